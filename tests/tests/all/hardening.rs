//! Findings of the review of a root broker that hold for any broker, root or
//! not: each reproduced through the real binaries, with the counter-test that
//! shows the attempt works where it is allowed. As root the file runs again
//! as the unprivileged test user.

use palisade_protocol::wire::{
    ClientMessage, Decoder, Encoding, ErrorKind, Hello, RunRequest, ServerMessage, encode,
};
use palisade_tests::*;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Tier B, as on a host without user namespaces, with the fallback that runs it.
const TIER_B: &str = "[policy]\nfallback = \"warn_and_execute\"\n[broker]\nuser_namespaces = false\n";

/// A workspace the sandbox's uid can use (a root broker's Tier B runs as another uid).
fn workspace(dir: &TempDir) -> std::path::PathBuf {
    if is_root() { shared_workspace(dir, "ws") } else { dir.path().to_path_buf() }
}

/// Finding 4, without root: a workspace swapped with a symlink to a
/// sensitive directory (what a concurrent run with `disk = "direct"` could
/// do) must never be mounted. The broker opens the workspace with no symlink
/// allowed; a helper that is not root mounts only the very directory the
/// broker opened.
#[test]
fn a_workspace_swapped_for_a_sensitive_directory_is_never_mounted() {
    let d = Daemon::start("");
    let dir = TempDir::new("swap");
    let ssh = dir.join("home/.ssh");
    std::fs::create_dir_all(&ssh).unwrap();
    std::fs::write(ssh.join("id_rsa"), "private-key-4714").unwrap();
    let ws = dir.join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("id_rsa"), "decoy").unwrap();
    let link = dir.join("link");
    std::os::unix::fs::symlink(&ssh, &link).unwrap();
    let target = ws.join("id_rsa");
    race(Swapper::start(&ws, &link), || {
        let o = palisade_cli(
            dir.path(),
            &["run", "--socket", d.socket.to_str().unwrap(), "--workspace", ws.to_str().unwrap()],
            &[&probe(), "read", target.to_str().unwrap()],
            None,
        );
        let out = text(&o.stdout);
        assert!(!out.contains("private-key"), "the sensitive directory was mounted: {out}");
        out.contains("decoy")
    });
    // Counter-test: outside, the path the sandbox asked for does lead there.
    assert!(probe_outside(&["read", ssh.join("id_rsa").to_str().unwrap()]).unwrap().contains("private-key"));
}

/// Finding 5: Tier B with network allowed unix sockets, and Landlock does not
/// cover `connect` to a path: a sandbox asked its own broker for a run with a
/// wider workspace. Tier B's filter now refuses unix sockets.
#[test]
fn tier_b_with_network_cannot_reach_a_unix_socket_such_as_the_brokers() {
    // A socket the sandbox's uid may connect to, as far as its mode goes.
    let d = Daemon::start(&format!("network = \"allow_all\"\n{TIER_B}socket_mode = 0o666\n"));
    let dir = TempDir::new("tier-b-unix");
    let ws = workspace(&dir);
    let sock = d.socket.to_str().unwrap();
    // The path comes on stdin: on the command line the policy refuses it.
    let mut cli = std::process::Command::new(bin("palisade"))
        .args(["run", "--socket", sock, "--", &probe(), "unix", "-"])
        .current_dir(&ws)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    cli.stdin.take().unwrap().write_all(sock.as_bytes()).unwrap();
    let o = cli.wait_with_output().unwrap();
    assert!(text(&o.stdout).starts_with("err EPERM"), "{}\n{}", text(&o.stdout), text(&o.stderr));
    // Counter-tests: the same probe reaches the socket outside, and the
    // sandbox does have IP sockets.
    assert_eq!(probe_outside(&["unix", sock]), Ok(String::new()));
    let (_l, addr) = loopback_listener();
    let o = palisade_cli(&ws, &["run", "--socket", sock], &[&probe(), "connect", &addr], None);
    assert_eq!(text(&o.stdout), "ok \n", "{}", text(&o.stderr));
}

