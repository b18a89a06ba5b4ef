//! Which broker the CLI goes to on a shared machine, as a user runs it (no
//! `--socket`, no `$PALISADE_SOCKET`): the user's own broker, then the
//! system broker (the system configuration names its socket: here a test's
//! own, `PALISADE_SYSTEM_CONFIG`, never the host's /etc/palisade), then an
//! embedded one. A broker that refuses is an error, never replaced by an
//! embedded one; the system configuration may require the system broker.
//!
//! The system broker here is a root broker serving another user: only root
//! can run one and make the users, so as an ordinary user these tests say
//! so and do nothing.

use palisade_tests::*;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

/// Users, and a directory everyone may traverse for the system
/// configurations, the users' runtime directories and workspaces.
struct Machine {
    users: SystemUsers,
    dir: TempDir,
}

impl Machine {
    fn new() -> Option<Machine> {
        use std::os::unix::fs::PermissionsExt;
        let Some(users) = system_users() else {
            skipped("not root: a system broker serving other users cannot be tested as an ordinary user");
            return None;
        };
        let dir = TempDir::new("discovery");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Some(Machine { users, dir })
    }

    /// A root broker serving root, the attacker and the victim, its socket
    /// open to all (`extra`: more of its `[broker]` table, replacing these).
    fn system_broker(&self, extra: &str) -> Daemon {
        let (a, v) = (self.users.attacker.uid, self.users.victim.uid);
        let mut broker = format!("allowed_uids = [0, {a}, {v}]\nsocket_mode = 0o666\n");
        for line in extra.lines() {
            let key = line.split('=').next().unwrap_or("").trim();
            broker = broker.lines().filter(|l| !l.starts_with(key)).map(|l| format!("{l}\n")).collect();
            broker += &format!("{line}\n");
        }
        Daemon::start(&format!("[broker]\n{broker}"))
    }

    /// A system configuration with this `[clients]` table.
    fn system_config(&self, name: &str, clients: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, format!("[clients]\n{clients}\n")).unwrap();
        path
    }

    /// An empty runtime directory of `user`'s: no broker of its own answers there.
    fn runtime(&self, user: &nix::unistd::User, name: &str) -> PathBuf {
        let path = self.dir.join(name);
        owned_dir(&path, user, 0o700);
        path
    }

    /// `palisade PRE -- CMD` as `user` in a workspace of its own, as its
    /// shell runs it: no socket named, its runtime directory `runtime`, the
    /// system configuration `config`.
    fn palisade(
        &self,
        user: &nix::unistd::User,
        runtime: &Path,
        config: &Path,
        pre: &[&str],
        cmd: &[&str],
    ) -> Output {
        self.palisade_with(user, runtime, config, pre, cmd, &[])
    }

    fn palisade_with(
        &self,
        user: &nix::unistd::User,
        runtime: &Path,
        config: &Path,
        pre: &[&str],
        cmd: &[&str],
        env: &[(&str, &Path)],
    ) -> Output {
        let ws = self.dir.join(&format!("{}-ws", user.name));
        owned_dir(&ws, user, 0o755);
        let (_journal, journal) = scratch_journal(Some(user));
        let mut argv = as_user(user);
        argv.push(bin("palisade").to_string_lossy().into_owned());
        argv.extend(pre.iter().map(|s| s.to_string()));
        argv.push("--".into());
        argv.extend(cmd.iter().map(|s| s.to_string()));
        let mut command = std::process::Command::new(&argv[0]);
        command.args(&argv[1..]).current_dir(&ws).stdin(std::process::Stdio::null());
        command.env_remove("PALISADE_SOCKET").env("XDG_RUNTIME_DIR", runtime);
        command.env(SYSTEM_CONFIG_ENV, config);
        command.env("PALISADE_STATE", state_beside(&journal)).env("PALISADE_JOURNAL", &journal);
        command.envs(env.iter().copied());
        command.output().unwrap()
    }
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", text(&o.stdout), text(&o.stderr)))
}

