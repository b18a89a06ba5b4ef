//! The broker and the CLI end to end, through the real binaries and the Unix
//! socket: output, quotas, deadlines, disconnects, bad input, peers,
//! concurrency, shutdown, systemd integration, and a broker run unprivileged.

use palisade_broker::cli::client::{Client, ClientError};
use palisade_protocol::wire::{
    self, ClientMessage, Decoder, Encoding, ErrorKind, Hello, MAX_FRAME_BYTES, RunRequest, RunStatus,
    ServerMessage, Stream, encode,
};
use palisade_tests::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn token(tag: &str) -> String {
    format!("palisade-{tag}-{}-{:?}", std::process::id(), std::thread::current().id()).replace(['(', ')'], "")
}

#[test]
fn output_stdin_and_exit_status_go_end_to_end_through_the_cli() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let o = d.run(ws.path(), &[&probe(), "echo", "hello", "world"]);
    assert_eq!((o.status.code(), stdout(&o).as_str()), (Some(0), "ok hello world\n"), "{}", d.log());

    let mut cli = std::process::Command::new(bin("palisade"))
        .args(["run", "--socket", d.socket.to_str().unwrap(), "--", &probe(), "cat"])
        .current_dir(ws.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    cli.stdin.take().unwrap().write_all(b"fed through stdin").unwrap();
    let o = cli.wait_with_output().unwrap();
    assert_eq!(stdout(&o), "ok fed through stdin\n");

    assert_eq!(d.run(ws.path(), &[&probe(), "exit", "7"]).status.code(), Some(7));
    assert_eq!(d.run(ws.path(), &[&probe(), "kill-self", "15"]).status.code(), Some(128 + 15));
    let o = d.run(ws.path(), &[&probe(), "write", ws.join("made").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    assert!(ws.join("made").exists(), "the current directory is the writable workspace");
}

#[test]
fn json_output_carries_the_result_and_its_attestation() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let o = palisade_cli(
        ws.path(),
        &["run", "--json", "--socket", d.socket.to_str().unwrap()],
        &[&probe(), "echo", "x"],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["stdout"], "ok x\n");
    let r = &v["result"];
    assert_eq!(r["status"]["exited"]["code"], 0);
    assert_eq!(r["stdout_bytes"], 5);
    let a = &r["attestation"];
    assert_eq!(a["executor"], "linux-tier-c");
    assert_eq!(a["execution_sha256"].as_str().unwrap().len(), 64);
    let e = &a["enforcement"];
    assert_eq!(e["namespaces"].as_array().unwrap().len(), 7);
    assert_eq!(e["seccomp_sha256"].as_str().unwrap().len(), 64);
    assert!(e["landlock"]["abi"].as_u64().unwrap() >= 1, "{e}");
    let core = serde_json::json!({"name": "CORE", "soft": 0, "hard": 0});
    assert!(e["rlimits"].as_array().unwrap().contains(&core), "{e}");
    assert!(r["wall_ms"].as_u64().is_some() && r["peak_memory_bytes"].as_u64().unwrap() > 0);
}

/// A hello that never ends is refused after 10 s in the encoding its
/// first bytes chose: JSON for a JSON client; a bincode frame for a client
/// that sent nothing at all (its encoding cannot be known).
#[test]
fn the_hello_timeout_answers_in_the_clients_encoding() {
    let d = Daemon::start("");
    let answer = |sent: &[u8]| {
        let mut s = UnixStream::connect(&d.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(sent).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        got
    };
    let (json, silent) = std::thread::scope(|t| {
        let json = t.spawn(|| answer(br#"{"hello": {"magic": "palisade", "version": 12"#));
        let silent = t.spawn(|| answer(b""));
        (json.join().unwrap(), silent.join().unwrap())
    });
    let line: serde_json::Value = serde_json::from_slice(&json).unwrap_or_else(|e| panic!("{e}: {json:?}"));
    assert_eq!(line["error"]["kind"], "ProtocolError");
    assert_eq!(line["error"]["message"], "no hello within 10 s");
    let mut decoder = Decoder::new(Some(Encoding::Bincode));
    decoder.push(&silent);
    match decoder.next_message::<ServerMessage>() {
        Ok(Some(ServerMessage::Error(e))) => assert_eq!(e.message, "no hello within 10 s"),
        other => panic!("{other:?}"),
    }
}

/// `palisade run --json` keeps output that is not UTF-8 as it was (base64)
/// and says which broker ran the command.
#[test]
fn run_json_keeps_the_bytes_and_names_the_broker() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    std::fs::write(ws.join("bytes"), b"a\xffb").unwrap();
    let socket = d.socket.to_str().unwrap();
    let o = palisade_cli(ws.path(), &["run", "--json", "--socket", socket], &["cat", "bytes"], None);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (&v["stdout_base64"], &v["stdout"], &v["stderr"]),
        (&"Yf9i".into(), &serde_json::Value::Null, &"".into())
    );
    assert_eq!(v["result"]["stdout_bytes"], 3);
    assert_eq!(v["broker"], format!("the broker on {socket}"));
    let o = palisade_cli(ws.path(), &["run", "--json", "--policy", "/dev/null"], &["echo", "x"], None);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((&v["stdout"], &v["broker"]), (&"x\n".into(), &"embedded (policy: /dev/null)".into()));
}

/// Without a cgroup, a run's peak memory is its command's own (the
/// largest resident set of its processes), not the broker's that the
/// helper inherits when it is forked.
#[test]
fn peak_memory_is_the_commands_own() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let peak = |args: &[&str]| {
        let socket = d.socket.to_str().unwrap();
        let o = palisade_cli(ws.path(), &["run", "--json", "--socket", socket], args, None);
        let v: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", stderr(&o)));
        assert_eq!(v["result"]["memory_source"], "rusage", "{v}");
        v["result"]["peak_memory_bytes"].as_u64().unwrap()
    };
    let small = peak(&[&probe(), "echo", "x"]);
    let big = peak(&[&probe(), "membomb", "96"]);
    assert!(small > 0 && small < 16 << 20, "echo's peak: {small}");
    assert!((96 << 20..128 << 20).contains(&big), "a 96 MiB allocation's peak: {big}");
    // The broker is larger than the echo's peak: that is not what was reported.
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
    let hwm = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).unwrap();
    let broker_kib: u64 = hwm.trim().trim_end_matches(" kB").trim().parse().unwrap();
    assert!(broker_kib * 1024 > small, "broker {broker_kib} KiB, echo {small} bytes");
}

#[test]
fn output_over_the_quota_kills_the_sandbox_and_never_reaches_the_client() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let tok = token("flood");
    let mut client = Client::connect(&d.socket).unwrap();
    let mut req = request(ws.path(), &["flood", &tok]);
    req.max_output_bytes = Some(100_000);
    let mut received = 0usize;
    let result = client
        .run(req, |m| {
            if let ServerMessage::Output { data, .. } = m {
                received += data.len();
            }
        })
        .unwrap();
    assert_eq!(result.status, RunStatus::QuotaExceeded);
    assert_eq!(received, 100_000);
    assert_eq!(result.stdout_bytes, 100_000);
    assert!(eventually(Duration::from_secs(5), || process_with_token(&tok).is_none()), "the flood survived");
    // With the CLI: exit 125 and the kind named.
    let o = palisade_cli(
        ws.path(),
        &["run", "--socket", d.socket.to_str().unwrap(), "--max-output", "1000"],
        &[&probe(), "flood"],
        None,
    );
    assert_eq!(o.status.code(), Some(125));
    assert_eq!(o.stdout.len(), 1000);
    assert!(stderr(&o).starts_with("palisade: QuotaExceeded: "), "{}", stderr(&o));
}

