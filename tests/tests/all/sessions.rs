//! Sessions: a sandbox that stays for the commands run in it. A command in
//! a session shares its namespaces (and so its processes, its loopback and
//! its files), a background process outlives the command that started it,
//! stopping the session (or its idle timeout) kills everything in it, and
//! another requester can neither run in a session nor see it.

use palisade_broker::cli::client::{Client, ClientError};
use palisade_protocol::wire::{
    ClientMessage, ErrorKind, RunRequest, RunResult, RunStatus, ServerMessage, SessionInfo, StartSession,
    Stream,
};
use palisade_tests::*;
use std::path::Path;
use std::time::Duration;

/// The sessions' profile: a shell may run, and the probe from its folder.
fn shell() -> String {
    let probes = Path::new(&probe()).parent().unwrap().display().to_string();
    format!("[profiles.sh]\nallow_interpreters = true\nallow_inline_code = true\nread_only = [{probes:?}]\n")
}

/// Starts session `name` in `ws`, with the shell's profile.
fn start(client: &mut Client, ws: &Path, name: &str, idle: Option<u64>) -> Result<SessionInfo, ClientError> {
    let run = RunRequest { profile: Some("sh".into()), argv: vec![], ..request(ws, &[]) };
    let start =
        StartSession { name: Some(name.into()), run, idle_timeout_secs: idle, max_lifetime_secs: None };
    match client.request(&ClientMessage::StartSession(start))? {
        ServerMessage::SessionStarted(info) => Ok(info),
        other => panic!("not a session: {other:?}"),
    }
}

/// Runs `argv` in session `name`: its result and its stdout.
fn run_in(client: &mut Client, name: &str, argv: &[&str]) -> Result<(RunResult, String), ClientError> {
    let mut out = Vec::new();
    client.in_session(name.into());
    let run = RunRequest { argv: argv.iter().map(|a| a.to_string()).collect(), ..RunRequest::default() };
    let result = client.run(run, |m| {
        if let ServerMessage::Output { stream: Stream::Stdout, data } = m {
            out.extend_from_slice(data);
        }
    })?;
    Ok((result, text(&out)))
}

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