/// A user without a broker of its own reaches the system broker, and is
/// told so on stderr (once; with --json, in the object only). Counter-tests:
/// the user's own broker, when it answers, is preferred and nothing is
/// said; with no broker anywhere, an embedded one runs as before.
#[test]
fn without_a_broker_of_its_own_a_user_reaches_the_system_broker_and_is_told_so() {
    let Some(m) = Machine::new() else { return };
    let user = &m.users.attacker;
    let system = m.system_broker("");
    let config = m.system_config("system.toml", &format!("system_socket = {:?}", system.socket));
    let runtime = m.runtime(user, "runtime");
    let o = m.palisade(user, &runtime, &config, &["run"], &[&probe(), "echo", "served"]);
    assert_eq!(text(&o.stdout), "ok served\n", "{}\n{}", text(&o.stderr), system.log());
    assert_eq!(
        text(&o.stderr),
        format!("palisade: run by the system broker on {}\n", system.socket.display())
    );
    let o = m.palisade(user, &runtime, &config, &["run", "--json"], &[&probe(), "echo", "served"]);
    assert_eq!(json(&o)["broker"], format!("the system broker on {}", system.socket.display()));
    assert_eq!(text(&o.stderr), "");
    assert!(eventually(Duration::from_secs(10), || system.runs_finished() == 2), "{}", system.log());

    // Counter-test: the user's own broker answers, and is preferred, quietly.
    let socket = runtime.join("palisade/palisade.sock");
    let own = Daemon::start_with(DaemonOptions {
        user: Some(user.clone()),
        env: vec![("XDG_RUNTIME_DIR".into(), runtime.to_string_lossy().into_owned())],
        default_socket: Some(socket.clone()),
        ..Default::default()
    });
    let o = m.palisade(user, &runtime, &config, &["run"], &[&probe(), "echo", "own"]);
    assert_eq!((text(&o.stdout).as_str(), text(&o.stderr).as_str()), ("ok own\n", ""));
    let o = m.palisade(user, &runtime, &config, &["run", "--json"], &[&probe(), "echo", "own"]);
    assert_eq!(json(&o)["broker"], format!("the broker on {}", socket.display()));
    assert!(eventually(Duration::from_secs(10), || own.runs_finished() == 2), "{}", own.log());
    assert_eq!(system.runs_finished(), 2, "{}", system.log());

    // Counter-test: no broker anywhere: an embedded one, as before.
    let nowhere = m.system_config("nowhere.toml", &format!("system_socket = {:?}", m.dir.join("none.sock")));
    let empty = m.runtime(user, "empty-runtime");
    let o = m.palisade(user, &empty, &nowhere, &["run", "--json"], &["/usr/bin/echo", "embedded"]);
    let v = json(&o);
    assert_eq!((&v["broker"], &v["stdout"]), (&"embedded (policy: built-in)".into(), &"embedded\n".into()));
    assert_eq!(system.runs_finished(), 2, "{}", system.log());
}

/// A system broker that is there and refuses the user, by its socket's
/// permissions or by answering `Unauthorized`, is an error saying what to
/// do, and nothing runs (no embedded broker in its place), with or without
/// `$PALISADE_SOCKET` naming it. Counter-test: a user it serves runs
/// through the same broker.
#[test]
fn a_system_broker_that_refuses_is_an_error_never_an_embedded_run() {
    let Some(m) = Machine::new() else { return };
    let (user, other) = (&m.users.attacker, &m.users.victim);
    let runtime = m.runtime(user, "runtime");
    // Its socket is root's alone (0600): connecting fails with EACCES.
    let closed = m.system_broker("socket_mode = 0o600");
    let config = m.system_config("closed.toml", &format!("system_socket = {:?}", closed.socket));
    let o = m.palisade(user, &runtime, &config, &["run"], &["/usr/bin/echo", "embedded"]);
    let refused = format!(
        "palisade: Unauthorized: the system broker on {} refuses uid {}: its socket does not let this user \
         connect (Permission denied (os error 13)). Ask its administrator to let you use it (the palisade \
         group, named in [broker] allowed_gids); no embedded broker runs in its place\n",
        closed.socket.display(),
        user.uid
    );
    assert_eq!((o.status.code(), text(&o.stdout).as_str(), text(&o.stderr)), (Some(125), "", refused));
    // The same socket named by $PALISADE_SOCKET: refused, not replaced either.
    let o = m.palisade_with(
        user,
        &runtime,
        &config,
        &["run"],
        &["/usr/bin/echo", "x"],
        &[("PALISADE_SOCKET", &closed.socket)],
    );
    assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(125), ""));
    let named =
        format!("palisade: Unauthorized: the broker on {} refuses uid {}", closed.socket.display(), user.uid);
    assert!(text(&o.stderr).starts_with(&named), "{}", text(&o.stderr));
    // It answers Unauthorized: the user is not among its allowed_uids.
    let strict = m.system_broker(&format!("allowed_uids = [0, {}]", other.uid));
    let config = m.system_config("strict.toml", &format!("system_socket = {:?}", strict.socket));
    let o = m.palisade(user, &runtime, &config, &["run"], &["/usr/bin/echo", "embedded"]);
    assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(125), ""));
    let said = text(&o.stderr);
    let refuses = format!(
        "palisade: Unauthorized: the system broker on {} refuses uid {}: uid {} ",
        strict.socket.display(),
        user.uid,
        user.uid
    );
    assert!(said.starts_with(&refuses), "{said}");
    assert!(
        said.contains("is not allowed to use this broker") && said.contains("no embedded broker runs"),
        "{said}"
    );
    // Counter-test: the user it serves runs through it.
    let other_runtime = m.runtime(other, "other-runtime");
    let o = m.palisade(other, &other_runtime, &config, &["run"], &[&probe(), "echo", "served"]);
    assert_eq!(text(&o.stdout), "ok served\n", "{}\n{}", text(&o.stderr), strict.log());
}

