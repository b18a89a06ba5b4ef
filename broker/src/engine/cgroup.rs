//! Run cgroups: the broker manages a subtree it was given, and nothing else.
//!
//! - **cgroup v2**: the root named by `cgroup_root`, or, only where
//!   /sys/fs/cgroup is a pure cgroup v2 mount, the broker's own cgroup when it
//!   was delegated (systemd `Delegate=yes`: owned by the broker's uid, or
//!   marked `trusted.delegate` for a root broker). The broker moves itself
//!   into a leaf (`broker`) so the no-internal-processes rule holds, enables
//!   `memory pids cpu` for the subtree, and creates `run-N` per run. The
//!   helper joins through fd 5.
//! - **cgroup v1**: only under a root the configuration names (a directory in
//!   a v1 hierarchy, e.g. `/sys/fs/cgroup/memory/palisade`); the same name is
//!   used in the memory, pids, cpu, cpuacct and freezer hierarchies. The broker
//!   places the helper itself, before the helper has its plan.
//!
//! Elsewhere, limits fall back to rlimits and the attestation says so.

use cgroups_rs::cpu::CpuController;
use cgroups_rs::freezer::FreezerController;
use cgroups_rs::memory::MemController;
use cgroups_rs::pid::PidController;
use cgroups_rs::{Cgroup, CgroupPid, Controller, Hierarchy, MaxValue, Subsystem, hierarchies};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// statfs(2)'s `f_type` of a cgroup v2 mount.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// statfs(2)'s `f_type` of a cgroup v1 hierarchy.
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
/// The controllers runs are limited with.
pub const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
const V1_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];
/// The CPU quota's period: the kernel's default CFS period (100 ms), in µs.
const CPU_PERIOD_USEC: u64 = 100_000;
/// cgroup v1's `cpuacct.stat` counts in USER_HZ ticks, 100 a second on Linux.
const USER_HZ: u64 = 100;
/// How long removal keeps killing a run's processes before it gives up
/// waiting for the cgroup to empty (they are SIGKILLed: only a process
/// stuck in the kernel takes this long).
const EMPTY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long removal keeps trying `rmdir` (the kernel refuses it until the
/// last member is gone from its accounting).
const REMOVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Between two kills of what is left, while a cgroup empties.
const EMPTY_POLL: Duration = Duration::from_millis(2);
/// Between two attempts to remove an emptied cgroup.
const REMOVE_POLL: Duration = Duration::from_millis(5);

pub use crate::error::CgroupError;

/// A cgroup v2 hierarchy rooted at the broker's subtree (cgroups-rs's own
/// `V2` is rooted at /sys/fs/cgroup, which the broker must not touch).
#[derive(Debug, Clone)]
struct Subtree {
    root: PathBuf,
}

impl Hierarchy for Subtree {
    fn v2(&self) -> bool {
        true
    }
    fn subsystems(&self) -> Vec<Subsystem> {
        let enabled = std::fs::read_to_string(self.root.join("cgroup.subtree_control")).unwrap_or_default();
        let r = || self.root.clone();
        let mut subs = vec![Subsystem::Freezer(FreezerController::new(r(), true))];
        for c in enabled.split_whitespace() {
            match c {
                "memory" => subs.push(Subsystem::Mem(MemController::new(r(), true))),
                "pids" => subs.push(Subsystem::Pid(PidController::new(r(), true))),
                "cpu" => subs.push(Subsystem::Cpu(CpuController::new(r(), true))),
                _ => {}
            }
        }
        subs
    }
    fn root(&self) -> PathBuf {
        self.root.clone()
    }
    fn root_control_group(&self) -> Cgroup {
        Cgroup::load(Box::new(self.clone()), "")
    }
    fn parent_control_group(&self, path: &str) -> Cgroup {
        let parent = Path::new(path).parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        Cgroup::load(Box::new(self.clone()), parent)
    }
}

#[derive(Debug, Clone)]
enum Backend {
    V2 { root: PathBuf },
    V1 { relative: PathBuf },
}

/// What the broker may use, found once at start-up.
#[derive(Debug, Clone)]
pub struct Cgroups {
    /// `Err`: why there is none.
    backend: Result<Backend, Unavailable>,
    /// For `palisade doctor` and the logs.
    pub description: String,
}

/// Limits of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimits {
    pub memory_bytes: u64,
    pub processes: u64,
    /// Percent of one CPU; 0: no limit.
    pub cpu_percent: u64,
}

