//! A run in a terminal (`RunInTerminal`, `palisade run -t`): the command's
//! stdin, stdout and stderr are one pseudo-terminal of the sandbox's own
//! devpts; its window is the client's, and a `Resize` reaches it as
//! SIGWINCH; Ctrl-C and Ctrl-Z typed into it signal its foreground process
//! group; its output counts against the quota; TIOCSTI stays refused.

use palisade_broker::cli::client::{Client, ClientError};
use palisade_protocol::wire::{ClientMessage, ErrorKind, RunRequest, RunStatus, ServerMessage, WindowSize};
use palisade_tests::*;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

/// The profile whose runs may be a shell script.
const SHELL: &str = "[profiles.sh]\nallow_interpreters = true\nallow_inline_code = true\n";

const WINDOW: WindowSize = WindowSize { rows: 24, cols: 80 };

/// `sh -c script` in a terminal of `WINDOW`, under `SHELL`'s profile.
fn in_terminal(ws: &TempDir, script: &str) -> RunRequest {
    RunRequest {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        profile: Some("sh".into()),
        terminal: Some(WINDOW),
        ..request(ws.path(), &[])
    }
}

/// Runs `request` through `client`, its keyboard a pipe; `on_output` sees
/// all the output so far after each piece, and says what to type (and
/// whether to resize the window) next. Returns the status and the output.
pub(crate) fn drive(
    client: &mut Client,
    request: RunRequest,
    mut on_output: impl FnMut(&str) -> Option<(&'static [u8], Option<WindowSize>)>,
) -> (RunStatus, String) {
    let (keys, keyboard) = nix::unistd::pipe().unwrap();
    let mut keyboard = std::fs::File::from(keyboard);
    client.stream_stdin(Box::new(std::fs::File::from(keys)));
    let control = client.canceller().unwrap();
    let mut heard = Vec::new();
    let result = client.run(request, |m| {
        if let ServerMessage::Output { data, .. } = m {
            heard.extend_from_slice(data);
            if let Some((typed, window)) = on_output(&text(&heard)) {
                if let Some(size) = window {
                    assert!(control.resize(size), "the run is over");
                }
                keyboard.write_all(typed).unwrap();
            }
        }
    });
    (result.unwrap().status, text(&heard))
}

/// A program that reads its window (`stty size`) gets the client's, and a
/// resize reaches it as SIGWINCH with the new size; its stdio is one
/// terminal of the sandbox's devpts.
#[test]
fn a_terminal_program_reads_its_window_and_gets_a_resize() {
    let ws = TempDir::new("tty-window");
    let d = Daemon::start(SHELL);
    let mut client = Client::connect(&d.socket).unwrap();
    let script = "trap 'stty size; exit 7' WINCH; stty size; tty; [ -t 0 ] && [ -t 1 ] && [ -t 2 ] && \
                  echo all-three; echo ready; while :; do sleep 0.05; done";
    let mut resized = false;
    let (status, out) = drive(&mut client, in_terminal(&ws, script), |heard| {
        let ready = heard.contains("ready") && !std::mem::replace(&mut resized, true);
        ready.then_some((&b""[..], Some(WindowSize { rows: 40, cols: 132 })))
    });
    assert_eq!(status, RunStatus::Exited { code: 7 }, "{out}\n{}", d.log());
    // The terminal's own line discipline: "\r\n" at each line's end.
    let lines: Vec<&str> = out.split("\r\n").collect();
    assert_eq!(lines[0], "24 80", "{out:?}");
    assert_eq!(lines[1], "/dev/pts/0", "the sandbox's own devpts: {out:?}");
    assert_eq!(lines[2..4], ["all-three", "ready"], "{out:?}");
    assert!(lines.contains(&"40 132"), "{out:?}");
    // Without a terminal, the same script has none.
    let piped = RunRequest { terminal: None, ..in_terminal(&ws, "tty; stty size") };
    let mut out = Vec::new();
    let r = client.run(piped, |m| {
        if let ServerMessage::Output { data, .. } = m {
            out.extend_from_slice(data)
        }
    });
    assert_ne!(r.unwrap().status, RunStatus::Exited { code: 0 });
    assert!(text(&out).contains("not a tty"), "{}", text(&out));
}

/// Ctrl-C typed into the terminal interrupts the foreground process group
/// (SIGINT, by the terminal's line discipline), Ctrl-Z stops it (SIGTSTP);
/// the same bytes on a pipe are only bytes.
#[test]
fn ctrl_c_and_ctrl_z_through_the_terminal_signal_the_command() {
    let ws = TempDir::new("tty-signals");
    let d = Daemon::start(SHELL);
    let mut client = Client::connect(&d.socket).unwrap();
    for (key, signal, code) in [(b"\x03", "INT", 9), (b"\x1a", "TSTP", 4)] {
        let script = format!(
            "trap 'echo got-{signal}; exit {code}' {signal}; echo ready; while :; do sleep 0.05; done"
        );
        let mut typed = false;
        let (status, out) = drive(&mut client, in_terminal(&ws, &script), |heard| {
            let ready = heard.contains("ready") && !std::mem::replace(&mut typed, true);
            ready.then_some((&key[..], None))
        });
        assert_eq!(status, RunStatus::Exited { code }, "{out:?}\n{}", d.log());
        assert!(out.contains(&format!("got-{signal}")), "{out:?}");
    }
    // On a pipe, Ctrl-C is a byte the command reads.
    let piped = RunRequest { terminal: None, ..in_terminal(&ws, "head -c 1 | od -An -c") };
    client.stream_stdin(Box::new(&b"\x03"[..]));
    let mut out = Vec::new();
    let r = client.run(piped, |m| {
        if let ServerMessage::Output { data, .. } = m {
            out.extend_from_slice(data)
        }
    });
    assert_eq!(r.unwrap().status, RunStatus::Exited { code: 0 });
    assert_eq!(text(&out).trim(), "003", "{}", text(&out));
}

/// What a command writes to its terminal counts against the output quota,
/// as stdout would.
#[test]
fn output_through_a_terminal_counts_against_the_quota() {
    let ws = TempDir::new("tty-quota");
    let d = Daemon::start(SHELL);
    let mut client = Client::connect(&d.socket).unwrap();
    let flood = RunRequest { max_output_bytes: Some(4096), ..in_terminal(&ws, "timeout 60 yes") };
    let (status, out) = drive(&mut client, flood, |_| None);
    assert_eq!(status, RunStatus::QuotaExceeded, "{}", d.log());
    assert_eq!(out.len(), 4096);
}

/// TIOCSTI on the run's own terminal is refused inside (seccomp), where
/// the same probe on a terminal outside injects input.
#[test]
fn tiocsti_on_the_runs_terminal_fails() {
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    let mut outside = Command::new(bin("probe"));
    outside.arg("tiocsti").stdin(slave).stdout(Stdio::piped());
    in_own_session(&mut outside, Some(0));
    let out = outside.output().unwrap();
    assert!(text(&out.stdout).starts_with("ok"), "outside: {out:?}");
    let mut injected = [0u8; 1];
    std::fs::File::from(pty.master).read_exact(&mut injected).unwrap();
    assert_eq!(&injected, b"#");

    let ws = TempDir::new("tty-tiocsti");
    let d = Daemon::start("");
    let mut client = Client::connect(&d.socket).unwrap();
    let probe = RunRequest { terminal: Some(WINDOW), ..request(ws.path(), &["tiocsti"]) };
    let (status, out) = drive(&mut client, probe, |_| None);
    // The probe says what failed, and exits 1.
    assert_eq!(status, RunStatus::Exited { code: 1 }, "{out:?}");
    assert!(out.starts_with("err EPERM"), "TIOCSTI inside: {out:?}");
}

/// A window no terminal has is refused, naming the bounds, and the
/// connection serves the next request; so is a terminal run that carries
/// its stdin in the request.
#[test]
fn a_terminal_of_no_size_or_with_a_stdin_field_is_refused() {
    let ws = TempDir::new("tty-refused");
    let d = Daemon::start("");
    let mut client = Client::connect(&d.socket).unwrap();
    let run = request(ws.path(), &["env"]);
    for (size, stdin, why) in [
        (WindowSize { rows: 0, cols: 80 }, vec![], "rows and cols are 1 to 4096"),
        (WindowSize { rows: 24, cols: 5000 }, vec![], "rows and cols are 1 to 4096"),
        (WINDOW, b"x".to_vec(), "stdin messages"),
    ] {
        let run = RunRequest { stdin, ..run.clone() };
        match client.request(&ClientMessage::RunInTerminal { run, size }) {
            Err(ClientError::Reply(e)) => {
                assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e:?}");
                assert!(e.message.contains(why), "{}", e.message);
            }
            other => panic!("{other:?}"),
        }
    }
    let r = client.run(RunRequest { argv: vec!["true".into()], ..run }, |_| {}).unwrap();
    assert_eq!(r.status, RunStatus::Exited { code: 0 });
}

