//! A run's streaming, whatever runs it: stdout and stderr passed to the
//! client as they come, under the output quota, the deadline and the
//! client's own pace, with the whole tree killed when palisade ends the run.
//!
//! The streaming is a state machine, [`Run`], over two seams: the client's
//! [`Sink`] and the process's [`Child`]; its tests drive it with neither a
//! kernel sandbox nor a client socket. Linux's engine ([`crate::engine::run`]) and
//! macOS's ([`crate::seatbelt`]) each give it their process.

use palisade_protocol::wire::{RunStatus, ServerMessage, Stream};
use std::future::Future;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::time::{Duration, Instant};
use tokio::net::unix::pipe;
use tokio::time::Sleep;

/// After the helper exits, how long stray holders of the output pipes may keep
/// them open before the run is finished without their end-of-file.
const DRAIN_GRACE: Duration = Duration::from_millis(200);
/// Tier B: time between SIGTERM (the helper kills its descendants) and SIGKILL.
pub(crate) const TERM_GRACE: Duration = Duration::from_millis(500);
/// A timer that is armed later.
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);
/// Once a run has ended (deadline, quota, cancel), how long a message to a
/// client that does not read may stay unsent before the client is given up.
const SEND_GRACE: Duration = Duration::from_secs(5);
/// How long `Started` may wait to go out with the run's first output or its
/// result: a short run's whole answer is then one write, read by the client
/// in one wake-up. A longer run has it sent when this has passed.
const STARTED_HOLD: Duration = Duration::from_millis(20);
/// Output waiting in a pipe is spliced into a client's socket from this size
/// on; less is read, to go out with its frame's header in one write.
const SPLICE_MIN_BYTES: usize = 16 * 1024;

/// Pieces of a run's stdin as its client streams them (`RunWithStdin`,
/// `RunInTerminal`): the channel ends with the client's `StdinEnd`, or
/// when it is gone.
pub type StdinPieces = tokio::sync::mpsc::Receiver<Piece>;

/// What a client streams to its run's stdin.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    Data(Vec<u8>),
    /// A terminal's new window (`Resize`); nothing to a stdin that is a pipe.
    Resize(palisade_protocol::wire::WindowSize),
    /// `StdinEnd`: a pipe is closed (the command reads end of file); a
    /// terminal takes no more input, and still takes resizes.
    End,
}

/// What a run's command reads on its stdin: the request's `stdin` field,
/// the pieces its client streams, or nothing (end of file at once).
pub enum Input {
    Nothing,
    Bytes(Vec<u8>),
    Streamed(StdinPieces),
    /// The run's terminal: the pieces are its keyboard and its resizes.
    Terminal(StdinPieces),
}

impl Input {
    pub fn of(request: &palisade_protocol::wire::RunRequest, streamed: Option<StdinPieces>) -> Input {
        match streamed {
            Some(pieces) if request.terminal.is_some() => Input::Terminal(pieces),
            Some(pieces) => Input::Streamed(pieces),
            None if request.stdin.is_empty() => Input::Nothing,
            None => Input::Bytes(request.stdin.clone()),
        }
    }

    /// Whether the command's stdin is a pipe the broker writes.
    pub fn piped(&self) -> bool {
        !matches!(self, Input::Nothing)
    }

    /// Writes it all into `stdin`, then closes it. A piece waits for the
    /// command to read the one before (the pipe's back-pressure reaches the
    /// client through the bounded channel); once the command closed its
    /// stdin the rest is dropped, and the channel with it. A terminal's
    /// `stdin` is its master, whose window a resize sets.
    pub async fn feed(self, mut stdin: impl tokio::io::AsyncWrite + AsFd + Unpin) {
        use tokio::io::AsyncWriteExt;
        match self {
            Input::Nothing => {}
            Input::Bytes(data) => {
                let _ = stdin.write_all(&data).await;
            }
            Input::Streamed(mut pieces) => {
                while let Some(piece) = pieces.recv().await {
                    match piece {
                        Piece::Data(data) if stdin.write_all(&data).await.is_ok() => {}
                        Piece::Resize(_) => {}
                        Piece::Data(_) | Piece::End => break,
                    }
                }
            }
            Input::Terminal(mut pieces) => {
                let mut typing = true;
                while let Some(piece) = pieces.recv().await {
                    match piece {
                        Piece::Data(data) if typing => typing = stdin.write_all(&data).await.is_ok(),
                        Piece::Data(_) => {}
                        Piece::Resize(size) => set_window(stdin.as_fd(), size),
                        Piece::End => typing = false,
                    }
                }
            }
        }
    }
}

