//! A blocking client for the broker's socket (what the CLI uses).

use palisade_protocol::wire::{
    ClientMessage, Decoder, Encoding, ErrorReply, Hello, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION,
    PendingApproval, REACH_VERSION, RunRequest, RunResult, ServerMessage, Stream, WindowSize, encode,
    encode_in,
};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Connecting, reading or writing failed.
    #[error("{0}")]
    Io(#[source] std::io::Error),
    /// The broker answered with an error.
    #[error("{}: {}", .0.kind, .0.message)]
    Reply(ErrorReply),
    /// The broker said something that makes no sense here.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The streamed stdin could not be read: the run was cancelled.
    #[error("reading the run's stdin: {0}")]
    Stdin(String),
}

/// What a run sends before its result.
pub enum Event<'a> {
    /// A piece of output, in the client's receive buffer (output moved
    /// straight to a descriptor given to [`Client::splice_output_to`] is
    /// not seen here).
    Output(Stream, &'a [u8]),
    /// Any other message (`Started`, ...).
    Message(&'a ServerMessage),
}

/// A run held for approval, as the requester is told.
pub struct Ask<'a> {
    pub reason: &'a str,
    /// Whether this client's own answer is taken; otherwise an approver
    /// answers from elsewhere (`palisade approve ID`) and the run waits.
    pub may_answer: bool,
    pub approval: &'a PendingApproval,
    /// Sends this client's answer later, from another thread, while the
    /// run waits for whichever answer comes first.
    pub answerer: Answerer,
}

/// This client's `Approve`, to send from another thread (a prompt at a
/// terminal that an approver elsewhere may answer first).
pub struct Answerer {
    writer: Writer,
}

impl Answerer {
    /// Sends the answer; the broker takes it only while the run still waits.
    pub fn send(self, approved: bool) -> Result<(), ClientError> {
        self.writer.send(&ClientMessage::Approve { approved })
    }
}

/// Cancels one run of a connection from anywhere (a run's `on` included):
/// see [`Client::canceller`].
pub struct Canceller {
    writer: Writer,
    run: u64,
}

impl Canceller {
    /// Sends `cancel` while the run is in progress; after its end, nothing.
    pub fn cancel(&self) {
        let _ = self.writer.send_in(Some(self.run), &ClientMessage::Cancel);
    }

    /// Sends the run's terminal its new window while the run is in
    /// progress; `false` once it is over (nothing was sent).
    pub fn resize(&self, size: WindowSize) -> bool {
        matches!(self.writer.send_in(Some(self.run), &ClientMessage::Resize(size)), Ok(true))
    }
}

/// The connection's sending side, for another thread: each message is
/// written whole under a lock the client's own sends take too, so that
/// frames from two threads never interleave. The lock holds the number of
/// the runs ended on the connection: a run's stdin is sent only while it
/// is the one in progress (see [`Writer::send_in`]).
#[derive(Clone)]
struct Writer {
    stream: Arc<UnixStream>,
    lock: Arc<Mutex<u64>>,
    encoding: Encoding,
}

impl Writer {
    fn send(&self, msg: &ClientMessage) -> Result<(), ClientError> {
        self.send_in(None, msg).map(|_| ())
    }

    /// Sends `msg`, when `run` is given only while that run is the one in
    /// progress (`false`: it ended, nothing was sent): a piece of its stdin
    /// never reaches the connection's next run.
    fn send_in(&self, run: Option<u64>, msg: &ClientMessage) -> Result<bool, ClientError> {
        let bytes = encode(msg, self.encoding).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let ended = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if run.is_some_and(|run| run != *ended) {
            return Ok(false);
        }
        (&*self.stream).write_all(&bytes).map_err(ClientError::Io)?;
        Ok(true)
    }
}

/// The end of a run on the client's side: dropped, it counts the run as
/// ended, so that its stdin's thread sends nothing more. A run that ended
/// otherwise than by the broker's answer (`answered`) may have left the
/// broker not reading while that thread waits in a write: the connection
/// (`stream`, where a stdin streams) is shut down first, which ends the wait.
struct RunEnd {
    lock: Arc<Mutex<u64>>,
    stream: Option<UnixStream>,
    answered: bool,
}

