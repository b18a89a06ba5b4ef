//! A system broker's part of a sandbox's root: detached clones of every
//! bind and overlay source, the granted ones idmapped for the requester
//! ([`JailPlan::captured`]). Only the broker can make them: the kernel
//! clones mounts of the caller's own mount namespace, idmapping a host
//! filesystem needs the host's `CAP_SYS_ADMIN`, and the helper becomes the
//! sandbox's unprivileged host ids before it has a namespace (ahead of the
//! plan, in a warm slot). It attaches what it is given, and clones nothing
//! of the host's itself.

use nix::errno::Errno;
use palisade_protocol::{HostIds, JailPlan, Mount};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

/// What goes with a plan on the helper's fd 3: the descriptors of its host
/// paths, or a system broker's trees of its mounts
/// ([`JailPlan::sends_trees`]).
pub enum Sent<'a> {
    Paths(&'a [OwnedFd]),
    Trees(Vec<OwnedFd>),
}

impl Sent<'_> {
    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        match self {
            Sent::Paths(fds) => fds.iter().map(AsFd::as_fd).collect(),
            Sent::Trees(fds) => fds.iter().map(AsFd::as_fd).collect(),
        }
    }

    /// Owned copies, for a plan written from another thread.
    pub fn owned(self) -> io::Result<Vec<OwnedFd>> {
        match self {
            Sent::Paths(fds) => fds.iter().map(OwnedFd::try_clone).collect(),
            Sent::Trees(fds) => Ok(fds),
        }
    }
}

/// What to send with `plan`, whose host paths' descriptors are
/// `descriptors` (in the plan's order): those, or the trees cloned from
/// them ([`trees`]).
pub fn sent<'a>(plan: &JailPlan, descriptors: &'a [OwnedFd]) -> io::Result<Sent<'a>> {
    match plan.sends_trees() {
        true => trees(plan, descriptors).map(Sent::Trees),
        false => Ok(Sent::Paths(descriptors)),
    }
}

/// The trees of the plan's captured mounts, in order, cloned from
/// `descriptors` (the plan's host paths, in the plan's order). Owned ones
/// (granted to the request) are idmapped from the requester to the sandbox's
/// host ids: the requester's files are the sandbox's, and the sandbox acts
/// as anybody else on the rest. Nothing for a plan without host ids.
fn trees(plan: &JailPlan, descriptors: &[OwnedFd]) -> io::Result<Vec<OwnedFd>> {
    let (Some(ids), Some(requester)) = (plan.host_ids, plan.acting_for) else { return Ok(vec![]) };
    let mut trees = Vec::new();
    for i in plan.captured() {
        let (source, writable, owned, layer) = match &plan.mounts[i] {
            Mount::Bind { source, writable, owned, .. } => (source, *writable, *owned, None),
            // The lower layer of an overlay is read-only; the sandbox writes to the upper.
            Mount::Overlay { source, owned, layer, .. } => (source, false, *owned, layer.as_ref()),
            _ => continue,
        };
        let fd = plan.descriptor(source).and_then(|d| descriptors.get(d));
        let fd = fd.ok_or_else(|| io::Error::other(format!("no descriptor for {source}")))?;
        let tree = clone_tree(fd).map_err(|e| {
            let why = if e == Errno::EPERM {
                " (a system broker clones the sandbox's mounts with CAP_SYS_ADMIN)"
            } else {
                ""
            };
            io::Error::other(format!("clone {source} for the sandbox: {e}{why}"))
        })?;
        if owned && requester != ids {
            match idmap_userns(requester, ids).and_then(|ns| idmap(&tree, &ns)) {
                Ok(()) => {}
                // A read-only bind on a filesystem that cannot idmap stays a
                // plain bind: the sandbox gets less access, never more.
                Err(Errno::EINVAL) if !writable => {}
                Err(e) => {
                    return Err(io::Error::other(format!(
                        "idmap {source} for the sandbox's uid: {e} (its filesystem may not support idmapped \
                         mounts; disk = \"overlay\" needs none for a workspace)"
                    )));
                }
            }
        }
        trees.push(tree);
        // An overlay's layer on disk, after its lower layer: the requester's
        // own, idmapped as a granted directory is, so that what the sandbox
        // writes there is the requester's.
        if let Some(layer) = layer {
            let fd = plan.descriptor(layer).and_then(|d| descriptors.get(d));
            let fd = fd.ok_or_else(|| io::Error::other(format!("no descriptor for {layer}")))?;
            let tree = clone_tree(fd).map_err(|e| io::Error::other(format!("clone {layer}: {e}")))?;
            if requester != ids {
                idmap_userns(requester, ids)
                    .and_then(|ns| idmap(&tree, &ns))
                    .map_err(|e| io::Error::other(format!("idmap {layer} for the sandbox's uid: {e}")))?;
            }
            trees.push(tree);
        }
    }
    Ok(trees)
}

