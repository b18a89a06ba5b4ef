//! The attestation of a run, typed: what was asked and built (a hash), and
//! what the kernel actually enforced.
//!
//! In both encodings the enums read as fixed strings (`"linux-tier-c"`,
//! `"cgroup v2 + rlimits"`, `"full"`, ...). The three values that carry
//! figures (`network`, `disk`, `memory`) are one sentence each, for people,
//! and [`FromStr`] reads each back into the same value: a size is written
//! in the largest unit that divides it exactly (`256 MiB`, `12492 KiB`).

use crate::plan::{RLIM_INFINITY, Rlimit, RlimitName, Tier};
use crate::status::RulesetState;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// What ran the command.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Executor {
    /// Landlock, seccomp and rlimits, without namespaces.
    LinuxTierB,
    /// Namespaces, a private root, Landlock, seccomp and rlimits.
    LinuxTierC,
    /// macOS: a Seatbelt profile (`sandbox-exec`) and rlimits.
    MacosSeatbelt,
}

impl Executor {
    pub fn name(self) -> &'static str {
        match self {
            Executor::LinuxTierB => "linux-tier-b",
            Executor::LinuxTierC => "linux-tier-c",
            Executor::MacosSeatbelt => "macos-seatbelt",
        }
    }
}

impl From<Tier> for Executor {
    fn from(tier: Tier) -> Executor {
        match tier {
            Tier::B => Executor::LinuxTierB,
            Tier::C => Executor::LinuxTierC,
        }
    }
}

impl fmt::Display for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How network access is checked and enforced (the policy's `egress`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum EgressMode {
    /// No check.
    None,
    /// Hosts named in the arguments must be on the allow-list.
    #[default]
    Preflight,
    /// Preflight, and the kernel enforces it: a network namespace with only
    /// loopback. Refused where the host cannot create one.
    Strict,
}

impl fmt::Display for EgressMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EgressMode::None => "none",
            EgressMode::Preflight => "preflight",
            EgressMode::Strict => "strict",
        })
    }
}

/// When the run's sandbox was built: ahead of its request, by the broker's
/// warm pool (namespaces, monitor and pid 1), or for it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Built {
    Warm,
    Cold,
}

/// What bounded the run's memory and processes.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitsBy {
    /// The run's cgroup (v2), with the rlimits as a looser floor.
    #[serde(rename = "cgroup v2 + rlimits")]
    CgroupV2,
    /// The run's cgroups (v1 hierarchies), with the rlimits as a looser floor.
    #[serde(rename = "cgroup v1 + rlimits")]
    CgroupV1,
    /// The rlimits alone: no cgroup was available.
    #[serde(rename = "rlimits")]
    Rlimits,
}

impl LimitsBy {
    pub fn name(self) -> &'static str {
        match self {
            LimitsBy::CgroupV2 => "cgroup v2 + rlimits",
            LimitsBy::CgroupV1 => "cgroup v1 + rlimits",
            LimitsBy::Rlimits => "rlimits",
        }
    }
}

impl fmt::Display for LimitsBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a run's usage figures (peak memory, CPU time) come from.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MemorySource {
    /// The run's cgroup: every process of the run, tmpfs pages included.
    Cgroup,
    /// `getrusage` of the helper's children: the largest process only.
    Rusage,
}

/// One resource limit that was set. `None` is unlimited (`RLIM_INFINITY`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct RlimitEntry {
    pub name: RlimitName,
    pub soft: Option<u64>,
    pub hard: Option<u64>,
}

impl RlimitEntry {
    pub fn new(name: RlimitName, limit: Rlimit) -> RlimitEntry {
        let finite = |v: u64| (v != RLIM_INFINITY).then_some(v);
        RlimitEntry { name, soft: finite(limit.soft), hard: finite(limit.hard) }
    }
}

/// What Landlock enforced, as the helper reported it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct LandlockEnforcement {
    pub abi: u32,
    pub ruleset: RulesetState,
    pub enforced: Vec<String>,
    pub not_enforced: Vec<String>,
    pub required: Vec<String>,
}

/// What was actually in force for a run.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Enforcement {
    pub namespaces: Vec<String>,
    /// Whether the namespaces were built ahead of the request (warm) or for
    /// it (cold); `None` where nothing was built (`palisade explain`).
    pub built: Option<Built>,
    /// The host uid the sandbox ran as.
    pub host_uid: u32,
    pub landlock: Option<LandlockEnforcement>,
    pub seccomp_sha256: String,
    pub seccomp_instructions: u32,
    /// Every rlimit set on the command, in the order the helper sets them.
    pub rlimits: Vec<RlimitEntry>,
    /// The run's cgroup, when limits were enforced by one.
    pub cgroup: Option<String>,
    pub limits_by: LimitsBy,
    pub network: Network,
    pub egress: EgressMode,
    /// How the run's writes were bounded.
    pub disk: Disk,
    /// What bounded the run's memory, its tmpfs mounts included.
    pub memory: Memory,
    /// Strict egress: every connection and name lookup the broker served
    /// for the run. `None` for other egress modes.
    #[serde(default)]
    pub egress_traffic: Option<EgressTraffic>,
    /// macOS: sha256 of the Seatbelt profile the command ran under (its
    /// text, as `sandbox-exec -f` read it). `None` elsewhere.
    #[serde(default)]
    pub seatbelt_sha256: Option<String>,
    /// The run's deadline, in seconds: `max_execution_time`, or the
    /// request's lower `timeout_secs`.
    #[serde(default)]
    pub deadline_secs: u64,
    /// The run's output quota (stdout and stderr together), in bytes:
    /// `max_output_bytes`, or the request's lower one.
    #[serde(default)]
    pub max_output_bytes: u64,
}

