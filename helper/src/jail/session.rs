//! Working directory and a new session; a palisade session's sandbox, held
//! and joined.

use super::error::{self, Context, Result, fail};
use super::{creds, lifeline};
use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sched::{CloneFlags, setns};
use nix::sys::{prctl, signal::Signal, stat::Mode};
use nix::unistd::{chdir, getcwd, setsid};
use palisade_protocol::{HelperRecord, JailPlan, Namespaces, Stage};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

/// Enters the working directory and checks that it is the one the plan named
/// (no symlink took the process elsewhere).
pub fn enter_cwd(cwd: &str) -> Result<()> {
    chdir(cwd).at(Stage::Cwd, || format!("chdir {cwd}"))?;
    let actual = getcwd().at(Stage::Cwd, || "getcwd".into())?;
    if actual != Path::new(cwd) {
        return Err(fail(Stage::Cwd, Errno::EXDEV, format!("chdir {cwd} landed in {}", actual.display())));
    }
    Ok(())
}

/// A new session without a controlling terminal: the command cannot inject
/// input into the caller's terminal (TIOCSTI) or receive its job-control signals.
pub fn new_session() -> Result<()> {
    setsid().map(drop).at(Stage::Session, || "setsid".into())
}

/// The process that holds a session sends the namespaces the plan made
/// (see [`palisade_protocol::SessionRole::Hold`]), in the order of
/// [`Namespaces::names`]: the broker joins them for each command of the
/// session. Before Landlock, which would refuse opening them.
pub fn send_namespaces(ns: &Namespaces) -> Result<()> {
    let mut held = Vec::new();
    for name in ns.names() {
        let path = format!("/proc/self/ns/{}", if name == "mount" { "mnt" } else { name });
        let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        held.push(open(path.as_str(), flags, Mode::empty()).at(Stage::Session, || format!("open {path}"))?);
    }
    let raw: Vec<_> = held.iter().map(AsRawFd::as_raw_fd).collect();
    error::send_with_fds(&HelperRecord::Session, &raw).at(Stage::Session, || "send the namespaces".into())
}

/// Enters a held session's namespaces (see
/// [`palisade_protocol::SessionRole::Join`]), its user namespace first.
/// A helper started by a system broker first becomes the session's host ids.
pub fn join(plan: &JailPlan, namespaces: Vec<OwnedFd>) -> Result<()> {
    if let Some(ids) = plan.host_ids {
        creds::become_host_ids(ids)?;
        // The kernel clears the death signal when credentials change.
        lifeline::arm_against_caller(plan.parent_pid, Signal::SIGKILL)?;
    }
    // It holds the capabilities of the session's user namespace until it
    // forks: nothing of the session may reach it (it is outside the pid namespace too).
    prctl::set_dumpable(false).at(Stage::Join, || "PR_SET_DUMPABLE(0)".into())?;
    for (fd, name) in namespaces.iter().zip(plan.namespaces.names()) {
        setns(fd, CloneFlags::empty())
            .at(Stage::Join, || format!("setns into the session's {name} namespace"))?;
    }
    Ok(())
}