/// `palisade run -t`, through a daemon and embedded: the command's stdio is
/// a terminal (24x80 when palisade's own is none), and `-T` leaves pipes.
#[test]
fn palisade_run_t_gives_the_command_a_terminal() {
    let ws = TempDir::new("tty-cli");
    let d = Daemon::start(SHELL);
    let policy = ws.join("policy.toml");
    std::fs::write(&policy, format!("{}\n{SHELL}", base_config())).unwrap();
    let script = "stty size; tty";
    for route in [["--socket", d.socket.to_str().unwrap()], ["--policy", policy.to_str().unwrap()]] {
        let pre = ["run", route[0], route[1], "--profile", "sh", "-t"];
        let o = palisade_cli(ws.path(), &pre, &["sh", "-c", script], None);
        assert_eq!((o.status.code(), text(&o.stdout)), (Some(0), "24 80\r\n/dev/pts/0\r\n".into()), "{o:?}");
        let pre = ["run", route[0], route[1], "--profile", "sh", "-T"];
        let o = palisade_cli(ws.path(), &pre, &["sh", "-c", "tty"], None);
        assert_eq!((o.status.code(), text(&o.stdout)), (Some(1), "not a tty\n".into()), "{o:?}");
    }
}

/// As root, the suite again as the unprivileged test user.
#[test]
fn the_terminal_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_terminal_suite_passes_as_an_unprivileged_user");
}

