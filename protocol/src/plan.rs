//! The `JailPlan`: what the broker hands the helper on fd 3.
//!
//! A plan is fully resolved: the helper decides nothing, it applies the plan in
//! a fixed order and execs. On the wire a plan is a small fixed header (magic,
//! version, architecture) followed by a bincode 2 body; the header is checked
//! before the body is decoded, so a version or architecture mismatch is named as
//! such rather than showing up as a decoding error.

use serde::{Deserialize, Serialize};
use std::fmt;

/// First bytes of every encoded plan.
pub const PLAN_MAGIC: [u8; 4] = *b"PJP\x01";
/// Bumped on every incompatible change of [`JailPlan`].
pub const PLAN_VERSION: u32 = 9;
/// Largest encoded plan the helper accepts (seccomp program included).
pub const PLAN_MAX_BYTES: usize = 1 << 20;
/// Most descriptors a plan may come with: what one `SCM_RIGHTS` message
/// carries (the kernel's `SCM_MAX_FD`).
pub const PLAN_MAX_DESCRIPTORS: usize = 253;
/// The architecture this build runs on and compiles seccomp programs for.
pub const PLAN_ARCH: &str = std::env::consts::ARCH;

/// Value of an rlimit that means "no limit".
pub const RLIM_INFINITY: u64 = u64::MAX;

/// Everything the helper needs to build one sandbox and exec one command.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct JailPlan {
    /// Absolute path of the executable.
    pub program: String,
    /// Full argument vector, `argv[0]` included.
    pub argv: Vec<String>,
    /// The complete environment of the command; nothing else is inherited.
    pub env: Vec<(String, String)>,
    /// Working directory of the command (inside the sandbox's root).
    pub cwd: String,
    /// User id of the command inside the sandbox.
    pub uid: u32,
    /// Group id of the command inside the sandbox.
    pub gid: u32,
    /// Namespaces to create. None at all selects Tier B.
    pub namespaces: Namespaces,
    /// For a helper started by root (Tier C only): the unprivileged host ids the
    /// sandbox runs as, so that no sandboxed process is ever host root (whose
    /// process count RLIMIT_NPROC ignores, and who owns most of the host's
    /// files).
    pub host_ids: Option<HostIds>,
    /// With `host_ids`: the ids of the requester, on whose behalf the broker
    /// runs. Owned binds are idmapped so that the requester's files appear
    /// owned by the sandbox, and what it creates is stored as the
    /// requester's; every other file is the sandbox's as it is anybody's
    /// (the permissions of "others"). The sandbox gets the requester's
    /// access, never the broker's.
    pub acting_for: Option<HostIds>,
    /// The host paths the broker opened for this run, as the requester, in the
    /// order of the descriptors that come with the plan on fd 3. Every bind
    /// and overlay source is one of them, and in Tier B every Landlock path:
    /// the helper builds the sandbox from these descriptors and never
    /// resolves a path a request named on its own.
    pub descriptors: Vec<HostPath>,
    /// The sandbox's root, in order (parents before children). Empty in Tier B.
    pub mounts: Vec<Mount>,
    /// Host name inside a new UTS namespace.
    pub hostname: Option<String>,
    /// Bring `lo` up inside a new network namespace.
    pub loopback: bool,
    /// Strict egress: the sockets the helper opens inside the new network
    /// namespace (after `lo` is up) and hands to the broker on the status
    /// channel, in one [`crate::status::HelperRecord::Listeners`] record,
    /// before the command runs. No process of the sandbox keeps them.
    pub listeners: Vec<Listener>,
    /// Resource limits, applied to the command and inherited by its children.
    pub rlimits: Rlimits,
    /// Landlock rules, applied after the mounts and before seccomp.
    pub landlock: LandlockPlan,
    /// Compiled classic BPF program installed last, right before `execve`.
    pub seccomp: Vec<BpfInstruction>,
    /// Compiled classic BPF program of the helper's own processes that stay
    /// beside the command (pid 1 of a Tier C sandbox): what reaping, relaying
    /// signals and reporting need, and nothing else.
    pub monitor_seccomp: Vec<BpfInstruction>,
    /// The run's cgroup, created by the broker; the helper joins it through fd 5.
    pub cgroup: Option<String>,
    /// Pid of the process that must stay alive for the sandbox to live (the broker).
    pub parent_pid: u32,
    /// The command's umask (the requester's, at most 0o777), set just
    /// before exec; `None`: the helper's own (the broker's).
    pub umask: Option<u32>,
    /// The command's stdin, stdout and stderr are one pseudo-terminal of
    /// the sandbox's devpts, of this window size, and its controlling
    /// terminal; its master goes to the broker in a
    /// [`crate::status::HelperRecord::Terminal`] record before exec.
    pub terminal: Option<WindowSize>,
    /// A session's part (Tier C only): see [`SessionRole`].
    pub session: Option<SessionRole>,
}

