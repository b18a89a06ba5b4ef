//! The commands the CLI serves itself, through a running broker: a run,
//! an explanation. Without one, `palisaded cli` takes over the process
//! (`crate::hand_over`) and runs an embedded broker.

use crate::args::{ExplainArgs, RunArgs, explain_run, request};
use crate::client::{Client, ClientError, Event};
use crate::discovery::{self, Found, Route, Which};
use crate::render::Render;
use crate::{json_fail, json_reply};
use palisade_protocol::wire::{ErrorKind, ErrorReply, RunRequest, Stream};
use std::ffi::OsString;
use std::io::Write;

/// `palisade run`: through the broker discovery finds; with none, or with
/// `--policy`, the embedded broker of `palisaded cli` runs it (`argv`, this
/// process's own arguments, are handed over untouched, stdin unread).
pub fn run(args: RunArgs, argv: &[OsString]) -> i32 {
    // Failures before any run are reported like the broker's: one line, or the JSON object.
    let refuse =
        |kind: ErrorKind, message: String| Render::new(args.json).finish(Err(ErrorReply::new(kind, message)));
    if args.policy.is_some() {
        return crate::hand_over(argv);
    }
    let found = match discovery::find(args.socket.as_deref(), true) {
        Ok(Route::Broker(found)) => found,
        Ok(Route::Embedded { .. }) => return crate::hand_over(argv),
        Err(e) => return refuse(e.kind(), e.to_string()),
    };
    let request = match request(&args) {
        Ok(r) => r,
        Err(e) => return refuse(ErrorKind::InvalidRequest, e),
    };
    let (name, which, client) = (found.name(), found.which, found.client);
    // Said once, and only of a broker that is not the user's own
    // (with --json, the object's `broker` says it).
    if which == Which::System && !args.json {
        eprintln!("palisade: run by {name}");
    }
    let mut render = Render::new(args.json);
    render.by(name);
    via_socket(client, request, render, &args)
}

/// `palisade explain`: the running broker's policy decides; with none, or
/// with `--policy`, `palisaded cli` decides with the policy here.
pub fn explain(args: ExplainArgs, argv: &[OsString]) -> i32 {
    if args.policy.is_some() {
        return crate::hand_over(argv);
    }
    match discovery::find(args.socket.as_deref(), true) {
        Ok(Route::Broker(found)) => explain_by(*found, args),
        Ok(Route::Embedded { .. }) => crate::hand_over(argv),
        Err(e) => json_fail(args.json, e.kind(), e),
    }
}

/// `palisade explain` through the broker `found`: its policy decides.
pub fn explain_by(found: Found, args: ExplainArgs) -> i32 {
    let name = found.name();
    let (mut client, socket, json) = (found.client, found.socket, args.json);
    let run_args = explain_run(args);
    let request = match request(&run_args) {
        Ok(r) => r,
        Err(e) => return json_fail(json, ErrorKind::InvalidRequest, e),
    };
    match client.request(&palisade_protocol::wire::ClientMessage::Explain(request)) {
        Ok(palisade_protocol::wire::ServerMessage::Explained(e)) => show_explanation(&e, &name, json),
        Ok(other) => json_fail(json, ErrorKind::RuntimeFailure, format!("the broker answered {other:?}")),
        Err(ClientError::Reply(e)) => json_reply(json, e),
        Err(e) => json_fail(json, ErrorKind::RuntimeFailure, format!("{}: {e}", socket.display())),
    }
}

/// The decision, then which policy made it (`by`: which broker); 0 when
/// the run is allowed. `json`: as one object, the explanation's fields and `by`.
pub fn show_explanation(e: &palisade_protocol::wire::Explanation, by: &str, json: bool) -> i32 {
    if json {
        let mut value = serde_json::to_value(e).unwrap_or_default();
        if let Some(object) = value.as_object_mut() {
            object.insert("by".into(), by.into());
        }
        crate::outln!("{value}");
    } else {
        crate::out!("{}", e.text);
        crate::outln!("policy:   {} ({by})", e.policy);
    }
    if e.decision == "allow" { 0 } else { 1 }
}

