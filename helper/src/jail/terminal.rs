//! The run's terminal (the plan's `terminal`): a pseudo-terminal of the
//! sandbox's own devpts instance (Tier C's /dev), opened with the command's
//! ids. Its master goes to the broker, which alone reads and writes it and
//! sets its window; its other end becomes the command's stdin, stdout,
//! stderr and controlling terminal. TIOCSTI and TIOCLINUX stay refused by
//! the command's seccomp filter, whatever its stdio is.

use super::error::{self, Context, Result};
use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;
use palisade_protocol::{HelperRecord, Stage, wire::WindowSize};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `ioctl(fd, request, arg)`, where `arg` is an integer or the address of
/// a value of the type `request` reads.
fn ioctl(fd: &OwnedFd, request: libc::Ioctl, arg: usize, what: &str) -> Result<i32> {
    // SAFETY: `fd` is open (it is owned), and each caller passes an integer
    // or the address of a local of the type `request` reads, which outlives the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, arg) };
    Errno::result(rc).at(Stage::Terminal, || what.into())
}

/// Opens the terminal at `size` and sends its master to the broker; returns
/// the other end, for [`take`].
pub fn open_and_send(size: WindowSize) -> Result<OwnedFd> {
    let flags = OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let master =
        open("/dev/pts/ptmx", flags, Mode::empty()).at(Stage::Terminal, || "open /dev/pts/ptmx".into())?;
    let unlocked: libc::c_int = 0;
    ioctl(&master, libc::TIOCSPTLCK, &raw const unlocked as usize, "TIOCSPTLCK")?;
    let window = libc::winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
    ioctl(&master, libc::TIOCSWINSZ, &raw const window as usize, "TIOCSWINSZ")?;
    let peer = ioctl(&master, libc::TIOCGPTPEER, flags.bits() as usize, "TIOCGPTPEER")?;
    // SAFETY: TIOCGPTPEER returned a new descriptor, which nothing else owns.
    let peer = unsafe { OwnedFd::from_raw_fd(peer) };
    error::send_with_fds(&HelperRecord::Terminal, &[master.as_raw_fd()])
        .at(Stage::Terminal, || "send the terminal".into())?;
    Ok(peer)
}

/// Makes `peer` the controlling terminal of this session's leader (its
/// process group the foreground one), and its stdin, stdout and stderr.
pub fn take(peer: OwnedFd) -> Result<()> {
    ioctl(&peer, libc::TIOCSCTTY, 0, "TIOCSCTTY")?;
    nix::unistd::dup2_stdin(&peer).at(Stage::Terminal, || "dup2 onto stdin".into())?;
    nix::unistd::dup2_stdout(&peer).at(Stage::Terminal, || "dup2 onto stdout".into())?;
    nix::unistd::dup2_stderr(&peer).at(Stage::Terminal, || "dup2 onto stderr".into())
}
