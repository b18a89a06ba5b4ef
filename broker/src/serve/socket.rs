//! A client's connection, as every broker serves it: its messages read
//! and decoded within their limits ([`Inbound`]), its hello checked, and
//! replies written ([`SocketSink`]).

use crate::engine::stream::{Piece, Sink, StdinPieces};
use crate::serve::budget::{BudgetError, Draw, UNBUDGETED_BYTES};
use palisade_protocol::wire::{
    ClientMessage, Decoder, Encoding, ErrorKind, Hello, MAGIC, MAX_FRAME_BYTES, SMALL_FRAME_BYTES,
    ServerMessage, Stream, WireError, encode_in, output_frame_header,
};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::Instant;

/// How long a new connection may take to say hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest hello accepted from a peer (before the handshake, frames are small).
pub const HELLO_MAX_BYTES: usize = 4096;
/// The most read from a client at once.
const READ_BYTES: usize = 16 * 1024;
/// A piece of output up to this size is copied behind its frame's header,
/// to go in one write; a larger one is written after it, not copied.
const COPY_MAX_BYTES: usize = 16 * 1024;

/// The version the connection speaks (the highest both sides do), or why
/// the hello is refused: its magic and encoding must be this broker's and
/// the frame's, and its versions meet this broker's.
pub fn check_hello(h: &Hello, encoding: Encoding) -> Result<u32, String> {
    if h.magic != MAGIC {
        Err(format!("bad magic {:?}", h.magic))
    } else if h.encoding != encoding {
        Err(format!("hello says {:?} but the frame is {encoding:?}", h.encoding))
    } else {
        h.agreed_version()
    }
}

/// Why reading a client's next message failed: the connection cannot go
/// on, and the same error comes again at every later read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReadError {
    /// Bytes that are not a message, or a frame over a limit.
    #[error("{0}")]
    Wire(#[from] WireError),
    /// Buffering more of the frame would exceed a request budget.
    #[error("{0}: closing the connection; try again later")]
    Budget(#[from] BudgetError),
    /// A frame begun and not finished within its deadline.
    #[error(
        "a frame was not complete within {0} s of its first byte (frame_timeout_secs): closing the connection"
    )]
    FrameTimeout(u64),
    /// The socket failed.
    #[error("{0}")]
    Io(String),
}

impl ReadError {
    /// The kind the client is told: `Busy` for a budget, which other
    /// connections draw on too, and `ProtocolError` for what this client
    /// sent.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ReadError::Budget(_) => ErrorKind::Busy,
            _ => ErrorKind::ProtocolError,
        }
    }
}

/// The client's side of a connection as the broker reads it: its bytes
/// decoded into messages, within the frame limits, the request budgets
/// and the frame deadline.
pub struct Inbound {
    reader: OwnedReadHalf,
    decoder: Decoder,
    /// Bytes held beyond [`UNBUDGETED_BYTES`], drawn from the budgets; none
    /// for a connection being refused (its hello's limit bounds it).
    draw: Option<Draw>,
    /// `stdin` bytes of the run being served: held until [`Inbound::run_done`].
    in_use: usize,
    /// How long a frame may take from its first byte to its last.
    frame_timeout: Option<Duration>,
    /// When the frame pending began to arrive.
    frame_started: Option<Instant>,
    /// The error that ended reading, given again to every later read.
    broken: Option<ReadError>,
}

impl Inbound {
    /// Reading a hello (at most [`HELLO_MAX_BYTES`]), without budgets:
    /// a connection being refused.
    pub fn new(reader: OwnedReadHalf) -> Inbound {
        let mut decoder = Decoder::default();
        decoder.set_limit(HELLO_MAX_BYTES);
        decoder.set_small_limit(SMALL_FRAME_BYTES);
        Inbound {
            reader,
            decoder,
            draw: None,
            in_use: 0,
            frame_timeout: None,
            frame_started: None,
            broken: None,
        }
    }

    /// A connection served: its bytes beyond [`UNBUDGETED_BYTES`] come from
    /// `draw`.
    pub fn budgeted(reader: OwnedReadHalf, draw: Draw) -> Inbound {
        Inbound { draw: Some(draw), ..Inbound::new(reader) }
    }

    /// After the hello (which its own timeout bounds): frames up to
    /// [`MAX_FRAME_BYTES`] (a run's `stdin`), [`SMALL_FRAME_BYTES`] for any
    /// other message, each whole within `frame_timeout` of its first byte.
    pub fn greeted(&mut self, frame_timeout: Duration) {
        self.decoder.set_limit(MAX_FRAME_BYTES);
        self.frame_timeout = Some(frame_timeout);
    }

