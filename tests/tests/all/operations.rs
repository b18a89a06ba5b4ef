//! Operating a running palisaded: `SIGHUP` reads its configuration again
//! without touching the runs in progress, and keeps the running one when the
//! file does not load; `palisaded --check-config` says whether a start would
//! take a file, and touches nothing; `palisade status` reports the broker's
//! state. As root, a reload serves a user it adds to `allowed_uids` (by
//! name) while another user's run goes on; the rest runs again as the
//! unprivileged test user.

use palisade_protocol::wire::BrokerStatus;
use palisade_tests::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// An outer bound on what a test waits for (a reload, a run reaching its
/// gate): each takes well under a second.
const WAIT: Duration = Duration::from_secs(30);

/// Sends the daemon `SIGHUP` and waits until its log has said what became
/// of it: one more `configuration reloaded` or `configuration not reloaded`.
fn reload(d: &Daemon) {
    let count =
        |log: &str| log.matches("configuration reloaded").count() + log.matches("not reloaded").count();
    let before = count(&d.log());
    let pid = nix::unistd::Pid::from_raw(d.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    assert!(eventually(WAIT, || count(&d.log()) > before), "no word of the reload:\n{}", d.log());
}

/// The daemon's configuration file, rewritten as [`test_config`] makes `toml`.
fn rewrite(d: &Daemon, toml: &str) {
    std::fs::write(d.dir.join("palisade.toml"), test_config(toml)).unwrap();
}

/// `palisade status --json` against `d`, as `user` (root when `None`).
fn status_as(d: &Daemon, user: Option<&nix::unistd::User>) -> Result<BrokerStatus, String> {
    let o = status_command(d, user, &["--json"]).output().unwrap();
    if !o.status.success() {
        return Err(said(&o));
    }
    serde_json::from_slice(&o.stdout).map_err(|e| format!("{e}: {}", said(&o)))
}

fn status(d: &Daemon) -> BrokerStatus {
    status_as(d, None).unwrap()
}

fn status_command(d: &Daemon, user: Option<&nix::unistd::User>, extra: &[&str]) -> Command {
    let mut argv = user.map(as_user).unwrap_or_default();
    argv.push(bin("palisade").to_string_lossy().into_owned());
    argv.extend(["status".into(), "--socket".into(), d.socket.to_string_lossy().into_owned()]);
    argv.extend(extra.iter().map(|a| a.to_string()));
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).stdin(Stdio::null());
    cmd
}

/// A profile `gated` that may read the gate's directory (and the probe).
fn gated_profile(gate: &Gate) -> String {
    let probe_dir = bin("probe").parent().unwrap().to_string_lossy().into_owned();
    format!("[profiles.gated]\nread_only = [{probe_dir:?}, {:?}]\n", gate.dir.to_string_lossy())
}

/// `palisade run --profile gated -- probe read GATE` against `d` as `user`,
/// in `ws`, in the background: a run in progress until the gate opens.
fn gated_run(
    d: &Daemon,
    ws: &Path,
    gate: &Gate,
    user: Option<&nix::unistd::User>,
) -> std::thread::JoinHandle<Output> {
    let (socket, ws, gate) = (d.socket.clone(), ws.to_path_buf(), gate.path.clone());
    let user = user.cloned();
    std::thread::spawn(move || {
        let pre = [
            "run",
            "--socket",
            socket.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
            "--profile",
            "gated",
        ];
        palisade_cli(&ws, &pre, &[&probe(), "read", gate.to_str().unwrap()], user.as_ref())
    })
}

/// `palisade run --socket S --workspace WS -- probe echo WORD` as `user`.
fn echo(d: &Daemon, ws: &Path, user: Option<&nix::unistd::User>, word: &str) -> Output {
    let pre = ["run", "--socket", d.socket.to_str().unwrap(), "--workspace", ws.to_str().unwrap()];
    palisade_cli(ws, &pre, &[&probe(), "echo", word], user)
}