impl Drop for RunEnd {
    fn drop(&mut self) {
        if let Some(stream) = self.stream.as_ref().filter(|_| !self.answered) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        *self.lock.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    }
}

/// The protocol version that streams a run's stdin (`RunWithStdin`).
const STREAMED_STDIN_VERSION: u32 = 14;
/// The protocol version that runs a command in a terminal (`RunInTerminal`).
const TERMINAL_VERSION: u32 = 15;
/// The protocol version that streams the stdin of a command in a session.
const SESSION_STDIN_VERSION: u32 = 17;

/// Sends what `source` gives as the stdin pieces of `run` (the number of
/// runs ended before it), then its end; nothing more once the run is over
/// or the connection fails. Runs on a thread of its own from the run's
/// `Started` on.
fn feed_stdin(
    mut source: Box<dyn Read + Send>,
    writer: Writer,
    run: u64,
    failed: Arc<Mutex<Option<String>>>,
) {
    let sent = |piece: &[u8]| {
        matches!(writer.send_in(Some(run), &ClientMessage::Stdin { data: piece.to_vec() }), Ok(true))
    };
    match crate::args::read_pieces(&mut source, sent) {
        Ok(true) => {
            let _ = writer.send_in(Some(run), &ClientMessage::StdinEnd);
        }
        // The run is over, or the connection failed.
        Ok(false) => {}
        // Unreadable: the run is cancelled (never fed a truncated input as
        // if it were whole), and the run's caller told why.
        Err(e) => {
            *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
            let _ = writer.send_in(Some(run), &ClientMessage::Cancel);
        }
    }
}

pub struct Client {
    stream: UnixStream,
    /// Taken by every write, here and on other threads; it holds the
    /// number of runs ended (see [`Writer`]).
    write_lock: Arc<Mutex<u64>>,
    /// The version the broker's hello agreed on, once it is read.
    version: Option<u32>,
    /// The next run's stdin, streamed while it runs (see [`Client::stream_stdin`]).
    stdin: Option<Box<dyn Read + Send>>,
    /// The session the next run is a command of (see [`Client::in_session`]).
    session: Option<String>,
    /// Why a run's streamed stdin could not be read, from its feeding thread.
    stdin_failed: Arc<Mutex<Option<String>>>,
    decoder: Decoder,
    encoding: Encoding,
    /// The hello is sent (or queued) but its answer not yet read.
    hello_pending: bool,
    /// Encoded and not yet written: the hello waits to go out with the
    /// first request, in one write.
    queued: Vec<u8>,
    /// Pipes that large pieces of stdout and stderr are spliced into.
    splice_to: [Option<RawFd>; 2],
    /// How much the next read asks for: after a splice, no more than the
    /// next frame's header, so that its data can be spliced too.
    next_read: Option<usize>,
    /// How much a read asks for otherwise: it starts small (most runs get a
    /// few hundred bytes: a short process need not zero and fault in a large
    /// buffer) and doubles, up to [`READ_BYTES`], while reads fill it.
    read_size: usize,
}

/// The most one read from the broker takes.
const READ_BYTES: usize = 64 * 1024;
/// What the first read takes.
const FIRST_READ_BYTES: usize = 4096;
/// What a pipe taking spliced output is grown to (the default is 64 KiB).
const OUTPUT_PIPE_BYTES: usize = 256 * 1024;
/// Output frames with at least this much data still to come are spliced.
const SPLICE_MIN_BYTES: usize = 16 * 1024;

