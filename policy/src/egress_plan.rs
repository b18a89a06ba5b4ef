//! Strict egress's plan: what the broker serves on the listeners the helper
//! opens inside the sandbox's network namespace, and what it lets through.
//! The policy builds it (from the profile's or tool's `allow_domains`, the
//! request's narrowing and the `[egress]` table); the broker serves it.

use crate::capabilities::NetworkCapability;
use crate::config::{EgressConfig, host_name};
use crate::denial::Denial;
use crate::inspect::{CredentialGrant, Inspection, RequestRule};
use palisade_protocol::wire::{ErrorKind, RunRequest};
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
    /// Allowed names: exact (`pkgs.example.org`) and `*.suffix` patterns, as the
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
    /// The policy is the requester's own to widen (the CLI's embedded
    /// broker, whose flags edit it): a refused port or address names the
    /// flag that allows it beside the key ([`EgressPlan::port_fix`]).
    pub own: bool,
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
            own: false,
        };
        plan.fits()
    }

    /// The plan, refused when its listeners would not fit in a plan.
    fn fits(self) -> Result<EgressPlan, Denial> {
        let count = self.listener_count();
        if count > PLAN_MAX_LISTENERS {
            return Err(Denial::new(
                ErrorKind::InvalidRequest,
                "egress.too_many_listeners",
                format!(
                    "strict egress would need {count} listeners ({} pool addresses × {} ports, the proxy and \
                     the resolver); a plan carries at most {PLAN_MAX_LISTENERS}: allow fewer names or \
                     ports, or set [egress] transparent = false",
                    self.pool.len(),
                    self.ports.len()
                ),
            ));
        }
        Ok(self)
    }

    /// The plan with the request's [`Reach`]: where the policy is the
    /// requester's own to widen, its ports and addresses are added (those
    /// of an embedded broker's are there already: its flags edited
    /// `[egress]`), and a refusal names the flags.
    pub fn reaching(mut self, reach: &Reach) -> Result<EgressPlan, Denial> {
        if !reach.own {
            return Ok(self);
        }
        self.own = true;
        for port in &reach.ports {
            if !self.ports.contains(port) {
                self.ports.push(*port);
            }
        }
        for net in &reach.addresses {
            if !self.allow_addresses.contains(net) {
                self.allow_addresses.push(*net);
            }
        }
        self.fits()
    }

    /// What lets a connection to `port` through, which the plan refuses,
    /// worded as the policy's refusals end ([`Denial::finish`]): the flag
    /// and the key where the policy is the requester's own, else the key
    /// an operator would set.
    pub fn port_fix(&self, port: u16) -> String {
        let mut ports = self.ports.clone();
        ports.push(port);
        let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
        fix(self.own, format!("--allow-port {port}"), format!("[egress] ports = [{}]", ports.join(", ")))
    }

    /// What lets a connection to `address` through, which the plan refuses
    /// as loopback, private, link-local, multicast or unspecified: as
    /// [`EgressPlan::port_fix`].
    pub fn address_fix(&self, address: IpAddr) -> String {
        let address = address.to_canonical();
        let mut nets: Vec<String> =
            self.allow_addresses.iter().map(|n| format!("\"{}\"", net_text(n))).collect();
        nets.push(format!("\"{address}\""));
        fix(
            self.own,
            format!("--allow-address {address}"),
            format!("[egress] allow_addresses = [{}]", nets.join(", ")),
        )
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

/// The end of a refusal that `flag` or `key` lifts (see [`Denial::finish`]).
fn fix(own: bool, flag: String, key: String) -> String {
    // The rule and kind are not shown: only the words the fix adds are kept.
    let words = Denial::new(ErrorKind::CapabilityDenied, WIDENS_RULE, String::new());
    words.with_fix(Some(flag), key).finish(own).reason
}

/// A range as `[egress] allow_addresses` would write it: one address alone
/// without its prefix length.
fn net_text(net: &ipnet::IpNet) -> String {
    if net.prefix_len() == net.max_prefix_len() { net.addr().to_string() } else { net.to_string() }
}

/// The rule of an ask a policy does not allow (`asks.rs`'s).
const WIDENS_RULE: &str = "request.widens";

/// What a run request asks of strict egress besides its names: the ports
/// (`allow_ports`, `palisade run --allow-port`) and the addresses that are
/// otherwise refused (`allow_addresses`, `--allow-address`) it needs to
/// connect to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reach {
    pub ports: Vec<u16>,
    pub addresses: Vec<ipnet::IpNet>,
    /// The policy is the requester's own to widen: the asks are added to
    /// the plan ([`EgressPlan::reaching`]).
    pub own: bool,
}