fn echoed(o: &Output, word: &str) -> bool {
    o.status.success() && text(&o.stdout) == format!("ok {word}\n")
}

/// Waits until `d` has `n` runs in flight.
fn in_flight(d: &Daemon, n: u64) {
    assert!(
        eventually(WAIT, || status(d).runs_in_flight == n),
        "not {n} runs in flight: {:?}\n{}",
        status(d),
        d.log()
    );
}

/// The journal's `config_reloaded` records.
fn reload_records(d: &Daemon) -> Vec<serde_json::Value> {
    journal_records(&d.journal()).into_iter().filter(|r| r["event"] == "config_reloaded").collect()
}

#[test]
fn a_reload_leaves_runs_in_progress_alone_and_decides_what_comes_next() {
    let dir = TempDir::new("reload");
    let ws = shared_workspace(&dir, "ws");
    let gate = Gate::new(dir.path(), None);
    let slots = "[broker]\nmax_concurrent = 1\nmax_queued = 0\n";
    let d = Daemon::start(&format!("{slots}{}", gated_profile(&gate)));
    let first = gated_run(&d, &ws, &gate, None);
    in_flight(&d, 1);
    // Its one slot is taken and nothing may wait: another run is refused.
    let o = echo(&d, &ws, None, "busy");
    assert!(o.status.code() == Some(125) && text(&o.stderr).contains("Busy"), "{}", said(&o));

    // Two slots now, and no profile `gated`.
    rewrite(&d, "[broker]\nmax_concurrent = 2\nmax_queued = 0\n");
    reload(&d);
    assert!(d.log().contains("configuration reloaded"), "{}", d.log());
    let s = status(&d);
    assert_eq!((s.runs_in_flight, s.max_concurrent, s.config.reloads), (1, 2, 1), "{s:?}");
    // What comes next is decided by the new file: a second slot, no profile `gated`.
    assert!(echoed(&echo(&d, &ws, None, "second"), "second"));
    let o = gated_run(&d, &ws, &gate, None).join().unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    assert!(text(&o.stderr).contains("no profile \"gated\""), "{}", said(&o));
    // The run in progress keeps what it was decided with, and ends as it would have.
    assert!(gate.open(WAIT), "the first run never reached its gate:\n{}", d.log());
    let o = first.join().unwrap();
    assert_eq!((o.status.code(), text(&o.stdout)), (Some(0), "ok 2 bytes: go\n".into()), "{}", said(&o));
    in_flight(&d, 0);

    // One slot again: the free one is taken back at once.
    rewrite(&d, &format!("{slots}{}", gated_profile(&gate)));
    reload(&d);
    assert_eq!(status(&d).max_concurrent, 1);
    let held = gated_run(&d, &ws, &gate, None);
    in_flight(&d, 1);
    let o = echo(&d, &ws, None, "busy");
    assert!(o.status.code() == Some(125) && text(&o.stderr).contains("Busy"), "{}", said(&o));
    assert!(gate.open(WAIT), "the run never reached its gate:\n{}", d.log());
    assert!(held.join().unwrap().status.success());
    assert!(echoed(&echo(&d, &ws, None, "after"), "after"));
    assert_eq!(reload_records(&d).len(), 2);
}

