//! From a resolved sandbox description to the helper's `JailPlan`.
//!
//! Everything host-dependent is decided here: which system directories exist
//! and which are symlinks (merged /usr), which /etc files a program needs,
//! what Landlock rules mirror the mounts. The helper receives the result and
//! decides nothing.

use crate::seccomp;
use palisade_protocol::wire::ErrorKind;
use palisade_protocol::{
    HostIds, HostPath, JailPlan, LandlockFeatures, LandlockPlan, Listener, Mount, Namespaces,
    PLAN_MAX_DESCRIPTORS, PlanInvariant, RLIM_INFINITY, Rlimit, Rlimits, Tier,
};
use std::path::{Path, PathBuf};

/// System directories made visible read-only (or recreated as symlinks).
pub const SYSTEM_DIRS: [&str; 7] = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/// The parts of /etc ordinary tools need; everything else in /etc stays hidden.
pub const ETC_ENTRIES: [&str; 22] = [
    "/etc/alternatives",
    "/etc/ca-certificates",
    "/etc/debian_version",
    "/etc/gitconfig",
    "/etc/group",
    "/etc/host.conf",
    "/etc/hostname",
    "/etc/hosts",
    "/etc/inputrc",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/mime.types",
    "/etc/nsswitch.conf",
    "/etc/os-release",
    "/etc/passwd",
    "/etc/protocols",
    "/etc/resolv.conf",
    "/etc/services",
    "/etc/ssl",
    "/etc/timezone",
];

/// `/tmp`'s mode: anyone may create files, only their owner removes them.
const TMP_MODE: u32 = 0o1777;
/// A temporary workspace's mode: the sandbox's uid owns it, others read.
const TEMP_WORKSPACE_MODE: u32 = 0o755;
/// The empty tmpfs over a hidden directory: one page, mode 0 (nothing to
/// list, nothing to create).
const HIDDEN_DIR_BYTES: u64 = 4096;
const HIDDEN_DIR_MODE: u32 = 0o000;
/// RLIMIT_CPU's hard limit is this many seconds past the soft one: SIGXCPU
/// at the soft limit lets a program stop by itself, SIGKILL follows.
const CPU_KILL_GRACE_SECONDS: u64 = 1;

/// Resource limits of one run, resolved from the configuration (a value of
/// 0 is no limit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// RLIMIT_DATA: private writable memory per process.
    pub memory_bytes: u64,
    /// RLIMIT_AS: address space per process, reservations included.
    pub address_space_bytes: u64,
    pub cpu_seconds: u64,
    pub processes: u64,
    pub open_files: u64,
    pub file_size_bytes: u64,
    /// Size of the tmpfs `/tmp` (and of a temporary workspace).
    pub tmp_bytes: u64,
    /// Size of the tmpfs `/dev/shm`: shared memory is memory, so the policy
    /// gives it the run's memory limit (less, without a cgroup, what the
    /// other tmpfs mounts take of it).
    pub shm_bytes: u64,
}