impl Reach {
    /// The asks of `req`, checked: a port must be at least 1 (`request.limit`)
    /// and an address an IP address or a CIDR range (`request.address`).
    /// Unless the policy is the requester's own to widen (`own`), each port
    /// must be one `[egress] ports` lists and each address lie within a
    /// range `[egress] allow_addresses` lists: a request can only narrow
    /// the policy, and anything more is refused (`request.widens`), naming
    /// the field, the flag and the key an operator would set.
    pub fn asked(config: &EgressConfig, req: &RunRequest, own: bool) -> Result<Reach, Denial> {
        let mut reach = Reach { own, ..Reach::default() };
        for &port in &req.allow_ports {
            if port == 0 {
                let why = "allow_ports (--allow-port): 0 is not a port, which must be at least 1";
                return Err(Denial::new(ErrorKind::InvalidRequest, "request.limit", why));
            }
            if !own && !config.ports.contains(&port) {
                let mut ports: Vec<String> = config.ports.iter().map(u16::to_string).collect();
                let why = format!(
                    "allow_ports (--allow-port) would widen the policy: [egress] ports ([{}]) does not list {port}",
                    ports.join(", ")
                );
                ports.push(port.to_string());
                let key = format!("[egress] ports = [{}]", ports.join(", "));
                let denial = Denial::new(ErrorKind::CapabilityDenied, WIDENS_RULE, why);
                return Err(denial.with_fix(Some(format!("--allow-port {port}")), key));
            }
            if !reach.ports.contains(&port) {
                reach.ports.push(port);
            }
        }
        let granted = config.allowed_addresses();
        for text in &req.allow_addresses {
            let net = parse_net(text).ok_or_else(|| {
                let why =
                    format!("allow_addresses (--allow-address): {text:?} is not an address or CIDR range");
                Denial::new(ErrorKind::InvalidRequest, "request.address", why)
            })?;
            if !own && !granted.iter().any(|g| g.contains(&net)) {
                let mut nets: Vec<String> = granted.iter().map(|n| format!("\"{}\"", net_text(n))).collect();
                let why = format!(
                    "allow_addresses (--allow-address) would widen the policy: {} lies within no range of \
                     [egress] allow_addresses ([{}])",
                    net_text(&net),
                    nets.join(", ")
                );
                nets.push(format!("\"{}\"", net_text(&net)));
                let key = format!("[egress] allow_addresses = [{}]", nets.join(", "));
                let denial = Denial::new(ErrorKind::CapabilityDenied, WIDENS_RULE, why);
                return Err(denial.with_fix(Some(format!("--allow-address {}", net_text(&net))), key));
            }
            if !reach.addresses.contains(&net) {
                reach.addresses.push(net);
            }
        }
        Ok(reach)
    }
}