/// What a run's cgroup recorded.
#[derive(Debug, Clone, Copy, Default)]
pub struct CgroupUsage {
    pub peak_memory_bytes: u64,
    pub cpu_user_usec: u64,
    pub cpu_system_usec: u64,
    pub oom_kills: u64,
}

fn statfs_magic(path: &Path) -> Option<i64> {
    // The type is i64 with glibc, u64 with musl; magic numbers fit both.
    #[allow(clippy::unnecessary_cast)]
    nix::sys::statfs::statfs(path).ok().map(|s| s.filesystem_type().0 as i64)
}

/// The cgroup v2 path of this process, from /proc/self/cgroup (`0::/path`).
fn own_cgroup_v2() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/')))
}

/// Why the broker has no cgroups, as discovery found (kept to be told).
#[derive(Debug, Clone)]
struct Unavailable(String);

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    })
}

/// Whether this process was delegated `dir`: an unprivileged broker owns it;
/// a root broker needs systemd's `trusted.delegate` mark (root can write
/// anywhere, so writability proves nothing).
fn delegated(dir: &Path) -> Result<(), CgroupError> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir).map_err(|source| CgroupError::Stat { path: dir.into(), source })?;
    let me = nix::unistd::geteuid().as_raw();
    if me != 0 {
        return if meta.uid() == me {
            Ok(())
        } else {
            Err(CgroupError::NotDelegated { dir: dir.into(), uid: me, owner: meta.uid() })
        };
    }
    // Room for the mark's value, "1", and then some.
    let mut buf = [0u8; 8];
    // A path with a NUL byte cannot name a file, let alone a marked one.
    let marked = std::ffi::CString::new(dir.as_os_str().as_bytes()).is_ok_and(|path| {
        // SAFETY: both strings are NUL-terminated and `buf` is valid for its length.
        let n = unsafe {
            libc::getxattr(path.as_ptr(), c"trusted.delegate".as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        };
        n > 0 && buf[0] == b'1'
    });
    if marked { Ok(()) } else { Err(CgroupError::NoDelegateMark(dir.into())) }
}

impl Cgroups {
    pub fn none(reason: impl std::fmt::Display) -> Cgroups {
        let reason = reason.to_string();
        Cgroups { description: format!("none: {reason}"), backend: Err(Unavailable(reason)) }
    }

    /// Finds (and, with `apply`, prepares) the subtree: the configured root,
    /// else the delegated cgroup of this process on a pure cgroup v2 host.
    /// Without `apply` nothing is written (for `palisade doctor`).
    pub fn discover(configured: Option<&Path>, apply: bool) -> Cgroups {
        Cgroups::find(configured, apply).unwrap_or_else(Cgroups::none)
    }

    fn find(configured: Option<&Path>, apply: bool) -> Result<Cgroups, CgroupError> {
        let Some(root) = configured else {
            if statfs_magic(Path::new("/sys/fs/cgroup")) != Some(CGROUP2_SUPER_MAGIC) {
                return Err(CgroupError::NotPureV2);
            }
            let own = own_cgroup_v2().ok_or(CgroupError::NoOwnCgroup)?;
            delegated(&own)?;
            return Cgroups::prepare_v2(&own, false, apply);
        };
        match statfs_magic(root) {
            Some(CGROUP2_SUPER_MAGIC) => Cgroups::prepare_v2(root, true, apply),
            Some(CGROUP_SUPER_MAGIC) => Cgroups::prepare_v1(root, apply),
            Some(_) => Err(CgroupError::NotCgroupFs(root.into())),
            None => Err(CgroupError::Missing(root.into())),
        }
    }

