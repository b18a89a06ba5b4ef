//! `palisade mcp` read on the wire (JSON-RPC lines on its stdio), for what
//! a client library hides: a call the client cancels gets no response (the
//! MCP specification's rule) while its run is killed and the server serves
//! on, and a refusal is an error for the agent, not a warning in the
//! server's log.

use palisade_tests::*;
use serde_json::{Value, json};
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// `palisade mcp --policy POLICY OPTIONS` in `ws`: its stdin, its stdout's
/// messages, and the process.
fn server_with(
    ws: &TempDir,
    policy: &Path,
    options: &[&str],
) -> (std::process::ChildStdin, mpsc::Receiver<Value>, std::process::Child) {
    let mut child = std::process::Command::new(bin("palisade"))
        .args(["mcp", "--policy"])
        .arg(policy)
        .args(options)
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

/// [`server`], past MCP's initialization (request 1).
fn initialized(ws: &TempDir) -> (std::process::ChildStdin, mpsc::Receiver<Value>, std::process::Child) {
    initialized_with(ws, Path::new("/dev/null"))
}

/// [`initialized`], with the policy `policy`.
fn initialized_with(
    ws: &TempDir,
    policy: &Path,
) -> (std::process::ChildStdin, mpsc::Receiver<Value>, std::process::Child) {
    initialized_with_options(ws, policy, &[])
}

/// [`initialized_with`], the server started with `options` too.
fn initialized_with_options(
    ws: &TempDir,
    policy: &Path,
    options: &[&str],
) -> (std::process::ChildStdin, mpsc::Receiver<Value>, std::process::Child) {
    let (mut stdin, rx, child) = server_with(ws, policy, options);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "wire", "version": "0"}}});
    send(&mut stdin, init);
    until_response(&rx, 1);
    send(&mut stdin, json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    (stdin, rx, child)
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
    copy_executable(&bin("probe"), &ws.join("probe"));
    let (mut stdin, rx, mut child) = initialized(&ws);
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

/// A tool call's result (its structured content), or the error it got.
fn tool(
    stdin: &mut std::process::ChildStdin,
    rx: &mpsc::Receiver<Value>,
    id: u64,
    name: &str,
    args: Value,
) -> Value {
    send(
        stdin,
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": args}}),
    );
    let reply = until_response(rx, id).pop().unwrap();
    if reply["error"].is_null() {
        reply["result"]["structuredContent"].clone()
    } else {
        reply["error"].clone()
    }
}

#[test]
fn a_session_started_over_mcp_keeps_its_files_and_ends_with_the_server() {
    let ws = TempDir::new("mcp-session");
    copy_executable(&bin("probe"), &ws.join("probe"));
    std::fs::create_dir(ws.join("sub")).unwrap();
    let etc = TempDir::new("mcp-policy");
    let policy = etc.join("policy.toml");
    std::fs::write(&policy, "[defaults]\nallow_interpreters = true\nallow_inline_code = true\n").unwrap();
    let (mut stdin, rx, mut child) = initialized_with(&ws, &policy);
    let started = tool(&mut stdin, &rx, 2, "session_start", json!({"name": "agent"}));
    assert_eq!(started["name"], "agent", "{started}");
    let ran = tool(
        &mut stdin,
        &rx,
        3,
        "session_exec",
        json!({"session": "agent", "argv": ["./probe", "put", "made.txt", "x"]}),
    );
    assert_eq!(ran["exit_code"], 0, "{ran}");
    let seen = tool(
        &mut stdin,
        &rx,
        4,
        "run_command",
        json!({"session": "agent", "argv": ["./probe", "read", "made.txt"]}),
    );
    assert!(seen["stdout"].as_str().is_some_and(|s| s.starts_with("ok")), "the next command sees it: {seen}");
    assert!(!ws.join("made.txt").exists(), "the session's writes are its own until it ends");
    let listed = tool(&mut stdin, &rx, 5, "session_list", json!({}));
    assert_eq!(listed["sessions"][0]["runs"], 2, "{listed}");
    let wider = tool(
        &mut stdin,
        &rx,
        6,
        "run_command",
        json!({"session": "agent", "argv": ["true"], "workspace": "."}),
    );
    assert_eq!(wider["code"], -32602, "a session's command names no workspace: {wider}");
    // The session's shell: one line's directory and exported variables, the next's.
    let mut line = |id, command: &str| {
        tool(
            &mut stdin,
            &rx,
            id,
            "session_exec",
            json!({"session": "agent", "shell": true, "command": command}),
        )
    };
    assert_eq!(line(7, "cd sub && export X=kept")["exit_code"], 0);
    let shown = line(8, "echo ${PWD##*/} $X");
    assert_eq!(shown["stdout"], "sub kept\n", "{shown}");
    let alone = tool(&mut stdin, &rx, 9, "run_command", json!({"shell": true, "command": "pwd"}));
    assert_eq!(alone["code"], -32602, "a shell line needs a session: {alone}");
    drop(stdin);
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    // Its session ended with it, stopped: its writes applied.
    assert_eq!(std::fs::read_to_string(ws.join("made.txt")).unwrap_or_default(), "x", "{stderr}");
}

/// A command that succeeds but whose writes did not all land (here held
/// for review by the policy) is an error for the agent, with the change
/// set's id: an agent reads `is_error`, not a line it may never parse.
#[test]
fn a_run_whose_writes_did_not_land_is_an_error_with_its_change_set() {
    let ws = TempDir::new("mcp-held");
    copy_executable(&bin("probe"), &ws.join("probe"));
    let policy = ws.join("hold.toml");
    std::fs::write(&policy, "[defaults]\nkeep_changes = \"always_hold\"\n").unwrap();
    let (mut stdin, rx, _child) = initialized_with(&ws, &policy);
    send(&mut stdin, call(2, &["./probe", "ops", "put", "made.txt", "x"]));
    let reply = until_response(&rx, 2).pop().unwrap();
    let result = &reply["result"];
    assert_eq!(result["isError"], true, "{reply}");
    let s = &result["structuredContent"];
    assert_eq!((s["exit_code"].as_i64(), s["writes_landed"].as_bool()), (Some(0), Some(false)), "{s}");
    assert_eq!(s["changes"]["outcome"], "held", "{s}");
    let id = s["changes"]["id"].as_str().unwrap();
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(text.contains(id) && text.contains("NOT ALL OF THE RUN'S WRITES WERE APPLIED"), "{text}");
    assert!(!ws.join("made.txt").exists());
    // Counter-test: a run that writes nothing is no error.
    send(&mut stdin, call(3, &["./probe", "echo", "fine"]));
    let reply = until_response(&rx, 3).pop().unwrap();
    assert_eq!(reply["result"]["isError"], false, "{reply}");
    assert_eq!(reply["result"]["structuredContent"]["writes_landed"], true, "{reply}");
}

/// One server runs both: commands under its profile (`--profile sh`, which
/// allows a shell's inline code) and the tools its policy declares, whose
/// calls never carry the server's profile (a request naming a tool and a
/// profile is refused).
#[test]
fn one_server_runs_commands_under_its_profile_and_declared_tools() {
    let ws = TempDir::new("mcp-both");
    std::fs::write(ws.join("notes.txt"), "one\ntwo\n").unwrap();
    let etc = TempDir::new("mcp-both-policy");
    let policy = etc.join("policy.toml");
    std::fs::write(
        &policy,
        "[trust]\nenabled = false\n\n[profiles.sh]\nallow_interpreters = true\nallow_inline_code = true\n\n\
         [tools.lister]\ndescription = \"lists the workspace\"\n\
         [tools.lister.overrides]\nfilesystem = [{ read_only = \"${WORKSPACE}\" }]\n",
    )
    .unwrap();
    let (mut stdin, rx, mut child) = initialized_with_options(&ws, &policy, &["--profile", "sh"]);
    let listing = ["ls", ws.path().to_str().unwrap()];
    let ran = tool(&mut stdin, &rx, 2, "run_command", json!({"command": "echo $((6 * 7)) | cat"}));
    assert_eq!((ran["exit_code"].as_i64(), ran["stdout"].as_str()), (Some(0), Some("42\n")), "{ran}");
    let listed = tool(&mut stdin, &rx, 3, "run_tool", json!({"tool": "lister", "argv": listing}));
    assert_eq!(listed["exit_code"], 0, "{listed}");
    assert!(listed["stdout"].as_str().is_some_and(|s| s.contains("notes.txt")), "{listed}");
    let explained = tool(&mut stdin, &rx, 4, "explain", json!({"tool": "lister", "argv": listing}));
    assert_eq!(explained["decision"], "allow", "{explained}");
    // And the commands after it still run under the profile.
    let again = tool(&mut stdin, &rx, 5, "run_command", json!({"command": "echo again | cat"}));
    assert_eq!(again["stdout"], "again\n", "{again}");
    drop(stdin);
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
}
