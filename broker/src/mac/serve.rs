//! `palisaded` on macOS: [`Mac`] served on a Unix socket, in the protocol
//! of `docs/protocol.md`. A connection says hello, then sends runs one
//! after another; `Cancel`, or closing the connection, kills the run in
//! progress. The requests of the Linux broker that this one does not serve
//! (approvals, tools, plugins) are answered `Unavailable`, and the
//! connection goes on.

use super::Mac;
use crate::engine::stream::Sink;
use crate::serve::budget::RequestBudget;
use crate::serve::socket::{HELLO_TIMEOUT, Inbound, SocketSink, check_hello};
use palisade_protocol::wire::{
    ClientMessage, Encoding, ErrorKind, ErrorReply, PROTOCOL_VERSION, ServerHello, ServerMessage,
};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

/// The limits of `[broker]` this broker applies.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub max_concurrent: usize,
    pub max_queued: usize,
    pub idle_timeout: Duration,
    pub request_buffer_bytes: usize,
    pub request_buffer_bytes_per_uid: usize,
    pub frame_timeout: Duration,
}

impl Limits {
    pub fn of(config: &palisade_policy::config::BrokerConfig) -> Limits {
        Limits {
            max_connections: config.max_connections,
            max_concurrent: config.max_concurrent,
            max_queued: config.max_queued,
            idle_timeout: Duration::from_secs(config.idle_timeout_secs),
            request_buffer_bytes: config.request_buffer_bytes,
            request_buffer_bytes_per_uid: config.request_buffer_bytes_per_uid,
            frame_timeout: Duration::from_secs(config.frame_timeout_secs),
        }
    }
}

/// What connections share.
struct Shared {
    mac: Mac,
    limits: Limits,
    /// The uid served: the broker's own.
    uid: u32,
    connections: Arc<Semaphore>,
    /// Runs running or waiting to.
    admitted: Arc<Semaphore>,
    /// Runs running.
    running: Semaphore,
    /// The bytes of requests held for the clients.
    requests: Arc<RequestBudget>,
}

/// Serves `listener` until `shutdown` completes; the connections are then
/// dropped, and with them the runs in progress (a run dropped kills every
/// process of it, see `seatbelt::Group`).
pub async fn serve(mac: Mac, limits: Limits, listener: UnixListener, shutdown: impl Future<Output = ()>) {
    let shared = Arc::new(Shared {
        mac,
        limits,
        uid: nix::unistd::geteuid().as_raw(),
        connections: Arc::new(Semaphore::new(limits.max_connections)),
        admitted: Arc::new(Semaphore::new(limits.max_concurrent + limits.max_queued)),
        running: Semaphore::new(limits.max_concurrent),
        requests: RequestBudget::new(limits.request_buffer_bytes, limits.request_buffer_bytes_per_uid),
    });
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tasks.spawn(connection(Arc::clone(&shared), stream));
                }
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            _ = &mut shutdown => break,
        }
    }
    tasks.shutdown().await;
}