/// A resolved sandbox: paths are absolute and canonical, the command resolved.
#[derive(Debug, Clone)]
pub struct JailSpec {
    pub tier: Tier,
    pub program: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// Writable directories (the workspace first).
    pub read_write: Vec<PathBuf>,
    /// Extra read-only files or directories.
    pub read_only: Vec<PathBuf>,
    /// Directories from which programs may be executed, beyond the system ones.
    pub exec_dirs: Vec<PathBuf>,
    /// Tier B: a private temporary directory created by the broker.
    pub tmp_dir: Option<PathBuf>,
    /// Keep the host's network (no network namespace, no Landlock TCP rules).
    pub host_network: bool,
    pub limits: Limits,
    /// Landlock features that must be enforced (the helper fails otherwise).
    pub landlock_required: LandlockFeatures,
    pub hostname: String,
    /// Ids inside the sandbox (the broker's own by default).
    pub uid: u32,
    pub gid: u32,
    /// Tier C started by root: the unprivileged host ids the sandbox runs as.
    pub host_ids: Option<HostIds>,
    /// With `host_ids`: the requester's ids, whose files in granted
    /// directories the sandbox acts as the owner of (see [`JailPlan::acting_for`]).
    pub acting_for: Option<HostIds>,
    pub parent_pid: u32,
    pub cgroup: Option<String>,
    /// Processes may not create processes (threads only).
    pub no_fork: bool,
    /// Tier C: a tmpfs at this path, the writable temporary workspace.
    pub temp_workspace: Option<PathBuf>,
    /// Tier C: writable directories are overlays whose upper layer is a tmpfs
    /// of this many bytes (see [`Mount::Overlay`]); `None`: plain binds.
    pub write_bound: Option<u64>,
    /// Tier C: sensitive entries inside granted directories, hidden by an
    /// empty mount over each (a directory: an empty tmpfs; a file: /dev/null).
    pub hidden: Vec<(PathBuf, bool)>,
    /// Tier C, a grant written in place: what the host executes in it,
    /// bound read-only over itself.
    pub held: Vec<PathBuf>,
    /// And the directories on the way to each, bound over themselves as
    /// they are: a mount point is never renamed nor removed.
    pub pinned: Vec<PathBuf>,
    /// The workspace's own `HOME`, outside it: written in place (no
    /// change set), kept between runs.
    pub home: Option<PathBuf>,
    /// Tier C: a directory holding a copy of the [`ETC_ENTRIES`] (what others
    /// may read of them), bound read-only at `/etc` in one mount instead of
    /// one mount per entry. Not used when another mount lies under `/etc`
    /// (its mount point could not be made in a read-only bind).
    pub etc_view: Option<PathBuf>,
    /// The host's system directories, /etc entries and devices.
    pub layout: Layout,
    /// Tier C, strict egress: the sockets the helper opens in the network
    /// namespace for the broker (see [`JailPlan::listeners`]).
    pub listeners: Vec<Listener>,
    /// Tier C, strict egress: the only TCP ports the command may connect
    /// to, and no bind (Landlock `net.tcp`, where the kernel has it).
    pub tcp_connect: Option<Vec<u16>>,
    /// Tier C: files of the plan's own, path and contents, bound read-only
    /// over what the host has there (see [`Mount::File`]).
    pub files: Vec<(String, String)>,
    /// The command's umask (see [`JailPlan::umask`]).
    pub umask: Option<u32>,
    /// Tier C: the command's terminal (see [`JailPlan::terminal`]).
    pub terminal: Option<palisade_protocol::wire::WindowSize>,
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Parents before children: mounts sorted by depth, then name.
pub fn depth_then_name(a: &Mount, b: &Mount) -> std::cmp::Ordering {
    let key = |m: &Mount| (m.target().matches('/').count(), m.target().to_string());
    key(a).cmp(&key(b))
}

/// How this host lays out its system directories: the symlinks among them
/// (as their link text), the real ones, and all of them canonical; and which
/// of the [`ETC_ENTRIES`] and [`DEV_NODES`] (as `/dev/<name>`) it has. Gathered by the
/// broker (see [`crate::Host`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    pub links: Vec<(String, String)>,
    pub real: Vec<String>,
    pub canonical: Vec<PathBuf>,
    pub etc: Vec<String>,
    pub devices: Vec<String>,
}

/// The system directories and, unless a snapshot stands for them, the /etc
/// entries present on this host: symlinks (as their link text) and real paths.
fn system_paths(layout: &Layout, etc_entries: bool) -> (Vec<(String, String)>, Vec<String>) {
    let Layout { links, mut real, .. } = layout.clone();
    if etc_entries {
        real.extend(layout.etc.iter().cloned());
    }
    (links, real)
}

/// Why a plan could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    #[error(
        "the sandbox would need {0} descriptors of host paths; a plan carries at most {PLAN_MAX_DESCRIPTORS}"
    )]
    TooManyPaths(usize),
    /// A plan that breaks its own rules: a bug of the policy, never sent.
    #[error("the resolved plan asks for {0}")]
    Invariant(#[from] PlanInvariant),
}