#[test]
fn a_file_that_does_not_load_changes_nothing_and_the_log_says_why() {
    let d = Daemon::start("");
    let dir = TempDir::new("bad-reload");
    let ws = shared_workspace(&dir, "ws");
    let shell = ["sh", "-c", "echo shell"];
    let refused = |o: &Output| o.status.code() == Some(125) && text(&o.stderr).contains("interpreters");
    assert!(refused(&d.run(&ws, &shell)), "{}", said(&d.run(&ws, &shell)));
    let config = d.dir.join("palisade.toml");
    let loaded = status(&d).config;
    assert_eq!(loaded.file.as_deref(), Some(config.to_str().unwrap()));

    // A typo (line 4 of the file), and a group of nobody: neither reloads.
    rewrite(&d, "allow_interpreters = true\nallow_inline_cod = true\n");
    reload(&d);
    let typo = format!("{}:4:1: unknown field `allow_inline_cod`", config.display());
    assert!(d.log().contains(&typo), "{typo} not in:\n{}", d.log());
    rewrite(
        &d,
        "allow_interpreters = true\nallow_inline_code = true\n[broker]\nallowed_gids = [\"palisade-no-such-group\"]\n",
    );
    reload(&d);
    assert!(d.log().contains("no group named \"palisade-no-such-group\" on this host"), "{}", d.log());
    assert_eq!(d.log().matches("configuration not reloaded; the running one stays in force").count(), 2);
    // status shows the failure, with its reason to the broker's own user.
    let last = status(&d).operations.and_then(|o| o.last_reload).expect("a last reload");
    assert!(
        !last.ok && last.error.as_deref().is_some_and(|e| e.contains("palisade-no-such-group")),
        "{last:?}"
    );
    let shown = status_command(&d, None, &[]).output().unwrap();
    assert!(text(&shown.stdout).contains("last reload: FAILED"), "{}", said(&shown));
    // The running policy stays: interpreters are still refused, nothing was recorded.
    let o = d.run(&ws, &shell);
    assert!(refused(&o), "{}", said(&o));
    assert_eq!(status(&d).config, loaded);
    assert!(reload_records(&d).is_empty());
    // The journal records each failure, in the file's own words.
    let failed: Vec<serde_json::Value> =
        journal_records(&d.journal()).into_iter().filter(|r| r["event"] == "config_reload_failed").collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert!(failed[0]["error"].as_str().unwrap().contains(&typo), "{}", failed[0]);
    assert_eq!(failed[0]["path"], config.to_str().unwrap());

    // Counter-test: the same change without the typo takes effect.
    rewrite(&d, "allow_interpreters = true\nallow_inline_code = true\n");
    reload(&d);
    let o = d.run(&ws, &shell);
    assert_eq!((o.status.code(), text(&o.stdout)), (Some(0), "shell\n".into()), "{}", said(&o));
    assert_eq!(status(&d).config.reloads, 1);
    assert_eq!(
        status(&d).operations.and_then(|o| o.last_reload).map(|r| (r.ok, r.error)),
        Some((true, None))
    );
    let records = reload_records(&d);
    let text = std::fs::read(&config).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["sha256"], palisade_broker::journal::attest::sha256_hex(&text));
    assert_eq!(records[0]["path"], config.to_str().unwrap());

    // A key that needs a restart keeps its running value, and the log says so.
    rewrite(&d, "allow_interpreters = true\nallow_inline_code = true\n[broker]\nprespawn = 5\n");
    reload(&d);
    assert!(d.log().contains("broker.prespawn changed in"), "{}", d.log());
    assert_eq!(status(&d).pool.size, 2);
    assert_eq!(reload_records(&d).last().unwrap()["needs_restart"], serde_json::json!(["broker.prespawn"]));
}