/// `[clients] require_system_broker`: with no system broker answering, a
/// run that would embed a broker is refused with the reason, and so are
/// `--policy` and `explain`'s built-in decision. Counter-tests: required and
/// answering, the system broker runs it; not required, the same machine
/// embeds one as before.
#[test]
fn an_admin_may_require_the_system_broker_for_every_run() {
    let Some(m) = Machine::new() else { return };
    let user = &m.users.attacker;
    let runtime = m.runtime(user, "runtime");
    let none = m.dir.join("none.sock");
    let required =
        m.system_config("required.toml", &format!("system_socket = {none:?}\nrequire_system_broker = true"));
    let o = m.palisade(user, &runtime, &required, &["run"], &["/usr/bin/echo", "embedded"]);
    let refused = format!(
        "palisade: Unavailable: this machine requires the system broker ([clients] require_system_broker in {}): \
         it does not answer on {}, and no embedded broker runs in its place; ask the administrator to start it \
         (systemctl start palisade.socket)\n",
        required.display(),
        none.display()
    );
    assert_eq!((o.status.code(), text(&o.stdout).as_str(), text(&o.stderr)), (Some(125), "", refused));
    let policy = m.dir.join("policy.toml");
    std::fs::write(&policy, base_config()).unwrap();
    let o = m.palisade(
        user,
        &runtime,
        &required,
        &["run", "--policy", policy.to_str().unwrap()],
        &["/usr/bin/echo", "x"],
    );
    assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(125), ""));
    assert!(
        text(&o.stderr).contains("): --policy runs an embedded broker, which it does not allow"),
        "{}",
        text(&o.stderr)
    );
    let o = m.palisade(user, &runtime, &required, &["explain"], &["/usr/bin/echo", "x"]);
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stdout));
    assert!(
        text(&o.stderr).starts_with("palisade: Unavailable: this machine requires the system broker"),
        "{}",
        text(&o.stderr)
    );

    // Counter-test: required, and answering: it runs there.
    let system = m.system_broker("");
    let there = m.system_config(
        "there.toml",
        &format!("system_socket = {:?}\nrequire_system_broker = true", system.socket),
    );
    let o = m.palisade(user, &runtime, &there, &["run"], &[&probe(), "echo", "served"]);
    assert_eq!(text(&o.stdout), "ok served\n", "{}\n{}", text(&o.stderr), system.log());
    // Counter-test: not required: the same missing broker, and an embedded one runs.
    let optional = m.system_config("optional.toml", &format!("system_socket = {none:?}"));
    let o = m.palisade(user, &runtime, &optional, &["run"], &["/usr/bin/echo", "embedded"]);
    assert_eq!(text(&o.stdout), "embedded\n", "{}", text(&o.stderr));
    // ... and says so, every time: never silently without the system broker.
    let bypass = "run by an embedded broker: the system broker's policy, approvals and journal do not apply";
    for _ in 0..2 {
        let o = m.palisade(user, &runtime, &optional, &["run"], &["/usr/bin/echo", "embedded"]);
        assert!(text(&o.stderr).contains(bypass), "{}", text(&o.stderr));
    }
    // doctor tells the user where runs go: there, and through the system broker when it answers.
    let o = m.palisade(user, &runtime, &optional, &["doctor"], &[]);
    assert!(
        text(&o.stdout).contains("runs go to:       an embedded broker under the built-in policy"),
        "{}",
        text(&o.stdout)
    );
    let o = m.palisade(user, &runtime, &there, &["doctor"], &[]);
    let by = format!("runs go to:       the system broker on {}", system.socket.display());
    assert!(text(&o.stdout).contains(&by), "{}", text(&o.stdout));
    // Counter-test: no system configuration (no install): an embedded run says nothing of it.
    let absent = m.dir.join("absent.toml");
    let o = m.palisade(user, &runtime, &absent, &["run"], &["/usr/bin/echo", "embedded"]);
    assert_eq!((text(&o.stdout).as_str(), text(&o.stderr).as_str()), ("embedded\n", ""));
}