/// What a run is to a session, a sandbox that outlives one command.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionRole {
    /// Builds the session's sandbox and keeps it: its process execs
    /// nothing, and sends the namespaces it is in to the broker (a
    /// [`crate::status::HelperRecord::Session`] record, before Landlock),
    /// then waits under the command's filter until the sandbox is torn down.
    Hold,
    /// Runs the command in a held session: its namespaces come with the
    /// plan after the descriptors of its host paths, in the order of
    /// [`Namespaces::names`]; no root is built (the plan's mounts are the
    /// session's, already in place), and the command's monitor stays
    /// outside its pid namespace, whose pid 1 is the session's.
    Join,
}

impl JailPlan {
    /// The tier this plan asks for, as reported in attestations.
    pub fn tier(&self) -> Tier {
        if self.namespaces.user { Tier::C } else { Tier::B }
    }

    /// The index of `path` among the plan's descriptors.
    pub fn descriptor(&self, path: &str) -> Option<usize> {
        self.descriptors.iter().position(|d| d.path == path)
    }

    /// Whether the plan comes with a system broker's trees of its mounts
    /// ([`JailPlan::captured`]) instead of its host paths' descriptors: with
    /// `host_ids`, for a root the helper builds (not a joined session's).
    /// The helper, already the sandbox's unprivileged host ids, could
    /// neither reach the requester's paths nor clone or idmap them.
    pub fn sends_trees(&self) -> bool {
        self.host_ids.is_some() && self.session != Some(SessionRole::Join)
    }

    /// The mounts whose detached trees come with the plan, by index, in
    /// this order ([`JailPlan::sends_trees`]): every bind and overlay.
    pub fn captured(&self) -> impl Iterator<Item = usize> + '_ {
        let cloned = self.sends_trees();
        self.mounts
            .iter()
            .enumerate()
            .filter(move |(_, m)| cloned && matches!(m, Mount::Bind { .. } | Mount::Overlay { .. }))
            .map(|(i, _)| i)
    }

    /// How many descriptors come with the plan: its host paths' (or the
    /// trees of its mounts, an overlay's layer after its lower layer), then
    /// a joined session's namespaces.
    pub fn descriptors_sent(&self) -> usize {
        let joined = if self.session == Some(SessionRole::Join) { self.namespaces.names().len() } else { 0 };
        let paths = if self.sends_trees() { self.trees_sent() } else { self.descriptors.len() };
        paths + joined
    }

    /// How many trees a system broker sends ([`JailPlan::sends_trees`]):
    /// one per captured mount, and an overlay's layer besides.
    pub fn trees_sent(&self) -> usize {
        let layers = |i: &usize| matches!(&self.mounts[*i], Mount::Overlay { layer: Some(_), .. });
        self.captured().count() + self.captured().filter(layers).count()
    }
}

/// A terminal's window: rows and columns of characters, each 1 to
/// [`WINDOW_MAX`].
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct WindowSize {
    pub rows: u16,
    pub cols: u16,
}

/// The most rows, and the most columns, of a terminal's window.
pub const WINDOW_MAX: u16 = 4096;

impl WindowSize {
    /// Why this size is not one a terminal takes, if it is not.
    pub fn check(self) -> Result<(), String> {
        let fits = |n: u16| (1..=WINDOW_MAX).contains(&n);
        if fits(self.rows) && fits(self.cols) {
            Ok(())
        } else {
            Err(format!(
                "a terminal's rows and cols are 1 to {WINDOW_MAX} (got {} rows, {} cols)",
                self.rows, self.cols
            ))
        }
    }
}

