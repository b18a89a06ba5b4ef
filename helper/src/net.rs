//! Networking inside the new network namespace: only `lo`, and only up when
//! the plan asks for it.

use crate::error::{Context, Result};
use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
use palisade_protocol::Stage;
use std::os::fd::AsRawFd;

pub fn loopback_up() -> Result<()> {
    let sock = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)
        .at(Stage::Loopback, || "socket for interface ioctls".into())?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the flags of the named interface into `req`, which outlives the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) };
    Errno::result(rc).at(Stage::Loopback, || "read the flags of lo".into())?;
    // SAFETY: after SIOCGIFFLAGS the flags member of the union is the initialized one.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads `req`, which outlives the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) };
    Errno::result(rc).map(drop).at(Stage::Loopback, || "bring lo up".into())
}
