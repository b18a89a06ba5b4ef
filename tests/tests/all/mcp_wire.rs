//! `palisade mcp` read on the wire (JSON-RPC lines on its stdio), for what
//! a client library hides: a call the client cancels gets no response (the
//! MCP specification's rule) while its run is killed and the server serves
//! on, and a refusal is an error for the agent, not a warning in the
//! server's log.

use palisade_tests::*;
use serde_json::{Value, json};
use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::time::Duration;

/// `palisade mcp --policy /dev/null` in `ws`: its stdin, its stdout's
/// messages, and the process.
fn server(ws: &TempDir) -> (std::process::ChildStdin, mpsc::Receiver<Value>, std::process::Child) {
    let mut child = std::process::Command::new(bin("palisade"))
        .args(["mcp", "--policy", "/dev/null"])
        .current_dir(ws.path())
        .env("PALISADE_JOURNAL", ws.join("journal"))
        .env("PALISADE_STATE", state_beside(ws.join("journal")))
        .env_remove("PALISADE_LOG")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = tx.send(serde_json::from_str(&line).unwrap_or(Value::String(line)));
        }
    });
    (child.stdin.take().unwrap(), rx, child)
}

fn send(stdin: &mut std::process::ChildStdin, message: Value) {
    writeln!(stdin, "{message}").unwrap();
}

/// Messages up to the response to `id` (which is last).
fn until_response(rx: &mpsc::Receiver<Value>, id: u64) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let m = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}: {seen:?}"));
        let done = m["id"] == id;
        seen.push(m);
        if done {
            return seen;
        }
    }
}

fn call(id: u64, argv: &[&str]) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "run_command", "arguments": {"argv": argv}}})
}

#[test]
fn a_cancelled_call_gets_no_response_and_a_refusal_is_no_warning() {
    let ws = TempDir::new("mcp-wire");
    std::fs::copy(bin("probe"), ws.join("probe")).unwrap();
    let (mut stdin, rx, mut child) = server(&ws);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "wire", "version": "0"}}});
    send(&mut stdin, init);
    until_response(&rx, 1);
    send(&mut stdin, json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    // A refusal: an error response.
    send(&mut stdin, call(2, &["python3", "-c", "1"]));
    let refused = until_response(&rx, 2);
    assert_eq!(refused.last().unwrap()["error"]["data"]["rule"], "interpreters.denied", "{refused:?}");
    // A run that would never end, cancelled once it runs.
    let token = format!("{}.mcp-wire", std::process::id());
    send(&mut stdin, call(3, &["./probe", "sleep", &token]));
    let running = || {
        let procs = std::fs::read_dir("/proc").into_iter().flatten().flatten();
        procs
            .filter(|p| {
                std::fs::read(p.path().join("cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).any(|w| w == token.as_bytes()))
            })
            .count()
    };
    assert!(eventually(Duration::from_secs(20), || running() > 0), "the run never started");
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3, "reason": "enough"}});
    send(&mut stdin, cancel);
    assert!(eventually(Duration::from_secs(20), || running() == 0), "the cancelled run still runs");
    send(&mut stdin, call(4, &["./probe", "echo", "after"]));
    let mut seen = until_response(&rx, 4);
    assert!(seen.last().unwrap()["result"]["structuredContent"]["stdout"] == "ok after\n", "{seen:?}");
    drop(stdin);
    let status = child.wait().unwrap();
    seen.extend(rx.try_iter());
    assert!(seen.iter().all(|m| m["id"] != 3), "a response to the cancelled call: {seen:?}");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}
