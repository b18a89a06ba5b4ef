//! A run's stdin streamed while it runs (`RunWithStdin`): `palisade run`
//! passes its own for any size, through a daemon and embedded; a shell
//! reads its lines one at a time, each sent once the answer to the one
//! before has come back; a command that reads nothing ends the run however
//! much is offered; and code on a streamed stdin is inline code to the
//! policy, as code in the request's `stdin` is.

use palisade_broker::cli::client::{Client, ClientError};
use palisade_protocol::wire::{ClientMessage, ErrorKind, RunRequest, RunResult, RunStatus, ServerMessage};
use palisade_tests::*;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The profile whose runs may be a shell reading code on its stdin.
const SHELL: &str = "[profiles.sh]\nallow_interpreters = true\nallow_inline_code = true\n\
                     [profiles.interpreters]\nallow_interpreters = true\n";

/// `palisade PRE -- ARGS` in `cwd`, its stdin what `feed` writes (then
/// closed), under an outer bound of two minutes.
fn palisade_fed(cwd: &Path, pre: &[&str], args: &[&str], feed: impl FnOnce(&mut dyn Write) + Send) -> Output {
    let (_journal, path) = scratch_journal(None);
    let mut cmd = Command::new("timeout");
    cmd.arg("120").arg(bin("palisade")).args(pre).arg("--").args(args).current_dir(cwd);
    cmd.env("PALISADE_STATE", state_beside(&path)).env("PALISADE_JOURNAL", &path);
    fed(cmd, feed)
}

/// `cmd`'s output, its stdin what `feed` writes (then closed).
fn fed(mut cmd: Command, feed: impl FnOnce(&mut dyn Write) + Send) -> Output {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || feed(&mut stdin));
        child.wait_with_output().unwrap()
    })
}

/// A daemon (`SHELL`'s profiles) and an embedded broker (the base policy,
/// written in `ws`): `palisade run`'s arguments for each.
fn both_brokers(ws: &TempDir) -> (Daemon, [Vec<String>; 2]) {
    let d = Daemon::start(SHELL);
    let policy = ws.join("policy.toml");
    std::fs::write(&policy, base_config()).unwrap();
    let run = |flag: &str, at: &Path| vec!["run".to_string(), flag.into(), at.to_string_lossy().into_owned()];
    let pre = [run("--socket", &d.socket), run("--policy", &policy)];
    (d, pre)
}

/// `n` bytes of a pattern, written in pieces (a reader gone ends it).
fn pattern_of(n: usize) -> impl FnOnce(&mut dyn Write) + Send {
    move |w: &mut dyn Write| {
        let piece = pattern(1 << 20, 7);
        let mut left = n;
        while left > 0 {
            let k = left.min(piece.len());
            if w.write_all(&piece[..k]).is_err() {
                return;
            }
            left -= k;
        }
    }
}

/// More than any frame holds (8 MiB): streamed, never read whole first.
#[test]
fn a_stdin_larger_than_any_frame_streams_through_a_daemon_and_embedded() {
    let ws = TempDir::new("stdin-large");
    let (_d, routes) = both_brokers(&ws);
    let size = 24 << 20;
    for pre in routes {
        let pre: Vec<&str> = pre.iter().map(String::as_str).collect();
        let o = palisade_fed(ws.path(), &pre, &["wc", "-c"], pattern_of(size));
        assert_eq!(
            (o.status.code(), text(&o.stdout).trim()),
            (Some(0), size.to_string().as_str()),
            "{pre:?}: {o:?}"
        );
    }
    // Outside a sandbox, the same count.
    let mut wc = Command::new("wc");
    wc.arg("-c");
    assert_eq!(text(&fed(wc, pattern_of(size)).stdout).trim(), size.to_string());
}

/// A command that reads nothing of an endless stdin (`yes`) ends the run
/// when it exits; the broker holds no more of it than its queue.
#[test]
fn an_endless_stdin_the_command_does_not_read_ends_with_the_command() {
    let ws = TempDir::new("stdin-endless");
    let (_d, routes) = both_brokers(&ws);
    let endless = |w: &mut dyn Write| {
        let piece = vec![b'y'; 1 << 16];
        while w.write_all(&piece).is_ok() {}
    };
    for pre in routes {
        let pre: Vec<&str> = pre.iter().map(String::as_str).collect();
        let o = palisade_fed(ws.path(), &pre, &["sleep", "1"], endless);
        assert_eq!(o.status.code(), Some(0), "{pre:?}: {o:?}");
        // Reading some of it, then stopping: the same.
        let o = palisade_fed(ws.path(), &pre, &["head", "-c", "5"], endless);
        assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(0), "yyyyy"), "{pre:?}: {o:?}");
    }
}

/// A pipe whose read end is a run's stdin, written as the run's output
/// asks: the next line of a script once the answer to the one before came.
#[test]
fn a_shell_reads_its_lines_one_at_a_time_each_sent_after_the_last_answer() {
    let ws = TempDir::new("stdin-repl");
    let d = Daemon::start(SHELL);
    let mut client = Client::open(&d.socket).unwrap();
    let request =
        RunRequest { argv: vec!["sh".into()], profile: Some("sh".into()), ..request(ws.path(), &[]) };
    let script = ["echo one\n", "echo $((6 * 7))\n", "exit 5\n"];
    let result = converse(&mut client, request, script, [b"one\n", b"one\n42\n"]);
    let (result, heard) = result.unwrap_or_else(|e| panic!("{e}: {}", d.log()));
    assert_eq!((result.status, text(&heard).as_str()), (RunStatus::Exited { code: 5 }, "one\n42\n"));
}

