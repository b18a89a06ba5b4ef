//! What this host can enforce, probed once at start-up (before any thread
//! exists, since one probe forks).

use crate::cgroup::Cgroups;
use nix::sched::{CloneFlags, unshare};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, fork};
use palisade_policy::{CgroupRoot, HostCapabilities};

/// Whether this process may create a user namespace and, owned by it, every
/// other namespace Tier C uses (mount, pid, network, ipc, uts, cgroup), tried
/// for real in a throwaway child: sysctls, AppArmor, seccomp in a container,
/// or a kernel without one of them can each forbid it.
pub fn user_namespaces() -> bool {
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
        Ok(ForkResult::Parent { child }) => matches!(waitpid(child, None), Ok(WaitStatus::Exited(_, 0))),
        Err(_) => false,
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

pub fn probe(cgroups: &Cgroups) -> HostCapabilities {
    HostCapabilities {
        user_namespaces: user_namespaces(),
        landlock_abi: landlock_abi(),
        cgroup: match cgroups.available() {
            Ok(()) => Ok(CgroupRoot { path: cgroups.path_of("").unwrap_or_default(), v1: cgroups.is_v1() }),
            Err(why) => Err(why.to_string()),
        },
    }
}