/// `palisade run` at a terminal (its stdin, stdout and stderr one, its
/// controlling terminal) gives the command a terminal by itself, this
/// terminal's size; a resize of this terminal reaches the command; keys
/// go through raw (Ctrl-C is the command's, not palisade's); and this
/// terminal is back in its own mode when palisade ends. Through a daemon
/// and embedded.
#[test]
fn palisade_run_at_a_terminal_gives_the_command_one_and_passes_its_resizes() {
    let ws = TempDir::new("tty-auto");
    let d = Daemon::start(SHELL);
    let policy = ws.join("policy.toml");
    std::fs::write(&policy, format!("{}\n{SHELL}", base_config())).unwrap();
    let script = "trap 'stty size; exit 7' WINCH; trap 'echo got-INT' INT; stty size; echo ready; \
                  while :; do sleep 0.05; done";
    for route in [["--socket", d.socket.to_str().unwrap()], ["--policy", policy.to_str().unwrap()]] {
        let mut cmd = Command::new("timeout");
        cmd.arg("120").arg(bin("palisade")).args(["run", route[0], route[1], "--profile", "sh", "--"]);
        cmd.args(["sh", "-c", script]).current_dir(ws.path());
        let (mut child, master, slave, _journal) = at_a_terminal(cmd, 30, 100);
        let before = nix::sys::termios::tcgetattr(&slave).unwrap();
        let mut reader = master.try_clone().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = reader.read(&mut buf) {
                let _ = tx.send(buf[..n].to_vec());
            }
        });
        let mut heard = Vec::new();
        let wait_for = |what: &str, heard: &mut Vec<u8>| {
            while !text(heard).contains(what) {
                match rx.recv_timeout(std::time::Duration::from_secs(60)) {
                    Ok(piece) => heard.extend(piece),
                    Err(e) => panic!("{route:?}: {e} waiting for {what:?} in {:?}", text(heard)),
                }
            }
        };
        wait_for("ready", &mut heard);
        // Ctrl-C typed here is the command's: it says so and goes on.
        (&master).write_all(b"\x03").unwrap();
        wait_for("got-INT", &mut heard);
        let resized = nix::pty::Winsize { ws_row: 40, ws_col: 132, ws_xpixel: 0, ws_ypixel: 0 };
        // SAFETY: TIOCSWINSZ reads one winsize through the pointer, a local that outlives the call.
        assert_eq!(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &resized) }, 0);
        wait_for("40 132", &mut heard);
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(7), "{route:?}: {:?}", text(&heard));
        assert!(text(&heard).contains("30 100\r\n"), "{route:?}: {:?}", text(&heard));
        let after = nix::sys::termios::tcgetattr(&slave).unwrap();
        assert_eq!(
            (after.local_flags, after.input_flags),
            (before.local_flags, before.input_flags),
            "{route:?}"
        );
    }
}