impl BuildError {
    /// The kind a client sees.
    pub fn kind(&self) -> ErrorKind {
        match self {
            BuildError::TooManyPaths(_) => ErrorKind::InvalidRequest,
            BuildError::Seccomp(_) | BuildError::Invariant(_) => ErrorKind::RuntimeFailure,
        }
    }

    /// The stable name of the rule that refused.
    pub fn rule(&self) -> &'static str {
        match self {
            BuildError::TooManyPaths(_) => "filesystem.too_many_paths",
            BuildError::Seccomp(_) => "seccomp.compile",
            BuildError::Invariant(_) => "plan.invariant",
        }
    }
}

/// Builds the plan, and checks it before anything is sent. Tier C: a
/// private root of read-only system binds, the writable directories, tmpfs
/// /tmp, fresh /proc and minimal /dev, with Landlock rules mirroring it.
/// Tier B: the host's root, confined by Landlock alone.
pub fn build_plan(spec: &JailSpec) -> Result<JailPlan, BuildError> {
    let under_etc = |p: &PathBuf| p.starts_with("/etc");
    // A file of the plan's own needs a mount point: in the snapshot's
    // read-only /etc only where the host has the entry.
    let file_has_mount_point =
        |(t, _): &(String, String)| !t.starts_with("/etc/") || spec.layout.etc.contains(t);
    let etc_view = spec.etc_view.as_deref().filter(|_| {
        spec.tier == Tier::C
            && !(spec.read_write.iter().chain(&spec.read_only).chain(&spec.temp_workspace).any(under_etc))
            && spec.files.iter().all(file_has_mount_point)
    });
    // With the snapshot, the entries are not bound one by one: it holds them.
    let (links, system) = system_paths(&spec.layout, etc_view.is_none());
    let mut landlock = landlock_rules(spec, &system);
    let (namespaces, mut mounts, hostname) = match spec.tier {
        Tier::C => {
            let mounts = tier_c_mounts(spec, &links, &system, etc_view);
            tier_c_landlock(spec, etc_view.is_some(), &mut landlock);
            let ns = Namespaces { net: !spec.host_network, ..Namespaces::ALL };
            (ns, mounts, Some(spec.hostname.clone()))
        }
        Tier::B => {
            tier_b_landlock(spec, &mut landlock);
            (Namespaces::NONE, vec![], None)
        }
    };
    mounts.sort_by(depth_then_name);
    let descriptors = descriptors(spec, &mounts, &landlock)?;
    // Tier C cuts the network with a namespace (loopback inside stays usable);
    // Tier B has only Landlock's TCP rules and the seccomp socket families.
    let ip = spec.host_network || spec.tier == Tier::C;
    let profile = seccomp::Profile { tier: spec.tier, ip, fork: !spec.no_fork };
    let plan = JailPlan {
        program: spec.program.clone(),
        argv: spec.argv.clone(),
        env: spec.env.clone(),
        cwd: s(&spec.cwd),
        uid: spec.uid,
        gid: spec.gid,
        host_ids: if spec.tier == Tier::C { spec.host_ids } else { None },
        acting_for: if spec.tier == Tier::C { spec.host_ids.and(spec.acting_for) } else { None },
        descriptors,
        loopback: namespaces.net,
        listeners: if spec.tier == Tier::C { spec.listeners.clone() } else { vec![] },
        namespaces,
        mounts,
        hostname,
        rlimits: rlimits(&spec.limits),
        landlock,
        seccomp: seccomp::default_program(profile)?.to_vec(),
        monitor_seccomp: seccomp::monitor_program()?.to_vec(),
        cgroup: spec.cgroup.clone(),
        parent_pid: spec.parent_pid,
        umask: spec.umask,
        terminal: spec.terminal,
        session: None,
    };
    plan.check()?;
    Ok(plan)
}

