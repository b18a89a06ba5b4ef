//! A helper started by root never leaves a sandboxed process as host root:
//! it prepares what needs root (idmapped binds of the granted paths), then
//! becomes the plan's unprivileged host ids before creating any namespace.

use crate::error::{Context, Result, fail};
use crate::{lifeline, mounts};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sched::{CloneFlags, unshare};
use nix::sys::signal::{Signal, kill};
use nix::sys::stat::stat;
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Gid, Uid, fork, getuid, read, setgroups, setresgid, setresuid, write};
use palisade_protocol::{HostIds, JailPlan, Mount, Stage};
use std::os::fd::OwnedFd;

/// Returns the owned binds' detached, idmapped trees (by mount index).
pub fn become_unprivileged(plan: &JailPlan, ids: HostIds) -> Result<Vec<Option<OwnedFd>>> {
    if !getuid().is_root() {
        return Err(fail(
            Stage::Ids,
            Errno::EINVAL,
            "the plan names host ids but the helper is not running as root",
        ));
    }
    let mut trees: Vec<Option<OwnedFd>> = plan.mounts.iter().map(|_| None).collect();
    // One idmapping namespace per on-disk owner: that owner's files become the sandbox's.
    let mut namespaces: Vec<((u32, u32), OwnedFd)> = Vec::new();
    for (i, m) in plan.mounts.iter().enumerate() {
        let (source, writable) = match m {
            Mount::Bind { source, owned: true, writable, .. } => (source, *writable),
            // The lower layer of an overlay is read-only; the sandbox writes to the upper.
            Mount::Overlay { source, owned: true, .. } => (source, false),
            _ => continue,
        };
        // Captured now, while root: the sandbox's uid may not even reach it.
        let tree = mounts::open_tree(source, true)?;
        let st = stat(source.as_str()).at(Stage::Mounts, || format!("stat {source}"))?;
        let owner = (st.st_uid, st.st_gid);
        if owner != (ids.uid, ids.gid) {
            let userns = match namespaces.iter().position(|(o, _)| *o == owner) {
                Some(k) => &namespaces[k].1,
                None => {
                    namespaces.push((owner, idmap_userns(owner.0, owner.1, ids)?));
                    &namespaces[namespaces.len() - 1].1
                }
            };
            match mounts::idmap(&tree, userns) {
                Ok(()) => {}
                // A read-only bind on a filesystem that cannot idmap stays a
                // plain bind: the sandbox gets less access, never more.
                Err(Errno::EINVAL) if !writable => {}
                Err(e) => {
                    return Err(e).at(Stage::Mounts, || {
                        format!("idmap {source} for the sandbox's uid (its filesystem may not support idmapped mounts)")
                    });
                }
            }
        }
        trees[i] = Some(tree);
    }
    setgroups(&[]).at(Stage::Ids, || "drop supplementary groups".into())?;
    setresgid(Gid::from_raw(ids.gid), Gid::from_raw(ids.gid), Gid::from_raw(ids.gid))
        .at(Stage::Ids, || format!("setresgid {}", ids.gid))?;
    setresuid(Uid::from_raw(ids.uid), Uid::from_raw(ids.uid), Uid::from_raw(ids.uid))
        .at(Stage::Ids, || format!("setresuid {}", ids.uid))?;
    // Leaving root made us non-dumpable, which leaves /proc/self owned by root
    // and our own uid and gid maps unwritable to us.
    nix::sys::prctl::set_dumpable(true).at(Stage::Ids, || "PR_SET_DUMPABLE".into())?;
    // The kernel clears the death signal when credentials change.
    lifeline::arm_against_caller(plan.parent_pid, Signal::SIGKILL)?;
    Ok(trees)
}

/// A user namespace mapping the on-disk owner to the sandbox's host ids, for
/// idmapping: made by a short-lived child whose maps we (root) write.
fn idmap_userns(disk_uid: u32, disk_gid: u32, ids: HostIds) -> Result<OwnedFd> {
    let (ready_r, ready_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).at(Stage::Ids, || "pipe".into())?;
    // SAFETY: the helper is single-threaded; the child only makes syscalls and never returns.
    let child = match unsafe { fork() }.at(Stage::Fork, || "fork for the idmap namespace".into())? {
        ForkResult::Child => {
            let ok = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).is_ok()
                && unshare(CloneFlags::CLONE_NEWUSER).is_ok();
            let _ = write(&ready_w, &[u8::from(ok)]);
            loop {
                nix::unistd::pause();
            }
        }
        ForkResult::Parent { child } => child,
    };
    drop(ready_w);
    let mut byte = [0u8];
    let ready = read(&ready_r, &mut byte);
    let result = if ready != Ok(1) || byte[0] != 1 {
        Err(fail(Stage::Namespaces, Errno::EPERM, "cannot create the user namespace for idmapped mounts"))
    } else {
        std::fs::write(format!("/proc/{child}/uid_map"), format!("{disk_uid} {} 1\n", ids.uid))
            .and_then(|()| {
                std::fs::write(format!("/proc/{child}/gid_map"), format!("{disk_gid} {} 1\n", ids.gid))
            })
            .at(Stage::IdMap, || {
                format!("map {disk_uid}:{disk_gid} to {}:{} for idmapping", ids.uid, ids.gid)
            })
            .and_then(|()| {
                std::fs::File::open(format!("/proc/{child}/ns/user"))
                    .map(OwnedFd::from)
                    .at(Stage::Namespaces, || "open the idmap namespace".into())
            })
    };
    kill(child, Signal::SIGKILL).at(Stage::Fork, || "stop the idmap child".into())?;
    waitpid(child, None).at(Stage::Fork, || "reap the idmap child".into())?;
    result
}