impl Client {
    /// Connects and completes the handshake.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let mut client = Client::open(path)?;
        client.finish_hello()?;
        Ok(client)
    }

    /// Connects; the hello goes out with the first request, in the same
    /// write, and its answer is read before the first reply to it: a run
    /// then costs one round trip instead of two. A refused hello still
    /// fails that request.
    pub fn open(path: &Path) -> Result<Client, ClientError> {
        Client::over(UnixStream::connect(path).map_err(ClientError::Io)?)
    }

    /// [`Client::open`] on a connected stream (one with a read timeout, say).
    pub fn over(stream: UnixStream) -> Result<Client, ClientError> {
        let encoding = Encoding::Bincode;
        let hello = encode(&ClientMessage::Hello(Hello::new(encoding)), encoding)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok(Client {
            stream,
            write_lock: Arc::new(Mutex::new(0)),
            version: None,
            stdin: None,
            session: None,
            stdin_failed: Arc::new(Mutex::new(None)),
            decoder: Decoder::new(Some(encoding)),
            encoding,
            hello_pending: true,
            queued: hello,
            splice_to: [None, None],
            next_read: None,
            read_size: FIRST_READ_BYTES,
        })
    }

    /// Large pieces of `stream`'s output go from the socket into `pipe`
    /// with `splice(2)`, without passing through this process's memory (a
    /// run's event callback does not see them). Only a pipe can take them:
    /// for anything else this returns `false` and output stays an event.
    pub fn splice_output_to(&mut self, stream: Stream, pipe: BorrowedFd<'static>) -> bool {
        let is_pipe = nix::sys::stat::fstat(pipe).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFIFO);
        if is_pipe {
            self.splice_to[stream as usize] = Some(pipe.as_raw_fd());
            // A larger pipe: fewer waits for its reader. Best effort, and never smaller.
            if rustix::pipe::fcntl_getpipe_size(pipe).is_ok_and(|size| size < OUTPUT_PIPE_BYTES) {
                let _ = rustix::pipe::fcntl_setpipe_size(pipe, OUTPUT_PIPE_BYTES);
            }
        }
        is_pipe
    }

    /// Waits for the broker's answer to the hello (sent now if it was
    /// waiting for the first request): an `Unauthorized`, say.
    pub fn greet(&mut self) -> Result<(), ClientError> {
        self.finish_hello()
    }

    /// Whether the broker, greeted, runs commands in a terminal (protocol
    /// version 15 or later).
    pub fn speaks_terminal(&self) -> bool {
        self.version.is_some_and(|v| v >= TERMINAL_VERSION)
    }

    fn finish_hello(&mut self) -> Result<(), ClientError> {
        if !std::mem::take(&mut self.hello_pending) {
            return Ok(());
        }
        if !self.queued.is_empty() {
            let queued = std::mem::take(&mut self.queued);
            self.write(&queued)?;
        }
        match self.receive()? {
            ServerMessage::Hello(h) if (OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&h.version) => {
                self.version = Some(h.version);
                self.decoder.set_version(h.version);
                Ok(())
            }
            ServerMessage::Hello(h) => Err(ClientError::Protocol(format!(
                "the broker answered in protocol version {}; this client speaks {OLDEST_PROTOCOL_VERSION} to {PROTOCOL_VERSION}",
                h.version
            ))),
            ServerMessage::Error(e) => Err(ClientError::Reply(e)),
            other => Err(ClientError::Protocol(format!("expected a hello, got {other:?}"))),
        }
    }

    /// Sends `msg` in the form of the version the hellos agreed on. Before
    /// the broker's hello is read, a message goes out with this client's in
    /// the form of the version before [`REACH_VERSION`], which a broker of
    /// that version and a later one both read; but a run that asks what
    /// only a later one reads (`allow_ports`, `allow_addresses`) waits for
    /// the broker's hello, and is refused by an older broker's client here.
    pub fn send(&mut self, msg: &ClientMessage) -> Result<(), ClientError> {
        if msg.run_request().is_some_and(RunRequest::reaches) {
            self.finish_hello()?;
            let version = self.version.unwrap_or(0);
            if version < REACH_VERSION {
                return Err(ClientError::Protocol(format!(
                    "this broker speaks protocol version {version}; a run's --allow-port and \
                     --allow-address need {REACH_VERSION} or later (restart the broker after an upgrade)"
                )));
            }
        }
        let form = self.version.unwrap_or(REACH_VERSION - 1);
        let mut bytes =
            encode_in(msg, self.encoding, form).map_err(|e| ClientError::Protocol(e.to_string()))?;
        if !self.queued.is_empty() {
            let mut all = std::mem::take(&mut self.queued);
            all.append(&mut bytes);
            bytes = all;
        }
        self.write(&bytes)
    }

    fn write(&self, bytes: &[u8]) -> Result<(), ClientError> {
        let _held = self.write_lock.lock().unwrap_or_else(|e| e.into_inner());
        (&self.stream).write_all(bytes).map_err(ClientError::Io)
    }

    /// A [`Canceller`] of the next run this client starts.
    pub fn canceller(&self) -> Result<Canceller, ClientError> {
        let run = *self.write_lock.lock().unwrap_or_else(|e| e.into_inner());
        Ok(Canceller { writer: self.writer()?, run })
    }

    fn writer(&self) -> Result<Writer, ClientError> {
        let stream = Arc::new(self.stream.try_clone().map_err(ClientError::Io)?);
        Ok(Writer { stream, lock: Arc::clone(&self.write_lock), encoding: self.encoding })
    }

    /// The next run's stdin is what `source` gives, streamed while the
    /// command runs (for any size, at the pace the command reads it), from
    /// a thread that sends it after the run's `Started`. A broker older
    /// than protocol version 14 gets it read whole, in the request. The
    /// thread ends at the source's end or once the run is over and a piece
    /// cannot be sent; a source that never ends keeps it waiting.
    /// The next run is a command in the session `name` (`RunInSession`).
    pub fn in_session(&mut self, name: String) {
        self.session = Some(name);
    }

    pub fn stream_stdin(&mut self, source: Box<dyn Read + Send>) {
        self.stdin = Some(source);
    }

    pub fn receive(&mut self) -> Result<ServerMessage, ClientError> {
        loop {
            if let Some(m) = self.decoder.next_message().map_err(|e| ClientError::Protocol(e.to_string()))? {
                return Ok(m);
            }
            self.read_more()?;
        }
    }

    /// One read from the broker into the decoder; its end is an error here.
    fn read_more(&mut self) -> Result<(), ClientError> {
        let max = self.next_read.take().unwrap_or(self.read_size);
        let n = self.decoder.read_from(&mut self.stream, max).map_err(ClientError::Io)?;
        if n == self.read_size {
            self.read_size = (self.read_size * 2).min(READ_BYTES);
        }
        if n == 0 {
            return Err(ClientError::Protocol("the broker closed the connection".into()));
        }
        Ok(())
    }

    /// Runs a command; `each` sees every message before the final one.
    pub fn run(
        &mut self,
        request: RunRequest,
        each: impl FnMut(&ServerMessage),
    ) -> Result<RunResult, ClientError> {
        // Nobody to ask here: a run that needs approval is refused (or, where
        // this client may not answer, waits for an approver).
        self.run_with_approval(request, each, |_| false)
    }

    /// Runs `request`; a run that needs approval is put to `approve`, which
    /// asks a person and says whether they approved, when this client may
    /// answer; otherwise the run waits for an approver's answer.
    pub fn run_with_approval(
        &mut self,
        request: RunRequest,
        mut each: impl FnMut(&ServerMessage),
        mut approve: impl FnMut(&str) -> bool,
    ) -> Result<RunResult, ClientError> {
        let on = |event: Event<'_>| match event {
            Event::Output(stream, data) => each(&ServerMessage::Output { stream, data: data.to_vec() }),
            Event::Message(m) => each(m),
        };
        self.run_events(request, on, |ask: Ask<'_>| ask.may_answer.then(|| approve(ask.reason)))
    }

    /// The message that starts a run whose stdin `source` gives: streamed
    /// where the broker speaks a version that does (`source` is put back in
    /// `stdin`, fed once the run starts), else read whole into the request.
    fn with_stdin(
        &mut self,
        mut request: RunRequest,
        mut source: Box<dyn Read + Send>,
        stdin: &mut Option<Box<dyn Read + Send>>,
    ) -> Result<ClientMessage, ClientError> {
        self.finish_hello()?;
        if let Some(size) = request.terminal {
            let version = self.version.unwrap_or(0);
            if version < TERMINAL_VERSION {
                return Err(ClientError::Protocol(format!(
                    "this broker speaks protocol version {version}; a run in a terminal needs \
                     {TERMINAL_VERSION} or later (palisade run -T runs it without one)"
                )));
            }
            *stdin = Some(source);
            return Ok(ClientMessage::RunInTerminal { run: request, size });
        }
        if self.version.is_some_and(|v| v >= STREAMED_STDIN_VERSION) {
            *stdin = Some(source);
            return Ok(ClientMessage::RunWithStdin(request));
        }
        source.read_to_end(&mut request.stdin).map_err(ClientError::Io)?;
        Ok(ClientMessage::Run(request))
    }

    /// A command of `session` whose stdin is `source`: streamed where the
    /// broker speaks version 17 (in a terminal, if `run` asks for one), else
    /// read whole into the request.
    fn in_session_with_stdin(
        &mut self,
        session: String,
        mut run: RunRequest,
        mut source: Box<dyn Read + Send>,
        stdin: &mut Option<Box<dyn Read + Send>>,
    ) -> Result<ClientMessage, ClientError> {
        self.finish_hello()?;
        if self.version.is_some_and(|v| v >= SESSION_STDIN_VERSION) {
            *stdin = Some(source);
            return Ok(match run.terminal {
                Some(size) => ClientMessage::RunInSessionInTerminal { session, run, size },
                None => ClientMessage::RunInSessionWithStdin { session, run },
            });
        }
        source.read_to_end(&mut run.stdin).map_err(ClientError::Io)?;
        Ok(ClientMessage::RunInSession { session, run })
    }

    /// Sends one message that is not a run (`ListApprovals`, `Answer`,
    /// `ListTools`, `ApproveTool`) and returns the broker's reply; an
    /// error reply is `ClientError::Reply`.
    pub fn request(&mut self, msg: &ClientMessage) -> Result<ServerMessage, ClientError> {
        let sent = self.send(msg);
        self.finish_hello()?;
        sent?;
        match self.receive()? {
            ServerMessage::Error(e) => Err(ClientError::Reply(e)),
            reply => Ok(reply),
        }
    }

    /// Runs `request`: `on` sees each piece of output where it was received
    /// (no copy) and every other message before the final one; `approve`
    /// puts a question to a person, if the run needs one: `Some(answer)`
    /// is sent, `None` sends nothing and the run waits for an answer (an
    /// approver's, or one sent later with [`Ask::answerer`]).
    pub fn run_events(
        &mut self,
        request: RunRequest,
        mut on: impl FnMut(Event<'_>),
        mut approve: impl FnMut(Ask<'_>) -> Option<bool>,
    ) -> Result<RunResult, ClientError> {
        let mut stdin = self.stdin.take();
        // A terminal's input is streamed, even when there is none to send.
        if request.terminal.is_some() && stdin.is_none() {
            stdin = Some(Box::new(std::io::empty()));
        }
        let message = match (self.session.take(), stdin.take()) {
            (Some(session), Some(source)) => {
                self.in_session_with_stdin(session, request, source, &mut stdin)?
            }
            (Some(session), None) => ClientMessage::RunInSession { session, run: request },
            (None, Some(source)) => self.with_stdin(request, source, &mut stdin)?,
            (None, None) => ClientMessage::Run(request),
        };
        let sent = self.send(&message);
        // A refused hello explains a failed send (the broker hung up after refusing).
        self.finish_hello()?;
        sent?;
        // Whatever ends the run (a panic of `on` included), its stdin stops
        // there; ended otherwise than by the broker's answer, the broker may
        // not be reading, and the connection is shut down first.
        let mut end = RunEnd {
            lock: Arc::clone(&self.write_lock),
            stream: stdin.as_ref().map(|_| self.stream.try_clone()).transpose().map_err(ClientError::Io)?,
            answered: false,
        };
        let ended = self.events(stdin, &mut on, &mut approve);
        end.answered = matches!(ended, Ok(_) | Err(ClientError::Reply(_)));
        drop(end);
        match self.stdin_failed.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(why) => Err(ClientError::Stdin(why)),
            None => ended,
        }
    }

    /// A run's messages to its end (see [`Client::run_events`]); its
    /// streamed `stdin` is fed from `Started` on.
    fn events(
        &mut self,
        mut stdin: Option<Box<dyn Read + Send>>,
        on: &mut impl FnMut(Event<'_>),
        approve: &mut impl FnMut(Ask<'_>) -> Option<bool>,
    ) -> Result<RunResult, ClientError> {
        loop {
            if let Some((stream, bytes)) = self.decoder.next_output() {
                on(Event::Output(stream, bytes));
                continue;
            }
            if self.pass_output(on)? {
                continue;
            }
            let next = self.decoder.next_message().map_err(|e| ClientError::Protocol(e.to_string()))?;
            let Some(message) = next else {
                // More bytes, then look for an output frame first again.
                self.read_more()?;
                continue;
            };
            match message {
                ServerMessage::Finished(r) => return Ok(*r),
                ServerMessage::Error(e) => return Err(ClientError::Reply(e)),
                ServerMessage::ApprovalRequired { reason, may_answer, approval } => {
                    let answerer = Answerer { writer: self.writer()? };
                    if let Some(approved) =
                        approve(Ask { reason: &reason, may_answer, approval: &approval, answerer })
                    {
                        self.send(&ClientMessage::Approve { approved })?;
                    }
                }
                ServerMessage::Output { stream, data } => on(Event::Output(stream, &data)),
                started @ ServerMessage::Started { .. } => {
                    // The run is on: its stdin may flow.
                    if let Some(source) = stdin.take() {
                        let writer = self.writer()?;
                        let run = *self.write_lock.lock().unwrap_or_else(|e| e.into_inner());
                        let failed = Arc::clone(&self.stdin_failed);
                        std::thread::spawn(move || feed_stdin(source, writer, run, failed));
                    }
                    on(Event::Message(&started))
                }
                other => on(Event::Message(&other)),
            }
        }
    }

    /// When a large output frame has begun and its stream has a pipe to
    /// splice into: the data already received goes to `on`, the rest from
    /// the socket into the pipe. `false`: nothing of the kind was pending.
    fn pass_output(&mut self, on: &mut impl FnMut(Event<'_>)) -> Result<bool, ClientError> {
        if self.splice_to == [None, None] {
            return Ok(false);
        }
        let targets = self.splice_to;
        let Some((stream, here, mut rest, header)) =
            self.decoder.take_output_start(SPLICE_MIN_BYTES, |s| targets[s as usize].is_some())
        else {
            return Ok(false);
        };
        let Some(pipe) = targets[stream as usize] else {
            return Err(ClientError::Protocol("output frame taken for a stream without a pipe".into()));
        };
        if !here.is_empty() {
            on(Event::Output(stream, here));
        }
        let closed = || ClientError::Protocol("the broker closed the connection".into());
        while rest > 0 {
            // SAFETY: both descriptors are open (the socket is this client's,
            // the pipe its caller's for the process's life); no memory is passed.
            let moved = unsafe {
                libc::splice(
                    self.stream.as_raw_fd(),
                    std::ptr::null_mut(),
                    pipe,
                    std::ptr::null_mut(),
                    rest,
                    libc::SPLICE_F_MOVE,
                )
            };
            match moved {
                0 => return Err(closed()),
                n if n > 0 => rest -= n as usize,
                _ => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    // The pipe's reader is gone, or it cannot take a splice:
                    // what remains is read and handed to `on` like any output.
                    self.splice_to = [None, None];
                    let mut buf = vec![0u8; rest.min(READ_BYTES)];
                    while rest > 0 {
                        let want = rest.min(buf.len());
                        let n = self.stream.read(&mut buf[..want]).map_err(ClientError::Io)?;
                        if n == 0 {
                            return Err(closed());
                        }
                        on(Event::Output(stream, &buf[..n]));
                        rest -= n;
                    }
                }
            }
        }
        // The next frame is likely another of the same: read no more than its header.
        self.next_read = Some(header);
        Ok(true)
    }
}
