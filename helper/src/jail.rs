//! The helper's order on Linux, one step after another ([`contain`]), and
//! one module per kernel mechanism.

mod cgroup;
mod creds;
pub mod error;
mod exec;
mod fault;
mod fds;
mod landlock;
mod lifeline;
mod monitor;
mod mounts;
mod net;
mod rlimits;
mod seccomp;
mod session;
mod terminal;
mod userns;
mod uts;

use error::{Context, Result, fail};
use monitor::Role;
use nix::errno::Errno;
use nix::sys::{prctl, signal::Signal};
use palisade_protocol::{JailPlan, Namespaces, SessionRole, Stage};
use std::convert::Infallible;
use std::os::fd::{AsFd, OwnedFd};

/// The helper's order, one step after another; see [`step`].
pub fn contain() -> Result<Infallible> {
    step(Stage::NoNewPrivs, || {
        // Never gain privileges through exec, from here on.
        prctl::set_no_new_privs().at(Stage::NoNewPrivs, || "PR_SET_NO_NEW_PRIVS".into())?;
        fds::check_conventions()?;
        // Nothing a caller left open may reach the sandbox (pid 1 never execs).
        fds::close_inherited()?;
        fds::close_on_exec_above_stdio()
    })?;
    let (plan, mut descriptors, entered) = match fds::read_warm_spec()? {
        Some(spec) => enter_warm(spec)?,
        None => {
            let had_cgroup_dir = fds::cgroup_dir_passed();
            let (plan, descriptors) = step(Stage::Plan, receive_plan)?;
            fds::settle_cgroup_dir(&plan, had_cgroup_dir)?;
            (plan, descriptors, None)
        }
    };
    // Tier B's helper cleans up after the command when its caller dies: see lifeline.rs.
    let death_signal = if plan.namespaces.user { Signal::SIGKILL } else { Signal::SIGTERM };
    if entered.is_none() {
        step(Stage::Lifeline, || lifeline::arm_against_caller(plan.parent_pid, death_signal))?;
        if let Some(path) = &plan.cgroup {
            // Before the namespaces: this cgroup becomes the root of the sandbox's cgroup namespace.
            step(Stage::Cgroup, || cgroup::join(path))?;
        }
    }
    let tether = if plan.session == Some(SessionRole::Join) {
        let namespaces = descriptors.take().map(|mut d| d.rest()).unwrap_or_default();
        step(Stage::Join, || session::join(&plan, namespaces))?;
        step(Stage::Monitor, || monitor::fork_watched(Role::Visitor, || Ok(())))?
    } else if plan.namespaces.user {
        let entered = step(Stage::Fork, || match entered {
            Some(built_ahead) => Ok(built_ahead),
            None => enter_cold(&plan, death_signal),
        })?;
        become_pid1(&plan, descriptors.take(), entered)?
    } else {
        // A root caller's groups would otherwise follow the command to its new uid.
        creds::drop_supplementary_groups()?;
        // The reaper stays beside the command, outside its Landlock domain.
        prctl::set_dumpable(false).at(Stage::Monitor, || "PR_SET_DUMPABLE(0)".into())?;
        step(Stage::Monitor, || monitor::fork_watched(Role::Reaper, || Ok(())))?
    };
    step(Stage::Rlimits, || rlimits::apply(&plan.rlimits))?;
    step(Stage::Capabilities, || creds::switch_ids_and_drop_capabilities(plan.uid, plan.gid))?;
    // Its watcher (pid 1, or Tier B's reaper) has set itself up before the command goes on.
    lifeline::wait_for_release(tether.as_fd(), "the parent")?;
    // The kernel clears the death signal when credentials change.
    lifeline::arm_in_child(&tether)?;
    drop(tether);
    // As the command's ids, before Landlock: the terminal is the command's own.
    let terminal = step(Stage::Terminal, || plan.terminal.map(terminal::open_and_send).transpose())?;
    let holds = plan.session == Some(SessionRole::Hold);
    if holds {
        step(Stage::Session, || session::send_namespaces(&plan.namespaces))?;
    }
    // After the mounts (a Landlock-restricted process cannot mount), before
    // seccomp. Tier B's rules are on the broker's descriptors of host paths.
    step(Stage::Landlock, || landlock::restrict_self(&plan.landlock, descriptors.as_ref()))?;
    let command = exec::prepare(&plan)?;
    step(Stage::Cwd, || session::enter_cwd(&plan.cwd))?;
    step(Stage::Session, session::new_session)?;
    if let Some(peer) = terminal {
        step(Stage::Terminal, || terminal::take(peer))?;
    }
    // The requester's umask, not the broker's (a unit's UMask=0077): what the command creates.
    if let Some(mask) = plan.umask {
        nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(mask));
    }
    // Last before execve, so the filter need not allow anything the helper does.
    step(Stage::Seccomp, || seccomp::install(&plan.seccomp))?;
    // A session's holder, under the command's filter, execs nothing: it waits until the sandbox is torn down.
    if holds {
        loop {
            nix::unistd::pause();
        }
    }
    exec::exec(command)
}