/// A socket the helper opens in the sandbox's network namespace for the
/// broker to serve (strict egress).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    pub kind: ListenerKind,
    /// An address of 127.0.0.0/8, inside the sandbox's namespace.
    pub address: std::net::Ipv4Addr,
    pub port: u16,
}

/// What the broker serves on a [`Listener`].
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ListenerKind {
    /// The HTTP proxy (`CONNECT host:port`, and plain HTTP by `Host`): TCP.
    Proxy,
    /// The sandbox's resolver: UDP.
    DnsUdp,
    /// The sandbox's resolver: TCP.
    DnsTcp,
    /// A transparent listener: TCP connections to this address and port go
    /// to the name the address stands for.
    Transparent,
}

/// Most listeners a plan may ask for: they travel in one `SCM_RIGHTS`
/// message with nothing else.
pub const PLAN_MAX_LISTENERS: usize = PLAN_MAX_DESCRIPTORS;

/// A uid and gid on the host.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostIds {
    pub uid: u32,
    pub gid: u32,
}

/// A host path that comes with the plan as a descriptor.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct HostPath {
    pub path: String,
    /// A path of the host's own layout (an `/etc` entry such as
    /// `/etc/resolv.conf` may be a symlink), resolved as the host resolves
    /// it. Otherwise (every path a request named, canonical when the policy
    /// checked it) no symlink may be on the way: a component replaced by one
    /// since is refused, not followed.
    pub host_layout: bool,
}

/// Tier C uses namespaces; Tier B uses Landlock, seccomp and rlimits only.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    B,
    C,
}

impl fmt::Display for Tier {
    /// The executor's name (`attest::Executor`'s): `linux-tier-b`, `linux-tier-c`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::B => "linux-tier-b",
            Tier::C => "linux-tier-c",
        })
    }
}

/// The namespaces a plan creates. Any namespace requires `user`: the helper
/// never runs with privileges on the host.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Namespaces {
    pub user: bool,
    pub mount: bool,
    pub pid: bool,
    pub net: bool,
    pub ipc: bool,
    pub uts: bool,
    pub cgroup: bool,
}

impl Namespaces {
    /// Every namespace: Tier C.
    pub const ALL: Namespaces =
        Namespaces { user: true, mount: true, pid: true, net: true, ipc: true, uts: true, cgroup: true };
    /// No namespace: Tier B.
    pub const NONE: Namespaces = Namespaces {
        user: false,
        mount: false,
        pid: false,
        net: false,
        ipc: false,
        uts: false,
        cgroup: false,
    };

    /// Names of the namespaces in the set, for humans and attestations.
    pub fn names(&self) -> Vec<&'static str> {
        let all = [
            (self.user, "user"),
            (self.mount, "mount"),
            (self.pid, "pid"),
            (self.net, "net"),
            (self.ipc, "ipc"),
            (self.uts, "uts"),
            (self.cgroup, "cgroup"),
        ];
        all.iter().filter(|(on, _)| *on).map(|(_, n)| *n).collect()
    }
}

/// One step in building the sandbox's root. Paths are absolute; sources are
/// host paths, targets are paths inside the sandbox.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// Bind a host file or directory (recursively), always nosuid and nodev.
    /// `owned`: a path granted to this request, whose owner the sandbox acts
    /// as; when the helper starts as root (see `host_ids`), it is idmapped.
    Bind { source: String, target: String, writable: bool, owned: bool },
    /// A fresh tmpfs, nosuid and nodev, limited to `size_bytes` and to
    /// [`tmpfs_inodes`]`(size_bytes)` files.
    Tmpfs { target: String, size_bytes: u64, mode: u32 },
    /// A fresh procfs for the sandbox's pid namespace.
    Proc { target: String },
    /// A minimal /dev laid out as [`DEV_NODES`], [`DEV_LINKS`], a private
    /// devpts at [`DEV_PTS`] and, at [`DEV_SHM`], a tmpfs of `shm_bytes`.
    Dev { target: String, shm_bytes: u64 },
    /// A symbolic link (for merged-/usr layouts: `/bin -> usr/bin`).
    Symlink { target: String, link: String },
    /// A host directory seen read-write through an overlay: the run's
    /// writes go to an upper layer, never to the host directory, and the
    /// broker takes them as a change set when the run is over.
    ///
    /// With `layer`, the upper layer is on disk: `layer` is a host directory
    /// of the broker's (one of the plan's descriptors, or a system broker's
    /// tree sent after the lower layer's) holding two empty directories,
    /// `upper` and `work`, which the helper mounts as the overlay's upper and
    /// work directories; it hands nothing back, and the broker bounds the
    /// run's writes to `size_bytes`. Without, the upper layer is a tmpfs of
    /// `size_bytes` (and [`tmpfs_inodes`] files), which the helper hands the
    /// broker (a directory fd on the status channel).
    Overlay { source: String, target: String, size_bytes: u64, owned: bool, layer: Option<String> },
    /// A read-only file of the plan's own (at most [`PLAN_MAX_FILE_BYTES`]),
    /// nosuid, nodev and noexec: the helper writes `contents` in its staging
    /// tmpfs, outside the new root, and binds it over `target` (strict
    /// egress: `/etc/resolv.conf` naming the sandbox's own resolver). The
    /// helper fails when the target cannot be made or bound; it never falls
    /// back to what was there.
    File { target: String, contents: String },
}