/// Where two byte strings first differ (their lengths, when one is a prefix).
fn first_difference(a: &[u8], b: &[u8]) -> Option<String> {
    let at = a.iter().zip(b).position(|(x, y)| x != y);
    match at {
        Some(i) => Some(format!("byte {i} differs ({} and {} bytes)", a.len(), b.len())),
        None if a.len() != b.len() => Some(format!("{} bytes against {}", a.len(), b.len())),
        None => None,
    }
}

#[test]
fn large_output_arrives_whole_and_in_order_into_pipes_files_and_the_library() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let len = 6_000_000 + 123;
    let (out, err) = (pattern(len, 0), pattern(len, 1));
    let mut expected_out = out.clone();
    expected_out.extend_from_slice(b"ok \n");
    let args = [probe(), "pattern".into(), len.to_string()];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    // Into pipes, as `palisade run ... | next` (the CLI splices from the socket).
    let o = d.run(ws.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", d.log());
    assert_eq!(first_difference(&o.stdout, &expected_out), None, "stdout into a pipe");
    assert_eq!(first_difference(&o.stderr, &err), None, "stderr into a pipe");

    // Into files (the CLI reads and writes).
    let files = TempDir::new("files");
    let (fo, fe) = (files.join("out"), files.join("err"));
    let status = std::process::Command::new(bin("palisade"))
        .args(["run", "--socket", d.socket.to_str().unwrap(), "--"])
        .args(&args)
        .current_dir(ws.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&fo).unwrap())
        .stderr(std::fs::File::create(&fe).unwrap())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(first_difference(&std::fs::read(&fo).unwrap(), &expected_out), None, "stdout into a file");
    assert_eq!(first_difference(&std::fs::read(&fe).unwrap(), &err), None, "stderr into a file");

    // Through the library, each piece seen.
    let mut client = Client::connect(&d.socket).unwrap();
    let (mut got_out, mut got_err) = (Vec::new(), Vec::new());
    let result = client
        .run(request(ws.path(), &["pattern", &len.to_string()]), |m| {
            if let ServerMessage::Output { stream, data } = m {
                if *stream == Stream::Stdout { &mut got_out } else { &mut got_err }.extend_from_slice(data);
            }
        })
        .unwrap();
    assert_eq!(result.status, RunStatus::Exited { code: 0 });
    assert_eq!(first_difference(&got_out, &expected_out), None, "stdout through the library");
    assert_eq!(first_difference(&got_err, &err), None, "stderr through the library");
    assert_eq!((result.stdout_bytes, result.stderr_bytes), (expected_out.len() as u64, len as u64));

    // The quota cuts spliced output at the byte: the two streams together
    // carry exactly the limit, each a prefix of what was written.
    let limit = 3_000_001;
    let o = palisade_cli(
        ws.path(),
        &["run", "--socket", d.socket.to_str().unwrap(), "--max-output", &limit.to_string()],
        &args,
        None,
    );
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let message = b"palisade: QuotaExceeded: ";
    let at = o.stderr.windows(message.len()).rposition(|w| w == message).expect("the quota's message");
    let err_part = &o.stderr[..at];
    assert_eq!(o.stdout.len() + err_part.len(), limit);
    assert_eq!(first_difference(&o.stdout, &out[..o.stdout.len()]), None);
    assert_eq!(first_difference(err_part, &err[..err_part.len()]), None);

    // A reader that goes away early, in the middle of spliced output: the
    // CLI cancels the run and ends as SIGPIPE would end it, and the daemon
    // goes on serving.
    let mut cli = std::process::Command::new(bin("palisade"))
        .args(["run", "--socket", d.socket.to_str().unwrap(), "--"])
        .args(&args)
        .current_dir(ws.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut head = [0u8; 100_000];
    cli.stdout.take().unwrap().read_exact(&mut head).unwrap();
    assert_eq!(first_difference(&head, &out[..head.len()]), None);
    let status = cli.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGPIPE), "{}", d.log());
    let o = palisade_cli(
        ws.path(),
        &["run", "--socket", d.socket.to_str().unwrap()],
        &["/bin/echo", "next"],
        None,
    );
    assert_eq!((o.status.code(), o.stdout.as_slice()), (Some(0), &b"next\n"[..]), "{}", stderr(&o));
}

#[test]
fn the_deadline_kills_a_double_forked_setsid_sleeper() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let tok = token("sleeper");
    let cli = std::process::Command::new(bin("palisade"))
        .args([
            "run",
            "--socket",
            d.socket.to_str().unwrap(),
            "--timeout",
            "2",
            "--",
            &probe(),
            "daemonize",
            &tok,
        ])
        .current_dir(ws.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The sleeper itself (`probe sleep TOKEN`, in a session of its own), not
    // the CLI or the command that asked for it, which carry the token too.
    assert!(
        eventually(Duration::from_secs(10), || sleeper_with_token(&tok).is_some()),
        "the sleeper never started"
    );
    let sleeper = sleeper_with_token(&tok).unwrap();
    let session = nix::unistd::getsid(Some(nix::unistd::Pid::from_raw(sleeper as i32))).unwrap();
    assert_ne!(session, nix::unistd::getsid(None).unwrap(), "the sleeper did not call setsid");
    let o = cli.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).starts_with("palisade: TimedOut: "), "{}", stderr(&o));
    assert!(
        eventually(Duration::from_secs(5), || !Path::new(&format!("/proc/{sleeper}")).exists()),
        "pid {sleeper} outlived the deadline"
    );
    assert!(process_with_token(&tok).is_none(), "a process of the sandbox outlived the deadline");
}

#[test]
fn a_client_that_stops_reading_cannot_hold_its_sandbox_past_the_deadline() {
    // An output quota the flood cannot reach: the deadline ends the run.
    let d = Daemon::start("max_output_bytes = 1099511627776\n");
    let ws = TempDir::new("ws");
    let tok = token("unread");
    let mut stalled = Client::connect(&d.socket).unwrap();
    let mut req = request(ws.path(), &["flood", &tok]);
    req.timeout_secs = Some(2);
    stalled.send(&ClientMessage::Run(req)).unwrap();
    // It never reads: the socket's buffers fill and the broker's writes block.
    assert!(eventually(Duration::from_secs(10), || process_with_token(&tok).is_some()));
    assert!(
        eventually(Duration::from_secs(20), || process_with_token(&tok).is_none()),
        "the sandbox outlived its deadline while its client did not read\n{}",
        d.log()
    );
    // The run's slot is free again, and other clients are served meanwhile.
    let o = d.run(ws.path(), &[&probe(), "echo", "next"]);
    assert_eq!(stdout(&o), "ok next\n", "{}", d.log());
    // The run itself ends (its unsent output dropped) a short grace later.
    assert!(eventually(Duration::from_secs(15), || d.log().contains("status=TimedOut")), "{}", d.log());
    drop(stalled);
}

#[test]
fn a_client_that_leaves_the_queue_frees_its_place() {
    let d = Daemon::start("[broker]\nmax_concurrent = 1\nmax_queued = 1\n");
    let ws = TempDir::new("ws");
    let mut first = Client::connect(&d.socket).unwrap();
    first.send(&ClientMessage::Run(request(ws.path(), &["sleep", "x"]))).unwrap();
    assert!(matches!(first.receive().unwrap(), ServerMessage::Started { .. }));
    // The second waits in the queue, then gives up.
    let mut second = Client::connect(&d.socket).unwrap();
    second.send(&ClientMessage::Run(request(ws.path(), &["echo", "queued"]))).unwrap();
    // Queued before anyone else comes (connections are served concurrently).
    assert!(eventually(Duration::from_secs(10), || d.log().contains("waiting in the queue")), "{}", d.log());
    assert!(eventually(Duration::from_secs(10), || {
        let o = d.run(ws.path(), &[&probe(), "echo", "x"]);
        stderr(&o).starts_with("palisade: Busy: ")
    }));
    drop(second);
    assert!(eventually(Duration::from_secs(10), || d.log().contains("left the queue")), "{}", d.log());
    // Its place is free: a third waits instead of being told Busy, and runs once the first is gone.
    let third = std::thread::scope(|s| {
        let waiting = s.spawn(|| d.run(ws.path(), &[&probe(), "echo", "third"]));
        std::thread::sleep(Duration::from_millis(500));
        drop(first);
        waiting.join().unwrap()
    });
    assert_eq!((third.status.code(), stdout(&third).as_str()), (Some(0), "ok third\n"), "{}", stderr(&third));
}