    /// Moves this process out of `root` (into `root/broker`) if it lives
    /// there, enables the controllers for the subtree, and clears runs left
    /// over from a previous broker.
    fn prepare_v2(root: &Path, configured: bool, apply: bool) -> Result<Cgroups, CgroupError> {
        let available = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        let missing: Vec<&str> =
            CONTROLLERS.iter().copied().filter(|c| !available.split_whitespace().any(|a| a == *c)).collect();
        if !missing.is_empty() {
            let available = available.trim().to_string();
            return Err(CgroupError::MissingControllers { root: root.into(), missing, available });
        }
        let description = format!(
            "cgroup v2 at {} ({}), controllers {}{}",
            root.display(),
            if configured { "configured" } else { "delegated" },
            CONTROLLERS.join(" "),
            if root.join("memory.swap.current").exists() {
                ""
            } else {
                "; no swap accounting (swapaccount=0): memory.swap.max cannot be set, swap is not limited"
            }
        );
        let c = Cgroups { description, backend: Ok(Backend::V2 { root: root.to_path_buf() }) };
        if !apply {
            return Ok(c);
        }
        if own_cgroup_v2().as_deref() == Some(root) {
            // No internal processes: the broker moves into a leaf of its own.
            let leaf = root.join("broker");
            std::fs::create_dir_all(&leaf)
                .map_err(|source| CgroupError::Mkdir { path: leaf.clone(), source })?;
            write(&leaf.join("cgroup.procs"), &std::process::id().to_string())?;
        }
        let enable: String = CONTROLLERS.iter().map(|c| format!("+{c} ")).collect();
        write(&root.join("cgroup.subtree_control"), enable.trim_end())
            .map_err(|e| CgroupError::Enable { root: root.into(), source: Box::new(e) })?;
        c.sweep();
        Ok(c)
    }

    fn prepare_v1(root: &Path, apply: bool) -> Result<Cgroups, CgroupError> {
        let mounts = hierarchies::V1::new();
        let memory = mounts.get_mount_point(cgroups_rs::Controllers::Mem);
        let point = memory.ok_or(CgroupError::NoV1Hierarchy("memory"))?;
        let relative = root
            .strip_prefix(&point)
            .map_err(|_| CgroupError::NotInV1Memory { root: root.into(), memory: point.clone() })?;
        for (c, ctl) in [
            ("pids", cgroups_rs::Controllers::Pids),
            ("cpu", cgroups_rs::Controllers::Cpu),
            ("cpuacct", cgroups_rs::Controllers::CpuAcct),
            ("freezer", cgroups_rs::Controllers::Freezer),
        ] {
            mounts.get_mount_point(ctl).ok_or(CgroupError::NoV1Hierarchy(c))?;
        }
        let c = Cgroups {
            description: format!(
                "cgroup v1 under {} in the {} hierarchies",
                relative.display(),
                V1_CONTROLLERS.join(", ")
            ),
            backend: Ok(Backend::V1 { relative: relative.to_path_buf() }),
        };
        if apply {
            c.sweep();
        }
        Ok(c)
    }

    /// The subtree as the policy sees it, or why the broker has none.
    pub fn for_policy(&self) -> Result<palisade_policy::CgroupRoot, String> {
        self.available().map_err(|why| why.to_string())?;
        Ok(palisade_policy::CgroupRoot { path: self.path_of("").unwrap_or_default(), v1: self.is_v1() })
    }

    /// How this host mounts cgroups, for `palisade doctor`.
    pub fn host_layout() -> String {
        match statfs_magic(Path::new("/sys/fs/cgroup")) {
            Some(CGROUP2_SUPER_MAGIC) => {
                let c = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
                format!("v2 (pure), root controllers: {}", c.trim())
            }
            Some(_) if statfs_magic(Path::new("/sys/fs/cgroup/unified")) == Some(CGROUP2_SUPER_MAGIC) => {
                "v1/v2 hybrid: controllers in v1 hierarchies, an empty v2 tree at /sys/fs/cgroup/unified"
                    .into()
            }
            Some(_) => "v1".into(),
            None => "no cgroup filesystem at /sys/fs/cgroup".into(),
        }
    }

    /// `Err`: why the broker has no cgroups.
    pub fn available(&self) -> Result<(), &str> {
        self.backend.as_ref().map(|_| ()).map_err(|Unavailable(why)| why.as_str())
    }

    pub fn is_v1(&self) -> bool {
        matches!(self.backend, Ok(Backend::V1 { .. }))
    }