/// Sets a terminal's window; the kernel sends SIGWINCH to its foreground
/// process group. A stdin that is no terminal has no window (ENOTTY), and
/// nothing happens.
fn set_window(fd: BorrowedFd<'_>, size: palisade_protocol::wire::WindowSize) {
    let window = libc::winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads one winsize through the pointer, a local that outlives the call.
    let _ = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::TIOCSWINSZ, &window) };
}

/// What a held session's run hands over once its sandbox is built: its
/// namespaces, and its cgroup for the commands to join.
pub struct Built {
    pub namespaces: Vec<std::os::fd::OwnedFd>,
    pub cgroup: Option<std::sync::Arc<SessionCgroup>>,
}

/// A session's cgroup, as its commands join it (Linux's; no other executor
/// has sessions).
#[cfg(target_os = "linux")]
pub use crate::engine::cgroup::Membership as SessionCgroup;
#[cfg(not(target_os = "linux"))]
pub enum SessionCgroup {}

/// Where a run's messages go. `false`: the client is gone.
pub trait Sink {
    fn send(&mut self, msg: ServerMessage) -> impl Future<Output = bool> + Send;

    /// One piece of output; the same as sending `ServerMessage::Output`, which
    /// a sink may do without copying `data` into a message first.
    fn send_output(&mut self, stream: Stream, data: &[u8]) -> impl Future<Output = bool> + Send {
        self.send(ServerMessage::Output { stream, data: data.to_vec() })
    }

    /// Whether [`Sink::splice_output`] moves output without copying it.
    fn splices(&self) -> bool {
        false
    }

    /// The stdin its client streams for the run about to start, once
    /// (`None`: the request's `stdin` field is the input).
    fn take_stdin(&mut self) -> Option<StdinPieces> {
        None
    }

    /// The next `len` bytes of `pipe` (a pipe holding at least that many,
    /// read by no one else) as one piece of output. A sink that
    /// [`splices`](Sink::splices) moves them into its socket with `splice(2)`;
    /// this default reads them and sends them as [`Sink::send_output`] does.
    fn splice_output(
        &mut self,
        stream: Stream,
        pipe: BorrowedFd<'_>,
        len: usize,
    ) -> impl Future<Output = bool> + Send
    where
        Self: Send,
    {
        async move {
            let mut data = vec![0u8; len];
            match read_exact_now(pipe, &mut data) {
                Ok(()) => self.send_output(stream, &data).await,
                Err(e) => {
                    tracing::error!("reading output the pipe said it held: {e}");
                    false
                }
            }
        }
    }

    /// Keeps `msg` to go out in front of the next message, in the same write
    /// (one wake-up of the client instead of two). `false`: this sink does
    /// not hold messages, and the caller sends it now.
    fn hold(&mut self, _msg: &ServerMessage) -> bool {
        false
    }

    /// Writes what [`Sink::hold`] kept, if anything.
    fn flush(&mut self) -> impl Future<Output = bool> + Send {
        std::future::ready(true)
    }

    /// A send was dropped half done: nothing more can go through this sink.
    fn abandon(&mut self) {}

    /// A session's sandbox is built and held: its namespaces and its cgroup
    /// (see `palisade_protocol::SessionRole::Hold`). Only a session's sink
    /// gets them; any other drops them.
    fn session_held(&mut self, _built: Built) {}

    /// A session's run that its requester stopped (a cancel that is not
    /// palisade's: no deadline, idle timeout or shutdown). Only a session's
    /// sink says so.
    fn session_stopped(&self) -> bool {
        false
    }
}

/// Reads `buf.len()` bytes that `fd` (non-blocking) already holds.
pub(crate) fn read_exact_now(fd: BorrowedFd<'_>, mut buf: &mut [u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match nix::unistd::read(fd, buf) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Bytes waiting in a pipe (`FIONREAD`); 0 also at its end.
fn pipe_holds(pipe: &pipe::Receiver) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which is valid for it.
    let rc = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(pipe), libc::FIONREAD, &mut n) };
    if rc < 0 { 0 } else { n.max(0) as usize }
}