/// The answer of the person at this process's terminal; `None` when there
/// is no terminal to ask (nobody answered).
pub fn terminal_answer(question: &str) -> Option<bool> {
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty") {
        Ok(tty) => Some(prompt(tty, question)),
        Err(_) => {
            eprintln!("palisade: the run needs approval and there is no terminal to ask: {question}");
            None
        }
    }
}

/// Puts `question` at the terminal `tty`; "y" or "yes" approves.
fn prompt(mut tty: std::fs::File, question: &str) -> bool {
    if write!(tty, "palisade: {question} [y/N] ").and_then(|()| tty.flush()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let mut reader = std::io::BufReader::new(tty);
    std::io::BufRead::read_line(&mut reader, &mut answer).is_ok()
        && matches!(answer.trim(), "y" | "Y" | "yes" | "Yes" | "YES")
}

/// A run held for approval, put to the requester: at its terminal when it
/// may answer, while an approver elsewhere may answer first (no terminal:
/// refused, as nobody here can answer); otherwise it says who can, and waits.
pub(crate) fn ask_requester(ask: crate::client::Ask<'_>) -> Option<bool> {
    let details = crate::approve::describe(ask.approval);
    let id = ask.approval.id;
    if !ask.may_answer {
        eprintln!(
            "palisade: {}\n{details}palisade: waiting for an approver: palisade approve {id} (or palisade deny {id})",
            ask.reason
        );
        return None;
    }
    let Ok(tty) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty") else {
        eprintln!("palisade: the run needs approval and there is no terminal to ask: {}", ask.reason);
        return Some(false);
    };
    let question = format!("{}\n{details}Run it? (or elsewhere: palisade approve {id})", ask.reason);
    let answerer = ask.answerer;
    // The prompt waits on its own thread: an answer from elsewhere ends the
    // wait, and the process, without it.
    std::thread::spawn(move || {
        let approved = prompt(tty, &question);
        let _ = answerer.send(approved);
    });
    None
}

/// A run through a broker's socket, shown by `render`. Its stdin is this
/// process's, streamed while it runs (`request.stdin_streamed`; nothing
/// with `--no-stdin`). A terminal the CLI chose by itself (no `-t`) that
/// the broker cannot give (Tier B, or a broker older than terminals) is
/// done without: the run is asked again, with pipes.
pub fn via_socket(mut client: Client, mut request: RunRequest, mut render: Render, args: &RunArgs) -> i32 {
    if !render.json() {
        // Large output into a pipe (`palisade run ... | next`) is spliced:
        // the CLI does not copy it through its own memory.
        for (stream, fd) in [(Stream::Stdout, libc::STDOUT_FILENO), (Stream::Stderr, libc::STDERR_FILENO)] {
            // SAFETY: the standard streams stay open for the process's whole life.
            client.splice_output_to(stream, unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) });
        }
    }
    // A terminal chosen by itself is left out where the broker is older than terminals.
    if request.terminal.is_some() && !args.tty && client.greet().is_ok() && !client.speaks_terminal() {
        request.terminal = None;
        request.stdin_streamed = crate::args::streams_stdin(args);
    }
    let outcome = loop {
        match once(&mut client, request.clone(), &mut render, args.no_stdin) {
            Err(ClientError::Reply(e))
                if request.terminal.is_some()
                    && !args.tty
                    && e.rule.as_deref() == Some(crate::tty::UNAVAILABLE_RULE) =>
            {
                request.terminal = None;
                request.stdin_streamed = crate::args::streams_stdin(args);
            }
            outcome => break outcome,
        }
    };
    match outcome {
        Ok(r) => render.finish(Ok(r)),
        Err(ClientError::Reply(e)) => render.finish(Err(e)),
        // The broker went away mid-run (killed, crashed): what the run wrote is not lost.
        Err(e @ ClientError::Protocol(_)) => render.finish(Err(ErrorReply::new(
            ErrorKind::RuntimeFailure,
            format!(
                "{e}: if the run had started, its writes are held when the broker starts again \
                 (`palisade changes list` shows them), never applied by themselves"
            ),
        ))),
        Err(e) => render.finish(Err(ErrorReply::new(ErrorKind::RuntimeFailure, e.to_string()))),
    }
}