#[test]
fn check_config_says_ok_or_names_the_error_and_touches_nothing() {
    let dir = TempDir::new("check-config");
    let check = |toml: &str| {
        let file = dir.join("p.toml");
        std::fs::write(&file, toml).unwrap();
        let o = Command::new(bin("palisaded"))
            .args(["--check-config", file.to_str().unwrap()])
            .env("PALISADE_JOURNAL", dir.join("journal"))
            .env("PALISADE_STATE", dir.join("state"))
            .env("XDG_RUNTIME_DIR", dir.join("runtime"))
            .output()
            .unwrap();
        (o.status.code(), text(&o.stdout), text(&o.stderr), file.display().to_string())
    };
    let (code, out, err, file) = check(&test_config("[broker]\nallowed_uids = [\"root\", 0]\n"));
    assert_eq!((code, out), (Some(0), format!("{file}: ok\n")), "{err}");
    for (toml, want) in [
        ("[broker]\nmax_concurent = 4\n".to_string(), ":2:1: unknown field `max_concurent`"),
        (
            "[broker]\nallowed_gids = [\"palisade-no-such-group\"]\n".into(),
            ":2:17: broker.allowed_gids: no group named",
        ),
        ("[approvers]\nuids = [\"palisade-no-such-user\"]\n".into(), ":2:9: approvers.uids: no user named"),
        ("[policy]\ncedar = \"p.cedar\"\n".into(), "[policy] cedar: cannot read"),
        (format!("[broker]\nhelper = {:?}\n", dir.join("no-helper").to_string_lossy()), "no-helper"),
    ] {
        let (code, out, err, file) = check(&toml);
        assert_eq!((code, out.as_str()), (Some(2), ""), "{toml}: {err}");
        assert!(err.starts_with("palisaded: ") && err.contains(want), "{toml}: {err} (file {file})");
    }
    // A broken Cedar file is named with its line; a good one is ok.
    std::fs::write(dir.join("p.cedar"), "permit(principal, action, resource) when { nonsense };\n").unwrap();
    let (code, _, err, _) = check("[policy]\ncedar = \"p.cedar\"\n");
    assert!(code == Some(2) && err.contains("p.cedar:1:"), "{err}");
    std::fs::write(dir.join("p.cedar"), "permit(principal, action, resource);\n").unwrap();
    assert_eq!(check("[policy]\ncedar = \"p.cedar\"\n").0, Some(0));
    // Nothing was made: no journal, no state, no socket.
    for made in ["journal", "state", "runtime"] {
        assert!(!dir.join(made).exists(), "--check-config made {made}");
    }
}

#[test]
fn status_reports_the_runs_the_pool_the_journal_and_the_configuration() {
    let dir = TempDir::new("status");
    let ws = shared_workspace(&dir, "ws");
    let gate = Gate::new(dir.path(), None);
    let d = Daemon::start(&gated_profile(&gate));
    let s = status(&d);
    assert_eq!(
        (s.version.as_str(), s.protocol),
        (env!("CARGO_PKG_VERSION"), palisade_protocol::wire::PROTOCOL_VERSION)
    );
    assert_eq!((s.pid, s.uid), (d.child.id(), nix::unistd::geteuid().as_raw()));
    assert_eq!((s.runs_in_flight, s.runs_queued, s.max_concurrent, s.max_queued), (0, 0, 16, 128));
    assert!(
        ["v2", "v1", "none"].contains(&s.cgroup.mode.as_str()) && !s.cgroup.description.is_empty(),
        "{s:?}"
    );
    assert_eq!(s.config.file.as_deref(), Some(d.dir.join("palisade.toml").to_str().unwrap()));
    assert_eq!(s.config.reloads, 0);
    // The warm pool fills up to its size.
    assert!(eventually(WAIT, || status(&d).pool.idle == 2), "{:?}", status(&d));
    assert_eq!(status(&d).pool.size, 2);

    // A run in progress is counted, and no longer once it is over.
    let run = gated_run(&d, &ws, &gate, None);
    in_flight(&d, 1);
    let shown = text(&status_command(&d, None, &[]).output().unwrap().stdout);
    assert!(shown.contains("runs:        1 in flight (of 16), 0 queued (of 128)"), "{shown}");
    assert!(shown.contains(&format!("config:      {}", d.dir.join("palisade.toml").display())), "{shown}");
    assert!(gate.open(WAIT));
    assert!(run.join().unwrap().status.success());
    in_flight(&d, 0);
    // The journal's head is its newest record, the run's end.
    let head = status(&d).journal.expect("the journal is on");
    let records = journal_records(&d.journal());
    assert!(records.iter().any(|r| r["event"] == "run_finished"));
    let newest = records.last().unwrap();
    assert_eq!(
        (serde_json::json!(head.seq), serde_json::json!(head.hash)),
        (newest["seq"].clone(), newest["hash"].clone())
    );
    assert_eq!(Path::new(&head.dir), d.journal());
    let shown = text(&status_command(&d, None, &[]).output().unwrap().stdout);
    assert!(shown.contains(&format!("journal:     head {} {}", head.seq, head.hash)), "{shown}");
}

