//! Forking a watched child.
//!
//! The parent of each fork becomes a monitor that never returns: it relays
//! signals, reaps, and exits with the child's status. Three roles:
//! - `Relay`: the outer helper in Tier C, watching pid 1 of the new pid namespace;
//! - `Init`: pid 1 in Tier C, watching the command; when it exits the kernel
//!   kills whatever is left in the namespace;
//! - `Reaper`: the helper in Tier B, a child subreaper that kills every
//!   remaining descendant when the command ends;
//! - `Visitor`: the helper of a command in a held session, outside its pid
//!   namespace: what the command leaves running stays, the session's pid 1
//!   its reaper.
//!
//! SIGTERM to the helper means "tear the sandbox down now"; it is also Tier
//! B's death signal, so the reaper cleans up when its caller dies.

use super::error::{self, Context, Result};
use super::{creds, fault, fds, lifeline};
use nix::errno::Errno;
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::sys::{prctl, time::TimeVal};
use nix::unistd::{ForkResult, Pid, fork, getpid};
use palisade_protocol::{ExitReport, HelperRecord, Stage};
use std::os::fd::OwnedFd;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Relay,
    Init,
    Reaper,
    Visitor,
}

const WATCHED: [Signal; 7] = [
    Signal::SIGCHLD,
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Forks. Returns in the child only, with its end of the lifeline tether.
/// The parent does `in_parent` (concurrently with the child) before it
/// starts watching, and kills the child and exits if that fails. The parent
/// never returns: nothing it holds is ever dropped.
pub fn fork_watched(role: Role, in_parent: impl FnOnce() -> Result<()>) -> Result<OwnedFd> {
    if role == Role::Reaper {
        // Orphans of the command are re-parented to us instead of escaping to init.
        prctl::set_child_subreaper(true).at(Stage::Monitor, || "PR_SET_CHILD_SUBREAPER".into())?;
    }
    let tether = lifeline::tether()?;
    let mut watched = SigSet::empty();
    WATCHED.iter().for_each(|s| watched.add(*s));
    // Blocked before fork, so no signal is lost between fork and sigwait; a
    // blocked signal is queued even for a pid 1 that has no handler.
    let previous =
        watched.thread_swap_mask(SigmaskHow::SIG_BLOCK).at(Stage::Monitor, || "block signals".into())?;
    // SAFETY: the helper is single-threaded, so the child may run any code after fork.
    match unsafe { fork() }.at(Stage::Fork, || "fork".into())? {
        ForkResult::Child => {
            drop(tether.parent_end);
            // The command must not inherit a blocked signal mask.
            previous.thread_set_mask().at(Stage::Monitor, || "restore the signal mask".into())?;
            lifeline::arm_in_child(&tether.child_end)?;
            Ok(tether.child_end)
        }
        ForkResult::Parent { child } => {
            drop(tether.child_end);
            let inside = matches!(role, Role::Init | Role::Visitor);
            // pid 1 (and a visitor, in the session's user namespace) needs no privilege to reap and relay.
            let drop_caps = || if inside { creds::drop_capabilities() } else { Ok(()) };
            // pid 1 and the reaper stay beside the command: they keep nothing
            // it could reach through them (the Relay is outside its pid namespace).
            let close = || match role {
                Role::Relay => Ok(()),
                Role::Init | Role::Reaper | Role::Visitor => fds::keep_only_status_and(&tether.parent_end),
            };
            // pid 1 and the reaper release the command once they hold nothing
            // it could reach (pid 1 under its own filter), and once the broker
            // says the run's start is on disk: until then it waits.
            let release = || match role {
                Role::Relay => Ok(()),
                Role::Init | Role::Reaper | Role::Visitor => {
                    lifeline::wait_for_release(error::status_channel(), "the broker")?;
                    lifeline::release(&tether.parent_end)
                }
            };
            if let Err(e) =
                drop_caps().and_then(|()| close()).and_then(|()| in_parent()).and_then(|()| release())
            {
                error::report(&e);
                let _ = kill(child, Signal::SIGKILL);
                std::process::exit(error::EXIT_HELPER_FAILED);
            }
            watch(child, role, &watched, tether.parent_end)
        }
    }
}

fn watch(child: Pid, role: Role, watched: &SigSet, _tether: OwnedFd) -> ! {
    loop {
        let Ok(signal) = watched.wait() else { continue };
        match signal {
            Signal::SIGCHLD => {
                if let Some(status) = reap(child) {
                    finish(status, role)
                }
            }
            Signal::SIGTERM if role != Role::Init => {
                // Best effort: the child may already be gone, and SIGCHLD follows either way.
                let _ = kill(Pid::from_raw(-child.as_raw()), Signal::SIGKILL);
                let _ = kill(child, Signal::SIGKILL);
            }
            other => {
                // Relayed to the command's process group (it called setsid), else to the child.
                if kill(Pid::from_raw(-child.as_raw()), other).is_err() {
                    let _ = kill(child, other);
                }
            }
        }
    }
}

/// Reaps every exited process; returns the child's status once it has ended.
fn reap(child: Pid) -> Option<ExitReport> {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == child => return Some(ExitReport::Code(code)),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => {
                return Some(ExitReport::Signal(sig as i32));
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

fn finish(report: ExitReport, role: Role) -> ! {
    if role != Role::Relay {
        // The command tree's peak, as the kernel counted it for the processes reaped.
        if let Ok(usage) = getrusage(UsageWho::RUSAGE_CHILDREN) {
            error::send(&HelperRecord::Peak { max_rss_kib: usage.max_rss().max(0) as u64 });
        }
        error::send(&HelperRecord::Exit(report));
    } else if let Some((user_us, system_us)) = cpu_us() {
        // pid 1 is reaped once the kernel has killed and reaped the rest of its namespace: the run is
        // over, and the broker may answer it while this exit tears the namespaces and mounts down.
        // The output pipes first: an exit closes its files only after that teardown.
        let _ = fds::close_range(0, 2);
        error::send(&HelperRecord::Reaped { exit: report, user_us, system_us });
        fault::stop_after(Stage::Reaped);
    }
    if role == Role::Reaper {
        kill_descendants();
    }
    let code = match report {
        ExitReport::Code(code) => code,
        ExitReport::Signal(sig) => 128 + sig,
    };
    // SAFETY: _exit ends the process at once; nothing is left to flush (the
    // record went out in one write), and libc's exit would make system calls
    // pid 1's filter does not allow.
    unsafe { libc::_exit(code) }
}

/// CPU time (user, system) in µs of this process and of the processes it
/// reaped: what `wait4` would report for it.
fn cpu_us() -> Option<(u64, u64)> {
    let (me, reaped) = (getrusage(UsageWho::RUSAGE_SELF).ok()?, getrusage(UsageWho::RUSAGE_CHILDREN).ok()?);
    let us = |t: TimeVal| (t.tv_sec() * 1_000_000 + t.tv_usec()).max(0) as u64;
    Some((us(me.user_time()) + us(reaped.user_time()), us(me.system_time()) + us(reaped.system_time())))
}

/// Kills what the command left behind. Each killed process's children are
/// re-parented to us (the subreaper), so repeating until nothing is left
/// catches processes that double-forked and called setsid.
/// The pids read are those of children not yet reaped (alive or zombie), so
/// none can have been reused by another process.
fn kill_descendants() {
    let me = getpid();
    loop {
        let children = match std::fs::read_to_string(format!("/proc/self/task/{me}/children")) {
            Ok(c) => c,
            Err(e) => {
                // Without the list, waiting could block forever on a survivor.
                eprintln!("palisade-helper: cannot list the command's leftover processes: {e}");
                return;
            }
        };
        for pid in children.split_whitespace().filter_map(|p| p.parse().ok()) {
            // ESRCH just means it already died.
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if waitpid(None, None) == Err(Errno::ECHILD) {
            return;
        }
    }
}
