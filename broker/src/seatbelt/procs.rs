//! The processes of a run: its process group and every descendant of a
//! member (a process that left the group with `setsid` or `setpgid` is
//! found while its parent lives), to kill them all and to sum their memory.
//! A sampler walks them every [`super::MEMORY_SAMPLE_EVERY`] and remembers
//! each it saw (pid and start time), so that one that left the group and
//! then lost its parent is still killed at the end. One that leaves the
//! group and loses its parent between two samples is found by its sandbox
//! ([`Marks`]): macOS has no cgroup, pid namespace or subreaper to hold it,
//! but a process never leaves its Seatbelt sandbox.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Sends `signal` to every process of the run whose group is `pgid`. A
/// SIGKILL first stops the tree and walks it again until no new process
/// appears, so that none forks past the walk.
pub fn kill_all(pgid: libc::pid_t, signal: i32) {
    if signal == libc::SIGKILL {
        signal_group(pgid, libc::SIGSTOP);
        let mut seen = BTreeSet::new();
        loop {
            let found: Vec<libc::pid_t> = members(pgid).into_iter().filter(|p| !seen.contains(p)).collect();
            if found.is_empty() {
                break;
            }
            for &pid in &found {
                signal_one(pid, libc::SIGSTOP);
            }
            seen.extend(found);
        }
        for &pid in &seen {
            signal_one(pid, libc::SIGKILL);
        }
    }
    signal_group(pgid, signal);
}

fn signal_group(pgid: libc::pid_t, signal: i32) {
    // SAFETY: killpg takes plain integers; a group that is gone is ESRCH.
    unsafe { libc::killpg(pgid, signal) };
}

fn signal_one(pid: libc::pid_t, signal: i32) {
    // SAFETY: kill takes plain integers; a process that is gone is ESRCH.
    unsafe { libc::kill(pid, signal) };
}

/// What marks a run's processes in a way they cannot shed: paths that its
/// profile alone lets read (the run's mark and its broker's), asked of the
/// kernel for any process of the user (`sandbox_check`), beside a path no
/// profile lets read (which tells apart a process in another sandbox that
/// lets read anything there). A process keeps its sandbox for life and
/// passes it on to its children: whatever group or session it moves to,
/// whoever its parent, it is found. The paths need not exist: they are in
/// the broker's private directory, which no run is granted.
#[derive(Clone, Debug)]
pub struct Marks {
    /// What is looked for: the run's mark, or a broker's (every run of it).
    mark: PathBuf,
    /// The broker's mark, which its runs' profiles also let read.
    instance: PathBuf,
    /// What no profile lets read.
    none: PathBuf,
}

/// How many times [`Marks::kill`] looks again for processes that a marked
/// one started before it was stopped: far past what a run's process limit
/// lets it start.
const KILL_ROUNDS: usize = 4096;

impl Marks {
    /// Run `run`'s of broker `instance`, whose profiles are in `profiles`.
    pub fn of_run(profiles: &Path, instance: &str, run: u64) -> Marks {
        let dir = profiles.join("marks");
        Marks {
            mark: dir.join(format!("{instance}-{run}")),
            instance: dir.join(instance),
            none: dir.join("none"),
        }
    }

    /// Every run's of broker `instance`.
    pub fn of_instance(profiles: &Path, instance: &str) -> Marks {
        let dir = profiles.join("marks");
        Marks { mark: dir.join(instance), instance: dir.join(instance), none: dir.join("none") }
    }

    /// Adds to `profile` the rule that lets the run's processes read its marks.
    pub fn allow_in(&self, profile: &mut String) -> Result<(), palisade_policy::seatbelt::SeatbeltError> {
        let quoted = |p: &Path| palisade_policy::seatbelt::quoted(&p.to_string_lossy());
        let (mark, instance) = (quoted(&self.mark)?, quoted(&self.instance)?);
        profile.push_str(&format!(
            "\n; Marks: paths only this run's processes may read (they need not exist),\n\
             ; by which the broker finds every one of them, wherever it went.\n\
             (allow file-read-data (literal {mark}) (literal {instance}))\n"
        ));
        Ok(())
    }

    /// What a stand-in's command is given to be found by (Linux, under test).
    #[cfg(not(target_os = "macos"))]
    pub fn environment(&self) -> String {
        format!("{}:{}", self.mark.display(), self.instance.display())
    }