/// As root: a reload adds a user, by name, while another user's run is in
/// progress; that run ends normally and the added user is served from then
/// on (and may ask for the status), where before it was refused.
#[test]
fn a_reload_adds_a_user_while_another_users_run_goes_on() {
    let Some(users) = system_users() else {
        skipped("not root: a broker serving other users takes root");
        return;
    };
    let (attacker, victim) = (&users.attacker, &users.victim);
    let dir = TempDir::new("reload-uid");
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (ws_a, ws_v) = (dir.join("a"), dir.join("v"));
    owned_dir(&ws_a, attacker, 0o755);
    owned_dir(&ws_v, victim, 0o755);
    let gate = Gate::new(dir.path(), Some(victim));
    let config = |uids: &str| {
        format!("[broker]\nallowed_uids = [{uids}]\nsocket_mode = 0o666\n{}", gated_profile(&gate))
    };
    let d = Daemon::start(&config(&format!("0, {}", victim.uid)));
    let run = gated_run(&d, &ws_v, &gate, Some(victim));
    in_flight(&d, 1);
    let o = echo(&d, &ws_a, Some(attacker), "a");
    assert!(o.status.code() == Some(125) && text(&o.stderr).contains("Unauthorized"), "{}", said(&o));
    assert!(status_as(&d, Some(attacker)).unwrap_err().contains("Unauthorized"));

    rewrite(&d, &config(&format!("0, {}, {:?}", victim.uid, attacker.name)));
    reload(&d);
    assert!(d.log().contains("configuration reloaded"), "{}", d.log());
    let o = echo(&d, &ws_a, Some(attacker), "a");
    assert!(echoed(&o, "a"), "{}", said(&o));
    // A run is answered before its sandbox is torn down, and counts until then.
    in_flight(&d, 1);
    let s = status_as(&d, Some(attacker)).unwrap();
    assert_eq!((s.runs_in_flight, s.config.reloads), (1, 1));
    assert!(gate.open(WAIT), "the victim's run never reached its gate:\n{}", d.log());
    let o = run.join().unwrap();
    assert_eq!((o.status.code(), text(&o.stdout)), (Some(0), "ok 2 bytes: go\n".into()), "{}", said(&o));
}

/// As root, the same file again as the unprivileged test user.
#[test]
fn the_operations_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_operations_suite_passes_as_an_unprivileged_user");
}

/// A directory under `root` for `user`'s workspace, removed (with `root`
/// itself when the test made it) when dropped.
struct Workspace {
    path: PathBuf,
    made_root: Option<PathBuf>,
}

impl Workspace {
    fn under(root: &Path, user: &nix::unistd::User) -> Workspace {
        let made_root = (!root.exists()).then(|| root.to_path_buf());
        std::fs::create_dir_all(root).unwrap();
        let path = root.join(format!("palisade-admin-{}-{}", std::process::id(), user.name));
        owned_dir(&path, user, 0o755);
        Workspace { path, made_root }
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
        if let Some(root) = &self.made_root {
            let _ = std::fs::remove_dir(root);
        }
    }
}