/// One step of the order: `f`, which reports its own failure as `(stage,
/// errno)`, then the fault hook of `stage` (nothing in a release build).
fn step<T>(stage: Stage, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let done = f()?;
    fault::stop_after(stage);
    Ok(done)
}

/// A warm pool's sandbox: its namespaces, monitor and pid 1, and the shared
/// part of its root, come before the request; then the plan must be one
/// they fit exactly.
fn enter_warm(
    spec: palisade_protocol::WarmSpec,
) -> Result<(JailPlan, Option<fds::Descriptors>, Option<Entered>)> {
    lifeline::arm_against_caller(spec.parent_pid, Signal::SIGKILL)?;
    if spec.cgroup {
        // The pool slot's cgroup, the run's once a plan claims it.
        cgroup::join("the pooled sandbox's cgroup")?;
    }
    if let Some(ids) = spec.host_ids {
        become_host_ids(ids, spec.parent_pid, Signal::SIGKILL)?;
    }
    let mut entered = enter_namespaces(&spec.namespaces, spec.uid, spec.gid, true)?;
    entered.ahead = Some(mounts::build_ahead()?);
    let (plan, descriptors) = receive_plan()?;
    spec.admits(&plan).map_err(|e| fail(Stage::Plan, Errno::EINVAL, e))?;
    Ok((plan, descriptors, Some(entered)))
}

/// Tier C from its namespaces to pid 1's watch: the root, the hostname, the
/// loopback, then pid 1 forks the command's process and stays as its init.
fn become_pid1(plan: &JailPlan, descriptors: Option<fds::Descriptors>, entered: Entered) -> Result<OwnedFd> {
    step(Stage::Mounts, || mounts::build_root(plan, descriptors, entered.ahead))?;
    if let Some(name) = &plan.hostname {
        step(Stage::Hostname, || uts::set_hostname(name))?;
    }
    if let Some(n) = entered.net {
        step(Stage::Loopback, || n.join(plan.loopback, &plan.listeners))?;
    }
    drop(entered.to_relay);
    // pid 1 stays as a tiny init; the command runs in its child. Nothing
    // of pid 1 may be reached from the command through /proc/1: it holds
    // no descriptor but stdio and the status channel, and it is not
    // dumpable (no ptrace, no /proc/1/mem or /proc/1/fd).
    fds::keep_only_stdio_and_status()?;
    prctl::set_dumpable(false).at(Stage::Monitor, || "PR_SET_DUMPABLE(0)".into())?;
    // pid 1's own filter (the command's comes later, in the child).
    step(Stage::Monitor, || monitor::fork_watched(Role::Init, || seccomp::install(&plan.monitor_seccomp)))
}

/// The plan from fd 3, checked, and the descriptors of its host paths (Tier
/// C builds its root from them; Tier B's Landlock rules use them).
fn receive_plan() -> Result<(JailPlan, Option<fds::Descriptors>)> {
    let (plan, received) = fds::read_plan()?;
    // The broker checked it before sending; the helper builds nothing it has not checked itself.
    plan.check().map_err(|e| fail(Stage::Plan, Errno::EINVAL, format!("the plan asks for {e}")))?;
    let descriptors = fds::Descriptors::new(&plan, received)?;
    Ok((plan, Some(descriptors)))
}

/// A Tier C sandbox up to its mounts: in a new user namespace and the
/// others, the outer helper left behind as monitor, this process pid 1; a
/// warm one has built the shared part of its root too.
struct Entered {
    net: Option<net::Pending>,
    to_relay: OwnedFd,
    ahead: Option<mounts::Ahead>,
}

/// [`Entered`] for a plan in hand (a cold sandbox).
fn enter_cold(plan: &JailPlan, death: Signal) -> Result<Entered> {
    if let Some(ids) = plan.host_ids {
        become_host_ids(ids, plan.parent_pid, death)?;
    }
    enter_namespaces(&plan.namespaces, plan.uid, plan.gid, false)
}

/// A helper started by a system broker becomes the sandbox's unprivileged
/// host ids before any namespace: no process of the sandbox is ever host
/// root. The broker cloned every host mount it needs (`JailPlan::captured`).
fn become_host_ids(ids: palisade_protocol::HostIds, parent_pid: u32, death: Signal) -> Result<()> {
    creds::become_host_ids(ids)?;
    fault::stop_after(Stage::HostIds);
    // The kernel clears the death signal when credentials change.
    lifeline::arm_against_caller(parent_pid, death)
}

/// The namespaces and the fork into pid 1. The outer helper stays behind as
/// monitor, and makes the network namespace while its child goes on; in a
/// warm sandbox it first closes fd 3, which only pid 1 reads.
fn enter_namespaces(ns: &Namespaces, uid: u32, gid: u32, warm: bool) -> Result<Entered> {
    userns::enter(ns, uid, gid)?;
    fault::stop_after(Stage::Namespaces);
    let net = if ns.net { Some(net::prepare()?) } else { None };
    let to_relay = monitor::fork_watched(Role::Relay, || {
        if warm {
            fds::close_plan_socket()?;
        }
        net.as_ref().map_or(Ok(()), net::Pending::create)
    })?;
    Ok(Entered { net, to_relay, ahead: None })
}