#[test]
fn a_client_that_disconnects_gets_its_sandbox_killed() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let tok = token("abandoned");
    let mut client = Client::connect(&d.socket).unwrap();
    client.send(&ClientMessage::Run(request(ws.path(), &["daemonize", &tok]))).unwrap();
    assert!(matches!(client.receive().unwrap(), ServerMessage::Started { .. }));
    assert!(eventually(Duration::from_secs(10), || process_with_token(&tok).is_some()));
    drop(client);
    assert!(
        eventually(Duration::from_secs(5), || process_with_token(&tok).is_none()),
        "the sandbox outlived its client"
    );
}

/// Sends `bytes` on a fresh connection, half-closes, and returns the broker's answer.
fn exchange(socket: &Path, bytes: &[u8]) -> Vec<ServerMessage> {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let mut d = Decoder::default();
    d.push(&out);
    std::iter::from_fn(|| d.next_message::<ServerMessage>().ok().flatten()).collect()
}

/// Sends `bytes` and reads replies, the connection left open, until a run
/// finishes or an error comes (or the broker closes it).
fn converse(socket: &Path, bytes: &[u8]) -> Vec<ServerMessage> {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(bytes).unwrap();
    let (mut d, mut got, mut buf) = (Decoder::default(), Vec::new(), [0u8; 4096]);
    loop {
        while let Ok(Some(m)) = d.next_message::<ServerMessage>() {
            let last = matches!(m, ServerMessage::Finished(_) | ServerMessage::Error(_));
            // Messages after the hello take the form of the version it agreed.
            if let ServerMessage::Hello(h) = &m {
                d.set_version(h.version);
            }
            got.push(m);
            if last {
                return got;
            }
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return got,
            Ok(n) => d.push(&buf[..n]),
        }
    }
}

fn the_error(msgs: &[ServerMessage]) -> (ErrorKind, String) {
    match msgs.last() {
        Some(ServerMessage::Error(e)) => (e.kind, e.message.clone()),
        other => panic!("expected an error, got {other:?} in {msgs:?}"),
    }
}

fn hello(encoding: Encoding) -> Vec<u8> {
    encode(&ClientMessage::Hello(Hello::new(encoding)), encoding).unwrap()
}