/// `cmd` started at a terminal of its own of `rows` by `cols` (its stdin,
/// stdout and stderr, and its controlling terminal, in a new session), its
/// journal and state a scratch one, never the host's: the child, the
/// terminal's master and its other end, and the scratch directory.
fn at_a_terminal(
    mut cmd: Command,
    rows: u16,
    cols: u16,
) -> (std::process::Child, std::fs::File, std::fs::File, TempDir) {
    let (journal_dir, journal) = scratch_journal(None);
    cmd.env("PALISADE_STATE", state_beside(&journal)).env("PALISADE_JOURNAL", &journal);
    let window = nix::pty::Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    let pty = nix::pty::openpty(Some(&window), None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    cmd.stdin(slave.try_clone().unwrap()).stdout(slave.try_clone().unwrap());
    cmd.stderr(slave.try_clone().unwrap());
    in_own_session(&mut cmd, Some(0));
    let child = cmd.spawn().unwrap();
    (child, std::fs::File::from(pty.master), slave, journal_dir)
}

/// Where the sandbox has no /dev of its own (Tier B: here a broker told
/// not to use user namespaces), `-t` is refused with the reason and the
/// way out, and the terminal `palisade run` would choose by itself is left
/// out: the command runs with pipes. Through a daemon and embedded.
#[test]
fn without_a_dev_of_its_own_a_terminal_is_refused_when_asked_and_left_out_when_chosen() {
    let dir = TempDir::new("tty-tier-b");
    // Tier B runs a root broker's command as its sandbox ids, on the host: a workspace they reach.
    let ws = shared_workspace(&dir, "ws");
    let tier_b =
        format!("[broker]\nuser_namespaces = false\n[policy]\nfallback = \"warn_and_execute\"\n{SHELL}");
    let d = Daemon::start(&tier_b);
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, tier_b.replacen("[policy]", &format!("{}\n[policy]", base_config()), 1)).unwrap();
    for route in [["--socket", d.socket.to_str().unwrap()], ["--policy", policy.to_str().unwrap()]] {
        let o = palisade_cli(&ws, &["run", route[0], route[1], "--profile", "sh", "-t"], &["true"], None);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{route:?}: {o:?}");
        assert!(err.contains("Unavailable") && err.contains("palisade run -T"), "{route:?}: {err}");
        let mut cmd = Command::new("timeout");
        cmd.arg("120").arg(bin("palisade")).args(["run", route[0], route[1], "--profile", "sh", "--"]);
        cmd.args(["sh", "-c", "tty; echo done"]).current_dir(&ws);
        let (mut child, master, slave, _journal) = at_a_terminal(cmd, 24, 80);
        let status = child.wait().unwrap();
        // Its end of the terminal closed, the master reads what is left, then EIO.
        drop(slave);
        let mut out = Vec::new();
        let _ = (&master).read_to_end(&mut out);
        let out = text(&out);
        assert_eq!(status.code(), Some(0), "{route:?}: {out:?}");
        assert!(out.contains("not a tty") && out.contains("done"), "{route:?}: {out:?}");
    }
}

/// A broker older than terminals (version 14, here a fake one on a socket
/// of the test's own) is not asked for one: `palisade run` at a terminal
/// sends it a `run`, with no stdin (a terminal's is not streamed without
/// one), as before terminals.
#[test]
fn a_broker_older_than_terminals_is_not_asked_for_one() {
    use palisade_protocol::wire::{Decoder, Encoding, ErrorReply, ServerHello, encode};
    let dir = TempDir::new("tty-old-broker");
    let socket = dir.join("old.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut d = Decoder::new(Some(Encoding::Bincode));
        let mut next = |conn: &mut std::os::unix::net::UnixStream| loop {
            if let Some(m) = d.next_message::<ClientMessage>().unwrap() {
                return m;
            }
            assert!(d.read_from(conn, 4096).unwrap() > 0, "the client left");
        };
        assert!(matches!(next(&mut conn), ClientMessage::Hello(_)));
        let hello =
            ServerHello { version: 14, broker: "palisaded 0.0.14".into(), encoding: Encoding::Bincode };
        conn.write_all(&encode(&ServerMessage::Hello(hello), Encoding::Bincode).unwrap()).unwrap();
        let asked = next(&mut conn).name();
        let refusal = ErrorReply::new(ErrorKind::Unavailable, "a fake broker runs nothing");
        conn.write_all(&encode(&ServerMessage::Error(refusal), Encoding::Bincode).unwrap()).unwrap();
        asked
    });
    let mut cmd = Command::new("timeout");
    cmd.arg("60").arg(bin("palisade")).args(["run", "--socket", socket.to_str().unwrap(), "--", "true"]);
    cmd.current_dir(dir.path());
    let (mut child, _master, _slave, _journal) = at_a_terminal(cmd, 24, 80);
    assert_eq!(child.wait().unwrap().code(), Some(125));
    assert_eq!(server.join().unwrap(), "run");
}

/// A `resize` sent during a run with no terminal changes nothing: the run
/// goes on to its end (any other message would end it).
#[test]
fn a_resize_in_a_run_with_no_terminal_is_passed_over() {
    let ws = TempDir::new("tty-resize-piped");
    let d = Daemon::start(SHELL);
    let mut client = Client::connect(&d.socket).unwrap();
    let control = client.canceller().unwrap();
    let piped = RunRequest { terminal: None, ..in_terminal(&ws, "echo ready; sleep 0.5; echo done") };
    let mut out = Vec::new();
    let r = client.run(piped, |m| {
        if let ServerMessage::Output { data, .. } = m {
            out.extend_from_slice(data);
            if text(&out).contains("ready") {
                control.resize(WindowSize { rows: 40, cols: 132 });
            }
        }
    });
    assert_eq!((r.unwrap().status, text(&out)), (RunStatus::Exited { code: 0 }, "ready\ndone\n".into()));
}
