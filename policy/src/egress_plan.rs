//! Strict egress's plan: what the broker serves on the listeners the helper
//! opens inside the sandbox's network namespace, and what it lets through.
//! The policy builds it (from the profile's or tool's `allow_domains`, the
//! request's narrowing and the `[egress]` table); the broker serves it.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::time::Duration;

/// The proxy's address inside the sandbox (`HTTP_PROXY` and the others name
/// it): squid's customary port, on the sandbox's own loopback.
pub const PROXY_ADDRESS: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 3128);
/// The sandbox's resolver (`/etc/resolv.conf` names it), UDP and TCP.
pub const DNS_ADDRESS: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 53);
/// The transparent pool: one address per allowed name, from here up.
pub const TRANSPARENT_POOL: Ipv4Addr = Ipv4Addr::new(127, 77, 0, 1);

/// One address of the transparent pool and the name it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolEntry {
    pub address: Ipv4Addr,
    /// An exact allowed name, fixed for the run; `None`: a spare address,
    /// given by the resolver to the first name that matches a `*.suffix`
    /// pattern and is not in the pool yet.
    pub name: Option<String>,
}

/// Everything the broker needs to serve a run's strict egress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressPlan {
    /// Allowed names: exact (`pypi.org`) and `*.suffix` patterns, as the
    /// preflight check reads them (`*.github.com` matches `api.github.com`,
    /// not `github.com`). Already narrowed by the request.
    pub domains: Vec<String>,
    /// Ports a connection may go to (`[egress] ports`).
    pub ports: Vec<u16>,
    /// Transparent mode: the resolver answers allowed names with pool
    /// addresses, each with a listener per allowed port.
    pub transparent: bool,
    /// The transparent pool (empty when not transparent).
    pub pool: Vec<PoolEntry>,
    /// Addresses and ranges the broker may connect to although they are
    /// loopback, private, link-local, multicast or unspecified
    /// (`[egress] allow_addresses`).
    pub allow_addresses: Vec<ipnet::IpNet>,
    /// Names the broker resolves from this map before DNS (`[egress] hosts`).
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    /// Connections open at once (proxy and transparent together).
    pub max_connections: u32,
    /// Bytes both ways, every connection of the run together.
    pub max_bytes: u64,
    /// A connection with no byte either way for this long is closed.
    pub idle_timeout: Duration,
}

impl EgressPlan {
    /// Whether `name` (lower case, no trailing dot) is allowed.
    pub fn allows(&self, name: &str) -> bool {
        crate::egress::allowed(name, &self.domains)
    }
}