/// The hello carries the range of versions a client speaks; the broker
/// answers with the highest both speak, and speaks the version before its
/// own too: a client of version 12 (whose hello, in bincode, has no
/// `min_version`) runs a command as it did.
#[test]
fn the_hello_agrees_on_the_highest_version_both_sides_speak() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let json = |hello: &str| {
        let run = serde_json::json!({ "run": request(ws.path(), &["echo", "spoken"]) });
        converse(&d.socket, format!("{{\"hello\": {hello}}}\n{run}\n").as_bytes())
    };
    let agreed = |msgs: &[ServerMessage]| match msgs.first() {
        Some(ServerMessage::Hello(h)) => h.version,
        other => panic!("{other:?} in {msgs:?}"),
    };
    let ran = |msgs: &[ServerMessage]| {
        msgs.iter()
            .any(|m| matches!(m, ServerMessage::Finished(r) if r.status == RunStatus::Exited { code: 0 }))
    };
    let (current, oldest) = (wire::PROTOCOL_VERSION, wire::OLDEST_PROTOCOL_VERSION);
    let msgs = json(&format!(r#"{{"magic": "palisade", "version": {oldest}, "encoding": "json"}}"#));
    assert!(agreed(&msgs) == oldest && ran(&msgs), "{msgs:?}");
    let msgs = json(&format!(
        r#"{{"magic": "palisade", "version": 40, "min_version": {oldest}, "encoding": "json"}}"#
    ));
    assert!(agreed(&msgs) == current && ran(&msgs), "{msgs:?}");
    let old = oldest - 1;
    let (kind, msg) =
        the_error(&json(&format!(r#"{{"magic": "palisade", "version": {old}, "encoding": "json"}}"#)));
    assert_eq!(kind, ErrorKind::ProtocolError);
    assert_eq!(
        msg,
        format!("protocol version {old} is not supported; this broker speaks {oldest} to {current}")
    );
    let (_, msg) =
        the_error(&json(r#"{"magic": "palisade", "version": 12, "min_version": 14, "encoding": "json"}"#));
    assert_eq!(msg, "min_version 14 is above version 12");
    // Version 12's bincode hello: magic, version and encoding, nothing after;
    // then a run in version 12's form.
    #[derive(serde::Serialize)]
    enum Twelve {
        Hello { magic: String, version: u32, encoding: Encoding },
    }
    let hello = Twelve::Hello { magic: "palisade".into(), version: oldest, encoding: Encoding::Bincode };
    let body = bincode::serde::encode_to_vec(&hello, bincode::config::standard()).unwrap();
    let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
    bytes.extend(body);
    let run = ClientMessage::Run(request(ws.path(), &["echo", "spoken"]));
    bytes.extend(wire::encode_in(&run, Encoding::Bincode, oldest).unwrap());
    let msgs = converse(&d.socket, &bytes);
    assert!(agreed(&msgs) == oldest && ran(&msgs), "{msgs:?}");
}

#[test]
fn bad_frames_get_an_error_and_the_broker_keeps_serving() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let still_serving = || {
        let o = d.run(ws.path(), &[&probe(), "echo", "alive"]);
        assert_eq!(stdout(&o), "ok alive\n", "{}", d.log());
    };

    // Oversized: a length prefix past the limit, refused before anything is buffered.
    let mut oversized = hello(Encoding::Bincode);
    oversized.extend(((MAX_FRAME_BYTES + 1) as u32).to_be_bytes());
    let (kind, msg) = the_error(&exchange(&d.socket, &oversized));
    assert_eq!(kind, ErrorKind::ProtocolError);
    assert!(msg.contains("exceeds"), "{msg}");
    still_serving();

    // Garbage instead of a hello.
    let (kind, _) = the_error(&exchange(&d.socket, b"\x00\x00\x00\x08\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8"));
    assert_eq!(kind, ErrorKind::ProtocolError);
    still_serving();

    // A hello far larger than any hello is refused before authentication.
    let mut big = 5000u32.to_be_bytes().to_vec();
    big.extend(vec![0u8; 5000]);
    assert_eq!(the_error(&exchange(&d.socket, &big)).0, ErrorKind::ProtocolError);
    still_serving();

    // A protocol version this broker does not speak.
    let mut h = Hello::new(Encoding::Bincode);
    (h.version, h.min_version) = (99, Some(99));
    let (kind, msg) =
        the_error(&exchange(&d.socket, &encode(&ClientMessage::Hello(h), Encoding::Bincode).unwrap()));
    assert_eq!(kind, ErrorKind::ProtocolError);
    assert!(msg.contains("version 99"), "{msg}");
    still_serving();

    // A frame cut short by the end of the connection.
    let mut truncated = hello(Encoding::Bincode);
    let run = encode(&ClientMessage::Run(request(ws.path(), &["echo"])), Encoding::Bincode).unwrap();
    truncated.extend(&run[..run.len() / 2]);
    let (kind, msg) = the_error(&exchange(&d.socket, &truncated));
    assert_eq!(kind, ErrorKind::ProtocolError);
    assert!(msg.contains("middle of a frame"), "{msg}");
    still_serving();

    // JSON with the wrong types.
    let mut json = hello(Encoding::Json);
    json.extend(b"{\"run\": {\"argv\": \"echo not-a-list\", \"timeout_secs\": \"soon\"}}\n");
    let msgs = exchange(&d.socket, &json);
    assert!(matches!(msgs.first(), Some(ServerMessage::Hello(_))), "{msgs:?}");
    assert_eq!(the_error(&msgs).0, ErrorKind::ProtocolError);
    still_serving();

    // A misspelt field is refused by its name, never ignored (the deadline
    // it meant would not apply); the hello takes fields it does not know.
    let mut hello_json = serde_json::to_value(ClientMessage::Hello(Hello::new(Encoding::Json))).unwrap();
    hello_json["hello"]["from_the_future"] = serde_json::json!(1);
    for (message, field) in [
        (r#"{"run": {"argv": ["echo"], "cwd": "/tmp", "timeout_sec": 5}}"#, "timeout_sec"),
        (r#"{"answer": {"approval": 1, "approved": true, "reasn": "x"}}"#, "reasn"),
    ] {
        let mut bytes = serde_json::to_vec(&hello_json).unwrap();
        bytes.push(b'\n');
        bytes.extend(message.as_bytes());
        bytes.push(b'\n');
        let msgs = exchange(&d.socket, &bytes);
        assert!(matches!(msgs.first(), Some(ServerMessage::Hello(_))), "{msgs:?}");
        let (kind, msg) = the_error(&msgs);
        assert_eq!(kind, ErrorKind::ProtocolError);
        assert!(msg.contains(&format!("unknown field `{field}`")), "{msg}");
    }
    still_serving();

    // A well-formed request the policy refuses also leaves the connection usable.
    let mut c = Client::connect(&d.socket).unwrap();
    let bad =
        RunRequest { argv: vec!["/nonexistent/cmd".into()], cwd: Some("/tmp".into()), ..Default::default() };
    assert!(matches!(c.run(bad, |_| {}), Err(ClientError::Reply(e)) if e.kind == ErrorKind::InvalidRequest));
    let r = c.run(request(ws.path(), &["echo", "again"]), |_| {}).unwrap();
    assert_eq!(r.status, RunStatus::Exited { code: 0 });
}

#[test]
fn a_peer_whose_uid_is_not_allowed_is_refused() {
    let ws = TempDir::new("ws");
    let ws_path = shared_workspace(&ws, "w");
    // Allow only a uid that is not the one that will connect.
    let (allowed, connect_as) = if is_root() { (0, Some(test_user())) } else { (0, None) };
    let d = Daemon::start(&format!("[broker]\nallowed_uids = [{allowed}]\nsocket_mode = 0o666\n"));
    let o = palisade_cli(
        &ws_path,
        &["run", "--socket", d.socket.to_str().unwrap()],
        &[&probe(), "echo", "x"],
        connect_as.as_ref(),
    );
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).starts_with("palisade: Unauthorized: uid "), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
    assert!(d.log().contains("peer not allowed"));
    if is_root() {
        // Counter-test: the allowed uid gets through.
        let o = d.run(ws.path(), &[&probe(), "echo", "x"]);
        assert_eq!(stdout(&o), "ok x\n");
    }
}

#[test]
fn the_socket_is_0660_and_a_peer_may_be_allowed_by_its_group() {
    use std::os::unix::fs::PermissionsExt;
    let me = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
    // No uid that will connect is allowed; the client's gid is.
    let d = Daemon::start(&format!("[broker]\nallowed_uids = [4242]\nallowed_gids = [{}]\n", me.1));
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o660, "socket mode {mode:o}");
    let ws = TempDir::new("ws");
    let o = d.run(ws.path(), &[&probe(), "echo", "by-group"]);
    assert_eq!((o.status.code(), stdout(&o).as_str()), (Some(0), "ok by-group\n"), "{}", stderr(&o));
    // Counter-test: neither the uid nor the gid allowed.
    let d = Daemon::start("[broker]\nallowed_uids = [4242]\nallowed_gids = [4242]\n");
    let o = d.run(ws.path(), &[&probe(), "echo", "x"]);
    assert!(stderr(&o).starts_with("palisade: Unauthorized: "), "{}", stderr(&o));
}

#[test]
fn the_cli_finds_the_broker_at_the_default_socket_or_palisade_socket() {
    use std::os::unix::fs::PermissionsExt;
    // Run as the unprivileged user: root's default socket is the system's /run/palisade.
    let user = if is_root() { Some(test_user()) } else { None };
    let runtime = TempDir::new("xdg");
    std::fs::set_permissions(runtime.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    if let Some(u) = &user {
        nix::unistd::chown(runtime.path(), Some(u.uid), Some(u.gid)).unwrap();
    }
    let socket = runtime.join("palisade/palisade.sock");
    let xdg = runtime.path().to_string_lossy().into_owned();
    let d = Daemon::start_with(DaemonOptions {
        user: user.clone(),
        env: vec![("XDG_RUNTIME_DIR".into(), xdg.clone())],
        default_socket: Some(socket.clone()),
        ..Default::default()
    });
    let ws = TempDir::new("ws");
    let ws_path = shared_workspace(&ws, "w");
    let (_journal, journal) = scratch_journal(user.as_ref());
    let cli = |env: &[(&str, &str)], command: &[&str]| {
        let mut argv: Vec<String> = user.as_ref().map(as_user).unwrap_or_default();
        argv.push(bin("palisade").to_string_lossy().into_owned());
        argv.extend(["run", "--"].map(String::from));
        argv.extend(command.iter().map(|a| a.to_string()));
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]).current_dir(&ws_path).stdin(std::process::Stdio::null());
        cmd.env_remove("PALISADE_SOCKET").env("XDG_RUNTIME_DIR", "/nonexistent");
        cmd.env("PALISADE_JOURNAL", &journal).env("PALISADE_STATE", state_beside(&journal));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let o = cmd.output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{env:?}: {}", stderr(&o));
        stdout(&o)
    };
    let probe = probe();
    // Through the broker at $XDG_RUNTIME_DIR/palisade/palisade.sock...
    assert_eq!(cli(&[("XDG_RUNTIME_DIR", &xdg)], &[&probe, "echo", "found"]), "ok found\n");
    assert!(eventually(Duration::from_secs(5), || d.runs_finished() == 1), "{}", d.log());
    // ... and at $PALISADE_SOCKET, whatever the runtime directory.
    assert_eq!(
        cli(&[("PALISADE_SOCKET", socket.to_str().unwrap())], &[&probe, "echo", "found"]),
        "ok found\n"
    );
    assert!(eventually(Duration::from_secs(5), || d.runs_finished() == 2), "{}", d.log());
    // Counter-test: with neither, no broker answers and the CLI runs an embedded one.
    assert_eq!(cli(&[], &["/usr/bin/echo", "embedded"]), "embedded\n");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(d.runs_finished(), 2, "{}", d.log());
}

/// A user's daemon started by hand where there is no runtime directory
/// (no `XDG_RUNTIME_DIR`, no `/run/user/UID`: containers, CI, SSH without
/// logind) listens in the private `palisade-UID` of the temporary
/// directory, and the CLI finds it there; one of that name someone else
/// made is refused by the daemon and passed over by the CLI.
#[test]
fn a_user_daemon_without_a_runtime_directory_is_found_in_its_private_temporary_directory() {
    use std::os::unix::fs::PermissionsExt;
    let user = if is_root() { Some(test_user()) } else { None };
    let uid = user.as_ref().map_or_else(|| nix::unistd::geteuid().as_raw(), |u| u.uid.as_raw());
    assert!(
        !Path::new(&format!("/run/user/{uid}")).exists(),
        "uid {uid} has a runtime directory: this test needs a user without one"
    );
    // A shared temporary directory of the test's own, as /tmp is.
    let tmp = TempDir::new("tmpdir");
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let private = tmp.join(&format!("palisade-{uid}"));
    let tmpdir = tmp.path().to_string_lossy().into_owned();
    let env = vec![("XDG_RUNTIME_DIR".to_string(), String::new()), ("TMPDIR".to_string(), tmpdir.clone())];

    // Someone else's directory of that name: the daemon refuses it, naming it.
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut argv: Vec<String> = user.as_ref().map(as_user).unwrap_or_default();
    argv.push(bin("palisaded").to_string_lossy().into_owned());
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]).envs(env.iter().cloned()).stdin(std::process::Stdio::null());
    let (journal_dir, journal) = scratch_journal(user.as_ref());
    cmd.env("PALISADE_JOURNAL", &journal).env("PALISADE_STATE", state_beside(&journal));
    let o = cmd.output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("{} is not a directory of uid {uid}", private.display())),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir(&private).unwrap();
    drop(journal_dir);

    let socket = private.join("palisade.sock");
    let d = Daemon::start_with(DaemonOptions {
        user: user.clone(),
        env: env.clone(),
        default_socket: Some(socket.clone()),
        ..Default::default()
    });
    let mode = std::fs::symlink_metadata(&private).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    let ws = TempDir::new("ws");
    let ws_path = shared_workspace(&ws, "w");
    let (_journal, journal) = scratch_journal(user.as_ref());
    let cli = |tmpdir: &str, command: &[&str]| {
        let mut argv: Vec<String> = user.as_ref().map(as_user).unwrap_or_default();
        argv.push(bin("palisade").to_string_lossy().into_owned());
        argv.extend(["run", "--"].map(String::from));
        argv.extend(command.iter().map(|a| a.to_string()));
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]).current_dir(&ws_path).stdin(std::process::Stdio::null());
        cmd.env_remove("PALISADE_SOCKET").env("XDG_RUNTIME_DIR", "").env("TMPDIR", tmpdir);
        cmd.env("PALISADE_JOURNAL", &journal).env("PALISADE_STATE", state_beside(&journal));
        let o = cmd.output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
    };
    let probe = probe();
    assert_eq!(cli(&tmpdir, &[&probe, "echo", "found"]), "ok found\n");
    assert!(eventually(Duration::from_secs(5), || d.runs_finished() == 1), "{}", d.log());
    // Counter-test: another temporary directory, no broker there: an embedded one runs.
    let elsewhere = TempDir::new("tmpdir2");
    std::fs::set_permissions(elsewhere.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    assert_eq!(cli(&elsewhere.path().to_string_lossy(), &["/usr/bin/echo", "embedded"]), "embedded\n");
    // The daemon's directory opened to others: the CLI no longer trusts it.
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_eq!(cli(&tmpdir, &["/usr/bin/echo", "passed over"]), "passed over\n");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(d.runs_finished(), 1, "{}", d.log());
}