    /// `v2`, `v1`, or `none` (without cgroups for runs).
    pub fn mode(&self) -> &'static str {
        match self.backend {
            Ok(Backend::V2 { .. }) => "v2",
            Ok(Backend::V1 { .. }) => "v1",
            Err(_) => "none",
        }
    }

    /// The path of run `name`'s cgroup (for the plan and the attestation).
    pub fn path_of(&self, name: &str) -> Option<PathBuf> {
        match &self.backend {
            Ok(Backend::V2 { root }) => Some(root.join(name)),
            Ok(Backend::V1 { relative }) => Some(relative.join(name)),
            Err(_) => None,
        }
    }

    fn load(&self, name: &str) -> Option<Cgroup> {
        match self.backend.as_ref().ok()? {
            Backend::V2 { root } => Some(Cgroup::load(Box::new(Subtree { root: root.clone() }), name)),
            Backend::V1 { relative } => Some(Cgroup::load_with_specified_controllers(
                Box::new(hierarchies::V1::new()),
                relative.join(name),
                V1_CONTROLLERS.iter().map(|s| s.to_string()).collect(),
            )),
        }
    }

    /// Creates run `name`'s cgroup with its limits.
    pub fn create(&self, name: &str, limits: CgroupLimits) -> Result<RunCgroup, CgroupError> {
        let run = self.create_unlimited(name)?;
        if let Err(e) = run.set_limits(limits) {
            run.remove();
            return Err(e);
        }
        Ok(run)
    }

    /// Creates the cgroup of a warm pool's slot (v2, or v1 in every
    /// hierarchy): its limits are the run's, set when a run claims it
    /// ([`RunCgroup::set_limits`]).
    pub fn create_unlimited(&self, name: &str) -> Result<RunCgroup, CgroupError> {
        let unavailable = || CgroupError::Unavailable(self.available().err().unwrap_or("no cgroup").into());
        let cg = self.load(name).ok_or_else(unavailable)?;
        let dir = match &self.backend {
            Ok(Backend::V2 { root }) => {
                let dir = root.join(name);
                std::fs::create_dir(&dir)
                    .map_err(|source| CgroupError::Mkdir { path: dir.clone(), source })?;
                Some(dir)
            }
            _ => {
                // The run's directory in each v1 hierarchy (cpu and cpuacct
                // may share one), made here so that a failure in any of them
                // fails the run: cgroups-rs 0.3's `create` does not report them.
                for sub in cg.subsystems() {
                    let path = sub.to_controller().path().to_path_buf();
                    if let Err(source) = std::fs::create_dir_all(&path) {
                        let _ = cg.delete();
                        return Err(CgroupError::Mkdir { path, source });
                    }
                }
                None
            }
        };
        Ok(RunCgroup {
            cg,
            dir,
            v1: self.is_v1(),
            name: name.to_string(),
            owner: self.clone(),
            removed: false,
        })
    }

    /// Removes run cgroups that brokers no longer running left behind
    /// (killing what is in them); those of live brokers sharing the subtree
    /// stay. Their names say whose they are (`run-<pid>-<start>-<n>`).
    pub fn sweep(&self) {
        self.remove_runs(|instance| !crate::host::instance::alive(instance));
    }

    /// Removes this broker's own run cgroups (at shutdown: runs cut short).
    pub fn remove_own(&self) {
        let mine = format!("{}-", crate::host::instance::tag());
        self.remove_runs(|instance| instance.starts_with(&mine));
    }

    fn remove_runs(&self, pick: impl Fn(&str) -> bool) {
        let dir = match &self.backend {
            Ok(Backend::V2 { root }) => root.clone(),
            Ok(Backend::V1 { relative }) => {
                match hierarchies::V1::new().get_mount_point(cgroups_rs::Controllers::Mem) {
                    Some(point) => point.join(relative),
                    None => return,
                }
            }
            Err(_) => return,
        };
        let Ok(entries) = std::fs::read_dir(&dir) else { return };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(instance) = name.strip_prefix("run-") else { continue };
            if !pick(instance) {
                continue;
            }
            if let Some(cg) = self.load(&name) {
                tracing::warn!(cgroup = %name, "removing a run cgroup left behind");
                let v2_dir = (!self.is_v1()).then(|| dir.join(&name));
                RunCgroup { dir: v2_dir, cg, v1: self.is_v1(), name, owner: self.clone(), removed: false }
                    .remove();
            }
        }
    }
}