/// What a run reached through the broker's egress listeners, and what it
/// was refused (strict egress). On a connection of protocol version 17 or
/// older it has that version's form: without `requests` and
/// `requests_omitted` (see [`crate::form::in_form_of`]).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[serde(into = "EgressTrafficForm", from = "EgressTrafficForm")]
pub struct EgressTraffic {
    /// Each host and port reached, in the order first reached.
    pub reached: Vec<HostReached>,
    /// Hosts reached beyond the bound of `reached` (their bytes are in the
    /// totals).
    #[serde(default)]
    pub reached_omitted: u64,
    /// Refused attempts, in order, at most [`EGRESS_LIST_MAX`].
    pub denied: Vec<EgressDenied>,
    /// Refused attempts left out of `denied` (beyond its bound).
    pub denied_omitted: u64,
    /// Bytes from the sandbox to the hosts, every connection together.
    pub bytes_out: u64,
    /// Bytes from the hosts to the sandbox.
    pub bytes_in: u64,
    /// The run's byte quota (`[egress] max_bytes`) was reached and ended
    /// the connections open then.
    pub quota_exceeded: bool,
    /// Requests to inspected domains (decrypted by the broker), allowed and
    /// refused, in order, at most [`EGRESS_LIST_MAX`].
    #[serde(default)]
    pub requests: Vec<InspectedRequest>,
    /// Inspected requests left out of `requests`.
    #[serde(default)]
    pub requests_omitted: u64,
}

/// [`EgressTraffic`] on the wire: its whole form, or version 17's, as the
/// connection's version says (bincode carries no field names to tell).
enum EgressTrafficForm {
    Whole(EgressTrafficWhole),
    V17(EgressTrafficV17),
}

impl Serialize for EgressTrafficForm {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            EgressTrafficForm::Whole(t) => t.serialize(s),
            EgressTrafficForm::V17(t) => t.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for EgressTrafficForm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if crate::form::form_before(crate::form::INSPECTION_VERSION) {
            EgressTrafficV17::deserialize(d).map(EgressTrafficForm::V17)
        } else {
            EgressTrafficWhole::deserialize(d).map(EgressTrafficForm::Whole)
        }
    }
}

#[derive(Serialize, Deserialize)]
struct EgressTrafficWhole {
    reached: Vec<HostReached>,
    #[serde(default)]
    reached_omitted: u64,
    denied: Vec<EgressDenied>,
    denied_omitted: u64,
    bytes_out: u64,
    bytes_in: u64,
    quota_exceeded: bool,
    #[serde(default)]
    requests: Vec<InspectedRequest>,
    #[serde(default)]
    requests_omitted: u64,
}

#[derive(Serialize, Deserialize)]
struct EgressTrafficV17 {
    reached: Vec<HostReached>,
    #[serde(default)]
    reached_omitted: u64,
    denied: Vec<EgressDenied>,
    denied_omitted: u64,
    bytes_out: u64,
    bytes_in: u64,
    quota_exceeded: bool,
}

impl From<EgressTraffic> for EgressTrafficForm {
    fn from(t: EgressTraffic) -> Self {
        if crate::form::form_before(crate::form::INSPECTION_VERSION) {
            return EgressTrafficForm::V17(EgressTrafficV17 {
                reached: t.reached,
                reached_omitted: t.reached_omitted,
                denied: t.denied,
                denied_omitted: t.denied_omitted,
                bytes_out: t.bytes_out,
                bytes_in: t.bytes_in,
                quota_exceeded: t.quota_exceeded,
            });
        }
        EgressTrafficForm::Whole(EgressTrafficWhole {
            reached: t.reached,
            reached_omitted: t.reached_omitted,
            denied: t.denied,
            denied_omitted: t.denied_omitted,
            bytes_out: t.bytes_out,
            bytes_in: t.bytes_in,
            quota_exceeded: t.quota_exceeded,
            requests: t.requests,
            requests_omitted: t.requests_omitted,
        })
    }
}

impl From<EgressTrafficForm> for EgressTraffic {
    fn from(form: EgressTrafficForm) -> Self {
        match form {
            EgressTrafficForm::Whole(t) => EgressTraffic {
                reached: t.reached,
                reached_omitted: t.reached_omitted,
                denied: t.denied,
                denied_omitted: t.denied_omitted,
                bytes_out: t.bytes_out,
                bytes_in: t.bytes_in,
                quota_exceeded: t.quota_exceeded,
                requests: t.requests,
                requests_omitted: t.requests_omitted,
            },
            EgressTrafficForm::V17(t) => EgressTraffic {
                reached: t.reached,
                reached_omitted: t.reached_omitted,
                denied: t.denied,
                denied_omitted: t.denied_omitted,
                bytes_out: t.bytes_out,
                bytes_in: t.bytes_in,
                quota_exceeded: t.quota_exceeded,
                requests: vec![],
                requests_omitted: 0,
            },
        }
    }
}

