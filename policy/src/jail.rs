//! From a resolved sandbox description to the helper's `JailPlan`.
//!
//! Everything host-dependent is decided here: which system directories exist
//! and which are symlinks (merged /usr), which /etc files a program needs,
//! what Landlock rules mirror the mounts. The helper receives the result and
//! decides nothing.

use crate::seccomp;
use palisade_protocol::{
    HostIds, HostPath, JailPlan, LandlockFeatures, LandlockPlan, Mount, Namespaces, PLAN_MAX_DESCRIPTORS,
    RLIM_INFINITY, Rlimit, Rlimits, Tier,
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

/// Host device files a Tier B sandbox may use (Tier C gets its own /dev).
pub const TIER_B_DEVICES: [&str; 6] =
    ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"];

/// Resource limits of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: u64,
    pub cpu_seconds: u64,
    pub processes: u64,
    pub open_files: u64,
    pub file_size_bytes: u64,
    /// Size of the tmpfs `/tmp` (and of a temporary workspace).
    pub tmp_bytes: u64,
    /// Size of the tmpfs `/dev/shm`.
    pub shm_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 512 << 20,
            cpu_seconds: 300,
            processes: 256,
            open_files: 1024,
            file_size_bytes: 1 << 30,
            tmp_bytes: 256 << 20,
            shm_bytes: 64 << 20,
        }
    }
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
    /// Tier C: a directory holding a copy of the [`ETC_ENTRIES`] (what others
    /// may read of them), bound read-only at `/etc` in one mount instead of
    /// one mount per entry. Not used when another mount lies under `/etc`
    /// (its mount point could not be made in a read-only bind).
    pub etc_view: Option<PathBuf>,
    /// The host's system directories, /etc entries and devices.
    pub layout: Layout,
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
/// of the [`ETC_ENTRIES`] and [`TIER_B_DEVICES`] it has. Gathered by the
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
    #[error("the sandbox would need {0} host paths; a plan carries at most {PLAN_MAX_DESCRIPTORS}")]
    TooManyPaths(usize),
}