/// Finding 6: with `warn_and_execute` on a kernel without Landlock, Tier B
/// ran with no filesystem boundary. Tier B requires Landlock, whatever the
/// fallback: the broker refuses, and so does the helper.
#[test]
fn tier_b_without_landlock_is_refused() {
    let without = Daemon::start_with(DaemonOptions {
        config: TIER_B.into(),
        prefix: vec![probe(), "no-landlock".into()],
        ..Default::default()
    });
    let dir = TempDir::new("tier-b-landlock");
    let ws = workspace(&dir);
    let o = palisade_cli(
        &ws,
        &["run", "--socket", without.socket.to_str().unwrap()],
        &[&probe(), "echo", "x"],
        None,
    );
    assert_eq!(
        text(&o.stderr),
        "palisade: Unavailable: the policy requires Landlock fs, which this kernel (Landlock ABI 0) cannot enforce: \
         no flag makes the kernel enforce it (a newer kernel does)\n"
    );
    assert!(o.stdout.is_empty());
    // Counter-test: with Landlock, the same broker configuration runs it.
    let with = Daemon::start(TIER_B);
    let o = palisade_cli(
        &ws,
        &["run", "--socket", with.socket.to_str().unwrap()],
        &[&probe(), "echo", "x"],
        None,
    );
    assert_eq!(text(&o.stdout), "ok x\n", "{}", text(&o.stderr));
}

/// `program args` with `file` open on fd 9 and not close-on-exec, as a
/// caller's stray descriptor would be.
fn with_fd_9(program: &Path, file: &Path, args: &[&str]) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let fd = std::os::fd::IntoRawFd::into_raw_fd(std::fs::File::open(file).unwrap());
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).stdin(std::process::Stdio::null());
    // SAFETY: dup2 and fcntl only, which are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself would leave fd 9 close-on-exec (File::open sets it).
            let rc = if fd == 9 { libc::fcntl(9, libc::F_SETFD, 0) } else { libc::dup2(fd, 9) };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// `palisade run --policy P -- args` (an embedded broker, as the review ran
/// it), with `file` on fd 9.
fn cli_with_fd_9(cwd: &Path, file: &Path, args: &[&str]) -> std::process::Command {
    let policy = cwd.join("../p.toml");
    std::fs::write(&policy, base_config()).unwrap();
    let mut all = vec!["run", "--policy", policy.to_str().unwrap(), "--"];
    all.extend_from_slice(args);
    let mut cmd = with_fd_9(&bin("palisade"), file, &all);
    cmd.current_dir(cwd)
        .env("PALISADE_JOURNAL", cwd.join("../journal"))
        .env("PALISADE_STATE", state_beside(cwd.join("../journal")));
    cmd
}

