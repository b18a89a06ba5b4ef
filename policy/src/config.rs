//! The configuration file (TOML). Unknown keys and bad values are errors that
//! name the line and column; so are overrides of a preset's immutable fields,
//! unknown presets, and executables that cannot be found.

use crate::capabilities::{
    Binding, EnvironmentCapability, FsCapability, NetworkCapability, Overrides, Preset,
};
use crate::cedar::{CedarError, CedarPolicies};
use crate::egress::EgressMode;
use crate::inspect::Inspection;
pub mod ids;

pub(crate) use crate::spans::line_column;
pub use ids::{IdList, IdOrName};
use palisade_protocol::LandlockFeatures;
use palisade_protocol::wire::{KeepChanges, OnConflict};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use toml::Spanned;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub broker: BrokerConfig,
    #[serde(default)]
    pub journal: JournalConfig,
    #[serde(default)]
    pub policy: PolicyConfig,
    #[serde(default)]
    pub defaults: DefaultProfile,
    /// Profiles a request may name instead of `[defaults]` (`[profiles.NAME]`,
    /// the same keys, each defaulting as in `[defaults]`).
    #[serde(default)]
    pub profiles: BTreeMap<String, DefaultProfile>,
    #[serde(default)]
    pub tools: BTreeMap<String, ToolConfig>,
    #[serde(default)]
    pub approvers: ApproversConfig,
    #[serde(default)]
    pub trust: TrustConfig,
    #[serde(default)]
    pub egress: EgressConfig,
    #[serde(default)]
    pub plugins: PluginsConfig,
    #[serde(default)]
    pub changes: ChangesConfig,
    /// What every user's `palisade` reads of the system configuration; the
    /// broker itself does not use it.
    #[serde(default)]
    pub clients: ClientsConfig,
    /// The file it was loaded from (`None`: the built-in default policy).
    #[serde(skip)]
    pub source: Option<PathBuf>,
    /// The policy is the person's own (the CLI's embedded broker, whose
    /// flags edit it): a refusal names the flag that lifts it, not only
    /// the key.
    #[serde(skip)]
    pub own: bool,
    /// The file's text, for the position of what is checked after it is
    /// read (a user or group name, see [`Config::resolve_ids`]).
    #[serde(skip)]
    text: SourceText,
}

/// A configuration file's text (its length alone is shown in `Debug`).
#[derive(Clone, Default)]
struct SourceText(Arc<str>);

impl std::fmt::Debug for SourceText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes>", self.0.len())
    }
}

pub use palisade_protocol::clients::{ClientsConfig, SYSTEM_SOCKET};

/// WebAssembly skill plugins (Tier A, `[plugins]`): whether they run, the
/// limits of each call, where skills are installed, and the most any
/// skill's manifest may be granted (see `docs/plugins.md`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PluginsConfig {
    pub enabled: bool,
    /// Requests may bring their own module (WAT or base64) instead of an installed skill's.
    pub allow_inline_modules: bool,
    /// Instructions' fuel per call (wasmtime fuel units).
    pub fuel_budget: u64,
    /// Largest a call's linear memory may grow.
    pub max_memory_bytes: u64,
    pub max_table_elements: u32,
    /// Instances a call may create (its module's, and any it instantiates).
    pub max_instances: u32,
    /// Wall-clock deadline of a call, host functions included.
    pub timeout_ms: u64,
    /// The skills index; default `<state dir>/skills`.
    pub skills_dir: Option<PathBuf>,
    /// The secret store (a 0600 file per key); default `<state dir>/secrets`.
    pub secrets_dir: Option<PathBuf>,
    /// Bytes of storage per requester and skill (keys and values together).
    pub storage_quota_bytes: u64,
    /// Bytes the module cache (`skills_dir/.cache`) keeps at most: installed
    /// skills' compiled modules; past it a module is compiled for its call only.
    pub cache_max_bytes: u64,
    /// palisade-plugin-host; default: next to palisade-helper.
    pub host: Option<PathBuf>,
    /// The plugin-host's cgroup memory limit, where the broker has cgroups:
    /// its engine, a module's compilation, and the call running.
    pub host_memory_bytes: u64,
    /// Hosts `http_fetch` may reach at most: exact names or `*.suffix`.
    pub allow_http_hosts: Vec<String>,
    /// Secret keys `secret_get` may read at most.
    pub allow_secrets: Vec<String>,
    /// Key prefixes storage may use at most.
    pub allow_storage_prefixes: Vec<String>,
}

/// Palyra's default fuel budget: a few hundred milliseconds of plain code.
pub const DEFAULT_PLUGIN_FUEL: u64 = 10_000_000;
/// The largest output chunk: its JSON line (base64, 4/3 of it) fits the
/// protocol's 8 MiB frame with room to spare.
pub const MAX_CAPTURE_CHUNK_BYTES: usize = 4 << 20;

/// Palyra's default memory ceiling: room for a JSON document and its parse.
pub const DEFAULT_PLUGIN_MEMORY_BYTES: u64 = 64 << 20;
/// Palyra's default: far above what a skill's function tables need.
pub const DEFAULT_PLUGIN_TABLE_ELEMENTS: u32 = 10_000;
/// A skill is one module: one instance per call.
pub const DEFAULT_PLUGIN_INSTANCES: u32 = 1;
/// A skill's call is an interactive step of an agent: seconds, not minutes.
pub const DEFAULT_PLUGIN_TIMEOUT_MS: u64 = 5_000;
/// Enough for a skill's settings and cache keys, not a data store.
pub const DEFAULT_PLUGIN_STORAGE_QUOTA: u64 = 1 << 20;
/// About fifty installed skills' compiled modules (4 to 6 MiB each).
pub const DEFAULT_PLUGIN_CACHE_BYTES: u64 = 256 << 20;
/// The host's engine and a call (16 MiB resident when idle, a call's
/// memory up to its 64 MiB slot) with room for compiling a large module.
pub const DEFAULT_PLUGIN_HOST_MEMORY: u64 = 512 << 20;

impl Default for PluginsConfig {
    fn default() -> Self {
        PluginsConfig {
            enabled: false,
            allow_inline_modules: false,
            fuel_budget: DEFAULT_PLUGIN_FUEL,
            max_memory_bytes: DEFAULT_PLUGIN_MEMORY_BYTES,
            max_table_elements: DEFAULT_PLUGIN_TABLE_ELEMENTS,
            max_instances: DEFAULT_PLUGIN_INSTANCES,
            timeout_ms: DEFAULT_PLUGIN_TIMEOUT_MS,
            skills_dir: None,
            secrets_dir: None,
            storage_quota_bytes: DEFAULT_PLUGIN_STORAGE_QUOTA,
            cache_max_bytes: DEFAULT_PLUGIN_CACHE_BYTES,
            host: None,
            host_memory_bytes: DEFAULT_PLUGIN_HOST_MEMORY,
            allow_http_hosts: vec![],
            allow_secrets: vec![],
            allow_storage_prefixes: vec![],
        }
    }
}

impl PluginsConfig {
    /// Limits are at least 1 (the memory at least one wasm page), paths absolute.
    fn check(&self) -> Result<(), (usize, String)> {
        const WASM_PAGE: u64 = 65536;
        if self.fuel_budget == 0
            || self.max_memory_bytes < WASM_PAGE
            || self.max_table_elements == 0
            || self.max_instances == 0
            || self.timeout_ms == 0
        {
            return Err((
                0,
                "plugins.fuel_budget, max_table_elements, max_instances and timeout_ms must be at least 1, \
                 max_memory_bytes at least 65536 (one page)"
                    .into(),
            ));
        }
        if self.host_memory_bytes < self.max_memory_bytes {
            return Err((0, "plugins.host_memory_bytes must be at least max_memory_bytes".into()));
        }
        for (key, path) in
            [("skills_dir", &self.skills_dir), ("secrets_dir", &self.secrets_dir), ("host", &self.host)]
        {
            if path.as_ref().is_some_and(|p| !p.is_absolute()) {
                return Err((0, format!("plugins.{key} must be an absolute path")));
            }
        }
        Ok(())
    }
}

