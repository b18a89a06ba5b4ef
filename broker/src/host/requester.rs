//! Acting for the requester.
//!
//! A broker never does for a requester what the requester could not do
//! itself. Every path a request names is opened as the requesting uid (its
//! filesystem uid and gid and its groups, on a thread of its own), once, at
//! decision time, with no symlink allowed on the way; the broker keeps the
//! descriptors and the helper builds the sandbox from them, never from the
//! names. What a run wrote is copied back as the requester too, relative to
//! the same descriptors. A broker that does not serve other users
//! ([`crate::host::privilege`]) can act only as itself: it serves its own uid and
//! root (see `Server::allowed`).

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use palisade_protocol::JailPlan;
use palisade_protocol::wire::{ErrorKind, ErrorReply};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

/// `SO_PEERGROUPS`: the peer's supplementary groups at connect time (Linux
/// 4.13). Its number on the architectures palisade builds for.
#[cfg(not(any(target_arch = "mips", target_arch = "mips64", target_arch = "sparc64")))]
const SO_PEERGROUPS: libc::c_int = 59;

/// Who a run is for: a peer's ids and supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requester {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Requester {
    /// The peer of a connected Unix socket, whose ids `SO_PEERCRED` gave.
    pub fn of_peer(socket: &impl AsRawFd, uid: u32, gid: u32) -> io::Result<Requester> {
        let mut groups: Vec<libc::gid_t> = vec![0; 64];
        loop {
            let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
            // SAFETY: `groups` is valid for `len` bytes, which the kernel
            // updates to what it wrote (or, with ERANGE, to what it needs).
            let rc = unsafe {
                libc::getsockopt(
                    socket.as_raw_fd(),
                    libc::SOL_SOCKET,
                    SO_PEERGROUPS,
                    groups.as_mut_ptr().cast(),
                    &mut len,
                )
            };
            let needed = len as usize / std::mem::size_of::<libc::gid_t>();
            match Errno::result(rc) {
                Ok(_) => {
                    groups.truncate(needed);
                    return Ok(Requester { uid, gid, groups });
                }
                Err(Errno::ERANGE) if needed > groups.len() => groups.resize(needed, 0),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// This process's own credentials (the CLI's embedded broker).
    pub fn me() -> Requester {
        let groups = nix::unistd::getgroups().unwrap_or_default();
        Requester {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
            groups: groups.into_iter().map(|g| g.as_raw()).collect(),
        }
    }

    /// Acting for this requester means changing credentials: a broker that
    /// serves other users ([`crate::host::privilege`]), acting for anyone but
    /// itself (a root broker for root acts as itself).
    fn switches(&self) -> bool {
        crate::host::privilege::serves_others() && self.uid != nix::unistd::geteuid().as_raw()
    }

    /// Runs `f` with this requester's filesystem credentials: on a thread of
    /// its own whose fsuid, fsgid and groups are the requester's (the thread
    /// ends with `f`), when the broker is root and the requester is not.
    /// Otherwise on this thread, as the broker, which then is the requester
    /// or can do no more than it.
    pub fn act<T: Send>(&self, f: impl FnOnce(&Acting) -> T + Send) -> io::Result<T> {
        if !self.switches() {
            return Ok(f(&Acting { switched: None }));
        }
        std::thread::scope(|scope| {
            let thread = std::thread::Builder::new().name("palisade-acting".into());
            let handle = thread.spawn_scoped(scope, || {
                switch_thread(self.uid, self.gid, &self.groups)?;
                Ok(f(&Acting { switched: Some((self.uid, self.gid)) }))
            })?;
            handle.join().map_err(|_| io::Error::other("the thread acting for the requester panicked"))?
        })
    }
}

pub use crate::host::peer::Peer;

impl Peer {
    pub fn requester(&self) -> Requester {
        Requester { uid: self.uid, gid: self.gid, groups: self.groups.clone() }
    }
}

/// The credentials a thread acts with, inside [`Requester::act`].
pub struct Acting {
    switched: Option<(u32, u32)>,
}

impl Acting {
    /// Whether this is the broker acting as itself (it is the requester, or
    /// can do no more than it): what it makes is its own either way.
    pub fn is_broker(&self) -> bool {
        self.switched.is_none()
    }

    /// Runs `f` with the broker's own filesystem credentials, then acts for
    /// the requester again: for what the broker itself must read (a run's
    /// overlay layer, written by the sandbox's uid).
    pub fn as_broker<T>(&self, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let Some((uid, gid)) = self.switched else { return f() };
        let me = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        set_fs_ids(me.0, me.1, true)?;
        let result = f();
        set_fs_ids(uid, gid, uid == 0)?;
        result
    }
}

/// Sets the calling thread's filesystem ids, checked (the system calls
/// return the previous id, not an error), and its filesystem capabilities
/// (DAC override, chown, ...): effective when `fs_caps` (the broker as
/// itself, or acting as root), else none, so that permission checks are the
/// requester's. The kernel does the same when the filesystem uid leaves or
/// becomes 0, which is all a root broker needs; a broker running as a
/// dedicated user with ambient capabilities changes from one uid that is
/// not 0 to another, and the kernel leaves its capabilities as they were.
fn set_fs_ids(uid: u32, gid: u32, fs_caps: bool) -> io::Result<()> {
    // SAFETY: setfsgid and setfsuid take an id and change only this thread's
    // credentials; with -1 (an invalid id) they change nothing and return the
    // current one.
    let now = unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsuid, uid);
        (libc::syscall(libc::SYS_setfsuid, -1i32) as u32, libc::syscall(libc::SYS_setfsgid, -1i32) as u32)
    };
    if now != (uid, gid) {
        return Err(io::Error::other(format!(
            "cannot act as {uid}:{gid} (the thread is {}:{})",
            now.0, now.1
        )));
    }
    set_fs_caps(fs_caps)
}