#[test]
fn fifty_concurrent_runs_all_finish_with_the_right_outputs() {
    let d = Daemon::start("[broker]\nmax_concurrent = 8\nmax_queued = 64\n");
    let ws = TempDir::new("ws");
    let outputs: Vec<(usize, String, Option<i32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..50)
            .map(|i| {
                let (d, ws) = (&d, &ws);
                s.spawn(move || {
                    let o = d.run(ws.path(), &[&probe(), "echo", &format!("run-{i}")]);
                    (i, stdout(&o), o.status.code())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, out, code) in outputs {
        assert_eq!((out, code), (format!("ok run-{i}\n"), Some(0)), "{}", d.log());
    }
}

#[test]
fn a_full_queue_answers_busy() {
    let d = Daemon::start("[broker]\nmax_concurrent = 1\nmax_queued = 0\n");
    let ws = TempDir::new("ws");
    let mut first = Client::connect(&d.socket).unwrap();
    first.send(&ClientMessage::Run(request(ws.path(), &["sleep", "x"]))).unwrap();
    assert!(matches!(first.receive().unwrap(), ServerMessage::Started { .. }));
    let o = d.run(ws.path(), &[&probe(), "echo", "x"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).starts_with("palisade: Busy: "), "{}", stderr(&o));
    drop(first);
    // The slot frees once the first client is gone.
    assert!(eventually(Duration::from_secs(10), || d
        .run(ws.path(), &[&probe(), "echo", "x"])
        .status
        .success()));
}

#[test]
fn a_helper_failure_reaches_the_client_as_stage_and_errno() {
    // The broker runs under a hard RLIMIT_NOFILE of 4096 and the policy asks for
    // more: the helper cannot raise a hard limit (no privilege in the initial
    // user namespace), fails at its rlimits step, and execs nothing.
    let d = Daemon::start_with(DaemonOptions {
        config: "max_open_files = 100000\n".into(),
        prefix: vec!["prlimit".into(), "--nofile=4096:4096".into(), "--".into()],
        ..Default::default()
    });
    let ws = TempDir::new("ws");
    let marker = ws.join("ran");
    let o = d.run(ws.path(), &[&probe(), "write", marker.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    assert_eq!(
        stderr(&o).trim_end(),
        "palisade: RuntimeFailure: sandbox setup failed: (rlimits, EPERM) setrlimit RLIMIT_NOFILE 100000/100000: EPERM"
    );
    assert!(o.stdout.is_empty() && !marker.exists());
    // The same failure as fields, in both encodings.
    let what = "setrlimit RLIMIT_NOFILE 100000/100000: EPERM";
    let req = request(ws.path(), &["write", marker.to_str().unwrap()]);
    match Client::connect(&d.socket).unwrap().run(req.clone(), |_| {}) {
        Err(ClientError::Reply(e)) => {
            assert_eq!(e.kind, ErrorKind::RuntimeFailure);
            let h = e.helper.unwrap_or_else(|| panic!("no helper fields: {}", e.message));
            assert_eq!((h.stage.as_str(), h.errno, h.errno_name.as_str()), ("rlimits", libc::EPERM, "EPERM"));
            assert_eq!(h.message, what);
        }
        other => panic!("expected the helper's failure, got {other:?}"),
    }
    let json = json_run(&d.socket, &req);
    let error = &json.last().unwrap()["error"];
    assert_eq!(error["kind"], "RuntimeFailure", "{json:?}");
    assert_eq!(
        error["helper"],
        serde_json::json!({"stage": "rlimits", "errno": libc::EPERM, "errno_name": "EPERM", "message": what})
    );
    let o = palisade_cli(
        ws.path(),
        &["run", "--json", "--socket", d.socket.to_str().unwrap()],
        &[&probe(), "write", marker.to_str().unwrap()],
        None,
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    assert_eq!(
        (&v["error"]["helper"]["stage"], &v["error"]["helper"]["errno"]),
        (&"rlimits".into(), &1.into())
    );
    assert!(!marker.exists());
    // The journal's record of each failed run names the step too.
    let failed: Vec<_> =
        journal_records(&d.journal()).into_iter().filter(|r| r["event"] == "run_failed").collect();
    assert_eq!(failed.len(), 4, "{failed:?}");
    for r in &failed {
        assert_eq!(
            (&r["kind"], &r["stage"], &r["errno"]),
            (&"RuntimeFailure".into(), &"rlimits".into(), &1.into())
        );
    }
    // Counter-test: within the hard limit the same run works.
    let d = Daemon::start_with(DaemonOptions {
        config: "max_open_files = 4096\n".into(),
        prefix: vec!["prlimit".into(), "--nofile=4096:4096".into(), "--".into()],
        ..Default::default()
    });
    assert_eq!(d.run(ws.path(), &[&probe(), "write", marker.to_str().unwrap()]).status.code(), Some(0));
}

/// Runs `req` over the JSON-lines encoding: every message the broker sent,
/// up to its `finished` or `error`, as JSON values.
fn json_run(socket: &Path, req: &RunRequest) -> Vec<serde_json::Value> {
    let mut bytes = hello(Encoding::Json);
    bytes.extend(encode(&ClientMessage::Run(req.clone()), Encoding::Json).unwrap());
    // No half-close: a client that stops sending is a client gone.
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(&bytes).unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(s));
    let mut msgs: Vec<serde_json::Value> = Vec::new();
    while !msgs.last().is_some_and(|m| m.get("finished").is_some() || m.get("error").is_some()) {
        let line = lines.next().unwrap_or_else(|| panic!("closed early: {msgs:?}")).unwrap();
        msgs.push(serde_json::from_str(&line).unwrap());
    }
    msgs
}

#[test]
fn sigterm_kills_running_sandboxes_removes_the_socket_and_exits_zero() {
    let mut d = Daemon::start("");
    let ws = TempDir::new("ws");
    let tok = token("shutdown");
    let mut client = Client::connect(&d.socket).unwrap();
    client.send(&ClientMessage::Run(request(ws.path(), &["daemonize", &tok]))).unwrap();
    assert!(eventually(Duration::from_secs(10), || process_with_token(&tok).is_some()));
    let status = d.stop().expect("palisaded stopped");
    assert_eq!(status.code(), Some(0), "{}", d.log());
    assert!(!d.socket.exists(), "the socket was left behind");
    assert!(
        eventually(Duration::from_secs(5), || process_with_token(&tok).is_none()),
        "a sandbox survived shutdown"
    );
    // The client heard how its run ended.
    let mut saw_end = false;
    while let Ok(m) = client.receive() {
        if let ServerMessage::Finished(r) = m {
            assert_eq!(r.status, RunStatus::Cancelled);
            saw_end = true;
        }
    }
    assert!(saw_end);
}

#[test]
fn readiness_is_notified_and_a_socket_passed_by_systemd_is_used() {
    // sd_notify
    let dir = TempDir::new("notify");
    let notify = dir.join("notify.sock");
    let listener = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    listener.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let d = Daemon::start_with(DaemonOptions {
        env: vec![("NOTIFY_SOCKET".into(), notify.to_string_lossy().into_owned())],
        ..Default::default()
    });
    let mut buf = [0u8; 256];
    let n = listener.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"READY=1");
    drop(d);

    // LISTEN_FDS: the test binds; palisaded (exec'd by a shell that sets
    // LISTEN_PID to its own pid) serves on fd 3.
    let sock = dir.join("activated.sock");
    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let raw = std::os::fd::AsRawFd::as_raw_fd(&l);
    let cfg = dir.join("c.toml");
    std::fs::write(&cfg, base_config()).unwrap();
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        "LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" --config \"$1\"",
        bin("palisaded").to_str().unwrap(),
    ])
    .arg(&cfg)
    .env("PALISADE_JOURNAL", dir.join("journal"))
    .env("PALISADE_STATE", state_beside(dir.join("journal")))
    .stderr(std::process::Stdio::null());
    // SAFETY: dup2 and fcntl are async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            // dup2 onto itself would leave close-on-exec set.
            let rc = if raw == 3 { libc::fcntl(3, libc::F_SETFD, 0) } else { libc::dup2(raw, 3) };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(l);
    let ws = TempDir::new("ws");
    let o = palisade_cli(
        ws.path(),
        &["run", "--socket", sock.to_str().unwrap()],
        &[&probe(), "echo", "activated"],
        None,
    );
    assert_eq!(stdout(&o), "ok activated\n", "{}", stderr(&o));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn the_broker_runs_as_an_unprivileged_user() {
    if !is_root() {
        // The whole suite runs unprivileged: so does every broker it starts.
        let d = Daemon::start("");
        let status = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap().to_string();
        assert!(uid.split_whitespace().skip(1).all(|u| u != "0"), "{uid}");
        let ws = TempDir::new("ws");
        assert_eq!(stdout(&d.run(ws.path(), &[&probe(), "echo", "x"])), "ok x\n", "{}", d.log());
        return;
    }
    let user = test_user();
    let d = Daemon::start_with(DaemonOptions { user: Some(user.clone()), ..Default::default() });
    let ws = TempDir::new("ws");
    let ws_path = shared_workspace(&ws, "w");
    let o = palisade_cli(
        &ws_path,
        &["run", "--json", "--socket", d.socket.to_str().unwrap()],
        &[&probe(), "ids"],
        Some(&user),
    );
    assert_eq!(o.status.code(), Some(0), "{}\n{}", stderr(&o), d.log());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["stdout"], format!("ok uid={} gid={}\n", user.uid, user.gid));
    assert_eq!(v["result"]["attestation"]["enforcement"]["host_uid"], user.uid.as_raw());
    // The broker's own process is unprivileged (setpriv execs palisaded in place).
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&user.uid.to_string()))
    );
    // A peer not allowed (root, here) is refused.
    let root_ws = TempDir::new("rootws");
    let o = palisade_cli(
        root_ws.path(),
        &["run", "--socket", d.socket.to_str().unwrap()],
        &[&probe(), "echo", "x"],
        None,
    );
    assert!(stderr(&o).starts_with("palisade: Unauthorized: "), "{}", stderr(&o));
    // A broker that is not root cannot act as another uid, so it serves none,
    // even one allowed_uids names: it would lend that peer its own access.
    let d = Daemon::start_with(DaemonOptions {
        user: Some(user.clone()),
        config: format!("[broker]\nallowed_uids = [{}, {SANDBOX_ID}]\nsocket_mode = 0o666\n", user.uid),
        ..Default::default()
    });
    let nobody = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(SANDBOX_ID)).unwrap().unwrap();
    let o = palisade_cli(
        &ws_path,
        &["run", "--socket", d.socket.to_str().unwrap()],
        &[&probe(), "echo", "x"],
        Some(&nobody),
    );
    assert!(stderr(&o).starts_with("palisade: Unauthorized: "), "{}\n{}", stderr(&o), d.log());
    let why = format!("this broker runs as uid {} and can act only as itself, not for uid 65534", user.uid);
    assert!(stderr(&o).contains(&why), "{}", stderr(&o));
    // Counter-test: the owner's own request on it runs.
    let o = palisade_cli(
        &ws_path,
        &["run", "--socket", d.socket.to_str().unwrap()],
        &[&probe(), "echo", "x"],
        Some(&user),
    );
    assert_eq!(stdout(&o), "ok x\n", "{}", stderr(&o));
}