/// A session's cgroup, as each command of the session joins it: the
/// broker places the command's helper in it (v1 and v2 alike: the helper
/// may be one started ahead, outside any cgroup), before the helper has
/// its plan; the session's own run, which made the cgroup, kills and
/// removes it when the session ends. Its figures are the
/// whole session's, never one command's; its OOM kills say whether the
/// memory limit ended a command.
#[derive(Debug)]
pub struct Membership {
    cg: Cgroup,
    dir: Option<PathBuf>,
    v1: bool,
}

impl Membership {
    /// Moves a command's helper (`pid`) into the session's cgroup: on v2
    /// through its `cgroup.procs`, on v1 in every hierarchy.
    pub fn place(&self, pid: u32) -> Result<(), CgroupError> {
        match &self.dir {
            Some(dir) => write(&dir.join("cgroup.procs"), &pid.to_string()),
            None => place_v1(&self.cg, pid),
        }
    }

    /// The processes the memory limit has killed in the session so far.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v1 { "memory.oom_control" } else { "memory.events" };
        let text =
            file_path(&self.cg, self.dir.as_deref(), file).and_then(|p| std::fs::read_to_string(p).ok());
        field(&text.unwrap_or_default(), "oom_kill ")
    }
}

/// cgroup v1: moves `pid` into `cg` in every hierarchy.
fn place_v1(cg: &Cgroup, pid: u32) -> Result<(), CgroupError> {
    cg.add_task_by_tgid(CgroupPid::from(pid as u64)).map_err(|source| CgroupError::Place { pid, source })
}

/// Where a cgroup's `file` is: in its v2 directory, or (v1) its memory
/// hierarchy's.
fn file_path(cg: &Cgroup, dir: Option<&Path>, file: &str) -> Option<PathBuf> {
    match dir {
        Some(d) => Some(d.join(file)),
        None => cg.controller_of::<MemController>().map(|m| m.path().join(file)),
    }
}

/// The number after `key` on its line of a cgroup file; 0 where it is missing.
fn field(text: &str, key: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok()).unwrap_or(0)
}

/// One run's cgroup. Removed by [`RunCgroup::remove`] after the run; one
/// dropped without it (a run cut short) is removed by a thread of its own.
pub struct RunCgroup {
    cg: Cgroup,
    /// cgroup v2: the directory (the helper joins it through fd 5).
    dir: Option<PathBuf>,
    v1: bool,
    name: String,
    owner: Cgroups,
    removed: bool,
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        if std::mem::replace(&mut self.removed, true) {
            return;
        }
        let Some(cg) = self.owner.load(&self.name) else { return };
        let orphan = RunCgroup {
            cg,
            dir: self.dir.clone(),
            v1: self.v1,
            name: self.name.clone(),
            owner: self.owner.clone(),
            removed: false,
        };
        // Removal waits for the members to die: not on this (async) thread.
        std::thread::spawn(move || orphan.remove());
    }
}

impl RunCgroup {
    /// Sets the run's limits: on a cgroup made by [`Cgroups::create`] at
    /// once; on a warm pool slot's, when a run claims it.
    pub fn set_limits(&self, l: CgroupLimits) -> Result<(), CgroupError> {
        let e = |what: &'static str| move |source| CgroupError::Limit { what, source };
        let mem: &MemController = self.cg.controller_of().ok_or(CgroupError::NoController("memory"))?;
        mem.set_limit(l.memory_bytes as i64).map_err(e("the memory limit"))?;
        let swap_file = if self.v1 { "memory.memsw.limit_in_bytes" } else { "memory.swap.max" };
        // Without swap accounting the file is missing; discovery said so.
        if self.path(swap_file).is_some_and(|p| p.exists()) {
            // No swap beyond the memory limit (v1: memory+swap equal to memory).
            let swap = if self.v1 { l.memory_bytes as i64 } else { 0 };
            mem.set_memswap_limit(swap).map_err(e("the swap limit"))?;
        }
        let pids: &PidController = self.cg.controller_of().ok_or(CgroupError::NoController("pids"))?;
        pids.set_pid_max(MaxValue::Value(l.processes as i64)).map_err(e("pids.max"))?;
        if l.cpu_percent > 0 {
            let cpu: &CpuController = self.cg.controller_of().ok_or(CgroupError::NoController("cpu"))?;
            let (period, quota) = (CPU_PERIOD_USEC, CPU_PERIOD_USEC * l.cpu_percent / 100);
            cpu.set_cfs_quota_and_period(Some(quota as i64), Some(period)).map_err(e("the cpu quota"))?;
        }
        Ok(())
    }

