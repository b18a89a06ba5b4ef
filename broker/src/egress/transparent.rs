//! A transparent listener: a tool that ignores the proxy variables
//! connects to the address the sandbox's resolver gave it for a name. The
//! address the connection came to (its local address, so one listener on
//! a wildcard address would serve the whole pool) says the name; the port
//! is the one the helper's record names for the listener (the port the
//! sandbox dialled). Then the proxy's checks, SNI on the TLS port, and the
//! tunnel.

use super::inspect::{self, Inspected};
use super::refusal::Refusal;
use super::{Run, connect, sni, tunnel};
use palisade_protocol::attest::EgressPath;
use palisade_protocol::plan::Listener;
use std::net::IpAddr;
use std::sync::Arc;
use tokio::net::TcpStream;

/// Serves one connection to a transparent listener; a refusal closes it.
pub async fn serve(run: Arc<Run>, mut client: TcpStream, listener: Listener) {
    let port = listener.port;
    let local = match client.local_addr() {
        Ok(local) => local.ip(),
        Err(e) => return tracing::debug!("a transparent connection without its address: {e}"),
    };
    let name = match local.to_canonical() {
        IpAddr::V4(v4) => run.pool.name_of(v4),
        IpAddr::V6(_) => None,
    };
    let Some(name) = name else {
        let refusal = Refusal::DomainNotAllowed(format!("{local} (an address no name was given)"));
        return run.account.deny(&local.to_string(), port, EgressPath::Transparent, &refusal);
    };
    if let Err(refusal) = forward(&run, &mut client, &name, port).await {
        run.account.deny(&name, port, EgressPath::Transparent, &refusal);
    }
}

async fn forward(run: &Run, client: &mut TcpStream, name: &str, port: u16) -> Result<(), Refusal> {
    let _slot = run.slots.admit(&run.quota)?;
    if let Some(closed) = run.credentials.closed() {
        return Err(Refusal::RequestNotAllowed(closed));
    }
    // The server name first: a mismatch never reaches the origin.
    let prefix = if port == run.tls_port { sni::expect(client, Vec::new(), name).await? } else { Vec::new() };
    let (mut origin, address) = connect::open(&run.plan, name, port).await?;
    if run.plan.inspects(name) {
        let to = Inspected { name, port, via: EgressPath::Transparent, tls: None };
        inspect::serve(run, client, prefix, origin, address, to).await;
        return Ok(());
    }
    let flow = run.account.reached(name, port, address, EgressPath::Transparent);
    let end = tunnel::relay(client, &mut origin, &prefix, &run.quota, &flow, run.plan.idle_timeout).await;
    tracing::debug!(host = name, port, ?end, "transparent connection ended");
    Ok(())
}
