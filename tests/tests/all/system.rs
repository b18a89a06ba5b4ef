//! A system install: palisaded as root, or as the unit runs it (a dedicated
//! user with ambient capabilities), serving other users. Each test is a
//! finding of a review of that setup, reproduced through the real binaries
//! with an attacking and a victim user the suite makes: what the attacker
//! tries must fail, and the same thing done by one who may (the victim on
//! its own files, root) must work, so that the test could fail.
//!
//! Only root can make users and run such a broker: as an ordinary user these
//! tests say so and do nothing (the README's unprivileged half).

use palisade_protocol::wire::{ClientMessage, Decoder, Encoding, Hello, ServerMessage, encode};
use palisade_tests::*;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The probe's report, run outside any sandbox as `user`: the counter-test.
fn probe_as(user: &nix::unistd::User, args: &[&str]) -> String {
    let o = std::process::Command::new("setpriv")
        .args(&as_user(user)[1..])
        .arg(probe())
        .args(args)
        .output()
        .unwrap();
    text(&o.stdout)
}

/// A root broker serving the attacker and the victim (and root), in a base
/// directory everyone may traverse.
struct System {
    users: SystemUsers,
    base: TempDir,
    daemon: Daemon,
}

impl System {
    fn start(config: &str) -> Option<System> {
        System::start_under(config, vec![], None)
    }

    /// Started as the system unit starts it: as its `User=` with `caps`
    /// ambient and as its bounding set, its umask and no_new_privs.
    fn start_as_unit(config: &str, caps: &[String]) -> Option<System> {
        let user = unit_user()?;
        System::start_under(config, as_the_unit(caps, &user), Some(user))
    }

    /// The same test's brokers: one run by root, one as the unit runs it.
    fn root_and_unit(config: &str) -> Vec<System> {
        let unit = System::start_as_unit(config, &unit_caps());
        System::start(config).into_iter().chain(unit).collect()
    }

    /// Started under `prefix` (a command that execs the rest), its
    /// directories `owner`'s.
    fn start_under(config: &str, prefix: Vec<String>, owner: Option<nix::unistd::User>) -> Option<System> {
        let Some(users) = system_users() else {
            skipped("not root: a root broker serving other users cannot be tested as an ordinary user");
            return None;
        };
        let base = TempDir::new("system");
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (a, v) = (users.attacker.uid, users.victim.uid);
        let (defaults, rest) = match config.find('[') {
            Some(i) => config.split_at(i),
            None => (config, ""),
        };
        // Keys of [broker] the test gives go with those.
        let rest = rest.strip_prefix("[broker]\n").unwrap_or(rest);
        let config = format!("{defaults}[broker]\nallowed_uids = [0, {a}, {v}]\nsocket_mode = 0o666\n{rest}");
        let config = match &owner {
            Some(user) if !config.contains("temp_root") => {
                with_temp_root(&config, &unit_runs_dir(base.path(), user))
            }
            _ => config,
        };
        let daemon = Daemon::start_with(DaemonOptions { config, prefix, owner, ..Default::default() });
        Some(System { users, base, daemon })
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.base.join(rel)
    }

    /// `palisade run --socket S <pre> -- <args>` as `user`, in the base directory.
    fn run_as(&self, user: Option<&nix::unistd::User>, pre: &[&str], args: &[&str]) -> std::process::Output {
        let mut all = vec!["run", "--socket", self.daemon.socket.to_str().unwrap()];
        all.extend_from_slice(pre);
        palisade_cli(self.base.path(), &all, args, user)
    }
}

/// Finding 1: copy-back made its temporary file as root and gave it the
/// sandbox's mode (4755) before it gave it away by name; renamed in between,
/// the file stayed root's, setuid. Now it is made by the requester and never
/// carries setuid, setgid or sticky bits. Applied by a copy (the change sets
/// on another filesystem than the workspace, here a tmpfs) the temporary
/// file is stolen as it appears; applied by a move (the same filesystem),
/// the file moved is the requester's and carries none of them either.
#[test]
fn copy_back_never_leaves_a_root_owned_or_setuid_file() {
    if !is_root() {
        return;
    }
    let elsewhere = TempDir::new("system-store");
    std::fs::set_permissions(elsewhere.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = Tmpfs::mount(&elsewhere, "size=256m,mode=0755");
    // A floor the 256 MiB filesystem keeps with a 48 MiB run in it (the
    // default, 1 GiB, it never could: each run would be stopped and held).
    let copied = format!("[changes]\ndir = {:?}\nmin_free_mb = 16\n", store.path().join("changes"));
    let Some(s) = System::start(&copied) else { return };
    steal_and_check(&s);
    // Moved: no temporary file to steal, and the same invariants.
    let Some(s) = System::start("") else { return };
    let attacker = &s.users.attacker;
    let ws = s.path("attacker-ws");
    owned_dir(&ws, attacker, 0o755);
    let o = s.run_as(
        Some(attacker),
        &["--workspace", ws.to_str().unwrap()],
        &[&probe(), "setuid-file", "moved", "1"],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let m = std::fs::metadata(ws.join("moved")).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7000), (attacker.uid.as_raw(), 0), "mode {:o}", m.mode());
}

/// The race of finding 1 against a copy, and what it leaves.
fn steal_and_check(s: &System) {
    let attacker = &s.users.attacker;
    let ws = s.path("attacker-ws");
    owned_dir(&ws, attacker, 0o755);
    // The attacker watches its directory and renames the broker's temporary
    // file away as soon as it appears (a large file keeps the window open).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (ws, stop) = (ws.clone(), stop.clone());
        std::thread::spawn(move || steal_temporary_files(&ws, &stop))
    };
    let mut outputs = Vec::new();
    for attempt in 0..8 {
        let name = format!("payload-{attempt}");
        let o = s.run_as(
            Some(attacker),
            &["--workspace", ws.to_str().unwrap()],
            &[&probe(), "setuid-file", &name, "48"],
        );
        outputs.push(text(&o.stderr));
        if std::fs::read_dir(&ws)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("stolen"))
        {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let stolen = watcher.join().unwrap();
    // The race was run: a temporary file was taken away at least once.
    assert!(stolen > 0, "no temporary file appeared to be renamed: {outputs:?}\n{}", s.daemon.log());
    for e in std::fs::read_dir(&ws).unwrap().flatten() {
        let m = e.metadata().unwrap();
        let name = e.file_name();
        assert_ne!(m.uid(), 0, "{name:?} belongs to root");
        assert_eq!(m.mode() & 0o7000, 0, "{name:?} has mode {:o}", m.mode());
        assert_eq!(m.uid(), attacker.uid.as_raw(), "{name:?} is not the requester's");
    }
    // Counter-test: outside, the same user may make its own file setuid (the
    // bit is harmless on its own file), which is what the sandbox asked for.
    let mine = ws.join("mine");
    let out = probe_as(attacker, &["setuid-file", mine.to_str().unwrap(), "1"]);
    assert_eq!(out, "ok mode 4755\n");
    assert_eq!(std::fs::metadata(&mine).unwrap().mode() & 0o7777, 0o4755);
}