/// The process side of a run, as its streaming sees it: when it has exited,
/// and how to kill it with everything it started.
pub(crate) trait Child {
    /// Completes once the process has exited (it is not reaped).
    fn exited(&self) -> impl Future<Output = ()> + Send;
    /// Sends `signal` to the process and everything it started.
    fn kill(&self, signal: i32);
}

/// What bounds a run's streaming.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// stdout and stderr together; not one byte more reaches the client.
    pub max_output_bytes: u64,
    pub timeout: Duration,
    /// The most read from a pipe at once.
    pub chunk_bytes: usize,
    /// What ends the run: SIGKILL, or SIGTERM followed by SIGKILL after [`TERM_GRACE`].
    pub first_signal: i32,
}

/// How a run's streaming ended.
#[derive(Debug)]
pub(crate) struct Streamed {
    /// Why palisade ended the run, if it did.
    pub ended: Option<RunStatus>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// When the process was seen to exit.
    pub exited_at: Option<Instant>,
}

/// One of the command's output streams.
struct Pipe {
    rx: pipe::Receiver,
    buf: Vec<u8>,
    open: bool,
    /// Bytes passed on to the client.
    bytes: u64,
}

/// A message on its way to the client (see [`Run::send`]).
enum Outgoing {
    Message(ServerMessage),
    /// What the sink holds.
    Flush,
    /// The first bytes of the stream's buffer.
    Read(Stream, usize),
    /// The next bytes of the stream's pipe.
    Splice(Stream, usize),
}

/// What a run waits for; one at a time happens.
#[derive(Debug)]
enum Event {
    ReleaseStarted,
    Readable(Stream),
    Closed(Stream),
    Exited,
    Deadline,
    Cancelled,
    Escalate,
    Drained,
}

/// What ends a run from outside its output, and the kill that follows.
struct Ending<K, C> {
    child: K,
    cancel: Pin<Box<C>>,
    deadline: Pin<Box<Sleep>>,
    first_signal: i32,
    /// Why palisade ended the run, once it has.
    ended: Option<RunStatus>,
    exited: bool,
    /// Tier B: SIGKILL after a SIGTERM that did not end the run, armed by
    /// `end` and waited for wherever the run waits (a stuck send included).
    escalate: Pin<Box<Sleep>>,
    escalation_armed: bool,
}

impl<K: Child, C> Ending<K, C> {
    /// Neither ended by palisade nor exited: the deadline and a cancel still apply.
    fn live(&self) -> bool {
        self.ended.is_none() && !self.exited
    }

    /// Palisade ends the run: the whole tree is signalled, and after a
    /// SIGTERM, SIGKILL follows in [`TERM_GRACE`] unless it has exited.
    fn end(&mut self, status: RunStatus) {
        let first = self.ended.is_none();
        self.ended = Some(status);
        self.child.kill(self.first_signal);
        if first && self.first_signal == libc::SIGTERM && !self.exited {
            self.escalation_armed = true;
            self.escalate.as_mut().reset(tokio::time::Instant::now() + TERM_GRACE);
        }
    }

    /// Whether the SIGKILL after a SIGTERM is due when `escalate` fires.
    fn escalating(&self) -> bool {
        self.escalation_armed && !self.exited
    }

    /// The SIGKILL after a SIGTERM that did not end the run.
    fn escalate(&mut self) {
        self.escalation_armed = false;
        self.child.kill(libc::SIGKILL);
    }
}

/// A run in progress: the helper's output goes to the client, under the
/// quota, the deadline and the client's own pace, until the helper has
/// exited and its output is drained.
pub(crate) struct Run<'s, S, K, C> {
    sink: &'s mut S,
    /// stdout and stderr, by [`Stream`].
    pipes: [Pipe; 2],
    ending: Ending<K, C>,
    /// After the exit, how long stray holders of the pipes may keep them open.
    drain: Pin<Box<Sleep>>,
    /// `Started` held to go out with the first output, until then.
    release_started: Pin<Box<Sleep>>,
    started_held: bool,
    max_output_bytes: u64,
    total: u64,
    /// The client still takes messages.
    connected: bool,
    splices: bool,
    exited_at: Option<Instant>,
}