#[test]
fn a_background_process_outlives_its_command_and_dies_with_the_session() {
    let d = Daemon::start(&shell());
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    let info = start(&mut client, ws.path(), "dev", None).unwrap();
    assert_eq!(info.name, "dev");
    let token = format!("session-bg-{}", std::process::id());
    let script = format!("true; {} sleep {token} >/dev/null 2>&1 & echo started", probe());
    let argv = sh(&script);
    let (r, out) = run_in(&mut client, "dev", &argv.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    assert_eq!((r.status, out.trim()), (RunStatus::Exited { code: 0 }, "started"), "{}", d.log());
    assert!(eventually(Duration::from_secs(10), || sleeper_with_token(&token).is_some()), "no sleeper");
    // Still there once the command's run is over.
    std::thread::sleep(Duration::from_millis(500));
    let sleeper = sleeper_with_token(&token).expect("the background process outlives the command");
    // The next command sees it: the same pid namespace.
    let (r, seen) = run_in(&mut client, "dev", &[&probe(), "pids"]).unwrap();
    assert_eq!(r.status, RunStatus::Exited { code: 0 });
    assert!(seen.split(',').count() >= 3, "pid 1, the session's holder and the sleeper: {seen}");
    let (_, ns1) = run_in(&mut client, "dev", &[&probe(), "ns"]).unwrap();
    let (_, ns2) = run_in(&mut client, "dev", &[&probe(), "ns"]).unwrap();
    assert_eq!(ns1, ns2, "two commands of a session are in its namespaces");
    let mut fresh = Vec::new();
    let r = client.run(request(ws.path(), &["ns"]), |m| {
        if let ServerMessage::Output { stream: Stream::Stdout, data } = m {
            fresh.extend_from_slice(data);
        }
    });
    assert_eq!(r.unwrap().status, RunStatus::Exited { code: 0 });
    assert_ne!(text(&fresh), ns1, "a run of its own is in namespaces of its own");
    match client.request(&ClientMessage::ListSessions).unwrap() {
        ServerMessage::Sessions(list) => {
            assert_eq!(list.len(), 1);
            assert_eq!((list[0].name.as_str(), list[0].runs, list[0].running), ("dev", 4, 0));
        }
        other => panic!("{other:?}"),
    }
    match client.request(&ClientMessage::StopSession { session: "dev".into() }).unwrap() {
        ServerMessage::Finished(r) => assert_eq!(r.run_id, info.run_id),
        other => panic!("{other:?}"),
    }
    assert!(
        eventually(Duration::from_secs(10), || sleeper_with_token(&token).is_none()),
        "pid {sleeper} lives on"
    );
    match client.request(&ClientMessage::ListSessions).unwrap() {
        ServerMessage::Sessions(list) => assert!(list.is_empty(), "{list:?}"),
        other => panic!("{other:?}"),
    }
    let gone = run_in(&mut client, "dev", &["true"]);
    assert!(
        matches!(gone, Err(ClientError::Reply(ref e)) if e.kind == ErrorKind::InvalidRequest),
        "{gone:?}"
    );
}

/// What a command of session `name` printed (`probe` commands print `ok
/// ...` or `err ERRNO ...`), trimmed.
fn probe_in(client: &mut Client, name: &str, args: &[&str]) -> String {
    let mut argv = vec![probe()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let (_, out) = run_in(client, name, &argv.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    out.trim().to_string()
}

/// `sh -c SCRIPT` in session `name`: its result.
fn sh_in(client: &mut Client, name: &str, script: &str) -> RunResult {
    run_in(client, name, &["sh", "-c", script]).unwrap().0
}

#[test]
fn a_server_started_by_one_command_is_reached_by_the_next_and_by_nothing_outside() {
    let d = Daemon::start(&shell());
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    start(&mut client, ws.path(), "web", None).unwrap();
    let port = 20000 + std::process::id() % 20000;
    let addr = format!("127.0.0.1:{port}");
    // The address in a file: the policy's egress preflight reads a command's arguments.
    std::fs::write(ws.join("addr"), &addr).unwrap();
    let serve = format!("true; {} serve \"$(cat addr)\" >/dev/null 2>&1 &", probe());
    assert_eq!(sh_in(&mut client, "web", &serve).status, RunStatus::Exited { code: 0 });
    let connect = format!("true; {} connect \"$(cat addr)\"", probe());
    let mut reached = String::new();
    let up = eventually(Duration::from_secs(10), || {
        let argv = sh(&connect);
        reached = run_in(&mut client, "web", &argv.iter().map(String::as_str).collect::<Vec<_>>()).unwrap().1;
        reached.trim() == "ok"
    });
    assert!(up, "the next command reaches the server: {reached}");
    // A run of its own has a loopback of its own; the host has its own too.
    let mut fresh = Vec::new();
    let own = RunRequest { profile: Some("sh".into()), argv: sh(&connect), ..request(ws.path(), &[]) };
    let r = client.run(own, |m| {
        if let ServerMessage::Output { stream: Stream::Stdout, data } = m {
            fresh.extend_from_slice(data);
        }
    });
    assert_eq!(r.unwrap().status, RunStatus::Exited { code: 1 }, "{}", text(&fresh));
    assert!(std::net::TcpStream::connect(&addr).is_err(), "the session's loopback is not the host's");
}

#[test]
fn an_idle_session_ends_and_takes_its_processes_with_it() {
    let d = Daemon::start(&shell());
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    start(&mut client, ws.path(), "idle", Some(2)).unwrap();
    let token = format!("session-idle-{}", std::process::id());
    sh_in(&mut client, "idle", &format!("true; {} sleep {token} >/dev/null 2>&1 &", probe()));
    assert!(eventually(Duration::from_secs(10), || sleeper_with_token(&token).is_some()), "no sleeper");
    assert!(
        eventually(Duration::from_secs(30), || sleeper_with_token(&token).is_none()),
        "the sleeper lives on"
    );
    // Its run's end (the copy-back) comes after its processes are gone.
    let ended = eventually(Duration::from_secs(10), || {
        client.request(&ClientMessage::ListSessions).unwrap() == ServerMessage::Sessions(vec![])
    });
    assert!(ended, "the idle session is still listed");
    assert!(d.log().contains("session idle: ending it"), "{}", d.log());
}

#[test]
fn a_session_past_its_lifetime_ends_and_takes_its_processes_with_it() {
    let d = Daemon::start(&shell());
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    let run = RunRequest { profile: Some("sh".into()), argv: vec![], ..request(ws.path(), &[]) };
    let start =
        StartSession { name: Some("brief".into()), run, max_lifetime_secs: Some(3), ..Default::default() };
    match client.request(&ClientMessage::StartSession(start)).unwrap() {
        ServerMessage::SessionStarted(info) => assert_eq!(info.max_lifetime_secs, 3),
        other => panic!("not a session: {other:?}"),
    }
    let token = format!("session-life-{}", std::process::id());
    sh_in(&mut client, "brief", &format!("true; {} sleep {token} >/dev/null 2>&1 &", probe()));
    assert!(eventually(Duration::from_secs(10), || sleeper_with_token(&token).is_some()), "no sleeper");
    let socket = publish(&mut client, "brief", 8080).unwrap();
    // Kept busy past its lifetime: the lifetime, not idleness, ends it.
    let long = format!("true; {} sleep {token}-fg", probe());
    let r = sh_in(&mut client, "brief", &long);
    assert_eq!(r.status, RunStatus::Signaled { signal: 9 }, "the command ends with its session");
    assert!(
        eventually(Duration::from_secs(10), || sleeper_with_token(&token).is_none()),
        "the background process outlives its session's lifetime"
    );
    let ended = eventually(Duration::from_secs(10), || {
        client.request(&ClientMessage::ListSessions).unwrap() == ServerMessage::Sessions(vec![])
            && !Path::new(&socket).exists()
    });
    assert!(ended, "the session (or its published socket) outlives its lifetime");
}

#[test]
fn a_broker_that_dies_takes_its_sessions_with_it() {
    let mut d = Daemon::start(&shell());
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    start(&mut client, ws.path(), "doomed", None).unwrap();
    let token = format!("session-doomed-{}", std::process::id());
    sh_in(&mut client, "doomed", &format!("true; {} sleep {token} >/dev/null 2>&1 &", probe()));
    assert!(eventually(Duration::from_secs(10), || sleeper_with_token(&token).is_some()), "no sleeper");
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || sleeper_with_token(&token).is_none()),
        "the sleeper lives on"
    );
}

#[test]
fn a_broker_that_stops_ends_its_sessions_and_holds_their_writes() {
    let mut d = Daemon::start(&shell());
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    let info = start(&mut client, ws.path(), "kept", None).unwrap();
    assert_eq!(sh_in(&mut client, "kept", "echo mine > note.txt").status, RunStatus::Exited { code: 0 });
    drop(client);
    assert!(d.stop().is_some_and(|s| s.success()), "{}", d.log());
    assert!(!ws.join("note.txt").exists(), "palisade ended it: its writes are held, not applied");
    let log = d.log();
    let finished =
        log.lines().find(|l| l.contains("run finished") && l.contains(&format!("run_id={}", info.run_id)));
    assert!(finished.is_some_and(|l| l.contains("Cancelled")), "the session's end is recorded: {log}");
    // The journal's `changes` record of the session's run says they are held.
    let o = std::process::Command::new(bin("palisade"))
        .args(["audit", "tail", "-n", "100", "--json"])
        .env("PALISADE_JOURNAL", d.journal())
        .output()
        .unwrap();
    let held = text(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|r| r["event"] == "changes" && r["run_id"] == info.run_id && r["outcome"] == "held");
    assert!(held, "its writes are held: {}", text(&o.stdout));
}

#[test]
fn the_escape_probes_still_fail_in_a_session() {
    let d = Daemon::start(&shell());
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    start(&mut client, ws.path(), "jail", None).unwrap();
    let mut victim = std::process::Command::new("sleep").arg("60").spawn().unwrap();
    let pid = victim.id().to_string();
    // Outside, each succeeds (see the jail's own tests for bpf).
    for check in [
        vec!["mount"],
        vec!["chroot"],
        vec!["userns"],
        vec!["keyctl"],
        vec!["io_uring"],
        vec!["ptrace", &pid],
    ] {
        assert!(probe_outside(&check).is_ok(), "{check:?} fails even outside: {:?}", probe_outside(&check));
    }
    for check in ["mount", "chroot", "userns", "keyctl", "bpf", "io_uring"] {
        assert_eq!(probe_in(&mut client, "jail", &[check]), "err EPERM", "{check}");
    }
    for check in ["signal", "ptrace"] {
        let got = probe_in(&mut client, "jail", &[check, &pid]);
        assert!(["err ESRCH", "err EPERM"].contains(&got.as_str()), "{check}: {got}");
    }
    let status = probe_in(&mut client, "jail", &["status"]);
    for held in ["NoNewPrivs=1", "Seccomp=2", "CapEff=0000000000000000", "CapBnd=0000000000000000"] {
        assert!(status.contains(held), "{held}: {status}");
    }
    // The session's holder and pid 1 are nothing a command can reach.
    for pid in ["1", "2"] {
        let got = probe_in(&mut client, "jail", &["ptrace", pid]);
        assert!(got.starts_with("err "), "ptrace {pid}: {got}");
    }
    let _ = victim.kill();
    let _ = victim.wait();
}

#[test]
fn stopping_a_session_applies_its_writes_as_a_command_that_exited_would() {
    let d = Daemon::start(&shell());
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    start(&mut client, ws.path(), "w", None).unwrap();
    let r = sh_in(&mut client, "w", "echo one > made.txt");
    assert_eq!(r.status, RunStatus::Exited { code: 0 });
    let read = probe_in(&mut client, "w", &["read", "made.txt"]);
    assert!(read.starts_with("ok") && read.ends_with("one"), "{read}");
    assert!(!ws.join("made.txt").exists(), "a session's writes are its own until it ends");
    let result = match client.request(&ClientMessage::StopSession { session: "w".into() }).unwrap() {
        ServerMessage::Finished(r) => r,
        other => panic!("{other:?}"),
    };
    // Stopped as asked: no cancellation, no error (a connection of version
    // 19 or older is told `cancelled`, as before).
    assert_eq!((result.status, result.status.error_kind()), (RunStatus::Stopped, None));
    assert_eq!(result.changes.files, 1, "{:?}", result.changes);
    assert_eq!(std::fs::read_to_string(ws.join("made.txt")).unwrap(), "one\n");
    // The journal says so too.
    let o = std::process::Command::new(bin("palisade"))
        .args(["audit", "tail", "-n", "100", "--json"])
        .env("PALISADE_JOURNAL", d.journal())
        .output()
        .unwrap();
    let recorded = text(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|r| r["event"] == "run_finished" && r["run_id"] == result.run_id && r["status"] == "stopped");
    assert!(recorded, "{}", text(&o.stdout));
    // A client of version 19 is told `cancelled`, what that version said.
    start(&mut client, ws.path(), "older", None).unwrap();
    let mut older = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    older.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let hello = r#"{"hello": {"magic": "palisade", "version": 19, "encoding": "json"}}"#;
    std::io::Write::write_all(
        &mut older,
        format!("{hello}\n{{\"stop_session\": {{\"session\": \"older\"}}}}\n").as_bytes(),
    )
    .unwrap();
    let finished = std::io::BufRead::lines(std::io::BufReader::new(older))
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .find(|m| m.get("finished").is_some() || m.get("error").is_some())
        .unwrap();
    assert_eq!(finished["finished"]["status"], "cancelled", "{finished}");
}

/// A session whose commands made a hard link to a 3 MB file and a sparse
/// file: its writes, every command's, are applied when it stops, the
/// links and holes as they were (they were once counted too large, and all
/// of it dropped).
#[test]
fn a_sessions_hard_links_and_holes_are_applied_when_it_stops() {
    use std::os::unix::fs::MetadataExt;
    let d = Daemon::start(&shell());
    let ws = TempDir::new("session-links");
    let mut client = Client::connect(&d.socket).unwrap();
    start(&mut client, ws.path(), "l", None).unwrap();
    let r = sh_in(&mut client, "l", "head -c 3000000 /dev/zero > big && ln big big-link && echo a > first");
    assert_eq!(r.status, RunStatus::Exited { code: 0 });
    let r = sh_in(&mut client, "l", "truncate -s 100M sparse && echo b > second");
    assert_eq!(r.status, RunStatus::Exited { code: 0 });
    let result = match client.request(&ClientMessage::StopSession { session: "l".into() }).unwrap() {
        ServerMessage::Finished(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        result.changes.outcome,
        palisade_protocol::wire::ChangesOutcome::Applied,
        "{:?}",
        result.changes
    );
    let m = |n: &str| std::fs::metadata(ws.join(n)).unwrap();
    assert_eq!((m("big").len(), m("big").ino()), (3_000_000, m("big-link").ino()));
    assert_eq!(m("sparse").len(), 100 << 20);
    assert!(m("sparse").blocks() * 512 < 1 << 20, "its holes are kept");
    assert_eq!(std::fs::read_to_string(ws.join("first")).unwrap(), "a\n");
    assert_eq!(std::fs::read_to_string(ws.join("second")).unwrap(), "b\n");
}

/// The test user, and a broker of root's that serves it and root.
fn serving_two() -> (nix::unistd::User, Daemon) {
    let user = test_user();
    let config = format!("{}[broker]\nallowed_uids = [0, {}]\nsocket_mode = 0o666\n", shell(), user.uid);
    (user, Daemon::start(&config))
}

#[test]
fn another_requester_can_neither_run_in_a_session_nor_list_it() {
    if !is_root() {
        return skipped("another requester needs a broker serving two uids (run as root)");
    }
    let (user, d) = serving_two();
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    start(&mut client, ws.path(), "mine", None).unwrap();
    let socket = d.socket.to_str().unwrap();
    let theirs = shared_workspace(&ws, "theirs");
    let o = palisade_cli(
        &theirs,
        &["session", "exec", "mine", "--socket", socket],
        &[&probe(), "echo", "x"],
        Some(&user),
    );
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stdout));
    assert!(text(&o.stderr).contains("you have no session named mine"), "{}", text(&o.stderr));
    let listed = std::process::Command::new("setpriv")
        .args(as_user(&user).iter().skip(1))
        .arg(bin("palisade"))
        .args(["session", "list", "--socket", socket])
        .output()
        .unwrap();
    assert_eq!(text(&listed.stdout), "no sessions\n", "{}", text(&listed.stderr));
    // Counter-test: its requester runs in it, and lists it.
    let o = palisade_cli(
        ws.path(),
        &["session", "exec", "mine", "--socket", socket],
        &[&probe(), "echo", "x"],
        None,
    );
    assert_eq!((o.status.code(), text(&o.stdout)), (Some(0), "ok x\n".into()), "{}", text(&o.stderr));
}

