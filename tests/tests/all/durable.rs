//! A run's writes outlive what can end it, and an apply never writes over
//! what someone changes while it runs. The broker killed during a run: its
//! writes are held at the next start, and said so; killed during an apply:
//! the change set says it is part-applied, and applying it again finishes
//! it; `palisade run` sent SIGTERM or SIGHUP: the run is cancelled and its
//! writes held; the workspace's disk filling during an apply: what did not
//! fit stays held and the run says so. A host edit made in the window
//! between an apply's check of a file and its replacement (held open by the
//! broker's fault hook, or the copy's own time, found by fanotify or by
//! inotify as the apply's temporary file appears) survives, the file
//! appended, replaced, or replaced by a directory or a symlink, and the
//! run's version is held as a conflict: through the embedded broker, the
//! user's daemon and a root daemon acting for the user; also where
//! `renameat2` has no flags (the fault hook takes them away).

use palisade_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Where a run goes, and as whom.
struct Broker {
    /// `--socket S` or `--policy P`.
    at: Vec<String>,
    user: Option<nix::unistd::User>,
    state: PathBuf,
    /// What `palisade` runs with besides (an embedded broker's faults).
    env: Vec<(String, String)>,
    _daemon: Option<Daemon>,
}

/// A directory its user may use: the state of an embedded broker, or a workspace.
fn users_dir(path: &Path, user: Option<&nix::unistd::User>) {
    match user {
        Some(u) => owned_dir(path, u, 0o755),
        None => std::fs::create_dir_all(path).unwrap(),
    }
}

impl Broker {
    /// `palisade ARGS` as the broker's user, in `cwd`, with `env`.
    fn palisade(&self, cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut argv: Vec<String> = self.user.as_ref().map(as_user).unwrap_or_default();
        argv.push(bin("palisade").to_string_lossy().into_owned());
        argv.extend(args.iter().map(|a| a.to_string()));
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..])
            .current_dir(cwd)
            .stdin(Stdio::null())
            .env_remove("PALISADE_SOCKET")
            .env("PALISADE_STATE", &self.state)
            .env("PALISADE_JOURNAL", self.state.join("journal"))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(env.iter().copied());
        c
    }

    /// `palisade run AT FLAGS -- probe ops OPS`.
    fn run(&self, ws: &Path, flags: &[&str], ops: &[&str]) -> Command {
        let probe = probe();
        let mut args: Vec<&str> = vec!["run"];
        args.extend(self.at.iter().map(String::as_str));
        args.extend(flags);
        args.extend(["--", &probe, "ops"]);
        args.extend(ops);
        self.palisade(ws, &args, &[])
    }

    /// `palisade changes ARGS AT --json`: the reply and the output.
    fn changes(&self, ws: &Path, args: &[&str], env: &[(&str, &str)]) -> (Value, Output) {
        let mut all = vec!["changes"];
        all.extend(args);
        all.extend(self.at.iter().map(String::as_str));
        all.push("--json");
        let o = self.palisade(ws, &all, env).output().unwrap();
        (serde_json::from_slice(&o.stdout).unwrap_or(Value::Null), o)
    }
}

/// The user runs go as (the unprivileged test user, as root), and a state directory of its.
fn base(tag: &str) -> (TempDir, Option<nix::unistd::User>) {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new(tag);
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, is_root().then(test_user))
}

fn embedded(dir: &TempDir, user: Option<&nix::unistd::User>, config: &str) -> Broker {
    use std::os::unix::fs::PermissionsExt;
    let policy = dir.join("embedded.toml");
    std::fs::write(&policy, test_config(config)).unwrap();
    std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let state = dir.join("embedded-state");
    users_dir(&state, user);
    let at = vec!["--policy".into(), policy.to_string_lossy().into_owned()];
    Broker { at, user: user.cloned(), state, env: vec![], _daemon: None }
}