/// Renames every `.palisade-apply-*` file that appears in `dir` to
/// `stolen-N`, until `stop`; how many it renamed.
fn steal_temporary_files(dir: &Path, stop: &std::sync::atomic::AtomicBool) -> usize {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).unwrap();
    inotify.add_watch(dir, AddWatchFlags::IN_CREATE).unwrap();
    let mut stolen = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let events = match inotify.read_events() {
            Ok(e) => e,
            Err(nix::errno::Errno::EAGAIN) => {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            Err(e) => panic!("inotify: {e}"),
        };
        for event in events {
            let Some(name) = event.name else { continue };
            if name.to_string_lossy().starts_with(".palisade-apply-")
                && std::fs::rename(dir.join(&name), dir.join(format!("stolen-{stolen}"))).is_ok()
            {
                stolen += 1;
            }
        }
    }
    stolen
}

/// Finding 2: copy-back opened the workspace by its path at the end of the
/// run; a parent replaced by a symlink meanwhile sent root's writes into any
/// directory. Now it writes relative to the descriptor opened when the run
/// was decided, as the requester.
#[test]
fn copy_back_follows_no_parent_swapped_during_the_run() {
    let Some(s) = System::start("") else { return };
    let attacker = &s.users.attacker;
    let (home, parent) = (s.path("attacker"), s.path("attacker/parent"));
    let ws = parent.join("ws");
    for d in [&home, &parent, &ws] {
        owned_dir(d, attacker, 0o755);
    }
    let root_only = s.path("root-only");
    std::fs::create_dir_all(root_only.join("ws")).unwrap();
    std::fs::set_permissions(&root_only, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = ws.join("out");
    let before = s.daemon.log().matches("helper started").count();
    let run = {
        let (sock, out, ws, base) =
            (s.daemon.socket.clone(), out.clone(), ws.clone(), s.base.path().to_path_buf());
        let attacker = attacker.clone();
        std::thread::spawn(move || {
            palisade_cli(
                &base,
                &["run", "--socket", sock.to_str().unwrap(), "--workspace", ws.to_str().unwrap()],
                &[&probe(), "write-sleep", out.to_str().unwrap(), "2"],
                Some(&attacker),
            )
        })
    };
    // While the sandbox sleeps, the attacker swaps the workspace's parent for
    // a symlink to a directory only root may write.
    assert!(eventually(Duration::from_secs(20), || s.daemon.log().matches("helper started").count() > before));
    std::fs::rename(&parent, home.join("parent.moved")).unwrap();
    std::os::unix::fs::symlink(&root_only, &parent).unwrap();
    let o = run.join().unwrap();
    assert!(
        !root_only.join("ws/out").exists(),
        "root wrote into {}: {}",
        root_only.display(),
        text(&o.stderr)
    );
    let kept = home.join("parent.moved/ws/out");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "probe\n", "{}", text(&o.stderr));
    assert_eq!(std::fs::metadata(&kept).unwrap().uid(), attacker.uid.as_raw());
    // Counter-test: the attacker itself may not write there.
    let out = probe_as(attacker, &["write", root_only.join("ws/x").to_str().unwrap()]);
    assert!(out.starts_with("err EACCES"), "{out}");
}

fn read_tools() -> String {
    let probe = probe();
    let dir = bin("probe").parent().unwrap().to_string_lossy().into_owned();
    format!(
        r#"
[tools.lint]
preset = "code_analyzer"
allowed_executables = ["{probe}"]
[tools.lint.overrides]
filesystem = [{{ read_only = "${{WORKSPACE}}" }}, {{ read_only = "{dir}" }}]

[tools.show]
preset = "file_processor"
allowed_executables = ["{probe}"]
[tools.show.overrides]
filesystem = [{{ read_only = "{dir}" }}]
[tools.show.parameters.file]
capability = "filesystem.read_only"
validation = "is_file"
mapping = "single"
"#
    )
}

/// Finding 3: read grants were taken as root and idmapped to the sandbox, so
/// another user's 0600 files and root's were readable through a tool's
/// workspace or parameter. Now the requester must be able to read a grant
/// itself, and the sandbox acts as the requester on it, never as its owner.
/// Both for a root broker and for one run as the unit runs it (its user's
/// ambient capabilities, which the thread acting as the requester drops).
#[test]
fn a_read_grant_gives_only_what_the_requester_may_read() {
    for s in System::root_and_unit(&read_tools()) {
        read_grants_as_the_requester(&s);
    }
}

/// The requester may not read another's grant; its owner and root may.
fn read_grants_as_the_requester(s: &System) {
    let (attacker, victim) = (&s.users.attacker, &s.users.victim);
    let home = s.path("victim-home");
    owned_dir(&home, victim, 0o700);
    let secret = home.join("secret");
    owned_file(&secret, victim, 0o600, "victim-secret-4711");
    let root_only = s.path("root-only");
    std::fs::create_dir(&root_only).unwrap();
    std::fs::set_permissions(&root_only, std::fs::Permissions::from_mode(0o700)).unwrap();
    let root_secret = root_only.join("secret");
    std::fs::write(&root_secret, "root-secret-4712").unwrap();
    std::fs::set_permissions(&root_secret, std::fs::Permissions::from_mode(0o600)).unwrap();

    let lint = |user| {
        s.run_as(
            user,
            &["--tool", "lint", "--workspace", home.to_str().unwrap()],
            &[&probe(), "read", secret.to_str().unwrap()],
        )
    };
    let o = lint(Some(attacker));
    assert!(!text(&o.stdout).contains("victim-secret"), "{}", text(&o.stdout));
    let want =
        format!("palisade: WorkspaceScopeDenied: {}: not allowed (uid {}", home.display(), attacker.uid);
    assert!(text(&o.stderr).starts_with(&want), "{}", text(&o.stderr));
    let show = |user| {
        let param = format!("file={}", root_secret.display());
        s.run_as(
            user,
            &["--tool", "show", "--param", &param],
            &[&probe(), "read", root_secret.to_str().unwrap()],
        )
    };
    let o = show(Some(attacker));
    assert!(!text(&o.stdout).contains("root-secret"), "{}", text(&o.stdout));
    assert!(text(&o.stderr).contains("not allowed"), "{}", text(&o.stderr));

    // Counter-tests: the owner reads its own file through the same grants.
    assert_eq!(text(&lint(Some(victim)).stdout), "ok 18 bytes: victim-secret-4711\n");
    assert_eq!(text(&show(None).stdout), "ok 16 bytes: root-secret-4712\n");
}