/// Strict egress (`egress = "strict"` with `network = { allow_domains =
/// [...] }`): what the broker's proxy, resolver and transparent listeners
/// let through, and their limits per run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// Ports a connection to an allowed name may go to.
    pub ports: Vec<u16>,
    /// Listeners on a loopback pool address per allowed name, so that tools
    /// that ignore the proxy variables reach allowed names too.
    pub transparent: bool,
    /// Addresses and ranges (CIDR) the broker may connect to although they
    /// are loopback, private, link-local, multicast or unspecified.
    pub allow_addresses: Vec<Spanned<String>>,
    /// Names the broker resolves from this map before DNS: one address or a
    /// list of them per name.
    pub hosts: BTreeMap<String, Spanned<HostAddresses>>,
    /// Connections open at once per run (proxy and transparent together).
    pub max_connections: u32,
    /// Bytes both ways per run, every connection together.
    pub max_bytes: u64,
    /// A connection silent both ways for this long is closed.
    pub idle_timeout_secs: u64,
    /// Inspected domains: the trust roots the broker verifies origins
    /// with (a PEM bundle); unset, the host's own bundle.
    pub ca_bundle: Option<PathBuf>,
}

/// The address or addresses of a name in `[egress] hosts`, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum HostAddresses {
    One(String),
    Many(Vec<String>),
}

/// HTTPS and plain HTTP: what package indexes, forges and APIs use.
pub const DEFAULT_EGRESS_PORTS: [u16; 2] = [443, 80];
/// Enough for a parallel package install, few enough that a run cannot
/// tie up the broker's descriptors.
pub const DEFAULT_EGRESS_MAX_CONNECTIONS: u32 = 64;
/// A large dependency download fits; an exfiltration of a disk does not.
pub const DEFAULT_EGRESS_MAX_BYTES: u64 = 1 << 30;
/// As long as the broker's own connections may stay silent.
pub const DEFAULT_EGRESS_IDLE_TIMEOUT_SECS: u64 = 60;

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            ports: DEFAULT_EGRESS_PORTS.to_vec(),
            transparent: true,
            allow_addresses: vec![],
            hosts: BTreeMap::new(),
            max_connections: DEFAULT_EGRESS_MAX_CONNECTIONS,
            max_bytes: DEFAULT_EGRESS_MAX_BYTES,
            idle_timeout_secs: DEFAULT_EGRESS_IDLE_TIMEOUT_SECS,
            ca_bundle: None,
        }
    }
}

impl EgressConfig {
    /// `allow_addresses`, parsed (a single address is a range of one).
    pub fn allowed_addresses(&self) -> Vec<ipnet::IpNet> {
        self.allow_addresses.iter().filter_map(|a| parse_net(a.get_ref()).ok()).collect()
    }

    /// `hosts`, parsed, names in lower case without a trailing dot.
    pub fn host_map(&self) -> BTreeMap<String, Vec<std::net::IpAddr>> {
        self.hosts
            .iter()
            .map(|(name, addrs)| {
                let list = match addrs.get_ref() {
                    HostAddresses::One(a) => vec![a.clone()],
                    HostAddresses::Many(l) => l.clone(),
                };
                (host_name(name), list.iter().filter_map(|a| a.parse().ok()).collect())
            })
            .collect()
    }

    /// Each address and range parses, each name has at least one address
    /// and each of them parses, the limits are at least 1.
    fn check(&self) -> Result<(), (usize, String)> {
        for a in &self.allow_addresses {
            parse_net(a.get_ref()).map_err(|e| {
                (
                    a.span().start,
                    format!("egress.allow_addresses: {:?} is not an address or CIDR range: {e}", a.get_ref()),
                )
            })?;
        }
        for (name, addrs) in &self.hosts {
            let list = match addrs.get_ref() {
                HostAddresses::One(a) => vec![a.clone()],
                HostAddresses::Many(l) => l.clone(),
            };
            if list.is_empty() {
                return Err((addrs.span().start, format!("egress.hosts: {name} has no address")));
            }
            if let Some(bad) = list.iter().find(|a| a.parse::<std::net::IpAddr>().is_err()) {
                return Err((
                    addrs.span().start,
                    format!("egress.hosts: {name}: {bad:?} is not an IPv4 or IPv6 address"),
                ));
            }
        }
        if self.ports.contains(&0) {
            return Err((0, "egress.ports: 0 is not a port".into()));
        }
        if self.max_connections == 0 || self.max_bytes == 0 || self.idle_timeout_secs == 0 {
            return Err((
                0,
                "egress.max_connections, max_bytes and idle_timeout_secs must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// An address or a CIDR range.
fn parse_net(text: &str) -> Result<ipnet::IpNet, String> {
    text.parse::<ipnet::IpNet>()
        .or_else(|e| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from).map_err(|_| e.to_string()))
}

/// A name as the broker compares it: lower case, no trailing dot.
pub fn host_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Who may answer a run held for approval, from any connection. With
/// neither list set: the broker's own uid, and root.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ApproversConfig {
    /// By uid or user name.
    pub uids: IdList,
    /// A peer whose primary or supplementary group is one of these (by gid
    /// or group name).
    pub gids: IdList,
    /// Whether a client that is not an approver may answer its own request.
    pub self_approval: bool,
}

/// Where the change sets held for review are kept, and how much of them
/// (`[changes]`): each requester's within these bounds.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChangesConfig {
    /// Default: `changes` in the broker's state directory.
    pub dir: Option<PathBuf>,
    /// Bytes of files held for one requester, all its change sets together.
    pub max_bytes: u64,
    /// Change sets held for one requester.
    pub max_sets: usize,
    /// Days a held change set is kept before it is removed (a journal record says so).
    pub max_age_days: u64,
    /// The free space (MiB) the filesystem of the change sets keeps while
    /// runs write there (their layers are on it): a run whose writes would
    /// take it below this is stopped (`DiskLimitExceeded`), its writes held.
    /// 0: no floor.
    pub min_free_mb: u64,
}

/// How often the broker checks an overlay run's writes against
/// `max_disk_mb` and `[changes] min_free_mb` (one `statvfs` each time; the
/// layers are walked only when the filesystem grew by the rest of the bound).
pub const DISK_CHECK_MS: u64 = 20;

/// The default free-space floor of the change sets' filesystem: room for
/// the host's own needs and the journal's floor (64 MiB) well clear of a
/// full disk.
pub const DEFAULT_CHANGES_MIN_FREE_MB: u64 = 1024;

impl Default for ChangesConfig {
    fn default() -> Self {
        // A few large runs' writes, or thousands of small ones, per person;
        // two weeks to look at them.
        ChangesConfig {
            dir: None,
            max_bytes: 4 << 30,
            max_sets: 200,
            max_age_days: 14,
            min_free_mb: DEFAULT_CHANGES_MIN_FREE_MB,
        }
    }
}

/// Trust stages of declared tools: Draft (not executable until an approver
/// approves its declaration), Trial (each run held for approval), Verified
/// (runs silently). The default profile has none.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrustConfig {
    pub enabled: bool,
    /// Approved Trial runs that exit 0 before the tool is Verified.
    pub trial_runs: u32,
    /// The stages' file; default `trust.json` in the broker's state directory.
    pub state: Option<PathBuf>,
}

impl Default for TrustConfig {
    fn default() -> Self {
        TrustConfig { enabled: true, trial_runs: 3, state: None }
    }
}

/// How palisaded serves (the CLI's embedded broker ignores the socket settings).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// Socket path; default `$XDG_RUNTIME_DIR/palisade/palisade.sock` for a user
    /// (else `/run/user/UID/...`, else the private `$TMPDIR/palisade-UID/`),
    /// `/run/palisade/palisade.sock` for root.
    pub socket: Option<PathBuf>,
    /// Permission bits of the socket.
    pub socket_mode: u32,
    /// A broker that serves only its own user (not root, not the system
    /// service): its owner's requests may widen the profile they name, as
    /// `palisade run`'s flags widen an embedded broker's (interpreters,
    /// inline code, domains, paths, variables, limits up to the profile's
    /// ceilings, how writes land), since the configuration is the owner's
    /// too; `[policy]` and the Cedar rules still decide. false: every
    /// request only narrows, as a system broker's always do.
    pub owner_widens: bool,
    /// Peers allowed to connect, by uid or user name; empty: the broker's own uid only.
    pub allowed_uids: IdList,
    /// Peers allowed to connect, by a group they are in (primary or
    /// supplementary, as the peer's credentials give them when it
    /// connects): by gid or group name.
    pub allowed_gids: IdList,
    /// Runs at once; further runs wait in the queue.
    pub max_concurrent: usize,
    /// Runs waiting for a slot; beyond this, requests get `Busy`.
    pub max_queued: usize,
    /// Runs at once of one requester (uid); default: three quarters of
    /// `max_concurrent` (rounded down, at least 1) for a broker that serves
    /// other users (`allowed_uids` or `allowed_gids` set), all of it for
    /// one that serves its own user and root only. A freed slot goes to the waiting requester with the
    /// fewest runs in progress.
    pub max_concurrent_per_uid: Option<usize>,
    /// Runs of one requester waiting for a slot; default: three quarters of
    /// `max_queued`, likewise.
    pub max_queued_per_uid: Option<usize>,
    /// Sessions one requester may have at once.
    pub max_sessions_per_uid: usize,
    /// MiB of memory one requester's runs in progress may be given together
    /// (each run's cgroup limit counts); a run that would go over waits.
    /// Where no cgroup bounds a run's memory, a run is refused while this is
    /// set. 0: no share.
    pub max_memory_mb_per_uid: u64,
    /// Helpers started ahead of requests, waiting for a plan, so that a run
    /// without a cgroup does not wait for one to start: the warm pool's
    /// size (and, once a session has run a command, one more for the next
    /// command of a session). 0: none.
    pub prespawn: usize,
    /// Each of those builds its sandbox ahead, as far as nothing of the
    /// request is involved (user namespace and maps, the other namespaces,
    /// monitor and pid 1, in a cgroup of its own with cgroup v2), for a
    /// broker that is not root; one serves one run. false: they only wait,
    /// having built nothing.
    pub warm: bool,
    /// Sandboxes see `/etc` as one read-only bind of a copy of the curated
    /// entries that the broker keeps, and takes afresh when the host's change
    /// (watched with inotify); false: each entry is bound on its own, at
    /// every run.
    pub etc_snapshot: bool,
    /// Path of palisade-helper; default: next to the running binary.
    pub helper: Option<PathBuf>,
    /// When the broker runs as root: the block of host ids sandboxes run as.
    /// The sandboxes of requesting uid U run as uid and gid `first + U`, so
    /// that two users' sandboxes never share a uid (they could signal or
    /// trace each other). A block no one else uses: the broker refuses to
    /// start when it overlaps a user, a group or a subordinate id range of
    /// the host, and refuses a requester whose uid is `count` or more.
    pub sandbox_ids: SandboxIds,
    /// Connections open at once, all peers together; one more is answered
    /// `Busy` and closed.
    pub max_connections: usize,
    /// Connections open at once from one uid.
    pub max_connections_per_uid: usize,
    /// How long an open connection may stay silent between requests (after
    /// the hello, and after each result) before the broker closes it.
    pub idle_timeout_secs: u64,
    /// Bytes of requests the broker holds for all its clients together
    /// beyond the first 64 KiB of each connection: frames on their way in
    /// and the `stdin` of runs not finished. A connection that would go
    /// over is answered `Busy` and closed.
    pub request_buffer_bytes: usize,
    /// The same, for the connections of one uid.
    pub request_buffer_bytes_per_uid: usize,
    /// How long a frame (or JSON line) may take from its first byte to its
    /// last before the connection is closed.
    pub frame_timeout_secs: u64,
    /// The cgroup subtree runs are created under (a cgroup v2 directory, or a
    /// directory in a v1 memory hierarchy). Default: the broker's own cgroup
    /// if systemd delegated it on a pure cgroup v2 host; otherwise none.
    pub cgroup_root: Option<PathBuf>,
    /// Use unprivileged user namespaces (Tier C) where the host allows them.
    /// false: act as on a host without them (the fallback policy decides),
    /// for hosts where they exist but misbehave.
    pub user_namespaces: bool,
}

