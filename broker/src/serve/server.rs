//! palisaded's socket server: peer credentials, the handshake, framing, the
//! connection limits (overall and per uid) and idle timeout, the request
//! budgets, the concurrency limit with its bounded queue, and shutdown.
//!
//! A peer is sorted out as soon as it is accepted: one the broker does not
//! serve is answered `Unauthorized` and closed, one over the connection
//! limits `Busy`, each kind of refusal within a room of its own
//! ([`REFUSING_ROOM`]); only the others count against the limits.

use super::slots::{Limits, Refused, Slot, Taken};
use crate::decide::approvals::{ApproverAction, Ticket};
use crate::decide::panics::{self, Caught};
use crate::decide::service::{Broker, Decided, Native, Question, not_approved};
use crate::engine::executor::Executor;
use crate::engine::stream::Sink;
use crate::error::BrokerError;
use crate::host::peer::Peer;
use crate::journal::Event;
use crate::logs::refusals::{Refusals, unlogged_suffix};
use crate::serve::budget::RequestBudget;
use crate::serve::memory;
use crate::serve::socket::{HELLO_MAX_BYTES, HELLO_TIMEOUT, Inbound, ReadError, SocketSink, check_hello};
use palisade_protocol::wire::{
    BrokerStatus, ClientMessage, ConfigStatus, Decoder, Encoding, ErrorKind, ErrorReply, JournalHead,
    LiveSession, Operations, PROTOCOL_VERSION, PerUidLimits, ReloadOutcome, RequesterShare, RunRequest,
    RunResult, ServerHello, ServerMessage, encode,
};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::{JoinError, JoinSet};

/// How long a run's result may wait for a client that does not read.
const RESULT_SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// Pieces of a streamed stdin received ahead of the command's reading: past
/// them the broker reads no further message from the client until one is
/// taken. With the piece waiting to join them and the one being written,
/// a run holds at most 4 (each at most `SMALL_FRAME_BYTES`): what streamed
/// stdin holds is bounded by the runs in progress (`max_concurrent`).
const STDIN_PIECES_QUEUED: usize = 2;
/// How long shutdown waits for killed runs to report.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// How long a refused connection (over the limits, or of a peer not
/// served) may take to say hello, to be told why in its own encoding.
const REFUSAL_HELLO_TIMEOUT: Duration = Duration::from_secs(1);
/// Refused connections of each kind (over the limits; of peers not served)
/// waiting for their hello at once, beyond the `max_connections` served.
/// Past that, one is answered at once, in the encoding of what it has sent
/// so far (bincode if nothing), and closed: descriptors and memory stay
/// bounded whatever the rate of attempts, and the accept loop never waits.
pub const REFUSING_ROOM: usize = 256;
/// After a failed accept (out of descriptors, say), a pause before the next:
/// the failure would otherwise repeat at once, in a busy loop.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// How long a thread of the runtime's blocking pool (decisions, copy-back)
/// waits for more work before it exits: after a burst, its memory goes back
/// to the allocator soon, and from there to the system (see below).
pub const BLOCKING_KEEP_ALIVE: Duration = Duration::from_secs(1);
/// An idle broker that has served since it last did gives the allocator's
/// free memory back to the system ([`memory::release_free_memory`]) once it has
/// had no connection for two of these: past [`BLOCKING_KEEP_ALIVE`], when
/// the pool's threads are gone.
const IDLE_TRIM_EVERY: Duration = Duration::from_secs(1);
/// What reading a client's first message gave: nothing within
/// [`HELLO_TIMEOUT`], a bad frame, its end, or a message.
type HelloRead = Result<Result<Option<ClientMessage>, ReadError>, tokio::time::error::Elapsed>;

/// Open connections, overall and by peer uid.
#[derive(Default)]
struct Connections {
    total: usize,
    by_uid: HashMap<u32, usize>,
}

/// One admitted connection; counted until dropped.
struct Admitted {
    connections: Arc<Mutex<Connections>>,
    uid: u32,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut c = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        c.total -= 1;
        if let Some(n) = c.by_uid.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                c.by_uid.remove(&self.uid);
            }
        }
    }
}

/// The connection and run limits (`[broker]`) are read from the broker's
/// settings where each applies, so that a reload changes them for what
/// comes next: a connection's idle and frame timeouts at its next request,
/// the connection limits at the next connection, the run slots and the
/// request budgets at once ([`Server::reload`]).
pub struct Server<E: Executor = Native> {
    pub(super) broker: Arc<Broker<E>>,
    /// The live sessions (see [`crate::serve::sessions`]).
    pub(super) sessions: Arc<crate::decide::sessions::Sessions>,
    /// The tasks holding them: a shutdown waits for each (its writes settled).
    pub(super) session_tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Where sessions' published ports listen (see [`crate::serve::publish`]).
    pub(super) published_dir: std::sync::OnceLock<std::path::PathBuf>,
    connections: Arc<Mutex<Connections>>,
    /// One permit per connection over the limits waiting for its hello.
    refusing_busy: Arc<Semaphore>,
    /// One permit per connection of a peer not served waiting for its hello.
    refusing_not_allowed: Arc<Semaphore>,
    /// The bytes of requests held for the clients (`request_buffer_bytes`).
    requests: Arc<RequestBudget>,
    /// The run slots and their queue, shared fairly between requesters.
    slots: Arc<super::slots::Slots>,
    /// The runs held now, for `status`.
    live: super::live::Live,
    /// The socket served (set when serving starts).
    socket: std::sync::OnceLock<String>,
    /// How the last reload ended.
    last_reload: Mutex<Option<ReloadOutcome>>,
    /// When the server started serving.
    started: std::time::SystemTime,
    /// Connections refused over the limits, logged a few at a time.
    busy: Refusals,
    /// Connections of peers the broker does not serve, logged apart from
    /// the others (a flood of those never hides one of these).
    not_allowed: Refusals,
}