    fn path(&self, file: &str) -> Option<PathBuf> {
        file_path(&self.cg, self.dir.as_deref(), file)
    }

    /// cgroup v2: the helper joins through fd 5; v1: the broker places it.
    pub fn joins_itself(&self) -> bool {
        self.dir.is_some()
    }

    /// The directory to hand the helper as fd 5 (cgroup v2).
    pub fn open_dir(&self) -> std::io::Result<Option<OwnedFd>> {
        let Some(dir) = &self.dir else { return Ok(None) };
        let file = std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)?;
        Ok(Some(OwnedFd::from(file)))
    }

    /// The cgroup as a session's commands join it: see [`Membership`].
    pub fn membership(&self) -> Option<Membership> {
        let cg = self.owner.load(&self.name)?;
        Some(Membership { cg, dir: self.dir.clone(), v1: self.v1 })
    }

    /// `run-...`, under the broker's cgroup root.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn is_v1(&self) -> bool {
        self.v1
    }

    pub fn display(&self) -> String {
        self.dir.as_ref().map_or_else(|| self.cg.path().to_string(), |d| d.display().to_string())
    }

    /// cgroup v1: moves `pid` into the run's cgroup in every hierarchy.
    pub fn place(&self, pid: u32) -> Result<(), CgroupError> {
        if self.dir.is_some() {
            return Ok(());
        }
        place_v1(&self.cg, pid)
    }

    /// Kills every process in the cgroup: `cgroup.kill` where the kernel has
    /// it, else freeze, SIGKILL every member, thaw.
    pub fn kill(&self) {
        if !self.v1 && self.cg.kill().is_ok() {
            return;
        }
        let freezer: Option<&FreezerController> = self.cg.controller_of();
        if let Some(f) = freezer {
            let _ = f.freeze();
        }
        for pid in self.cg.procs() {
            // ESRCH: already gone.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if let Some(f) = freezer {
            let _ = f.thaw();
        }
    }

    pub fn usage(&self) -> CgroupUsage {
        let read =
            |file: &str| self.path(file).and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
        let peak = |file: &str| read(file).trim().parse::<u64>().unwrap_or(0);
        if self.v1 {
            let cpuacct = |f: &str| {
                let p = self
                    .cg
                    .controller_of::<cgroups_rs::cpuacct::CpuAcctController>()
                    .map(|c| c.path().join(f));
                p.and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default()
            };
            let ticks = |key: &str| field(&cpuacct("cpuacct.stat"), key) * 1_000_000 / USER_HZ;
            return CgroupUsage {
                peak_memory_bytes: peak("memory.max_usage_in_bytes"),
                cpu_user_usec: ticks("user "),
                cpu_system_usec: ticks("system "),
                oom_kills: field(&read("memory.oom_control"), "oom_kill "),
            };
        }
        let cpu = read("cpu.stat");
        CgroupUsage {
            peak_memory_bytes: peak("memory.peak"),
            cpu_user_usec: field(&cpu, "user_usec "),
            cpu_system_usec: field(&cpu, "system_usec "),
            oom_kills: field(&read("memory.events"), "oom_kill "),
        }
    }

    fn populated(&self) -> bool {
        if self.v1 {
            return !self.cg.procs().is_empty();
        }
        let events =
            self.path("cgroup.events").and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
        events.lines().any(|l| l == "populated 1")
    }

    /// Kills what is left, waits for the cgroup to empty, and removes it.
    pub fn remove(mut self) {
        self.removed = true;
        let start = Instant::now();
        while self.populated() && start.elapsed() < EMPTY_TIMEOUT {
            self.kill();
            std::thread::sleep(EMPTY_POLL);
        }
        let mut last = None;
        while start.elapsed() < REMOVE_TIMEOUT {
            let refused = match &self.dir {
                Some(d) => std::fs::remove_dir(d).err().map(|e| e.to_string()),
                None => self.cg.delete().err().map(|e| e.to_string()),
            };
            match refused {
                None => return,
                Some(e) => last = Some(e),
            }
            std::thread::sleep(REMOVE_POLL);
        }
        tracing::error!(cgroup = %self.display(), "cannot remove the run's cgroup: {}", last.unwrap_or_default());
    }
}