#[test]
fn the_cli_starts_runs_in_lists_and_stops_a_session() {
    let d = Daemon::start(&shell());
    let ws = TempDir::new("session-ws");
    let socket = d.socket.to_str().unwrap();
    let cli = |args: &[&str]| {
        std::process::Command::new(bin("palisade")).args(args).current_dir(ws.path()).output().unwrap()
    };
    let o =
        cli(&["session", "start", "--socket", socket, "--name", "c", "--profile", "sh", "--publish", "8080"]);
    assert_eq!((o.status.code(), text(&o.stdout)), (Some(0), "c\n".into()), "{}", text(&o.stderr));
    let published = text(&o.stderr);
    assert!(published.starts_with("palisade: port 8080 of session c published at /"), "{published}");
    let o = cli(&["session", "exec", "c", "--socket", socket, "--", "sh", "-c", "echo $((6*7)); exit 3"]);
    assert_eq!((o.status.code(), text(&o.stdout)), (Some(3), "42\n".into()), "{}", text(&o.stderr));
    // The session's shell: a line's directory and exported variables, the next line's.
    std::fs::create_dir(ws.join("sub")).unwrap();
    let line = |words: &[&str]| {
        cli(&[&["session", "exec", "--shell", "c", "--socket", socket, "--"], words].concat())
    };
    let o = line(&["cd sub && export X=kept; Y=lost"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = line(&["echo", "${PWD##*/}", "$X", "${Y-none}"]);
    assert_eq!(
        (o.status.code(), text(&o.stdout)),
        (Some(0), "sub kept none\n".into()),
        "{}",
        text(&o.stderr)
    );
    // Counter-test: a command not of the shell starts where the session does.
    let o = cli(&["session", "exec", "c", "--socket", socket, "--", "sh", "-c", "echo ${PWD##*/} ${X-none}"]);
    let here = ws.path().file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(text(&o.stdout), format!("{here} none\n"), "{}", text(&o.stderr));
    let o = cli(&["session", "list", "--socket", socket, "--json"]);
    let listed: Vec<SessionInfo> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((listed.len(), listed[0].name.as_str(), listed[0].runs), (1, "c", 4));
    let o = cli(&["session", "stop", "c", "--socket", socket]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(text(&o.stdout).starts_with("session c stopped (run "), "{}", text(&o.stdout));
    let o = cli(&["session", "exec", "c", "--socket", socket, "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("InvalidRequest: you have no session named c"), "{}", text(&o.stderr));
}

#[test]
fn a_command_past_its_deadline_ends_with_its_process_group_and_the_session_stays() {
    let d = Daemon::start(&shell());
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    start(&mut client, ws.path(), "slow", None).unwrap();
    let token = format!("session-group-{}", std::process::id());
    let script = format!("true; {} sleep {token} & sleep 100", probe());
    client.in_session("slow".into());
    let run = RunRequest { argv: sh(&script), timeout_secs: Some(1), ..RunRequest::default() };
    let r = client.run(run, |_| {}).unwrap();
    assert_eq!(r.status, RunStatus::TimedOut);
    assert!(
        eventually(Duration::from_secs(10), || sleeper_with_token(&token).is_none()),
        "its group lives on"
    );
    assert_eq!(probe_in(&mut client, "slow", &["echo", "still"]), "ok still", "the session stays");
}

#[test]
fn a_tier_b_broker_starts_no_session() {
    let d = Daemon::start(&format!(
        "{}[broker]\nuser_namespaces = false\n[policy]\nfallback = \"warn_and_execute\"\n",
        shell()
    ));
    let dir = TempDir::new("session-ws");
    // A root broker's Tier B runs as the sandbox's host ids: a workspace they can enter.
    let ws = shared_workspace(&dir, "w");
    let mut client = Client::connect(&d.socket).unwrap();
    match start(&mut client, &ws, "b", None) {
        Err(ClientError::Reply(e)) => {
            assert_eq!(
                (e.kind, e.rule.as_deref()),
                (ErrorKind::Unavailable, Some("session.unavailable")),
                "{e:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Counter-test: the same broker runs a command of its own (Tier B).
    let r = client.run(request(&ws, &["echo", "x"]), |_| {}).unwrap();
    assert_eq!(r.status, RunStatus::Exited { code: 0 });
}

#[test]
fn the_session_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_session_suite_passes_as_an_unprivileged_user");
}

/// `Publish`s `port` of session `name`: the socket on the host, or the refusal.
fn publish(client: &mut Client, name: &str, port: u16) -> Result<String, ClientError> {
    match client.request(&ClientMessage::Publish { session: name.into(), port })? {
        ServerMessage::Published(p) => {
            assert_eq!((p.session.as_str(), p.port), (name, port));
            Ok(p.socket)
        }
        other => panic!("not published: {other:?}"),
    }
}

/// What comes from the Unix socket at `path` until it closes, read as its
/// requester: `None` if it cannot connect.
fn fetch(path: &str) -> Option<String> {
    use std::io::Read;
    let mut stream = std::os::unix::net::UnixStream::connect(path).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = String::new();
    let _ = stream.read_to_string(&mut got);
    Some(got)
}

/// Starts `probe serve` on a loopback port of session `name`; the port.
fn serve_in(client: &mut Client, ws: &Path, name: &str) -> u16 {
    let port = 20000 + (std::process::id() % 20000) as u16;
    // The address in a file: the policy's egress preflight reads a command's arguments.
    std::fs::write(ws.join("addr"), format!("127.0.0.1:{port}")).unwrap();
    let serve = format!("true; {} serve \"$(cat addr)\" >/dev/null 2>&1 &", probe());
    assert_eq!(sh_in(client, name, &serve).status, RunStatus::Exited { code: 0 });
    port
}

#[test]
fn a_published_port_reaches_the_sessions_server_from_the_host() {
    use std::os::unix::fs::MetadataExt;
    let d = Daemon::start(&shell());
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    start(&mut client, ws.path(), "web", None).unwrap();
    let port = serve_in(&mut client, ws.path(), "web");
    let socket = publish(&mut client, "web", port).unwrap();
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!((meta.mode() & 0o777, meta.uid()), (0o600, nix::unistd::geteuid().as_raw()), "{socket}");
    let mut got = None;
    let up = eventually(Duration::from_secs(10), || {
        got = fetch(&socket);
        got.as_deref() == Some("hello\n")
    });
    assert!(up, "the host reaches the session's server through {socket}: {got:?}");
    // Counter-test: the port is the session's loopback's, not the host's.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "the host has no such port");
    // Published twice: the same socket. A port nothing listens on: closed at once.
    assert_eq!(publish(&mut client, "web", port).unwrap(), socket);
    let idle = publish(&mut client, "web", port + 1).unwrap();
    assert_eq!(fetch(&idle).as_deref(), Some(""), "nothing listens on {}", port + 1);
    // The CLI's publish names the same socket.
    let o = std::process::Command::new(bin("palisade"))
        .args(["session", "publish", "web", &port.to_string(), "--socket", d.socket.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!((o.status.code(), text(&o.stdout)), (Some(0), format!("{socket}\n")), "{}", text(&o.stderr));
    let Err(ClientError::Reply(e)) = publish(&mut client, "web", 0) else { panic!("port 0 published") };
    assert_eq!(e.rule.as_deref(), Some("session.publish"), "{}", e.message);
    palisade_policy::denial::names_a_fix_or_why_none("session.publish", &e.message).unwrap();
    let Err(ClientError::Reply(e)) = publish(&mut client, "nosuch", port) else { panic!("published") };
    assert_eq!(e.rule.as_deref(), Some("session.unknown"), "{}", e.message);
    // The session stopped: its sockets are gone by the time the stop is answered.
    assert!(Path::new(&socket).exists() && Path::new(&idle).exists());
    client.request(&ClientMessage::StopSession { session: "web".into() }).unwrap();
    for s in [&socket, &idle] {
        assert!(!Path::new(s).exists(), "{s} outlived its session's stop");
    }
}

#[test]
fn a_published_port_is_its_requesters_alone() {
    if !is_root() {
        return skipped("another requester needs a broker serving two uids (run as root)");
    }
    let (user, d) = serving_two();
    let socket = d.socket.to_str().unwrap();
    let dir = TempDir::new("session-ws");
    let theirs = shared_workspace(&dir, "theirs");
    owned_dir(&theirs, &user, 0o755);
    let as_them = |args: &[&str]| {
        std::process::Command::new("setpriv")
            .args(as_user(&user).iter().skip(1))
            .args(args)
            .current_dir(&theirs)
            .output()
            .unwrap()
    };
    let palisade = bin("palisade").to_string_lossy().into_owned();
    let o =
        as_them(&[&palisade, "session", "start", "--socket", socket, "--name", "theirs", "--profile", "sh"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let port = 20000 + (std::process::id() % 20000) as u16;
    std::fs::write(theirs.join("addr"), format!("127.0.0.1:{port}")).unwrap();
    let serve = format!("true; {} serve \"$(cat addr)\" >/dev/null 2>&1 &", probe());
    let o = as_them(&[
        &palisade, "session", "exec", "theirs", "--socket", socket, "-n", "--", "sh", "-c", &serve,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = as_them(&[&palisade, "session", "publish", "theirs", &port.to_string(), "--socket", socket]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let published = text(&o.stdout).trim().to_string();
    // Its requester reaches the server...
    let mut got = String::new();
    let up = eventually(Duration::from_secs(10), || {
        got = text(&as_them(&[&probe(), "fetch", &published]).stdout);
        got.trim() == "ok hello"
    });
    assert!(up, "{} reaches its session's server: {got}", user.name);
    // ... and nobody else: root passes the socket's mode 0600, and the
    // broker, which checks every peer's uid, closes the connection unserved.
    assert_eq!(fetch(&published).as_deref(), Some(""), "root was relayed to {}'s server", user.name);
    // A session of root's, published: the other user may not connect at all.
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    start(&mut client, ws.path(), "mine", None).unwrap();
    let mine = publish(&mut client, "mine", port).unwrap();
    let o = as_them(&[&probe(), "fetch", &mine]);
    assert!(text(&o.stdout).starts_with("err EACCES"), "{}", text(&o.stdout));
    assert_eq!(fetch(&mine).as_deref(), Some(""), "nothing listens in root's session: closed, but reached");
}

/// A command of a session reads its stdin as it comes (`RunInSessionWithStdin`):
/// a shell answers each line before the next is sent, in the session (what
/// the line before left in its /tmp, it finds).
#[test]
fn a_shell_in_a_session_reads_its_lines_one_at_a_time() {
    let d = Daemon::start(&shell());
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    start(&mut client, ws.path(), "repl", None).unwrap();
    sh_in(&mut client, "repl", "echo left > /tmp/note");
    let script = ["cat /tmp/note\n", "echo $((6 * 7))\n", "exit 5\n"];
    client.in_session("repl".into());
    let request = RunRequest { argv: vec!["sh".into()], ..RunRequest::default() };
    let result = crate::stdin::converse(&mut client, request, script, [b"left\n", b"left\n42\n"]);
    let (result, heard) = result.unwrap_or_else(|e| panic!("{e}: {}", d.log()));
    assert_eq!((result.status, text(&heard).as_str()), (RunStatus::Exited { code: 5 }, "left\n42\n"));
    // Its stdin field set as well: refused, and the session serves on.
    let run = RunRequest { argv: vec!["cat".into()], stdin: b"x".to_vec(), ..RunRequest::default() };
    let e = client.request(&ClientMessage::RunInSessionWithStdin { session: "repl".into(), run });
    assert!(matches!(e, Err(ClientError::Reply(ref e)) if e.kind == ErrorKind::InvalidRequest), "{e:?}");
    assert_eq!(sh_in(&mut client, "repl", "true").status, RunStatus::Exited { code: 0 });
}

/// A command of a session in a terminal (`RunInSessionInTerminal`): the
/// session's own devpts, its window and a resize, Ctrl-C to its foreground
/// process group, and TIOCSTI refused on it.
#[test]
fn a_command_of_a_session_runs_in_a_terminal_of_the_sessions() {
    use palisade_protocol::wire::WindowSize;
    let d = Daemon::start(&shell());
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    start(&mut client, ws.path(), "tty", None).unwrap();
    let window = WindowSize { rows: 24, cols: 80 };
    let in_terminal =
        |argv: Vec<String>| RunRequest { argv, terminal: Some(window), ..RunRequest::default() };
    let script = "trap 'stty size; exit 7' WINCH; stty size; tty; echo ready; while :; do sleep 0.05; done";
    let mut resized = false;
    client.in_session("tty".into());
    let (status, out) = crate::terminal::drive(&mut client, in_terminal(sh(script)), |heard| {
        let ready = heard.contains("ready") && !std::mem::replace(&mut resized, true);
        ready.then_some((&b""[..], Some(WindowSize { rows: 40, cols: 132 })))
    });
    assert_eq!(status, RunStatus::Exited { code: 7 }, "{out:?}\n{}", d.log());
    let lines: Vec<&str> = out.split("\r\n").collect();
    assert_eq!(lines[0], "24 80", "{out:?}");
    assert!(lines[1].starts_with("/dev/pts/"), "the session's own devpts: {out:?}");
    assert!(lines.contains(&"40 132"), "{out:?}");
    let script = "trap 'echo got-INT; exit 9' INT; echo ready; while :; do sleep 0.05; done";
    let mut typed = false;
    client.in_session("tty".into());
    let (status, out) = crate::terminal::drive(&mut client, in_terminal(sh(script)), |heard| {
        let ready = heard.contains("ready") && !std::mem::replace(&mut typed, true);
        ready.then_some((&b"\x03"[..], None))
    });
    assert_eq!(status, RunStatus::Exited { code: 9 }, "{out:?}");
    assert!(out.contains("got-INT"), "{out:?}");
    client.in_session("tty".into());
    let tiocsti = in_terminal(vec![probe(), "tiocsti".into()]);
    let (status, out) = crate::terminal::drive(&mut client, tiocsti, |_| None);
    assert_eq!(status, RunStatus::Exited { code: 1 }, "{out:?}");
    assert!(out.starts_with("err EPERM"), "TIOCSTI inside the session: {out:?}");
}

/// A published socket is the requester's, not its runs': where the broker's
/// socket is in a shared directory (so only the socket itself is kept from
/// runs), its published sockets' directory is kept from them too, even
/// from a run given that directory (a read-only bind: a socket in it is
/// still connected to).
#[test]
fn no_run_reaches_a_published_socket() {
    use std::os::unix::fs::PermissionsExt;
    let shared = TempDir::new("session-shared");
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let socket = shared.join("palisade.sock");
    let probes = Path::new(&probe()).parent().unwrap().display().to_string();
    let config = format!(
        "{}[profiles.shared]\nread_only = [{probes:?}, {:?}]\n[broker]\nsocket = {:?}\n",
        shell(),
        shared.path().display().to_string(),
        socket.display().to_string()
    );
    let d = Daemon::start_with(DaemonOptions { config, default_socket: Some(socket), ..Default::default() });
    let ws = TempDir::new("session-ws");
    let mut client = Client::connect(&d.socket).unwrap();
    start(&mut client, ws.path(), "web", None).unwrap();
    let port = serve_in(&mut client, ws.path(), "web");
    let published = publish(&mut client, "web", port).unwrap();
    assert!(published.starts_with(&shared.path().display().to_string()), "{published}");
    // Counter-test: its requester reaches the server.
    assert!(eventually(Duration::from_secs(10), || fetch(&published).as_deref() == Some("hello\n")));
    let mut out = Vec::new();
    let run = RunRequest { profile: Some("shared".into()), ..request(ws.path(), &["fetch", &published]) };
    let r = client.run(run, |m| {
        if let ServerMessage::Output { stream: Stream::Stdout, data } = m {
            out.extend_from_slice(data);
        }
    });
    assert_eq!(r.unwrap().status, RunStatus::Exited { code: 1 }, "a run reached {published}: {}", text(&out));
    assert!(text(&out).starts_with("err "), "{}", text(&out));
}