/// Builds the plan. Tier C: a private root of read-only system binds, the
/// writable directories, tmpfs /tmp, fresh /proc and minimal /dev, with
/// Landlock rules mirroring it. Tier B: the host's root, confined by Landlock
/// alone.
pub fn build_plan(spec: &JailSpec) -> Result<JailPlan, BuildError> {
    let under_etc = |p: &PathBuf| p.starts_with("/etc");
    let etc_view = spec.etc_view.as_ref().filter(|_| {
        spec.tier == Tier::C
            && !(spec.read_write.iter().chain(&spec.read_only).chain(&spec.temp_workspace).any(under_etc))
    });
    // With the snapshot, the entries are not bound one by one: it holds them.
    let (links, system) = system_paths(&spec.layout, etc_view.is_none());
    let read_write: Vec<String> = spec.read_write.iter().map(|p| s(p)).collect();
    let read_only: Vec<String> = spec.read_only.iter().map(|p| s(p)).collect();
    let mut exec: Vec<String> = system.iter().filter(|p| !p.starts_with("/etc")).cloned().collect();
    exec.extend(spec.exec_dirs.iter().map(|p| s(p)));

    let mut wanted = LandlockFeatures::FS
        .union(LandlockFeatures::FS_REFER)
        .union(LandlockFeatures::FS_TRUNCATE)
        .union(LandlockFeatures::SCOPE_ABSTRACT_UNIX)
        .union(LandlockFeatures::SCOPE_SIGNAL);
    // Tier C cuts the network with a namespace (loopback inside stays usable);
    // Tier B has only Landlock's TCP rules and the seccomp socket families.
    let ip_sockets = spec.host_network || spec.tier == Tier::C;
    if spec.tier == Tier::B && !spec.host_network {
        wanted = wanted.union(LandlockFeatures::NET_TCP);
    }
    let mut landlock = LandlockPlan {
        wanted,
        required: spec.landlock_required.intersection(wanted),
        read: system.clone(),
        write: read_write.clone(),
        execute: exec,
        list: vec![],
        tcp_bind: vec![],
        tcp_connect: vec![],
    };
    landlock.read.extend(read_only.iter().cloned());

    let (namespaces, mut mounts, hostname) = match spec.tier {
        Tier::C => {
            let mut mounts: Vec<Mount> =
                links.iter().map(|(t, l)| Mount::Symlink { target: t.clone(), link: l.clone() }).collect();
            let bind = |p: &String, writable, owned| Mount::Bind {
                source: p.clone(),
                target: p.clone(),
                writable,
                owned,
            };
            match etc_view {
                Some(view) => {
                    mounts.extend(
                        system.iter().filter(|p| !p.starts_with("/etc/")).map(|p| bind(p, false, false)),
                    );
                    mounts.push(Mount::Bind {
                        source: s(view),
                        target: "/etc".into(),
                        writable: false,
                        owned: false,
                    });
                }
                None => mounts.extend(system.iter().map(|p| bind(p, false, false))),
            }
            mounts.extend(read_only.iter().map(|p| bind(p, false, true)));
            mounts.extend(read_write.iter().map(|p| match spec.write_bound {
                Some(size_bytes) => {
                    Mount::Overlay { source: p.clone(), target: p.clone(), size_bytes, owned: true }
                }
                None => bind(p, true, true),
            }));
            mounts.push(Mount::Tmpfs {
                target: "/tmp".into(),
                size_bytes: spec.limits.tmp_bytes,
                mode: 0o1777,
            });
            if let Some(t) = &spec.temp_workspace {
                mounts.push(Mount::Tmpfs { target: s(t), size_bytes: spec.limits.tmp_bytes, mode: 0o755 });
                landlock.write.push(s(t));
            }
            mounts.push(Mount::Proc { target: "/proc".into() });
            mounts.push(Mount::Dev { target: "/dev".into(), shm_bytes: spec.limits.shm_bytes });
            mounts.extend(spec.hidden.iter().map(|(p, is_dir)| hiding(p, *is_dir)));
            // The private /etc holds only the curated entries: one rule covers them.
            if etc_view.is_some() || landlock.read.iter().any(|p| p.starts_with("/etc/")) {
                landlock.read.retain(|p| !p.starts_with("/etc/") && p != "/etc");
                landlock.read.push("/etc".into());
            }
            landlock.read.push("/proc".into());
            landlock.write.extend(["/tmp".to_string(), "/dev".to_string()]);
            // Inside the private root, listing directories reveals nothing that is not mounted.
            landlock.list.push("/".into());
            let ns = Namespaces { net: !spec.host_network, ..Namespaces::ALL };
            (ns, mounts, Some(spec.hostname.clone()))
        }
        Tier::B => {
            landlock.read.push("/proc".into());
            landlock.write.extend(spec.layout.devices.iter().cloned());
            landlock.write.extend(spec.tmp_dir.iter().map(|p| s(p)));
            (Namespaces::NONE, vec![], None)
        }
    };
    mounts.sort_by(depth_then_name);
    let descriptors = descriptors(spec, &mounts, &landlock)?;
    let l = &spec.limits;
    let profile = seccomp::Profile { tier: spec.tier, ip: ip_sockets, fork: !spec.no_fork };
    Ok(JailPlan {
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
        namespaces,
        mounts,
        hostname,
        rlimits: Rlimits {
            address_space: limit(l.memory_bytes),
            // SIGXCPU at the limit, SIGKILL a second later.
            cpu_seconds: Rlimit { soft: l.cpu_seconds, hard: l.cpu_seconds.saturating_add(1) },
            processes: limit(l.processes),
            open_files: limit(l.open_files),
            file_size: limit(l.file_size_bytes),
            core: Rlimit::both(0),
        },
        landlock,
        seccomp: seccomp::default_program(profile)?.to_vec(),
        monitor_seccomp: seccomp::monitor_program()?.to_vec(),
        cgroup: spec.cgroup.clone(),
        parent_pid: spec.parent_pid,
    })
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
    let mut out: Vec<HostPath> = Vec::new();
    for path in sources {
        if !out.iter().any(|d| d.path == *path) {
            out.push(HostPath { path: path.clone(), host_layout: !granted.contains(path) });
        }
    }
    if out.len() > PLAN_MAX_DESCRIPTORS {
        return Err(BuildError::TooManyPaths(out.len()));
    }
    Ok(out)
}

/// An empty mount over a sensitive entry: an empty tmpfs over a directory,
/// /dev/null over a file.
fn hiding(path: &Path, is_dir: bool) -> Mount {
    match is_dir {
        true => Mount::Tmpfs { target: s(path), size_bytes: 4096, mode: 0o000 },
        false => Mount::Bind { source: "/dev/null".into(), target: s(path), writable: false, owned: false },
    }
}

fn limit(v: u64) -> Rlimit {
    Rlimit::both(if v == 0 { RLIM_INFINITY } else { v })
}