impl<'s, S, K, C> Run<'s, S, K, C>
where
    S: Sink + Send,
    K: Child,
    C: Future<Output = ()> + Send,
{
    pub(crate) fn new(
        sink: &'s mut S,
        child: K,
        [out, err]: [pipe::Receiver; 2],
        bounds: Bounds,
        cancel: C,
    ) -> Self {
        let pipe = |rx| Pipe { rx, buf: vec![0u8; bounds.chunk_bytes], open: true, bytes: 0 };
        let splices = sink.splices();
        Run {
            sink,
            pipes: [pipe(out), pipe(err)],
            ending: Ending {
                child,
                cancel: Box::pin(cancel),
                deadline: Box::pin(tokio::time::sleep(bounds.timeout)),
                first_signal: bounds.first_signal,
                ended: None,
                exited: false,
                escalate: Box::pin(tokio::time::sleep(NEVER)),
                escalation_armed: false,
            },
            drain: Box::pin(tokio::time::sleep(NEVER)),
            release_started: Box::pin(tokio::time::sleep(NEVER)),
            started_held: false,
            max_output_bytes: bounds.max_output_bytes,
            total: 0,
            connected: false,
            splices,
            exited_at: None,
        }
    }

    /// Output is read and copied, never spliced: a terminal's master is no
    /// pipe.
    #[cfg(target_os = "linux")]
    pub(crate) fn copying(mut self) -> Self {
        self.splices = false;
        self
    }

    /// Announces the run with `started`, then passes its output on until
    /// the helper has exited and its pipes are drained.
    pub(crate) async fn stream(mut self, started: ServerMessage) -> Streamed {
        self.announce(started).await;
        while !(self.ending.exited && !self.pipes[0].open && !self.pipes[1].open) {
            match self.next_event().await {
                Event::ReleaseStarted => self.release_started().await,
                Event::Readable(stream) => self.forward(stream).await,
                Event::Closed(stream) => self.pipes[stream as usize].open = false,
                Event::Exited => {
                    self.ending.exited = true;
                    self.exited_at = Some(Instant::now());
                    self.drain.as_mut().reset(tokio::time::Instant::now() + DRAIN_GRACE);
                }
                Event::Deadline => self.ending.end(RunStatus::TimedOut),
                Event::Cancelled => self.ending.end(RunStatus::Cancelled),
                Event::Escalate => self.ending.escalate(),
                Event::Drained => break,
            }
        }
        let [out, err] = &self.pipes;
        Streamed {
            ended: self.ending.ended,
            stdout_bytes: out.bytes,
            stderr_bytes: err.bytes,
            exited_at: self.exited_at,
        }
    }

    /// `Started` goes out now, or is held to go out with what comes next
    /// (within [`STARTED_HOLD`]).
    async fn announce(&mut self, started: ServerMessage) {
        self.started_held = self.sink.hold(&started);
        if self.started_held {
            self.release_started.as_mut().reset(tokio::time::Instant::now() + STARTED_HOLD);
        }
        self.connected = self.started_held || self.send(Outgoing::Message(started)).await;
    }

    async fn next_event(&mut self) -> Event {
        let [out, err] = &self.pipes;
        let ending = &mut self.ending;
        let live = ending.live();
        tokio::select! {
            _ = self.release_started.as_mut(), if self.started_held => Event::ReleaseStarted,
            r = out.rx.readable(), if out.open => match r {
                Ok(()) => Event::Readable(Stream::Stdout),
                Err(_) => Event::Closed(Stream::Stdout),
            },
            r = err.rx.readable(), if err.open => match r {
                Ok(()) => Event::Readable(Stream::Stderr),
                Err(_) => Event::Closed(Stream::Stderr),
            },
            _ = ending.child.exited(), if !ending.exited => Event::Exited,
            _ = ending.deadline.as_mut(), if live => Event::Deadline,
            _ = ending.cancel.as_mut(), if live => Event::Cancelled,
            _ = ending.escalate.as_mut(), if ending.escalating() => Event::Escalate,
            _ = self.drain.as_mut(), if ending.exited => Event::Drained,
        }
    }

    async fn release_started(&mut self) {
        self.started_held = false;
        if self.connected {
            self.connected = self.send(Outgoing::Flush).await;
        }
    }

    /// Passes on what `stream`'s pipe holds, up to the quota: the run dies
    /// at the first byte past it, which never leaves.
    async fn forward(&mut self, stream: Stream) {
        if self.ending.ended == Some(RunStatus::QuotaExceeded) {
            return;
        }
        let Some((n, spliced)) = self.take(stream) else { return };
        let room = self.max_output_bytes.saturating_sub(self.total);
        let deliver = (n as u64).min(room) as usize;
        if deliver < n {
            // Over the quota: the whole tree dies now, and no byte past the limit leaves.
            self.ending.end(RunStatus::QuotaExceeded);
            self.pipes[0].open = false;
            self.pipes[1].open = false;
        }
        if deliver == 0 {
            return;
        }
        self.total += deliver as u64;
        self.pipes[stream as usize].bytes += deliver as u64;
        if self.connected {
            // Whatever is held goes out in front of this piece.
            self.started_held = false;
            let out =
                if spliced { Outgoing::Splice(stream, deliver) } else { Outgoing::Read(stream, deliver) };
            self.connected = self.send(out).await;
        }
    }

    /// How many bytes of `stream` go out next, and whether they are still
    /// in the pipe (to be spliced) rather than in its buffer. What the pipe
    /// holds goes out by splice where the sink can take it so; otherwise
    /// (and to see the pipe's end) it is read here. Small pieces are read:
    /// header and bytes then go in one write. `None`: nothing to pass on.
    fn take(&mut self, stream: Stream) -> Option<(usize, bool)> {
        let pipe = &mut self.pipes[stream as usize];
        let held = if self.splices && self.connected { pipe_holds(&pipe.rx).min(pipe.buf.len()) } else { 0 };
        if held >= SPLICE_MIN_BYTES {
            return Some((held, true));
        }
        match pipe.rx.try_read(&mut pipe.buf) {
            Ok(n) if n > 0 => Some((n, false)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            _ => {
                pipe.open = false;
                None
            }
        }
    }

    /// Sends `out` while the run's deadline and cancellation stay in force:
    /// a client that stops reading cannot hold a sandbox past either. Once
    /// the run has ended, a send still stuck after [`SEND_GRACE`] is dropped
    /// (`false`: the client is given up, its sink abandoned). A client gone
    /// while the run goes on cancels the run.
    async fn send(&mut self, out: Outgoing) -> bool {
        let sent = {
            let (sink, pipes) = (&mut *self.sink, &self.pipes);
            let send = async move {
                match out {
                    Outgoing::Message(msg) => sink.send(msg).await,
                    Outgoing::Flush => sink.flush().await,
                    Outgoing::Read(stream, n) => {
                        sink.send_output(stream, &pipes[stream as usize].buf[..n]).await
                    }
                    Outgoing::Splice(stream, n) => {
                        sink.splice_output(stream, pipes[stream as usize].rx.as_fd(), n).await
                    }
                }
            };
            tokio::pin!(send);
            let grace = tokio::time::sleep(if self.ending.ended.is_some() { SEND_GRACE } else { NEVER });
            tokio::pin!(grace);
            loop {
                let live = self.ending.live();
                tokio::select! {
                    ok = &mut send => break Some(ok),
                    _ = self.ending.deadline.as_mut(), if live => {
                        self.ending.end(RunStatus::TimedOut);
                        grace.as_mut().reset(tokio::time::Instant::now() + SEND_GRACE);
                    }
                    _ = self.ending.cancel.as_mut(), if live => {
                        self.ending.end(RunStatus::Cancelled);
                        grace.as_mut().reset(tokio::time::Instant::now() + SEND_GRACE);
                    }
                    _ = self.ending.escalate.as_mut(), if self.ending.escalating() => self.ending.escalate(),
                    // Seen while the client holds up a send, the exit's time is the command's own.
                    _ = self.ending.child.exited(), if !self.ending.exited => {
                        self.ending.exited = true;
                        self.exited_at = Some(Instant::now());
                        self.drain.as_mut().reset(tokio::time::Instant::now() + DRAIN_GRACE);
                    }
                    _ = &mut grace => break None,
                }
            }
        };
        let connected = sent.unwrap_or_else(|| {
            self.sink.abandon();
            false
        });
        if !connected && self.ending.ended.is_none() {
            self.ending.end(RunStatus::Cancelled);
        }
        connected
    }
}

/// The run's state machine against a fake client and a fake process: real
/// pipes, no sandbox, no root, and tokio's paused clock for every timer.
#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::OwnedFd;
    use std::sync::Arc;
    use std::sync::Mutex;
    use tokio::sync::watch;

    /// What the fake client does.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Client {
        /// Takes everything at once.
        Reads,
        /// Gone after taking this many messages: every send after fails.
        GoneAfter(usize),
        /// Takes messages but never the output: those sends never complete.
        StopsReading,
    }

    struct FakeSink {
        client: Client,
        /// What reached the client, in order.
        sent: Vec<ServerMessage>,
        /// Messages held to go in front of the next.
        held: Vec<ServerMessage>,
        holds: bool,
        splices: bool,
        abandoned: bool,
    }

    impl FakeSink {
        fn new(client: Client) -> FakeSink {
            FakeSink { client, sent: vec![], held: vec![], holds: false, splices: false, abandoned: false }
        }

        fn output(&self, stream: Stream) -> Vec<u8> {
            let data = |m: &ServerMessage| match m {
                ServerMessage::Output { stream: s, data } if *s == stream => Some(data.clone()),
                _ => None,
            };
            self.sent.iter().filter_map(data).flatten().collect()
        }

        fn deliver(&mut self, msg: ServerMessage) -> bool {
            if matches!(self.client, Client::GoneAfter(n) if self.sent.len() >= n) {
                return false;
            }
            self.sent.append(&mut self.held);
            self.sent.push(msg);
            true
        }
    }

    impl Sink for FakeSink {
        async fn send(&mut self, msg: ServerMessage) -> bool {
            self.deliver(msg)
        }

        async fn send_output(&mut self, stream: Stream, data: &[u8]) -> bool {
            if self.client == Client::StopsReading {
                std::future::pending::<()>().await;
            }
            self.deliver(ServerMessage::Output { stream, data: data.to_vec() })
        }

        fn splices(&self) -> bool {
            self.splices
        }

        fn hold(&mut self, msg: &ServerMessage) -> bool {
            if self.holds {
                self.held.push(msg.clone());
            }
            self.holds
        }

        async fn flush(&mut self) -> bool {
            self.sent.append(&mut self.held);
            true
        }

        fn abandon(&mut self) {
            self.abandoned = true;
        }
    }

    struct ChildState {
        /// Signals received, in order.
        kills: Vec<i32>,
        /// The write ends of stdout and stderr, while the process holds them.
        writers: Option<[OwnedFd; 2]>,
        /// The signals it dies of.
        dies_of: &'static [i32],
    }

    /// A process that writes what the test says and exits when told or killed.
    struct FakeChild {
        state: Arc<Mutex<ChildState>>,
        exit: Arc<watch::Sender<bool>>,
    }

    impl Child for FakeChild {
        fn exited(&self) -> impl Future<Output = ()> + Send {
            let mut exit = self.exit.subscribe();
            async move {
                let _ = exit.wait_for(|exited| *exited).await;
            }
        }

        fn kill(&self, signal: i32) {
            let mut state = self.state.lock().unwrap();
            state.kills.push(signal);
            if state.dies_of.contains(&signal) {
                state.writers = None;
                self.exit.send_replace(true);
            }
        }
    }

    /// The test's side of the fake process.
    struct Process {
        state: Arc<Mutex<ChildState>>,
        exit: Arc<watch::Sender<bool>>,
    }

    impl Process {
        fn write(&self, stream: Stream, data: &[u8]) {
            let state = self.state.lock().unwrap();
            let fd = &state.writers.as_ref().expect("the process holds its pipes")[stream as usize];
            assert_eq!(nix::unistd::write(fd, data).unwrap(), data.len());
        }

        /// Exits; `keep_pipes`: something it started still holds them.
        fn exit(&self, keep_pipes: bool) {
            if !keep_pipes {
                self.state.lock().unwrap().writers = None;
            }
            self.exit.send_replace(true);
        }

        fn kills(&self) -> Vec<i32> {
            self.state.lock().unwrap().kills.clone()
        }
    }

    fn process(dies_of: &'static [i32]) -> (FakeChild, [pipe::Receiver; 2], Process) {
        let pipe = || nix::unistd::pipe().unwrap();
        let ((out_r, out_w), (err_r, err_w)) = (pipe(), pipe());
        let state =
            Arc::new(Mutex::new(ChildState { kills: vec![], writers: Some([out_w, err_w]), dies_of }));
        let exit = Arc::new(watch::channel(false).0);
        let readers =
            [pipe::Receiver::from_owned_fd(out_r).unwrap(), pipe::Receiver::from_owned_fd(err_r).unwrap()];
        let child = FakeChild { state: state.clone(), exit: exit.clone() };
        (child, readers, Process { state, exit })
    }

    const TIMEOUT: Duration = Duration::from_secs(30);

    fn bounds(max_output_bytes: u64) -> Bounds {
        Bounds { max_output_bytes, timeout: TIMEOUT, chunk_bytes: 64 * 1024, first_signal: libc::SIGKILL }
    }

    async fn stream(
        sink: &mut FakeSink,
        child: FakeChild,
        pipes: [pipe::Receiver; 2],
        bounds: Bounds,
        cancel: impl Future<Output = ()> + Send,
    ) -> Streamed {
        let started =
            ServerMessage::Started { run_id: 1, executor: palisade_protocol::wire::Executor::LinuxTierC };
        Run::new(sink, child, pipes, bounds, cancel).stream(started).await
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn output_is_cut_at_exactly_the_quota_read_or_spliced() {
        // (spliced, bytes written, quota): one byte over, far over, exactly at it.
        for (splices, len, max) in [(false, 10, 9), (false, 10, 7), (true, 40_000, 20_001), (false, 7, 7)] {
            let (child, pipes, p) = process(&[libc::SIGKILL]);
            let data = pattern(len);
            p.write(Stream::Stdout, &data);
            let at_quota = len as u64 <= max;
            if at_quota {
                p.exit(false);
            }
            let mut sink = FakeSink { splices, ..FakeSink::new(Client::Reads) };
            let s = stream(&mut sink, child, pipes, bounds(max), std::future::pending()).await;
            let kept = len.min(max as usize);
            assert_eq!(sink.output(Stream::Stdout), data[..kept], "{len} bytes, quota {max}");
            assert_eq!((s.stdout_bytes, s.stderr_bytes), (kept as u64, 0));
            if at_quota {
                assert_eq!((s.ended, p.kills()), (None, vec![]), "{len} bytes, quota {max}");
            } else {
                assert_eq!((s.ended, p.kills()), (Some(RunStatus::QuotaExceeded), vec![libc::SIGKILL]));
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_quota_counts_both_streams_together() {
        let (child, pipes, p) = process(&[libc::SIGKILL]);
        p.write(Stream::Stdout, b"ooooo");
        p.write(Stream::Stderr, b"eeeee");
        let mut sink = FakeSink::new(Client::Reads);
        let s = stream(&mut sink, child, pipes, bounds(7), std::future::pending()).await;
        assert_eq!(s.ended, Some(RunStatus::QuotaExceeded));
        let (out, err) = (sink.output(Stream::Stdout), sink.output(Stream::Stderr));
        assert_eq!(out.len() + err.len(), 7, "{out:?} {err:?}");
        assert!(b"ooooo".starts_with(&out) && b"eeeee".starts_with(&err));
        assert_eq!((s.stdout_bytes, s.stderr_bytes), (out.len() as u64, err.len() as u64));
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_kills_the_run_and_tier_b_escalates_to_sigkill() {
        // Tier C dies of the first signal; Tier B's helper is given TERM_GRACE.
        for (first, dies_of, kills, took) in [
            (libc::SIGKILL, &[libc::SIGKILL][..], vec![libc::SIGKILL], TIMEOUT),
            (libc::SIGTERM, &[libc::SIGKILL][..], vec![libc::SIGTERM, libc::SIGKILL], TIMEOUT + TERM_GRACE),
        ] {
            let (child, pipes, p) = process(dies_of);
            p.write(Stream::Stdout, b"partial");
            let mut sink = FakeSink::new(Client::Reads);
            let t0 = tokio::time::Instant::now();
            let s =
                stream(&mut sink, child, pipes, Bounds { first_signal: first, ..bounds(1 << 20) }, async {
                    std::future::pending().await
                })
                .await;
            assert_eq!((s.ended, p.kills()), (Some(RunStatus::TimedOut), kills));
            assert_eq!(t0.elapsed(), took);
            assert_eq!(sink.output(Stream::Stdout), b"partial");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_disconnects_gets_its_run_cancelled() {
        // Seen by the connection (its end of input, or a cancel): the cancel future.
        let (child, pipes, p) = process(&[libc::SIGKILL]);
        let mut sink = FakeSink::new(Client::Reads);
        let t0 = tokio::time::Instant::now();
        let s = stream(&mut sink, child, pipes, bounds(1 << 20), tokio::time::sleep(Duration::from_secs(1)))
            .await;
        assert_eq!((s.ended, p.kills()), (Some(RunStatus::Cancelled), vec![libc::SIGKILL]));
        assert_eq!(t0.elapsed(), Duration::from_secs(1));
        // Seen by a send: the client takes `Started`, then its socket fails.
        let (child, pipes, p) = process(&[libc::SIGKILL]);
        p.write(Stream::Stdout, b"hello");
        let mut sink = FakeSink::new(Client::GoneAfter(1));
        let s = stream(&mut sink, child, pipes, bounds(1 << 20), std::future::pending()).await;
        assert_eq!((s.ended, p.kills()), (Some(RunStatus::Cancelled), vec![libc::SIGKILL]));
        assert!(matches!(sink.sent.as_slice(), [ServerMessage::Started { .. }]), "{:?}", sink.sent);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_cannot_hold_the_run_past_its_deadline() {
        let (child, pipes, p) = process(&[libc::SIGKILL]);
        p.write(Stream::Stdout, b"nobody reads this");
        let mut sink = FakeSink::new(Client::StopsReading);
        let t0 = tokio::time::Instant::now();
        let s = stream(&mut sink, child, pipes, bounds(1 << 20), std::future::pending()).await;
        assert_eq!((s.ended, p.kills()), (Some(RunStatus::TimedOut), vec![libc::SIGKILL]));
        // Killed at the deadline; the stuck send is given up SEND_GRACE later.
        assert!(sink.abandoned);
        assert_eq!(t0.elapsed(), TIMEOUT + SEND_GRACE);
        // A run already ended (here, over its quota) gives a stuck send SEND_GRACE too.
        let (child, pipes, p) = process(&[libc::SIGKILL]);
        p.write(Stream::Stdout, &pattern(100));
        let mut sink = FakeSink::new(Client::StopsReading);
        let t0 = tokio::time::Instant::now();
        let s = stream(&mut sink, child, pipes, bounds(10), std::future::pending()).await;
        assert_eq!((s.ended, p.kills()), (Some(RunStatus::QuotaExceeded), vec![libc::SIGKILL]));
        assert!(sink.abandoned);
        assert_eq!(t0.elapsed(), SEND_GRACE);
    }

    #[tokio::test(start_paused = true)]
    async fn tier_b_escalates_to_sigkill_while_a_send_is_stuck() {
        let (child, pipes, p) = process(&[libc::SIGKILL]);
        p.write(Stream::Stdout, b"nobody reads this");
        let mut sink = FakeSink::new(Client::StopsReading);
        let tier_b = Bounds { first_signal: libc::SIGTERM, ..bounds(1 << 20) };
        let run = stream(&mut sink, child, pipes, tier_b, std::future::pending());
        let watch = async {
            tokio::time::sleep(TIMEOUT + TERM_GRACE / 2).await;
            let before = p.kills();
            tokio::time::sleep(TERM_GRACE).await;
            (before, p.kills())
        };
        let (s, (before, after)) = tokio::join!(run, watch);
        // SIGKILL comes TERM_GRACE after SIGTERM, not once the stuck send is given up.
        assert_eq!((before, after), (vec![libc::SIGTERM], vec![libc::SIGTERM, libc::SIGKILL]));
        assert_eq!(s.ended, Some(RunStatus::TimedOut));
    }

    #[tokio::test(start_paused = true)]
    async fn started_goes_out_with_the_first_output_and_stray_pipe_holders_are_not_waited_for() {
        let (child, pipes, p) = process(&[libc::SIGKILL]);
        p.write(Stream::Stderr, b"warning\n");
        // The process exits; something it left behind keeps its pipes open.
        p.exit(true);
        let mut sink = FakeSink { holds: true, ..FakeSink::new(Client::Reads) };
        let t0 = tokio::time::Instant::now();
        let s = stream(&mut sink, child, pipes, bounds(1 << 20), std::future::pending()).await;
        assert_eq!((s.ended, p.kills()), (None, vec![]));
        assert!(
            matches!(sink.sent.as_slice(), [ServerMessage::Started { .. }, ServerMessage::Output { .. }]),
            "{:?}",
            sink.sent
        );
        assert_eq!(sink.output(Stream::Stderr), b"warning\n");
        assert_eq!(t0.elapsed(), DRAIN_GRACE);
    }
}