/// Finding 4: the helper opened the workspace by name after the broker's
/// checks; a workspace swapped with a symlink (renameat2 RENAME_EXCHANGE)
/// mounted another user's home. Now the broker opens it once, as the
/// requester, with no symlink allowed, and the helper mounts that descriptor.
#[test]
fn a_workspace_swapped_for_a_symlink_is_never_mounted() {
    let Some(s) = System::start("") else { return };
    let (attacker, victim) = (&s.users.attacker, &s.users.victim);
    let home = s.path("victim-home");
    owned_dir(&home, victim, 0o700);
    owned_file(&home.join("secret.txt"), victim, 0o600, "victim-secret-4713");
    let dir = s.path("attacker");
    owned_dir(&dir, attacker, 0o755);
    let ws = dir.join("ws");
    owned_dir(&ws, attacker, 0o755);
    owned_file(&ws.join("secret.txt"), attacker, 0o644, "decoy");
    let link = dir.join("link");
    std::os::unix::fs::symlink(&home, &link).unwrap();
    let target = ws.join("secret.txt");
    race(Swapper::start(&ws, &link), || {
        let o = s.run_as(
            Some(attacker),
            &["--workspace", ws.to_str().unwrap()],
            &[&probe(), "read", target.to_str().unwrap()],
        );
        let out = text(&o.stdout);
        assert!(!out.contains("victim-secret"), "the victim's home was mounted: {out}");
        out.contains("decoy")
    });
    // Counter-test: the victim reads its own file.
    let out = probe_as(victim, &["read", home.join("secret.txt").to_str().unwrap()]);
    assert!(out.contains("victim-secret-4713"));
}