/// The audit journal (`[journal]`): where the broker records every request,
/// decision, approval and run, hash-chained (see `docs/journal.md`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JournalConfig {
    /// Record events; off, results say so (no `journal` in their attestation).
    pub enabled: bool,
    /// The journal's directory; default `$PALISADE_JOURNAL`, else
    /// `/var/lib/palisade/journal` for root, `$XDG_STATE_HOME/palisade/journal` for a user.
    pub path: Option<PathBuf>,
    /// A segment that reached this size is closed and a new one started.
    pub segment_bytes: u64,
    /// Retention by age: when a segment is closed, the oldest segments whose
    /// records are all older than this many days are removed (and a record
    /// says so); absent: every segment is kept. By age, never by volume: a
    /// requester's flood cannot push anybody's records out (it meets
    /// `min_free_bytes` instead).
    pub keep_days: Option<u32>,
    /// Gone: retention by count let one requester's volume push every other
    /// record out. Refused with the reason; `keep_days` replaces it.
    pub keep_segments: Option<Spanned<toml::Value>>,
    /// The group that may read the journal (a gid or a group's name), e.g.
    /// the approvers': directory 0750 and files 0640 instead of 0700 and 0600.
    pub reader_gid: Option<Spanned<IdOrName>>,
    /// The free space (bytes) the journal's filesystem keeps: below it, new
    /// runs (and refusals) are refused `JournalUnavailable` before the disk
    /// is full, while the records of what is under way are still written.
    /// 0: no floor.
    pub min_free_bytes: u64,
    /// Refusals of one uid recorded one by one in each period; past that,
    /// they are counted, and a `refusals_summarized` record gives the count
    /// when the period ends (or the broker stops).
    pub refusals_recorded: u32,
    /// The period of `refusals_recorded`, in seconds.
    pub refusal_period_secs: u64,
}

/// A segment's default size: large enough that rotation is rare, small
/// enough that one segment is read in a moment.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;

/// The default free-space floor: room for the records of the runs under
/// way when it is reached (each record is at most 1 MiB, most under 2 KiB)
/// and for the segment's next reserve (1 MiB), with the rest of the host's
/// needs well clear of a full disk.
pub const DEFAULT_MIN_FREE_BYTES: u64 = 64 << 20;

/// Refusals of one uid recorded one by one per period, by default: enough
/// to see what a client was refused and why; a client refused in a loop is
/// counted past them.
pub const DEFAULT_REFUSALS_RECORDED: u32 = 20;

/// The default period of `refusals_recorded`: a minute.
pub const DEFAULT_REFUSAL_PERIOD_SECS: u64 = 60;

/// The longest `refusal_period_secs`: a day; the counts of a longer period
/// would wait too long for their record.
pub const MAX_REFUSAL_PERIOD_SECS: u64 = 86_400;

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            enabled: true,
            path: None,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            keep_days: None,
            keep_segments: None,
            reader_gid: None,
            min_free_bytes: DEFAULT_MIN_FREE_BYTES,
            refusals_recorded: DEFAULT_REFUSALS_RECORDED,
            refusal_period_secs: DEFAULT_REFUSAL_PERIOD_SECS,
        }
    }
}

/// Requests held for all clients: sixteen of the largest frames (8 MiB)
/// at once, a small part of a host's memory, where without a budget a
/// thousand stalled connections could hold 8 GiB.
pub const DEFAULT_REQUEST_BUFFER_BYTES: usize = 128 << 20;
/// Requests held for one uid: four of the largest frames at once, so that
/// one user's clients take at most a quarter of the whole.
pub const DEFAULT_REQUEST_BUFFER_BYTES_PER_UID: usize = 32 << 20;