/// One request on a connection to an inspected domain.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct InspectedRequest {
    pub method: String,
    pub host: String,
    /// The path, without its query (which may carry secrets).
    pub path: String,
    /// The origin's status; 403 for a request the broker refused, 502 for
    /// an origin that failed.
    pub status: u16,
    /// Whether the broker let it through.
    pub allowed: bool,
    /// The `inspect.requests` rule that allowed it, or why it was refused;
    /// null when no rule names the host.
    #[serde(default)]
    pub rule: Option<String>,
    /// The response body's length, when the origin said it (else null).
    #[serde(default)]
    pub bytes_in: Option<u64>,
    /// The credentials the broker added to it, by name (never a value).
    #[serde(default)]
    pub credentials: Vec<String>,
}

/// At most this many entries in each list of [`EgressTraffic`].
pub const EGRESS_LIST_MAX: usize = 256;

/// A host a run reached (one entry per name, port and path).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct HostReached {
    /// The name asked for (CONNECT, `Host`, or the name a transparent
    /// address stands for).
    pub host: String,
    pub port: u16,
    /// The address the broker connected to.
    pub address: String,
    pub via: EgressPath,
    pub connections: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// How a connection or lookup reached the broker.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EgressPath {
    /// The proxy named in `HTTP_PROXY` and `HTTPS_PROXY`.
    Proxy,
    /// A transparent listener (a tool that ignores the proxy variables).
    Transparent,
    /// The sandbox's resolver.
    Dns,
}

/// A refused attempt.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct EgressDenied {
    /// The name asked for, or the address when no name was given.
    pub host: String,
    /// 0 for a name lookup.
    pub port: u16,
    pub via: EgressPath,
    /// Stable: `domain_not_allowed`, `port_not_allowed`, `address_refused`,
    /// `sni_mismatch`, `too_many_connections`, `quota_exceeded`,
    /// `resolve_failed`, `connect_failed`, `malformed_request`,
    /// `query_refused`, `rate_limited`.
    pub reason: String,
    /// For a person: what was refused and why.
    pub detail: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Attestation {
    /// sha256 over the canonical (bincode) encoding of the request and the resolved plan.
    pub execution_sha256: String,
    pub executor: Executor,
    pub enforcement: Enforcement,
    /// What the policy let through with a warning (a fallback to Tier B, ...).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The audit journal's record of the run's end; `None` when the broker's journal is off.
    #[serde(default)]
    pub journal: Option<JournalRecord>,
}

/// Where a run's end was recorded in the broker's audit journal (see docs/journal.md).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct JournalRecord {
    /// The `run_finished` record's sequence number.
    pub seq: u64,
    /// Its hash (lowercase hex sha256), which chains every record before it.
    pub hash: String,
}

/// A value of the attestation that does not read as one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub what: &'static str,
    pub text: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a {} of an attestation: {:?}", self.what, self.text)
    }
}

impl std::error::Error for ParseError {}

fn bad(what: &'static str, text: &str) -> ParseError {
    ParseError { what, text: text.to_string() }
}

/// Serialized as its `Display` text, read back with `FromStr`.
macro_rules! serde_as_text {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

serde_as_text!(Network);
serde_as_text!(Disk);
serde_as_text!(Memory);

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A size in the largest unit that divides it: `1 GiB`, `64 MiB`,
/// `12492 KiB`, `100 bytes`; `unlimited` for `u64::MAX`.
pub fn exact_size(v: u64) -> String {
    match v {
        u64::MAX => "unlimited".into(),
        0 => "0 bytes".into(),
        v if v % GIB == 0 => format!("{} GiB", v / GIB),
        v if v % MIB == 0 => format!("{} MiB", v / MIB),
        v if v % KIB == 0 => format!("{} KiB", v / KIB),
        v => format!("{v} bytes"),
    }
}

/// The inverse of [`exact_size`].
pub fn parse_size(s: &str) -> Option<u64> {
    if s == "unlimited" {
        return Some(u64::MAX);
    }
    let (n, unit) = s.split_once(' ')?;
    let unit = match unit {
        "GiB" => GIB,
        "MiB" => MIB,
        "KiB" => KIB,
        "bytes" => 1,
        _ => return None,
    };
    n.parse::<u64>().ok()?.checked_mul(unit)
}

/// The network a run had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    /// Tier C: a network namespace with only loopback.
    LoopbackOnly,
    /// Tier B: no `socket()` but `socketpair`, and Landlock's TCP rules.
    NoSockets,
    /// The host's network, every address (`allow_all`).
    Host,
    /// The host's network, under an allowlist of domains. `preflight`: the
    /// hosts named on the command line were checked against it; nothing
    /// stops a connection to any other address.
    HostDomains { domains: Vec<String>, preflight: bool },
    /// Tier C, strict egress with allowed domains: a network namespace with
    /// only loopback, where the broker's proxy and resolver (and, when
    /// `transparent`, its listeners on pool addresses) reach `domains` on
    /// `ports`, and nothing else.
    StrictDomains { domains: Vec<String>, ports: Vec<u16>, transparent: bool },
}

