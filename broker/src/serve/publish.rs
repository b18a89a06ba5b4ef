//! A session's published ports (`Publish`): for each, a Unix socket on the
//! host that only the session's requester may connect to (the file is
//! theirs, mode 0600, and the broker checks each peer's uid as well), each
//! connection relayed to the port on the session's own loopback, until the
//! session ends. Nothing else of the session's network changes: the
//! broker connects from inside it, with a socket the executor makes there.
//! The sockets live in a directory of the broker's beside its own socket
//! (`palisade.sock` → `palisade.published/`), made (0711: others may pass,
//! not list) when it starts serving and emptied as it starts and stops.

use crate::decide::sessions::Session;
use crate::engine::executor::Executor;
use crate::error::BrokerError;
use crate::host::peer::Peer;
use crate::serve::server::Server;
use palisade_protocol::wire::{ErrorKind, ErrorReply, PublishedPort, ServerMessage};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpSocket, TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;

/// Ports one session may publish.
pub const MAX_PUBLISHED_PER_SESSION: usize = 16;
/// Connections relayed at once to one published port; more are closed.
pub const MAX_CONNECTIONS_PER_PORT: usize = 64;
/// The longest path of a Unix socket, its terminating NUL aside.
const SOCKET_PATH_MAX: usize = 107;

fn refused(kind: ErrorKind, why: impl Into<String>) -> BrokerError {
    ErrorReply::with_rule(kind, why, "session.publish").into()
}

/// The directory of published sockets of a broker listening on `socket`,
/// made (or emptied of what an earlier broker left): `None`, and why, if it
/// cannot be the broker's own.
pub fn prepare_dir(socket: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let dir = socket.with_extension("published");
    match std::fs::DirBuilder::new().mode(0o711).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() {
                return Err(format!("{} is not a directory of the broker's own", dir.display()));
            }
            for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?.flatten() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    }
    // The umask took some of 0711 away.
    let mode = std::fs::Permissions::from_mode(0o711);
    std::fs::set_permissions(&dir, mode).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// Listens on `path` for the requester `uid` alone: the socket is theirs,
/// mode 0600 (made without write permission for anyone but the broker
/// before that, whatever the umask).
fn listen_for(path: &Path, uid: u32) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    let closed = std::fs::Permissions::from_mode(0o600);
    std::fs::set_permissions(path, closed)?;
    std::os::unix::fs::chown(path, Some(uid), None)?;
    Ok(listener)
}

impl<E: Executor> Server<E> {
    /// Makes the directory of the sessions' published sockets beside the
    /// socket `listener` listens on, where it has a path; that directory.
    pub(super) fn publish_beside(&self, listener: &UnixListener) -> Option<std::path::PathBuf> {
        let addr = listener.local_addr().ok()?;
        match prepare_dir(addr.as_pathname()?) {
            Ok(dir) => {
                // Out of every run's reach, as the broker's socket is (where
                // the socket's directory is a shared one, it is not).
                self.broker.keep_out_of_reach(&dir, "the sessions' published sockets");
                let _ = self.published_dir.set(dir.clone());
                Some(dir)
            }
            Err(e) => {
                tracing::warn!("sessions publish no port: {e}");
                None
            }
        }
    }

    /// `Publish`: answered once the socket listens (a port another request
    /// is publishing already: with its socket, at once).
    pub(super) async fn publish(
        &self,
        peer: &Peer,
        name: &str,
        port: u16,
    ) -> Result<ServerMessage, BrokerError> {
        let session = self.sessions.get(peer.uid, name)?;
        let answer = |socket: &str| {
            let socket = socket.to_string();
            Ok(ServerMessage::Published(PublishedPort { session: name.to_string(), port, socket }))
        };
        let dir = self.published_dir.get().ok_or_else(|| {
            let why = "this broker publishes no port: it listens on no socket of a path of its own, \
                       beside which the published ones would be";
            refused(ErrorKind::Unavailable, why)
        })?;
        // Taken under one lock: two publishes of a port never bind twice.
        let socket = match take_port(&session, dir, port)? {
            Taken::Already(socket) => return answer(&socket),
            Taken::Now(path) => path,
        };
        let listened = self.listen(peer, &session, &socket).await;
        let listener = listened.inspect_err(|_| {
            session.published.lock().unwrap_or_else(|e| e.into_inner()).remove(&port);
        })?;
        let shown = socket.display().to_string();
        tracing::info!(uid = peer.uid, session = name, port, socket = shown, "published");
        tokio::spawn(serve_port(self.broker.clone(), session, listener, port));
        answer(&shown)
    }

    /// The listener of the published socket `path` of `session`, once its
    /// network is reached (the session has a network of its own).
    async fn listen(
        &self,
        peer: &Peer,
        session: &Arc<Session>,
        path: &Path,
    ) -> Result<UnixListener, BrokerError> {
        let (broker, probe) = (self.broker.clone(), session.clone());
        tokio::task::spawn_blocking(move || broker.executor.loopback_sockets(&probe.sandbox)).await??;
        listen_for(path, peer.uid).map_err(|e| {
            BrokerError::from(ErrorReply::new(ErrorKind::RuntimeFailure, format!("{}: {e}", path.display())))
        })
    }
}