/// The user's own daemon (`root`: a root daemon acting for the user), its state in `state`, with `env`.
fn daemon(
    dir: &TempDir,
    user: Option<&nix::unistd::User>,
    root: bool,
    state: &Path,
    env: &[(&str, &str)],
) -> Broker {
    let shells = "allow_interpreters = true\nallow_inline_code = true\n";
    let config = match (root, user) {
        (true, Some(u)) => format!("{shells}[broker]\nallowed_uids = [{}]\nsocket_mode = 0o666\n", u.uid),
        _ => shells.to_string(),
    };
    let mut env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    env.push(("PALISADE_STATE".into(), state.to_string_lossy().into_owned()));
    let runs_as = if root { None } else { user.cloned() };
    if !root {
        users_dir(state, user);
    }
    let d = Daemon::start_with(DaemonOptions { config, user: runs_as, env, ..Default::default() });
    let client_state = dir.join(if root { "root-client" } else { "user-client" });
    users_dir(&client_state, user);
    let at = vec!["--socket".into(), d.socket.to_string_lossy().into_owned()];
    Broker { at, user: user.cloned(), state: client_state, env: vec![], _daemon: Some(d) }
}

/// Whether a run's layer in the store under `state` holds `name` yet.
fn layer_holds(store: &Path, name: &str) -> bool {
    let Ok(uids) = std::fs::read_dir(store) else { return false };
    uids.flatten().any(|u| {
        std::fs::read_dir(u.path()).into_iter().flatten().flatten().any(|d| {
            d.file_name().to_string_lossy().starts_with(".new-")
                && d.path().join("0/upper").join(name).exists()
        })
    })
}

#[test]
fn a_broker_killed_during_a_run_holds_its_writes_at_its_next_start() {
    let (dir, user) = base("durable-killed");
    let ws = dir.join("ws");
    users_dir(&ws, user.as_ref());
    let state = dir.join("daemon-state");
    // One journal for both brokers, as a user's daemon keeps in its state.
    let journal = state.join("journal");
    let journal_env = [("PALISADE_JOURNAL", journal.to_str().unwrap())];
    let first = daemon(&dir, user.as_ref(), false, &state, &journal_env);
    let client = first
        .run(&ws, &[], &["put", "made.txt", "by the run\n", "sleep", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(20), || layer_holds(&state.join("changes"), "made.txt")));
    let mut d = first._daemon.unwrap();
    let killed = d.child.id();
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    let o = client.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    assert!(text(&o.stderr).contains("its writes are held when the broker starts again"), "{}", said(&o));
    assert!(!ws.join("made.txt").exists());
    // The next start holds them, and says why; the change set names the
    // broker that ran the run (the killed one), not the one that held it.
    let next = daemon(&dir, user.as_ref(), false, &state, &journal_env);
    // Its journal says the killed broker ended without stopping, and its run with it.
    let records: Vec<serde_json::Value> = std::fs::read_dir(&journal)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("segment-"))
        .flat_map(|e| {
            std::fs::read_to_string(e.path()).unwrap().lines().map(String::from).collect::<Vec<_>>()
        })
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    let by_killed = |event: &str| {
        records.iter().any(|r| {
            r["event"] == event && r["lost"].as_str().is_some_and(|t| t.starts_with(&format!("{killed}-")))
        })
    };
    assert!(by_killed("run_lost") && by_killed("broker_lost"), "{records:?}");
    let lost = records.iter().find(|r| r["event"] == "run_lost").unwrap();
    assert_eq!(lost["run_id"], 1, "{lost}");
    let (listed, o) = next.changes(&ws, &["list"], &[]);
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{}", said(&o));
    assert!(listed[0]["reason"].as_str().unwrap().contains("the broker stopped during run"), "{listed}");
    let broker = listed[0]["broker"].as_str().unwrap_or_default();
    assert!(broker.starts_with(&format!("{killed}-")), "{listed}");
    let id = listed[0]["id"].as_str().unwrap().to_string();
    let (_, o) = next.changes(&ws, &["apply", &id], &[]);
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(std::fs::read_to_string(ws.join("made.txt")).unwrap(), "by the run\n");
}