const LOOPBACK_ONLY: &str = "none: a network namespace with only loopback";
const NO_SOCKETS: &str = "none: no socket() but socketpair, Landlock TCP rules (no namespace)";
const HOST_ALL: &str = "host network (allow_all)";
const STRICT_PREFIX: &str = "a network namespace with only loopback; the broker's proxy";
const STRICT_TRANSPARENT: &str = ", resolver and transparent listeners";
const STRICT_PROXY_DNS: &str = " and resolver";
const PREFLIGHT_NOTE: &str = ": preflight checked the hosts named on the command line; \
                              nothing stops a connection to any other address, host loopback included";

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Network::LoopbackOnly => f.write_str(LOOPBACK_ONLY),
            Network::NoSockets => f.write_str(NO_SOCKETS),
            Network::Host => f.write_str(HOST_ALL),
            Network::HostDomains { domains, preflight } => {
                write!(f, "host network (allow_domains [{}])", domains.join(", "))?;
                if *preflight { f.write_str(PREFLIGHT_NOTE) } else { Ok(()) }
            }
            Network::StrictDomains { domains, ports, transparent } => {
                let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
                write!(
                    f,
                    "{STRICT_PREFIX}{} reach allow_domains [{}] on ports [{}]",
                    if *transparent { STRICT_TRANSPARENT } else { STRICT_PROXY_DNS },
                    domains.join(", "),
                    ports.join(", ")
                )
            }
        }
    }
}

impl FromStr for Network {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Network, ParseError> {
        match s {
            LOOPBACK_ONLY => return Ok(Network::LoopbackOnly),
            NO_SOCKETS => return Ok(Network::NoSockets),
            HOST_ALL => return Ok(Network::Host),
            _ => {}
        }
        if let Some(rest) = s.strip_prefix(STRICT_PREFIX) {
            return strict_domains(rest).ok_or_else(|| bad("network", s));
        }
        let (rest, preflight) = s.strip_suffix(PREFLIGHT_NOTE).map_or((s, false), |r| (r, true));
        let list = rest.strip_prefix("host network (allow_domains [").and_then(|r| r.strip_suffix("])"));
        let list = list.ok_or_else(|| bad("network", s))?;
        let domains = if list.is_empty() { vec![] } else { list.split(", ").map(String::from).collect() };
        Ok(Network::HostDomains { domains, preflight })
    }
}

/// The rest of a [`Network::StrictDomains`] text, after its prefix.
fn strict_domains(rest: &str) -> Option<Network> {
    let (rest, transparent) = match rest.strip_prefix(STRICT_TRANSPARENT) {
        Some(r) => (r, true),
        None => (rest.strip_prefix(STRICT_PROXY_DNS)?, false),
    };
    let rest = rest.strip_prefix(" reach allow_domains [")?.strip_suffix("]")?;
    let (domains, ports) = rest.split_once("] on ports [")?;
    let list = |l: &str| if l.is_empty() { vec![] } else { l.split(", ").map(String::from).collect() };
    let ports = list(ports).iter().map(|p| p.parse().ok()).collect::<Option<Vec<u16>>>()?;
    Some(Network::StrictDomains { domains: list(domains), ports, transparent })
}

/// How a run's writes were bounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    pub scratch: Scratch,
    /// How writes to the writable directories were held; `None`: there were none.
    pub writable: Option<WritableDirs>,
}

/// Where a run writes what it does not keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scratch {
    /// Tier C: a tmpfs `/tmp` of `bytes`.
    Tmp { bytes: u64 },
    /// Tier C: a tmpfs temporary workspace at `workspace` and a tmpfs
    /// `/tmp`, of `bytes` each.
    WorkspaceAndTmp { workspace: String, bytes: u64 },
    /// Tier B: directories of the host's.
    Host,
}

/// How writes to the writable directories were held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WritableDirs {
    /// An overlay each, its writes in a layer on disk in the broker's
    /// state, at most `bound_bytes` together, applied as a change set when
    /// the run is over.
    Layers { bound_bytes: u64 },
    /// An overlay each, its writes in a tmpfs of `upper_bytes` (the
    /// attestations of earlier brokers).
    Overlay { upper_bytes: u64 },
    /// Written in place, bounded by RLIMIT_FSIZE per file only.
    Direct,
}

const WRITABLE: &str = "; writable directories: ";
const DIRECT: &str = "direct, bounded by RLIMIT_FSIZE per file only";
const OVERLAY: (&str, &str) = (
    "overlay, writes held in a ",
    " tmpfs, applied as a change set when the run is over (held when palisade ends it)",
);
const LAYERS: (&str, &str) = (
    "overlay, writes held on disk (at most ",
    "), applied as a change set when the run is over (held when palisade ends it)",
);

impl fmt::Display for Disk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.scratch {
            Scratch::Tmp { bytes } => write!(f, "tmpfs /tmp of {}", exact_size(*bytes))?,
            Scratch::WorkspaceAndTmp { workspace, bytes } => {
                write!(f, "tmpfs {workspace} and /tmp of {} each", exact_size(*bytes))?
            }
            Scratch::Host => f.write_str("host directories")?,
        }
        match self.writable {
            None => Ok(()),
            Some(WritableDirs::Direct) => write!(f, "{WRITABLE}{DIRECT}"),
            Some(WritableDirs::Overlay { upper_bytes }) => {
                write!(f, "{WRITABLE}{}{}{}", OVERLAY.0, exact_size(upper_bytes), OVERLAY.1)
            }
            Some(WritableDirs::Layers { bound_bytes }) => {
                write!(f, "{WRITABLE}{}{}{}", LAYERS.0, exact_size(bound_bytes), LAYERS.1)
            }
        }
    }
}

