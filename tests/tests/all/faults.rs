//! Faults, each injected for real: a panic in one request's handling, the
//! helper killed at each stage of its order, the broker `kill -9`ed with
//! runs in flight, the broker out of descriptors, a helper that cannot start
//! (out of memory or processes), a full disk under the run directories,
//! `SIGTERM` during a burst, a run's start not recorded. After each, the client
//! has its answer, nothing of the run is left (processes, descriptors,
//! mounts, run directories), and the daemon (or the next one) serves.
//!
//! The hooks that place a fault (`PALISADE_FAULT_PANIC`,
//! `PALISADE_HELPER_FAULT`, `PALISADE_FAULT_SPAWN`, `PALISADE_FAULT_RECORD`: broker/src/fault.rs,
//! helper/src/jail/fault.rs) exist
//! in debug builds only, so this file runs against the debug binaries.

use palisade_broker::cli::client::{Client, ClientError};
use palisade_protocol::Stage;
use palisade_protocol::wire::{ClientMessage, Encoding, ErrorKind, Hello, RunResult, RunStatus, encode};
use palisade_tests::*;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

fn token(tag: &str) -> String {
    format!("palisade-{tag}-{}-{:?}", std::process::id(), std::thread::current().id()).replace(['(', ')'], "")
}

/// A daemon with no helper started ahead (so that every process it has
/// belongs to a run), its run directories under `temp`, and `env`.
fn daemon(temp: &Path, env: Vec<(String, String)>, prefix: Vec<String>) -> Daemon {
    daemon_with(temp, ("", "", ""), env, prefix)
}

/// [`daemon`], with `defaults`, `broker` and `policy` added to those tables.
fn daemon_with(
    temp: &Path,
    (defaults, broker, policy): (&str, &str, &str),
    env: Vec<(String, String)>,
    prefix: Vec<String>,
) -> Daemon {
    assert!(
        std::env::var_os("PALISADE_TEST_RELEASE_DIR").is_none(),
        "the fault hooks exist in debug builds only: run this file against them"
    );
    let config = format!(
        "{defaults}[broker]\nprespawn = 0\n{broker}\n[policy]\ntemp_root = {:?}\n{policy}",
        temp.to_string_lossy()
    );
    Daemon::start_with(DaemonOptions { config, env, prefix, ..Default::default() })
}

fn run(socket: &Path, ws: &Path, args: &[&str]) -> Result<RunResult, ClientError> {
    Client::connect(socket)?.run(request(ws, args), |_| {})
}

fn expect_echo(socket: &Path, ws: &Path, d: &Daemon) {
    let r = run(socket, ws, &["echo", "still serving"]).unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    assert_eq!(r.status, RunStatus::Exited { code: 0 }, "{}", d.log());
}

/// Waits until nothing of the runs since `before` is left.
fn settles(d: &Daemon, temp: &Path, before: &Census) {
    let mut now = Census::of(d, temp);
    let settled = eventually(Duration::from_secs(10), || {
        now = Census::of(d, temp);
        now.nothing_left_since(before)
    });
    assert!(settled, "left behind: before {before:?}, now {now:?}\n{}", d.log());
}