/// Finding 7: pid 1 of a Tier C sandbox was dumpable, had no filter, and held
/// the caller's stray descriptors: the command listed /proc/1/fd and opened
/// /proc/1/mem. Now it is not dumpable, holds only its status channel and its
/// lifeline, and runs under a filter of its own.
#[test]
fn pid_1_of_the_sandbox_holds_nothing_the_command_can_reach() {
    let dir = TempDir::new("pid1");
    let secret = dir.join("secret");
    std::fs::write(&secret, "caller-secret-4715").unwrap();
    let ws = dir.join("ws");
    std::fs::create_dir(&ws).unwrap();
    let inside = |args: &[&str]| {
        let mut all = vec![probe()];
        all.extend(args.iter().map(|a| a.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        text(&cli_with_fd_9(&ws, &secret, &all).output().unwrap().stdout)
    };
    assert!(inside(&["list", "/proc/1/fd"]).starts_with("err EACCES"));
    assert!(inside(&["open-rw", "/proc/1/mem"]).starts_with("err EACCES"));
    let status = inside(&["read", "/proc/1/status"]);
    assert!(status.contains("Seccomp:\t2") && status.contains("NoNewPrivs:\t1"), "{status}");
    // Counter-test: a process the caller starts the same way holds fd 9.
    let outside = with_fd_9(&bin("probe"), &secret, &["read", "/proc/self/fd/9"]).output().unwrap();
    assert!(text(&outside.stdout).contains("caller-secret-4715"), "{}", text(&outside.stdout));
    if is_root() {
        // Seen from the host (root may look): pid 1 holds two descriptors.
        let token = format!("pid1-{}", std::process::id());
        let mut cli = cli_with_fd_9(&ws, &secret, &[&probe(), "sleep", &token]).spawn().unwrap();
        let mut sleeper = None;
        assert!(eventually(Duration::from_secs(20), || {
            sleeper = sleeper_with_token(&token);
            sleeper.is_some()
        }));
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", sleeper.unwrap())).unwrap();
        let pid1: u32 = stat.rsplit(')').next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
        let fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid1}/fd"))
            .unwrap()
            .flatten()
            .map(|e| std::fs::read_link(e.path()).map(|l| l.display().to_string()).unwrap_or_default())
            .collect();
        let _ = cli.kill();
        let _ = cli.wait();
        assert_eq!(fds.len(), 2, "pid 1 holds {fds:?}");
        assert!(fds.iter().all(|f| !f.contains("secret")), "{fds:?}");
    }
}

/// Finding 8: a program swapped for a FIFO blocked the decision's read of its
/// `#!` line, and with it a runtime worker, until the broker stopped
/// answering. Decisions now read regular files only, without blocking, off
/// the runtime's threads.
#[test]
fn a_fifo_named_as_a_program_holds_up_nothing() {
    let d = Daemon::start("");
    let dir = TempDir::new("fifo");
    let ws = workspace(&dir);
    let fifo = ws.join("prog");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o755)).unwrap();
    std::fs::set_permissions(&fifo, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = |args: Vec<String>| {
        let (sock, ws) = (d.socket.clone(), ws.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let _ = tx.send(palisade_cli(&ws, &["run", "--socket", sock.to_str().unwrap()], &args, None));
        });
        rx
    };
    // More than the runtime has worker threads.
    let fifo_runs: Vec<_> = (0..4).map(|_| run(vec!["nice".into(), fifo.to_string_lossy().into()])).collect();
    let other = run(vec![probe(), "echo".into(), "served".into()]);
    let o = other.recv_timeout(Duration::from_secs(60)).expect("the broker stopped answering");
    assert_eq!(text(&o.stdout), "ok served\n", "{}", text(&o.stderr));
    for r in fifo_runs {
        let o = r.recv_timeout(Duration::from_secs(60)).expect("a run naming a FIFO never ended");
        assert_ne!(o.status.code(), Some(0), "{o:?}");
    }
    // Counter-test: a reader of the FIFO does block until a writer comes.
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::read(&reader).map(|b| b.len()));
    });
    assert!(rx.recv_timeout(Duration::from_millis(500)).is_err(), "opening the FIFO did not block");
    std::fs::write(&fifo, b"x").unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap(), 1);
}

/// A new connection that has said hello, and the broker's first answer.
fn hello(socket: &Path) -> (UnixStream, Decoder, Option<ServerMessage>) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&encode(&ClientMessage::Hello(Hello::new(Encoding::Bincode)), Encoding::Bincode).unwrap())
        .unwrap();
    let mut d = Decoder::default();
    let first = next(&mut s, &mut d);
    (s, d, first)
}

/// A connection the broker greeted.
fn greeted(socket: &Path) -> (UnixStream, Decoder) {
    let (s, d, first) = hello(socket);
    assert!(matches!(first, Some(ServerMessage::Hello(_))), "{first:?}");
    (s, d)
}

/// A connection the broker greeted, once it has one to spare: the
/// connection that saw the broker up may be counted for a moment more.
fn greeted_soon(socket: &Path) -> (UnixStream, Decoder) {
    let mut greeted = None;
    let spared = eventually(Duration::from_secs(10), || {
        let (s, d, first) = hello(socket);
        matches!(first, Some(ServerMessage::Hello(_))).then(|| greeted = Some((s, d))).is_some()
    });
    assert!(spared, "no connection was served");
    greeted.unwrap()
}

fn busy(first: Option<ServerMessage>) -> String {
    match first {
        Some(ServerMessage::Error(e)) if e.kind == ErrorKind::Busy => e.message,
        other => panic!("expected Busy, got {other:?}"),
    }
}

/// The next message, or `None` at the end of the connection (or after 20 s).
fn next(s: &mut UnixStream, d: &mut Decoder) -> Option<ServerMessage> {
    let mut buf = [0u8; 4096];
    loop {
        if let Some(m) = d.next_message::<ServerMessage>().unwrap() {
            return Some(m);
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => d.push(&buf[..n]),
        }
    }
}