/// The Landlock rules both tiers start from: the system paths readable and
/// executable, the grants as granted.
fn landlock_rules(spec: &JailSpec, system: &[String]) -> LandlockPlan {
    let mut wanted = LandlockFeatures::FS
        .union(LandlockFeatures::FS_REFER)
        .union(LandlockFeatures::FS_TRUNCATE)
        .union(LandlockFeatures::SCOPE_ABSTRACT_UNIX)
        .union(LandlockFeatures::SCOPE_SIGNAL);
    if spec.tier == Tier::B && !spec.host_network {
        wanted = wanted.union(LandlockFeatures::NET_TCP);
    }
    let mut execute: Vec<String> = system.iter().filter(|p| !p.starts_with("/etc")).cloned().collect();
    execute.extend(spec.exec_dirs.iter().map(|p| s(p)));
    LandlockPlan {
        wanted,
        required: spec.landlock_required.intersection(wanted),
        read: system.iter().cloned().chain(spec.read_only.iter().map(|p| s(p))).collect(),
        write: spec.read_write.iter().chain(&spec.home).map(|p| s(p)).collect(),
        execute,
        list: vec![],
        tcp_bind: vec![],
        tcp_connect: vec![],
    }
}

/// Tier C's root: the system directories (and their symlinks), /etc, the
/// grants, the tmpfs mounts, /proc, /dev, and what hides sensitive entries.
fn tier_c_mounts(
    spec: &JailSpec,
    links: &[(String, String)],
    system: &[String],
    etc_view: Option<&Path>,
) -> Vec<Mount> {
    let bind =
        |p: &String, writable, owned| Mount::Bind { source: p.clone(), target: p.clone(), writable, owned };
    // A file of the plan's own stands for the host's entry: not bound too.
    let system: Vec<String> =
        system.iter().filter(|p| !spec.files.iter().any(|(t, _)| t == *p)).cloned().collect();
    let mut mounts: Vec<Mount> =
        links.iter().map(|(t, l)| Mount::Symlink { target: t.clone(), link: l.clone() }).collect();
    match etc_view {
        Some(view) => {
            mounts.extend(system.iter().filter(|p| !p.starts_with("/etc/")).map(|p| bind(p, false, false)));
            mounts.push(Mount::Bind {
                source: s(view),
                target: "/etc".into(),
                writable: false,
                owned: false,
            });
        }
        None => mounts.extend(system.iter().map(|p| bind(p, false, false))),
    }
    mounts.extend(spec.read_only.iter().map(|p| bind(&s(p), false, true)));
    mounts.extend(spec.read_write.iter().map(|p| match spec.write_bound {
        Some(size_bytes) => {
            // The broker gives the overlay its layer on disk (`layer`) once the run has an id.
            Mount::Overlay { source: s(p), target: s(p), size_bytes, owned: true, layer: None }
        }
        None => bind(&s(p), true, true),
    }));
    mounts.extend(spec.home.iter().map(|p| bind(&s(p), true, true)));
    // Parents before children: the pinned directories, then what they lead to.
    let mut in_place: Vec<(&PathBuf, bool)> =
        spec.pinned.iter().map(|p| (p, true)).chain(spec.held.iter().map(|p| (p, false))).collect();
    in_place.sort();
    mounts.extend(in_place.into_iter().map(|(p, writable)| bind(&s(p), writable, true)));
    let tmp_bytes = spec.limits.tmp_bytes;
    mounts.push(Mount::Tmpfs { target: "/tmp".into(), size_bytes: tmp_bytes, mode: TMP_MODE });
    if let Some(t) = &spec.temp_workspace {
        mounts.push(Mount::Tmpfs { target: s(t), size_bytes: tmp_bytes, mode: TEMP_WORKSPACE_MODE });
    }
    mounts.push(Mount::Proc { target: "/proc".into() });
    mounts.push(Mount::Dev { target: "/dev".into(), shm_bytes: spec.limits.shm_bytes });
    mounts.extend(spec.hidden.iter().map(|(p, is_dir)| hiding(p, *is_dir)));
    mounts.extend(spec.files.iter().map(|(t, c)| Mount::File { target: t.clone(), contents: c.clone() }));
    mounts
}