/// Raises (as far as the permitted set allows) or drops every filesystem
/// capability in the calling thread's effective set, checked.
fn set_fs_caps(raise: bool) -> io::Result<()> {
    use caps::{CapSet, Capability::*};
    let fs = [
        CAP_CHOWN,
        CAP_DAC_OVERRIDE,
        CAP_DAC_READ_SEARCH,
        CAP_FOWNER,
        CAP_FSETID,
        CAP_LINUX_IMMUTABLE,
        CAP_MAC_OVERRIDE,
        CAP_MKNOD,
    ];
    let failed =
        |e: caps::errors::CapsError| io::Error::other(format!("cannot set the thread's capabilities: {e}"));
    let permitted = caps::read(None, CapSet::Permitted).map_err(failed)?;
    let mut effective = caps::read(None, CapSet::Effective).map_err(failed)?;
    for cap in fs {
        match raise && permitted.contains(&cap) {
            true => effective.insert(cap),
            false => effective.remove(&cap),
        };
    }
    caps::set(None, CapSet::Effective, &effective).map_err(failed)?;
    let now = caps::read(None, CapSet::Effective).map_err(failed)?;
    if now != effective {
        return Err(io::Error::other(format!("the thread's capabilities are {now:?}, not {effective:?}")));
    }
    Ok(())
}

/// Gives the calling thread (and only it: the raw system calls, not libc's,
/// which change every thread of the process) the requester's groups and
/// filesystem ids, and none of the broker's filesystem capabilities (but for
/// root), so permission checks are the requester's.
fn switch_thread(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    let groups: Vec<rustix::process::Gid> =
        groups.iter().map(|g| rustix::process::Gid::from_raw(*g)).collect();
    rustix::thread::set_thread_groups(&groups)?;
    set_fs_ids(uid, gid, uid == 0)
}

fn refusal(rule: &str, message: String) -> ErrorReply {
    ErrorReply::with_rule(ErrorKind::WorkspaceScopeDenied, message, rule)
}

/// The refusal of a path the requester may not reach (the same words
/// whether or not it exists: nothing to learn about what it cannot see).
pub fn not_allowed(path: &str, uid: u32) -> ErrorReply {
    refusal("scope.not_allowed", format!("{path}: not allowed (uid {uid} cannot reach it)"))
}

/// Opens the plan's host paths, in the plan's order, as the thread's
/// credentials allow (call inside [`Requester::act`]): `O_PATH`, no magic
/// link on the way, and no symlink at all for a path the request named
/// (canonical when the policy checked it: one there now was swapped in).
/// `broker_made`: the run's own directories, which the broker made for the
/// sandbox's uid and opens as itself.
pub fn open_paths(
    plan: &JailPlan,
    broker_made: &[std::path::PathBuf],
    act: &Acting,
    uid: u32,
) -> Result<Vec<OwnedFd>, ErrorReply> {
    let mut out = Vec::with_capacity(plan.descriptors.len());
    for d in &plan.descriptors {
        let mut resolve = ResolveFlag::RESOLVE_NO_MAGICLINKS;
        if !d.host_layout {
            resolve |= ResolveFlag::RESOLVE_NO_SYMLINKS;
        }
        let how = OpenHow::new().flags(OFlag::O_PATH | OFlag::O_CLOEXEC).resolve(resolve);
        let open = || openat2(nix::fcntl::AT_FDCWD, d.path.as_str(), how).map_err(io::Error::from);
        let opened =
            if broker_made.iter().any(|p| Path::new(&d.path) == p) { act.as_broker(open) } else { open() };
        out.push(opened.map_err(|e| match e.raw_os_error().map(Errno::from_raw) {
            Some(Errno::EACCES | Errno::EPERM) => not_allowed(&d.path, uid),
            Some(Errno::ELOOP | Errno::ENOENT | Errno::ENOTDIR | Errno::EXDEV) => refusal(
                "scope.changed",
                format!("{} changed since it was checked ({e}): refused, not followed", d.path),
            ),
            _ => ErrorReply::new(ErrorKind::RuntimeFailure, format!("cannot open {}: {e}", d.path)),
        })?);
    }
    Ok(out)
}

/// Whether the thread's credentials (see [`Requester::act`]) may read, or
/// write, what `fd` is (and search it, if it is a directory).
pub fn may(fd: &OwnedFd, write: bool) -> io::Result<bool> {
    let dir = nix::sys::stat::fstat(fd)?.st_mode & libc::S_IFMT == libc::S_IFDIR;
    let mut mode = libc::R_OK;
    if dir {
        mode |= libc::X_OK;
    }
    if write {
        mode |= libc::W_OK;
    }
    // AT_EACCESS: the thread's filesystem ids, not the process's real ones.
    let flags = libc::AT_EACCESS | libc::AT_EMPTY_PATH;
    // SAFETY: faccessat2 on an open descriptor with an empty, NUL-terminated path.
    let rc =
        unsafe { libc::syscall(libc::SYS_faccessat2, fd.as_fd().as_raw_fd(), c"".as_ptr(), mode, flags) };
    match Errno::result(rc) {
        Ok(_) => Ok(true),
        Err(Errno::EACCES | Errno::EPERM | Errno::EROFS) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