/// The broker answers a hello that arrives with a request behind it together
/// with the first reply (one wake-up of the client); it never holds it while
/// waiting for the client, who may be waiting for it.
#[test]
fn a_hello_is_answered_with_the_first_reply_and_never_held_while_the_broker_waits() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let read_all = |s: &mut UnixStream, decoder: &mut Decoder, until: fn(&ServerMessage) -> bool| {
        let mut msgs = Vec::new();
        let mut buf = [0u8; 4096];
        while !msgs.last().is_some_and(until) {
            let n = s.read(&mut buf).expect("a reply within the read timeout");
            assert!(n > 0, "closed early: {msgs:?}");
            decoder.push(&buf[..n]);
            while let Some(m) = decoder.next_message::<ServerMessage>().unwrap() {
                msgs.push(m);
            }
        }
        msgs
    };
    // Hello and run in one write: the hello's answer is in front of the run's replies.
    let mut bytes = hello(Encoding::Bincode);
    bytes.extend(encode(&ClientMessage::Run(request(ws.path(), &["echo", "x"])), Encoding::Bincode).unwrap());
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(&bytes).unwrap();
    let mut decoder = Decoder::new(Some(Encoding::Bincode));
    let msgs = read_all(&mut s, &mut decoder, |m| matches!(m, ServerMessage::Finished(_)));
    assert!(matches!(msgs.first(), Some(ServerMessage::Hello(_))), "{msgs:?}");
    assert!(matches!(msgs.get(1), Some(ServerMessage::Started { .. })), "{msgs:?}");
    // Hello and a cancel (nothing to reply to): the hello still comes, at once.
    let mut bytes = hello(Encoding::Bincode);
    bytes.extend(encode(&ClientMessage::Cancel, Encoding::Bincode).unwrap());
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(&bytes).unwrap();
    let mut decoder = Decoder::new(Some(Encoding::Bincode));
    let msgs = read_all(&mut s, &mut decoder, |m| matches!(m, ServerMessage::Hello(_)));
    assert_eq!(msgs.len(), 1, "{msgs:?}");
}

