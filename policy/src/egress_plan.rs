//! Strict egress's plan: what the broker serves on the listeners the helper
//! opens inside the sandbox's network namespace, and what it lets through.
//! The policy builds it (from the profile's or tool's `allow_domains`, the
//! request's narrowing and the `[egress]` table); the broker serves it.

use crate::capabilities::NetworkCapability;
use crate::config::{EgressConfig, host_name};
use crate::denial::Denial;
use crate::inspect::{CredentialGrant, Inspection, RequestRule};
use palisade_protocol::wire::ErrorKind;
use palisade_protocol::{Listener, ListenerKind, PLAN_MAX_LISTENERS};
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
    /// Allowed names whose connections the broker decrypts and whose
    /// requests it checks (exact and `*.suffix`, within `domains`).
    pub inspect: Vec<String>,
    /// The rules on inspected requests.
    pub requests: Vec<RequestRule>,
    /// The trust roots for inspected origins (`[egress] ca_bundle`);
    /// `None`: the host's.
    pub ca_bundle: Option<std::path::PathBuf>,
    /// Credentials the proxy adds to inspected requests.
    pub credentials: Vec<Credential>,
    /// The broker's secret store (`[plugins] secrets_dir`; `None`: the
    /// state directory's).
    pub secrets_dir: Option<std::path::PathBuf>,
}

/// A credential of the run: its grant, and (for an `env` grant) the
/// placeholder the broker gives the run, unique to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub grant: CredentialGrant,
    /// Set by the broker when the run starts; empty until then.
    pub placeholder: String,
}

impl EgressPlan {
    /// Whether `name` (lower case, no trailing dot) is allowed.
    pub fn allows(&self, name: &str) -> bool {
        crate::egress::allowed(name, &self.domains)
    }

    /// Whether the broker decrypts connections to `name`.
    pub fn inspects(&self, name: &str) -> bool {
        crate::egress::allowed(name, &self.inspect)
    }
}

/// Spare pool addresses when a `*.suffix` pattern is allowed: names below
/// it that the resolver is asked for get one each, first come, for the run.
pub const SPARE_POOL_ADDRESSES: usize = 16;
/// `HTTP_PROXY` and its kin name the proxy as a URL.
const PROXY_URL: &str = "http://127.0.0.1:3128";
/// Loopback itself is never proxied: a tool's own local servers stay local.
const NO_PROXY: &str = "localhost,127.0.0.1,::1";

impl EgressPlan {
    /// Builds the plan for `domains` (already narrowed by the request) under
    /// `[egress]`: in transparent mode, one pool address per exact name, in
    /// sorted order from [`TRANSPARENT_POOL`] up, then the spare ones when a
    /// `*.suffix` is allowed. Refused when its listeners would not fit in a
    /// plan.
    pub fn new(
        config: &EgressConfig,
        domains: &[String],
        inspection: &Inspection,
    ) -> Result<EgressPlan, Denial> {
        let mut domains: Vec<String> = domains.iter().map(|d| host_name(d)).collect();
        domains.sort();
        domains.dedup();
        let mut ports = config.ports.clone();
        ports.dedup();
        let pool = if config.transparent { pool(&domains) } else { vec![] };
        let plan = EgressPlan {
            domains,
            ports,
            transparent: config.transparent,
            pool,
            allow_addresses: config.allowed_addresses(),
            hosts: config.host_map(),
            max_connections: config.max_connections,
            max_bytes: config.max_bytes,
            idle_timeout: Duration::from_secs(config.idle_timeout_secs),
            inspect: inspection.domains.iter().map(|d| host_name(d)).collect(),
            requests: inspection.requests.clone(),
            ca_bundle: config.ca_bundle.clone(),
            credentials: inspection
                .credentials
                .iter()
                .map(|grant| Credential { grant: grant.clone(), placeholder: String::new() })
                .collect(),
            secrets_dir: None,
        };
        let count = plan.listener_count();
        if count > PLAN_MAX_LISTENERS {
            return Err(Denial::new(
                ErrorKind::InvalidRequest,
                "egress.too_many_listeners",
                format!(
                    "strict egress would need {count} listeners ({} pool addresses × {} ports, the proxy and \
                     the resolver); a plan carries at most {PLAN_MAX_LISTENERS}: allow fewer names or \
                     ports, or set [egress] transparent = false",
                    plan.pool.len(),
                    plan.ports.len()
                ),
            ));
        }
        Ok(plan)
    }