/// Finding 8, continued: there was no idle timeout after the hello and no
/// limit on connections, so held connections used up the broker's
/// descriptors. Now a silent connection is closed, and connections beyond
/// the limits (per uid, overall) are answered `Busy`.
#[test]
fn silent_connections_are_closed_and_connections_are_limited() {
    let d = Daemon::start("[broker]\nidle_timeout_secs = 1\nmax_connections_per_uid = 2\n");
    let (mut s, mut dec) = greeted(&d.socket);
    match next(&mut s, &mut dec) {
        Some(ServerMessage::Error(e)) => {
            assert_eq!(e.kind, ErrorKind::ProtocolError);
            assert_eq!(e.message, "no request within 1 s (idle_timeout_secs): closing the connection");
        }
        other => panic!("{other:?}"),
    }
    assert!(next(&mut s, &mut dec).is_none(), "the connection stayed open");
    // Two connections of one uid are served; a third is told Busy.
    let d = Daemon::start("[broker]\nmax_connections_per_uid = 2\n");
    let held = [greeted_soon(&d.socket), greeted_soon(&d.socket)];
    let me = nix::unistd::geteuid();
    let want =
        format!("uid {me} has all 2 connections it may open (max_connections_per_uid); try again later");
    assert_eq!(busy(hello(&d.socket).2), want);
    // Counter-test: once one closes, a new one is served.
    drop(held);
    assert!(eventually(Duration::from_secs(10), || matches!(
        hello(&d.socket).2,
        Some(ServerMessage::Hello(_))
    )));
    // The limit of all connections together.
    let d = Daemon::start("[broker]\nmax_connections = 1\n");
    let _held = greeted_soon(&d.socket);
    let want = "all 1 connections the broker takes (max_connections) are open; try again later";
    assert_eq!(busy(hello(&d.socket).2), want);
    // Refusals in a loop are each answered, but not each logged: the first
    // one is, the others are counted (within REFUSAL_LOG_EVERY, 10 s).
    for _ in 0..20 {
        assert_eq!(busy(hello(&d.socket).2), want);
    }
    let refused = d.log().matches("connection refused").count();
    assert_eq!(refused, 1, "{}", d.log());
}

/// A figure of `/proc/PID/status` (`VmRSS`, `VmHWM`), in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).unwrap();
    line.split_whitespace().next().unwrap().parse().unwrap()
}

/// A client that says hello in `encoding`, sends `part` (the start of a
/// frame it never finishes; the broker may refuse it midway), says so on
/// `sent`, and returns the broker's answer, if any, and whether the
/// connection was closed after it.
fn stall(
    socket: &Path,
    encoding: Encoding,
    part: &[u8],
    sent: std::sync::mpsc::Sender<()>,
) -> (Option<ServerMessage>, bool) {
    let mut s = UnixStream::connect(socket).unwrap();
    // Outer bounds: the broker answers within the frame deadline.
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(&encode(&ClientMessage::Hello(Hello::new(encoding)), encoding).unwrap()).unwrap();
    let mut d = Decoder::default();
    let greeting = next(&mut s, &mut d);
    assert!(matches!(greeting, Some(ServerMessage::Hello(_))), "{greeting:?}");
    // Refused midway, the write fails: the answer is read all the same.
    let _ = s.write_all(part);
    sent.send(()).unwrap();
    let answer = next(&mut s, &mut d);
    let closed = next(&mut s, &mut d).is_none();
    (answer, closed)
}

