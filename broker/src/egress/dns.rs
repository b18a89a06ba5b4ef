//! The sandbox's resolver (`/etc/resolv.conf` names it), on UDP and TCP.
//! A and AAAA for allowed names only: in transparent mode the name's pool
//! address (and no AAAA, so clients use it), otherwise the addresses the
//! broker would connect to (CNAME chains flattened to their addresses).
//! `NXDOMAIN` for names not allowed, `REFUSED` for other types and classes
//! and past the query rate.

use super::dnswire::{self, CLASS_IN, Query, Rcode, TYPE_A, TYPE_AAAA, TYPE_PTR, Unanswerable};
use super::limits::Verdict;
use super::refusal::Refusal;
use super::{Run, connect, finished, name};
use palisade_protocol::attest::EgressPath;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

/// Largest UDP query read (EDNS payloads of 4096 are common; a longer
/// datagram is dropped).
pub const UDP_MAX: usize = 4096;
/// How long an answer may be cached: short, the run's view may change.
pub const TTL: u32 = 30;
/// Most addresses in one answer (`dnswire::answer` also keeps it within
/// 512 bytes).
const ANSWERS_MAX: usize = 16;
/// TCP connections to the resolver open at once.
const TCP_CONNECTIONS: usize = 16;
/// A TCP connection to the resolver with no query for this long is closed.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// Answers UDP queries until the run finishes.
pub async fn serve_udp(run: Arc<Run>, socket: UdpSocket, mut stop: watch::Receiver<bool>) {
    let socket = Arc::new(socket);
    let mut pending = JoinSet::new();
    // One byte more than the largest query, to see a longer one.
    let mut buf = vec![0u8; UDP_MAX + 1];
    loop {
        tokio::select! {
            () = finished(&mut stop) => break,
            Some(_) = pending.join_next(), if !pending.is_empty() => {}
            received = socket.recv_from(&mut buf) => match received {
                Ok((n, _)) if n > UDP_MAX => {}
                Ok((n, peer)) => {
                    let (run, socket, msg) = (run.clone(), socket.clone(), buf[..n].to_vec());
                    pending.spawn(async move {
                        if let Some(reply) = respond(&run, &msg).await {
                            let _ = socket.send_to(&reply, peer).await;
                        }
                    });
                }
                Err(e) => tracing::debug!("the resolver's UDP socket: {e}"),
            },
        }
    }
    pending.shutdown().await;
}

/// Answers the length-prefixed queries of one TCP connection.
pub async fn serve_tcp(run: Arc<Run>, mut stream: TcpStream) {
    let Ok(_slot) = run.dns_connections.clone().try_acquire_owned() else {
        return tracing::debug!("too many TCP connections to the resolver");
    };
    loop {
        let query = async {
            let len = usize::from(stream.read_u16().await?);
            let mut msg = vec![0u8; len];
            stream.read_exact(&mut msg).await?;
            std::io::Result::Ok(msg)
        };
        let Ok(Ok(msg)) = tokio::time::timeout(TCP_IDLE, query).await else { return };
        let Some(reply) = respond(&run, &msg).await else { return };
        let mut framed = (reply.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&reply);
        if stream.write_all(&framed).await.is_err() {
            return;
        }
    }
}

/// The semaphore bounding TCP connections to the resolver.
pub fn tcp_connections() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(TCP_CONNECTIONS))
}

/// The answer to one message, or `None` to drop it.
pub async fn respond(run: &Run, msg: &[u8]) -> Option<Vec<u8>> {
    let parsed = dnswire::parse(msg);
    if matches!(parsed, Err(Unanswerable::Drop)) {
        return None;
    }
    // Every answered message counts against the rate, malformed ones too.
    let verdict = run.rate.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
    let query = match (parsed, verdict) {
        (Ok(query), Verdict::Allowed) => query,
        (Ok(query), Verdict::Limited { first }) => {
            if first {
                let refusal = Refusal::RateLimited(super::limits::DNS_RATE);
                run.account.deny(&query.name, 0, EgressPath::Dns, &refusal);
            }
            return Some(dnswire::answer(&query, Rcode::Refused, &[], TTL));
        }
        (Err(Unanswerable::Error { id, flags, rcode }), Verdict::Allowed) => {
            return Some(dnswire::error(id, flags, rcode));
        }
        (Err(_), _) => return None,
    };
    // A reverse lookup of a transparent address names what it stands for
    // (a canonicalization like Kerberos' looks the address up again).
    if query.qtype == TYPE_PTR && query.qclass == CLASS_IN && run.plan.transparent {
        if let Some(name) = dnswire::reverse_v4(&query.name).and_then(|a| run.pool.name_of(a)) {
            return Some(dnswire::ptr_answer(&query, &name, TTL));
        }
    }
    let (rcode, addresses) = match lookup(run, &query).await {
        Ok(addresses) => (Rcode::NoError, addresses),
        Err((rcode, refusal)) => {
            run.account.deny(&query.name, 0, EgressPath::Dns, &refusal);
            (rcode, vec![])
        }
    };
    Some(dnswire::answer(&query, rcode, &addresses, TTL))
}

/// The addresses to answer `query` with, or its code and the refusal.
async fn lookup(run: &Run, query: &Query<'_>) -> Result<Vec<IpAddr>, (Rcode, Refusal)> {
    let name = match name::normalize(&query.name) {
        Ok(name) if run.plan.allows(&name) => name,
        _ => return Err((Rcode::NxDomain, Refusal::DomainNotAllowed(query.name.clone()))),
    };
    if query.qclass != CLASS_IN || !matches!(query.qtype, TYPE_A | TYPE_AAAA) {
        let what = format!("a query of type {} class {} for {name}", query.qtype, query.qclass);
        return Err((Rcode::Refused, Refusal::QueryRefused(what)));
    }
    if run.plan.transparent {
        if query.qtype == TYPE_AAAA {
            return Ok(vec![]);
        }
        return match run.pool.address_for(&name) {
            Some(address) => Ok(vec![IpAddr::V4(address)]),
            None => {
                let why = "the transparent pool has no spare address left".to_owned();
                Err((Rcode::ServFail, Refusal::ResolveFailed { name, why }))
            }
        };
    }
    let resolved = connect::resolve(&run.plan, &name).await.map_err(|r| (Rcode::ServFail, r))?;
    // Every address refused: the name exists, no address is given out.
    let acceptable = match connect::acceptable(&run.plan, &name, &resolved) {
        Ok(acceptable) => acceptable,
        Err(refusal) => {
            run.account.deny(&name, 0, EgressPath::Dns, &refusal);
            return Ok(vec![]);
        }
    };
    let family = |ip: &IpAddr| ip.is_ipv4() == (query.qtype == TYPE_A);
    Ok(acceptable.into_iter().filter(family).take(ANSWERS_MAX).collect())
}