/// Largest [`Mount::File`]: a host's bundle of trust roots (about 220 KiB)
/// with room to spare, within the helper's 1 MiB staging tmpfs.
pub const PLAN_MAX_FILE_BYTES: usize = 512 * 1024;

/// Bytes of a tmpfs per file it may hold: half the kernel's default density
/// (one inode per page of a tmpfs's default size), so inode memory stays in
/// proportion to the size.
pub const TMPFS_BYTES_PER_INODE: u64 = 8192;
/// Files a tmpfs may hold however small it is: room for a tool's scratch
/// files, at under 1 MiB of inodes.
pub const TMPFS_MIN_INODES: u64 = 1024;

/// The files a tmpfs of `size_bytes` may hold: one per
/// [`TMPFS_BYTES_PER_INODE`], at least [`TMPFS_MIN_INODES`]. Without a bound,
/// a tmpfs takes up to half of RAM's pages in inodes, whose memory `size=`
/// does not count: empty files could grow past it.
pub fn tmpfs_inodes(size_bytes: u64) -> u64 {
    (size_bytes / TMPFS_BYTES_PER_INODE).max(TMPFS_MIN_INODES)
}

/// The host's device nodes a sandbox gets: bound into a Tier C /dev, and
/// the only ones of the host's /dev a Tier B sandbox may write. Each is
/// harmless to share (no state, no other process's data).
pub const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// The symbolic links of a Tier C /dev, name and target.
pub const DEV_LINKS: [(&str, &str); 5] = [
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
];
/// A Tier C /dev's tmpfs for shared memory (its size is the plan's).
pub const DEV_SHM: &str = "shm";
/// A Tier C /dev's private devpts instance.
pub const DEV_PTS: &str = "pts";

/// Every name in a Tier C sandbox's /dev.
pub fn dev_entries() -> impl Iterator<Item = &'static str> {
    DEV_NODES.into_iter().chain(DEV_LINKS.map(|(name, _)| name)).chain([DEV_SHM, DEV_PTS])
}

impl Mount {
    pub fn target(&self) -> &str {
        match self {
            Mount::Bind { target, .. }
            | Mount::Tmpfs { target, .. }
            | Mount::Proc { target }
            | Mount::Dev { target, .. }
            | Mount::Symlink { target, .. }
            | Mount::Overlay { target, .. }
            | Mount::File { target, .. } => target,
        }
    }
}

/// A soft and hard limit pair; [`RLIM_INFINITY`] means unlimited.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimit {
    pub soft: u64,
    pub hard: u64,
}

impl Rlimit {
    pub const fn both(value: u64) -> Rlimit {
        Rlimit { soft: value, hard: value }
    }
    pub const UNLIMITED: Rlimit = Rlimit::both(RLIM_INFINITY);
}

/// A resource limit, by the name of its `RLIMIT_*` resource.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum RlimitName {
    As,
    Data,
    Cpu,
    Nproc,
    Nofile,
    Fsize,
    Core,
}