#[test]
fn the_json_lines_encoding_serves_a_whole_run() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let mut bytes = hello(Encoding::Json);
    let req = request(ws.path(), &["echo", "json"]);
    bytes.extend(encode(&ClientMessage::Run(req), Encoding::Json).unwrap());
    // No half-close here: a client that stops sending is a client gone.
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(&bytes).unwrap();
    let mut decoder = Decoder::default();
    let mut msgs = Vec::new();
    let mut buf = [0u8; 4096];
    while !matches!(msgs.last(), Some(ServerMessage::Finished(_)) | Some(ServerMessage::Error(_))) {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed early: {msgs:?}");
        decoder.push(&buf[..n]);
        while let Some(m) = decoder.next_message::<ServerMessage>().unwrap() {
            msgs.push(m);
        }
    }
    assert_eq!(decoder.encoding(), Some(Encoding::Json));
    let out: Vec<u8> = msgs
        .iter()
        .filter_map(|m| match m {
            ServerMessage::Output { stream: Stream::Stdout, data } => Some(data.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(out, b"ok json\n");
    assert!(
        matches!(msgs.last(), Some(ServerMessage::Finished(r)) if r.status == RunStatus::Exited { code: 0 })
    );
}

#[test]
fn the_documented_python_client_works() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let o = python_client(&[])
        .args(["--socket", d.socket.to_str().unwrap(), "--", &probe(), "echo", "from", "python"])
        .current_dir(ws.path())
        .output()
        .expect("python3");
    assert_eq!(stdout(&o), "ok from python\n", "{}", stderr(&o));
    assert_eq!(o.status.code(), Some(0));
    let o = python_client(&[])
        .args(["--socket", d.socket.to_str().unwrap(), "--", &probe(), "exit", "3"])
        .current_dir(ws.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    // A run that needs approval, with no terminal to ask at: refused.
    let d = Daemon::start("[broker]\nuser_namespaces = false\n[policy]\nfallback = \"request_approval\"\n");
    let mut cmd = python_client(&[]);
    cmd.args(["--socket", d.socket.to_str().unwrap(), "--", &probe(), "echo", "x"])
        .current_dir(ws.path())
        .stdin(std::process::Stdio::null());
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            nix::unistd::setsid().map(drop).map_err(std::io::Error::from)
        });
    }
    let o = cmd.output().unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    assert!(stderr(&o).starts_with("palisade: NeedsApproval: "), "{}", stderr(&o));
    assert!(d.log().contains("not approved (refused)"), "{}", d.log());
}

#[test]
fn with_json_a_failure_is_a_json_object_too() {
    let ws = TempDir::new("ws");
    let nowhere = ws.join("no-broker.sock");
    for (pre, kind) in [
        (vec!["run", "--json", "--socket", nowhere.to_str().unwrap()], "RuntimeFailure"),
        (vec!["run", "--json", "--policy", nowhere.to_str().unwrap()], "InvalidRequest"),
    ] {
        let o = palisade_cli(ws.path(), &pre, &["/usr/bin/echo", "x"], None);
        assert_eq!(o.status.code(), Some(125));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
        assert_eq!(v["error"]["kind"], kind, "{v}");
        assert!(o.stderr.is_empty(), "{}", stderr(&o));
    }
}

#[test]
fn without_a_broker_the_cli_runs_an_embedded_one() {
    let ws = TempDir::new("ws");
    let nowhere = ws.join("no-broker.sock");
    let (_journal, journal) = scratch_journal(None);
    let o = std::process::Command::new(bin("palisade"))
        .args(["run", "--", "/usr/bin/echo", "embedded"])
        .env("PALISADE_SOCKET", &nowhere)
        .env("PALISADE_JOURNAL", &journal)
        .env("PALISADE_STATE", state_beside(&journal))
        .current_dir(ws.path())
        .output()
        .unwrap();
    assert_eq!((o.status.code(), stdout(&o).as_str()), (Some(0), "embedded\n"), "{}", stderr(&o));
    // An explicit --socket that does not answer is an error, not a fallback.
    let o = palisade_cli(
        ws.path(),
        &["run", "--socket", nowhere.to_str().unwrap()],
        &["/usr/bin/echo", "x"],
        None,
    );
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).starts_with("palisade: RuntimeFailure: "), "{}", stderr(&o));
}

/// The daemon's idle helpers: its children (of any thread) running palisade-helper.
fn idle_helpers(d: &Daemon) -> Vec<i32> {
    let pid = d.child.id();
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse::<i32>().ok()) {
            let comm = std::fs::read_to_string(format!("/proc/{child}/comm")).unwrap_or_default();
            if comm.trim_end() == "palisade-helper" {
                found.push(child);
            }
        }
    }
    found
}

#[test]
fn helpers_started_ahead_serve_runs_and_a_dead_one_is_skipped() {
    let d = Daemon::start("[broker]\nprespawn = 2\n");
    let ws = TempDir::new("ws");
    assert!(eventually(Duration::from_secs(10), || idle_helpers(&d).len() == 2), "{}", d.log());
    // Every helper is a child of the one long-lived spawner thread (their death
    // signal follows the thread that forked them).
    let pid = d.child.id();
    for helper in idle_helpers(&d) {
        let parents: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("children"))
                    .unwrap_or_default()
                    .split_whitespace()
                    .any(|c| c == helper.to_string())
            })
            .map(|t| {
                std::fs::read_to_string(t.path().join("comm")).unwrap_or_default().trim_end().to_string()
            })
            .collect();
        // comm holds 15 bytes of the thread's name, "palisade-spawner".
        assert_eq!(parents, ["palisade-spawne"], "helper {helper}");
    }
    // Killed while idle: the next run must not pick a dead one. (SIGKILL
    // takes effect asynchronously: the run starts once they are dead.)
    let killed = idle_helpers(&d);
    for &pid in &killed {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    }
    let dead = |pid: &i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(true, |s| s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')))
    };
    assert!(eventually(Duration::from_secs(10), || killed.iter().all(dead)), "SIGKILL did not kill");
    let o = d.run(ws.path(), &[&probe(), "echo", "after"]);
    assert_eq!((o.status.code(), stdout(&o).as_str()), (Some(0), "ok after\n"), "{}", d.log());
    // A root broker has also started its requester's pool (root's own), of two warm sandboxes.
    let refilled = if is_root() { 4 } else { 2 };
    assert!(eventually(Duration::from_secs(10), || idle_helpers(&d).len() == refilled), "not refilled");
    // A pooled helper takes the run's stdin like any other.
    let mut c = Client::connect(&d.socket).unwrap();
    let mut req = request(ws.path(), &["cat"]);
    req.stdin = b"through a pooled helper".to_vec();
    let mut out = Vec::new();
    let r = c
        .run(req, |m| {
            if let ServerMessage::Output { data, .. } = m {
                out.extend_from_slice(data)
            }
        })
        .unwrap();
    assert_eq!(
        (r.status, String::from_utf8_lossy(&out).as_ref()),
        (RunStatus::Exited { code: 0 }, "ok through a pooled helper\n")
    );

    let none = Daemon::start("[broker]\nprespawn = 0\n");
    assert_eq!(none.run(ws.path(), &[&probe(), "echo", "x"]).status.code(), Some(0));
    std::thread::sleep(Duration::from_millis(200));
    assert!(idle_helpers(&none).is_empty(), "prespawn = 0 keeps no helper");
}