    fn listener_count(&self) -> usize {
        FIXED_LISTENERS.saturating_add(self.pool.len().saturating_mul(self.ports.len()))
    }

    /// The sockets the helper opens for the broker: the proxy, the resolver
    /// (UDP and TCP) and, in transparent mode, one per pool address and port.
    pub fn listeners(&self) -> Vec<Listener> {
        let at = |kind, a: SocketAddrV4| Listener { kind, address: *a.ip(), port: a.port() };
        let mut out = vec![
            at(ListenerKind::Proxy, PROXY_ADDRESS),
            at(ListenerKind::DnsUdp, DNS_ADDRESS),
            at(ListenerKind::DnsTcp, DNS_ADDRESS),
        ];
        for entry in &self.pool {
            out.extend(self.ports.iter().map(|&port| Listener {
                kind: ListenerKind::Transparent,
                address: entry.address,
                port,
            }));
        }
        out
    }

    /// The ports a sandboxed process may connect to (Landlock): the proxy's,
    /// the resolver's and the allowed ones (the transparent listeners').
    pub fn connect_ports(&self) -> Vec<u16> {
        let mut ports = vec![PROXY_ADDRESS.port(), DNS_ADDRESS.port()];
        ports.extend(&self.ports);
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// The proxy variables, upper and lower case.
    pub fn env() -> Vec<(String, String)> {
        let vars = [
            ("HTTP_PROXY", PROXY_URL),
            ("HTTPS_PROXY", PROXY_URL),
            ("ALL_PROXY", PROXY_URL),
            ("NO_PROXY", NO_PROXY),
        ];
        vars.iter()
            .flat_map(|(k, v)| [(k.to_string(), v.to_string()), (k.to_ascii_lowercase(), v.to_string())])
            .collect()
    }

    /// `/etc/resolv.conf` inside the sandbox: its own resolver only.
    pub fn resolv_conf() -> String {
        format!("nameserver {}\n", DNS_ADDRESS.ip())
    }
}

/// The proxy, and the resolver on UDP and TCP.
const FIXED_LISTENERS: usize = 3;

/// The transparent pool for sorted `domains`.
fn pool(domains: &[String]) -> Vec<PoolEntry> {
    let exact = domains.iter().filter(|d| !d.starts_with("*.")).map(|d| Some(d.clone()));
    let spare = if domains.iter().any(|d| d.starts_with("*.")) { SPARE_POOL_ADDRESSES } else { 0 };
    let first = u32::from(TRANSPARENT_POOL);
    exact
        .chain(std::iter::repeat_n(None, spare))
        .enumerate()
        .map(|(i, name)| PoolEntry { address: Ipv4Addr::from(first.saturating_add(i as u32)), name })
        .collect()
}

/// Narrows `network` to the names a request asks for (`None`: unchanged):
/// each must lie within the profile's list. A profile with `allow_all` is
/// narrowed to exactly those names; one with `deny` grants none.
pub fn narrow(network: &NetworkCapability, asked: Option<&[String]>) -> Result<NetworkCapability, Denial> {
    let Some(asked) = asked else { return Ok(network.clone()) };
    let granted: &[String] = match network {
        NetworkCapability::AllowAll => {
            return Ok(NetworkCapability::AllowDomains(asked.iter().map(|d| host_name(d)).collect()));
        }
        NetworkCapability::AllowDomains(d) => d,
        NetworkCapability::Deny => &[],
    };
    let mut out = Vec::new();
    for name in asked {
        let name = host_name(name);
        if !crate::egress::within(&name, granted) {
            let why = format!("the request asks for {name}, which its network ({network}) does not grant");
            let key = format!("network = {{ allow_domains = [\"{name}\"] }}");
            let denial = Denial::new(ErrorKind::CapabilityDenied, "egress.domain_not_granted", why);
            return Err(denial.with_fix(Some(format!("--allow-domain {name}")), key));
        }
        if !out.contains(&name) {
            out.push(name);
        }
    }
    Ok(NetworkCapability::AllowDomains(out))
}
