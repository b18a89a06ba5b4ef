//! The network namespace: only `lo`, up when the plan asks for it.
//!
//! Creating a network namespace is the slowest single step of a launch (the
//! kernel registers every protocol's per-namespace state), so the outer
//! helper creates it while its child builds the mount tree, and the child
//! joins it before anything runs: `prepare` before the fork, `create` in the
//! parent, `join` in the child. Nothing of it depends on the plan, so a
//! warm sandbox has it before its plan comes.
//!
//! `join` then brings `lo` up when the plan asks and, for strict egress,
//! opens the plan's listeners there and hands them to the broker in one
//! status record. The child still holds every capability of the sandbox's
//! user namespace (ports below 1024), and it keeps none of them: they are
//! closed once handed over, before the command is forked.

use super::error::{self, Context, Result, fail};
use nix::errno::Errno;
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, bind, listen, setsockopt, socket, sockopt,
};
use nix::unistd::{getpid, pipe2, read, write};
use palisade_protocol::{HelperRecord, Listener, ListenerKind, Stage};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Connections the kernel queues on a listener before the broker accepts
/// them: a burst of a parallel package install.
const LISTEN_BACKLOG: i32 = 128;

pub struct Pending {
    /// A pidfd of the process that creates the namespace.
    creator: OwnedFd,
    ready_read: OwnedFd,
    ready_write: OwnedFd,
}

/// Before the fork: a handle on this process (the creator to be) and a pipe
/// on which it says when the namespace is ready.
pub fn prepare() -> Result<Pending> {
    // SAFETY: pidfd_open takes a pid and flags; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, getpid().as_raw(), 0) };
    Errno::result(fd).at(Stage::Namespaces, || "pidfd_open on the helper".into())?;
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    let creator = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let (ready_read, ready_write) = pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .at(Stage::Namespaces, || "pipe for the network namespace".into())?;
    Ok(Pending { creator, ready_read, ready_write })
}

impl Pending {
    /// In the parent: a new network namespace for this process, then one
    /// byte to the child.
    pub fn create(&self) -> Result<()> {
        unshare(CloneFlags::CLONE_NEWNET).at(Stage::Namespaces, || "unshare(net)".into())?;
        write(&self.ready_write, &[1]).at(Stage::Namespaces, || "signal the network namespace".into())?;
        Ok(())
    }

    /// In the child: waits for the parent's namespace and moves into it (an
    /// end of file means the parent failed, and it reports why); then `lo`
    /// up if asked, and the listeners handed to the broker.
    pub fn join(self, loopback: bool, listeners: &[Listener]) -> Result<()> {
        drop(self.ready_write);
        let mut byte = [0u8];
        let n = loop {
            match read(&self.ready_read, &mut byte) {
                Err(Errno::EINTR) => continue,
                other => break other.at(Stage::Namespaces, || "wait for the network namespace".into())?,
            }
        };
        if n != 1 {
            return Err(fail(Stage::Namespaces, Errno::ECHILD, "the network namespace was not created"));
        }
        setns(&self.creator, CloneFlags::CLONE_NEWNET).at(Stage::Namespaces, || "setns(net)".into())?;
        if loopback {
            loopback_up()?;
        }
        if listeners.is_empty() { Ok(()) } else { hand_over(listeners) }
    }
}

fn loopback_up() -> Result<()> {
    let sock = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)
        .at(Stage::Loopback, || "socket for interface ioctls".into())?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // The request's type is c_ulong with glibc and c_int with musl; both hold these numbers.
    #[allow(clippy::unnecessary_cast)]
    let (get, set) = (libc::SIOCGIFFLAGS as libc::Ioctl, libc::SIOCSIFFLAGS as libc::Ioctl);
    // SAFETY: SIOCGIFFLAGS reads the flags of the named interface into `req`, which outlives the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), get, &mut req) };
    Errno::result(rc).at(Stage::Loopback, || "read the flags of lo".into())?;
    // SAFETY: after SIOCGIFFLAGS the flags member of the union is the initialized one.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads `req`, which outlives the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), set, &req) };
    Errno::result(rc).map(drop).at(Stage::Loopback, || "bring lo up".into())
}

/// Opens every listener (close-on-exec), sends them to the broker in one
/// record, in the plan's order, and closes this process's copies.
fn hand_over(listeners: &[Listener]) -> Result<()> {
    let sockets = listeners.iter().map(open_listener).collect::<Result<Vec<OwnedFd>>>()?;
    let fds: Vec<RawFd> = sockets.iter().map(AsRawFd::as_raw_fd).collect();
    error::send_with_fds(&HelperRecord::Listeners(listeners.to_vec()), &fds)
        .at(Stage::Listeners, || format!("hand {} listeners to the broker", fds.len()))
}

fn open_listener(l: &Listener) -> Result<OwnedFd> {
    let what = || format!("{:?} listener on {}:{}", l.kind, l.address, l.port);
    let udp = l.kind == ListenerKind::DnsUdp;
    let kind = if udp { SockType::Datagram } else { SockType::Stream };
    let sock = socket(AddressFamily::Inet, kind, SockFlag::SOCK_CLOEXEC, None)
        .at(Stage::Listeners, || format!("socket for the {}", what()))?;
    let addr = SockaddrIn::from(std::net::SocketAddrV4::new(l.address, l.port));
    if !udp {
        setsockopt(&sock, sockopt::ReuseAddr, &true)
            .at(Stage::Listeners, || format!("SO_REUSEADDR on the {}", what()))?;
    }
    bind(sock.as_raw_fd(), &addr).at(Stage::Listeners, || format!("bind the {}", what()))?;
    if !udp {
        let backlog = Backlog::new(LISTEN_BACKLOG).map_err(|e| fail(Stage::Listeners, e, what()))?;
        listen(&sock, backlog).at(Stage::Listeners, || format!("listen on the {}", what()))?;
    }
    Ok(sock)
}
