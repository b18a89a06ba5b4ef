//! Strict egress, the broker's side (issue 15): the helper opens listening
//! sockets inside the sandbox's network namespace (only loopback there) and
//! hands them over; the broker serves them for the run. A proxy (HTTP
//! CONNECT and plain HTTP), the sandbox's resolver (UDP and TCP), and the
//! transparent listeners whose addresses stand for allowed names. Every
//! connection passes the same checks (`connect.rs`), is bounded by the
//! run's limits (`limits.rs`) and is accounted for (`account.rs`).

mod account;
pub mod addr;
pub mod authority;
pub(crate) mod connect;
pub(crate) mod credentials;
mod dns;
mod dnswire;
mod inspect;
#[cfg(test)]
mod inspect_tests;
mod limits;
mod name;
mod pool;
mod proxy;
pub mod refusal;
mod scrub;
mod sni;
#[cfg(test)]
mod tests;
mod transparent;
mod tunnel;

/// The parsers of what a sandboxed command sends the listeners, for the
/// fuzz targets (`fuzz/`, `scripts/fuzz.sh`): each says whether it parsed.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    pub fn dns_query(msg: &[u8]) -> bool {
        super::dnswire::parse(msg).is_ok()
    }

    pub fn client_hello(buf: &[u8]) -> bool {
        super::sni::parse(buf).is_ok()
    }

    pub fn proxy_request(head: &[u8]) -> bool {
        super::proxy::parse_request(head).is_ok()
    }
}

use account::Account;
use limits::{Quota, Rate, Slots};
use palisade_policy::EgressPlan;
use palisade_protocol::attest::EgressTraffic;
use palisade_protocol::plan::{Listener, ListenerKind};
use pool::Pool;
use std::future::Future;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// The port whose tunnels must show a TLS server name (SNI) naming their host.
const TLS_PORT: u16 = 443;
/// A listener that cannot accept (out of descriptors) waits this long
/// before it tries again, rather than spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// One run's egress service: the tasks serving its listeners.
pub struct Egress {
    finish: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    run: Arc<Run>,
}

/// What every task of a run shares.
struct Run {
    plan: Arc<EgressPlan>,
    account: Account,
    quota: Quota,
    slots: Slots,
    pool: Pool,
    rate: Mutex<Rate>,
    /// TCP connections to the resolver (not counted in `slots`).
    dns_connections: Arc<tokio::sync::Semaphore>,
    /// The port that requires SNI (443; the tests' origins are elsewhere).
    tls_port: u16,
    /// The authority of inspected domains' leaves (`None` when the plan
    /// inspects none).
    authority: Option<Arc<authority::Authority>>,
    /// The credentials of inspected requests, with their values.
    credentials: credentials::Credentials,
}

impl Egress {
    /// Starts serving `listeners` (in the order and kinds the helper sent
    /// them; each fd is a bound, listening TCP socket or a bound UDP socket,
    /// inside the sandbox's namespace) for one run, as tokio tasks. Must be
    /// called within a Tokio runtime.
    /// `authority` is required when the plan inspects a domain.
    pub fn start(
        plan: Arc<EgressPlan>,
        listeners: Vec<(Listener, OwnedFd)>,
        authority: Option<Arc<authority::Authority>>,
    ) -> std::io::Result<Egress> {
        Egress::start_with(plan, listeners, TLS_PORT, authority)
    }

    fn start_with(
        plan: Arc<EgressPlan>,
        listeners: Vec<(Listener, OwnedFd)>,
        tls_port: u16,
        authority: Option<Arc<authority::Authority>>,
    ) -> std::io::Result<Egress> {
        if !plan.inspect.is_empty() && authority.is_none() {
            return Err(std::io::Error::other("the plan inspects domains, and no authority was given"));
        }
        let credentials = credentials::load(&plan).map_err(std::io::Error::other)?;
        let run = Arc::new(Run {
            authority,
            credentials,
            account: Account::default(),
            quota: Quota::new(plan.max_bytes),
            slots: Slots::new(plan.max_connections),
            pool: Pool::new(&plan.pool),
            rate: Mutex::new(Rate::new()),
            dns_connections: dns::tcp_connections(),
            tls_port,
            plan,
        });
        let (finish, _) = watch::channel(false);
        let mut tasks = Vec::with_capacity(listeners.len());
        for (listener, fd) in listeners {
            check_socket(&fd, listener.kind)?;
            let stop = finish.subscribe();
            let task = match listener.kind {
                ListenerKind::DnsUdp => {
                    let socket = std::net::UdpSocket::from(fd);
                    socket.set_nonblocking(true)?;
                    let socket = tokio::net::UdpSocket::from_std(socket)?;
                    tokio::spawn(dns::serve_udp(run.clone(), socket, stop))
                }
                kind => {
                    let socket = tcp_listener(fd)?;
                    let run = run.clone();
                    tokio::spawn(accept_loop(socket, stop, move |stream| {
                        let run = run.clone();
                        async move {
                            match kind {
                                ListenerKind::Proxy => proxy::serve(run, stream).await,
                                ListenerKind::DnsTcp => dns::serve_tcp(run, stream).await,
                                _ => transparent::serve(run, stream, listener).await,
                            }
                        }
                    }))
                }
            };
            tracing::debug!(?listener, "egress listener served");
            tasks.push(task);
        }
        Ok(Egress { finish, tasks, run })
    }

    /// Stops every task and connection of the run and returns what it
    /// reached and was refused.
    pub async fn finish(self) -> EgressTraffic {
        self.finish.send_replace(true);
        for task in self.tasks {
            if let Err(e) = task.await {
                tracing::error!("an egress task failed: {e}");
            }
        }
        self.run.account.traffic(self.run.quota.is_exceeded())
    }
}

/// Refuses a descriptor that is not the socket its record says: a bound
/// UDP socket for the resolver's UDP listener, a listening TCP socket for
/// the others (a mismatch would fail every accept, forever).
fn check_socket(fd: &OwnedFd, kind: ListenerKind) -> std::io::Result<()> {
    use nix::sys::socket::{SockType, getsockopt, sockopt};
    let mismatch = |what: &str| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("the {kind:?} listener is {what}"))
    };
    let ty = getsockopt(fd, sockopt::SockType).map_err(std::io::Error::from)?;
    match kind {
        ListenerKind::DnsUdp if ty != SockType::Datagram => Err(mismatch("not a UDP socket")),
        ListenerKind::DnsUdp => Ok(()),
        _ if ty != SockType::Stream => Err(mismatch("not a TCP socket")),
        _ if !getsockopt(fd, sockopt::AcceptConn).map_err(std::io::Error::from)? => {
            Err(mismatch("not listening"))
        }
        _ => Ok(()),
    }
}

fn tcp_listener(fd: OwnedFd) -> std::io::Result<TcpListener> {
    let listener = std::net::TcpListener::from(fd);
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

/// Resolves when the run is finished (or its `Egress` dropped).
async fn finished(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|finished| *finished).await;
}

/// Accepts connections until the run finishes, each served by `serve` as a
/// task of its own; at the end every connection still open is stopped
/// (its bytes are counted all the same: see `account::Flow`).
async fn accept_loop<F, Fut>(listener: TcpListener, mut stop: watch::Receiver<bool>, serve: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = finished(&mut stop) => break,
            Some(ended) = connections.join_next(), if !connections.is_empty() => {
                if let Err(e) = ended {
                    tracing::error!("an egress connection failed: {e}");
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve(stream));
                }
                Err(e) => {
                    tracing::warn!("egress listener cannot accept: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
    connections.shutdown().await;
}