/// The error of an answer, as kind and message.
fn error_of(answer: &Option<ServerMessage>) -> (ErrorKind, String) {
    match answer {
        Some(ServerMessage::Error(e)) => (e.kind, e.message.clone()),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Finding 9: partial frames held memory: 64 connections each holding an
/// unfinished 8 MiB line took the broker from 9 to 498 MiB. Now what a
/// connection buffers beyond 64 KiB is drawn from the request budgets
/// (`request_buffer_bytes`, per uid too): one that would go over is
/// answered `Busy` and closed, the broker's memory stays within the budget,
/// and a frame begun must be whole within `frame_timeout_secs`. Meanwhile
/// other clients are served, and a run with stdin within the limits runs.
#[test]
fn unfinished_large_frames_are_held_within_the_request_budgets() {
    const BUDGET: usize = 16 << 20;
    const CLIENTS: usize = 32;
    // Of each 6 MiB frame, 4 MiB are sent: 128 MiB in all, eight times the budget.
    const SENT: usize = 4 << 20;
    // What the broker may hold besides the budget: 64 KiB and a read buffer
    // per connection, its allocator's slack, the run served meanwhile.
    const MARGIN_KIB: u64 = 16 << 10;
    let d = Daemon::start(&format!(
        "[broker]\nrequest_buffer_bytes = {BUDGET}\nrequest_buffer_bytes_per_uid = {BUDGET}\n\
         frame_timeout_secs = 3\n"
    ));
    let ws = TempDir::new("ws");
    let pid = d.child.id();
    let rss_before = status_kib(pid, "VmRSS");
    // The peak from here on (VmHWM back to the resident set now).
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let run = ClientMessage::Run(RunRequest { stdin: vec![b'x'; 6 << 20], ..request(ws.path(), &["cat"]) });
    let frames = [Encoding::Bincode, Encoding::Json].map(|e| (e, encode(&run, e).unwrap()));
    let (sent, all_sent) = std::sync::mpsc::channel();
    let answers: Vec<_> = std::thread::scope(|t| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let (encoding, frame) = &frames[i % 2];
                let (sent, socket) = (sent.clone(), &d.socket);
                t.spawn(move || stall(socket, *encoding, &frame[..SENT], sent))
            })
            .collect();
        for _ in 0..CLIENTS {
            all_sent.recv().unwrap();
        }
        // Served meanwhile: a request within its connection's 64 KiB draws nothing.
        let o = d.run(ws.path(), &[&probe(), "echo", "served"]);
        assert_eq!(text(&o.stdout), "ok served\n", "{}\n{}", text(&o.stderr), d.log());
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let peak = status_kib(pid, "VmHWM");
    let (mut busy, mut timed_out) = (0, 0);
    for (answer, closed) in &answers {
        let (kind, message) = error_of(answer);
        match kind {
            ErrorKind::Busy => {
                busy += 1;
                assert!(
                    message.contains("(request_buffer_bytes)") && message.contains("closing the connection"),
                    "{message}"
                );
            }
            ErrorKind::ProtocolError => {
                timed_out += 1;
                let want = "a frame was not complete within 3 s of its first byte (frame_timeout_secs): closing the connection";
                assert_eq!(message, want);
            }
            other => panic!("{other:?}: {message}"),
        }
        assert!(closed, "the connection stayed open after {kind:?}");
    }
    // Those that got their 4 MiB in fit in the budget together.
    let drawn = SENT - palisade_broker::serve::budget::UNBUDGETED_BYTES;
    assert!(timed_out <= BUDGET / drawn, "{timed_out} frames held, {busy} refused");
    assert!(busy > 0, "none refused");
    let budget_kib = (BUDGET >> 10) as u64;
    assert!(
        peak <= rss_before + budget_kib + MARGIN_KIB,
        "the broker's resident set went from {rss_before} KiB to {peak} KiB, over a {budget_kib} KiB budget"
    );
    eprintln!(
        "{busy} refused, {timed_out} held until their deadline; resident set {rss_before} KiB, peak {peak} KiB"
    );
    // Counter-test: a run with 6 MiB of stdin, within the limits and the
    // budgets, runs.
    let mut c = palisade_broker::cli::client::Client::connect(&d.socket).unwrap();
    let mut out = 0;
    let r = c
        .run(RunRequest { stdin: vec![b'y'; 6 << 20], ..request(ws.path(), &["cat"]) }, |m| {
            if let ServerMessage::Output { data, .. } = m {
                out += data.len();
            }
        })
        .unwrap();
    assert_eq!(r.status, palisade_protocol::wire::RunStatus::Exited { code: 0 });
    // "ok ", the bytes, a newline.
    assert_eq!((out, r.stdout_bytes), (3 + (6 << 20) + 1, 3 + (6 << 20) + 1));
}

/// A frame that begins and stalls is closed at its deadline, however
/// small; a message other than a run with stdin is refused over 1 MiB,
/// from its first bytes when they show what it is.
#[test]
fn a_stalled_frame_is_closed_and_only_a_run_with_stdin_is_large() {
    let d = Daemon::start("[broker]\nframe_timeout_secs = 1\n");
    let ws = TempDir::new("ws");
    let (sent, _all_sent) = std::sync::mpsc::channel();
    let (answer, closed) = stall(&d.socket, Encoding::Json, br#"{"list_appro"#, sent.clone());
    let (kind, message) = error_of(&answer);
    assert_eq!(kind, ErrorKind::ProtocolError);
    assert!(message.contains("not complete within 1 s of its first byte (frame_timeout_secs)"), "{message}");
    assert!(closed);
    // An explain of 2 MiB: refused by its fifth byte, the rest never sent.
    let explain =
        ClientMessage::Explain(RunRequest { argv: vec!["e".repeat(2 << 20)], ..request(ws.path(), &[]) });
    let frame = encode(&explain, Encoding::Bincode).unwrap();
    let (answer, closed) = stall(&d.socket, Encoding::Bincode, &frame[..5], sent.clone());
    let (kind, message) = error_of(&answer);
    assert_eq!(kind, ErrorKind::ProtocolError);
    assert!(message.ends_with("-byte limit of any message but a run with stdin"), "{message}");
    assert!(message.contains("1048576"), "{message}");
    assert!(closed);
    // A run of 2 MiB without stdin: refused once read, in either encoding.
    let mut env = std::collections::BTreeMap::new();
    env.insert("BIG".to_string(), "b".repeat(2 << 20));
    let bare = RunRequest { env, ..request(ws.path(), &["echo", "x"]) };
    for encoding in [Encoding::Bincode, Encoding::Json] {
        let frame = encode(&ClientMessage::Run(bare.clone()), encoding).unwrap();
        let (answer, closed) = stall(&d.socket, encoding, &frame, sent.clone());
        let (kind, message) = error_of(&answer);
        assert_eq!(kind, ErrorKind::ProtocolError, "{encoding:?}");
        assert!(message.ends_with("limit of any message but a run with stdin"), "{message}");
        assert!(closed);
        // Counter-test: the same run with stdin runs.
        let with_stdin = RunRequest { stdin: b"in".to_vec(), ..bare.clone() };
        let frame = encode(&ClientMessage::Run(with_stdin), encoding).unwrap();
        let (answer, _) = stall(&d.socket, encoding, &frame, sent.clone());
        assert!(matches!(answer, Some(ServerMessage::Started { .. })), "{encoding:?}: {answer:?}");
    }
}

/// The units let palisaded open enough descriptors for its limits.
#[test]
fn the_units_raise_the_open_file_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for unit in ["systemd/palisade.service", "systemd/user/palisade.service"] {
        let text = std::fs::read_to_string(root.join(unit)).unwrap();
        let limit =
            text.lines().find_map(|l| l.strip_prefix("LimitNOFILE=")).unwrap_or_else(|| panic!("{unit}"));
        assert!(limit.parse::<u64>().unwrap() >= 16384, "{unit}: LimitNOFILE={limit}");
    }
}

/// Removes a System V IPC object of the host when dropped.
struct Ipc(&'static str, i32);

impl Drop for Ipc {
    fn drop(&mut self) {
        // SAFETY: IPC_RMID on an id this test made; no memory is passed.
        unsafe {
            match self.0 {
                "shm" => libc::shmctl(self.1, libc::IPC_RMID, std::ptr::null_mut()),
                "msg" => libc::msgctl(self.1, libc::IPC_RMID, std::ptr::null_mut()),
                _ => libc::semctl(self.1, 0, libc::IPC_RMID),
            };
        }
    }
}

/// Finding 10: Tier B shares the host's IPC namespace; a segment and a
/// message queue of the host were read from inside. Its filter now refuses
/// System V IPC (and POSIX message queues).
#[test]
fn tier_b_cannot_reach_the_hosts_system_v_ipc() {
    let key = 0x5a11_0000 + (std::process::id() as i32 & 0xffff);
    // SAFETY: plain system calls with integer arguments.
    let made = unsafe {
        [
            Ipc("shm", libc::shmget(key, 4096, libc::IPC_CREAT | 0o666)),
            Ipc("msg", libc::msgget(key, libc::IPC_CREAT | 0o666)),
            Ipc("sem", libc::semget(key, 1, libc::IPC_CREAT | 0o666)),
        ]
    };
    assert!(made.iter().all(|i| i.1 >= 0), "cannot make the host's IPC objects");
    let d = Daemon::start(TIER_B);
    let dir = TempDir::new("tier-b-ipc");
    let ws = workspace(&dir);
    for kind in ["shm", "msg", "sem"] {
        let key = key.to_string();
        let o = palisade_cli(
            &ws,
            &["run", "--socket", d.socket.to_str().unwrap()],
            &[&probe(), "sysv", kind, &key],
            None,
        );
        assert!(text(&o.stdout).starts_with("err EPERM"), "{kind}: {}{}", text(&o.stdout), text(&o.stderr));
        // Counter-test: outside, the same probe opens it.
        assert!(probe_outside(&["sysv", kind, &key]).is_ok(), "{kind}");
    }
}

/// Finding 14: without a cgroup, /tmp, /dev/shm and the overlay's upper
/// layer were each a tmpfs of its own size: a 512 MiB run held 1.25 GB of
/// shared memory. Now the tmpfs mounts' sizes together stay within the
/// memory limit (the overlay's writes are on disk, bounded apart), and the
/// attestation says so.
#[test]
fn without_a_cgroup_the_tmpfs_mounts_fit_in_the_memory_limit_together() {
    let d = Daemon::start("max_memory_mb = 64\n");
    let ws = TempDir::new("tmpfs");
    // The workspace's writes are on disk, bounded apart (disk.rs): the tmpfs mounts hold memory.
    let sock = d.socket.to_str().unwrap();
    let o = palisade_cli(
        ws.path(),
        &["run", "--json", "--socket", sock],
        &[&probe(), "fill", "/tmp", "/dev/shm"],
        None,
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{o:?}"));
    let out = v["stdout"].as_str().unwrap();
    let total: u64 = out.trim().strip_prefix("ok total ").unwrap_or_else(|| panic!("{out}")).parse().unwrap();
    assert!(total > 32 << 20 && total <= 64 << 20, "{total} bytes of tmpfs in a 64 MiB run");
    let e = &v["result"]["attestation"]["enforcement"];
    assert_eq!(e["limits_by"], "rlimits", "{e}");
    let memory = e["memory"].as_str().unwrap();
    let want = "RLIMIT_DATA 64 MiB and RLIMIT_AS 256 MiB per process; /tmp and /dev/shm";
    assert!(memory.starts_with(want) && memory.contains("together"), "{memory}");
}

/// Finding 9: with `allow_domains = ["github.com"]`, preflight let `curl
/// --resolve github.com:PORT:127.0.0.1` (and `--connect-to`) reach a
/// loopback-only service: preflight gives the host's network and checks only
/// the names the command line names. Options of known tools that connect
/// elsewhere are refused, and the attestation says what preflight is.
#[test]
fn preflight_refuses_options_that_connect_elsewhere_and_says_what_it_checks() {
    let d = Daemon::start("network = { allow_domains = [\"github.com\"] }\negress = \"preflight\"\n");
    let dir = TempDir::new("preflight");
    let ws = workspace(&dir);
    let (listener, addr) = loopback_listener();
    let port = addr.rsplit(':').next().unwrap();
    let url = format!("http://github.com:{port}/");
    let resolve = format!("github.com:{port}:127.0.0.1");
    let connect_to = format!("github.com:{port}:127.0.0.1:{port}");
    let attempts: [&[&str]; 2] = [&["--resolve", &resolve], &["--connect-to", &connect_to]];
    for option in attempts {
        let mut args = vec!["curl", "-sS", "--max-time", "2"];
        args.extend_from_slice(option);
        args.push(&url);
        let o = palisade_cli(&ws, &["run", "--socket", d.socket.to_str().unwrap()], &args, None);
        let want = format!(
            "palisade: CapabilityDenied: curl {} would connect somewhere the command line does not name",
            option[0]
        );
        assert!(text(&o.stderr).starts_with(&want), "{}", text(&o.stderr));
        // Counter-test: outside, the same command reaches the loopback service.
        let outside = std::process::Command::new("curl").args(&args[1..]).output().unwrap();
        listener.set_nonblocking(true).unwrap();
        assert!(listener.accept().is_ok(), "curl outside did not connect: {outside:?}");
    }
    let o = palisade_cli(
        &ws,
        &["run", "--json", "--socket", d.socket.to_str().unwrap()],
        &[&probe(), "echo"],
        None,
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{o:?}"));
    let network = v["result"]["attestation"]["enforcement"]["network"].as_str().unwrap().to_string();
    assert!(
        network.contains("nothing stops a connection to any other address, host loopback included"),
        "{network}"
    );
}

/// As root, the same file again as the unprivileged test user.
#[test]
fn the_hardening_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_hardening_suite_passes_as_an_unprivileged_user");
}