impl FromStr for Disk {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Disk, ParseError> {
        let err = || bad("disk", s);
        let (base, writes) = s.split_once(WRITABLE).map_or((s, None), |(b, w)| (b, Some(w)));
        let writable = match writes {
            None => None,
            Some(DIRECT) => Some(WritableDirs::Direct),
            Some(w) => match w.strip_prefix(LAYERS.0).and_then(|r| r.strip_suffix(LAYERS.1)) {
                Some(size) => Some(WritableDirs::Layers { bound_bytes: parse_size(size).ok_or_else(err)? }),
                None => {
                    let size = w.strip_prefix(OVERLAY.0).and_then(|r| r.strip_suffix(OVERLAY.1));
                    Some(WritableDirs::Overlay { upper_bytes: size.and_then(parse_size).ok_or_else(err)? })
                }
            },
        };
        let scratch = if base == "host directories" {
            Scratch::Host
        } else if let Some(size) = base.strip_prefix("tmpfs /tmp of ") {
            Scratch::Tmp { bytes: parse_size(size).ok_or_else(err)? }
        } else {
            let both = base.strip_prefix("tmpfs ").and_then(|r| r.strip_suffix(" each"));
            let (workspace, size) = both.and_then(|b| b.split_once(" and /tmp of ")).ok_or_else(err)?;
            Scratch::WorkspaceAndTmp { workspace: workspace.into(), bytes: parse_size(size).ok_or_else(err)? }
        };
        Ok(Disk { scratch, writable })
    }
}

/// What bounded a run's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Memory {
    /// The run's cgroup: `bytes` for the whole run, tmpfs pages included
    /// (`memory.max`, or `memory.limit_in_bytes` under cgroup v1).
    Cgroup { v1: bool, bytes: u64 },
    /// RLIMIT_DATA of `data` bytes per process (private writable memory:
    /// heap and private anonymous mappings) under RLIMIT_AS of
    /// `address_space` (which alone holds shared memory and the stack); in
    /// Tier C, the tmpfs mounts (whose pages no rlimit counts) within a
    /// budget together.
    Rlimit { data: u64, address_space: u64, tmpfs: Option<TmpfsBudget> },
    /// macOS: no kernel limit exists there (neither RLIMIT_AS nor
    /// RLIMIT_DATA is enforced); the
    /// broker samples the resident memory of the run's processes every
    /// `every_ms` and ends the run above `bytes`.
    Sampled { bytes: u64, every_ms: u64 },
}

/// The sizes of a Tier C run's tmpfs mounts, which hold memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TmpfsBudget {
    /// `/tmp`.
    pub tmp: u64,
    /// A temporary workspace, of the size of `/tmp`, where there is one.
    pub workspace: Option<String>,
    /// The overlays' upper layers, where there are any.
    pub upper_layers: Option<UpperLayers>,
    /// `/dev/shm`.
    pub shm: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpperLayers {
    pub count: u64,
    pub bytes_each: u64,
}

impl TmpfsBudget {
    /// The bytes all of them may hold together.
    pub fn total(&self) -> u64 {
        let upper = self.upper_layers.map_or(0, |u| u.count.saturating_mul(u.bytes_each));
        self.tmp
            .saturating_mul(1 + u64::from(self.workspace.is_some()))
            .saturating_add(upper)
            .saturating_add(self.shm)
    }
}

/// `Memory::Rlimit`: around `DATA and RLIMIT_AS AS per process`.
const RLIMITS: (&str, &str, &str) = ("RLIMIT_DATA ", " and RLIMIT_AS ", " per process");
const TMPFS_TOGETHER: (&str, &str) = ("; /tmp, /dev/shm and overlay upper layers ", " together (");
/// The same, where no overlay's writes are in memory (they are on disk).
const TMPFS_TOGETHER_NO_UPPER: &str = "; /tmp and /dev/shm ";
const UPPER_LAYERS: &str = " upper layer(s) of ";
/// `Memory::Sampled`: around `SIZE resident, sampled every MS`.
const SAMPLED: (&str, &str) = ("the run's processes together, ended above ", " ms (no kernel limit)");

impl fmt::Display for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (data, address_space, t) = match self {
            Memory::Cgroup { v1, bytes } => {
                let knob = if *v1 { "memory.limit_in_bytes" } else { "memory.max" };
                return write!(
                    f,
                    "cgroup {knob}: {} for the whole run, tmpfs pages included",
                    exact_size(*bytes)
                );
            }
            Memory::Rlimit { data, address_space, tmpfs } => (data, address_space, tmpfs),
            Memory::Sampled { bytes, every_ms } => {
                let size = exact_size(*bytes);
                return write!(f, "{}{size} resident, sampled every {every_ms}{}", SAMPLED.0, SAMPLED.1);
            }
        };
        let (data, address_space) = (exact_size(*data), exact_size(*address_space));
        write!(f, "{}{data}{}{address_space}{}", RLIMITS.0, RLIMITS.1, RLIMITS.2)?;
        let Some(t) = t else { return Ok(()) };
        let together = if t.upper_layers.is_some() { TMPFS_TOGETHER.0 } else { TMPFS_TOGETHER_NO_UPPER };
        write!(f, "{}{}{}/tmp {}", together, exact_size(t.total()), TMPFS_TOGETHER.1, exact_size(t.tmp))?;
        if let Some(w) = &t.workspace {
            write!(f, ", {w} {}", exact_size(t.tmp))?;
        }
        if let Some(u) = t.upper_layers {
            write!(f, ", {}{UPPER_LAYERS}{}", u.count, exact_size(u.bytes_each))?;
        }
        write!(f, ", /dev/shm {})", exact_size(t.shm))
    }
}