#[test]
fn a_broker_killed_during_a_run_in_place_takes_out_what_it_made_that_the_host_executes_at_its_next_start() {
    let (dir, user) = base("durable-direct");
    let ws = dir.join("ws");
    users_dir(&ws, user.as_ref());
    let b = embedded(
        &dir,
        user.as_ref(),
        "allow_interpreters = true\nallow_inline_code = true\nallow_direct = true\n",
    );
    let mut argv = vec!["run".to_string()];
    argv.extend(b.at.iter().cloned());
    let script = "echo '{}' > .mcp.json; echo plain > plain.txt; sleep 30";
    argv.extend(["--direct", "--", "sh", "-c", script].map(String::from));
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut client = b.palisade(&ws, &args, &[]).stderr(Stdio::piped()).spawn().unwrap();
    assert!(eventually(Duration::from_secs(20), || ws.join("plain.txt").exists()));
    // The embedded broker is the CLI's own process.
    client.kill().unwrap();
    client.wait().unwrap();
    assert!(ws.join(".mcp.json").exists(), "made in place while the run ran");
    // Its next start takes it out and holds it, and says why.
    let (listed, o) = b.changes(&ws, &["list"], &[]);
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{}", said(&o));
    assert!(listed[0]["reason"].as_str().unwrap().contains("the broker stopped during run"), "{listed}");
    assert!(!ws.join(".mcp.json").exists());
    assert_eq!(std::fs::read_to_string(ws.join("plain.txt")).unwrap(), "plain\n");
}