/// Tier C's Landlock rules mirror its root.
fn tier_c_landlock(spec: &JailSpec, etc_view: bool, landlock: &mut LandlockPlan) {
    landlock.write.extend(spec.temp_workspace.iter().map(|p| s(p)));
    for (target, _) in &spec.files {
        if !landlock.read.contains(target) {
            landlock.read.push(target.clone());
        }
    }
    if let Some(ports) = &spec.tcp_connect {
        // Wanted, not required: the network namespace already holds the
        // boundary (only loopback, where only the broker's listeners are).
        // Handled with no bind rule: the command binds no TCP port.
        landlock.wanted = landlock.wanted.union(LandlockFeatures::NET_TCP);
        landlock.tcp_connect = ports.clone();
    }
    // The private /etc holds only the curated entries: one rule covers them.
    if etc_view || landlock.read.iter().any(|p| p.starts_with("/etc/")) {
        landlock.read.retain(|p| !p.starts_with("/etc/") && p != "/etc");
        landlock.read.push("/etc".into());
    }
    landlock.read.push("/proc".into());
    landlock.write.extend(["/tmp".to_string(), "/dev".to_string()]);
    // Inside the private root, listing directories reveals nothing that is not mounted.
    landlock.list.push("/".into());
}

/// Tier B sees the host's root: the harmless device nodes and the run's own
/// temporary directory are all it may write beyond its grants.
fn tier_b_landlock(spec: &JailSpec, landlock: &mut LandlockPlan) {
    landlock.read.push("/proc".into());
    landlock.write.extend(spec.layout.devices.iter().cloned());
    landlock.write.extend(spec.tmp_dir.iter().map(|p| s(p)));
}

fn rlimits(l: &Limits) -> Rlimits {
    Rlimits {
        address_space: limit(l.address_space_bytes),
        data: limit(l.memory_bytes),
        cpu_seconds: Rlimit {
            soft: l.cpu_seconds,
            hard: l.cpu_seconds.saturating_add(CPU_KILL_GRACE_SECONDS),
        },
        processes: limit(l.processes),
        open_files: limit(l.open_files),
        file_size: limit(l.file_size_bytes),
        core: Rlimit::both(0),
    }
}

/// The host paths the helper gets as descriptors: every bind and overlay
/// source and, in Tier B, every Landlock path. Those the request brought
/// (grants, the workspace, Tier B's run directories) were canonical when the
/// policy checked them, and are opened with no symlink allowed on the way.
fn descriptors(
    spec: &JailSpec,
    mounts: &[Mount],
    landlock: &LandlockPlan,
) -> Result<Vec<HostPath>, BuildError> {
    let granted: Vec<String> = (spec.read_write.iter())
        .chain(&spec.read_only)
        .chain(&spec.exec_dirs)
        .chain(&spec.tmp_dir)
        .chain(&spec.held)
        .chain(&spec.pinned)
        .chain(&spec.home)
        .map(|p| s(p))
        .collect();
    let sources: Vec<&String> = match spec.tier {
        Tier::C => mounts
            .iter()
            .filter_map(|m| match m {
                Mount::Bind { source, .. } | Mount::Overlay { source, .. } => Some(source),
                _ => None,
            })
            .collect(),
        Tier::B => landlock
            .read
            .iter()
            .chain(&landlock.write)
            .chain(&landlock.execute)
            .chain(&landlock.list)
            .collect(),
    };
    // A system broker sends a cloned tree of each bind and overlay instead.
    let trees = (spec.tier == Tier::C && spec.host_ids.is_some()).then_some(sources.len());
    let mut out: Vec<HostPath> = Vec::new();
    for path in sources {
        if !out.iter().any(|d| d.path == *path) {
            out.push(HostPath { path: path.clone(), host_layout: !granted.contains(path) });
        }
    }
    let sent = trees.unwrap_or(out.len());
    if sent > PLAN_MAX_DESCRIPTORS {
        return Err(BuildError::TooManyPaths(sent));
    }
    Ok(out)
}