    /// The encoding the client's first byte chose, once it sent one.
    pub fn encoding(&self) -> Option<Encoding> {
        self.decoder.encoding()
    }

    /// A whole message is here: [`Inbound::next`] will not wait.
    pub fn has_message(&self) -> bool {
        self.broken.is_none() && self.decoder.has_message()
    }

    /// The run served is over: its `stdin` goes back to the budgets.
    pub fn run_done(&mut self) {
        self.in_use = 0;
        // Less is never refused.
        let _ = self.hold(self.decoder.buffered());
    }

    /// Reads until one whole message is decoded; `Ok(None)` at a clean end
    /// of input.
    pub async fn next(&mut self) -> Result<Option<ClientMessage>, ReadError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let read = self.read_next().await;
        if let Err(e) = &read {
            self.broken = Some(e.clone());
            // Nothing more of this connection is decoded: its bytes go back.
            self.decoder = Decoder::new(self.decoder.encoding());
            self.in_use = 0;
            let _ = self.hold(0);
        }
        read
    }

    async fn read_next(&mut self) -> Result<Option<ClientMessage>, ReadError> {
        let mut buf = [0u8; READ_BYTES];
        loop {
            if let Some(m) = self.decoded()? {
                return Ok(Some(m));
            }
            let reading = self.reader.read(&mut buf);
            let read = match self.frame_started.zip(self.frame_timeout) {
                Some((started, limit)) => tokio::time::timeout_at(started + limit, reading)
                    .await
                    .map_err(|_| ReadError::FrameTimeout(limit.as_secs()))?,
                None => reading.await,
            };
            let n = read.map_err(|e| ReadError::Io(e.to_string()))?;
            if n == 0 {
                return self.decoder.finish().map(|_| None).map_err(ReadError::from);
            }
            // Drawn before it is buffered: over a budget, it never is.
            self.hold(self.decoder.buffered() + n)?;
            if self.decoder.buffered() == 0 {
                self.frame_started = Some(Instant::now());
            }
            self.decoder.push(&buf[..n]);
        }
    }

    /// The next message of those buffered, checked against the small limit
    /// now that it is known to be a run or not.
    fn decoded(&mut self) -> Result<Option<ClientMessage>, ReadError> {
        // Before [`Inbound::greeted`] the message is the hello, of any version this broker speaks.
        let next = if self.frame_timeout.is_none() {
            self.decoder.next_hello()
        } else {
            self.decoder.next_message::<ClientMessage>()
        };
        let Some(message) = next? else { return Ok(None) };
        let len = self.decoder.last_len();
        let stdin = match &message {
            ClientMessage::Run(r) => Some(r.stdin.len()),
            _ => None,
        };
        if len > SMALL_FRAME_BYTES && stdin.unwrap_or(0) == 0 {
            return Err(WireError::LargeNotRun { len, max: SMALL_FRAME_BYTES }.into());
        }
        let pending = self.decoder.buffered();
        // What is left is the beginning of the next frame.
        self.frame_started = (pending > 0).then(Instant::now);
        self.decoder.release_storage(UNBUDGETED_BYTES);
        // The run's stdin replaces its frame, which was larger.
        self.in_use += stdin.unwrap_or(0);
        self.hold(pending)?;
        Ok(Some(message))
    }

    /// Holds `buffered` bytes of frames, with the `stdin` in use, drawing
    /// what is beyond [`UNBUDGETED_BYTES`] from the budgets.
    fn hold(&mut self, buffered: usize) -> Result<(), BudgetError> {
        match &mut self.draw {
            Some(draw) => draw.set((buffered + self.in_use).saturating_sub(UNBUDGETED_BYTES)),
            None => Ok(()),
        }
    }

    /// Completes when the client disconnects or sends `Cancel` (or anything
    /// else: a run in progress accepts nothing but a cancel). A late
    /// `Approve` (a prompt answered after an approver elsewhere did) and a
    /// `Resize` (a run with no terminal has no window) are passed over.
    pub async fn client_gone(&mut self) {
        while let Ok(Some(ClientMessage::Approve { .. } | ClientMessage::Resize(_))) = self.next().await {}
    }

    /// [`Inbound::client_gone`] for a run whose client streams its stdin
    /// (`RunWithStdin`): each `Stdin` piece is passed to `stdin`, waiting
    /// while the channel is full (no further message is read meanwhile: a
    /// command that does not read its input holds the client back), until
    /// `StdinEnd`. Pieces the command no longer takes, or sent after the
    /// end, are dropped. A terminal's `Resize` goes the same way, in order
    /// with the pieces (a resize after `StdinEnd` still reaches it).
    pub async fn client_gone_feeding(&mut self, stdin: tokio::sync::mpsc::Sender<Piece>) {
        let (mut stdin, mut ended) = (Some(stdin), false);
        loop {
            let piece = match self.next().await {
                Ok(Some(ClientMessage::Approve { .. })) => continue,
                Ok(Some(ClientMessage::Stdin { data })) if !ended => Piece::Data(data),
                Ok(Some(ClientMessage::Stdin { .. })) => continue,
                Ok(Some(ClientMessage::Resize(size))) if size.check().is_ok() => Piece::Resize(size),
                // A window no terminal takes changes nothing.
                Ok(Some(ClientMessage::Resize(_))) => continue,
                Ok(Some(ClientMessage::StdinEnd)) if !ended => {
                    ended = true;
                    Piece::End
                }
                Ok(Some(ClientMessage::StdinEnd)) => continue,
                _ => return,
            };
            if let Some(tx) = &stdin
                && tx.send(piece).await.is_err()
            {
                stdin = None;
            }
        }
    }
}

