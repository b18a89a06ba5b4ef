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