/// Runs `request` with `client`, its stdin a script sent a line at a time:
/// `script[0]` at once, each next line once the output so far is the
/// answer before it, the stdin closed after the last. Its result and output.
pub(crate) fn converse(
    client: &mut Client,
    request: RunRequest,
    script: [&str; 3],
    answers: [&[u8]; 2],
) -> Result<(RunResult, Vec<u8>), ClientError> {
    let (write, read) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut write = Some(write);
    write.as_mut().unwrap().write_all(script[0].as_bytes()).unwrap();
    client.stream_stdin(Box::new(read));
    let mut heard = Vec::new();
    let result = client.run(request, |m| {
        if let ServerMessage::Output { data, .. } = m {
            heard.extend_from_slice(data);
            let next = answers.iter().position(|a| *a == heard.as_slice()).map(|i| script[i + 1]);
            if let (Some(line), Some(w)) = (next, write.as_mut()) {
                w.write_all(line.as_bytes()).unwrap();
            }
            if next == Some(script[2]) {
                write = None;
            }
        }
    })?;
    Ok((result, heard))
}

/// Code on a streamed stdin is inline code: a shell reading it is refused
/// where inline code is not allowed, through a daemon and embedded, and
/// runs where it is; with an empty stdin (`/dev/null`) the shell has no
/// code to read and runs.
#[test]
fn code_on_a_streamed_stdin_is_inline_code_to_the_policy() {
    let ws = TempDir::new("stdin-code");
    let d = Daemon::start(SHELL);
    let socket = d.socket.to_str().unwrap();
    let code = |w: &mut dyn Write| {
        let _ = w.write_all(b"echo from-stdin\n");
    };
    let refused =
        palisade_fed(ws.path(), &["run", "--socket", socket, "--profile", "interpreters"], &["sh"], code);
    let err = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(125), "{err}");
    assert!(err.contains("PolicyDenied") && err.contains("code on stdin"), "{err}");
    let o = palisade_fed(ws.path(), &["run", "--socket", socket, "--profile", "sh"], &["sh"], code);
    assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(0), "from-stdin\n"), "{o:?}");
    let policy = ws.join("policy.toml");
    std::fs::write(&policy, base_config()).unwrap();
    let embedded = ["run", "--policy", policy.to_str().unwrap(), "--allow-interpreters"];
    let refused = palisade_fed(ws.path(), &embedded, &["sh"], code);
    assert_eq!(refused.status.code(), Some(125), "{refused:?}");
    assert!(text(&refused.stderr).contains("code on stdin"), "{refused:?}");
    let o = palisade_cli(ws.path(), &embedded, &["sh"], None);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
}

/// A run that ends while its client still streams (an endless stdin, a
/// command that reads none of it) leaves nothing of it on the connection:
/// the next run there gets its own stdin alone, and runs to its end.
#[test]
fn nothing_of_a_streamed_stdin_reaches_the_connections_next_run() {
    let ws = TempDir::new("stdin-next");
    let d = Daemon::start("");
    let mut client = Client::connect(&d.socket).unwrap();
    for _ in 0..3 {
        client.stream_stdin(Box::new(std::io::repeat(b'x')));
        let r = client.run(RunRequest { argv: vec!["true".into()], ..request(ws.path(), &[]) }, |_| {});
        assert_eq!(r.unwrap().status, RunStatus::Exited { code: 0 });
        let mut out = Vec::new();
        let next =
            RunRequest { argv: vec!["cat".into()], stdin: b"its own".to_vec(), ..request(ws.path(), &[]) };
        let r = client.run(next, |m| {
            if let ServerMessage::Output { data, .. } = m {
                out.extend_from_slice(data)
            }
        });
        assert_eq!((r.unwrap().status, text(&out).as_str()), (RunStatus::Exited { code: 0 }, "its own"));
    }
}

/// A stdin that fails to be read part way is never passed off as whole:
/// the run is cancelled and its caller told why.
#[test]
fn a_stdin_that_cannot_be_read_cancels_the_run() {
    struct Failing(bool);
    impl std::io::Read for Failing {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if std::mem::replace(&mut self.0, true) {
                return Err(std::io::Error::other("the disk went away"));
            }
            buf[..6].copy_from_slice(b"begin\n");
            Ok(6)
        }
    }
    let ws = TempDir::new("stdin-failing");
    let d = Daemon::start("");
    let mut client = Client::connect(&d.socket).unwrap();
    client.stream_stdin(Box::new(Failing(false)));
    let r = client.run(RunRequest { argv: vec!["cat".into()], ..request(ws.path(), &[]) }, |_| {});
    match r {
        Err(ClientError::Stdin(why)) => assert!(why.contains("the disk went away"), "{why}"),
        other => panic!("{other:?}"),
    }
    // The connection serves the next run.
    let r = client.run(RunRequest { argv: vec!["true".into()], ..request(ws.path(), &[]) }, |_| {});
    assert_eq!(r.unwrap().status, RunStatus::Exited { code: 0 });
}

/// A `run_with_stdin` carries no `stdin` field: one that does is refused,
/// and the connection serves the next request.
#[test]
fn a_run_with_stdin_that_carries_stdin_is_refused() {
    let ws = TempDir::new("stdin-field");
    let d = Daemon::start("");
    let mut client = Client::connect(&d.socket).unwrap();
    let both = RunRequest { stdin: b"x".to_vec(), ..request(ws.path(), &["cat"]) };
    match client.request(&ClientMessage::RunWithStdin(both)) {
        Err(ClientError::Reply(e)) => {
            assert_eq!(e.kind, ErrorKind::InvalidRequest);
            assert!(e.message.contains("stdin messages"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    let r = client.run(RunRequest { argv: vec!["true".into()], ..request(ws.path(), &[]) }, |_| {}).unwrap();
    assert_eq!(r.status, RunStatus::Exited { code: 0 });
}