    /// Every process of this user marked so: stopped (so that none forks
    /// past the walk), looked for again until no new one appears, then
    /// killed; how many.
    pub fn kill(&self) -> usize {
        let mut stopped = BTreeSet::new();
        for round in 0.. {
            let found: Vec<libc::pid_t> =
                os::marked(&self.mark, &self.none).into_iter().filter(|p| !stopped.contains(p)).collect();
            if found.is_empty() {
                break;
            }
            if round == KILL_ROUNDS {
                tracing::error!(mark = %self.mark.display(), "a run's processes keep appearing: killing those found");
                break;
            }
            for &pid in &found {
                signal_one(pid, libc::SIGSTOP);
            }
            stopped.extend(found);
        }
        for &pid in &stopped {
            signal_one(pid, libc::SIGKILL);
        }
        stopped.len()
    }
}

/// The processes of a run seen so far, by pid, with their start time.
#[derive(Default)]
pub struct Seen(Mutex<BTreeMap<libc::pid_t, u64>>);

impl Seen {
    fn record(&self, pids: &[libc::pid_t]) {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for &pid in pids {
            if let Some(start) = crate::host::instance::start_time(pid as u32) {
                seen.entry(pid).or_insert(start);
            }
        }
    }

    /// SIGKILL to each process seen that still runs: the same pid with the
    /// same start time (a pid reused since is another process, left alone).
    pub fn kill(&self) {
        let seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (&pid, &start) in seen.iter() {
            if crate::host::instance::start_time(pid as u32) == Some(start) {
                signal_one(pid, libc::SIGKILL);
            }
        }
    }
}

/// Every [`super::MEMORY_SAMPLE_EVERY`], records the run's processes in
/// `seen` and sums their resident memory; above `limit` bytes (unless
/// unlimited), sets `over` and kills them all.
pub async fn watch(pgid: libc::pid_t, limit: u64, seen: Arc<Seen>, over: Arc<AtomicBool>) {
    loop {
        tokio::time::sleep(super::MEMORY_SAMPLE_EVERY).await;
        let pids = members(pgid);
        seen.record(&pids);
        let total: u64 = pids.into_iter().filter_map(resident_bytes).sum();
        if limit != palisade_protocol::RLIM_INFINITY && total > limit {
            over.store(true, Ordering::SeqCst);
            kill_all(pgid, libc::SIGKILL);
            seen.kill();
            return;
        }
    }
}