#[test]
fn a_broker_killed_during_an_apply_leaves_it_part_applied_and_said_and_applying_again_finishes_it() {
    let (dir, user) = base("durable-apply");
    let ws = dir.join("ws");
    users_dir(&ws.join("many"), user.as_ref());
    users_dir(&ws, user.as_ref());
    let b = embedded(&dir, user.as_ref(), "allow_interpreters = true\nallow_inline_code = true\n");
    let script = "import os\nfor i in range(20000):\n    open('many/f%05d' % i, 'w').write(str(i))\n";
    // Into a directory the host has: 20,000 entries applied one by one; the broker dies after 300.
    let mut argv = vec!["run".to_string()];
    argv.extend(b.at.iter().cloned());
    argv.extend(["--", "python3", "-c", script].map(String::from));
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    let o = b.palisade(&ws, &args, &[("PALISADE_FAULT_APPLY", "300")]).output().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&o.status), Some(9), "{}", said(&o));
    let landed = std::fs::read_dir(ws.join("many")).unwrap().count();
    assert!((300..20000).contains(&landed), "{landed} files landed before the broker died");
    let (listed, o) = b.changes(&ws, &["list"], &[]);
    assert_eq!(listed[0]["status"], "partly_applied", "{}", said(&o));
    assert!(listed[0]["reason"].as_str().unwrap().contains("stopped while it applied it"), "{listed}");
    let id = listed[0]["id"].as_str().unwrap().to_string();
    let (applied, o) = b.changes(&ws, &["apply", &id], &[]);
    assert!(o.status.success(), "{}", said(&o));
    assert!(applied["id"].is_null(), "{applied}");
    for i in [0, 299, 300, 19999] {
        assert_eq!(std::fs::read_to_string(ws.join(format!("many/f{i:05}"))).unwrap(), i.to_string());
    }
    assert_eq!(std::fs::read_dir(ws.join("many")).unwrap().count(), 20000);
    let left: Vec<String> = std::fs::read_dir(ws.join("many"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".palisade"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_signal_to_palisade_run_cancels_the_run_and_holds_its_writes() {
    let (dir, user) = base("durable-signal");
    let embedded = embedded(&dir, user.as_ref(), "");
    let state = dir.join("daemon-state");
    let through_daemon = daemon(&dir, user.as_ref(), false, &state, &[]);
    for (b, store) in [(&embedded, embedded.state.join("changes")), (&through_daemon, state.join("changes"))]
    {
        for signal in [nix::sys::signal::Signal::SIGTERM, nix::sys::signal::Signal::SIGHUP] {
            let ws = dir.join(&format!("ws-{signal}-{}", b.at[0].trim_start_matches("--")));
            users_dir(&ws, user.as_ref());
            let name = format!("made-{signal}.txt");
            let child =
                b.run(&ws, &[], &["put", &name, "x", "sleep", "30"]).stderr(Stdio::piped()).spawn().unwrap();
            assert!(eventually(Duration::from_secs(20), || layer_holds(&store, &name)), "{signal}");
            // The CLI itself (setpriv execs it as the user: the same process).
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            nix::sys::signal::kill(pid, signal).unwrap();
            let o = child.wait_with_output().unwrap();
            assert_eq!(o.status.code(), Some(130), "{signal} {}: {}", b.at[0], said(&o));
            assert!(text(&o.stderr).contains("changes held as "), "{signal} {}: {}", b.at[0], said(&o));
            assert!(!ws.join(&name).exists());
            let (listed, _) = b.changes(&ws, &["list"], &[]);
            let held = listed
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["roots"][0].as_str().is_some_and(|r| Path::new(r) == ws) && s["entries"] == 1);
            assert!(held, "{signal} {}: {listed}", b.at[0]);
        }
    }
}

#[test]
fn a_disk_that_fills_during_an_apply_keeps_the_rest_held_and_the_run_says_so() {
    if !is_root() {
        skipped("not root: a small filesystem for the workspace cannot be mounted");
        return;
    }
    let (dir, user) = base("durable-full");
    let small = Tmpfs::mount(&dir, "size=8m,mode=0755");
    let ws = small.path().to_path_buf();
    // The requester's own, as a held change set's directory must be to be applied.
    users_dir(&ws, user.as_ref());
    let b = embedded(&dir, user.as_ref(), "allow_interpreters = true\nallow_inline_code = true\n");
    // 24 files of 1 MiB into 8 MiB: copied (the store is on another filesystem) until it is full.
    let mut ops: Vec<String> = vec![];
    for i in 0..24 {
        ops.extend(["bigfile".into(), format!("f{i:02}"), "1".into()]);
    }
    let ops: Vec<&str> = ops.iter().map(String::as_str).collect();

    let filler = write_ops(&b, &ws, &ops);
    let c = &filler["result"]["changes"];
    assert_eq!(c["outcome"], "partial", "{filler}");
    assert!(c["reason"].as_str().unwrap().contains("No space left on device"), "{filler}");
    let id = c["id"].as_str().unwrap().to_string();
    // Room made: applying again finishes it.
    let o = Command::new("mount").args(["-o", "remount,size=64m"]).arg(&ws).output().unwrap();
    assert!(o.status.success(), "{}", said(&o));
    let (applied, o) = b.changes(&ws, &["apply", &id], &[]);
    assert!(o.status.success(), "{}", said(&o));
    assert!(applied["id"].is_null(), "{applied}");
    for i in 0..24 {
        assert_eq!(std::fs::metadata(ws.join(format!("f{i:02}"))).unwrap().len(), 1 << 20);
    }
}

/// `palisade run --json -- probe` with the probe's `OPS` (each `bigfile`
/// op a 1 MiB file): the result, the run exiting 123 (not all landed).
fn write_ops(b: &Broker, ws: &Path, ops: &[&str]) -> Value {
    let probe = probe();
    let mut args: Vec<&str> = vec!["run", "--json"];
    args.extend(b.at.iter().map(String::as_str));
    let script: Vec<String> =
        ops.chunks(3).map(|op| format!("{} bigfile {} {}", probe, op[1], op[2])).collect();
    let script = script.join(" && ");
    args.extend(["--", "sh", "-c", &script]);
    let o = b.palisade(ws, &args, &[]).output().unwrap();
    assert_eq!(o.status.code(), Some(123), "{}", said(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", said(&o)))
}

/// What a person does to `data.bin` while an apply holds its window open.
#[derive(Clone, Copy, Debug)]
enum Edit {
    Append,
    Replace,
    /// The file replaced by a directory holding the person's file.
    Directory,
    /// The file replaced by a symlink to the person's file.
    Symlink,
}

/// Watches `marker` (the fault hook's): when the apply about to replace
/// `data.bin` names it, makes `edit` on the host's `data.bin` (once), then
/// lets the apply go on; any other entry goes on at once. Until `stop`;
/// whether it edited.
fn edit_in_the_window(
    marker: PathBuf,
    ws: PathBuf,
    edit: Option<Edit>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<bool> {
    std::thread::spawn(move || {
        let mut edited = false;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok(named) = std::fs::read(&marker) else {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            };
            if let (b"data.bin", Some(edit), false) = (named.as_slice(), edit, edited) {
                make(edit, &ws);
                edited = true;
            }
            let _ = std::fs::remove_file(&marker);
        }
        edited
    })
}

/// `edit` on the host's `data.bin` in `ws`.
fn make(edit: Edit, ws: &Path) {
    use std::os::unix::fs::MetadataExt;
    let data = ws.join("data.bin");
    match edit {
        Edit::Append => {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).open(&data).unwrap();
            f.write_all(b"the person's edit").unwrap();
        }
        Edit::Replace => {
            std::fs::write(ws.join("saved.tmp"), b"the person's file").unwrap();
            std::fs::rename(ws.join("saved.tmp"), &data).unwrap();
        }
        Edit::Directory => {
            std::fs::remove_file(&data).unwrap();
            std::fs::create_dir(&data).unwrap();
            std::fs::write(data.join("inside"), b"the person's file").unwrap();
            // The person's own, as the workspace is (a root test's user).
            let owner = std::fs::metadata(ws).unwrap();
            std::os::unix::fs::lchown(&data, Some(owner.uid()), Some(owner.gid())).unwrap();
        }
        Edit::Symlink => {
            std::fs::write(ws.join("elsewhere.bin"), b"the person's file").unwrap();
            std::os::unix::fs::symlink("elsewhere.bin", ws.join("link.tmp")).unwrap();
            std::fs::rename(ws.join("link.tmp"), &data).unwrap();
        }
    }
}

/// Whether `edit` is what the host's `data.bin` (of `mib` MiB before) holds.
fn edited(edit: Edit, ws: &Path, mib: usize) -> bool {
    let data = ws.join("data.bin");
    match edit {
        Edit::Append => std::fs::read(&data)
            .is_ok_and(|d| d.ends_with(b"the person's edit") && d.len() == (mib << 20) + 17),
        Edit::Replace => std::fs::read(&data).is_ok_and(|d| d == b"the person's file"),
        Edit::Directory => std::fs::read(data.join("inside")).is_ok_and(|d| d == b"the person's file"),
        Edit::Symlink => std::fs::read_link(&data).is_ok_and(|t| t == Path::new("elsewhere.bin")),
    }
}

/// How a test finds the window of an apply.
#[derive(Clone, Copy)]
enum Window<'a> {
    /// The fault hook's file.
    Marker(&'a Path),
    /// A hold on the open of the change set's copy, in the broker's `state`.
    Opening { state: &'a Path },
    /// The apply's temporary file appearing beside `data.bin` (inotify).
    Created,
}

/// A held run rewrote `data.bin` (`mib` MiB) and `small.txt`; the person
/// appends to `small.txt` before the apply (a conflict seen as ever) and
/// edits `data.bin` in the window of the apply. Both edits survive; the
/// run's versions are still held.
fn window_race(b: &Broker, ws: &Path, window: Window<'_>, edit: Edit, mib: usize) {
    let marker = match window {
        Window::Marker(m) => Some(m),
        Window::Opening { .. } | Window::Created => None,
    };
    std::fs::write(ws.join("data.bin"), vec![1u8; mib << 20]).unwrap();
    std::fs::write(ws.join("small.txt"), "original\n").unwrap();
    if let Some(u) = &b.user {
        for f in ["data.bin", "small.txt"] {
            nix::unistd::chown(&ws.join(f), Some(u.uid), Some(u.gid)).unwrap();
        }
    }
    let probe = probe();
    let script = format!("{probe} bigfile data.bin {mib} && {probe} ops put small.txt \"the run's\"");
    let mut args: Vec<&str> = vec!["run", "--hold-changes", "--json"];
    args.extend(b.at.iter().map(String::as_str));
    args.extend(["--", "sh", "-c", &script]);
    let o = b.palisade(ws, &args, &[]).output().unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", said(&o)));
    let id = v["result"]["changes"]["id"].as_str().unwrap_or_else(|| panic!("{v}")).to_string();
    // Its files written whole: not stopped (a disk bound) part-way.
    assert_eq!(v["result"]["status"]["exited"]["code"], 0, "{}", said(&o));
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(ws.join("small.txt")).unwrap();
        f.write_all(b"the person's line\n").unwrap();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = match window {
        Window::Marker(marker) => {
            edit_in_the_window(marker.to_path_buf(), ws.to_path_buf(), Some(edit), stop.clone())
        }
        Window::Opening { state } => edit_as_the_copy_opens(state, mib, ws.to_path_buf(), edit),
        Window::Created => edit_as_the_copy_appears(ws.to_path_buf(), edit, stop.clone()),
    };
    let marker_env = marker.map(|m| m.to_string_lossy().into_owned()).unwrap_or_default();
    let env: &[(&str, &str)] = match marker {
        Some(_) => &[("PALISADE_FAULT_APPLY_WINDOW", &marker_env)],
        None => &[],
    };
    let (applied, o) = b.changes(ws, &["apply", &id], env);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(watcher.join().unwrap(), "{edit:?}: the window was never opened: {}", said(&o));
    assert_eq!(o.status.code(), Some(123), "{edit:?}: {}", said(&o));
    assert!(edited(edit, ws, mib), "{edit:?}: the person's edit is gone: {}", said(&o));
    assert_eq!(std::fs::read_to_string(ws.join("small.txt")).unwrap(), "original\nthe person's line\n");
    let conflicts: Vec<&str> =
        applied["conflicts"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(conflicts.iter().any(|c| c.ends_with("data.bin")), "{edit:?}: {applied}");
    assert_eq!(applied["id"], id.as_str(), "{edit:?}: still held: {applied}");
    // Counter-test: told to, the run's version goes over the person's (a
    // daemon's windows opened and closed at once).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let opener = marker.map(|m| edit_in_the_window(m.to_path_buf(), ws.to_path_buf(), None, stop.clone()));
    let (_, o) = b.changes(ws, &["apply", &id, "--overwrite"], &[]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(opener) = opener {
        assert!(!opener.join().unwrap());
    }
    assert!(o.status.success(), "{}", said(&o));
    let data = std::fs::read(ws.join("data.bin")).unwrap();
    let kind = std::fs::symlink_metadata(ws.join("data.bin")).unwrap().file_type();
    assert!(
        kind.is_file() && data == vec![7u8; mib << 20],
        "{edit:?}: data.bin ({kind:?}, {} bytes) is not the run's: {}",
        data.len(),
        said(&o)
    );
}

#[test]
fn an_edit_in_the_window_of_an_apply_survives_and_the_runs_version_is_held() {
    let (dir, user) = base("durable-window");
    // Where the broker (as the test user, for two of them) writes its mark.
    let marks = dir.join("marks");
    users_dir(&marks, user.as_ref());
    let marker = marks.join("window");
    let marker_env = marker.to_string_lossy().into_owned();
    let mut brokers =
        vec![embedded(&dir, user.as_ref(), "allow_interpreters = true\nallow_inline_code = true\n")];
    let user_state = dir.join("user-state");
    brokers.push(daemon(
        &dir,
        user.as_ref(),
        false,
        &user_state,
        &[("PALISADE_FAULT_APPLY_WINDOW", &marker_env)],
    ));
    if is_root() {
        let root_state = dir.join("root-state");
        brokers.push(daemon(
            &dir,
            user.as_ref(),
            true,
            &root_state,
            &[("PALISADE_FAULT_APPLY_WINDOW", &marker_env)],
        ));
    }
    for (i, b) in brokers.iter().enumerate() {
        for edit in [Edit::Append, Edit::Replace, Edit::Directory, Edit::Symlink] {
            let ws = dir.join(&format!("ws-{i}-{edit:?}"));
            users_dir(&ws, user.as_ref());
            window_race(b, &ws, Window::Marker(&marker), edit, 8);
        }
    }
}

/// The same where the filesystem has no `RENAME_EXCHANGE` nor
/// `RENAME_NOREPLACE` (the broker's fault hook takes them away): the apply
/// checks the host's entry right before a plain rename and again after it,
/// and an edit in the window still survives, the run's version held.
/// Through the embedded broker and the user's daemon (a root daemon too, as root).
#[test]
fn without_renameat2_flags_an_edit_in_the_window_of_an_apply_still_survives() {
    let (dir, user) = base("durable-noexchange");
    let marks = dir.join("marks");
    users_dir(&marks, user.as_ref());
    let marker = marks.join("window");
    let marker_env = marker.to_string_lossy().into_owned();
    let faults =
        [("PALISADE_FAULT_APPLY_WINDOW", marker_env.as_str()), ("PALISADE_FAULT_NO_RENAME_FLAGS", "1")];
    let mut embedded = embedded(&dir, user.as_ref(), "allow_interpreters = true\nallow_inline_code = true\n");
    embedded.env = vec![("PALISADE_FAULT_NO_RENAME_FLAGS".into(), "1".into())];
    let mut brokers = vec![embedded, daemon(&dir, user.as_ref(), false, &dir.join("user-state"), &faults)];
    if is_root() {
        brokers.push(daemon(&dir, user.as_ref(), true, &dir.join("root-state"), &faults));
    }
    for (i, b) in brokers.iter().enumerate() {
        for edit in [Edit::Append, Edit::Replace, Edit::Directory, Edit::Symlink] {
            let ws = dir.join(&format!("ws-{i}-{edit:?}"));
            users_dir(&ws, user.as_ref());
            window_race(b, &ws, Window::Marker(&marker), edit, 8);
        }
    }
}

/// Watches `ws` (an inotify watch on `IN_CREATE`, in place before this
/// returns): the moment the apply's temporary file (`.palisade-apply-*`)
/// appears beside `data.bin`, as its copy begins, makes `edit` on the
/// host's `data.bin`. Until `stop`; whether it edited.
fn edit_as_the_copy_appears(
    ws: PathBuf,
    edit: Edit,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<bool> {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).unwrap();
    inotify.add_watch(&ws, AddWatchFlags::IN_CREATE).unwrap();
    std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let events = match inotify.read_events() {
                Ok(e) => e,
                Err(nix::errno::Errno::EAGAIN) => {
                    std::thread::sleep(Duration::from_micros(100));
                    continue;
                }
                Err(e) => panic!("inotify: {e}"),
            };
            let named = |e: &nix::sys::inotify::InotifyEvent| {
                e.name.as_ref().is_some_and(|n| n.to_string_lossy().starts_with(".palisade-apply-"))
            };
            if events.iter().any(named) {
                make(edit, &ws);
                return true;
            }
        }
        false
    })
}

/// Holds the next open of the change set's copy of `data.bin` (the one
/// file of `mib` MiB under `state`; a fanotify permission event): the
/// apply's open of it for its copy waits; in that window, after the apply's
/// check and before its swap, `edit` is made on the host's `data.bin`, then
/// the copy goes on. Returns once the hold is in place.
fn edit_as_the_copy_opens(
    state: &Path,
    mib: usize,
    ws: PathBuf,
    edit: Edit,
) -> std::thread::JoinHandle<bool> {
    use std::io::{BufRead, Write};
    let copy = files_under(state)
        .into_iter()
        .find(|p| {
            p.file_name() == Some("data.bin".as_ref())
                && std::fs::metadata(p).unwrap().len() == (mib << 20) as u64
        })
        .unwrap_or_else(|| panic!("no copy of data.bin under {}", state.display()));
    let mut holder = Command::new(probe())
        .args(["hold-open".as_ref(), copy.as_os_str()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = std::io::BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    said.read_line(&mut line).unwrap();
    assert_eq!(line, "held\n", "the hold on {}", copy.display());
    std::thread::spawn(move || {
        line.clear();
        said.read_line(&mut line).unwrap();
        let opened = line == "opened\n";
        if opened {
            make(edit, &ws);
        }
        let _ = holder.stdin.take().unwrap().write_all(b"go\n");
        let o = holder.wait_with_output().unwrap();
        assert!(o.status.success(), "the hold: {line} {}", said_of(&o, &mut said));
        opened
    })
}

/// What the hold's probe said past its first lines.
fn said_of(o: &Output, rest: &mut impl std::io::BufRead) -> String {
    let mut more = String::new();
    let _ = rest.read_to_string(&mut more);
    format!("{more}{}", said(o))
}

/// Every regular file under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            found.extend(files_under(&e.path()));
        } else if t.is_file() {
            found.push(e.path());
        }
    }
    found
}

/// Applied by a copy (the change sets on another filesystem than the
/// workspace: a tmpfs here), the window is the copy's own: a fanotify hold
/// on the change set's file stops the copy's open of it while the host's
/// file is edited (after the apply's check, before its swap). A root daemon acting
/// for the user.
#[test]
fn an_edit_made_while_an_apply_copies_survives_and_the_runs_version_is_held() {
    if !is_root() {
        skipped("not root: a filesystem for the change sets cannot be mounted");
        return;
    }
    let (dir, user) = base("durable-copy");
    let opening = [Edit::Append, Edit::Replace].map(|e| (e, "opening"));
    // An inotify watcher edits the moment the apply's temporary file appears (its copy begun).
    let created = [Edit::Append, Edit::Replace, Edit::Directory, Edit::Symlink].map(|e| (e, "created"));
    for (edit, how) in opening.into_iter().chain(created) {
        // Its state, and so its change sets, on a tmpfs of its own: another
        // filesystem than the workspace's, with more free than `[changes]
        // min_free_mb` (1 GiB) keeps, lest the run be stopped as it writes.
        let fs = dir.join(&format!("fs-{how}-{edit:?}"));
        std::fs::create_dir(&fs).unwrap();
        let store = Tmpfs::mount_at(&fs, "size=2g,mode=0755");
        let state = store.path().join("state");
        let b = daemon(&dir, user.as_ref(), true, &state, &[]);
        let ws = dir.join(&format!("ws-{how}-{edit:?}"));
        users_dir(&ws, user.as_ref());
        let window = match how {
            "opening" => Window::Opening { state: &state },
            _ => Window::Created,
        };
        window_race(&b, &ws, window, edit, 64);
        drop(b);
    }
}

/// How many pairs [`back_to_back_runs_and_a_host_edit_just_before_a_run_are_never_conflicts`]
/// makes of each kind: `PALISADE_TEST_PAIRS`, else 50.
#[cfg(feature = "slow")]
fn pairs() -> usize {
    std::env::var("PALISADE_TEST_PAIRS").ok().and_then(|n| n.parse().ok()).unwrap_or(50)
}

/// A run's `changes` after `palisade run --json ... -- probe ops put s.txt CONTENT`.
#[cfg(feature = "slow")]
fn put(b: &Broker, ws: &Path, content: &str) -> Value {
    let o = b.run(ws, &["--json"], &["put", "s.txt", content]).output().unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", said(&o)));
    assert_eq!(o.status.code(), Some(0), "{v}");
    v["result"]["changes"].clone()
}

/// No spurious conflicts. A run right after another's apply (an agent's
/// next tool call), and a run right after a person's edit, editing the same
/// file, are never conflicts: a conflict is a host change after the run's
/// view, which is split from the host's changes exactly. Through the
/// embedded broker, the user's daemon and a root daemon acting for the
/// user; a true concurrent edit is still one (`changes.rs`, the
/// `a_host_edit_during_a_run...` tests, and the window tests above).
#[cfg(feature = "slow")]
#[test]
fn back_to_back_runs_and_a_host_edit_just_before_a_run_are_never_conflicts() {
    let (dir, user) = base("durable-pairs");
    let mut brokers = vec![embedded(&dir, user.as_ref(), "")];
    brokers.push(daemon(&dir, user.as_ref(), false, &dir.join("user-state"), &[]));
    if is_root() {
        brokers.push(daemon(&dir, user.as_ref(), true, &dir.join("root-state"), &[]));
    }
    for (i, b) in brokers.iter().enumerate() {
        let ws = dir.join(&format!("ws-{i}"));
        users_dir(&ws, user.as_ref());
        let (mut spurious, n) = (Vec::new(), pairs());
        for pair in 0..n {
            for content in [format!("a{pair}"), format!("b{pair}")] {
                let c = put(b, &ws, &content);
                if c["outcome"] != "applied" || std::fs::read_to_string(ws.join("s.txt")).unwrap() != content
                {
                    spurious.push(c);
                }
            }
            // The person's edit, and the run at once.
            std::fs::write(ws.join("s.txt"), format!("host{pair}")).unwrap();
            let content = format!("c{pair}");
            let c = put(b, &ws, &content);
            if c["outcome"] != "applied" || std::fs::read_to_string(ws.join("s.txt")).unwrap() != content {
                spurious.push(c);
            }
        }
        assert!(spurious.is_empty(), "{} of {} runs {}: {spurious:?}", spurious.len(), 3 * n, b.at[0]);
    }
}