#[test]
fn a_panic_in_one_run_answers_runtime_failure_kills_its_sandbox_and_the_daemon_goes_on() {
    let tok = token("panic");
    let temp = TempDir::new("runs");
    let d = daemon(temp.path(), vec![("PALISADE_FAULT_PANIC".into(), tok.clone())], vec![]);
    let ws = TempDir::new("ws");
    expect_echo(&d.socket, ws.path(), &d);
    let before = Census::of(&d, temp.path());
    // A run in flight on another connection, which the panic must not touch.
    let (socket, wsp) = (d.socket.clone(), ws.path().to_path_buf());
    let other = std::thread::spawn(move || {
        let mut req = request(&wsp, &["write-sleep", "/tmp/x", "2"]);
        req.timeout_secs = Some(30);
        Client::connect(&socket).unwrap().run(req, |_| {})
    });
    // The named run panics in the broker after its sandbox started (a
    // sleeper left behind by `daemonize` shows whether it was killed).
    match run(&d.socket, ws.path(), &["daemonize", &tok]) {
        Err(ClientError::Reply(e)) => {
            assert_eq!(e.kind, ErrorKind::RuntimeFailure, "{}", e.message);
            assert!(e.message.starts_with("internal error while serving run "), "{}", e.message);
        }
        other => panic!("{other:?}\n{}", d.log()),
    }
    assert!(
        eventually(Duration::from_secs(10), || sleeper_with_token(&tok).is_none()),
        "the panicked run's sandbox survived"
    );
    let log = d.log();
    assert!(log.contains("the run's handling panicked: fault injected"), "{log}");
    assert!(log.lines().any(|l| l.contains("panicked") && l.contains("run_id=")), "{log}");
    let other = other.join().unwrap().expect("the other run");
    assert_eq!(other.status, RunStatus::Exited { code: 0 });
    expect_echo(&d.socket, ws.path(), &d);
    settles(&d, temp.path(), &before);
    // The journal records how the panicked run ended.
    let journal = std::fs::read_dir(d.journal()).unwrap().flatten().map(|e| e.path());
    let text: String = journal.map(|p| std::fs::read_to_string(p).unwrap_or_default()).collect();
    assert!(text.contains("internal error while serving run"), "no run_failed record");
}

/// The stages of the helper's order a run of the default profile passes
/// through here, after which the fault hook can stop it.
fn stages() -> Vec<Stage> {
    let mut stages = vec![Stage::NoNewPrivs, Stage::Plan, Stage::Lifeline];
    if is_root() {
        // A root broker's helper becomes the sandbox's host ids first.
        stages.push(Stage::HostIds);
    }
    stages.extend([
        Stage::Namespaces,
        Stage::Fork,
        Stage::Mounts,
        Stage::Hostname,
        Stage::Loopback,
        Stage::Monitor,
        Stage::Rlimits,
        Stage::Capabilities,
        Stage::Landlock,
        Stage::Cwd,
        Stage::Session,
        Stage::Seccomp,
    ]);
    stages
}

/// The process the helper's hook stopped at `stage`, among `d`'s.
fn stopped_at(d: &Daemon, stage: Stage) -> Option<u32> {
    let name = format!("fault-{}", stage.name());
    // The kernel keeps 15 bytes of a process's name.
    let name = &name[..name.len().min(15)];
    descendants(d.child.id())
        .into_iter()
        .find(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == name))
}