impl JournalConfig {
    fn check(&self) -> Result<(), (usize, String)> {
        if let Some(old) = &self.keep_segments {
            return Err((
                old.span().start,
                "journal.keep_segments is gone: retention by count let one requester's volume push \
                 every other record out; use keep_days (retention by age)"
                    .into(),
            ));
        }
        if self.segment_bytes < 4096 || self.keep_days == Some(0) {
            return Err((0, "journal.segment_bytes must be at least 4096 and keep_days at least 1".into()));
        }
        if !(1..=MAX_REFUSAL_PERIOD_SECS).contains(&self.refusal_period_secs) {
            return Err((
                0,
                format!("journal.refusal_period_secs must be from 1 to {MAX_REFUSAL_PERIOD_SECS}"),
            ));
        }
        if self.path.as_ref().is_some_and(|p| !p.is_absolute()) {
            return Err((0, "journal.path must be an absolute path".into()));
        }
        Ok(())
    }
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            socket: None,
            socket_mode: 0o660,
            allowed_uids: vec![],
            allowed_gids: vec![],
            max_concurrent: 16,
            max_queued: 128,
            max_concurrent_per_uid: None,
            max_queued_per_uid: None,
            max_sessions_per_uid: 8,
            max_memory_mb_per_uid: 0,
            prespawn: 2,
            warm: true,
            etc_snapshot: true,
            helper: None,
            sandbox_ids: SandboxIds::default(),
            max_connections: 1024,
            max_connections_per_uid: 256,
            idle_timeout_secs: 60,
            request_buffer_bytes: DEFAULT_REQUEST_BUFFER_BYTES,
            request_buffer_bytes_per_uid: DEFAULT_REQUEST_BUFFER_BYTES_PER_UID,
            frame_timeout_secs: 10,
            cgroup_root: None,
            user_namespaces: true,
            owner_widens: true,
        }
    }
}

/// A block of host ids (see [`BrokerConfig::sandbox_ids`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxIds {
    pub first: u32,
    pub count: u32,
}

impl Default for SandboxIds {
    /// systemd's host id ranges leave 1879048192 (0x70000000) and up to
    /// 2147483647 unused by users, DynamicUser and containers; subordinate
    /// id ranges (/etc/subuid) start far lower by default.
    fn default() -> Self {
        SandboxIds { first: 0x7000_0000, count: 65536 }
    }
}

impl SandboxIds {
    /// The host ids the sandboxes of requesting uid `uid` run as.
    pub fn for_requester(&self, uid: u32) -> Result<palisade_protocol::HostIds, String> {
        if uid >= self.count {
            return Err(format!(
                "uid {uid} has no sandbox ids: [broker] sandbox_ids covers requesting uids below {}",
                self.count
            ));
        }
        let id = self.first + uid;
        Ok(palisade_protocol::HostIds { uid: id, gid: id })
    }

    /// The last id of the block.
    pub fn last(&self) -> u32 {
        self.first + (self.count - 1)
    }
}

/// What to do where Tier C (user namespaces) is unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FallbackPolicy {
    /// Refuse to run (the default).
    #[default]
    Deny,
    /// Ask a person before running in Tier B.
    RequestApproval,
    /// Log a warning and run in Tier B (Landlock, seccomp, rlimits; no namespaces).
    WarnAndExecute,
}

/// How a run's writes to a host directory are bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DiskMode {
    #[default]
    Overlay,
    Direct,
}

/// Rules that hold for every run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    pub fallback: FallbackPolicy,
    /// How long a run that needs approval (`request_approval`, a tool's
    /// trust stage) waits for an answer before it is refused.
    pub approval_timeout_secs: u64,
    /// Refuse runs where no cgroup enforces memory, processes and CPU (see
    /// `palisade doctor`); rlimits alone do not bound a process tree.
    pub require_cgroup: bool,
    /// Landlock features every sandbox must have enforced (`fs`, `fs.refer`,
    /// `fs.truncate`, `net.tcp`, `scope.abstract_unix`, `scope.signal`); runs
    /// are refused on a kernel that lacks one. Tier B always requires `fs`.
    pub require_landlock: Vec<Spanned<String>>,
    /// Where per-run host directories go (Tier B's private /tmp and temp workspaces).
    pub temp_root: Option<PathBuf>,
    pub max_command_bytes: usize,
    pub max_arguments: usize,
    pub max_argument_bytes: usize,
    pub max_env_vars: usize,
    /// Output is read and forwarded in chunks of at most this size; the quota
    /// is checked on each, so the size never lets a byte past it through.
    pub capture_chunk_bytes: usize,
    /// Globs denied even inside an allowed root (added to the built-in list).
    pub sensitive_paths: Vec<Spanned<String>>,
    /// Regular expressions refused anywhere in a command line (added to the built-in list).
    pub blocked_patterns: Vec<Spanned<String>>,
    /// Interpreter names (globs) added to the built-in deny-list.
    pub interpreters: Vec<Spanned<String>>,
    /// Globs of files the host executes (relative to a granted directory,
    /// `**/` for any depth), added to the built-in list
    /// (`host_executed::HOST_EXECUTED`): a run's change to one is withheld
    /// from the copy-back, never applied by itself.
    pub host_executed: Vec<Spanned<String>>,
    /// `${PROJECT_ROOT}` in presets; default: the request's workspace.
    pub project_root: Option<PathBuf>,
    /// A file of Cedar policies (see docs/cedar.md), evaluated after the
    /// built-in checks, which it can only narrow; relative to the
    /// configuration file's directory.
    pub cedar: Option<Spanned<PathBuf>>,
    /// The policies of `cedar`, parsed and validated when the file is loaded.
    #[serde(skip)]
    pub cedar_policies: Option<Arc<CedarPolicies>>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            fallback: FallbackPolicy::Deny,
            approval_timeout_secs: 300,
            require_cgroup: false,
            require_landlock: vec![],
            temp_root: None,
            max_command_bytes: 256,
            max_arguments: 128,
            max_argument_bytes: 4096,
            max_env_vars: 32,
            capture_chunk_bytes: 65536,
            sensitive_paths: vec![],
            blocked_patterns: vec![],
            interpreters: vec![],
            host_executed: vec![],
            project_root: None,
            cedar: None,
            cedar_policies: None,
        }
    }
}

impl PolicyConfig {
    pub fn required_landlock(&self) -> LandlockFeatures {
        self.require_landlock
            .iter()
            .filter_map(|n| LandlockFeatures::TABLE.iter().find(|(_, _, name)| name == n.get_ref()))
            .fold(LandlockFeatures::EMPTY, |acc, (f, _, _)| acc.union(*f))
    }
}