/// An empty mount over a sensitive entry: an empty tmpfs over a directory,
/// /dev/null over a file.
fn hiding(path: &Path, is_dir: bool) -> Mount {
    match is_dir {
        true => Mount::Tmpfs { target: s(path), size_bytes: HIDDEN_DIR_BYTES, mode: HIDDEN_DIR_MODE },
        false => Mount::Bind { source: "/dev/null".into(), target: s(path), writable: false, owned: false },
    }
}

fn limit(v: u64) -> Rlimit {
    Rlimit::both(if v == 0 { RLIM_INFINITY } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(tier: Tier) -> JailSpec {
        let ws = std::env::temp_dir();
        JailSpec {
            tier,
            program: "/usr/bin/true".into(),
            argv: vec!["true".into()],
            env: vec![],
            cwd: ws.clone(),
            read_write: vec![ws.clone()],
            read_only: vec![],
            exec_dirs: vec![],
            tmp_dir: Some(ws),
            host_network: false,
            limits: Limits {
                memory_bytes: 1 << 30,
                address_space_bytes: 4 << 30,
                cpu_seconds: 10,
                processes: 64,
                open_files: 256,
                file_size_bytes: 1 << 20,
                tmp_bytes: 1 << 20,
                shm_bytes: 1 << 30,
            },
            landlock_required: LandlockFeatures::FS,
            hostname: "palisade".into(),
            uid: 1000,
            gid: 1000,
            host_ids: None,
            acting_for: None,
            parent_pid: 1,
            cgroup: None,
            no_fork: false,
            temp_workspace: None,
            write_bound: None,
            hidden: vec![],
            held: vec![],
            pinned: vec![],
            home: None,
            etc_view: None,
            layout: Layout {
                devices: palisade_protocol::DEV_NODES.iter().map(|n| format!("/dev/{n}")).collect(),
                ..Layout::default()
            },
            listeners: vec![],
            tcp_connect: None,
            files: vec![],
            umask: None,
            terminal: None,
        }
    }

    #[test]
    fn plans_are_checked_before_they_leave_the_policy() {
        for tier in [Tier::B, Tier::C] {
            let plan = build_plan(&spec(tier)).expect("a consistent plan");
            assert_eq!(plan.check(), Ok(()));
            assert_eq!(plan.rlimits.cpu_seconds, Rlimit { soft: 10, hard: 10 + CPU_KILL_GRACE_SECONDS });
        }
        // Tier B as host root: the policy's own check refuses it, by name.
        let mut root = spec(Tier::B);
        (root.uid, root.gid) = (0, 0);
        let err = build_plan(&root).unwrap_err();
        assert!(matches!(err, BuildError::Invariant(PlanInvariant::HostRoot)), "{err}");
        assert_eq!((err.kind(), err.rule()), (ErrorKind::RuntimeFailure, "plan.invariant"));
    }

    #[test]
    fn dev_shm_is_the_size_the_limits_give() {
        let plan = build_plan(&spec(Tier::C)).unwrap();
        let dev = plan.mounts.iter().find(|m| matches!(m, Mount::Dev { .. }));
        assert_eq!(dev, Some(&Mount::Dev { target: "/dev".into(), shm_bytes: 1 << 30 }));
        // Tier B may write the host's harmless device nodes, and no other device.
        let plan = build_plan(&spec(Tier::B)).unwrap();
        let devices: Vec<&String> = plan.landlock.write.iter().filter(|p| p.starts_with("/dev/")).collect();
        assert!(
            devices.iter().all(|d| palisade_protocol::DEV_NODES.contains(&&d["/dev/".len()..])),
            "{devices:?}"
        );
    }
}