impl<E: Executor> Server<E> {
    pub fn new(broker: Broker<E>) -> Server<E> {
        let settings = broker.settings();
        let b = &settings.config().broker;
        Server {
            connections: Arc::default(),
            refusing_busy: Arc::new(Semaphore::new(REFUSING_ROOM)),
            refusing_not_allowed: Arc::new(Semaphore::new(REFUSING_ROOM)),
            requests: RequestBudget::new(b.request_buffer_bytes, b.request_buffer_bytes_per_uid),
            slots: super::slots::Slots::new(super::slots::Limits::of(b, broker.context.serves_others)),
            live: super::live::Live::default(),
            socket: std::sync::OnceLock::new(),
            last_reload: Mutex::new(None),
            started: std::time::SystemTime::now(),
            busy: Refusals::default(),
            not_allowed: Refusals::default(),
            broker: Arc::new(broker),
            sessions: Arc::default(),
            session_tasks: Mutex::default(),
            published_dir: std::sync::OnceLock::new(),
        }
    }

    /// Serves until `shutdown` flips to true; then stops accepting, kills the
    /// runs in progress (each client gets its `Cancelled` result) and returns.
    pub async fn serve(self: Arc<Self>, listener: UnixListener, mut shutdown: watch::Receiver<bool>) {
        let published = self.publish_beside(&listener);
        if let Some(path) = listener.local_addr().ok().as_ref().and_then(|a| a.as_pathname()) {
            let _ = self.socket.set(path.display().to_string());
        }
        let mut connections = JoinSet::new();
        let mut trim = tokio::time::interval(IDLE_TRIM_EVERY);
        // Ticks missed while nothing was served are not made up at once.
        trim.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut served_since_trim, mut quiet_ticks) = (false, 0);
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        self.arrive(stream, &shutdown, &mut connections);
                        (served_since_trim, quiet_ticks) = (true, 0);
                    }
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(ACCEPT_RETRY).await;
                    }
                },
                _ = shutdown.changed() => break,
                _ = trim.tick(), if served_since_trim || self.busy.pending() || self.not_allowed.pending() => {
                    if let Some(n) = self.busy.overdue(Instant::now()) {
                        tracing::warn!("{n} more connections refused over the limits, not logged one by one");
                    }
                    if let Some(n) = self.not_allowed.overdue(Instant::now()) {
                        tracing::warn!("{n} more connections of peers not allowed, not logged one by one");
                    }
                    quiet_ticks = if connections.is_empty() { quiet_ticks + 1 } else { 0 };
                    if quiet_ticks == 2 {
                        served_since_trim = false;
                        // On this thread: the blocking pool's would be one more to start and keep.
                        memory::release_free_memory();
                    }
                }
                Some(joined) = connections.join_next(), if !connections.is_empty() => {
                    if let Err(e) = joined.map_err(JoinError::into_panic) {
                        tracing::error!("a connection's task panicked: {}", panics::message(e.as_ref()));
                    }
                }
            }
        }
        drop(listener);
        // Requests still waiting for a slot are answered now instead of starting.
        self.slots.close();
        tracing::info!(connections = connections.len(), "shutting down: killing the runs in progress");
        // The sessions end with the runs, their writes held as any ended run's.
        let tasks = std::mem::take(&mut *self.session_tasks.lock().unwrap_or_else(|e| e.into_inner()));
        let ended = async {
            while connections.join_next().await.is_some() {}
            for task in tasks {
                let _ = task.await;
            }
        };
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, ended).await;
        connections.abort_all();
        if let Some(dir) = published {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// Why `peer` may not use this broker, if it may not. A broker that does
    /// not serve other users ([`crate::host::privilege`]) can act only as itself (see [`crate::host::requester`]): it serves
    /// its own uid and root, whatever `allowed_uids` says.
    fn refusal(&self, peer: &Peer) -> Option<String> {
        let me = self.broker.context.uid;
        if !self.broker.settings().allows(me, peer.uid, peer.gid, &peer.groups) {
            Some(format!(
                "uid {} (gid {}, groups {:?}) is not allowed to use this broker",
                peer.uid, peer.gid, peer.groups
            ))
        } else {
            self.broker.executor.refusal(me, peer)
        }
    }

    /// Counts a new connection of `uid` in, or says which limit it is over.
    fn admit(&self, uid: u32) -> Result<Admitted, BrokerError> {
        let settings = self.broker.settings();
        let (max, per_uid) =
            (settings.config().broker.max_connections, settings.config().broker.max_connections_per_uid);
        let mut c = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        let of_uid = c.by_uid.get(&uid).copied().unwrap_or(0);
        if c.total >= max {
            return Err(BrokerError::Busy(format!(
                "all {max} connections the broker takes (max_connections) are open"
            )));
        }
        if of_uid >= per_uid {
            return Err(BrokerError::Busy(format!(
                "uid {uid} has all {of_uid} connections it may open (max_connections_per_uid)"
            )));
        }
        c.total += 1;
        *c.by_uid.entry(uid).or_default() += 1;
        Ok(Admitted { connections: self.connections.clone(), uid })
    }

    /// A connection just accepted, sorted out at once by its peer: served
    /// (counted against the limits), or refused (`Unauthorized`, `Busy`)
    /// within the room of that kind of refusal, never counted.
    fn arrive(
        self: &Arc<Self>,
        stream: UnixStream,
        shutdown: &watch::Receiver<bool>,
        connections: &mut JoinSet<()>,
    ) {
        let Some(peer) = peer_of(&stream) else { return };
        let (refusal, room) = match self.refusal(&peer) {
            Some(why) => {
                if let Some(unlogged) = self.not_allowed.note(Instant::now()) {
                    let more = unlogged_suffix(unlogged);
                    tracing::warn!(
                        uid = peer.uid,
                        gid = peer.gid,
                        pid = peer.pid,
                        "peer not allowed: {why}{more}"
                    );
                }
                (BrokerError::Unauthorized(why), &self.refusing_not_allowed)
            }
            None => match self.admit(peer.uid) {
                Ok(admitted) => {
                    let (server, stop) = (self.clone(), shutdown.clone());
                    connections.spawn(async move { server.connection(stream, peer, admitted, stop).await });
                    return;
                }
                Err(why) => {
                    if let Some(unlogged) = self.busy.note(Instant::now()) {
                        let more = unlogged_suffix(unlogged);
                        tracing::warn!(uid = peer.uid, pid = peer.pid, "connection refused: {why}{more}");
                    }
                    (BrokerError::Busy(format!("{why}; try again later")), &self.refusing_busy)
                }
            },
        };
        let reply = ErrorReply::from(refusal);
        match room.clone().try_acquire_owned() {
            Ok(permit) => {
                connections.spawn(async move {
                    refuse(stream, reply).await;
                    drop(permit);
                });
            }
            Err(_) => refuse_now(stream, reply),
        }
    }

    async fn connection(
        &self,
        stream: UnixStream,
        peer: Peer,
        _admitted: Admitted,
        shutdown: watch::Receiver<bool>,
    ) {
        let (reader, writer) = stream.into_split();
        let mut inbound = Inbound::budgeted(reader, self.requests.draw(peer.uid));
        let hello = tokio::time::timeout(HELLO_TIMEOUT, inbound.next()).await;
        let encoding = inbound.encoding().unwrap_or(Encoding::Bincode);
        let mut sink = SocketSink::new(writer, encoding);
        let version = match self.greet(&peer, hello, encoding) {
            Ok(Some(version)) => version,
            Ok(None) => return,
            Err(e) => {
                sink.send(e.into()).await;
                return;
            }
        };
        inbound.greeted(Duration::from_secs(self.broker.settings().config().broker.frame_timeout_secs));
        sink.set_version(version);
        let hello = ServerHello { version, broker: self.broker.executor.broker_name(), encoding };
        let hello = ServerMessage::Hello(hello);
        // A client that sent its request behind the hello gets the hello
        // with the first reply to it.
        let answered = if inbound.has_message() { sink.hold(&hello) } else { sink.send(hello).await };
        if answered {
            self.serve_requests(&peer, &mut sink, &mut inbound, shutdown).await;
        }
    }

    /// Whether a connection goes on after its first message, and in which
    /// version: a hello this broker takes (its peer was found to be served
    /// when it arrived). `Ok(None)`: the client left without a word.
    fn greet(&self, peer: &Peer, hello: HelloRead, encoding: Encoding) -> Result<Option<u32>, BrokerError> {
        let checked = match hello {
            Err(_) => Err(BrokerError::Protocol(format!("no hello within {} s", HELLO_TIMEOUT.as_secs()))),
            Ok(Err(e)) => Err(e.into()),
            Ok(Ok(None)) => return Ok(None),
            Ok(Ok(Some(ClientMessage::Hello(h)))) => check_hello(&h, encoding).map_err(BrokerError::Protocol),
            Ok(Ok(Some(_))) => Err(BrokerError::Protocol("the first message must be a hello".into())),
        };
        if let Err(e) = &checked {
            tracing::info!(uid = peer.uid, pid = peer.pid, "refused: {e}");
        }
        checked.map(Some)
    }

    /// Serves one request after another until the client leaves, falls
    /// silent, or breaks the protocol.
    async fn serve_requests(
        &self,
        peer: &Peer,
        sink: &mut SocketSink,
        inbound: &mut Inbound,
        shutdown: watch::Receiver<bool>,
    ) {
        loop {
            // Nothing held while waiting for the client, who may be waiting for it.
            if !inbound.has_message() && !sink.flush().await {
                return;
            }
            let idle = Duration::from_secs(self.broker.settings().config().broker.idle_timeout_secs);
            let next = tokio::time::timeout(idle, inbound.next()).await;
            let message = match next {
                Err(_) => return self.close_idle(peer, idle, sink).await,
                Ok(Ok(Some(m))) => m,
                Ok(Ok(None)) => return,
                Ok(Err(e)) => {
                    tracing::info!(uid = peer.uid, pid = peer.pid, "closing the connection: {e}");
                    sink.send(BrokerError::from(e).into()).await;
                    return;
                }
            };
            let mut session = None;
            let request = match message {
                ClientMessage::Run(r) => r,
                m @ (ClientMessage::RunInSession { .. }
                | ClientMessage::RunInSessionWithStdin { .. }
                | ClientMessage::RunInSessionInTerminal { .. }) => match self.in_session(peer, m) {
                    Ok((s, request)) => {
                        session = Some(s);
                        request
                    }
                    Err(e) => {
                        if !sink.send(ServerMessage::Error(e)).await {
                            return;
                        }
                        continue;
                    }
                },
                ClientMessage::StartSession(start) => {
                    let reply = match Caught::new(self.start_session(peer, start, shutdown.clone())).await {
                        Ok(reply) => reply.unwrap_or_else(ServerMessage::from),
                        Err(panic) => return after_panic(peer, "a session's start", panic, sink).await,
                    };
                    if !sink.send(reply).await {
                        return;
                    }
                    continue;
                }
                ClientMessage::RunWithStdin(r) if r.stdin.is_empty() => {
                    RunRequest { stdin_streamed: true, ..r }
                }
                ClientMessage::RunInTerminal { run, size } if run.stdin.is_empty() => {
                    RunRequest { stdin_streamed: true, terminal: Some(size), ..run }
                }
                ClientMessage::RunWithStdin(_) | ClientMessage::RunInTerminal { .. } => {
                    let e = ErrorReply::new(
                        palisade_protocol::wire::ErrorKind::InvalidRequest,
                        "the stdin of a run_with_stdin or a run_in_terminal comes as stdin messages: \
                         its stdin field must be empty",
                    );
                    if !sink.send(ServerMessage::Error(e)).await {
                        return;
                    }
                    continue;
                }
                // A cancel, or stdin, sent as the last run ended: too late for it.
                ClientMessage::Cancel
                | ClientMessage::Stdin { .. }
                | ClientMessage::StdinEnd
                | ClientMessage::Resize(_) => continue,
                ClientMessage::Approve { .. } => {
                    let e = BrokerError::Protocol("no run is waiting for approval".into());
                    if !sink.send(e.into()).await {
                        return;
                    }
                    continue;
                }
                ClientMessage::Hello(_) => {
                    sink.send(BrokerError::Protocol("hello sent twice".into()).into()).await;
                    return;
                }
                other => {
                    let reply = match Caught::new(self.control(peer, other)).await {
                        Ok(reply) => reply.unwrap_or_else(ServerMessage::from),
                        Err(panic) => return after_panic(peer, "a request", panic, sink).await,
                    };
                    if !sink.send(reply).await {
                        return;
                    }
                    continue;
                }
            };
            sink.set_raw_output(request.raw_output);
            let serving = self.serve_run(peer, (request, session), sink, inbound, shutdown.clone());
            let served = Caught::new(serving).await;
            sink.set_stdin(None);
            inbound.run_done();
            let msg = match served {
                Ok(Ok(result)) => ServerMessage::Finished(Box::new(result)),
                Ok(Err(e)) => e.into(),
                Err(panic) => return after_panic(peer, "a run request", panic, sink).await,
            };
            // A client that does not read its result is given up, not waited for.
            if !tokio::time::timeout(RESULT_SEND_TIMEOUT, sink.send(msg)).await.unwrap_or(false) {
                return;
            }
        }
    }

    /// A connection silent for `idle_timeout`: told why, then closed.
    async fn close_idle(&self, peer: &Peer, idle: Duration, sink: &mut SocketSink) {
        let secs = idle.as_secs();
        tracing::info!(uid = peer.uid, pid = peer.pid, "idle for {secs} s: closing the connection");
        let message = format!("no request within {secs} s (idle_timeout_secs): closing the connection");
        sink.send(BrokerError::Protocol(message).into()).await;
    }

    /// Decides off the runtime's threads: the decision reads the host as the
    /// requester, and a read that blocks (a file on a stuck network
    /// filesystem, say) must hold up no other client.
    pub(super) async fn decide(
        &self,
        peer: &Peer,
        request: RunRequest,
    ) -> (Result<Decided<E::Held>, BrokerError>, RunRequest) {
        let (broker, who) = (self.broker.clone(), peer.clone());
        let task = tokio::task::spawn_blocking(move || (broker.decide(&who, &request), request));
        match task.await {
            Ok((decided, request)) => (decided.map_err(BrokerError::from), request),
            Err(e) => (Err(BrokerError::Decision(e)), RunRequest::default()),
        }
    }

    /// The requester's session a `RunInSession`, `RunInSessionWithStdin` or
    /// `RunInSessionInTerminal` names, and the request of its command.
    fn in_session(
        &self,
        peer: &Peer,
        message: ClientMessage,
    ) -> Result<(Arc<crate::decide::sessions::Session>, RunRequest), ErrorReply> {
        let (name, run, streamed, terminal) = match message {
            ClientMessage::RunInSession { session, run } => (session, run, false, None),
            ClientMessage::RunInSessionWithStdin { session, run } => (session, run, true, None),
            ClientMessage::RunInSessionInTerminal { session, run, size } => (session, run, true, Some(size)),
            other => {
                return Err(ErrorReply::new(
                    ErrorKind::ProtocolError,
                    format!("not a session's: {}", other.name()),
                ));
            }
        };
        if streamed && !run.stdin.is_empty() {
            let why = format!(
                "the stdin of a {} comes as stdin messages: its stdin field must be empty",
                if terminal.is_some() { "run_in_session_in_terminal" } else { "run_in_session_with_stdin" }
            );
            return Err(ErrorReply::new(ErrorKind::InvalidRequest, why));
        }
        let session = self.sessions.get(peer.uid, &name)?;
        let request = crate::decide::sessions::command_request(&session.request, run)?;
        Ok((session, RunRequest { stdin_streamed: streamed, terminal, ..request }))
    }

    /// A request marked `stdin_streamed` came as `RunWithStdin`: its client
    /// streams its stdin (a `run`'s flag is never set: it is on no wire).
    /// `session`: the session a `RunInSession` runs in.
    async fn serve_run(
        &self,
        peer: &Peer,
        (request, session): (RunRequest, Option<Arc<crate::decide::sessions::Session>>),
        sink: &mut SocketSink,
        inbound: &mut Inbound,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<RunResult, BrokerError> {
        let (decided, request) = self.decide(peer, request).await;
        let mut decided = decided?;
        let state = if decided.approval.is_some() { "approval" } else { "queued" };
        let session_name = session.as_ref().map(|s| s.info.name.as_str());
        let tracked = self.live.track(decided.run_id, peer.uid, &request.argv, session_name, state);
        // A command of a session runs in its sandbox, which stays in use meanwhile.
        let _in_session = match &session {
            Some(s) => {
                self.broker.join(peer, &mut decided, &request, &s.sandbox)?;
                Some(s.activity.enter())
            }
            None => None,
        };
        if let Some(approval) = &decided.approval {
            let question = self.broker.pending_approval(peer, &decided, &request, approval);
            let answer = self.ask_approval(peer, question, sink, inbound).await?;
            (decided.approver_approved, decided.approved_by) = (answer.by_approver, answer.by_uid);
            tracked.now("queued");
        }
        let slot = self.slot(peer, &decided, inbound, shutdown.clone()).await?;
        tracked.now("running");
        // The run ends early if the client goes away, cancels, or the broker
        // stops; a streamed stdin's pieces reach the command meanwhile.
        let (stdin, pieces) = match request.stdin_streamed {
            true => {
                let (tx, rx) = tokio::sync::mpsc::channel(STDIN_PIECES_QUEUED);
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        sink.set_stdin(pieces);
        let cancel = async {
            let gone = async {
                match stdin {
                    Some(tx) => inbound.client_gone_feeding(tx).await,
                    None => inbound.client_gone().await,
                }
            };
            tokio::select! {
                _ = gone => {}
                _ = shutdown.wait_for(|stop| *stop) => {}
            }
        };
        let result = self.broker.execute(peer, decided, &request, sink, cancel).await;
        drop((slot, tracked));
        result
    }

    /// A run slot for `decided` (see [`super::slots`]): at once, or after a
    /// wait in the fair queue that ends early when the client leaves or the
    /// broker stops. Refused `Busy` (no room in the queue) or `Unavailable`
    /// (a memory share the run cannot meet), with the rule.
    async fn slot(
        &self,
        peer: &Peer,
        decided: &Decided<E::Held>,
        inbound: &mut Inbound,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<Slot, BrokerError> {
        let memory_mb = decided.resolved.cgroup.as_ref().map(|c| c.memory_bytes >> 20);
        let refused = |r: Refused| {
            let kind = if r.busy { ErrorKind::Busy } else { ErrorKind::Unavailable };
            BrokerError::Reply(ErrorReply::with_rule(kind, r.why, r.rule))
        };
        let ticket = match self.slots.take(peer.uid, memory_mb).map_err(refused)? {
            Taken::Now(slot) => return Ok(slot),
            Taken::Queued(ticket) => ticket,
        };
        tracing::debug!(uid = peer.uid, pid = peer.pid, "waiting in the queue for a run slot");
        // A client that leaves the queue frees its place at once.
        tokio::select! {
            slot = ticket.wait() => slot.map_err(refused),
            _ = inbound.client_gone() => {
                tracing::debug!(uid = peer.uid, pid = peer.pid, "a client left the queue");
                Err(BrokerError::Busy("the client left the queue".into()))
            }
            _ = shutdown.wait_for(|stop| *stop) => Err(BrokerError::Busy("the broker is shutting down".into())),
        }
    }

    /// The approvals, the answers and the tools' stages: what a client asks
    /// between runs. `ListApprovals`, `Answer`, `ListTools`, `ApproveTool`.
    async fn control(&self, peer: &Peer, message: ClientMessage) -> Result<ServerMessage, BrokerError> {
        let b = &self.broker;
        match message {
            ClientMessage::ListApprovals => {
                Ok(ServerMessage::Approvals(b.pending.list(&b.settings().approvers, peer)))
            }
            ClientMessage::Answer { approval, approved, reason } => {
                b.pending.answer(&b.settings().approvers, peer, approval, approved, reason)?;
                tracing::info!(uid = peer.uid, approval, approved, "answered an approval");
                Ok(ServerMessage::Answered { approval, approved })
            }
            ClientMessage::ListTools => {
                let broker = b.clone();
                let tools = tokio::task::spawn_blocking(move || broker.tools()).await??;
                Ok(ServerMessage::Tools(tools))
            }
            ClientMessage::ApproveTool { name } => {
                b.settings().approvers.authorize(peer, ApproverAction::ApproveTool(&name))?;
                let (broker, uid) = (b.clone(), peer.uid);
                let info = tokio::task::spawn_blocking(move || broker.approve_tool(&name, uid)).await??;
                Ok(ServerMessage::Tools(vec![info]))
            }
            ClientMessage::Explain(request) => {
                let (broker, peer) = (b.clone(), peer.clone());
                let explained = tokio::task::spawn_blocking(move || broker.explain(&peer, &request)).await?;
                Ok(explained.map_or_else(ServerMessage::Error, |e| ServerMessage::Explained(Box::new(e))))
            }
            ClientMessage::Status => {
                let mut status = self.status(peer);
                if let Some(operations) = status.operations.as_mut() {
                    super::live::name_users(operations).await;
                }
                Ok(ServerMessage::Status(Box::new(status)))
            }
            ClientMessage::ListSessions => self.sessions(peer, None).await,
            ClientMessage::StopSession { session } => self.sessions(peer, Some(session)).await,
            ClientMessage::Publish { session, port } => self.publish(peer, &session, port).await,
            m @ (ClientMessage::ListChanges
            | ClientMessage::ShowChanges { .. }
            | ClientMessage::ApplyChanges { .. }
            | ClientMessage::DiscardChanges { .. }) => self.changes(peer, m).await,
            ClientMessage::RunPlugin { skill, input, inline_module, timeout_ms } => {
                #[cfg(target_os = "linux")]
                if let Some(plugins) = &b.plugins {
                    let request = crate::plugins::CallRequest { skill, input, inline_module, timeout_ms };
                    return Ok(match plugins.call(&b.journal, peer, request).await {
                        Ok(r) => r.into(),
                        Err(e) => ServerMessage::Error(e),
                    });
                }
                let _ = (skill, input, inline_module, timeout_ms);
                Err(unavailable("plugins (Tier A) are"))
            }
            other => Err(BrokerError::Protocol(format!("unexpected message {other:?}"))),
        }
    }

    /// The held change sets: listed, shown, applied or discarded.
    async fn changes(&self, peer: &Peer, message: ClientMessage) -> Result<ServerMessage, BrokerError> {
        #[cfg(target_os = "linux")]
        if let Some(store) = self.broker.executor.changes() {
            let (broker, store, requester) = (self.broker.clone(), store.clone(), peer.requester());
            let approver = broker.settings().approvers.is_approver(peer);
            let serve =
                move || crate::changes::review::serve(&store, &broker.journal, &requester, approver, message);
            return Ok(tokio::task::spawn_blocking(serve).await?);
        }
        let _ = (peer, message);
        Err(unavailable("held change sets are"))
    }

    /// Puts the run to the requester and the approvers, and waits (bounded)
    /// for the first answer: the requester's own `Approve` where it may
    /// answer, or an approver's `Answer` from another connection. The
    /// requester gone, cancelling or refusing, or the time up, refuses the
    /// run; so does anything but an approval. Nothing runs before. The
    /// approval: who gave it.
    async fn ask_approval(
        &self,
        peer: &Peer,
        question: Question,
        sink: &mut SocketSink,
        inbound: &mut Inbound,
    ) -> Result<Answer, BrokerError> {
        let (approval, reason) = (question.approval, question.pending.reason.clone());
        let timeout = Duration::from_secs(question.timeout_secs);
        let mut ticket = self.broker.pending.open(question.pending, Some(question.run));
        let (id, run_id) = (ticket.pending.id, ticket.pending.run_id);
        let may_answer = self
            .broker
            .settings()
            .approvers
            .authorize(peer, ApproverAction::Approve(&ticket.pending, ticket.run.as_deref()))
            .is_ok();
        let asked_event = Event::ApprovalAsked {
            approval: id,
            run_id,
            uid: peer.uid,
            tool: ticket.pending.tool.clone(),
            reason: reason.clone(),
        };
        self.broker.journal.append(asked_event).await?;
        tracing::info!(
            uid = peer.uid,
            pid = peer.pid,
            approval = id,
            may_answer,
            "asking for approval: {reason}"
        );
        let asked = ServerMessage::ApprovalRequired {
            reason: reason.clone(),
            may_answer,
            approval: Box::new(ticket.pending.clone()),
        };
        let answer = if sink.send(asked).await {
            self.await_answer(peer, may_answer, timeout, &mut ticket, sink, inbound).await
        } else {
            Answer { approved: false, by_uid: None, by_approver: false, why: "the client is gone".into() }
        };
        drop(ticket);
        let outcome = if answer.approved { "approved" } else { "not approved" };
        tracing::info!(uid = peer.uid, pid = peer.pid, approval = id, "{outcome} ({}): {reason}", answer.why);
        let answered = Event::ApprovalAnswered {
            approval: id,
            run_id,
            by_uid: answer.by_uid,
            approved: answer.approved,
            why: answer.why.clone(),
        };
        self.broker.journal.append(answered).await?;
        if answer.approved { Ok(answer) } else { Err(not_approved(&approval, &answer.why).into()) }
    }

    /// The first answer to the requester's pending approval, within
    /// `approval_timeout_secs`: see [`Server::ask_approval`].
    async fn await_answer(
        &self,
        peer: &Peer,
        may_answer: bool,
        timeout: Duration,
        ticket: &mut Ticket,
        sink: &mut SocketSink,
        inbound: &mut Inbound,
    ) -> Answer {
        let secs = timeout.as_secs();
        let deadline = tokio::time::Instant::now() + timeout;
        let refused = |why: String| Answer { approved: false, by_uid: None, by_approver: false, why };
        loop {
            let message = tokio::select! {
                a = &mut ticket.answer => return match a {
                    Ok(a) => Answer { approved: a.approved, by_uid: Some(a.by_uid), by_approver: a.by_approver, why: a.why },
                    Err(_) => refused("the approval was withdrawn".into()),
                },
                m = inbound.next() => m,
                _ = tokio::time::sleep_until(deadline) => {
                    return refused(format!("the approval expired after {secs} s without an answer"));
                }
            };
            let by_uid = Some(peer.uid);
            let by_approver = self.broker.settings().approvers.is_approver(peer);
            return match message {
                Ok(Some(ClientMessage::Approve { approved: true })) if may_answer => Answer {
                    approved: true,
                    by_uid,
                    by_approver,
                    why: format!("approved by uid {} (the requester)", peer.uid),
                },
                Ok(Some(ClientMessage::Approve { approved: true })) => {
                    // Told so, and still waiting for an approver.
                    let e = self
                        .broker
                        .settings()
                        .approvers
                        .authorize(peer, ApproverAction::Approve(&ticket.pending, ticket.run.as_deref()));
                    if let Err(e) = e {
                        if !sink.send(e.into()).await {
                            return refused("the client is gone".into());
                        }
                    }
                    continue;
                }
                Ok(Some(ClientMessage::Approve { approved: false })) => {
                    Answer { approved: false, by_uid, by_approver, why: "refused".into() }
                }
                Ok(Some(ClientMessage::Cancel)) => {
                    Answer { approved: false, by_uid, by_approver, why: "cancelled".into() }
                }
                // A terminal's window changed while the question waits: nothing to answer.
                Ok(Some(ClientMessage::Resize(_))) => continue,
                Ok(Some(other)) => refused(format!("the client answered {}", other.name())),
                Ok(None) => refused("the client is gone".into()),
                Err(e) => refused(format!("the client's answer is not a message: {e}")),
            };
        }
    }
}

impl<E: Executor> Server<E> {
    /// Reads the configuration file `path` again ([`Broker::reload`]) and
    /// applies its run slots and request budgets; logs what became of it.
    /// A file that does not load changes nothing: the running
    /// configuration stays, and the log says why, in the file's own words.
    pub async fn reload(&self, path: &Path) {
        let (broker, file) = (self.broker.clone(), path.to_path_buf());
        let reloaded = tokio::task::spawn_blocking(move || broker.reload(&file)).await;
        match reloaded.map_err(|e| e.to_string()).and_then(|r| r) {
            Ok(needs_restart) => {
                for key in needs_restart {
                    tracing::warn!(
                        "{key} changed in {}: it needs a restart; the running value stays",
                        path.display()
                    );
                }
                let settings = self.broker.settings();
                let b = &settings.config().broker;
                self.requests.set_limits(b.request_buffer_bytes, b.request_buffer_bytes_per_uid);
                self.slots.set_limits(Limits::of(b, self.broker.context.serves_others));
                self.reloaded(None);
                tracing::info!(config = %path.display(), "configuration reloaded: new requests are decided with it");
            }
            Err(e) => {
                // Recorded before it is logged: whoever reads the log finds the record.
                self.reloaded(Some(e.clone()));
                let failed = Event::ConfigReloadFailed { path: path.display().to_string(), error: e.clone() };
                if let Err(e) = self.broker.journal.append(failed).await {
                    tracing::error!("the failed reload is not journaled: {e}");
                }
                tracing::error!(
                    config = %path.display(),
                    "configuration not reloaded; the running one stays in force: {e}"
                );
            }
        }
    }

    fn reloaded(&self, error: Option<String>) {
        let unix =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let outcome = ReloadOutcome { unix, ok: error.is_none(), error };
        *self.last_reload.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
    }

    /// The broker's state, for `palisade status`: any peer it serves may
    /// ask; the runs and sessions of others, and a failed reload's reason,
    /// only an operator sees (see [`Operations`]).
    fn status(&self, peer: &Peer) -> BrokerStatus {
        let b = &self.broker;
        let settings = b.settings();
        let unix =
            |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let (pool, cgroup) = b.executor.status();
        let connections = self.connections.lock().unwrap_or_else(|e| e.into_inner()).total;
        let ((running, queued), limits) = (self.slots.counts(), self.slots.limits());
        BrokerStatus {
            version: env!("CARGO_PKG_VERSION").into(),
            protocol: PROTOCOL_VERSION,
            pid: std::process::id(),
            uid: b.context.uid,
            started_unix: unix(self.started),
            uptime_secs: self.started.elapsed().map_or(0, |d| d.as_secs()),
            // Until its sandbox is gone: a run answered before its helper's exit is counted until then.
            runs_in_flight: (running + b.executor.tearing_down()) as u64,
            runs_queued: queued as u64,
            max_concurrent: limits.total as u64,
            max_queued: limits.queued as u64,
            connections: connections as u64,
            approvals_pending: b.pending.count() as u64,
            pool,
            journal: b.journal.dir().map(|dir| JournalHead {
                dir: dir.display().to_string(),
                seq: b.journal.head().map_or(0, |h| h.seq),
                hash: b.journal.head().map_or_else(String::new, |h| h.hash),
            }),
            cgroup,
            config: ConfigStatus {
                file: settings.config().source.as_ref().map(|p| p.display().to_string()),
                loaded_unix: unix(settings.loaded),
                reloads: b.reloads(),
            },
            operations: Some(self.operations(peer, &settings)),
        }
    }

    /// What an operator looks at (see [`Operations`]): all of it for an
    /// operator, the asker's own runs, sessions and share for the others.
    fn operations(&self, peer: &Peer, settings: &crate::decide::settings::Settings) -> Operations {
        let b = &self.broker;
        let operator = peer.uid == 0 || peer.uid == b.context.uid || settings.approvers.is_approver(peer);
        let shown = |uid: u32| operator || uid == peer.uid;
        // Their requesters' names are given by `name_users`, off the runtime's threads.
        let (runs, runs_omitted) = self.live.list(shown);
        let (mut sessions, mut sessions_omitted) = (Vec::new(), 0);
        for (uid, info) in self.sessions.all() {
            if !shown(uid) {
                sessions_omitted += 1;
                continue;
            }
            let age_secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs().saturating_sub(info.started_unix));
            sessions.push(LiveSession { name: info.name, uid, user: None, age_secs, running: info.running });
        }
        let limits = self.slots.limits();
        let requesters = (self.slots.shares().into_iter())
            .filter(|(uid, _)| shown(*uid))
            .map(|(uid, s)| RequesterShare {
                uid,
                running: s.running as u64,
                queued: s.queued as u64,
                memory_mb: s.memory_mb,
            })
            .collect();
        let mut last_reload = self.last_reload.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(r) = last_reload.as_mut().filter(|_| !operator) {
            r.error = None;
        }
        Operations {
            socket: self.socket.get().cloned().unwrap_or_default(),
            system: b.context.serves_others,
            per_uid: PerUidLimits {
                max_concurrent: limits.per_uid as u64,
                max_queued: limits.queued_per_uid as u64,
                max_sessions: settings.config().broker.max_sessions_per_uid as u64,
                max_memory_mb: limits.memory_mb_per_uid,
            },
            requesters,
            runs,
            runs_omitted,
            sessions,
            sessions_omitted,
            last_reload,
        }
    }
}

/// A request whose handling panicked: logged, its client answered
/// `RuntimeFailure` (bounded), and its connection closed, since what it had
/// half done is unknown. Other connections are not touched.
async fn after_panic(peer: &Peer, what: &str, panic: String, sink: &mut SocketSink) {
    tracing::error!(uid = peer.uid, pid = peer.pid, "the handling of {what} panicked: {panic}");
    let e = BrokerError::Internal(format!("{what} of uid {}", peer.uid));
    let _ = tokio::time::timeout(RESULT_SEND_TIMEOUT, sink.send(e.into())).await;
}

/// A refused connection: told why once it said hello (within
/// [`REFUSAL_HELLO_TIMEOUT`]), in its encoding (bincode if it sent nothing
/// to know it by), then closed.
async fn refuse(stream: UnixStream, reply: ErrorReply) {
    let (reader, writer) = stream.into_split();
    let mut inbound = Inbound::new(reader);
    let _ = tokio::time::timeout(REFUSAL_HELLO_TIMEOUT, inbound.next()).await;
    let mut sink = SocketSink::new(writer, inbound.encoding().unwrap_or(Encoding::Bincode));
    let _ = tokio::time::timeout(REFUSAL_HELLO_TIMEOUT, sink.send(ServerMessage::Error(reply))).await;
}

/// A refused connection past [`REFUSING_ROOM`]: told why at once, in the
/// encoding of what it has sent so far (bincode if nothing), without
/// waiting for anything, then closed.
fn refuse_now(stream: UnixStream, reply: ErrorReply) {
    use std::io::{Read, Write};
    // Plain non-blocking calls: the runtime has not polled this socket yet.
    let Ok(mut stream) = stream.into_std() else { return };
    let mut first = [0u8; HELLO_MAX_BYTES];
    let mut decoder = Decoder::default();
    if let Ok(n) = stream.read(&mut first) {
        decoder.push(&first[..n]);
        // Only for the encoding its first byte chose.
        let _ = decoder.next_message::<ClientMessage>();
    }
    let encoding = decoder.encoding().unwrap_or(Encoding::Bincode);
    if let Ok(bytes) = encode(&ServerMessage::Error(reply), encoding) {
        // A new connection's socket buffer has room for a short reply.
        let _ = stream.write(&bytes);
    }
}

/// The outcome of a pending approval as the journal records it.
struct Answer {
    approved: bool,
    /// Who answered; `None` when nobody did (expired, the client gone).
    by_uid: Option<u32>,
    /// Whether that is an approver (see [`crate::decide::approvals::Answer`]).
    by_approver: bool,
    why: String,
}

/// Who is at the other end: SO_PEERCRED's ids and SO_PEERGROUPS's groups
/// (on macOS, getpeereid's ids and no groups: its broker serves its own
/// uid only).
fn peer_of(stream: &UnixStream) -> Option<Peer> {
    let c = stream.peer_cred().map_err(|e| tracing::warn!("no peer credentials: {e}")).ok()?;
    #[cfg(target_os = "linux")]
    let groups = crate::host::requester::Requester::of_peer(stream, c.uid(), c.gid())
        .map_err(|e| tracing::warn!(uid = c.uid(), "no peer groups: {e}"))
        .ok()?
        .groups;
    #[cfg(not(target_os = "linux"))]
    let groups = Vec::new();
    Some(Peer { uid: c.uid(), gid: c.gid(), pid: c.pid(), groups })
}

/// The answer to a request for what this broker's executor does not do.
fn unavailable(what: &str) -> BrokerError {
    let why = format!("{what} not served by palisade on {} yet", std::env::consts::OS);
    BrokerError::Reply(ErrorReply::new(palisade_protocol::wire::ErrorKind::Unavailable, why))
}