/// The system install as an administrator runs it from the README: the
/// package's configuration as shipped (`allowed_gids = ["palisade"]`) with
/// the journal's reader group enabled as its comment says, the socket the
/// socket unit makes (root:palisade 0660), and the broker started as the
/// unit starts it (its user, capabilities, umask 0077, no_new_privs).
/// Two developers in the group are served with no socket named, in a
/// workspace in each root the unit lets the service write (/home, /srv),
/// their outputs theirs under their own umask; a third is added by group
/// with no restart, and by uid with a reload while a run is in flight; a
/// file with a typo changes nothing; the reader group verifies the journal
/// and nobody else can. (The unit's mount namespace is
/// `the_system_units_file_system_serves_other_users`'s, in system.rs.)
#[test]
fn an_admin_serves_developers_from_the_system_broker_as_the_readme_says() {
    let groups = (system_users(), system_group("palisade"), system_group("palisade-audit"));
    let (Some(users), Some(devs), Some(auditors), Some(service)) =
        (groups.0, groups.1, groups.2, unit_user())
    else {
        skipped("not root: a system broker serving other users needs root");
        return;
    };
    let (dev1, dev2, dev3) = (&users.attacker, &users.victim, &test_user());
    let base = TempDir::new("admin");
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let gate = Gate::new(base.path(), Some(dev1));
    // The package's file, and what the README has the admin change in it.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let shipped = std::fs::read_to_string(root.join("deploy/debian/palisade.toml")).unwrap();
    let config = shipped.replace("# reader_gid = \"palisade-audit\"", "reader_gid = \"palisade-audit\"");
    assert_ne!(config, shipped, "the shipped configuration no longer offers reader_gid");
    // The runs' directories in the service's own runtime directory.
    let config = with_temp_root(&config, &unit_runs_dir(base.path(), &service));
    let d = Daemon::start_with(DaemonOptions {
        config: format!("{config}\n{}", gated_profile(&gate)),
        prefix: as_the_unit(&unit_caps(), &service),
        owner: Some(service.clone()),
        ..Default::default()
    });
    // The socket unit's SocketGroup=palisade and SocketMode=0660.
    nix::unistd::chown(&d.socket, None, Some(devs.gid)).unwrap();
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o660)).unwrap();
    // Users find the system broker as /etc/palisade names it (a file of the
    // test's here), with no broker of their own (an empty runtime directory).
    let system = base.join("system.toml");
    let journal = d.journal();
    let text_of = format!("[clients]\nsystem_socket = {:?}\n[journal]\npath = {journal:?}\n", d.socket);
    std::fs::write(&system, text_of).unwrap();
    let runtime = base.join("runtime");
    std::fs::create_dir(&runtime).unwrap();
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o777)).unwrap();
    let env = [(SYSTEM_CONFIG_ENV, system.as_path()), ("XDG_RUNTIME_DIR", runtime.as_path())];
    let ran_here = format!("palisade: run by the system broker on {}\n", d.socket.display());
    let write = |user: &nix::unistd::User, groups: &[nix::unistd::Gid], ws: &Path| {
        let out = ws.join("out");
        let args =
            ["run", "--workspace", ws.to_str().unwrap(), "--", &probe(), "write", out.to_str().unwrap()];
        (palisade_in_groups(user, groups, ws, &args, &env), out)
    };

    // Two developers, members of the group, each in a documented root.
    let homes = [Workspace::under(&dev1.dir, dev1), Workspace::under(Path::new("/srv"), dev2)];
    for (dev, ws) in [(dev1, &homes[0]), (dev2, &homes[1])] {
        let (o, out) = write(dev, &[devs.gid], &ws.path);
        assert!(o.status.success(), "{} in {}: {}\n{}", dev.name, ws.path.display(), said(&o), d.log());
        assert!(text(&o.stderr).contains(&ran_here), "{}", said(&o));
        let meta = std::fs::metadata(&out).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (dev.uid.as_raw(), 0o644), "{}", out.display());
    }
    // Counter-test: out of the group, refused by the system broker, and no
    // broker of the CLI's own runs it instead.
    let (o, out) = write(dev3, &[], &Workspace::under(&base.join("dev3"), dev3).path);
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    assert!(text(&o.stderr).contains("Unauthorized: the system broker on"), "{}", said(&o));
    assert!(!out.exists());

    // A third developer, added to the group: served, the broker untouched.
    let pid = d.child.id();
    let ws3 = Workspace::under(&base.join("dev3-in"), dev3);
    let (o, _) = write(dev3, &[devs.gid], &ws3.path);
    assert!(o.status.success(), "{}\n{}", said(&o), d.log());
    assert_eq!(d.child.id(), pid);

    // Or by uid, with a reload while dev1's run is in flight.
    let (socket, ws1) = (d.socket.clone(), homes[0].path.clone());
    let (fifo, dev1_run, devs_gid) = (gate.path.clone(), dev1.clone(), devs.gid);
    let first = std::thread::spawn(move || {
        let probe = probe();
        let args = [
            "run",
            "--socket",
            socket.to_str().unwrap(),
            "--workspace",
            ws1.to_str().unwrap(),
            "--profile",
            "gated",
            "--",
            &probe,
            "read",
            fifo.to_str().unwrap(),
        ];
        palisade_in_groups(&dev1_run, &[devs_gid], &ws1, &args, &[])
    });
    in_flight(&d, 1);
    // A uid outside the group connects only where the socket lets it: the
    // admin widens the socket unit's SocketMode (systemctl edit
    // palisade.socket), and the broker's own list still refuses it.
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (o, _) = write(dev3, &[], &ws3.path);
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    assert!(text(&o.stderr).contains(&format!("refuses uid {}", dev3.uid)), "{}", said(&o));
    let by_uid = config.replace("allowed_uids = []", &format!("allowed_uids = [{}]", dev3.uid));
    assert_ne!(by_uid, config, "the shipped configuration no longer has allowed_uids = []");
    rewrite(&d, &format!("{by_uid}\n{}", gated_profile(&gate)));
    reload(&d);
    assert!(d.log().contains("configuration reloaded"), "{}", d.log());
    let (o, _) = write(dev3, &[], &ws3.path);
    assert!(o.status.success(), "{}\n{}", said(&o), d.log());
    assert!(gate.open(WAIT), "dev1's run never reached its gate:\n{}", d.log());
    let o = first.join().unwrap();
    assert_eq!((o.status.code(), text(&o.stdout)), (Some(0), "ok 2 bytes: go\n".into()), "{}", said(&o));

    // A typo: the file in force stays, and the log says why.
    rewrite(&d, &by_uid.replace("allowed_gids", "allowed_gid"));
    reload(&d);
    assert!(d.log().contains("unknown field `allowed_gid`"), "{}", d.log());
    let (o, _) = write(dev3, &[], &ws3.path);
    assert!(o.status.success(), "{}\n{}", said(&o), d.log());
    assert_eq!(reload_records(&d).len(), 1);

    // The reader group verifies the journal; anybody else cannot read it.
    let verify = |user: &nix::unistd::User, groups: &[nix::unistd::Gid]| {
        let o = palisade_in_groups(user, groups, base.path(), &["audit", "verify", "--system"], &env);
        (o.status.code(), said(&o))
    };
    let (code, out) = verify(dev2, &[auditors.gid]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("verified: "), "{out}");
    let (code, out) = verify(dev1, &[devs.gid]);
    assert_eq!(code, Some(5), "{out}");
}

/// A memory share between requesters needs something that bounds each
/// run's memory: on a host where runs get no cgroup (this one, whose
/// cgroups the suite never writes), a broker with `max_memory_mb_per_uid`
/// refuses every run `Unavailable`, naming the key, and runs nothing;
/// without the key the same run goes.
#[test]
fn a_memory_share_where_no_cgroup_bounds_runs_is_refused() {
    let dir = TempDir::new("memory-share");
    let ws = shared_workspace(&dir, "ws");
    let d = Daemon::start("[broker]\nmax_memory_mb_per_uid = 1024\n");
    if status(&d).cgroup.mode != "none" {
        skipped("runs get a cgroup here: the share is enforced, not refused (tests/vm checks it)");
        return;
    }
    let o = d.run(&ws, &[&probe(), "put", "ran", "x"]);
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    let e = text(&o.stderr);
    assert!(e.contains("Unavailable") && e.contains("max_memory_mb_per_uid = 1024"), "{e}");
    assert!(!ws.join("ran").exists(), "a refused run ran");
    let d = Daemon::start("");
    let o = d.run(&ws, &[&probe(), "put", "ran", "x"]);
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    assert!(ws.join("ran").exists(), "{}", said(&o));
}