/// The profile `palisade run` uses when no tool is named: the workspace
/// read-write, system directories read-only, no network, forking allowed.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DefaultProfile {
    pub network: NetworkCapability,
    pub egress: EgressMode,
    pub environment: EnvironmentCapability,
    pub no_fork: bool,
    pub max_execution_time: u64,
    pub max_memory_mb: u64,
    pub max_processes: u64,
    /// Percent of one CPU the run's cgroup may use (cpu.max); 0: no limit.
    pub max_cpu_percent: u64,
    pub max_open_files: u64,
    pub max_file_size_mb: u64,
    pub tmp_size_mb: u64,
    pub max_output_bytes: u64,
    /// How far `palisade run --timeout` may raise `max_execution_time` with
    /// an embedded broker (seconds); a daemon's policy is only narrowed.
    pub timeout_ceiling_secs: u64,
    /// How far `palisade run --max-output` may raise `max_output_bytes`
    /// with an embedded broker.
    pub max_output_ceiling_bytes: u64,
    /// Extra paths visible read-only (and executable) in the sandbox.
    pub read_only: Vec<PathBuf>,
    /// Extra paths writable in the sandbox, as the workspace is (each must
    /// exist; a root broker checks that the requester owns it).
    pub read_write: Vec<PathBuf>,
    /// Variables a request may pass to the command beyond those
    /// `environment` passes (by name, with the client's value).
    pub pass_env: Vec<String>,
    /// How writes to the workspace are bounded (Tier C): "overlay" holds them
    /// in a layer on disk (in the broker's state) and applies them as a
    /// change set when the run is over; "direct" writes through, bounded by
    /// RLIMIT_FSIZE per file only.
    pub disk: DiskMode,
    /// The bound of an overlay run's writes, all its layers together (and
    /// of its files: one per 8 KiB of it): past it, the run is stopped
    /// (`DiskLimitExceeded`) and its writes held. The broker checks it every
    /// [`DISK_CHECK_MS`]; a run writing faster may pass it by what it writes
    /// in that time.
    pub max_disk_mb: u64,
    pub allow_interpreters: bool,
    pub allow_inline_code: bool,
    /// Empty: any executable the sandbox can see.
    pub allowed_executables: Vec<Spanned<String>>,
    /// Programs in the workspace may be executed (builds run what they build).
    pub exec_in_workspace: bool,
    /// The command's toolchain is visible read-only: its executable, each
    /// `#!` interpreter it leads to, and the directory each is installed in
    /// (a pyenv, nvm, asdf, rustup or uv installation, `~/.cargo/bin`,
    /// `~/.local/bin`), never a sensitive path.
    pub toolchains: bool,
    /// The requester's git identity (`user.name`, `user.email` of its
    /// global git configuration, nothing else) is given to the run as
    /// git's `GIT_AUTHOR_*` and `GIT_COMMITTER_*` variables.
    pub git_identity: bool,
    /// What becomes of a run's writes (the overlay's change set):
    /// "apply_unless_ended" (applied when the command exits by itself,
    /// held when palisade ends the run), "always_hold", "discard_when_ended".
    pub keep_changes: KeepChanges,
    /// A path someone else changed on the host while the run ran:
    /// "keep_host" (the run's version held, the rest applied), "hold"
    /// (nothing applied), "overwrite" (the run's version applied).
    pub on_conflict: OnConflict,
    /// A request may ask to write in place (`direct`, `palisade run
    /// --direct`) though `disk` is "overlay".
    pub allow_direct: bool,
    /// Strict egress: domains whose TLS the broker terminates, and rules on
    /// their requests (see `inspect.rs`).
    pub inspect: Inspection,
}

impl Default for DefaultProfile {
    fn default() -> Self {
        DefaultProfile {
            network: NetworkCapability::Deny,
            egress: EgressMode::Preflight,
            environment: EnvironmentCapability::Restricted,
            no_fork: false,
            max_execution_time: 300,
            max_memory_mb: 512,
            max_processes: 256,
            max_cpu_percent: 0,
            max_open_files: 1024,
            max_file_size_mb: 1024,
            tmp_size_mb: 256,
            max_output_bytes: 64 << 20,
            timeout_ceiling_secs: 3600,
            max_output_ceiling_bytes: 1 << 30,
            read_only: vec![],
            read_write: vec![],
            pass_env: vec![],
            disk: DiskMode::Overlay,
            // A build's outputs (a crate's target/, a project's node_modules) reach gigabytes.
            max_disk_mb: 16 << 10,
            allow_interpreters: false,
            allow_inline_code: false,
            allowed_executables: vec![],
            exec_in_workspace: true,
            toolchains: true,
            git_identity: true,
            keep_changes: KeepChanges::default(),
            on_conflict: OnConflict::default(),
            allow_direct: false,
            inspect: Inspection::default(),
        }
    }
}

/// A declared tool: a preset (or the conservative defaults), overrides, and
/// parameter bindings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    pub preset: Option<Spanned<String>>,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub overrides: Overrides,
    #[serde(default)]
    pub parameters: BTreeMap<String, Binding>,
    #[serde(default)]
    pub allowed_executables: Vec<Spanned<String>>,
    #[serde(default)]
    pub allow_interpreters: bool,
    #[serde(default)]
    pub allow_inline_code: bool,
    #[serde(default)]
    pub egress: EgressMode,
    #[serde(default = "default_tool_output")]
    pub max_output_bytes: u64,
    /// Refuse this tool's runs where no cgroup enforces its limits.
    #[serde(default)]
    pub require_cgroup: bool,
    /// Strict egress: domains whose TLS the broker terminates, and rules on
    /// their requests.
    #[serde(default)]
    pub inspect: Inspection,
}

fn default_tool_output() -> u64 {
    16 << 20
}

impl ToolConfig {
    /// The tool's capability declaration, one line per item, as a person
    /// reviews it (`palisade tools show`): the preset with its overrides
    /// applied, the parameters, executables, flags, egress and limits. The
    /// text is canonical (no positions, fixed order): its sha256 is the
    /// tool's capabilities hash, and a change of it puts the tool back to
    /// Draft. The description is not part of it.
    pub fn declaration(&self) -> String {
        use std::fmt::Write;
        let preset = self.preset.as_ref().and_then(|p| Preset::named(p.get_ref()));
        let base = preset.as_ref().map_or_else(Default::default, |p| p.capabilities.clone());
        let caps = self.overrides.apply(&base);
        let mut out = String::new();
        let _ = writeln!(out, "preset: {}", preset.as_ref().map_or("none", |p| p.name));
        for fs in &caps.filesystem {
            let _ = match fs {
                FsCapability::ReadOnly { path } => writeln!(out, "filesystem: read-only {path}"),
                FsCapability::ReadWrite { path } => writeln!(out, "filesystem: read-write {path}"),
                FsCapability::TempWorkspace => writeln!(out, "filesystem: temporary workspace"),
            };
        }
        let _ = writeln!(out, "network: {:?}", caps.network);
        let _ = writeln!(out, "egress: {:?}", self.egress);
        let _ = writeln!(out, "environment: {:?}", caps.environment);
        let p = caps.process;
        let _ = writeln!(
            out,
            "process: no_fork={} max_execution_time={}s max_memory_mb={} max_processes={} max_cpu_percent={}",
            p.no_fork, p.max_execution_time, p.max_memory_mb, p.max_processes, p.max_cpu_percent
        );
        for (name, b) in &self.parameters {
            let _ =
                writeln!(out, "parameter {name}: {:?}, {:?}, {:?}", b.capability, b.validation, b.mapping);
        }
        for exe in &self.allowed_executables {
            let _ = writeln!(out, "executable: {}", exe.get_ref());
        }
        let _ = writeln!(out, "allow_interpreters: {}", self.allow_interpreters);
        let _ = writeln!(out, "allow_inline_code: {}", self.allow_inline_code);
        let _ = writeln!(out, "max_output_bytes: {}", self.max_output_bytes);
        let _ = writeln!(out, "require_cgroup: {}", self.require_cgroup);
        for d in &self.inspect.domains {
            let _ = writeln!(out, "inspect: {d}");
        }
        for r in &self.inspect.requests {
            let _ = writeln!(out, "request rule: {}", r.text);
        }
        for c in &self.inspect.credentials {
            let way =
                c.header.as_deref().map_or_else(|| format!("env {:?}", c.env), |h| format!("header {h}"));
            let _ = writeln!(out, "credential {}: {} to {}", c.name(), way, c.hosts.join(", "));
        }
        out
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid { path: PathBuf, line: usize, column: usize, message: String },
    /// `[policy] cedar` names a file that cannot be read.
    #[error("{config}: [policy] cedar: cannot read {path}: {source}")]
    CedarRead { config: PathBuf, path: PathBuf, source: std::io::Error },
    /// The Cedar policies do not parse, or do not validate against the
    /// schema: each error on its own line.
    #[error("{}", cedar_lines(.path, .errors))]
    Cedar { path: PathBuf, errors: Vec<CedarError> },
}

/// `FILE:LINE:COLUMN: message`, one line per error.
fn cedar_lines(path: &Path, errors: &[CedarError]) -> String {
    let lines: Vec<String> =
        errors.iter().map(|e| format!("{}:{}:{}: {}", path.display(), e.line, e.column, e.message)).collect();
    lines.join("\n")
}

impl DefaultProfile {
    /// Deny beats allow: a configured grant of a sensitive path is a
    /// configuration error; `pass_env` holds variable names.
    fn check(&self, table: &str, sensitive: &dyn Fn(&str) -> bool) -> Result<(), (usize, String)> {
        for (key, paths) in [("read_only", &self.read_only), ("read_write", &self.read_write)] {
            if let Some(p) = paths.iter().find(|p| sensitive(&p.to_string_lossy())) {
                return Err((0, format!("{table}.{key}: {} is a sensitive path", p.display())));
            }
            if let Some(p) = paths.iter().find(|p| !p.is_absolute() && !p.starts_with("${")) {
                let p = p.display();
                return Err((0, format!("{table}.{key}: {p} is neither absolute nor a ${{TEMPLATE}}")));
            }
        }
        if let Some(n) = self.pass_env.iter().find(|n| n.is_empty() || n.contains(['=', '\0'])) {
            return Err((0, format!("{table}.pass_env: {n:?} is not a variable name")));
        }
        Ok(())
    }
}

impl Config {
    /// The text the configuration was read from (empty: the built-in one).
    pub(crate) fn text(&self) -> &str {
        &self.text.0
    }

