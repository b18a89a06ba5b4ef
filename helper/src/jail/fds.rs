//! The calling convention: the plan on fd 3 (a Unix stream socket, with the
//! descriptors of the host paths it names attached), the status channel on
//! fd 4 (a Unix stream socket too: the caller writes on it the one byte that
//! releases the command, once the run's start is on disk), the run's cgroup
//! directory on fd 5 when the plan names one.
//! Anything else the helper inherited is closed before the plan is read.

use super::error::{Context, Result, STATUS_FD, fail};
use nix::errno::Errno;
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use palisade_protocol::{
    JailPlan, PLAN_MAX_BYTES, PLAN_MAX_DESCRIPTORS, Stage, WARM_MAGIC, WARM_SPEC_BYTES, WarmSpec, decode_plan,
};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub const PLAN_FD: i32 = 3;
pub const CGROUP_FD: i32 = 5;
/// Bytes taken from the plan's socket per read: a default plan (its seccomp
/// programs included) in one read, the largest in a few.
const PLAN_READ_BYTES: usize = 64 * 1024;

fn is_open(fd: i32) -> bool {
    // SAFETY: fcntl(F_GETFD) takes no pointer and only reads the flags of the
    // number given; one that is not open fails with EBADF. No BorrowedFd is
    // made of it: a borrow asserts the descriptor is open, which is the question.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// Refuses to run unless 0, 1, 2, the plan and the status channel are open:
/// otherwise a descriptor opened later could take one of their numbers and
/// receive what was meant for them.
pub fn check_conventions() -> Result<()> {
    for fd in [0, 1, 2, PLAN_FD, STATUS_FD] {
        if !is_open(fd) {
            let msg = format!("fd {fd} is not open (plan on fd 3, status channel on fd 4, stdio on 0-2)");
            eprintln!("palisade-helper: {msg}");
            return Err(fail(Stage::Fds, Errno::EBADF, msg));
        }
    }
    Ok(())
}

/// Closing a descriptor that an OwnedFd still owns is sound only if that
/// owner never uses or closes it afterwards, when its number may be another
/// file's. Each caller closes descriptors nothing owns or, in a monitor, ones
/// whose owners stay untouched in frames that never return (Tier B's reaper
/// still holds the plan's).
pub fn close_range(first: u32, last: u32) -> Result<()> {
    // SAFETY: no pointer is passed, and no owner of a descriptor in the range
    // uses or closes it afterwards (see above).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
    Errno::result(rc).map(drop).at(Stage::Fds, || format!("close_range({first}..={last})"))
}

/// Closes whatever the helper inherited beyond its convention (a caller's
/// stray descriptor would otherwise live on in the sandbox's pid 1, which
/// never execs). Called first, before anything of the helper's own is open.
pub fn close_inherited() -> Result<()> {
    close_range(CGROUP_FD as u32 + 1, u32::MAX)
}

/// The warm spec that a pooled helper gets on fd 3 before its plan, or
/// `None` when a plan comes first (it is left unread, for [`read_plan`]).
pub fn read_warm_spec() -> Result<Option<WarmSpec>> {
    let mut head = [0u8; WARM_SPEC_BYTES];
    // A peek leaves a plan's bytes, and the descriptors sent with them, in the socket.
    let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_WAITALL;
    let peeked = loop {
        match nix::sys::socket::recv(PLAN_FD, &mut head[..WARM_MAGIC.len()], flags) {
            Err(Errno::EINTR) => continue,
            other => break other.at(Stage::Plan, || "read the start of fd 3".into())?,
        }
    };
    // Fewer bytes: the socket was closed early, which read_plan reports.
    if peeked < WARM_MAGIC.len() || head[..WARM_MAGIC.len()] != WARM_MAGIC {
        return Ok(None);
    }
    let mut have = 0;
    while have < WARM_SPEC_BYTES {
        match nix::sys::socket::recv(PLAN_FD, &mut head[have..], MsgFlags::empty()) {
            Err(Errno::EINTR) => continue,
            Ok(0) => return Err(fail(Stage::Plan, Errno::EPIPE, "fd 3 closed inside the warm spec")),
            Ok(n) => have += n,
            Err(e) => return Err(fail(Stage::Plan, e, "read the warm spec from fd 3")),
        }
    }
    let spec = WarmSpec::decode(&head).map_err(|e| fail(Stage::Plan, Errno::EINVAL, e))?;
    match (spec.cgroup, is_open(CGROUP_FD)) {
        (true, false) => {
            Err(fail(Stage::Cgroup, Errno::EBADF, "the warm spec names a cgroup, fd 5 is closed"))
        }
        // Nothing of ours: it goes before anything could take its number.
        (false, true) => close_range(CGROUP_FD as u32, CGROUP_FD as u32).map(|()| Some(spec)),
        _ => Ok(Some(spec)),
    }
}

/// Whether fd 5 is open: before anything of the helper's own is, whether
/// the caller passed a cgroup directory.
pub fn cgroup_dir_passed() -> bool {
    is_open(CGROUP_FD)
}

/// Closes fd 3 in the monitor of a warm sandbox, which forked before the
/// plan came: only pid 1 reads it.
pub fn close_plan_socket() -> Result<()> {
    close_range(PLAN_FD as u32, PLAN_FD as u32)
}

/// The plan from fd 3 and the descriptors that came with it (close-on-exec;
/// counted against the plan by [`Descriptors::new`]). fd 3 is closed afterwards.
pub fn read_plan() -> Result<(JailPlan, Vec<OwnedFd>)> {
    // SAFETY: fd 3 carries the plan by the calling convention and nothing else
    // in this process refers to it; the OwnedFd closes it when this returns.
    let socket = unsafe { OwnedFd::from_raw_fd(PLAN_FD) };
    let mut bytes = Vec::with_capacity(PLAN_READ_BYTES);
    let mut received: Vec<OwnedFd> = Vec::new();
    let mut buf = vec![0u8; PLAN_READ_BYTES];
    loop {
        let mut cmsg = nix::cmsg_space!([RawFd; PLAN_MAX_DESCRIPTORS]);
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let msg = match recvmsg::<()>(PLAN_FD, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(Errno::EINTR) => continue,
            other => other.at(Stage::Plan, || "read the plan from fd 3 (a Unix stream socket)".into())?,
        };
        for c in msg.cmsgs().at(Stage::Plan, || "read the plan's descriptors".into())? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                // SAFETY: SCM_RIGHTS installed these descriptors in this process; nothing else owns them.
                received.extend(fds.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
            return Err(fail(Stage::Plan, Errno::EMSGSIZE, "too many descriptors came with the plan"));
        }
        let n = msg.bytes;
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&buf[..n]);
        if bytes.len() > PLAN_MAX_BYTES {
            break;
        }
    }
    drop(socket);
    let plan = decode_plan(&bytes).map_err(|e| fail(Stage::Plan, Errno::EINVAL, e.to_string()))?;
    Ok((plan, received))
}