impl RlimitName {
    /// `AS`, `CPU`, ...: the resource's name without `RLIMIT_`.
    pub fn name(self) -> &'static str {
        match self {
            RlimitName::As => "AS",
            RlimitName::Data => "DATA",
            RlimitName::Cpu => "CPU",
            RlimitName::Nproc => "NPROC",
            RlimitName::Nofile => "NOFILE",
            RlimitName::Fsize => "FSIZE",
            RlimitName::Core => "CORE",
        }
    }
}

impl fmt::Display for RlimitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The rlimits every sandbox gets. Core dumps are always off.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimits {
    /// RLIMIT_AS, bytes of address space per process: a looser floor, as
    /// runtimes reserve far more than they use.
    pub address_space: Rlimit,
    /// RLIMIT_DATA, bytes of private writable memory per process (heap and
    /// private anonymous mappings, not shared memory or the stack): the
    /// memory limit where no cgroup holds it.
    pub data: Rlimit,
    /// RLIMIT_CPU, seconds of CPU time per process.
    pub cpu_seconds: Rlimit,
    /// RLIMIT_NPROC, processes of the sandbox's uid (in its user namespace).
    pub processes: Rlimit,
    /// RLIMIT_NOFILE, open descriptors per process.
    pub open_files: Rlimit,
    /// RLIMIT_FSIZE, largest file a process may write, bytes.
    pub file_size: Rlimit,
    /// RLIMIT_CORE; the policy always sets 0.
    pub core: Rlimit,
}

impl Rlimits {
    /// Every limit with its resource: what the helper sets, in this order,
    /// and what the attestation lists.
    pub fn table(&self) -> [(RlimitName, Rlimit); 7] {
        [
            (RlimitName::As, self.address_space),
            (RlimitName::Data, self.data),
            (RlimitName::Cpu, self.cpu_seconds),
            (RlimitName::Nproc, self.processes),
            (RlimitName::Nofile, self.open_files),
            (RlimitName::Fsize, self.file_size),
            (RlimitName::Core, self.core),
        ]
    }
}

/// A set of Landlock features, each tied to the ABI that introduced it.
#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq, Default)]
pub struct LandlockFeatures(pub u32);

impl LandlockFeatures {
    /// Filesystem access control (ABI 1).
    pub const FS: LandlockFeatures = LandlockFeatures(1 << 0);
    /// Renaming and linking across directories (ABI 2).
    pub const FS_REFER: LandlockFeatures = LandlockFeatures(1 << 1);
    /// Truncation (ABI 3).
    pub const FS_TRUNCATE: LandlockFeatures = LandlockFeatures(1 << 2);
    /// TCP bind and connect by port (ABI 4).
    pub const NET_TCP: LandlockFeatures = LandlockFeatures(1 << 3);
    /// No connecting to abstract unix sockets outside the sandbox (ABI 6).
    pub const SCOPE_ABSTRACT_UNIX: LandlockFeatures = LandlockFeatures(1 << 4);
    /// No signals to processes outside the sandbox (ABI 6).
    pub const SCOPE_SIGNAL: LandlockFeatures = LandlockFeatures(1 << 5);

    pub const EMPTY: LandlockFeatures = LandlockFeatures(0);
    pub const ALL: LandlockFeatures = LandlockFeatures(0b11_1111);

    /// Every feature with the ABI version that introduced it and its name.
    pub const TABLE: [(LandlockFeatures, u32, &'static str); 6] = [
        (Self::FS, 1, "fs"),
        (Self::FS_REFER, 2, "fs.refer"),
        (Self::FS_TRUNCATE, 3, "fs.truncate"),
        (Self::NET_TCP, 4, "net.tcp"),
        (Self::SCOPE_ABSTRACT_UNIX, 6, "scope.abstract_unix"),
        (Self::SCOPE_SIGNAL, 6, "scope.signal"),
    ];

    pub const fn contains(self, other: LandlockFeatures) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn intersects(self, other: LandlockFeatures) -> bool {
        self.0 & other.0 != 0
    }
    pub const fn union(self, other: LandlockFeatures) -> LandlockFeatures {
        LandlockFeatures(self.0 | other.0)
    }
    pub const fn intersection(self, other: LandlockFeatures) -> LandlockFeatures {
        LandlockFeatures(self.0 & other.0)
    }
    pub const fn difference(self, other: LandlockFeatures) -> LandlockFeatures {
        LandlockFeatures(self.0 & !other.0)
    }
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The features a kernel with Landlock ABI `abi` can enforce.
    pub fn supported_by_abi(abi: u32) -> LandlockFeatures {
        Self::TABLE.iter().filter(|(_, min, _)| abi >= *min).fold(Self::EMPTY, |acc, (f, _, _)| acc.union(*f))
    }

    /// Names of the features in the set.
    pub fn names(self) -> Vec<&'static str> {
        Self::TABLE.iter().filter(|(f, _, _)| self.contains(*f)).map(|(_, _, n)| *n).collect()
    }
}