impl FromStr for Memory {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Memory, ParseError> {
        let err = || bad("memory", s);
        if let Some(rest) = s.strip_prefix("cgroup ") {
            let (knob, rest) = rest.split_once(": ").ok_or_else(err)?;
            let v1 = match knob {
                "memory.max" => false,
                "memory.limit_in_bytes" => true,
                _ => return Err(err()),
            };
            let size = rest.strip_suffix(" for the whole run, tmpfs pages included").ok_or_else(err)?;
            return Ok(Memory::Cgroup { v1, bytes: parse_size(size).ok_or_else(err)? });
        }
        if let Some(rest) = s.strip_prefix(SAMPLED.0) {
            let rest = rest.strip_suffix(SAMPLED.1).ok_or_else(err)?;
            let (size, every) = rest.split_once(" resident, sampled every ").ok_or_else(err)?;
            let every_ms = every.parse().map_err(|_| err())?;
            return Ok(Memory::Sampled { bytes: parse_size(size).ok_or_else(err)?, every_ms });
        }
        let rest = s.strip_prefix(RLIMITS.0).ok_or_else(err)?;
        let (data, rest) = rest.split_once(RLIMITS.1).ok_or_else(err)?;
        let (address_space, tmpfs) = rest.split_once(RLIMITS.2).ok_or_else(err)?;
        let data = parse_size(data).ok_or_else(err)?;
        let address_space = parse_size(address_space).ok_or_else(err)?;
        if tmpfs.is_empty() {
            return Ok(Memory::Rlimit { data, address_space, tmpfs: None });
        }
        let tmpfs =
            (tmpfs.strip_prefix(TMPFS_TOGETHER.0).or_else(|| tmpfs.strip_prefix(TMPFS_TOGETHER_NO_UPPER)))
                .and_then(|r| r.strip_suffix(')'));
        let (total, parts) = tmpfs.and_then(|t| t.split_once(TMPFS_TOGETHER.1)).ok_or_else(err)?;
        let budget = parse_budget(parts).ok_or_else(err)?;
        if parse_size(total) != Some(budget.total()) {
            return Err(err());
        }
        Ok(Memory::Rlimit { data, address_space, tmpfs: Some(budget) })
    }
}

/// `/tmp X[, WORKSPACE X][, N upper layer(s) of Y], /dev/shm Z`.
fn parse_budget(parts: &str) -> Option<TmpfsBudget> {
    let mut parts: Vec<&str> = parts.split(", ").collect();
    let shm = parse_size(parts.pop()?.strip_prefix("/dev/shm ")?)?;
    let mut parts = parts.into_iter();
    let tmp = parse_size(parts.next()?.strip_prefix("/tmp ")?)?;
    let mut budget = TmpfsBudget { tmp, workspace: None, upper_layers: None, shm };
    for part in parts {
        match part.split_once(UPPER_LAYERS) {
            Some((count, size)) if budget.upper_layers.is_none() => {
                let (count, bytes_each) = (count.parse().ok()?, parse_size(size)?);
                budget.upper_layers = Some(UpperLayers { count, bytes_each });
            }
            None if budget.workspace.is_none() && budget.upper_layers.is_none() => {
                let (path, size) = part.split_once(' ')?;
                if parse_size(size)? != tmp {
                    return None;
                }
                budget.workspace = Some(path.to_string());
            }
            _ => return None,
        }
    }
    Some(budget)
}

#[cfg(test)]
mod tests {

    #[test]
    fn egress_traffic_takes_the_form_of_the_connections_version() {
        use crate::form::{INSPECTION_VERSION, in_form_of};
        let request = InspectedRequest {
            method: "GET".into(),
            host: "a.test".into(),
            path: "/".into(),
            status: 200,
            allowed: true,
            rule: None,
            bytes_in: Some(2),
            credentials: vec!["gh".into()],
        };
        let traffic =
            EgressTraffic { bytes_in: 7, requests: vec![request], requests_omitted: 3, ..Default::default() };
        let config = bincode::config::standard();
        let whole = bincode::serde::encode_to_vec(&traffic, config).unwrap();
        let (back, used): (EgressTraffic, usize) = bincode::serde::decode_from_slice(&whole, config).unwrap();
        assert_eq!((back, used), (traffic.clone(), whole.len()));
        let old = INSPECTION_VERSION - 1;
        let earlier = in_form_of(old, || bincode::serde::encode_to_vec(&traffic, config).unwrap());
        let (back, used): (EgressTraffic, usize) =
            in_form_of(old, || bincode::serde::decode_from_slice(&earlier, config).unwrap());
        assert_eq!(used, earlier.len());
        assert_eq!(back, EgressTraffic { requests: vec![], requests_omitted: 0, ..traffic.clone() });
        // The earlier form is exactly the fields before: two bytes shorter
        // than the whole form with nothing inspected (an empty list, a zero).
        let none = EgressTraffic { requests: vec![], requests_omitted: 0, ..traffic };
        let whole_none = bincode::serde::encode_to_vec(&none, config).unwrap();
        assert_eq!(whole_none.len(), earlier.len() + 2);
        assert_eq!(&whole_none[..earlier.len()], &earlier[..]);
        let json = in_form_of(old, || serde_json::to_value(&none).unwrap());
        assert!(json.get("requests").is_none() && json.get("bytes_in").is_some(), "{json}");
    }