/// One run of [`via_socket`] (or of `palisade session exec`). In a
/// terminal, this one is in raw mode from the run's start to its end (an
/// approval is asked before, in cooked mode), and its resizes are the run's.
pub fn once(
    client: &mut Client,
    request: RunRequest,
    render: &mut Render,
    no_stdin: bool,
) -> Result<palisade_protocol::wire::RunResult, ClientError> {
    let terminal = request.terminal.is_some();
    // Before any thread of the run starts: they all leave these signals to one.
    if !terminal && let Ok(canceller) = client.canceller() {
        cancel_on_signals(canceller);
    }
    if request.stdin_streamed {
        let source: Box<dyn std::io::Read + Send> = match no_stdin {
            true => Box::new(std::io::empty()),
            false => {
                let own = std::os::fd::AsFd::as_fd(&std::io::stdin()).try_clone_to_owned();
                Box::new(std::fs::File::from(own.map_err(ClientError::Io)?))
            }
        };
        client.stream_stdin(source);
    }
    // Resizes go once the run has started (before, the broker may be
    // asking for an approval); the window then is sent at `started`.
    let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if terminal && let Ok(resizer) = client.canceller() {
        let started = std::sync::Arc::clone(&started);
        let on = move |size| !started.load(std::sync::atomic::Ordering::Acquire) || resizer.resize(size);
        crate::tty::on_resize(on);
    }
    // Its reader gone (`palisade run ... | head`), the run is cancelled, as
    // SIGPIPE ends a command whose reader left: its writes are held, as a
    // cancelled run's are, and said on stderr.
    let canceller = client.canceller();
    let (mut cancelled, mut raw) = (false, None);
    let on = |event: Event<'_>| match event {
        Event::Output(stream, data) => {
            if !render.output(stream, data) && !std::mem::replace(&mut cancelled, true) {
                if let Ok(c) = &canceller {
                    c.cancel();
                }
            }
        }
        Event::Message(palisade_protocol::wire::ServerMessage::Started { .. }) if terminal => {
            started.store(true, std::sync::atomic::Ordering::Release);
            if let (Some(size), Ok(c)) = (crate::tty::window(), &canceller) {
                c.resize(size);
            }
            // Without input (`-t -n`), this terminal keeps its own keys: Ctrl-C ends palisade.
            if !no_stdin {
                raw = crate::tty::Raw::enter();
            }
        }
        Event::Message(_) => {}
    };
    let outcome = client.run_events(request, on, ask_requester);
    drop(raw);
    outcome
}

/// SIGINT, SIGTERM and SIGHUP to palisade (not in a terminal, whose own
/// handling is [`crate::tty`]'s) cancel the run, as its client leaving
/// would: the broker kills it and holds its writes, and its result, which
/// says so, is shown (exit 130). A second one ends palisade at once. Blocks
/// them in the calling thread, and so in every thread it starts afterwards,
/// for the one thread that waits for them.
fn cancel_on_signals(canceller: crate::client::Canceller) {
    static WATCHING: std::sync::Once = std::sync::Once::new();
    WATCHING.call_once(move || {
        // SAFETY: an empty set is initialised by sigemptyset before any other use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t for these calls, which only write
        // it and this thread's signal mask.
        let blocked = unsafe {
            libc::sigemptyset(&mut set);
            for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, signal);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
        };
        if blocked != 0 {
            return;
        }
        std::thread::spawn(move || {
            let mut cancelled = false;
            loop {
                let mut signal = 0;
                // SAFETY: `set` and `signal` are valid for the call, which writes `signal`.
                if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
                    return;
                }
                if std::mem::replace(&mut cancelled, true) {
                    std::process::exit(128 + signal);
                }
                canceller.cancel();
            }
        });
    });
}