impl fmt::Debug for LandlockFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{}}}", self.names().join(", "))
    }
}

impl fmt::Display for LandlockFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() { f.write_str("none") } else { f.write_str(&self.names().join(", ")) }
    }
}

/// Landlock rules. Paths are inside the sandbox's root and must exist.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct LandlockPlan {
    /// Features to handle (restrict). Empty: Landlock is not used.
    pub wanted: LandlockFeatures,
    /// Features that must be enforced: the helper fails when the kernel lacks one.
    pub required: LandlockFeatures,
    /// Read files and list directories beneath these paths.
    pub read: Vec<String>,
    /// Read, write, create and remove beneath these paths.
    pub write: Vec<String>,
    /// Execute files beneath these paths.
    pub execute: Vec<String>,
    /// Only directory listing (no file reads) beneath these paths.
    pub list: Vec<String>,
    /// TCP ports the sandbox may bind (when `NET_TCP` is handled).
    pub tcp_bind: Vec<u16>,
    /// TCP ports the sandbox may connect to (when `NET_TCP` is handled).
    pub tcp_connect: Vec<u16>,
}

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct BpfInstruction {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// Why an encoded plan was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    TooLarge { len: usize, max: usize },
    Truncated,
    BadMagic,
    Version { found: u32, expected: u32 },
    Arch { found: String, expected: &'static str },
    Encode(String),
    Decode(String),
    TrailingBytes(usize),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::TooLarge { len, max } => write!(f, "plan of {len} bytes exceeds the {max}-byte limit"),
            PlanError::Truncated => f.write_str("plan is truncated"),
            PlanError::BadMagic => f.write_str("not a palisade plan (bad magic)"),
            PlanError::Version { found, expected } => {
                write!(f, "plan version {found}, this helper speaks version {expected}")
            }
            PlanError::Arch { found, expected } => {
                write!(f, "plan built for {found}, this helper runs on {expected}")
            }
            PlanError::Encode(e) => write!(f, "cannot encode plan: {e}"),
            PlanError::Decode(e) => write!(f, "cannot decode plan: {e}"),
            PlanError::TrailingBytes(n) => write!(f, "{n} unexpected bytes after the plan"),
        }
    }
}

impl std::error::Error for PlanError {}

fn body_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<PLAN_MAX_BYTES>()
}

/// Encodes a plan: header (magic, version, arch) then the bincode body.
pub fn encode_plan(plan: &JailPlan) -> Result<Vec<u8>, PlanError> {
    let body =
        bincode::serde::encode_to_vec(plan, body_config()).map_err(|e| PlanError::Encode(e.to_string()))?;
    let arch = PLAN_ARCH.as_bytes();
    let mut out = Vec::with_capacity(PLAN_MAGIC.len() + 4 + 1 + arch.len() + body.len());
    out.extend_from_slice(&PLAN_MAGIC);
    out.extend_from_slice(&PLAN_VERSION.to_be_bytes());
    out.push(arch.len() as u8);
    out.extend_from_slice(arch);
    out.extend_from_slice(&body);
    if out.len() > PLAN_MAX_BYTES {
        return Err(PlanError::TooLarge { len: out.len(), max: PLAN_MAX_BYTES });
    }
    Ok(out)
}