    use super::*;

    #[test]
    fn sizes_read_back_exactly() {
        for v in [0, 1, 1000, 4096, 12_792_000 / 4096 * 4096, 64 << 20, 3 << 30, (1 << 30) + 4096, u64::MAX] {
            assert_eq!(parse_size(&exact_size(v)), Some(v), "{v}");
        }
        assert_eq!(exact_size(64 << 20), "64 MiB");
        assert_eq!(exact_size((12 << 20) + (200 << 10)), "12488 KiB");
        assert_eq!(parse_size("12.2 MiB"), None);
    }

    /// Each value reads back from its text; the texts are those of the
    /// attestation before it was typed.
    #[test]
    fn labels_read_back_from_their_text() {
        let networks = [
            (Network::LoopbackOnly, LOOPBACK_ONLY.to_string()),
            (Network::NoSockets, NO_SOCKETS.to_string()),
            (Network::Host, "host network (allow_all)".into()),
            (Network::HostDomains { domains: vec![], preflight: false }, "host network (allow_domains [])".into()),
            (
                Network::HostDomains { domains: vec!["pkgs.example.org".into(), "*.github.com".into()], preflight: true },
                "host network (allow_domains [pkgs.example.org, *.github.com]): preflight checked the hosts named on \
                 the command line; nothing stops a connection to any other address, host loopback included"
                    .into(),
            ),
        ];
        let strict = [
            (
                Network::StrictDomains {
                    domains: vec!["pkgs.example.org".into(), "*.github.com".into()],
                    ports: vec![443, 80],
                    transparent: true,
                },
                "a network namespace with only loopback; the broker's proxy, resolver and transparent \
                 listeners reach allow_domains [pkgs.example.org, *.github.com] on ports [443, 80]",
            ),
            (
                Network::StrictDomains {
                    domains: vec!["a.example".into()],
                    ports: vec![],
                    transparent: false,
                },
                "a network namespace with only loopback; the broker's proxy and resolver reach allow_domains \
                 [a.example] on ports []",
            ),
        ];
        let networks = networks.into_iter().chain(strict.map(|(n, t)| (n, t.to_string())));
        for (n, text) in networks {
            assert_eq!(n.to_string(), text);
            assert_eq!(text.parse::<Network>(), Ok(n));
        }
        let disks = [
            (Disk { scratch: Scratch::Host, writable: None }, "host directories"),
            (
                Disk { scratch: Scratch::Host, writable: Some(WritableDirs::Direct) },
                "host directories; writable directories: direct, bounded by RLIMIT_FSIZE per file only",
            ),
            (
                Disk {
                    scratch: Scratch::Tmp { bytes: 256 << 20 },
                    writable: Some(WritableDirs::Overlay { upper_bytes: 1 << 30 }),
                },
                "tmpfs /tmp of 256 MiB; writable directories: overlay, writes held in a 1 GiB tmpfs, applied \
                 as a change set when the run is over (held when palisade ends it)",
            ),
            (
                Disk {
                    scratch: Scratch::Tmp { bytes: 256 << 20 },
                    writable: Some(WritableDirs::Layers { bound_bytes: 16 << 30 }),
                },
                "tmpfs /tmp of 256 MiB; writable directories: overlay, writes held on disk (at most 16 GiB), \
                 applied as a change set when the run is over (held when palisade ends it)",
            ),
            (
                Disk {
                    scratch: Scratch::WorkspaceAndTmp { workspace: "/workspace".into(), bytes: 12 << 10 },
                    writable: None,
                },
                "tmpfs /workspace and /tmp of 12 KiB each",
            ),
        ];
        for (d, text) in disks {
            assert_eq!(d.to_string(), text);
            assert_eq!(text.parse::<Disk>(), Ok(d));
        }
        let budget = TmpfsBudget {
            tmp: 64 << 20,
            workspace: Some("/workspace".into()),
            upper_layers: Some(UpperLayers { count: 2, bytes_each: 100 << 10 }),
            shm: 4096,
        };
        let memories = [
            (
                Memory::Cgroup { v1: false, bytes: 512 << 20 },
                "cgroup memory.max: 512 MiB for the whole run, tmpfs pages included",
            ),
            (
                Memory::Cgroup { v1: true, bytes: 1 << 30 },
                "cgroup memory.limit_in_bytes: 1 GiB for the whole run, tmpfs pages included",
            ),
            (
                Memory::Rlimit { data: 512 << 20, address_space: 2 << 30, tmpfs: None },
                "RLIMIT_DATA 512 MiB and RLIMIT_AS 2 GiB per process",
            ),
            (
                Memory::Rlimit { data: 512 << 20, address_space: 2 << 30, tmpfs: Some(budget.clone()) },
                "RLIMIT_DATA 512 MiB and RLIMIT_AS 2 GiB per process; /tmp, /dev/shm and overlay upper layers 131276 KiB together \
                 (/tmp 64 MiB, /workspace 64 MiB, 2 upper layer(s) of 100 KiB, /dev/shm 4 KiB)",
            ),
            (
                Memory::Rlimit {
                    data: 0,
                    address_space: 0,
                    tmpfs: Some(TmpfsBudget { workspace: None, upper_layers: None, ..budget }),
                },
                "RLIMIT_DATA 0 bytes and RLIMIT_AS 0 bytes per process; /tmp and /dev/shm 65540 KiB together \
                 (/tmp 64 MiB, /dev/shm 4 KiB)",
            ),
            (
                Memory::Sampled { bytes: 512 << 20, every_ms: 50 },
                "the run's processes together, ended above 512 MiB resident, sampled every 50 ms \
                 (no kernel limit)",
            ),
        ];
        for (m, text) in memories {
            assert_eq!(m.to_string(), text);
            assert_eq!(text.parse::<Memory>(), Ok(m));
        }
    }