/// A detached copy of the mount tree at `fd` and below it.
fn clone_tree(fd: &OwnedFd) -> nix::Result<OwnedFd> {
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | libc::AT_RECURSIVE as u32
        | libc::AT_EMPTY_PATH as u32;
    // SAFETY: `fd` is open and the empty path is a valid NUL-terminated string.
    let tree = unsafe { libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), c"".as_ptr(), flags) };
    let tree = Errno::result(tree)?;
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(tree as i32) })
}

/// Idmaps a detached tree, and all below it, with the mapping of `userns`.
fn idmap(tree: &OwnedFd, userns: &OwnedFd) -> nix::Result<()> {
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let flags = libc::AT_EMPTY_PATH | libc::AT_RECURSIVE;
    // SAFETY: the path and `attr` are valid for the call, and `attr`'s size is passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    Errno::result(rc).map(drop)
}

/// The user namespaces mapping a requester's ids to its sandbox's, by both:
/// the same for every run of that requester, made once.
static NAMESPACES: Mutex<Vec<((HostIds, HostIds), OwnedFd)>> = Mutex::new(Vec::new());
/// Namespaces kept at most; the oldest is dropped for a new one.
const NAMESPACES_KEPT: usize = 64;

/// A user namespace mapping `requester` to `ids`, for idmapping: kept, or
/// made by a child created in it (`clone` with `CLONE_NEWUSER`), which
/// sends its own namespace back: a broker without CAP_SYS_PTRACE (the
/// unit's) may not open another process's, not even its own child's, when
/// it is not dumpable (as the unit's is not). The child makes itself
/// dumpable first, so that its `/proc` files are its uid's (the broker's)
/// and not root's; it lives for these few calls. The broker, holding
/// CAP_SETUID and CAP_SETGID, writes the maps; the namespace is kept by a
/// descriptor, the child killed and reaped.
fn idmap_userns(requester: HostIds, ids: HostIds) -> nix::Result<OwnedFd> {
    use crate::engine::publish::{Control, receive, send};
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    let mut kept = NAMESPACES.lock().map_err(|_| Errno::EDEADLK)?;
    if let Some((_, ns)) = kept.iter().find(|(key, _)| *key == (requester, ids)) {
        return ns.try_clone().map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)));
    }
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)?;
    let mut control = Control([0; 64]);
    let parent = nix::unistd::getpid();
    // The child of this many-threaded process makes only async-signal-safe
    // raw system calls (prctl, getppid, close_range, open, sendmsg, pause,
    // _exit) on memory made before the clone; it takes no lock and allocates nothing.
    // SAFETY: a fork-style clone (no new stack, no shared memory), whose child does only that.
    let rc = unsafe {
        libc::syscall(libc::SYS_clone, libc::CLONE_NEWUSER | libc::SIGCHLD, 0usize, 0usize, 0usize, 0usize)
    };
    if Errno::result(rc)? == 0 {
        // SAFETY: as above; the child never returns.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // Nothing of the broker's but its end of the socket stays open in a dumpable process.
            let end = theirs.as_raw_fd() as libc::c_uint;
            if libc::getppid() != parent.as_raw()
                || libc::syscall(libc::SYS_close_range, 0, end - 1, 0) != 0
                || libc::syscall(libc::SYS_close_range, end + 1, libc::c_uint::MAX, 0) != 0
                || libc::prctl(libc::PR_SET_DUMPABLE, 1) != 0
            {
                libc::_exit(0);
            }
            let ns = libc::open(c"/proc/self/ns/user".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if ns < 0 || send(theirs.as_raw_fd(), &[ns], &mut control) != 0 {
                libc::_exit(1);
            }
            loop {
                libc::pause();
            }
        }
    }
    let child = nix::unistd::Pid::from_raw(rc as i32);
    drop(theirs);
    let maps = |file: &str, inside: u32, outside: u32| {
        std::fs::write(format!("/proc/{child}/{file}"), format!("{inside} {outside} 1\n"))
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
    };
    // Received first: the child is in its namespace, and stays there until killed.
    let made = receive(&ours).and_then(|fds| fds.into_iter().next().ok_or(Errno::ECHILD)).and_then(|ns| {
        Ok((maps("uid_map", requester.uid, ids.uid)?, maps("gid_map", requester.gid, ids.gid)?, ns))
    });
    let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(child, None);
    let ((), (), ns) = made?;
    if kept.len() == NAMESPACES_KEPT {
        kept.remove(0);
    }
    kept.push(((requester, ids), ns.try_clone().map_err(|_| Errno::EMFILE)?));
    Ok(ns)
}
