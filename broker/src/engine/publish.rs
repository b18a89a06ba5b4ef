//! A session's published port, Linux's side: sockets made in the session's
//! network namespace, through which the broker connects to a port of the
//! session's own loopback. The rest (the socket on the host, the relay)
//! is the server's (`crate::serve::publish`).

use crate::engine::executor::Sandbox;
use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{
    AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, socket, socketpair,
};
use nix::sys::wait::{WaitStatus, waitpid};
use palisade_protocol::wire::{ErrorKind, ErrorReply};
use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// The most sockets one child sends: one IPv4, one IPv6.
const MOST: usize = 2;

/// Unconnected TCP sockets of the session's network namespace: IPv4, and
/// IPv6 where the namespace has it. A socket belongs to the namespace it
/// was made in, wherever it is used: the broker connects them to the
/// session's loopback. A process of many threads (as the broker is) may
/// not enter a user namespace, so a child of the broker's, of one thread,
/// enters the session's user and network namespaces, makes them, sends
/// them back and exits. Blocking: it waits for the child.
pub fn loopback_sockets(session: &Sandbox) -> Result<Vec<OwnedFd>, ErrorReply> {
    let failed = |what: &str, e: nix::Error| {
        ErrorReply::new(ErrorKind::RuntimeFailure, format!("reaching the session's network: {what}: {e}"))
    };
    let names = session.plan.namespaces.names();
    let find = |name| names.iter().position(|n| *n == name).and_then(|i| session.namespaces.get(i));
    let (Some(user), Some(net)) = (find("user"), find("net")) else {
        let why = "the session has no network namespace of its own: it uses the host's network, \
                   where its ports are the host's own to reach";
        return Err(ErrorReply::with_rule(ErrorKind::InvalidRequest, why, "session.publish"));
    };
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
        .map_err(|e| failed("socketpair", e))?;
    let mut control = Control([0; 64]);
    // The child (`in_child`) calls only async-signal-safe system calls
    // (prctl, setns, socket, sendmsg, _exit) on memory made before the fork.
    // SAFETY: it takes no lock and allocates nothing, so the broker's other
    // threads, absent in the child, hold nothing it needs.
    let forked = unsafe { nix::unistd::fork() };
    let child = match forked.map_err(|e| failed("fork", e))? {
        nix::unistd::ForkResult::Child => {
            let code = in_child(user.as_fd(), net.as_fd(), theirs.as_raw_fd(), &mut control);
            // SAFETY: ends the child at once, running nothing of the
            // parent's (no destructor, no atexit handler).
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => child,
    };
    drop(theirs);
    let received = receive(&ours);
    let status = waitpid(child, None).map_err(|e| failed("waitpid", e))?;
    match (received, status) {
        (Ok(sockets), _) if !sockets.is_empty() => Ok(sockets),
        (_, WaitStatus::Exited(_, code)) if code != 0 => {
            Err(failed("entering its namespaces", nix::Error::from_raw(code)))
        }
        (Err(e), _) => Err(failed("receiving its sockets", e)),
        (Ok(_), status) => Err(failed(&format!("the child ended {status:?}"), nix::Error::EIO)),
    }
}

/// The buffer of the descriptors' control message, made before the fork.
#[repr(C, align(8))]
pub(crate) struct Control(pub(crate) [u8; 64]);

/// The child: enters the namespaces, makes the sockets and sends them on
/// `to`. Its exit status: 0, or the errno of what failed.
fn in_child(user: BorrowedFd<'_>, net: BorrowedFd<'_>, to: RawFd, control: &mut Control) -> i32 {
    // Outside the session's pid namespace, with the capabilities of its
    // user namespace for a moment: nothing of the session may trace it.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        return e as i32;
    }
    if let Err(e) = setns(user, CloneFlags::CLONE_NEWUSER).and_then(|()| setns(net, CloneFlags::CLONE_NEWNET))
    {
        return e as i32;
    }
    let stream = |family| socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None);
    let v4 = match stream(AddressFamily::Inet) {
        Ok(fd) => fd,
        Err(e) => return e as i32,
    };
    // A namespace without IPv6 makes none: IPv4 alone.
    let v6 = stream(AddressFamily::Inet6).ok();
    let fds = [v4.as_raw_fd(), v6.as_ref().map_or(-1, AsRawFd::as_raw_fd)];
    let n = if v6.is_some() { MOST } else { 1 };
    send(to, &fds[..n], control)
}

/// `sendmsg` of `fds` with one byte, on a buffer of the parent's: the
/// child allocates nothing. 0, or the errno.
pub(crate) fn send(to: RawFd, fds: &[RawFd], control: &mut Control) -> i32 {
    let data_len = std::mem::size_of_val(fds);
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: an all-zero msghdr is a valid empty one (its padding fields,
    // on some C libraries, must be zero).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // SAFETY: CMSG_SPACE and CMSG_LEN compute sizes only.
    let (space, len) = unsafe { (libc::CMSG_SPACE(data_len as u32), libc::CMSG_LEN(data_len as u32)) };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // `control` is aligned for a cmsghdr and 64 bytes long (two
    // descriptors' header and data take 24).
    // SAFETY: so the first header and its `data_len` bytes lie inside it;
    // `msg` points to locals that outlive the sendmsg call.
    let rc = unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = len as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(header), data_len);
        libc::sendmsg(to, &msg, libc::MSG_NOSIGNAL)
    };
    if rc < 0 { nix::errno::Errno::last_raw() } else { 0 }
}

/// The sockets the child sent (none if it sent nothing).
pub(crate) fn receive(from: &OwnedFd) -> nix::Result<Vec<OwnedFd>> {
    use std::os::fd::FromRawFd;
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; MOST]);
    let flags = MsgFlags::MSG_CMSG_CLOEXEC;
    let msg = nix::sys::socket::recvmsg::<()>(from.as_raw_fd(), &mut iov, Some(&mut space), flags)?;
    let mut sockets = Vec::new();
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            // SAFETY: SCM_RIGHTS gave this process these descriptors, each
            // new and owned by nothing else.
            sockets.extend(fds.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    Ok(sockets)
}