    #[test]
    fn text_that_is_not_a_label_is_refused() {
        assert!("host network".parse::<Network>().is_err());
        let strict = "a network namespace with only loopback; the broker's proxy and resolver reach";
        assert!(format!("{strict} allow_domains [a] on ports [http]").parse::<Network>().is_err());
        assert!(format!("{strict} somewhere").parse::<Network>().is_err());
        assert!("tmpfs /tmp of lots".parse::<Disk>().is_err());
        assert!("host directories; writable directories: sometimes".parse::<Disk>().is_err());
        // A total that does not add up.
        assert!(
            "RLIMIT_DATA 1 GiB and RLIMIT_AS 4 GiB per process; /tmp, /dev/shm and overlay upper layers 1 GiB together (/tmp 1 MiB, /dev/shm 1 MiB)"
                .parse::<Memory>()
                .is_err()
        );
        assert!(
            "cgroup memory.high: 1 GiB for the whole run, tmpfs pages included".parse::<Memory>().is_err()
        );
    }

    fn json<T: Serialize>(v: T) -> serde_json::Value {
        serde_json::to_value(v).unwrap()
    }

    #[test]
    fn enums_keep_their_strings() {
        assert_eq!(json(Executor::LinuxTierC), "linux-tier-c");
        assert_eq!(json(Executor::LinuxTierB), "linux-tier-b");
        assert_eq!(json(Executor::MacosSeatbelt), "macos-seatbelt");
        // A tier prints as its executor.
        for tier in [Tier::B, Tier::C] {
            assert_eq!(tier.to_string(), Executor::from(tier).name());
        }
        assert_eq!(json(LimitsBy::CgroupV2), "cgroup v2 + rlimits");
        assert_eq!(json(LimitsBy::CgroupV1), "cgroup v1 + rlimits");
        assert_eq!(json(LimitsBy::Rlimits), "rlimits");
        assert_eq!(json(MemorySource::Rusage), "rusage");
        assert_eq!(json(EgressMode::Preflight), "preflight");
        assert_eq!(json(RulesetState::NotEnforced), "not_enforced");
        assert_eq!(json(RlimitName::Nproc), "NPROC");
        assert_eq!(
            json(RlimitEntry::new(RlimitName::As, Rlimit { soft: 1 << 30, hard: RLIM_INFINITY })),
            serde_json::json!({"name": "AS", "soft": 1u64 << 30, "hard": null})
        );
        for l in [LimitsBy::CgroupV2, LimitsBy::CgroupV1, LimitsBy::Rlimits] {
            assert_eq!(json(l), l.to_string());
        }
        for e in [Executor::LinuxTierB, Executor::LinuxTierC, Executor::MacosSeatbelt] {
            assert_eq!(json(e), e.to_string());
        }
        assert_eq!(json(Network::Host), "host network (allow_all)");
        assert_eq!(serde_json::from_value::<Network>(json(Network::NoSockets)).unwrap(), Network::NoSockets);
    }

    /// bincode carries the same values (the three sentences as strings).
    #[test]
    fn an_enforcement_round_trips_in_bincode() {
        let e = Enforcement {
            namespaces: vec!["user".into()],
            built: Some(Built::Warm),
            host_uid: 1000,
            landlock: Some(LandlockEnforcement {
                abi: 6,
                ruleset: RulesetState::Partial,
                enforced: vec!["fs".into()],
                not_enforced: vec![],
                required: vec!["fs".into()],
            }),
            seccomp_sha256: "00".into(),
            seccomp_instructions: 300,
            rlimits: vec![RlimitEntry::new(RlimitName::Core, Rlimit::both(0))],
            cgroup: None,
            limits_by: LimitsBy::Rlimits,
            network: Network::HostDomains { domains: vec!["example.org".into()], preflight: true },
            egress: EgressMode::Preflight,
            disk: Disk { scratch: Scratch::Tmp { bytes: 1 << 20 }, writable: Some(WritableDirs::Direct) },
            memory: Memory::Rlimit { data: 1 << 30, address_space: 4 << 30, tmpfs: None },
            egress_traffic: None,
            seatbelt_sha256: Some("ab".into()),
            deadline_secs: 300,
            max_output_bytes: 1 << 20,
        };
        let bytes = crate::wire::canonical_bytes(&e);
        let (back, _): (Enforcement, usize) =
            bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
        assert_eq!(back, e);
    }
}