/// A cold helper's fd 5 against its plan: the plan names a cgroup only with
/// the directory passed; when it names none, fd 5 was nothing of ours and
/// is closed. `had_cgroup_fd`: [`cgroup_dir_passed`], asked before the plan
/// was read (a received descriptor may take the number 5).
pub fn settle_cgroup_dir(plan: &JailPlan, had_cgroup_fd: bool) -> Result<()> {
    match (&plan.cgroup, had_cgroup_fd) {
        (Some(_), false) => Err(fail(Stage::Cgroup, Errno::EBADF, "the plan names a cgroup, fd 5 is closed")),
        (None, true) => close_range(CGROUP_FD as u32, CGROUP_FD as u32),
        _ => Ok(()),
    }
}

/// Marks every descriptor above stdio close-on-exec, the status channel and
/// the cgroup directory included: the command inherits only 0, 1 and 2.
pub fn close_on_exec_above_stdio() -> Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors; no memory is involved.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    Errno::result(rc).map(drop).at(Stage::Fds, || "close_range(3.., CLOEXEC)".into())
}

/// Closes every descriptor but stdio and the status channel. Called by pid 1
/// before it forks the command, so that nothing else of the helper's can be
/// reached through it; the caller owns nothing else open at this point (what
/// it held was dropped).
pub fn keep_only_stdio_and_status() -> Result<()> {
    close_range(PLAN_FD as u32, PLAN_FD as u32)?;
    close_range(STATUS_FD as u32 + 1, u32::MAX)
}

/// Closes every descriptor but the status channel and `tether` (its end of
/// the lifeline to its child): a monitor (pid 1, Tier B's reaper) needs no
/// more once the command is forked, not even stdio.
pub fn keep_only_status_and(tether: &OwnedFd) -> Result<()> {
    let mut keep = [STATUS_FD as u32, tether.as_raw_fd() as u32];
    keep.sort_unstable();
    let mut first = 0;
    for fd in keep {
        if fd > first {
            close_range(first, fd - 1)?;
        }
        first = fd + 1;
    }
    close_range(first, u32::MAX)
}

/// The cgroup directory the broker opened for this run (checked open by
/// [`read_plan`]), taken once, by `cgroup::join`, which closes it.
pub fn take_cgroup_dir() -> OwnedFd {
    // SAFETY: fd 5 is open (read_plan checked it when the plan names a
    // cgroup) and nothing else in this process owns it: this is its only
    // owner, and it is taken once.
    unsafe { OwnedFd::from_raw_fd(CGROUP_FD) }
}

/// The descriptors that came with the plan, by the host path each stands for.
pub struct Descriptors {
    paths: Vec<String>,
    fds: Vec<OwnedFd>,
}

impl Descriptors {
    /// Those of a checked plan: its host paths', then a held session's
    /// namespaces; or a system broker's trees ([`JailPlan::sends_trees`]).
    pub fn new(plan: &JailPlan, fds: Vec<OwnedFd>) -> Result<Descriptors> {
        let (named, came) = (plan.descriptors_sent(), fds.len());
        if named != came {
            let why = format!("the plan names {named} descriptors but came with {came}");
            return Err(fail(Stage::Plan, Errno::EINVAL, why));
        }
        let paths = plan.descriptors.iter().filter(|_| !plan.sends_trees()).map(|d| d.path.clone());
        Ok(Descriptors { paths: paths.collect(), fds })
    }

    /// The descriptors after those of the host paths: a joined session's
    /// namespaces, or a system broker's trees (all there are).
    pub fn rest(&mut self) -> Vec<OwnedFd> {
        self.fds.split_off(self.paths.len())
    }

    /// The descriptor of `path`, which the plan must have named.
    pub fn get(&self, path: &str, stage: Stage) -> Result<&OwnedFd> {
        let i = self.paths.iter().position(|p| p == path);
        i.map(|i| &self.fds[i]).ok_or_else(|| {
            fail(stage, Errno::EINVAL, format!("the plan names {path} but no descriptor for it"))
        })
    }
}