/// Decodes a plan, checking size, magic, version and architecture first.
pub fn decode_plan(bytes: &[u8]) -> Result<JailPlan, PlanError> {
    if bytes.len() > PLAN_MAX_BYTES {
        return Err(PlanError::TooLarge { len: bytes.len(), max: PLAN_MAX_BYTES });
    }
    let rest = bytes.strip_prefix(&PLAN_MAGIC[..]).ok_or(if bytes.len() < 4 {
        PlanError::Truncated
    } else {
        PlanError::BadMagic
    })?;
    let (version, rest) = rest.split_first_chunk::<4>().ok_or(PlanError::Truncated)?;
    let version = u32::from_be_bytes(*version);
    if version != PLAN_VERSION {
        return Err(PlanError::Version { found: version, expected: PLAN_VERSION });
    }
    let (&arch_len, rest) = rest.split_first().ok_or(PlanError::Truncated)?;
    let arch_len = usize::from(arch_len);
    if rest.len() < arch_len {
        return Err(PlanError::Truncated);
    }
    let (arch, body) = rest.split_at(arch_len);
    if arch != PLAN_ARCH.as_bytes() {
        return Err(PlanError::Arch {
            found: String::from_utf8_lossy(arch).into_owned(),
            expected: PLAN_ARCH,
        });
    }
    let (plan, used): (JailPlan, usize) = bincode::serde::decode_from_slice(body, body_config())
        .map_err(|e| PlanError::Decode(e.to_string()))?;
    if used != body.len() {
        return Err(PlanError::TrailingBytes(body.len() - used));
    }
    Ok(plan)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_system_brokers_plan_comes_with_one_tree_per_bind_and_overlay_instead_of_its_paths() {
        let mut plan = sample();
        plan.mounts.push(Mount::Overlay {
            source: "/usr".into(),
            target: "/work".into(),
            size_bytes: 1 << 20,
            owned: true,
            layer: None,
        });
        assert!(plan.sends_trees());
        assert_eq!(plan.captured().collect::<Vec<_>>(), [0, 5]);
        assert_eq!(plan.descriptors_sent(), 2, "one tree per mount, though both are of /usr");
        if let Mount::Overlay { layer, .. } = &mut plan.mounts[5] {
            *layer = Some("/var/lib/palisade/changes/1000/.new-x/0".into());
        }
        assert_eq!(plan.descriptors_sent(), 3, "an overlay's layer is a tree of its own");
        plan.mounts.pop();
        plan.session = Some(SessionRole::Join);
        assert!(!plan.sends_trees() && plan.captured().next().is_none(), "a joined session builds no root");
        assert_eq!(plan.descriptors_sent(), 1 + plan.namespaces.names().len());
        (plan.session, plan.host_ids, plan.acting_for) = (None, None, None);
        assert!(!plan.sends_trees());
        assert_eq!(plan.descriptors_sent(), 1, "the host path's, once");
    }

    pub(crate) fn sample() -> JailPlan {
        JailPlan {
            program: "/usr/bin/true".into(),
            argv: vec!["true".into()],
            env: vec![("PATH".into(), "/usr/bin".into())],
            cwd: "/".into(),
            uid: 1000,
            gid: 1000,
            namespaces: Namespaces::ALL,
            host_ids: Some(HostIds { uid: 65534, gid: 65534 }),
            acting_for: Some(HostIds { uid: 1000, gid: 1000 }),
            descriptors: vec![HostPath { path: "/usr".into(), host_layout: false }],
            mounts: vec![
                Mount::Bind { source: "/usr".into(), target: "/usr".into(), writable: false, owned: false },
                Mount::Tmpfs { target: "/tmp".into(), size_bytes: 1 << 20, mode: 0o1777 },
                Mount::Proc { target: "/proc".into() },
                Mount::Dev { target: "/dev".into(), shm_bytes: 1 << 20 },
                Mount::Symlink { target: "/bin".into(), link: "usr/bin".into() },
            ],
            hostname: Some("palisade".into()),
            loopback: true,
            listeners: vec![],
            rlimits: Rlimits {
                address_space: Rlimit::both(4 << 30),
                data: Rlimit::both(1 << 30),
                cpu_seconds: Rlimit { soft: 10, hard: 11 },
                processes: Rlimit::both(64),
                open_files: Rlimit::both(256),
                file_size: Rlimit::both(1 << 20),
                core: Rlimit::both(0),
            },
            landlock: LandlockPlan {
                wanted: LandlockFeatures::ALL,
                required: LandlockFeatures::FS,
                read: vec!["/usr".into()],
                write: vec!["/tmp".into()],
                execute: vec!["/usr".into()],
                list: vec![],
                tcp_bind: vec![],
                tcp_connect: vec![],
            },
            seccomp: vec![BpfInstruction { code: 6, jt: 0, jf: 0, k: 0x7fff_0000 }],
            monitor_seccomp: vec![BpfInstruction { code: 6, jt: 0, jf: 0, k: 0x8000_0000 }],
            cgroup: None,
            parent_pid: 1,
            umask: Some(0o022),
            terminal: None,
            session: None,
        }
    }

    fn header_len() -> usize {
        9 + PLAN_ARCH.len()
    }

    #[test]
    fn round_trip() {
        let plan = sample();
        let bytes = encode_plan(&plan).unwrap();
        assert_eq!(decode_plan(&bytes).unwrap(), plan);
        // Strict egress's pieces: listeners and a file of the plan's own.
        let mut strict = sample();
        strict.listeners = vec![
            Listener { kind: ListenerKind::Proxy, address: std::net::Ipv4Addr::LOCALHOST, port: 3128 },
            Listener { kind: ListenerKind::DnsUdp, address: std::net::Ipv4Addr::LOCALHOST, port: 53 },
            Listener {
                kind: ListenerKind::Transparent,
                address: std::net::Ipv4Addr::new(127, 77, 0, 1),
                port: 443,
            },
        ];
        strict.mounts.push(Mount::File {
            target: "/etc/resolv.conf".into(),
            contents: "nameserver 127.0.0.1\n".into(),
        });
        let bytes = encode_plan(&strict).unwrap();
        assert_eq!(decode_plan(&bytes).unwrap(), strict);
    }

    #[test]
    fn header_is_checked_before_the_body() {
        let mut bytes = encode_plan(&sample()).unwrap();
        bytes[7] ^= 0x7f; // last byte of the version
        assert!(matches!(decode_plan(&bytes), Err(PlanError::Version { .. })));

        let mut bytes = encode_plan(&sample()).unwrap();
        bytes[9] = b'Z'; // first byte of the architecture name
        assert!(matches!(decode_plan(&bytes), Err(PlanError::Arch { .. })));

        let mut bytes = encode_plan(&sample()).unwrap();
        bytes[0] = b'X';
        assert_eq!(decode_plan(&bytes), Err(PlanError::BadMagic));
        assert_eq!(decode_plan(b"PJ"), Err(PlanError::Truncated));
    }

    #[test]
    fn truncated_garbage_and_trailing_bytes_are_refused() {
        let bytes = encode_plan(&sample()).unwrap();
        for cut in [5, 9, 20, bytes.len() - 1] {
            assert!(decode_plan(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(decode_plan(&long), Err(PlanError::TrailingBytes(1)));
        let mut garbage = bytes[..header_len()].to_vec();
        garbage.extend(std::iter::repeat_n(0xff, 64));
        assert!(matches!(decode_plan(&garbage), Err(PlanError::Decode(_))));
    }

    #[test]
    fn oversized_plans_are_refused_without_decoding() {
        let huge = vec![0u8; PLAN_MAX_BYTES + 1];
        assert!(matches!(decode_plan(&huge), Err(PlanError::TooLarge { .. })));
        let mut plan = sample();
        plan.argv = vec!["x".repeat(4096); 300];
        assert!(matches!(encode_plan(&plan), Err(PlanError::TooLarge { .. })));
    }

    #[test]
    fn a_huge_length_prefix_inside_the_body_hits_the_limit() {
        let mut bytes = encode_plan(&sample()).unwrap()[..header_len()].to_vec();
        // A varint claiming a string of 2^40 bytes.
        bytes.extend_from_slice(&[253, 0, 0, 0, 0, 0, 1, 0, 0]);
        assert!(decode_plan(&bytes).is_err());
    }

    #[test]
    fn feature_sets_follow_the_abi() {
        assert_eq!(LandlockFeatures::supported_by_abi(0), LandlockFeatures::EMPTY);
        let abi2 = LandlockFeatures::supported_by_abi(2);
        assert!(abi2.contains(LandlockFeatures::FS.union(LandlockFeatures::FS_REFER)));
        assert!(!abi2.intersects(LandlockFeatures::FS_TRUNCATE));
        assert_eq!(LandlockFeatures::supported_by_abi(7), LandlockFeatures::ALL);
        assert_eq!(abi2.to_string(), "fs, fs.refer");
    }
}