pub struct SocketSink {
    writer: OwnedWriteHalf,
    encoding: Encoding,
    /// The protocol version the connection speaks, whose form replies take.
    version: u32,
    /// A frame was left half written: the stream can carry nothing more.
    broken: bool,
    /// The socket refused a splice: output is copied.
    no_splice: bool,
    /// Messages encoded but not yet written: they go out in front of the
    /// next write (see [`SocketSink::hold`]).
    held: Vec<u8>,
    /// JSON: output as a header line and the raw bytes (the run's `raw_output`).
    raw_output: bool,
    /// The stdin the client streams for the run about to start.
    stdin: Option<StdinPieces>,
    /// The run in progress takes a streamed stdin: its client waits for
    /// `Started` before it sends any, so `Started` is never held.
    streaming: bool,
}

impl SocketSink {
    pub fn new(writer: OwnedWriteHalf, encoding: Encoding) -> SocketSink {
        SocketSink {
            writer,
            encoding,
            version: palisade_protocol::wire::PROTOCOL_VERSION,
            broken: false,
            no_splice: false,
            held: Vec::new(),
            raw_output: false,
            stdin: None,
            streaming: false,
        }
    }

    /// The stdin of the run about to be served, streamed by its client
    /// (`None`: none is, or the run is over).
    pub fn set_stdin(&mut self, stdin: Option<StdinPieces>) {
        self.streaming = stdin.is_some();
        self.stdin = stdin;
    }

    /// Replies take the form of protocol `version` (the one the hellos agreed on).
    pub fn set_version(&mut self, version: u32) {
        self.version = version;
    }

    /// Whether the run about to be served asked for its output raw (JSON).
    pub fn set_raw_output(&mut self, raw: bool) {
        self.raw_output = raw && self.encoding == Encoding::Json;
    }

    /// The header of `len` bytes of output sent raw after it: bincode's
    /// frame header, or JSON's announcing line.
    fn raw_header(&self, stream: Stream, len: usize) -> Vec<u8> {
        match self.encoding {
            Encoding::Bincode => output_frame_header(stream, len),
            Encoding::Json => palisade_protocol::wire::raw_output_header(stream, len),
        }
    }

    /// `bytes`, behind whatever is held.
    fn behind_held(&mut self, bytes: Vec<u8>) -> Vec<u8> {
        if self.held.is_empty() {
            return bytes;
        }
        let mut all = std::mem::take(&mut self.held);
        all.extend_from_slice(&bytes);
        all
    }
}

impl Sink for SocketSink {
    async fn send(&mut self, msg: ServerMessage) -> bool {
        if self.broken {
            return false;
        }
        if let ServerMessage::Output { stream, data } = &msg {
            return self.send_output(*stream, data).await;
        }
        match encode_in(&msg, self.encoding, self.version) {
            Ok(bytes) => {
                let bytes = self.behind_held(bytes);
                self.writer.write_all(&bytes).await.is_ok()
            }
            Err(e) => {
                tracing::error!("cannot encode a reply: {e}");
                false
            }
        }
    }

    async fn send_output(&mut self, stream: Stream, data: &[u8]) -> bool {
        if self.broken {
            return false;
        }
        if self.encoding == Encoding::Json && !self.raw_output {
            let line = self.behind_held(palisade_protocol::wire::output_json_line(stream, data));
            return self.writer.write_all(&line).await.is_ok();
        }
        let frame = self.raw_header(stream, data.len());
        let mut frame = self.behind_held(frame);
        // Small pieces (most output) go in one write; large ones are not copied.
        if data.len() <= COPY_MAX_BYTES {
            frame.extend_from_slice(data);
            return self.writer.write_all(&frame).await.is_ok();
        }
        self.writer.write_all(&frame).await.is_ok() && self.writer.write_all(data).await.is_ok()
    }

