//! The user namespace and the other namespaces it owns.

use super::error::{Context, HelperError, Result};
use nix::errno::Errno;
use nix::sched::{CloneFlags, unshare};
use nix::unistd::{getgid, getuid};
use palisade_protocol::{Namespaces, Stage};

fn flags(ns: &Namespaces) -> CloneFlags {
    let mut flags = CloneFlags::empty();
    for (on, flag) in [
        (ns.user, CloneFlags::CLONE_NEWUSER),
        (ns.mount, CloneFlags::CLONE_NEWNS),
        (ns.pid, CloneFlags::CLONE_NEWPID),
        (ns.net, CloneFlags::CLONE_NEWNET),
        (ns.ipc, CloneFlags::CLONE_NEWIPC),
        (ns.uts, CloneFlags::CLONE_NEWUTS),
        (ns.cgroup, CloneFlags::CLONE_NEWCGROUP),
    ] {
        if on {
            flags |= flag;
        }
    }
    flags
}

fn hint(mut e: HelperError) -> HelperError {
    if matches!(e.errno, Errno::EPERM | Errno::EACCES | Errno::ENOSPC) {
        e.message.push_str(
            " (unprivileged user namespaces may be disabled: kernel.unprivileged_userns_clone, \
             user.max_user_namespaces, or an AppArmor userns restriction without palisade's profile)",
        );
    }
    e
}

/// Creates the namespaces at once (all but the network one, which
/// [`super::net`] makes alongside), owned by a new user namespace, and maps
/// the sandbox's uid and gid onto the caller's: one id each, nothing else exists.
pub fn enter(ns: &Namespaces, uid: u32, gid: u32) -> Result<()> {
    let (outer_uid, outer_gid) = (getuid(), getgid());
    unshare(flags(ns) - CloneFlags::CLONE_NEWNET)
        .at(Stage::Namespaces, || format!("unshare({})", ns.names().join(", ")))
        .map_err(hint)?;
    // An unprivileged process may write its gid map only once setgroups is denied.
    write_proc("/proc/self/setgroups", "deny")?;
    write_proc("/proc/self/uid_map", &format!("{uid} {outer_uid} 1\n"))?;
    write_proc("/proc/self/gid_map", &format!("{gid} {outer_gid} 1\n"))
}

fn write_proc(path: &str, contents: &str) -> Result<()> {
    std::fs::write(path, contents).at(Stage::IdMap, || format!("write {:?} to {path}", contents.trim_end()))
}