/// An address (a range of one) or a CIDR range, as `[egress]
/// allow_addresses` reads them; the range's host bits cleared.
fn parse_net(text: &str) -> Option<ipnet::IpNet> {
    let net =
        text.parse::<ipnet::IpNet>().ok().or_else(|| text.parse::<IpAddr>().ok().map(ipnet::IpNet::from))?;
    Some(net.trunc())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::denial::names_a_fix_or_why_none;

    fn config(ports: &[u16], addresses: &[&str]) -> EgressConfig {
        EgressConfig {
            ports: ports.to_vec(),
            allow_addresses: addresses.iter().map(|a| toml::Spanned::new(0..0, a.to_string())).collect(),
            ..EgressConfig::default()
        }
    }

    fn asks(ports: &[u16], addresses: &[&str]) -> RunRequest {
        RunRequest {
            allow_ports: ports.to_vec(),
            allow_addresses: addresses.iter().map(|a| a.to_string()).collect(),
            ..RunRequest::default()
        }
    }

    /// The refusal as a client gets it (`own`: the CLI's embedded broker).
    fn refused(config: &EgressConfig, req: &RunRequest, own: bool) -> (ErrorKind, &'static str, String) {
        let d = Reach::asked(config, req, own).expect_err("refused").finish(own);
        names_a_fix_or_why_none(d.rule, &d.reason).unwrap();
        (d.kind, d.rule, d.reason)
    }

    /// A request asks for ports and addresses the policy lists: a broker's
    /// policy is not widened, and anything more is refused naming the
    /// field, the flag and the key an operator would set.
    #[test]
    fn a_request_asks_only_for_ports_and_addresses_the_policy_lists() {
        let policy = config(&[443, 80, 3000], &["127.0.0.0/8", "10.1.2.3"]);
        let within = asks(&[3000, 3000], &["127.0.0.1", "10.1.2.3/32"]);
        let reach = Reach::asked(&policy, &within, false).unwrap();
        assert_eq!(reach.ports, [3000]);
        assert_eq!(reach.addresses.len(), 2);
        assert!(!reach.own);

        let policy = config(&[443, 80], &["127.0.0.1"]);
        assert_eq!(
            refused(&policy, &asks(&[18437], &[]), false),
            (
                ErrorKind::CapabilityDenied,
                "request.widens",
                "allow_ports (--allow-port) would widen the policy: [egress] ports ([443, 80]) does not list \
                 18437; this broker's policy does not allow it (an operator would set `[egress] ports = [443, \
                 80, 18437]`)"
                    .into()
            )
        );
        assert_eq!(
            refused(&policy, &asks(&[], &["127.0.0.0/24"]), false),
            (
                ErrorKind::CapabilityDenied,
                "request.widens",
                "allow_addresses (--allow-address) would widen the policy: 127.0.0.0/24 lies within no range \
                 of [egress] allow_addresses ([\"127.0.0.1\"]); this broker's policy does not allow it (an \
                 operator would set `[egress] allow_addresses = [\"127.0.0.1\", \"127.0.0.0/24\"]`)"
                    .into()
            )
        );
        // Whatever the policy, what is not a port or an address.
        for own in [false, true] {
            let (kind, rule, why) = refused(&policy, &asks(&[], &["localhost"]), own);
            assert_eq!((kind, rule), (ErrorKind::InvalidRequest, "request.address"), "{why}");
            assert!(why.contains("\"localhost\" is not an address or CIDR range"), "{why}");
            names_a_fix_or_why_none("request.address", &why).unwrap();
            let (kind, rule, why) = refused(&policy, &asks(&[0], &[]), own);
            assert_eq!((kind, rule), (ErrorKind::InvalidRequest, "request.limit"), "{why}");
        }
    }

    /// The requester's own policy (the CLI's embedded broker) takes the asks:
    /// the plan gets them, and a refusal of the run's egress names the flag
    /// beside the key; a broker's names the key an operator would set.
    #[test]
    fn the_requesters_own_policy_is_widened_and_refusals_name_the_flag() {
        let policy = config(&[443, 80], &[]);
        let plan = EgressPlan::new(&policy, &["dev.test".into()], &Inspection::default()).unwrap();
        let theirs = plan.clone().reaching(&Reach::asked(&policy, &asks(&[], &[]), false).unwrap()).unwrap();
        assert_eq!((theirs.ports.as_slice(), theirs.own), (&[443, 80][..], false));
        assert_eq!(
            theirs.port_fix(3000),
            "; this broker's policy does not allow it (an operator would set `[egress] ports = [443, 80, 3000]`)"
        );
        let own = Reach::asked(&policy, &asks(&[3000, 443], &["127.0.0.1", "10.0.0.0/8"]), true).unwrap();
        let mine = plan.reaching(&own).unwrap();
        assert_eq!((mine.ports.as_slice(), mine.own), (&[443, 80, 3000][..], true));
        assert_eq!(mine.allow_addresses.len(), 2);
        assert_eq!(
            mine.port_fix(8080),
            "; allow it with `--allow-port 8080` / `[egress] ports = [443, 80, 3000, 8080]`"
        );
        assert_eq!(
            mine.address_fix("::ffff:192.168.1.5".parse().unwrap()),
            "; allow it with `--allow-address 192.168.1.5` / `[egress] allow_addresses = [\"127.0.0.1\", \
             \"10.0.0.0/8\", \"192.168.1.5\"]`"
        );
    }
}