/// A port of a session: published already (its socket), or taken now for
/// the socket at this path.
enum Taken {
    Already(String),
    Now(PathBuf),
}

/// Takes `port` of `session` for publishing, if it may be published.
fn take_port(session: &Session, dir: &Path, port: u16) -> Result<Taken, BrokerError> {
    if port == 0 {
        return Err(refused(
            ErrorKind::InvalidRequest,
            "port 0 is no port: publish the one the server listens on",
        ));
    }
    let path = dir.join(format!("{}.{}.{port}.sock", session.uid, session.info.name));
    if path.as_os_str().len() > SOCKET_PATH_MAX {
        let why = format!(
            "the published socket's path {} is longer than a Unix socket's {SOCKET_PATH_MAX} bytes: \
             give the session a shorter name",
            path.display()
        );
        return Err(refused(ErrorKind::InvalidRequest, why));
    }
    let mut published = session.published.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(socket) = published.get(&port) {
        return Ok(Taken::Already(socket.clone()));
    }
    if published.len() >= MAX_PUBLISHED_PER_SESSION {
        let why = format!(
            "the session has published {MAX_PUBLISHED_PER_SESSION} ports, the most one session may \
             publish: start another session for more"
        );
        return Err(refused(ErrorKind::InvalidRequest, why));
    }
    published.insert(port, path.display().to_string());
    Ok(Taken::Now(path))
}
/// Accepts the requester's connections to the published `port` until the
/// session ends; then the socket goes, and every relay with it.
async fn serve_port<E: Executor>(
    broker: Arc<crate::decide::service::Broker<E>>,
    session: Arc<Session>,
    listener: UnixListener,
    port: u16,
) {
    let mut relays = tokio::task::JoinSet::new();
    let room = Arc::new(Semaphore::new(MAX_CONNECTIONS_PER_PORT));
    let (uid, name) = (session.uid, session.info.name.clone());
    loop {
        tokio::select! {
            () = session.ended() => break,
            Some(_) = relays.join_next(), if !relays.is_empty() => {}
            accepted = listener.accept() => {
                let conn = match accepted {
                    Ok((conn, _)) => conn,
                    Err(e) => {
                        tracing::warn!(uid, session = name, port, "accepting a published connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let peer = conn.peer_cred().map(|c| c.uid());
                if peer.as_ref().ok() != Some(&uid) {
                    tracing::warn!(uid, session = name, port, ?peer, "refused a published connection of another uid");
                    continue;
                }
                let Ok(permit) = room.clone().try_acquire_owned() else {
                    tracing::warn!(uid, session = name, port, "published port busy: connection closed");
                    continue;
                };
                relays.spawn(relay(broker.clone(), session.clone(), conn, port, permit));
            }
        }
    }
    // Removed here if the session's own end did not take it first (a port
    // published as the session ended).
    crate::decide::sessions::withdraw(&session.published, Some(port));
}

/// Relays `conn` to `port` on the session's loopback (127.0.0.1, else ::1)
/// until either side closes. Nothing reached: `conn` is closed.
async fn relay<E: Executor>(
    broker: Arc<crate::decide::service::Broker<E>>,
    session: Arc<Session>,
    mut conn: UnixStream,
    port: u16,
    _room: tokio::sync::OwnedSemaphorePermit,
) {
    session.activity.touch();
    let within = session.clone();
    let sockets =
        tokio::task::spawn_blocking(move || broker.executor.loopback_sockets(&within.sandbox)).await;
    let sockets = match sockets {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return tracing::warn!(session = session.info.name, port, "{}", e.message),
        Err(e) => return tracing::warn!(session = session.info.name, port, "{e}"),
    };
    let Some(mut tcp) = connect(sockets, port).await else { return };
    let _ = tokio::io::copy_bidirectional(&mut conn, &mut tcp).await;
    session.activity.touch();
}

/// The first of `sockets` that connects to `port` on its loopback.
async fn connect(sockets: Vec<OwnedFd>, port: u16) -> Option<TcpStream> {
    for fd in sockets {
        let std = std::net::TcpStream::from(fd);
        let v6 = std.local_addr().is_ok_and(|a| a.is_ipv6());
        let ip = if v6 { std::net::Ipv6Addr::LOCALHOST.into() } else { std::net::Ipv4Addr::LOCALHOST.into() };
        if std.set_nonblocking(true).is_err() {
            continue;
        }
        if let Ok(tcp) = TcpSocket::from_std_stream(std).connect(SocketAddr::new(ip, port)).await {
            return Some(tcp);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_directory_is_the_brokers_own_and_starts_empty() {
        let tmp = std::env::temp_dir().join(format!("palisade-publish-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let socket = tmp.join("palisade.sock");
        let dir = prepare_dir(&socket).unwrap();
        assert_eq!(dir, tmp.join("palisade.published"));
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o711);
        // What an earlier broker left goes.
        std::fs::write(dir.join("0.old.80.sock"), b"").unwrap();
        assert_eq!(prepare_dir(&socket).unwrap(), dir);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        // A link in its place is not the broker's directory.
        std::fs::remove_dir(&dir).unwrap();
        std::os::unix::fs::symlink("/tmp", &dir).unwrap();
        let e = prepare_dir(&socket).unwrap_err();
        assert!(e.contains("is not a directory of the broker's own"), "{e}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