    /// Which policy this is, for people: its file, or `built-in`.
    pub fn source_name(&self) -> String {
        self.source.as_ref().map_or_else(|| "built-in".into(), |p| p.display().to_string())
    }

    /// `[defaults]` and each `[profiles.NAME]`, with the table that holds it.
    pub fn profile_tables(&self) -> impl Iterator<Item = (String, &DefaultProfile)> {
        std::iter::once(("defaults".to_string(), &self.defaults))
            .chain(self.profiles.iter().map(|(name, p)| (format!("profiles.{name}"), p)))
    }

    /// The profile a request names (`None`: `[defaults]`), with its table's
    /// name; `Err` lists the declared ones.
    pub fn profile_named(&self, name: Option<&str>) -> Result<(String, &DefaultProfile), String> {
        let Some(name) = name else { return Ok(("defaults".into(), &self.defaults)) };
        self.profiles.get(name).map(|p| (format!("profiles.{name}"), p)).ok_or_else(|| {
            let known: Vec<&str> = self.profiles.keys().map(String::as_str).collect();
            format!(
                "no profile {name:?} is declared (declared: {})",
                if known.is_empty() { "none".into() } else { known.join(", ") }
            )
        })
    }

    /// The user's own configuration
    /// ([`palisade_protocol::clients::user_config`], which `palisade init`
    /// writes) where it exists, else the built-in one: what a user's
    /// daemon and the CLI's embedded broker run under unless told a file.
    /// One that cannot be read or parsed is an error naming it.
    pub fn own_or_default() -> Result<Config, ConfigError> {
        match palisade_protocol::clients::user_config().filter(|p| p.exists()) {
            Some(path) => Config::load(&path),
            None => Ok(Config::default()),
        }
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        Config::parse(&text, path)
    }

