//! The checks every connection passes, by proxy or transparently: the
//! name, the port, the resolution (the plan's hosts first, then DNS) and
//! the refused addresses; then the connection to the first address that
//! takes it.

use super::addr;
use super::refusal::Refusal;
use palisade_policy::EgressPlan;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::net::TcpStream;

/// How long a name may take to resolve.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one address may take to accept a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks that `name` (normalized) and `port` are allowed, resolves the
/// name, and connects to the first acceptable address.
pub async fn open(plan: &EgressPlan, name: &str, port: u16) -> Result<(TcpStream, SocketAddr), Refusal> {
    if !plan.allows(name) {
        return Err(Refusal::DomainNotAllowed(name.to_owned()));
    }
    if !plan.ports.contains(&port) {
        return Err(Refusal::PortNotAllowed { port, fix: plan.port_fix(port) });
    }
    let addresses = acceptable(plan, name, &resolve(plan, name).await?)?;
    let mut why = String::new();
    for ip in addresses {
        let address = SocketAddr::new(ip, port);
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => return Ok((stream, address)),
            Ok(Err(e)) => why = format!("{address}: {e}"),
            Err(_) => why = format!("{address}: no answer within {CONNECT_TIMEOUT:?}"),
        }
    }
    Err(Refusal::ConnectFailed { name: name.to_owned(), why })
}

/// The addresses of `name`: the plan's `hosts`, an address written as the
/// name, or DNS (bounded by [`RESOLVE_TIMEOUT`]). Never empty.
pub async fn resolve(plan: &EgressPlan, name: &str) -> Result<Vec<IpAddr>, Refusal> {
    let failed = |why: String| Refusal::ResolveFailed { name: name.to_owned(), why };
    if let Some(listed) = plan.hosts.get(name) {
        return if listed.is_empty() {
            Err(failed("the plan's hosts list no address".into()))
        } else {
            Ok(listed.clone())
        };
    }
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let found = match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((name, 0))).await {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => return Err(failed(e.to_string())),
        Err(_) => return Err(failed(format!("no answer within {RESOLVE_TIMEOUT:?}"))),
    };
    let mut addresses: Vec<IpAddr> = Vec::new();
    for a in found {
        if !addresses.contains(&a.ip()) {
            addresses.push(a.ip());
        }
    }
    if addresses.is_empty() {
        return Err(failed("no address".into()));
    }
    Ok(addresses)
}

/// The addresses the broker may connect to, in order, canonical (an
/// IPv4-mapped address as IPv4); refused when there is none.
pub fn acceptable(plan: &EgressPlan, name: &str, resolved: &[IpAddr]) -> Result<Vec<IpAddr>, Refusal> {
    let ok: Vec<IpAddr> = resolved
        .iter()
        .filter(|ip| addr::acceptable(**ip, &plan.allow_addresses))
        .map(|ip| ip.to_canonical())
        .collect();
    if ok.is_empty() {
        let addresses = resolved
            .iter()
            .map(|ip| format!("{ip}: {}", addr::refused_class(*ip).unwrap_or("refused")))
            .collect::<Vec<_>>()
            .join(", ");
        // Allowing the first would do: the broker tries them in order.
        let fix = resolved.first().map(|ip| plan.address_fix(*ip)).unwrap_or_default();
        return Err(Refusal::AddressRefused { name: name.to_owned(), addresses, fix });
    }
    Ok(ok)
}