async fn connection(shared: Arc<Shared>, stream: UnixStream) {
    let Ok(cred) = stream.peer_cred() else { return };
    let peer = (cred.uid(), cred.gid(), cred.pid());
    let (reader, writer) = stream.into_split();
    let draw = shared.requests.draw(peer.0);
    let mut inbound = Inbound::budgeted(reader, draw);
    let hello = tokio::time::timeout(HELLO_TIMEOUT, inbound.next()).await;
    let encoding = inbound.encoding().unwrap_or(Encoding::Bincode);
    let mut sink = SocketSink::new(writer, encoding);
    let refusal = match hello {
        Err(_) => Some(format!("no hello within {} s", HELLO_TIMEOUT.as_secs())),
        Ok(Err(e)) => Some(e.to_string()),
        Ok(Ok(None)) => return,
        Ok(Ok(Some(ClientMessage::Hello(h)))) => check_hello(&h, encoding).err(),
        Ok(Ok(Some(_))) => Some("the first message must be a hello".into()),
    };
    let refusal = refusal.map(|m| ErrorReply::new(ErrorKind::ProtocolError, m)).or_else(|| {
        let why = format!(
            "palisaded on macOS serves its own user (uid {}) only; uid {} is not",
            shared.uid, peer.0
        );
        (peer.0 != shared.uid).then(|| ErrorReply::new(ErrorKind::Unauthorized, why))
    });
    // Held until the connection ends: it counts against `max_connections`.
    let counted = Arc::clone(&shared.connections).try_acquire_owned();
    let refusal = refusal.or_else(|| {
        let busy = format!("{} connections are open; try again later", shared.limits.max_connections);
        counted.is_err().then(|| ErrorReply::new(ErrorKind::Busy, busy))
    });
    if let Some(e) = refusal {
        tracing::info!(uid = peer.0, "refused: {}", e.message);
        sink.send(ServerMessage::Error(e)).await;
        return;
    }
    inbound.greeted(shared.limits.frame_timeout);
    let broker = format!("palisaded {} (macOS)", env!("CARGO_PKG_VERSION"));
    if !sink.send(ServerMessage::Hello(ServerHello { version: PROTOCOL_VERSION, broker, encoding })).await {
        return;
    }
    loop {
        let next = tokio::time::timeout(shared.limits.idle_timeout, inbound.next()).await;
        let reply = match next {
            Err(_) | Ok(Ok(None)) => return,
            Ok(Err(e)) => {
                sink.send(ServerMessage::Error(ErrorReply::new(e.kind(), e.to_string()))).await;
                return;
            }
            Ok(Ok(Some(ClientMessage::Run(request)))) => {
                let ran = run(&shared, peer, &request, &mut sink, &mut inbound).await;
                inbound.run_done();
                match ran {
                    Ok(result) => ServerMessage::Finished(Box::new(result)),
                    Err(e) => ServerMessage::Error(e),
                }
            }
            Ok(Ok(Some(ClientMessage::Cancel))) => continue,
            Ok(Ok(Some(ClientMessage::Hello(_)))) => {
                sink.send(ServerMessage::Error(ErrorReply::new(
                    ErrorKind::ProtocolError,
                    "hello sent twice",
                )))
                .await;
                return;
            }
            Ok(Ok(Some(other))) => ServerMessage::Error(unserved(&other)),
        };
        if !sink.send(reply).await {
            return;
        }
    }
}

/// One run, admitted within `max_concurrent` running and `max_queued`
/// waiting. A client that leaves while it waits frees its place at once,
/// and one that leaves while it runs ends the run.
async fn run(
    shared: &Shared,
    peer: super::Peer,
    request: &palisade_protocol::wire::RunRequest,
    sink: &mut SocketSink,
    inbound: &mut Inbound,
) -> Result<palisade_protocol::wire::RunResult, ErrorReply> {
    let Ok(_admitted) = Arc::clone(&shared.admitted).try_acquire_owned() else {
        let why = format!(
            "{} runs are running or waiting; try again later",
            shared.limits.max_concurrent + shared.limits.max_queued
        );
        return Err(ErrorReply::new(ErrorKind::Busy, why));
    };
    let _running = tokio::select! {
        running = shared.running.acquire() => running.map_err(|_| ErrorReply::new(ErrorKind::Busy, "shutting down"))?,
        _ = inbound.client_gone() => {
            tracing::debug!(uid = peer.0, "a client left the queue");
            return Err(ErrorReply::new(ErrorKind::Busy, "the client left the queue"));
        }
    };
    shared.mac.run(peer, request, sink, inbound.client_gone()).await
}

/// The answer to a request the Linux broker serves and this one does not.
fn unserved(message: &ClientMessage) -> ErrorReply {
    let what = match message {
        ClientMessage::Approve { .. } => "no run is waiting for approval",
        ClientMessage::RunPlugin { .. } => "plugins (Tier A) are not served by palisade on macOS yet",
        ClientMessage::ListTools | ClientMessage::ApproveTool { .. } => {
            "tools' trust stages are not served by palisade on macOS yet"
        }
        ClientMessage::Status => "status is not served by palisade on macOS yet",
        _ => "approvals are not served by palisade on macOS yet",
    };
    let kind = if matches!(message, ClientMessage::Approve { .. }) {
        ErrorKind::ProtocolError
    } else {
        ErrorKind::Unavailable
    };
    ErrorReply::new(kind, what)
}