    /// Parses and checks a configuration; `path` only names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let at = |offset: usize, message: String| {
            let (line, column) = line_column(text, offset);
            ConfigError::Invalid { path: path.to_path_buf(), line, column, message }
        };
        let config: Config =
            toml::from_str(text).map_err(|e| at(e.span().map_or(0, |s| s.start), e.message().into()))?;
        config.check().map_err(|(offset, message)| at(offset, message))?;
        let mut config = config.load_cedar(path)?;
        config.source = Some(path.to_path_buf());
        config.text = SourceText(text.into());
        Ok(config)
    }

    /// Reads and validates the Cedar policies `[policy] cedar` names (a
    /// relative path is relative to the directory of `path`, the
    /// configuration file).
    fn load_cedar(mut self, path: &Path) -> Result<Config, ConfigError> {
        let Some(cedar) = &self.policy.cedar else { return Ok(self) };
        let file = path.parent().unwrap_or(Path::new("")).join(cedar.get_ref());
        let text = std::fs::read_to_string(&file).map_err(|source| ConfigError::CedarRead {
            config: path.to_path_buf(),
            path: file.clone(),
            source,
        })?;
        let policies = CedarPolicies::parse(&text, &file)
            .map_err(|errors| ConfigError::Cedar { path: file.clone(), errors })?;
        self.policy.cedar_policies = Some(Arc::new(policies));
        Ok(self)
    }

    /// Semantic checks, each failing with the byte offset it is about.
    /// Numbers that must fit where they go: the sandbox ids below the
    /// kernel's reserved ones, an output chunk in one frame.
    fn check_bounds(&self) -> Result<(), (usize, String)> {
        let ids = self.broker.sandbox_ids;
        if ids.count == 0 || ids.first.checked_add(ids.count - 1).is_none_or(|last| last >= u32::MAX - 1) {
            return Err((
                0,
                format!(
                    "broker.sandbox_ids: {} ids from {} do not fit below 4294967294",
                    ids.count, ids.first
                ),
            ));
        }
        if !(1..=MAX_CAPTURE_CHUNK_BYTES).contains(&self.policy.capture_chunk_bytes) {
            let max = MAX_CAPTURE_CHUNK_BYTES;
            return Err((
                0,
                format!("policy.capture_chunk_bytes must be from 1 to {max} (a chunk travels in one frame)"),
            ));
        }
        Ok(())
    }

    /// Every profile's and tool's `inspect` table parses.
    fn check_inspection(&self) -> Result<(), (usize, String)> {
        let tables = std::iter::once(("defaults".to_string(), &self.defaults.inspect))
            .chain(self.profiles.iter().map(|(n, p)| (format!("profiles.{n}"), &p.inspect)))
            .chain(self.tools.iter().map(|(n, t)| (format!("tools.{n}"), &t.inspect)));
        for (table, inspection) in tables {
            inspection.check().map_err(|e| (0, format!("{table}.{e}")))?;
        }
        if let Some(bundle) = self.egress.ca_bundle.as_ref().filter(|p| !p.is_absolute()) {
            return Err((0, format!("egress.ca_bundle must be an absolute path, not {}", bundle.display())));
        }
        Ok(())
    }

    fn check(&self) -> Result<(), (usize, String)> {
        self.check_bounds()?;
        self.egress.check()?;
        self.plugins.check()?;
        if self.trust.trial_runs == 0 {
            return Err((0, "trust.trial_runs must be at least 1".into()));
        }
        if self.broker.max_connections == 0 || self.broker.max_connections_per_uid == 0 {
            return Err((0, "broker.max_connections and max_connections_per_uid must be at least 1".into()));
        }
        if self.broker.frame_timeout_secs == 0 {
            return Err((0, "broker.frame_timeout_secs must be at least 1".into()));
        }
        self.journal.check()?;
        self.check_inspection()?;
        if self.changes.max_sets == 0 || self.changes.max_age_days == 0 {
            return Err((0, "changes.max_sets and changes.max_age_days must be at least 1".into()));
        }
        if self.changes.dir.as_ref().is_some_and(|p| !p.is_absolute()) {
            return Err((0, "changes.dir must be an absolute path".into()));
        }
        for name in &self.policy.require_landlock {
            if !LandlockFeatures::TABLE.iter().any(|(_, _, n)| n == name.get_ref()) {
                let known: Vec<&str> = LandlockFeatures::TABLE.iter().map(|(_, _, n)| *n).collect();
                return Err((
                    name.span().start,
                    format!("unknown Landlock feature {:?} (known: {})", name.get_ref(), known.join(", ")),
                ));
            }
        }
        for pattern in &self.policy.blocked_patterns {
            regex::Regex::new(pattern.get_ref())
                .map_err(|e| (pattern.span().start, format!("blocked_patterns: {e}")))?;
        }
        for glob in self
            .policy
            .sensitive_paths
            .iter()
            .chain(&self.policy.interpreters)
            .chain(&self.policy.host_executed)
        {
            globset::Glob::new(glob.get_ref())
                .map_err(|e| (glob.span().start, format!("bad glob {:?}: {e}", glob.get_ref())))?;
        }
        // Deny beats allow, here too: a configured grant of a sensitive path
        // is a configuration error (templates are checked at each request).
        let configured = self.policy.sensitive_paths.iter().map(|s| s.get_ref().clone());
        let rules = crate::sensitive::Sensitive::new(configured);
        let sensitive = |path: &str| !path.contains("${") && rules.matches(Path::new(path), None);
        for (table, profile) in self.profile_tables() {
            profile.check(&table, &sensitive)?;
        }
        for exe in self
            .profile_tables()
            .flat_map(|(_, p)| &p.allowed_executables)
            .chain(self.tools.values().flat_map(|t| &t.allowed_executables))
        {
            configured_executable(exe.get_ref())
                .map_err(|e| (exe.span().start, format!("allowed_executables: {e}")))?;
        }
        for (name, tool) in &self.tools {
            let preset = match &tool.preset {
                Some(p) => Some(Preset::named(p.get_ref()).ok_or_else(|| {
                    (
                        p.span().start,
                        format!(
                            "tool {name}: unknown preset {:?} (known: {})",
                            p.get_ref(),
                            Preset::NAMES.join(", ")
                        ),
                    )
                })?),
                None => None,
            };
            if let Some(preset) = &preset {
                tool.overrides.check_against(preset).map_err(|(offset, field)| {
                    (
                        offset,
                        format!(
                            "tool {name}: the {field} of preset {} is immutable; the override is refused",
                            preset.name
                        ),
                    )
                })?;
                if preset.immutable.filesystem {
                    if let Some((param, _)) = tool.parameters.iter().next() {
                        return Err((
                            tool.preset.as_ref().map_or(0, |p| p.span().start),
                            format!(
                                "tool {name}: parameter {param} binds a filesystem capability, but the filesystem of preset {} is immutable",
                                preset.name
                            ),
                        ));
                    }
                }
            }
            if let Some(fs) = &tool.overrides.filesystem {
                for cap in fs.get_ref() {
                    if let FsCapability::ReadOnly { path } | FsCapability::ReadWrite { path } = cap {
                        if !path.starts_with('/') && !path.starts_with("${") {
                            return Err((
                                fs.span().start,
                                format!("tool {name}: filesystem path {path:?} must be absolute"),
                            ));
                        }
                        if sensitive(path) {
                            return Err((
                                fs.span().start,
                                format!("tool {name}: {path} is a sensitive path and cannot be granted"),
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// An executable the configuration names, looked up on this host as the
/// file is read: the one read of the host, beyond the file itself and
/// canonical paths, that the policy crate makes (decisions read the host
/// through [`crate::HostFiles`]).
fn configured_executable(name: &str) -> Result<PathBuf, String> {
    let is_executable = |p: &Path| p.metadata().is_ok_and(|m| m.is_file() && has_execute_bits(&m));
    crate::paths::find_executable(name, &is_executable, &|p| p.canonicalize())
}

#[cfg(unix)]
fn has_execute_bits(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    m.permissions().mode() & crate::host::EXECUTE_BITS != 0
}

/// Windows has no execute bits: any file may be named (nothing runs there:
/// runs are refused on Windows).
#[cfg(not(unix))]
fn has_execute_bits(_: &std::fs::Metadata) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("p.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn unknown_keys_are_refused_with_line_and_column() {
        let err = parse("[broker]\nmax_concurrent = 4\nmax_concurent = 5\n").unwrap_err();
        assert!(err.starts_with("p.toml:3:1: unknown field `max_concurent`"), "{err}");
        let err = parse("[tools.x]\npreset = \"file_processor\"\n[tools.x.overrides]\nnetwrk = \"deny\"\n")
            .unwrap_err();
        assert!(err.starts_with("p.toml:4:1: unknown field `netwrk`"), "{err}");
    }

    #[test]
    fn bad_values_are_refused_with_line_and_column() {
        let err = parse("[defaults]\nmax_execution_time = \"soon\"\n").unwrap_err();
        assert!(err.starts_with("p.toml:2:22: invalid type"), "{err}");
        let err = parse("[defaults]\nnetwork = \"sometimes\"\n").unwrap_err();
        assert!(err.starts_with("p.toml:2:11: "), "{err}");
        let err = parse("[policy]\nfallback = \"pray\"\n").unwrap_err();
        assert!(err.starts_with("p.toml:2:12: unknown variant `pray`"), "{err}");
        let err = parse("[policy]\nrequire_landlock = [\"fs\", \"net.udp\"]\n").unwrap_err();
        assert!(err.starts_with("p.toml:2:27: unknown Landlock feature \"net.udp\""), "{err}");
        let err = parse("[defaults]\nallowed_executables = [\"no-such-program-xyz\"]\n").unwrap_err();
        assert!(err.starts_with("p.toml:2:24: allowed_executables: "), "{err}");
        let err =
            parse("[policy]\nfallback = \"deny\"\nblocked_patterns = [\"ok\", \"(unclosed\"]\n").unwrap_err();
        assert!(err.starts_with("p.toml:3:27: blocked_patterns: "), "{err}");
        let err = parse("[policy]\n\nsensitive_paths = [\"a[\"]\n").unwrap_err();
        assert!(err.starts_with("p.toml:3:20: bad glob"), "{err}");
    }

    #[test]
    fn capability_tables_take_exactly_their_keys() {
        let tool = |fs: &str| format!("[tools.t]\n[tools.t.overrides]\nfilesystem = [{fs}]\n");
        for (fs, want) in [
            ("{ read_only = \"/srv\", mode = \"x\" }", "exactly one key"),
            ("{ read_only = \"/srv\", read_write = \"/tmp\" }", "exactly one key"),
            ("{ read_olny = \"/srv\" }", "unknown filesystem capability \"read_olny\""),
            ("{ read_only = 7 }", "read_only must be a path"),
            ("\"tmp_workspace\"", "unknown filesystem capability \"tmp_workspace\""),
        ] {
            let err = parse(&tool(fs)).unwrap_err();
            assert!(err.starts_with("p.toml:3:") && err.contains(want), "{fs}: {err}");
        }
        assert!(parse(&tool("{ read_only = \"/srv\" }, \"temp_workspace\"")).is_ok());
        let net = |n: &str| format!("[defaults]\nnetwork = {n}\n");
        for (n, want) in [
            ("{ allow_domains = [\"a.example\"], extra = 1 }", "exactly the key allow_domains"),
            ("{ allow_domains = \"a.example\" }", "must be a list"),
            ("{ allow_domains = [1] }", "names (strings)"),
        ] {
            let err = parse(&net(n)).unwrap_err();
            assert!(err.starts_with("p.toml:2:") && err.contains(want), "{n}: {err}");
        }
        assert!(parse(&net("{ allow_domains = [\"a.example\", \"*.b.example\"] }")).is_ok());
    }

    #[test]
    fn overriding_an_immutable_field_is_refused() {
        let text =
            "[tools.fetch]\npreset = \"file_processor\"\n[tools.fetch.overrides]\nnetwork = \"allow_all\"\n";
        let err = parse(text).unwrap_err();
        assert_eq!(
            err,
            "p.toml:4:11: tool fetch: the network of preset file_processor is immutable; the override is refused"
        );
        let text = "[tools.s]\npreset = \"web_scraper\"\n[tools.s.overrides]\nfilesystem = [{ read_only = \"/srv\" }]\n";
        assert!(parse(text).unwrap_err().contains("the filesystem of preset web_scraper is immutable"));
        let text = "[tools.s]\npreset = \"web_scraper\"\n[tools.s.parameters.out]\ncapability = \"filesystem.read_write\"\nvalidation = \"is_directory\"\nmapping = \"single\"\n";
        assert!(parse(text).unwrap_err().contains("filesystem of preset web_scraper is immutable"));
        // data_transformer has no immutable field; file_processor's process is mutable.
        let ok = "[tools.t]\npreset = \"data_transformer\"\n[tools.t.overrides]\nnetwork = \"allow_all\"\nprocess = { max_memory_mb = 64 }\n";
        assert!(parse(ok).is_ok());
        let err = parse("[tools.t]\npreset = \"fast\"\n").unwrap_err();
        assert!(err.starts_with("p.toml:2:10: tool t: unknown preset \"fast\""), "{err}");
    }

    #[test]
    fn the_egress_table_is_checked_key_by_key() {
        let c = parse("").unwrap();
        assert_eq!((c.egress.ports.as_slice(), c.egress.transparent), (&[443, 80][..], true));
        assert_eq!(
            (c.egress.max_connections, c.egress.max_bytes, c.egress.idle_timeout_secs),
            (64, 1 << 30, 60)
        );
        let ok = "[egress]\nports = [443]\ntransparent = false\nallow_addresses = [\"10.0.0.0/8\", \"::1\"]\n\
                  hosts = { \"Origin.Test.\" = \"127.0.0.1\", \"b.test\" = [\"::1\", \"10.0.0.2\"] }\n\
                  max_connections = 8\nmax_bytes = 1048576\nidle_timeout_secs = 5\n";
        let c = parse(ok).unwrap();
        assert_eq!(c.egress.allowed_addresses().len(), 2);
        assert_eq!(c.egress.host_map()["origin.test"], ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]);
        for (text, want) in [
            (
                "[egress]\nallow_addresses = [\"10.0.0.0/33\"]\n",
                "p.toml:2:20: egress.allow_addresses: \"10.0.0.0/33\" is not an address or CIDR range",
            ),
            (
                "[egress]\nallow_addresses = [\"localhost\"]\n",
                "p.toml:2:20: egress.allow_addresses: \"localhost\"",
            ),
            (
                "[egress]\nhosts = { \"a.test\" = \"300.1.1.1\" }\n",
                "p.toml:2:22: egress.hosts: a.test: \"300.1.1.1\" is not an IPv4 or IPv6 address",
            ),
            ("[egress]\nhosts = { \"a.test\" = [] }\n", "p.toml:2:22: egress.hosts: a.test has no address"),
            ("[egress]\nhosts = { \"a.test\" = 7 }\n", "p.toml:2:"),
            ("[egress]\nport = [443]\n", "p.toml:2:1: unknown field `port`"),
            ("[egress]\nports = [0]\n", "p.toml:1:1: egress.ports: 0 is not a port"),
            ("[egress]\nports = [70000]\n", "p.toml:2:10: "),
            (
                "[egress]\nmax_bytes = 0\n",
                "p.toml:1:1: egress.max_connections, max_bytes and idle_timeout_secs must be at least 1",
            ),
            ("[egress]\ntransparent = \"yes\"\n", "p.toml:2:15: invalid type"),
            (
                "[plugins]\nhost_memory_bytes = 65536\n",
                "p.toml:1:1: plugins.host_memory_bytes must be at least max_memory_bytes",
            ),
            ("[profiles.b]\nallow_interpreter = true\n", "p.toml:2:1: unknown field `allow_interpreter`"),
            (
                "[profiles.b]\nread_write = [\"/etc/shadow\"]\n",
                "p.toml:1:1: profiles.b.read_write: /etc/shadow is a sensitive path",
            ),
            (
                "[defaults]\nread_only = [\"srv\"]\n",
                "p.toml:1:1: defaults.read_only: srv is neither absolute",
            ),
            (
                "[profiles.b]\npass_env = [\"A=B\"]\n",
                "p.toml:1:1: profiles.b.pass_env: \"A=B\" is not a variable name",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.starts_with(want), "{text}: {err}");
        }
    }

    #[test]
    fn an_empty_file_gives_the_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.broker.socket_mode, 0o660);
        assert_eq!(c.defaults.max_execution_time, 300);
        assert_eq!(c.policy.max_env_vars, 32);
        assert_eq!(c.policy.fallback, FallbackPolicy::Deny);
    }

    #[test]
    fn the_plugins_table_is_strict_and_has_defaults() {
        let c = parse("").unwrap();
        assert!(!c.plugins.enabled && !c.plugins.allow_inline_modules);
        assert_eq!(c.plugins.fuel_budget, DEFAULT_PLUGIN_FUEL);
        assert_eq!(c.plugins.max_memory_bytes, 64 << 20);
        let c = parse("[plugins]\nenabled = true\nallow_secrets = [\"k\"]\n").unwrap();
        assert!(c.plugins.enabled);
        assert_eq!(c.plugins.allow_secrets, ["k"]);
        let e = parse("[plugins]\nenabled = true\nfuel = 3\n").unwrap_err();
        assert!(e.contains(":3:") && e.contains("fuel"), "{e}");
        assert!(parse("[plugins]\ntimeout_ms = 0\n").unwrap_err().contains("timeout_ms"));
        assert!(parse("[plugins]\nskills_dir = \"rel\"\n").unwrap_err().contains("absolute"));
    }

    /// The request budgets and the frame deadline: their defaults, keys and bound.
    #[test]
    fn the_request_budgets_have_defaults_and_the_frame_deadline_a_bound() {
        let c = parse("").unwrap();
        assert_eq!(c.broker.request_buffer_bytes, 128 << 20);
        assert_eq!(c.broker.request_buffer_bytes_per_uid, 32 << 20);
        assert_eq!(c.broker.frame_timeout_secs, 10);
        let c = parse(
            "[broker]\nrequest_buffer_bytes = 0\nrequest_buffer_bytes_per_uid = 5\nframe_timeout_secs = 1\n",
        )
        .unwrap();
        assert_eq!((c.broker.request_buffer_bytes, c.broker.request_buffer_bytes_per_uid), (0, 5));
        let e = parse("[broker]\nframe_timeout_secs = 0\n").unwrap_err();
        assert!(e.contains("broker.frame_timeout_secs must be at least 1"), "{e}");
    }

    #[test]
    fn the_journal_keeps_by_age_a_floor_and_a_refusal_rate() {
        let c = parse("").unwrap();
        assert_eq!(
            (c.journal.keep_days, c.journal.min_free_bytes, c.journal.refusals_recorded),
            (None, DEFAULT_MIN_FREE_BYTES, DEFAULT_REFUSALS_RECORDED)
        );
        assert_eq!(c.journal.refusal_period_secs, DEFAULT_REFUSAL_PERIOD_SECS);
        let c = parse("[journal]\nkeep_days = 30\nmin_free_bytes = 0\nrefusals_recorded = 0\n").unwrap();
        assert_eq!(
            (c.journal.keep_days, c.journal.min_free_bytes, c.journal.refusals_recorded),
            (Some(30), 0, 0)
        );
        // Retention by count is gone, with the reason and where it was asked for.
        let e = parse("[journal]\n\nkeep_segments = 2\n").unwrap_err();
        assert!(e.contains(":3:") && e.contains("keep_days"), "{e}");
        assert!(parse("[journal]\nkeep_days = 0\n").unwrap_err().contains("keep_days"));
        assert!(parse("[journal]\nrefusal_period_secs = 0\n").unwrap_err().contains("refusal_period_secs"));
        assert!(parse("[journal]\nrefusal_period_secs = 86401\n").is_err());
    }

    #[test]
    fn the_example_configuration_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../palisade.example.toml");
        Config::load(&path).unwrap();
    }

    /// `palisade init`'s starter parses, and declares the profile the
    /// documentation's examples name (`--profile sh`).
    #[test]
    fn the_starter_configuration_parses_and_declares_sh() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/user/palisade.toml");
        let config = Config::load(&path).unwrap();
        let sh = config.profile_named(Some("sh")).unwrap().1;
        assert!(sh.allow_interpreters && sh.allow_inline_code);
    }
}