/// The probe's `what` on `path`, passed on stdin: the policy refuses paths
/// outside the workspace on the command line, the kernel is what is tested.
fn probe_path(d: &Daemon, ws: &Path, what: &str, path: &str) -> String {
    let mut req = request(ws, &[what, "-"]);
    req.stdin = path.as_bytes().to_vec();
    let mut out = Vec::new();
    Client::connect(&d.socket)
        .unwrap()
        .run(req, |m| {
            if let ServerMessage::Output { stream: Stream::Stdout, data } = m {
                out.extend_from_slice(data);
            }
        })
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// What a sandbox lists in `dir` (`None`: the listing failed), by name.
fn listing(d: &Daemon, ws: &Path, dir: &str) -> Option<std::collections::BTreeSet<String>> {
    let out = probe_path(d, ws, "list", dir);
    let names = out.trim_end().strip_prefix("ok ")?;
    Some(names.split(',').filter(|n| !n.is_empty()).map(String::from).collect())
}

#[test]
fn the_sandbox_sees_etc_as_a_snapshot_of_what_others_may_read() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let ws = TempDir::new("ws");
    let runs = TempDir::new("runs");
    std::fs::set_permissions(runs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut snapshot = Daemon::start(&format!("[policy]\ntemp_root = {:?}\n", runs.path()));
    let one_by_one = Daemon::start("[broker]\netc_snapshot = false\n");
    let snapshots = || {
        std::fs::read_dir(runs.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("etc-"))
            .count()
    };
    assert_eq!(snapshots(), 1, "the broker keeps one snapshot\n{}", snapshot.log());

    let curated: std::collections::BTreeSet<String> = palisade_policy::jail::ETC_ENTRIES
        .iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| p.trim_start_matches("/etc/").to_string())
        .collect();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    for d in [&snapshot, &one_by_one] {
        assert_eq!(listing(d, ws.path(), "/etc").as_ref(), Some(&curated), "{}", d.log());
        let read = probe_path(d, ws.path(), "read", "/etc/passwd");
        assert_eq!(read, format!("ok {} bytes: {passwd}\n", passwd.len()));
        let write = probe_path(d, ws.path(), "write", "/etc/palisade-probe");
        assert!(write.starts_with("err "), "/etc is writable: {write}");
    }
    assert!(!Path::new("/etc/palisade-probe").exists());

    // Below the entries: what others may read, and only that. (With each
    // entry bound, the sandbox sees the rest too but cannot read it.)
    if let Ok(host) = std::fs::read_dir("/etc/ssl") {
        let readable: std::collections::BTreeSet<String> = host
            .map(|e| e.unwrap())
            .filter(|e| {
                let m = std::fs::symlink_metadata(e.path()).unwrap();
                m.file_type().is_symlink()
                    || (m.is_dir() && m.mode() & 0o005 == 0o005)
                    || (m.is_file() && m.mode() & 0o004 != 0)
            })
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(listing(&snapshot, ws.path(), "/etc/ssl"), Some(readable));
        for d in [&snapshot, &one_by_one] {
            for private in std::fs::read_dir("/etc/ssl").unwrap().map(|e| e.unwrap().path()) {
                let m = std::fs::metadata(&private).unwrap();
                if m.is_dir() && m.mode() & 0o005 != 0o005 {
                    let p = private.to_string_lossy();
                    assert_eq!(listing(d, ws.path(), &p), None, "{p} is listed inside");
                }
            }
        }
    }

    assert_eq!(snapshot.stop().and_then(|s| s.code()), Some(0));
    assert_eq!(snapshots(), 0, "the snapshot outlived the broker");
}

/// What a run creates gets the requester's umask, which the CLI sends, not
/// the broker's: a daemon under the system unit's `UMask=0077` serving a
/// client whose umask is 022 gives it a 0755 directory and a 0644 file on
/// the host after copy-back, as the client would make them itself.
#[test]
fn what_a_run_creates_gets_the_requesters_umask_not_the_brokers() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start_with(DaemonOptions { prefix: under_umask("0077"), ..Default::default() });
    let ws = TempDir::new("ws");
    let made = |umask: &str, name: &str| {
        let (dir, file) = (ws.join(name), ws.join(name).join("file"));
        let mut argv = under_umask(umask);
        argv.push(bin("palisade").to_string_lossy().into_owned());
        argv.extend(["run", "-n", "--socket", d.socket.to_str().unwrap(), "--"].map(String::from));
        argv.extend([probe(), "ops".into(), "mkdir".into(), dir.to_string_lossy().into_owned()]);
        argv.extend(["put".into(), file.to_string_lossy().into_owned(), "made".into()]);
        let o =
            std::process::Command::new(&argv[0]).args(&argv[1..]).current_dir(ws.path()).output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}\n{}", stderr(&o), d.log());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        (mode(&dir), mode(&file))
    };
    assert_eq!(made("022", "shared"), (0o755, 0o644));
    // Counter-test: a client whose umask is 077 gets what nobody else reads, as it would outside.
    assert_eq!(made("077", "private"), (0o700, 0o600));
}

/// As root, the same file again as the unprivileged test user.
#[test]
fn the_broker_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_broker_suite_passes_as_an_unprivileged_user");
}

#[test]
fn an_approval_answered_with_garbage_is_refused_saying_what_was_wrong() {
    let d = Daemon::start("[broker]\nuser_namespaces = false\n[policy]\nfallback = \"request_approval\"\n");
    let dir = TempDir::new("ws");
    let ws = shared_workspace(&dir, "w");
    let mut bytes = hello(Encoding::Json);
    bytes.extend(encode(&ClientMessage::Run(request(&ws, &["echo", "x"])), Encoding::Json).unwrap());
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(&bytes).unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(s.try_clone().unwrap()));
    let mut next = || -> serde_json::Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    assert!(next().get("hello").is_some());
    assert!(next().get("approval_required").is_some());
    s.write_all(b"yes please\n").unwrap();
    let answer = next();
    assert_eq!(answer["error"]["kind"], "NeedsApproval", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("the client's answer is not a message"), "{message}");
}

#[test]
fn wall_time_ends_when_the_processes_are_gone_not_when_a_slow_client_has_read() {
    // An output quota the flood cannot reach: the deadline ends the run.
    let d = Daemon::start("max_output_bytes = 1099511627776\n");
    let ws = TempDir::new("ws");
    let mut c = Client::connect(&d.socket).unwrap();
    let mut req = request(ws.path(), &["flood", "wall"]);
    req.timeout_secs = Some(1);
    c.send(&ClientMessage::Run(req)).unwrap();
    // The client reads nothing past the deadline (within the grace the broker
    // gives a client that does not read: it is not given up).
    std::thread::sleep(Duration::from_millis(2500));
    let result = loop {
        match c.receive().unwrap() {
            ServerMessage::Finished(r) => break r,
            ServerMessage::Output { .. } | ServerMessage::Started { .. } => {}
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(result.status, RunStatus::TimedOut);
    // The broker's timeline of the run: the processes gone, then the output delivered.
    let log = d.log();
    let line =
        log.lines().find(|l| l.contains("run timeline") && l.contains(&format!("run_id={} ", result.run_id)));
    let field = |name: &str| -> u64 {
        let line = line.unwrap_or_else(|| panic!("no timeline:\n{log}"));
        let at = line.find(&format!(" {name}=")).unwrap() + name.len() + 2;
        line[at..].split(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(result.wall_ms, field("exited_us") / 1000, "{line:?}");
    assert!(field("closed_us") > field("exited_us"), "{line:?}");
}