    fn splices(&self) -> bool {
        let raw = self.encoding == Encoding::Bincode || self.raw_output;
        cfg!(target_os = "linux") && raw && !self.broken && !self.no_splice
    }

    fn take_stdin(&mut self) -> Option<StdinPieces> {
        self.stdin.take()
    }

    #[cfg(target_os = "linux")]
    async fn splice_output(&mut self, stream: Stream, pipe: std::os::fd::BorrowedFd<'_>, len: usize) -> bool {
        if self.broken {
            return false;
        }
        let header = self.raw_header(stream, len);
        let header = self.behind_held(header);
        if self.writer.write_all(&header).await.is_err() {
            return false;
        }
        use std::os::fd::AsRawFd;
        let socket: &tokio::net::UnixStream = self.writer.as_ref();
        let mut left = len;
        while left > 0 {
            // The pipe holds the bytes, so only a full socket makes this wait.
            let moved = socket
                .async_io(tokio::io::Interest::WRITABLE, || {
                    // SAFETY: both descriptors are open for the call; no memory is passed.
                    let n = unsafe {
                        libc::splice(
                            pipe.as_raw_fd(),
                            std::ptr::null_mut(),
                            socket.as_raw_fd(),
                            std::ptr::null_mut(),
                            left,
                            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
                        )
                    };
                    if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as usize) }
                })
                .await;
            match moved {
                Ok(0) => {
                    tracing::error!("the output pipe ended with {left} bytes it said it held");
                    return false;
                }
                Ok(n) => left -= n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && left == len => {
                    // This socket cannot take a splice: the bytes are read and written.
                    tracing::debug!("splice into the client's socket: {e}; copying instead");
                    self.no_splice = true;
                    let mut data = vec![0u8; left];
                    return match crate::engine::stream::read_exact_now(pipe, &mut data) {
                        Ok(()) => self.writer.write_all(&data).await.is_ok(),
                        Err(_) => false,
                    };
                }
                Err(_) => return false,
            }
        }
        true
    }

    /// Only for a message the client is sure to be sent something after
    /// (the hello when its request is already here, `Started`), and
    /// flushed before waiting on the client. A streamed run's `Started` is
    /// what its client waits for before it sends the command's input.
    fn hold(&mut self, msg: &ServerMessage) -> bool {
        if self.streaming && matches!(msg, ServerMessage::Started { .. }) {
            return false;
        }
        match encode_in(msg, self.encoding, self.version) {
            Ok(bytes) if !self.broken => {
                self.held.extend_from_slice(&bytes);
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::error!("cannot encode a reply: {e}");
                false
            }
        }
    }

    async fn flush(&mut self) -> bool {
        if self.held.is_empty() {
            return !self.broken;
        }
        let held = std::mem::take(&mut self.held);
        !self.broken && self.writer.write_all(&held).await.is_ok()
    }

    fn abandon(&mut self) {
        self.broken = true;
    }
}

/// Raises the soft limit on open files to the hard one: each connection and
/// each run holds descriptors, and the connection limits are counted against
/// what the process may open (the units set `LimitNOFILE`).
pub fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::debug!(from = soft, to = hard, "open file limit raised"),
            Err(e) => tracing::warn!("cannot raise the open file limit from {soft} to {hard}: {e}"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot read the open file limit: {e}"),
    }
}

/// Binds the socket with `mode`, replacing a stale one but never a live one.
pub fn bind(path: &std::path::Path, mode: u32) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "another broker is listening there",
            ));
        }
        std::fs::remove_file(path)?;
    }
    // Created with no permission for others, whatever the umask, then given
    // its mode: there is no moment when it is more open than configured.
    let previous = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = std::os::unix::net::UnixListener::bind(path);
    nix::sys::stat::umask(previous);
    let listener = bound?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    listener.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(listener)
}

/// The socket, and its directory where that is the broker's own (not a
/// shared one such as /tmp), are out of every run's reach: a run that could
/// connect would be a client of its own broker.
pub fn keep_socket_out_of_reach<E: crate::engine::executor::Executor>(
    broker: &crate::decide::service::Broker<E>,
    socket: &std::path::Path,
) {
    broker.keep_out_of_reach(socket, "the broker's socket");
    if let Some(dir) = socket.parent().filter(|d| crate::host::paths::private_to_us(d)) {
        broker.keep_out_of_reach(dir, "the broker's socket directory");
    }
}

/// A message that could not be read, in the broker's terms.
impl From<ReadError> for crate::error::BrokerError {
    fn from(e: ReadError) -> Self {
        match e.kind() {
            palisade_protocol::wire::ErrorKind::Busy => Self::Busy(e.to_string()),
            _ => Self::Protocol(e.to_string()),
        }
    }
}
