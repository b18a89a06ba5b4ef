//! The host the policy decides on: what it can enforce, probed once at
//! start-up (before any thread exists, since one probe forks), and what the
//! policy reads of it at each decision ([`gather`]), from the real
//! filesystem, with the credentials of the thread that decides.

use nix::sched::{CloneFlags, unshare};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, fork};
use palisade_policy::host::OwnedPath;
use palisade_policy::jail::{ETC_ENTRIES, SYSTEM_DIRS};
use palisade_policy::{CgroupRoot, Host, HostCapabilities, Layout};
use palisade_protocol::DEV_NODES;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use crate::host::files::{RealFiles, files};

/// Whether this process may create a user namespace and, owned by it, every
/// other namespace Tier C uses (mount, pid, network, ipc, uts, cgroup), tried
/// for real in a throwaway child: sysctls, AppArmor, seccomp in a container,
/// or a kernel without one of them can each forbid it.
pub fn user_namespaces() -> bool {
    UserNsProbe::start().passed()
}

/// The probe of [`user_namespaces`], started: its child builds and tears
/// down the namespaces (a millisecond) while this process goes on. Start it
/// before any thread exists: it forks.
pub struct UserNsProbe(Option<nix::unistd::Pid>);

impl UserNsProbe {
    pub fn start() -> UserNsProbe {
        // SAFETY: called before the runtime starts threads; the child only makes
        // async-signal-safe calls and exits.
        match unsafe { fork() } {
            Ok(ForkResult::Child) => {
                let all = CloneFlags::CLONE_NEWUSER
                    | CloneFlags::CLONE_NEWNS
                    | CloneFlags::CLONE_NEWPID
                    | CloneFlags::CLONE_NEWNET
                    | CloneFlags::CLONE_NEWIPC
                    | CloneFlags::CLONE_NEWUTS
                    | CloneFlags::CLONE_NEWCGROUP;
                let ok = unshare(all).is_ok();
                // SAFETY: _exit is async-signal-safe and ends the child at once.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) }
            }
            Ok(ForkResult::Parent { child }) => UserNsProbe(Some(child)),
            Err(_) => UserNsProbe(None),
        }
    }

    /// Whether the child made them all (waits for it).
    pub fn passed(self) -> bool {
        self.0.is_some_and(|child| matches!(waitpid(child, None), Ok(WaitStatus::Exited(_, 0))))
    }
}

/// The kernel's Landlock ABI version, 0 without Landlock.
pub fn landlock_abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute and size 0 this only queries the ABI version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v > 0 { v as u32 } else { 0 }
}

/// What the host can enforce; `user_namespaces` as [`UserNsProbe`] found
/// (and the configuration allows), `cgroup` as the broker's cgroups were
/// found (or why there are none).
pub fn probe(cgroup: Result<CgroupRoot, String>, user_namespaces: bool) -> HostCapabilities {
    HostCapabilities { user_namespaces, landlock_abi: landlock_abi(), seatbelt: false, cgroup }
}

/// The host a decision is made on, now: `capabilities` as probed, the homes
/// of /etc/passwd and the layout of `/` (each looked up again only when it
/// changed), and the real filesystem. Read with the calling thread's
/// credentials: the broker gathers it on the thread acting as the requester.
/// Only what the decision uses is looked up: the /etc entries when no
/// snapshot of /etc stands for them (`etc_entries`), the devices where Tier
/// B runs (user namespaces unavailable).
pub fn gather(capabilities: &HostCapabilities, etc_entries: bool, owned: Arc<[OwnedPath]>) -> Host {
    let layout = layout(etc_entries, !capabilities.user_namespaces);
    Host { capabilities: capabilities.clone(), homes: passwd_homes(), layout, files: files(), owned }
}

/// The host's [`Layout`]. Its system directories are looked up again only
/// when `/` changes (an entry made, removed or replaced there changes its
/// times): a launch does not resolve the same seven paths every time. The
/// /etc entries and devices present, when asked for, are looked up each time.
pub fn layout(etc_entries: bool, devices: bool) -> Layout {
    type Key = (u64, u64, i64, i64, i64, i64);
    static CACHE: Mutex<Option<(Key, Layout)>> = Mutex::new(None);
    let key = std::fs::symlink_metadata("/")
        .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()))
        .unwrap_or_default();
    let present = |wanted: bool, paths: &mut dyn Iterator<Item = String>| -> Vec<String> {
        if wanted { paths.filter(|p| Path::new(p).exists()).collect() } else { vec![] }
    };
    let etc = present(etc_entries, &mut ETC_ENTRIES.iter().map(|p| p.to_string()));
    let devices = present(devices, &mut DEV_NODES.iter().map(|n| format!("/dev/{n}")));
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((k, layout)) = cache.as_ref() {
        if *k == key {
            return Layout { etc, devices, ..layout.clone() };
        }
    }
    let mut layout = Layout::default();
    for dir in SYSTEM_DIRS {
        match std::fs::symlink_metadata(dir) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(link) = std::fs::read_link(dir) {
                    layout.links.push((dir.to_string(), link.to_string_lossy().into_owned()));
                }
            }
            Ok(m) if m.is_dir() => layout.real.push(dir.to_string()),
            _ => {}
        }
        layout.canonical.extend(Path::new(dir).canonicalize().ok());
    }
    *cache = Some((key, layout.clone()));
    Layout { etc, devices, ..layout }
}

/// The home directories of the users in /etc/passwd that exist, canonical.
/// Kept between decisions while /etc/passwd is the same file, unchanged
/// (resolving every home costs more than the rest of a decision).
fn passwd_homes() -> Vec<PathBuf> {
    // name:password:uid:gid:gecos:home:shell
    const HOME_FIELD: usize = 5;
    type Key = (u64, u64, i64, i64, u64);
    static CACHE: Mutex<Option<(Key, Vec<PathBuf>)>> = Mutex::new(None);
    let key = std::fs::metadata("/etc/passwd")
        .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.size()))
        .unwrap_or_default();
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((k, homes)) = cache.as_ref() {
        if *k == key {
            return homes.clone();
        }
    }
    let text = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let mut homes: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(':').nth(HOME_FIELD))
        .filter(|h| h.starts_with('/') && *h != "/")
        .filter_map(|h| Path::new(h).canonicalize().ok())
        .filter(|h| h != Path::new("/"))
        .collect();
    homes.sort();
    homes.dedup();
    *cache = Some((key, homes.clone()));
    homes
}

pub use crate::host::accounts::Accounts;