/// Finding 10: every user's sandboxes ran as uid 65534, so two users'
/// sandboxes could signal or trace each other. Now each requesting uid has
/// its own host ids.
#[test]
fn each_requesting_uid_gets_its_own_sandbox_ids() {
    let Some(s) = System::start("") else { return };
    let mut seen = Vec::new();
    for user in [&s.users.attacker, &s.users.victim] {
        let ws = s.path(&user.name);
        owned_dir(&ws, user, 0o755);
        let o = s.run_as(Some(user), &["--json", "--workspace", ws.to_str().unwrap()], &[&probe(), "ids"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{o:?}"));
        let host_uid = v["result"]["attestation"]["enforcement"]["host_uid"].as_u64().unwrap();
        assert_eq!(host_uid, 0x7000_0000 + u64::from(user.uid.as_raw()), "{v}");
        seen.push(host_uid);
    }
    assert_ne!(seen[0], seen[1]);
}

/// Finding 15: a root broker said "No such file" or "is not a directory"
/// for paths inside directories the requester cannot read: an oracle of
/// their contents. Now it decides as the requester, and says "not allowed"
/// alike for what exists and what does not. Both for a root broker and for
/// one run as the unit runs it.
#[test]
fn paths_the_requester_cannot_reach_are_not_allowed_whether_or_not_they_exist() {
    for s in System::root_and_unit("") {
        unreachable_paths_alike(&s);
    }
}

/// A directory the requester may write but does not own (another user's,
/// mode 0777) is no workspace of its: a run there would write as the
/// sandbox into what someone else owns. The refusal says no flag lifts it;
/// its owner runs there.
#[test]
fn a_workspace_another_user_owns_is_refused_though_the_requester_may_write_it() {
    let Some(s) = System::start("") else { return };
    let (attacker, victim) = (&s.users.attacker, &s.users.victim);
    let ws = s.path("victims-open-dir");
    owned_dir(&ws, victim, 0o777);
    let pre = ["--json", "--workspace", ws.to_str().unwrap()];
    let o = s.run_as(Some(attacker), &pre, &[&probe(), "ops", "put", "planted", "x"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    assert_eq!(v["error"]["rule"], "scope.not_the_peers", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    palisade_policy::denial::names_a_fix_or_why_none("scope.not_the_peers", message).unwrap();
    assert!(!ws.join("planted").exists());
    // Counter-test: its owner writes there.
    let o = s.run_as(Some(victim), &pre, &[&probe(), "ops", "put", "planted", "x"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(std::fs::read_to_string(ws.join("planted")).unwrap(), "x");
}

/// Unreachable paths refused alike, whatever is there; root is told.
fn unreachable_paths_alike(s: &System) {
    let attacker = &s.users.attacker;
    let root_only = s.path("root-only");
    std::fs::create_dir_all(root_only.join("dir")).unwrap();
    std::fs::write(root_only.join("file"), "x").unwrap();
    std::fs::set_permissions(&root_only, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut answers = Vec::new();
    for name in ["dir", "file", "missing"] {
        let ws = root_only.join(name);
        let o = s.run_as(Some(attacker), &["--workspace", ws.to_str().unwrap()], &[&probe(), "echo", "x"]);
        answers.push(text(&o.stderr).replace(&format!("/{name}:"), "/NAME:"));
    }
    let want = format!(
        "palisade: WorkspaceScopeDenied: workspace {}/NAME: not allowed (uid {} cannot reach it)\n",
        root_only.display(),
        attacker.uid
    );
    assert_eq!(answers, [want.clone(), want.clone(), want]);
    // Counter-test: root, who may look, is told what is there.
    let o =
        s.run_as(None, &["--workspace", root_only.join("file").to_str().unwrap()], &[&probe(), "echo", "x"]);
    assert!(text(&o.stderr).contains("is not a directory"), "{}", text(&o.stderr));
}

/// The system unit (systemd/palisade.service).
/// What another user does through a root broker: a run that writes in its
/// workspace, copied back as the user.
fn serve_another_user(s: &System) -> Result<(), String> {
    let attacker = &s.users.attacker;
    let ws = s.path("unit-ws");
    owned_dir(&ws, attacker, 0o755);
    let out = ws.join("out");
    let o = s.run_as(
        Some(attacker),
        &["--workspace", ws.to_str().unwrap()],
        &[&probe(), "write", out.to_str().unwrap()],
    );
    if !o.status.success() {
        return Err(format!("the run failed: {}", text(&o.stderr)));
    }
    match std::fs::metadata(&out) {
        Ok(m) if m.uid() == attacker.uid.as_raw() => Ok(()),
        Ok(m) => Err(format!("copied back as uid {}", m.uid())),
        Err(e) => Err(format!("nothing copied back: {e}; {}", text(&o.stderr))),
    }
}

/// What a root broker does for another user that needs one of the unit's
/// capabilities.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Service {
    /// A run in Tier C that writes in its workspace, copied back as the user.
    Write,
    /// A run killed at its deadline.
    Deadline,
    /// A run in Tier B (no user namespaces, `fallback = "warn_and_execute"`),
    /// whose private /tmp is a host directory of the sandbox's uid.
    TierB,
}

/// Each capability of the system unit, the service that needs it, and what
/// fails without it (README, "The system service's privilege", says why).
const NEEDED: [(&str, Service, &str); 6] = [
    // setfsuid: the broker opens and writes the requester's files as it;
    // without it the broker serves its own uid only, and says so.
    ("CAP_SETUID", Service::Write, "can act only as itself"),
    // setgroups and setfsgid, likewise.
    ("CAP_SETGID", Service::Write, "cannot act for uid"),
    // open_tree: the broker clones the host's mounts (the /etc snapshot,
    // every bind) and idmaps the requester's directories for the sandbox.
    ("CAP_SYS_ADMIN", Service::Write, "clones the sandbox's mounts with CAP_SYS_ADMIN"),
    // The run's writes (its overlay's upper layer, the sandbox's uid's) are
    // read back by the broker.
    ("CAP_DAC_OVERRIDE", Service::Write, "copying the run's writes back"),
    // The helper and the command run as the sandbox's host ids.
    ("CAP_KILL", Service::Deadline, "cannot signal the helper: Operation not permitted"),
    // Tier B's run directories are made for the sandbox's host ids.
    ("CAP_CHOWN", Service::TierB, "cannot create the run's directories: Operation not permitted"),
];

/// A root broker started as the unit starts it (its bounding set `caps`),
/// configured for `service`.
fn start_for(service: Service, caps: &[String]) -> Option<System> {
    let config = match service {
        Service::TierB => "[broker]\nuser_namespaces = false\n[policy]\nfallback = \"warn_and_execute\"\n",
        Service::Write | Service::Deadline => "",
    };
    System::start_as_unit(config, caps)
}

/// `service` for another user; the reason when it fails.
fn serve(s: &System, service: Service) -> Result<(), String> {
    match service {
        Service::Write => serve_another_user(s),
        Service::TierB => {
            let ws = s.path("tier-b-ws");
            owned_dir(&ws, &s.users.attacker, 0o755);
            let o = s.run_as(
                Some(&s.users.attacker),
                &["--workspace", ws.to_str().unwrap()],
                &[&probe(), "echo", "served"],
            );
            if text(&o.stdout) == "ok served\n" {
                Ok(())
            } else {
                Err(format!("{}{}", text(&o.stdout), text(&o.stderr)))
            }
        }
        Service::Deadline => {
            let attacker = &s.users.attacker;
            let ws = s.path("deadline-ws");
            owned_dir(&ws, attacker, 0o755);
            let pre = ["--timeout", "1", "--workspace", ws.to_str().unwrap()];
            std::thread::scope(|scope| {
                let client = scope.spawn(|| s.run_as(Some(attacker), &pre, &[&probe(), "sleep"]));
                let refused = helper_the_broker_cannot_signal(s, &client);
                let o = client.join().unwrap();
                match refused {
                    Some(line) => Err(line),
                    None if text(&o.stderr).contains("TimedOut: killed at the deadline") => Ok(()),
                    None => Err(text(&o.stderr)),
                }
            })
        }
    }
}

/// How often, and at most how many times, the test looks for the end of a
/// run that may never end: two minutes, far beyond its one-second deadline.
const POLL: Duration = Duration::from_millis(100);
const MAX_POLLS: u32 = 1200;

/// Watches a run whose client is `client` until it ends, or the broker logs
/// that it cannot signal its helper (which runs as the sandbox's host ids):
/// that line, after the test (root) killed the helper so that the run ends.
fn helper_the_broker_cannot_signal<T>(
    s: &System,
    client: &std::thread::ScopedJoinHandle<'_, T>,
) -> Option<String> {
    for _ in 0..MAX_POLLS {
        if client.is_finished() {
            return None;
        }
        let log = s.daemon.log();
        if let Some(line) = log.lines().find(|l| l.contains("cannot signal the helper")) {
            let pid =
                line.rsplit("pid=").next().and_then(|p| p.trim().parse().ok()).expect("the helper's pid");
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
                .unwrap();
            return Some(line.to_string());
        }
        std::thread::sleep(POLL);
    }
    panic!("the run neither ended nor was refused a signal:\n{}", s.daemon.log());
}

/// The system unit's CapabilityBoundingSet and UMask leave a root broker
/// able to serve other users, and each capability of the set is needed: one
/// fewer, and a service named in [`NEEDED`] fails with the reason given
/// there. The set is exactly those capabilities.
#[test]
fn each_of_the_system_units_capabilities_is_needed_to_serve_other_users() {
    let caps = unit_caps();
    let mut needed: Vec<&str> = NEEDED.iter().map(|(c, ..)| *c).collect();
    let mut unit = caps.iter().map(String::as_str).collect::<Vec<_>>();
    needed.sort_unstable();
    unit.sort_unstable();
    assert_eq!(
        unit, needed,
        "the unit's CapabilityBoundingSet is not the set each of whose members is shown needed"
    );
    if system_users().is_none() {
        return;
    }
    for service in [Service::Write, Service::Deadline, Service::TierB] {
        let s = start_for(service, &caps).unwrap();
        serve(&s, service)
            .unwrap_or_else(|e| panic!("{service:?} with the unit's capabilities: {e}\n{}", s.daemon.log()));
    }
    for (cap, service, reason) in NEEDED {
        let fewer: Vec<String> = caps.iter().filter(|c| *c != cap).cloned().collect();
        let s = start_for(service, &fewer).unwrap();
        match serve(&s, service) {
            Ok(()) => panic!("{service:?} served without {cap}"),
            Err(e) => assert!(e.contains(reason), "{service:?} without {cap}: {e}\n{}", s.daemon.log()),
        }
    }
}

/// Under the system unit's umask (0077) and capabilities, a root broker
/// still makes the /etc snapshot and another user's sandbox reads it: the
/// snapshot's directory, temp_root and the directory made on the way to it
/// get their modes explicitly, whatever the umask takes.
#[test]
fn under_the_units_umask_the_etc_snapshot_serves_other_users() {
    let base = TempDir::new("runs");
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let temp_root = base.join("made/runs");
    let config = format!("[policy]\ntemp_root = {temp_root:?}\n");
    let Some(s) = System::start_as_unit(&config, &unit_caps()) else { return };
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
    assert_eq!((mode(&base.join("made")), mode(&temp_root)), (0o711, 0o711));
    let snapshots = || -> Vec<PathBuf> {
        let entries = std::fs::read_dir(&temp_root).into_iter().flatten().flatten().map(|e| e.path());
        entries.filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("etc-")).collect()
    };
    // Another test's useradd changes /etc meanwhile: the broker then takes a
    // new snapshot and removes the old one (made 0700 on its way out).
    let settled = || matches!(&snapshots()[..], [one] if std::fs::metadata(one).is_ok_and(|m| m.mode() & 0o7777 == 0o755));
    assert!(eventually(Duration::from_secs(10), settled), "{:?}\n{}", snapshots(), s.daemon.log());
    assert!(!s.daemon.log().contains("no /etc snapshot"), "{}", s.daemon.log());
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let read_passwd = |s: &System| {
        let ws = s.path("attacker-ws");
        owned_dir(&ws, &s.users.attacker, 0o755);
        let args = [probe(), "read".into(), "/etc/passwd".into()];
        let o = s.run_as(
            Some(&s.users.attacker),
            &["--workspace", ws.to_str().unwrap()],
            &args.each_ref().map(|a| a.as_str()),
        );
        assert_eq!(text(&o.stdout), format!("ok {} bytes: {passwd}\n", passwd.len()), "{}", text(&o.stderr));
    };
    read_passwd(&s);
    drop(s);
    // Counter-test: a temp_root others cannot search (an admin made it
    // 0700) holds no snapshot: the broker says why, and binds the entries.
    let private = base.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let config = format!("[policy]\ntemp_root = {:?}\n", private.join("runs"));
    let s = System::start_as_unit(&config, &unit_caps()).unwrap();
    let why = format!(
        "{}: {} is mode 0700, not searchable by others",
        private.join("runs").display(),
        private.display()
    );
    assert!(s.daemon.log().contains(&why), "{}", s.daemon.log());
    read_passwd(&s);
}

/// Why the unit sets no ProtectKernelLogs, ProtectKernelTunables or
/// ProtectHostname: the first two cover parts of /proc with mounts, and the
/// kernel then refuses the sandbox's own /proc (a procfs mounted in a user
/// namespace must not reveal what the broker's hides); the third forbids
/// sethostname to every descendant. This makes such a cover and sees a
/// sandbox fail to start, and succeed without it.
#[test]
fn a_covered_proc_keeps_sandboxes_from_starting_so_the_unit_covers_none() {
    let unit = unit();
    for key in ["ProtectKernelLogs", "ProtectKernelTunables", "ProtectHostname", "ProtectProc", "ProcSubset"]
    {
        assert!(!unit.lines().any(|l| l.starts_with(&format!("{key}="))), "the unit sets {key}");
    }
    let Some(users) = system_users() else { return };
    let user = &users.attacker;
    // The embedded broker keeps its journal in the user's (temporary) home.
    let home = TempDir::new("covered-proc");
    owned_dir(home.path(), user, 0o700);
    let run = |cover: &str| {
        let script = format!(
            "{cover} exec setpriv --reuid {} --regid {} --clear-groups -- env HOME={} {} run -- /bin/echo started",
            user.uid,
            user.gid,
            home.path().display(),
            bin("palisade").display()
        );
        std::process::Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .current_dir("/tmp")
            .output()
            .unwrap()
    };
    let covered = run("mount --bind /dev/null /proc/kmsg &&");
    assert!(!covered.status.success(), "a sandbox started under a covered /proc");
    assert!(text(&covered.stderr).contains("mount proc on /proc: EPERM"), "{}", text(&covered.stderr));
    let open = run("");
    assert_eq!(text(&open.stdout), "started\n", "{}", text(&open.stderr));
}

/// The unit's ReadWritePaths, as paths (a leading `-`: "if it exists").
fn unit_read_write_paths() -> Vec<String> {
    let paths = unit_setting("ReadWritePaths");
    paths.split_whitespace().map(|p| p.trim_start_matches('-').to_string()).collect()
}

/// The system unit's file system settings (ProtectSystem=strict with its
/// ReadWritePaths, PrivateTmp, PrivateDevices), capabilities and umask,
/// made by tests/system-unit.sh in a mount namespace of the service's own,
/// leave the broker (as the unit's user) able to serve another user's run in a workspace
/// under /home (one of the roots the README names), its output the user's
/// with the user's umask; the same workspace without the ReadWritePaths is
/// read-only and the run is refused; a workspace in the host's /var/tmp,
/// which the service does not share (PrivateTmp), is refused saying so.
#[test]
fn the_system_units_file_system_serves_other_users() {
    let (Some(users), Some(service_user)) = (system_users(), unit_user()) else { return };
    let user = &users.attacker;
    let caps = setpriv_caps(&unit_caps());
    let roots = unit_read_write_paths();
    assert_eq!(roots, ["/home", "/srv"]);
    assert_eq!(unit_setting("PrivateTmp"), "yes");
    // WORK in the user's home: under /home, and not under /tmp or /var/tmp.
    let dir = TempDir::new_in(&user.dir, "unit");
    let work = dir.path().to_path_buf();
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ws = work.join("ws");
    owned_dir(&ws, user, 0o755);
    let config = work.join("palisade.toml");
    // The script runs copies of the binaries from WORK/bin (see there).
    let toml = format!(
        "[defaults]\nread_only = [{:?}]\n[broker]\nallowed_uids = [0, {}]\nsocket_mode = 0o666\n\
         [policy]\ntemp_root = \"/tmp/runs\"\n[trust]\nenabled = false\n",
        work.join("bin").display().to_string(),
        user.uid
    );
    std::fs::write(&config, toml).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("system-unit.sh");
    let run = |ws: &Path, read_write: &[String]| {
        let bin_dir = bin("palisaded").parent().unwrap().to_path_buf();
        std::process::Command::new("sh")
            .arg(&script)
            .args([bin_dir.as_os_str(), probe().as_ref(), work.as_os_str(), user.name.as_ref()])
            .args([&service_user.name, &caps])
            .args([unit_setting("UMask").as_str(), config.to_str().unwrap(), ws.to_str().unwrap()])
            .args(read_write)
            .output()
            .unwrap()
    };
    let o = run(&ws, &roots);
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    let out = std::fs::metadata(ws.join("out")).unwrap();
    // The user's, with the user's umask (022), not the unit's (0077).
    assert_eq!((out.uid(), out.mode() & 0o777), (user.uid.as_raw(), 0o644));
    std::fs::remove_file(ws.join("out")).unwrap();
    // Counter-test: /home read-only like the rest of the host, and the
    // workspace is refused (the requester cannot write it there either).
    let o = run(&ws, &[]);
    assert!(!o.status.success(), "a run wrote a workspace on a read-only host");
    let refused = format!("{}: not allowed (uid {} cannot reach it)", ws.display(), user.uid);
    assert!(text(&o.stderr).contains(&refused), "{}", text(&o.stderr));
    assert!(!ws.join("out").exists());
    // The host's /var/tmp is not the service's: a workspace there is
    // refused, saying why and what to do, and nothing is written.
    let var_tmp = TempDir::new_in(Path::new("/var/tmp"), "unit-ws");
    owned_dir(var_tmp.path(), user, 0o755);
    let o = run(var_tmp.path(), &roots);
    assert!(!o.status.success(), "a run was served in /var/tmp");
    let refused = format!(
        "palisade: InvalidRequest: cwd {}: the broker does not find it; if it is there for you, the broker \
         sees another file system: the system service (palisade.service) has a /tmp and /var/tmp of its own",
        var_tmp.path().display()
    );
    assert!(text(&o.stderr).contains(&refused), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("systemctl edit palisade.service"), "{}", text(&o.stderr));
    assert!(!var_tmp.join("out").exists());
}

/// A client of another user that never gets through: the probe's `hold`,
/// its connections open until [`Holder::finish`].
struct Holder(std::process::Child);

impl Holder {
    /// `n` connections to `socket` as `user`, each sent `first`; returns
    /// once all are open.
    fn start(user: &nix::unistd::User, socket: &Path, n: usize, first: &str) -> Holder {
        let mut child = std::process::Command::new("setpriv")
            .args(&as_user(user)[1..])
            .arg(probe())
            .args(["hold", socket.to_str().unwrap(), &n.to_string(), first])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = Vec::new();
        let out = child.stdout.as_mut().unwrap();
        let mut byte = [0u8];
        while line.last() != Some(&b'\n') && out.read(&mut byte).unwrap() == 1 {
            line.push(byte[0]);
        }
        assert_eq!(text(&line), format!("held {n}\n"));
        Holder(child)
    }

    /// Closes them, and says how the broker answered each, by kind.
    fn finish(mut self) -> String {
        drop(self.0.stdin.take());
        text(&self.0.wait_with_output().unwrap().stdout)
    }
}

/// A connection of this process (root) the broker greeted, once it has one
/// to spare (those of a test just done may be counted for a moment more).
fn greeted(socket: &Path) -> std::os::unix::net::UnixStream {
    let mut greeted = None;
    let spared = eventually(Duration::from_secs(10), || {
        let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let hello = encode(&ClientMessage::Hello(Hello::new(Encoding::Bincode)), Encoding::Bincode).unwrap();
        s.write_all(&hello).unwrap();
        let (mut d, mut buf) = (Decoder::default(), [0u8; 4096]);
        let first = loop {
            if let Some(m) = d.next_message::<ServerMessage>().unwrap() {
                break Some(m);
            }
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break None,
                Ok(n) => d.push(&buf[..n]),
            }
        };
        matches!(first, Some(ServerMessage::Hello(_))).then(|| greeted = Some(s)).is_some()
    });
    assert!(spared, "no connection was served");
    greeted.unwrap()
}

/// The daemon's open descriptors.
fn descriptors(d: &Daemon) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", d.child.id())).unwrap().count()
}

/// Finding 6 of the daemon's review: a peer the broker does not serve was
/// counted against `max_connections` before its uid was checked, and held
/// its place until the hello timeout: four such connections kept an allowed
/// user out (`Busy`). Now it is answered `Unauthorized` (in its encoding
/// when it says hello within a second) and closed, and never counts: an
/// allowed user is served while another user's connections, silent or
/// stalled mid-hello, pour in, more than the broker waits for at once; the
/// refusals are logged once every 10 s.
#[test]
fn peers_not_allowed_never_take_the_connections_of_those_allowed() {
    let Some(users) = system_users() else {
        skipped("not root: a root broker serving other users cannot be tested as an ordinary user");
        return;
    };
    let base = TempDir::new("system");
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = format!(
        "[broker]\nallowed_uids = [0, {}]\nsocket_mode = 0o666\nmax_connections = 2\n",
        users.victim.uid
    );
    let daemon = Daemon::start_with(DaemonOptions { config, ..Default::default() });
    let s = System { users, base, daemon };
    let socket = &s.daemon.socket;
    let ws = s.path("victim-ws");
    owned_dir(&ws, &s.users.victim, 0o755);
    let workspace = ["--workspace", ws.to_str().unwrap()];
    let (started, descriptors_before) = (Instant::now(), descriptors(&s.daemon));
    // More silent connections than the refusals that wait for a hello at
    // once (REFUSING_ROOM, 256), and some that stall in the middle of one.
    let silent = Holder::start(&s.users.attacker, socket, 300, "");
    let stalled = Holder::start(&s.users.attacker, socket, 40, r#"{"hello": {"magic": "palisade""#);
    let o = s.run_as(Some(&s.users.victim), &workspace, &[&probe(), "echo", "served"]);
    assert_eq!(text(&o.stdout), "ok served\n", "{}\n{}", text(&o.stderr), s.daemon.log());
    // Served, and refusing: at most the room of each kind that waits for a hello.
    let descriptors_now = descriptors(&s.daemon);
    let rooms = 2 * palisade_broker::serve::server::REFUSING_ROOM;
    assert!(descriptors_now <= descriptors_before + rooms, "{descriptors_before} -> {descriptors_now}");
    // Counter-test: the allowed users' own limit still holds: with root's
    // two connections open, the victim is told Busy.
    let held = [greeted(socket), greeted(socket)];
    let o = s.run_as(Some(&s.users.victim), &workspace, &[&probe(), "echo", "over"]);
    let busy =
        "palisade: Busy: all 2 connections the broker takes (max_connections) are open; try again later";
    assert!(text(&o.stderr).starts_with(busy), "{}", text(&o.stderr));
    drop(held);
    // Each of the other user's connections was answered, in its encoding.
    assert_eq!(silent.finish(), "ok Unauthorized=300\n");
    assert_eq!(stalled.finish(), "ok Unauthorized=40\n");
    // Logged once every 10 s (REFUSAL_LOG_EVERY), with the count of the others.
    let lines = s.daemon.log().matches("peer not allowed").count();
    let periods = started.elapsed().as_secs() as usize / 10 + 1;
    assert!((1..=periods).contains(&lines), "{lines} lines in {periods} periods of 10 s");
}

/// `palisade run --socket S --workspace WS -- probe echo WORD` as `user`
/// with exactly the supplementary groups `groups`.
fn echo_in_groups(
    socket: &Path,
    ws: &Path,
    user: &nix::unistd::User,
    groups: &[nix::unistd::Gid],
    word: &str,
) -> std::process::Output {
    let (socket, ws_arg, probe) = (socket.to_str().unwrap(), ws.to_str().unwrap(), probe());
    let args = ["run", "--socket", socket, "--workspace", ws_arg, "--", &probe, "echo", word];
    palisade_in_groups(user, groups, ws, &args, &[])
}

/// The socket's group is how a system install lets users in: a user whose
/// supplementary group `allowed_gids` names (by name: its gid differs from
/// one machine to the next) is served; the same user without that group, and
/// so with none of its groups allowed, is refused `Unauthorized`.
#[test]
fn a_supplementary_group_named_in_allowed_gids_lets_its_members_in() {
    let (Some(users), Some(devs)) = (system_users(), system_group("palisade-devs")) else {
        skipped("not root: a root broker serving other users cannot be tested as an ordinary user");
        return;
    };
    let member = &users.attacker;
    assert_ne!(member.gid, devs.gid, "the group must be a supplementary one");
    let base = TempDir::new("groups");
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ws = base.join("ws");
    owned_dir(&ws, member, 0o755);
    // No uid listed but the broker's own (root's): the group alone lets the member in.
    let d = Daemon::start("[broker]\nallowed_gids = [\"palisade-devs\"]\nsocket_mode = 0o666\n");
    let o = echo_in_groups(&d.socket, &ws, member, &[devs.gid], "in");
    assert_eq!(
        (o.status.code(), text(&o.stdout)),
        (Some(0), "ok in\n".into()),
        "{}\n{}",
        text(&o.stderr),
        d.log()
    );
    // Counter-test: the same user, without the group.
    let o = echo_in_groups(&d.socket, &ws, member, &[], "out");
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stdout));
    assert!(
        text(&o.stderr).contains("Unauthorized") && text(&o.stderr).contains("is not allowed"),
        "{}",
        text(&o.stderr)
    );
    // Another group is no better.
    let o = echo_in_groups(&d.socket, &ws, member, &[users.victim.gid], "other");
    assert!(text(&o.stderr).contains("Unauthorized"), "{}", text(&o.stderr));
}

/// The system broker's pool idle now (`palisade status`, as root).
fn pool_idle(s: &System) -> u64 {
    let socket = s.daemon.socket.to_str().unwrap();
    let o =
        std::process::Command::new(bin("palisade")).args(["status", "--socket", socket, "--json"]).output();
    let o = o.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{o:?}"));
    v["pool"]["idle"].as_u64().unwrap_or_else(|| panic!("{v}"))
}

/// `probe args` as `user` in `ws`: its stdout, whether its sandbox was
/// built warm or cold, and the host uid it ran as.
fn warm_run(s: &System, user: &nix::unistd::User, ws: &Path, args: &[&str]) -> (String, String, u64) {
    let mut argv = vec![probe()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let o = s.run_as(Some(user), &["--json", "--workspace", ws.to_str().unwrap()], &argv);
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{o:?}\n{}", s.daemon.log()));
    let enforcement = &v["result"]["attestation"]["enforcement"];
    let built =
        enforcement["built"].as_str().unwrap_or_else(|| panic!("{v}\n{}", s.daemon.log())).to_string();
    let host_uid = enforcement["host_uid"].as_u64().unwrap_or_else(|| panic!("{v}"));
    (v["stdout"].as_str().unwrap_or_default().to_string(), built, host_uid)
}

/// A system broker pools too, one pool per requester: a requester's first
/// run is cold and starts its pool; its next ones take a sandbox built
/// ahead as its own host ids, with its own files as its own, and nothing of
/// the run before. A sandbox built for one requester never serves another
/// (whose first run is cold, as its own ids). When the broker dies, its
/// pooled sandboxes go with it. Both for a root broker and for one run as
/// the unit runs it.
#[test]
fn a_system_brokers_pool_builds_ahead_for_each_requester_alone() {
    for mut s in System::root_and_unit("[broker]\nprespawn = 1\n") {
        let (attacker, victim) = (s.users.attacker.clone(), s.users.victim.clone());
        let (a_ws, v_ws) = (s.path("pool-a"), s.path("pool-v"));
        owned_dir(&a_ws, &attacker, 0o755);
        owned_dir(&v_ws, &victim, 0o755);
        let a_uid = 0x7000_0000 + u64::from(attacker.uid.as_raw());
        let v_uid = 0x7000_0000 + u64::from(victim.uid.as_raw());
        let token = format!("sys-warm-{}", std::process::id());
        let (first, built, host) = warm_run(&s, &attacker, &a_ws, &["traces", &token]);
        assert_eq!((built.as_str(), host), ("cold", a_uid), "{first}\n{}", s.daemon.log());
        // The attacker's pool fills (one sandbox), beside the helper that built nothing.
        assert!(eventually(Duration::from_secs(20), || pool_idle(&s) == 2), "{}", s.daemon.log());
        // The victim's first run: the attacker's sandbox is not for it.
        let (out, built, host) = warm_run(&s, &victim, &v_ws, &["echo", "v1"]);
        assert_eq!((out.as_str(), built.as_str(), host), ("ok v1\n", "cold", v_uid), "{}", s.daemon.log());
        let (next, built, host) = warm_run(&s, &attacker, &a_ws, &["look", &token]);
        assert_eq!((built.as_str(), host), ("warm", a_uid), "{next}\n{}", s.daemon.log());
        for trace in ["file", "sysv", "shm", "process"] {
            assert!(next.contains(&format!("{trace}=no")), "{trace} in {next}");
        }
        // The victim's own pool has filled meanwhile: its run is warm, as
        // its own ids, and what it writes in its workspace is the victim's.
        let full = || pool_idle(&s) == 3;
        assert!(eventually(Duration::from_secs(20), full), "{}", s.daemon.log());
        let (out, built, host) = warm_run(&s, &victim, &v_ws, &["write", "made-warm"]);
        assert_eq!((out.as_str(), built.as_str(), host), ("ok \n", "warm", v_uid), "{}", s.daemon.log());
        let made = std::fs::metadata(v_ws.join("made-warm")).unwrap();
        assert_eq!((made.uid(), made.gid()), (victim.uid.as_raw(), victim.gid.as_raw()));
        // The pools' sandboxes die with their broker.
        assert!(eventually(Duration::from_secs(20), full), "{}", s.daemon.log());
        let pooled = descendants(s.daemon.child.id());
        assert!(pooled.len() >= 5, "{pooled:?}");
        s.daemon.child.kill().unwrap();
        s.daemon.child.wait().unwrap();
        let alive = |p: &u32| std::path::Path::new(&format!("/proc/{p}")).exists();
        let gone = eventually(Duration::from_secs(10), || !pooled.iter().any(alive));
        assert!(gone, "left behind: {:?}", pooled.iter().filter(|p| alive(p)).collect::<Vec<_>>());
    }
}

/// Root's own `palisade run` (before the package is installed, or while
/// the service is down) keeps its journal, state and run directories where
/// a user's would (root's home) or its own (`/run/palisade-root`), never the system
/// broker's `/var/lib/palisade` and `/run/palisade`, which the unit's user
/// must find its own when the service starts.
#[test]
fn roots_own_run_keeps_out_of_the_system_brokers_directories() {
    if !is_root() {
        return skipped("not root: root's own run is what this is about");
    }
    let dir = TempDir::new("roots-own");
    let (home, runtime) = (dir.join("home"), dir.join("runtime"));
    for d in [&home, &runtime] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let listing = |p: &str| std::fs::read_dir(p).map(|d| d.count()).ok();
    let modified = |p: &str| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let before =
        (listing("/var/lib/palisade"), modified("/var/lib/palisade/journal"), listing("/run/palisade"));
    let o = std::process::Command::new(bin("palisade"))
        .args(["run", "--", "/usr/bin/echo", "root's own"])
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", &home)
        .env("XDG_RUNTIME_DIR", &runtime)
        .env(SYSTEM_CONFIG_ENV, test_system_config())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(0), "root's own\n"), "{}", text(&o.stderr));
    // Root's own, where a user's are.
    let journal = home.join(".local/state/palisade/journal");
    assert!(std::fs::read_dir(&journal).is_ok_and(|d| d.count() > 0), "{}", journal.display());
    assert!(Path::new("/run/palisade-root/runs").is_dir());
    // The system broker's, untouched.
    let after =
        (listing("/var/lib/palisade"), modified("/var/lib/palisade/journal"), listing("/run/palisade"));
    assert_eq!(before, after);
}

/// `palisade ARGS` as `user` with the supplementary `groups`, started and
/// left running (its output piped): one run of a flood.
fn spawn_in_groups(
    user: &nix::unistd::User,
    groups: &[nix::unistd::Gid],
    cwd: &Path,
    args: &[&str],
) -> std::process::Child {
    let mut argv = as_user_in(user, groups);
    argv.push(bin("palisade").to_string_lossy().into_owned());
    argv.extend(args.iter().map(|a| a.to_string()));
    std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .env_remove("PALISADE_SOCKET")
        .spawn()
        .unwrap()
}

/// `palisade status --json` as `user` (root when `None`).
fn status_json(socket: &Path, user: Option<&nix::unistd::User>) -> serde_json::Value {
    let mut argv = user.map(as_user).unwrap_or_default();
    argv.push(bin("palisade").to_string_lossy().into_owned());
    argv.extend(["status", "--json", "--socket", socket.to_str().unwrap()].map(String::from));
    let o = std::process::Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
    serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{o:?}"))
}

/// What requester `uid` holds, as root's status shows it: (running, queued).
fn held_by(socket: &Path, uid: u32) -> (u64, u64) {
    let v = status_json(socket, None);
    let all = v["operations"]["requesters"].as_array().cloned().unwrap_or_default();
    let mine = all.iter().find(|r| r["uid"].as_u64() == Some(uid.into()));
    mine.map_or((0, 0), |r| (r["running"].as_u64().unwrap(), r["queued"].as_u64().unwrap()))
}

/// Clients that are killed (their runs with them) when dropped.
struct Flood(Vec<std::process::Child>);

impl Drop for Flood {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One developer (let in through a supplementary group) floods a system
/// broker of two slots with runs that do not end; another's run still
/// starts at once, since one requester holds at most its share of the
/// slots (by default three quarters, rounded down: one of two) and of the
/// queue, and a freed slot goes to the requester with the fewest runs.
/// The flooder's run over its queue share is refused `Busy`, naming the
/// key; `status` lists each developer's own runs to them and all of them,
/// with the commands, to root. Counter-test: with a share of both slots,
/// the flood holds them and the other developer's run waits in the queue.
/// Through a root broker and one started as the system unit starts it.
#[test]
fn one_developers_flood_leaves_the_others_runs_a_slot() {
    let (Some(users), Some(devs)) = (system_users(), system_group("palisade-devs")) else {
        skipped("not root: a root broker serving other users cannot be tested as an ordinary user");
        return;
    };
    let (dev1, dev2) = (&users.attacker, &users.victim);
    let base = TempDir::new("fair");
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ws1, ws2) = (base.join("ws1"), base.join("ws2"));
    owned_dir(&ws1, dev1, 0o755);
    owned_dir(&ws2, dev2, 0o755);
    let cases = [
        (false, ""),
        (false, "max_concurrent_per_uid = 2\n"),
        (true, ""),
        (true, "max_concurrent_per_uid = 2\n"),
    ];
    for (unit, share) in cases {
        let Some(d) = fair_broker(
            unit,
            base.path(),
            &format!(
                "[broker]\nallowed_gids = [\"palisade-devs\"]\nallowed_uids = [0, {}]\nsocket_mode = 0o666\n\
             max_concurrent = 2\nmax_queued = 8\nmax_queued_per_uid = 3\n{share}",
                dev2.uid
            ),
        ) else {
            continue;
        };
        let socket = d.socket.to_str().unwrap();
        let (ws1_arg, probe) = (ws1.to_str().unwrap(), probe());
        let flood_one = |i: usize| {
            let token = format!("fair-{}-{i}", std::process::id());
            let args = ["run", "--socket", socket, "--workspace", ws1_arg, "--timeout", "300", "--", &probe];
            spawn_in_groups(dev1, &[devs.gid], &ws1, &[&args[..], &["sleep", &token]].concat())
        };
        let running: u64 = if share.is_empty() { 1 } else { 2 };
        let mut flood = Flood(Vec::new());
        for i in 0..running as usize + 3 {
            flood.0.push(flood_one(i));
        }
        let want = (running, 3);
        let reached = eventually(Duration::from_secs(60), || held_by(&d.socket, dev1.uid.as_raw()) == want);
        assert!(reached, "{:?}, not {want:?}\n{}", held_by(&d.socket, dev1.uid.as_raw()), d.log());
        // Over its share of the queue: refused, naming the key.
        let over = flood_one(9).wait_with_output().unwrap();
        assert_eq!(over.status.code(), Some(125), "{}", text(&over.stdout));
        assert!(text(&over.stderr).contains("max_queued_per_uid = 3"), "{}", text(&over.stderr));
        if share.is_empty() {
            let o = echo_in_groups(&d.socket, &ws2, dev2, &[], "fair");
            assert_eq!(
                (o.status.code(), text(&o.stdout)),
                (Some(0), "ok fair\n".into()),
                "{}",
                text(&o.stderr)
            );
            // The flood is still all there: the run did not wait for it.
            assert_eq!(held_by(&d.socket, dev1.uid.as_raw()), want);
            operators_and_requesters_see_the_runs(&d.socket, dev1, dev2);
        } else {
            let waiting = spawn_in_groups(
                dev2,
                &[],
                &ws2,
                &[
                    "run",
                    "--socket",
                    socket,
                    "--workspace",
                    ws2.to_str().unwrap(),
                    "--",
                    &probe,
                    "echo",
                    "late",
                ],
            );
            let queued =
                eventually(Duration::from_secs(60), || held_by(&d.socket, dev2.uid.as_raw()) == (0, 1));
            assert!(queued, "{:?}\n{}", held_by(&d.socket, dev2.uid.as_raw()), d.log());
            drop(flood);
            let o = waiting.wait_with_output().unwrap();
            assert_eq!(text(&o.stdout), "ok late\n", "{}", text(&o.stderr));
        }
    }
}

/// A system broker of `config`: root's, or (`unit`) one started as the
/// system unit starts it (its user, capabilities and umask); `None` where
/// the unit's user cannot be made.
fn fair_broker(unit: bool, base: &Path, config: &str) -> Option<Daemon> {
    if !unit {
        return Some(Daemon::start(config));
    }
    let user = unit_user()?;
    let config = with_temp_root(config, &unit_runs_dir(base, &user));
    let prefix = as_the_unit(&unit_caps(), &user);
    Some(Daemon::start_with(DaemonOptions { config, prefix, owner: Some(user), ..Default::default() }))
}

/// What `status` shows dev2 (its own runs; dev1's only counted) and root
/// (every run, with its requester and command) while dev1 floods.
fn operators_and_requesters_see_the_runs(socket: &Path, dev1: &nix::unistd::User, dev2: &nix::unistd::User) {
    let theirs = status_json(socket, Some(dev2));
    let ops = &theirs["operations"];
    assert_eq!(ops["runs"].as_array().map(Vec::len), Some(0), "{theirs}");
    assert_eq!(ops["runs_omitted"].as_u64(), Some(4), "{theirs}");
    assert_eq!(ops["system"].as_bool(), Some(true), "{theirs}");
    let root = status_json(socket, None);
    let runs = root["operations"]["runs"].as_array().cloned().unwrap_or_default();
    let states: Vec<&str> = runs.iter().filter_map(|r| r["state"].as_str()).collect();
    assert_eq!((runs.len(), states.iter().filter(|s| **s == "queued").count()), (4, 3), "{root}");
    let first = &runs[0];
    assert_eq!(first["uid"].as_u64(), Some(dev1.uid.as_raw().into()), "{root}");
    assert_eq!(first["user"].as_str(), Some(dev1.name.as_str()), "{root}");
    assert!(first["argv"][1] == "sleep", "{root}");
    assert_eq!(root["operations"]["socket"].as_str(), Some(socket.to_str().unwrap()), "{root}");
}