/// In the child, between fork and exec: every descriptor from 3 up marked
/// close-on-exec, so that none reaches the command. One inherited without
/// the flag (from whoever started `palisade run`, or launchd), or made by
/// another thread of the broker in the moment between its creation and its
/// flag (`pipe` then `fcntl`, `accept` then `fcntl`, as macOS has no
/// `pipe2`), would otherwise pass into the sandbox, where Seatbelt checks
/// paths at open, not descriptors already open. Done in the child, it
/// changes nothing of the broker's own descriptors. Async-signal-safe: it
/// allocates nothing and makes only `close_range` (Linux), `getrlimit` and
/// `fcntl` calls.
pub fn cloexec_from_3() {
    #[cfg(target_os = "linux")]
    // SAFETY: close_range takes no memory; with CLOSE_RANGE_CLOEXEC it only
    // sets a flag. Where the kernel lacks it (before 5.11), the loop below does.
    if unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) } == 0 {
        return;
    }
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the one struct it is given.
    let open = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
        // No descriptor is numbered at or past the soft limit; macOS keeps
        // it under kern.maxfilesperproc, far below this bound.
        0 => limit.rlim_cur.min(1 << 20) as libc::c_int,
        _ => 1 << 16,
    };
    for fd in 3..open {
        // SAFETY: fcntl on a descriptor number takes no memory; one not open fails with EBADF.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

/// The members of group `pgid` and their descendants.
fn members(pgid: libc::pid_t) -> Vec<libc::pid_t> {
    let mut all: BTreeSet<libc::pid_t> = group(pgid).into_iter().collect();
    let mut next: Vec<libc::pid_t> = all.iter().copied().collect();
    while let Some(pid) = next.pop() {
        for child in children(pid) {
            if all.insert(child) {
                next.push(child);
            }
        }
    }
    all.into_iter().collect()
}

/// `ru_maxrss` in bytes: macOS counts bytes, Linux KiB.
pub fn maxrss_bytes(maxrss: libc::c_long) -> u64 {
    let v = maxrss.max(0) as u64;
    if cfg!(target_os = "macos") { v } else { v * 1024 }
}

#[cfg(target_os = "macos")]
mod os {
    /// `proc_listpids`'s selector for one process group (`<sys/proc_info.h>`).
    const PROC_PGRP_ONLY: u32 = 2;
    /// The most processes one listing returns; a run has far fewer.
    const MAX_LISTED: usize = 4096;

    pub fn group(pgid: libc::pid_t) -> Vec<libc::pid_t> {
        let mut buf = vec![0 as libc::pid_t; MAX_LISTED];
        let size = (buf.len() * std::mem::size_of::<libc::pid_t>()) as libc::c_int;
        // SAFETY: `buf` is valid for writing `size` bytes; the call returns
        // the bytes it wrote (pids), or -1.
        let bytes =
            unsafe { libc::proc_listpids(PROC_PGRP_ONLY, pgid as u32, buf.as_mut_ptr().cast(), size) };
        buf.truncate(bytes.max(0) as usize / std::mem::size_of::<libc::pid_t>());
        buf.retain(|&p| p > 0);
        buf
    }

    pub fn children(pid: libc::pid_t) -> Vec<libc::pid_t> {
        let mut buf = vec![0 as libc::pid_t; MAX_LISTED];
        let size = (buf.len() * std::mem::size_of::<libc::pid_t>()) as libc::c_int;
        // SAFETY: `buf` is valid for writing `size` bytes; the call returns
        // the number of pids it wrote, or -1.
        let n = unsafe { libc::proc_listchildpids(pid, buf.as_mut_ptr().cast(), size) };
        buf.truncate((n.max(0) as usize).min(MAX_LISTED));
        buf.retain(|&p| p > 0);
        buf
    }

    /// `proc_listpids`'s selector for the processes of one real uid (what
    /// RLIMIT_NPROC counts; a setuid program a run starts keeps it).
    const PROC_RUID_ONLY: u32 = 5;
    /// The most processes of one user a listing counts: past any user's
    /// limit (`kern.maxprocperuid`).
    const MAX_OF_UID: usize = 1 << 16;
    /// `sandbox_check`'s filter for a path (`<sandbox.h>`).
    const SANDBOX_FILTER_PATH: libc::c_int = 1;

    unsafe extern "C" {
        /// 0: `pid`'s sandbox allows `operation` (or it has none); 1: it
        /// denies it; -1: no answer. libSystem's, as Chromium uses it.
        fn sandbox_check(
            pid: libc::pid_t,
            operation: *const libc::c_char,
            filter: libc::c_int,
            ...
        ) -> libc::c_int;
        /// A flag of the filter: the check itself is not logged.
        static SANDBOX_CHECK_NO_REPORT: libc::c_int;
    }

    fn of_uid_pids(uid: libc::uid_t) -> Vec<libc::pid_t> {
        let mut buf = vec![0 as libc::pid_t; MAX_OF_UID];
        let size = (buf.len() * std::mem::size_of::<libc::pid_t>()) as libc::c_int;
        // SAFETY: `buf` is valid for writing `size` bytes; the call returns
        // the bytes it wrote (pids), or -1.
        let bytes = unsafe { libc::proc_listpids(PROC_RUID_ONLY, uid, buf.as_mut_ptr().cast(), size) };
        buf.truncate(bytes.max(0) as usize / std::mem::size_of::<libc::pid_t>());
        buf.retain(|&p| p > 0);
        buf
    }

    pub fn of_uid(uid: libc::uid_t) -> usize {
        of_uid_pids(uid).len()
    }

    /// Whether `pid`'s sandbox lets read `path`: `None` where the kernel does not say.
    fn reads(pid: libc::pid_t, path: &std::ffi::CStr) -> Option<bool> {
        // SAFETY: a constant of libSystem's, read as the integer it is.
        let flags = SANDBOX_FILTER_PATH | unsafe { SANDBOX_CHECK_NO_REPORT };
        // SAFETY: both strings are NUL-terminated and outlive the call; the
        // path filter takes one `const char *` after the filter.
        let r = unsafe { sandbox_check(pid, c"file-read-data".as_ptr(), flags, path.as_ptr()) };
        match r {
            0 => Some(true),
            1 => Some(false),
            _ => None,
        }
    }

    /// The user's processes whose sandbox lets read `mark` and not `none`.
    pub fn marked(mark: &std::path::Path, none: &std::path::Path) -> Vec<libc::pid_t> {
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &std::path::Path| std::ffi::CString::new(p.as_os_str().as_bytes()).ok();
        let (Some(mark), Some(none)) = (c(mark), c(none)) else { return vec![] };
        let me = std::process::id() as libc::pid_t;
        let pids = of_uid_pids(nix::unistd::getuid().as_raw());
        pids.into_iter()
            .filter(|&p| p != me && reads(p, &mark) == Some(true) && reads(p, &none) == Some(false))
            .collect()
    }

    pub fn resident_bytes(pid: libc::pid_t) -> Option<u64> {
        // SAFETY: proc_taskinfo is plain old data; all-zero is valid.
        let mut info: libc::proc_taskinfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::proc_taskinfo>() as libc::c_int;
        // SAFETY: `info` is valid for writing `size` bytes.
        let n = unsafe { libc::proc_pidinfo(pid, libc::PROC_PIDTASKINFO, 0, (&raw mut info).cast(), size) };
        (n == size).then_some(info.pti_resident_size)
    }
}

#[cfg(not(target_os = "macos"))]
mod os {
    //! Linux, where this executor runs only under test: `/proc`.

    /// pid, parent and group of every process, from `/proc/PID/stat`.
    fn table() -> Vec<(libc::pid_t, libc::pid_t, libc::pid_t)> {
        let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
        dir.filter_map(|e| {
            let name = e.ok()?.file_name();
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", name.to_str()?)).ok()?;
            // After the command's name, in parentheses: state, ppid, pgrp.
            let rest = &stat[stat.rfind(')')? + 2..];
            let mut f = rest.split(' ').skip(1).map(|v| v.parse::<libc::pid_t>());
            Some((name.to_str()?.parse().ok()?, f.next()?.ok()?, f.next()?.ok()?))
        })
        .collect()
    }

    pub fn group(pgid: libc::pid_t) -> Vec<libc::pid_t> {
        table().into_iter().filter(|&(_, _, g)| g == pgid).map(|(p, _, _)| p).collect()
    }

    pub fn children(pid: libc::pid_t) -> Vec<libc::pid_t> {
        table().into_iter().filter(|&(_, parent, _)| parent == pid).map(|(p, _, _)| p).collect()
    }

    /// The processes of this user whose environment carries `mark` in
    /// [`super::MARKS_ENV`] (what the executor gives a stand-in's command on
    /// Linux, where no sandbox holds it: a stand-in for the kernel's answer).
    pub fn marked(mark: &std::path::Path, _none: &std::path::Path) -> Vec<libc::pid_t> {
        let me = std::process::id() as libc::pid_t;
        let wanted = mark.to_string_lossy();
        let carries = |pid: libc::pid_t| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let prefix = format!("{}=", super::MARKS_ENV);
            environ.split(|&b| b == 0).any(|var| {
                let var = String::from_utf8_lossy(var);
                var.strip_prefix(&prefix).is_some_and(|v| v.split(':').any(|m| m == wanted))
            })
        };
        of_uid_pids(nix::unistd::getuid().as_raw())
            .into_iter()
            .filter(|&pid| pid != me && carries(pid))
            .collect()
    }

    /// The processes `/proc` shows owned by `uid`.
    fn of_uid_pids(uid: libc::uid_t) -> Vec<libc::pid_t> {
        use std::os::unix::fs::MetadataExt;
        let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
        dir.flatten()
            .filter(|e| e.metadata().is_ok_and(|m| m.uid() == uid))
            .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
            .collect()
    }

    /// The threads of the processes `/proc` shows owned by `uid`: what
    /// Linux's RLIMIT_NPROC counts (macOS's counts processes).
    pub fn of_uid(uid: libc::uid_t) -> usize {
        let threads =
            |pid: libc::pid_t| std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count);
        of_uid_pids(uid).into_iter().map(threads).sum()
    }

    pub fn resident_bytes(pid: libc::pid_t) -> Option<u64> {
        let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
        let pages: u64 = statm.split(' ').nth(1)?.parse().ok()?;
        // SAFETY: sysconf takes a plain integer and returns a number.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Some(pages * page.max(0) as u64)
    }
}

pub use os::of_uid;

/// The variable carrying a run's marks to a stand-in's command (Linux, under test).
#[cfg(not(target_os = "macos"))]
pub const MARKS_ENV: &str = "PALISADE_SEATBELT_MARKS";
use os::{children, group, resident_bytes};
