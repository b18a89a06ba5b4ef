//! The sandbox dies with whoever started it.
//!
//! Every process of the chain (helper, pid 1, command) asks the kernel for a
//! signal when its parent dies, then checks that the parent did not die
//! before the request was in place. The kernel forgets the request on fork
//! and on credential changes, so it is re-armed after each.
//!
//! The signal is SIGKILL, except for Tier B's helper: with no pid namespace
//! to take the sandbox down with it, it asks for SIGTERM, which its reaper
//! loop waits for, and kills every process the command left before it exits.

use super::error::{Context, Result, fail};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::{prctl, signal::Signal};
use nix::unistd::getppid;
use palisade_protocol::Stage;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

fn request_death_signal(signal: Signal) -> Result<()> {
    prctl::set_pdeathsig(signal).at(Stage::Lifeline, || format!("PR_SET_PDEATHSIG({signal})"))
}

/// Arms the death signal against the caller, whose pid the plan names.
pub fn arm_against_caller(expected_parent: u32, signal: Signal) -> Result<()> {
    request_death_signal(signal)?;
    let parent = getppid().as_raw();
    if u32::try_from(parent).ok() != Some(expected_parent) {
        let why = format!("parent is pid {parent}, the plan expects {expected_parent}: the caller is gone");
        return Err(fail(Stage::Lifeline, Errno::ESRCH, why));
    }
    Ok(())
}

/// A pipe between a parent and the child it forks: the parent holds the
/// write end, so the child sees a hang-up exactly when the parent is gone.
/// It works across pid namespaces, where getppid() says 0. The parent writes
/// on it once at most, to [`release`] the child.
pub struct Tether {
    pub parent_end: OwnedFd,
    pub child_end: OwnedFd,
}

pub fn tether() -> Result<Tether> {
    let (child_end, parent_end) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).at(Stage::Lifeline, || "pipe for the lifeline".into())?;
    Ok(Tether { parent_end, child_end })
}

/// Arms (or re-arms) the death signal in a forked child, then checks the
/// tether: hung up once the parent is gone (a byte waiting on it is the
/// parent's [`release`], not its death).
pub fn arm_in_child(child_end: &OwnedFd) -> Result<()> {
    request_death_signal(Signal::SIGKILL)?;
    let mut fds = [PollFd::new(child_end.as_fd(), PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).at(Stage::Lifeline, || "poll the lifeline".into())?;
    if fds[0].revents().is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)) {
        let why = "the parent exited before the death signal was armed";
        return Err(fail(Stage::Lifeline, Errno::ESRCH, why));
    }
    Ok(())
}

/// The parent's word that the child may go on: one byte on the tether.
/// EPIPE means the child has already ended (a failed setup step of its own,
/// reported by itself): the parent goes on to reap it, not to fail over it.
pub fn release(parent_end: &OwnedFd) -> Result<()> {
    match nix::unistd::write(parent_end, &[1]) {
        Ok(_) | Err(Errno::EPIPE) => Ok(()),
        Err(e) => Err(fail(Stage::Monitor, e, "release the command")),
    }
}

/// Waits for one byte from `who` on `from`: the parent's [`release`] on the
/// tether, or the broker's word on the status channel that the run's start
/// is on disk. Fails if `who` is gone first.
pub fn wait_for_release(from: BorrowedFd<'_>, who: &str) -> Result<()> {
    let mut byte = [0u8];
    loop {
        match nix::unistd::read(from, &mut byte) {
            Ok(1) => return Ok(()),
            Ok(_) => {
                return Err(fail(Stage::Lifeline, Errno::ESRCH, format!("{who} ended before the release")));
            }
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(fail(Stage::Lifeline, e, format!("wait for the release by {who}"))),
        }
    }
}