#[test]
fn the_helper_killed_at_each_stage_leaves_nothing_and_the_client_is_answered() {
    let ws = TempDir::new("ws");
    let monitor = stages().iter().position(|s| *s == Stage::Monitor).unwrap();
    for (i, stage) in stages().into_iter().enumerate() {
        let after_monitor = i >= monitor;
        let temp = TempDir::new("runs");
        let env = vec![("PALISADE_HELPER_FAULT".into(), stage.name().to_string())];
        let d = daemon(temp.path(), env, vec![]);
        let before = Census::of(&d, temp.path());
        let (socket, wsp) = (d.socket.clone(), ws.path().to_path_buf());
        let client = std::thread::spawn(move || run(&socket, &wsp, &["echo", "never"]));
        let mut stopped = None;
        let found = eventually(Duration::from_secs(10), || {
            stopped = stopped_at(&d, stage);
            stopped.is_some()
        });
        assert!(found, "no helper stopped at {}\n{}", stage.name(), d.log());
        let pid = nix::unistd::Pid::from_raw(stopped.unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        // Answered, whatever the stage, with what is known. From `monitor`
        // on, the stopped process is the command's own (pid 1's child, not
        // yet exec'd), and pid 1 reports it killed; before, the sandbox's
        // supervisor itself was, and how the command ended is not known.
        match client.join().unwrap() {
            Ok(r) if after_monitor => assert_eq!(r.status, RunStatus::Signaled { signal: 9 }),
            Err(ClientError::Reply(e)) if !after_monitor => {
                assert_eq!(e.kind, ErrorKind::RuntimeFailure, "{}", e.message);
                let lost = "the sandbox ended before reporting how its command did: its helper ";
                assert!(e.message.starts_with(lost), "{}: {}", stage.name(), e.message);
            }
            other => panic!("{}: {other:?}\n{}", stage.name(), d.log()),
        }
        settles(&d, temp.path(), &before);
        // The next run gets its own helper, which stops at the same stage:
        // the daemon took it (and its answer is not waited for here).
        drop(d);
        eprintln!("killed at {}: answered, nothing left", stage.name());
    }
}

/// The end of a run after its answer: a helper that has reported every
/// process of its sandbox gone, and is held there by the hook before its
/// exit (which tears the namespaces and mounts down), does not hold up
/// the result. It is reaped once it exits, and nothing of the run is left.
/// The answer would wait for that exit, and so never come, if the broker
/// still waited for the helper's exit before answering. Until it exits, the
/// run is still counted in flight: the broker does not report itself idle.
#[test]
fn a_run_is_answered_before_its_helper_exits_and_the_helper_is_reaped_after() {
    let (ws, temp) = (TempDir::new("ws"), TempDir::new("runs"));
    let env = vec![("PALISADE_HELPER_FAULT".into(), Stage::Reaped.name().to_string())];
    let d = daemon(temp.path(), env, vec![]);
    let before = Census::of(&d, temp.path());
    let mut req = request(ws.path(), &["write", "kept"]);
    req.timeout_secs = Some(60);
    let r =
        Client::connect(&d.socket).unwrap().run(req, |_| {}).unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    assert_eq!(r.status, RunStatus::Exited { code: 0 }, "{}", d.log());
    assert_eq!(std::fs::read_to_string(ws.path().join("kept")).unwrap(), "probe\n");
    // Answered while the helper is still there, held after its report (its
    // hook names it there just after the record, maybe after the answer).
    let mut held = None;
    let found = eventually(Duration::from_secs(10), || {
        held = stopped_at(&d, Stage::Reaped);
        held.is_some()
    });
    assert!(found, "no helper held after its report\n{}", d.log());
    // Answered, but its sandbox is not gone yet: the broker does not report itself idle.
    assert_eq!(runs_in_flight(&d), 1, "{}", d.log());
    let helper = nix::unistd::Pid::from_raw(held.unwrap() as i32);
    nix::sys::signal::kill(helper, nix::sys::signal::Signal::SIGKILL).unwrap();
    settles(&d, temp.path(), &before);
    assert!(eventually(Duration::from_secs(10), || runs_in_flight(&d) == 0), "{}", d.log());
    expect_echo(&d.socket, ws.path(), &d);
}

/// `runs_in_flight` of `palisade status`.
fn runs_in_flight(d: &Daemon) -> u64 {
    let socket = d.socket.to_str().unwrap();
    let o =
        std::process::Command::new(bin("palisade")).args(["status", "--socket", socket, "--json"]).output();
    let o = o.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{o:?}"));
    v["runs_in_flight"].as_u64().unwrap_or_else(|| panic!("{v}"))
}

/// A run's start is on disk before its command's first instruction, and its
/// sandbox is built while the start syncs: the command waits for the
/// broker's word. A start that turns out not recorded (the hook answers it
/// so 1 s after the journal did, long after the sandbox is built) refuses
/// the run, and its command never ran: its write in place is not there.
/// Held by nothing, the command would have made that write within the
/// second. In both tiers (pid 1 holds Tier C's command, the reaper Tier B's).
#[test]
fn a_run_whose_start_is_not_recorded_never_runs_its_built_sandboxs_command() {
    let tier_b = ("user_namespaces = false\n", "fallback = \"warn_and_execute\"\n");
    for ((broker, policy), tier) in [(("", ""), "C"), (tier_b, "B")] {
        let (dir, temp) = (TempDir::new("ws"), TempDir::new("runs"));
        // Tier B as root runs its command as another uid.
        let ws = shared_workspace(&dir, "ws");
        let env = vec![("PALISADE_FAULT_RECORD".into(), "1".into())];
        let d = daemon_with(temp.path(), ("disk = \"direct\"\n", broker, policy), env, vec![]);
        let before = Census::of(&d, temp.path());
        match run(&d.socket, &ws, &["write", "ran"]) {
            Err(ClientError::Reply(e)) => {
                assert_eq!(e.kind, ErrorKind::JournalUnavailable, "tier {tier}: {}", e.message);
                assert!(e.message.contains("PALISADE_FAULT_RECORD"), "tier {tier}: {}", e.message);
            }
            other => panic!("tier {tier}: {other:?}\n{}", d.log()),
        }
        assert!(!ws.join("ran").exists(), "tier {tier}: the command ran unrecorded\n{}", d.log());
        settles(&d, temp.path(), &before);
        // The same run, recorded, makes its write.
        let r = run(&d.socket, &ws, &["write", "ran"]).unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
        assert_eq!(r.status, RunStatus::Exited { code: 0 }, "tier {tier}\n{}", d.log());
        assert_eq!(std::fs::read_to_string(ws.join("ran")).unwrap(), "probe\n", "tier {tier}");
    }
}

/// `count` clients, each on a thread of its own asking for `probe daemonize
/// TOKEN` (a setsid sleeper left behind), with their tokens.
fn daemonized(
    d: &Daemon,
    ws: &Path,
    tag: &str,
    count: usize,
) -> (Vec<String>, Vec<std::thread::JoinHandle<Result<RunResult, ClientError>>>) {
    let tokens: Vec<String> = (0..count).map(|i| token(&format!("{tag}{i}"))).collect();
    let clients = tokens
        .iter()
        .map(|tok| {
            let (socket, ws, tok) = (d.socket.clone(), ws.to_path_buf(), tok.clone());
            std::thread::spawn(move || run(&socket, &ws, &["daemonize", &tok]))
        })
        .collect();
    (tokens, clients)
}

#[test]
fn the_broker_killed_with_runs_in_flight_leaves_no_sandbox_and_the_next_one_serves() {
    let temp = TempDir::new("runs");
    let mut d = daemon(temp.path(), vec![], vec![]);
    let ws = TempDir::new("ws");
    let (tokens, clients) = daemonized(&d, ws.path(), "inflight", 4);
    assert!(
        eventually(Duration::from_secs(10), || tokens.iter().all(|t| sleeper_with_token(t).is_some())),
        "{}",
        d.log()
    );
    let pid = nix::unistd::Pid::from_raw(d.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = d.child.wait();
    // Every client sees its connection end, and no sandbox outlives the broker.
    for c in clients {
        assert!(c.join().unwrap().is_err());
    }
    assert!(
        eventually(Duration::from_secs(10), || tokens.iter().all(|t| sleeper_with_token(t).is_none())),
        "a sandbox survived its broker"
    );
    // The next broker, on the same socket and journal, cleans up and serves.
    let mut next = next_broker(&d);
    expect_echo(&d.socket, ws.path(), &d);
    // What the killed broker left under temp_root (its /etc snapshot, as an
    // unprivileged broker) the next one removed; only its own is there.
    let left: Vec<String> = std::fs::read_dir(temp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(&format!("etc-{}-", next.id())))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(next.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    assert!(next.wait().unwrap().success());
}

/// A second `palisaded` with `d`'s configuration, socket and journal.
fn next_broker(d: &Daemon) -> std::process::Child {
    let log = std::fs::File::create(d.dir.join("next.log")).unwrap();
    let child = std::process::Command::new(bin("palisaded"))
        .arg("--config")
        .arg(d.dir.join("palisade.toml"))
        .arg("--socket")
        .arg(&d.socket)
        .env("PALISADE_JOURNAL", d.journal())
        .env("PALISADE_STATE", state_beside(d.journal()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let up = eventually(Duration::from_secs(20), || Client::connect(&d.socket).is_ok());
    assert!(
        up,
        "the next broker did not serve: {}",
        std::fs::read_to_string(d.dir.join("next.log")).unwrap()
    );
    child
}

#[test]
fn out_of_descriptors_runs_are_answered_with_errors_not_panics_and_service_returns() {
    let temp = TempDir::new("runs");
    // A descriptor limit the daemon reaches with a few dozen idle connections
    // (and above what one run takes: a root broker holds, while it hands a
    // plan over, the descriptors of its host paths and the trees cloned from them).
    let limit = 96;
    // Hard: the daemon raises its soft limit to the hard one. Sandboxes get
    // a limit below it (they may not raise theirs above the hard limit).
    let prefix = vec!["prlimit".into(), format!("--nofile={limit}:{limit}"), "--".into()];
    let d = daemon_with(temp.path(), ("max_open_files = 32\n", "", ""), vec![], prefix);
    let ws = TempDir::new("ws");
    expect_echo(&d.socket, ws.path(), &d);
    let before = Census::of(&d, temp.path());
    let mut held = Vec::new();
    let mut refused = 0;
    let mut failed_runs = 0;
    // Connections until the daemon has none left to give: each one after
    // that waits in the listen queue (accept fails with EMFILE) or is refused.
    while held.len() < 2 * limit {
        let Ok(mut conn) = UnixStream::connect(&d.socket) else { break };
        match bounded_run(&mut conn, ws.path()) {
            Some(Ok(())) => held.push(conn),
            Some(Err(e)) => {
                let kind = e["error"]["kind"].as_str().unwrap_or_default().to_string();
                assert!(["RuntimeFailure", "Busy", "JournalUnavailable"].contains(&kind.as_str()), "{e}");
                failed_runs += 1;
                held.push(conn);
            }
            // The connection closed without a word, or not accepted at
            // all (out of descriptors): the end of what it takes.
            None => {
                refused += 1;
                break;
            }
        }
    }
    assert!(failed_runs + refused > 0, "never ran out of descriptors: {} connections", held.len());
    eprintln!(
        "{} connections held, {failed_runs} runs answered with an error, then {refused} not served",
        held.len()
    );
    drop(held);
    // Descriptors come back (once the daemon has seen those clients go),
    // and so does the service.
    let served = eventually(Duration::from_secs(10), || {
        run(&d.socket, ws.path(), &["echo", "back"]).is_ok_and(|r| r.status == RunStatus::Exited { code: 0 })
    });
    assert!(served, "{}", d.log());
    settles(&d, temp.path(), &before);
    assert!(!d.log().contains("panicked"), "{}", d.log());
}

/// One run of `echo` on `conn` in the JSON-lines encoding, read with a time
/// bound: `Ok` for its result, `Err` for an error reply, `None` when the
/// connection closed or nothing came within the bound.
fn bounded_run(conn: &mut UnixStream, ws: &Path) -> Option<Result<(), serde_json::Value>> {
    use std::io::{BufRead, Write};
    let mut bytes = encode(&ClientMessage::Hello(Hello::new(Encoding::Json)), Encoding::Json).unwrap();
    bytes.extend(encode(&ClientMessage::Run(request(ws, &["echo", "x"])), Encoding::Json).unwrap());
    conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    conn.write_all(&bytes).ok()?;
    let mut lines = std::io::BufReader::new(conn.try_clone().ok()?).lines();
    loop {
        let m: serde_json::Value = serde_json::from_str(&lines.next()?.ok()?).ok()?;
        if m.get("finished").is_some() {
            return Some(Ok(()));
        }
        if m.get("error").is_some() {
            return Some(Err(m));
        }
    }
}

#[test]
fn a_helper_that_cannot_start_for_want_of_memory_or_processes_is_an_error_and_service_returns() {
    let ws = TempDir::new("ws");
    for (errno, says) in
        [("ENOMEM", "Cannot allocate memory"), ("EAGAIN", "Resource temporarily unavailable")]
    {
        let temp = TempDir::new("runs");
        let env = vec![("PALISADE_FAULT_SPAWN".into(), format!("{errno}:3"))];
        let d = daemon(temp.path(), env, vec![]);
        let before = Census::of(&d, temp.path());
        for _ in 0..3 {
            match run(&d.socket, ws.path(), &["echo", "x"]) {
                Err(ClientError::Reply(e)) => {
                    assert_eq!(e.kind, ErrorKind::RuntimeFailure, "{}", e.message);
                    assert!(
                        e.message.starts_with("cannot start ") && e.message.contains(says),
                        "{}",
                        e.message
                    );
                }
                other => panic!("{errno}: {other:?}\n{}", d.log()),
            }
        }
        expect_echo(&d.socket, ws.path(), &d);
        settles(&d, temp.path(), &before);
        assert!(!d.log().contains("panicked"), "{}", d.log());
    }
}

#[test]
fn sigterm_during_a_burst_kills_every_run_and_answers_every_client() {
    let temp = TempDir::new("runs");
    // Four run at once; the others wait in the queue when the signal comes.
    let mut d = daemon_with(temp.path(), ("", "max_concurrent = 4\n", ""), vec![], vec![]);
    let ws = TempDir::new("ws");
    let (tokens, clients) = daemonized(&d, ws.path(), "burst", 12);
    let running = || tokens.iter().filter(|t| sleeper_with_token(t).is_some()).count();
    assert!(eventually(Duration::from_secs(10), || running() == 4), "{}", d.log());
    assert_eq!(d.stop().and_then(|s| s.code()), Some(0), "{}", d.log());
    let (mut cancelled, mut busy) = (0, 0);
    for c in clients {
        match c.join().unwrap() {
            Ok(r) if r.status == RunStatus::Cancelled => cancelled += 1,
            Err(ClientError::Reply(e)) if e.kind == ErrorKind::Busy => {
                assert!(e.message.contains("shutting down"), "{}", e.message);
                busy += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((cancelled, busy), (4, 8));
    assert!(eventually(Duration::from_secs(10), || running() == 0), "a sandbox survived shutdown");
}

#[test]
fn a_full_temp_root_refuses_tier_b_runs_with_the_reason_until_space_returns() {
    if !is_root() {
        skipped("not root: a tmpfs cannot be mounted here; the run as root covers this");
        return;
    }
    let dir = TempDir::new("fulltemp");
    // Few inodes: full once the test has made them all.
    let fs = Tmpfs::mount(&dir, "size=1m,nr_inodes=64,mode=0711");
    let temp = fs.path().join("runs");
    // Tier B, whose runs have directories of their own under temp_root.
    let tier_b = ("", "user_namespaces = false\n", "fallback = \"warn_and_execute\"\n");
    let d = daemon_with(&temp, tier_b, vec![], vec![]);
    let ws = shared_workspace(&dir, "ws");
    expect_echo(&d.socket, &ws, &d);
    let before = Census::of(&d, &temp);
    let filler = fs.path().join("filler");
    std::fs::create_dir(&filler).unwrap();
    let mut made = 0;
    while std::fs::write(filler.join(made.to_string()), "").is_ok() {
        made += 1;
        assert!(made < 1000, "the tmpfs never filled up");
    }
    match run(&d.socket, &ws, &["echo", "full"]) {
        Err(ClientError::Reply(e)) => {
            assert_eq!(e.kind, ErrorKind::RuntimeFailure, "{}", e.message);
            assert!(e.message.contains("cannot create the run's directories"), "{}", e.message);
            assert!(e.message.contains("No space left on device"), "{}", e.message);
        }
        other => panic!("{other:?}\n{}", d.log()),
    }
    settles(&d, &temp, &before);
    std::fs::remove_dir_all(&filler).unwrap();
    expect_echo(&d.socket, &ws, &d);
    settles(&d, &temp, &before);
}

/// As root, the same file again as the unprivileged test user.
#[test]
fn the_fault_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_fault_suite_passes_as_an_unprivileged_user");
}
