//! A helper started by a system broker prepares, while it still holds the
//! broker's capabilities and is in the host's mount namespace, what needs
//! both: clones of every bind and overlay source, the granted ones idmapped
//! for the requester. It then becomes the plan's unprivileged host ids
//! (`creds::become_host_ids`) before creating any namespace.

use super::error::{Context, Result, fail};
use super::{creds, fds::Descriptors, mounts};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use palisade_protocol::{HostIds, JailPlan, Mount, Stage};
use std::os::fd::OwnedFd;

/// Returns every bind's and overlay's detached tree (by mount index), cloned
/// from the broker's descriptors: the kernel clones only mounts of the
/// caller's own namespace, and these are the host's. Owned ones (granted to
/// the request) are idmapped from `requester` to `ids`, so that the
/// requester's files are the sandbox's: the sandbox acts as the requester
/// on them, and as anybody else on the rest.
pub fn clone_sources(
    plan: &JailPlan,
    descriptors: Option<&Descriptors>,
    requester: HostIds,
    ids: HostIds,
) -> Result<Vec<Option<OwnedFd>>> {
    let descriptors = descriptors.ok_or_else(|| fail(Stage::Plan, Errno::EINVAL, "no descriptors"))?;
    if !(creds::holds(creds::CAP_SYS_ADMIN)? && creds::holds(creds::CAP_SETUID)?) {
        let why = "the plan names host ids but the helper does not hold both CAP_SYS_ADMIN and CAP_SETUID \
                   (a system broker runs it as root or as a user with them)";
        return Err(fail(Stage::HostIds, Errno::EINVAL, why));
    }
    let mut trees: Vec<Option<OwnedFd>> = plan.mounts.iter().map(|_| None).collect();
    let mut userns: Option<OwnedFd> = None;
    for (i, m) in plan.mounts.iter().enumerate() {
        let (source, writable, owned) = match m {
            Mount::Bind { source, writable, owned, .. } => (source, *writable, *owned),
            // The lower layer of an overlay is read-only; the sandbox writes to the upper.
            Mount::Overlay { source, owned, .. } => (source, false, *owned),
            _ => continue,
        };
        let tree = mounts::clone_tree(descriptors.get(source, Stage::Mounts)?, source)?;
        if owned && requester != ids {
            let ns = match &userns {
                Some(ns) => ns,
                None => userns.insert(idmap_userns(requester, ids)?),
            };
            match mounts::idmap(&tree, ns) {
                Ok(()) => {}
                // A read-only bind on a filesystem that cannot idmap stays a
                // plain bind: the sandbox gets less access, never more.
                Err(Errno::EINVAL) if !writable => {}
                Err(e) => {
                    return Err(e).at(Stage::Mounts, || {
                        format!(
                            "idmap {source} for the sandbox's uid (its filesystem may not support idmapped mounts; \
                             disk = \"overlay\" needs none for a workspace)"
                        )
                    });
                }
            }
        }
        trees[i] = Some(tree);
    }
    Ok(trees)
}

/// A user namespace mapping the requester's ids to the sandbox's host ids,
/// for idmapping. A short-lived child is created in it (`clone` with
/// `CLONE_NEWUSER`: the namespace exists when the call returns, nothing to
/// wait for); we (holding CAP_SETUID) write its maps, keep the namespace by
/// a descriptor and kill the child. It is reaped with the command's monitor's other
/// children: nothing here waits for it.
fn idmap_userns(requester: HostIds, ids: HostIds) -> Result<OwnedFd> {
    let HostIds { uid: disk_uid, gid: disk_gid } = requester;
    let parent = nix::unistd::getpid();
    // SAFETY: a fork-style clone (no new stack, no shared memory): the child
    // continues here with a copy of the process and only makes raw syscalls.
    let rc = unsafe {
        libc::syscall(libc::SYS_clone, libc::CLONE_NEWUSER | libc::SIGCHLD, 0usize, 0usize, 0usize, 0usize)
    };
    let child = match Errno::result(rc).at(Stage::Fork, || "clone the idmap namespace's process".into())? {
        0 => {
            // SAFETY: prctl, getppid and pause take no memory; the child never returns.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // The helper died before the death signal was set: nobody will kill us.
                if libc::getppid() != parent.as_raw() {
                    libc::_exit(0);
                }
                loop {
                    libc::pause();
                }
            }
        }
        pid => Pid::from_raw(pid as i32),
    };
    let result = std::fs::write(format!("/proc/{child}/uid_map"), format!("{disk_uid} {} 1\n", ids.uid))
        .and_then(|()| {
            std::fs::write(format!("/proc/{child}/gid_map"), format!("{disk_gid} {} 1\n", ids.gid))
        })
        .at(Stage::IdMap, || format!("map {disk_uid}:{disk_gid} to {}:{} for idmapping", ids.uid, ids.gid))
        .and_then(|()| {
            std::fs::File::open(format!("/proc/{child}/ns/user"))
                .map(OwnedFd::from)
                .at(Stage::Namespaces, || "open the idmap namespace".into())
        });
    kill(child, Signal::SIGKILL).at(Stage::Fork, || "stop the idmap namespace's process".into())?;
    result
}
