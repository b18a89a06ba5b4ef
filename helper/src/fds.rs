//! The calling convention: plan on fd 3, status channel on fd 4, the run's
//! cgroup directory on fd 5 when the plan names one. Everything else is
//! closed at exec.

use crate::error::{Context, Result, STATUS_FD, fail};
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, fcntl};
use palisade_protocol::{JailPlan, PLAN_MAX_BYTES, Stage, decode_plan};
use std::fs::File;
use std::io::Read;
use std::os::fd::{BorrowedFd, FromRawFd};

pub const PLAN_FD: i32 = 3;
pub const CGROUP_FD: i32 = 5;

fn is_open(fd: i32) -> bool {
    // SAFETY: F_GETFD on a descriptor number only inspects it; a closed number fails with EBADF.
    fcntl(unsafe { BorrowedFd::borrow_raw(fd) }, FcntlArg::F_GETFD).is_ok()
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

/// Reads and decodes the plan from fd 3, then closes fd 3.
pub fn read_plan() -> Result<JailPlan> {
    // SAFETY: fd 3 carries the plan by the calling convention and nothing else in
    // this process refers to it; the File takes ownership and closes it.
    let file = unsafe { File::from_raw_fd(PLAN_FD) };
    let mut bytes = Vec::with_capacity(16 * 1024);
    file.take(PLAN_MAX_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .at(Stage::Plan, || "read the plan from fd 3".into())?;
    decode_plan(&bytes).map_err(|e| fail(Stage::Plan, Errno::EINVAL, e.to_string()))
}

/// Marks every descriptor above stdio close-on-exec, the status channel and
/// the cgroup directory included: the command inherits only 0, 1 and 2.
pub fn close_on_exec_above_stdio() -> Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors; no memory is involved.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    Errno::result(rc).map(drop).at(Stage::Fds, || "close_range(3.., CLOEXEC)".into())
}

/// The cgroup directory the broker opened for this run.
pub fn cgroup_dir() -> Result<BorrowedFd<'static>> {
    if !is_open(CGROUP_FD) {
        return Err(fail(Stage::Cgroup, Errno::EBADF, "the plan names a cgroup but fd 5 is not open"));
    }
    // SAFETY: fd 5 is the cgroup directory by the calling convention and stays open until exec.
    Ok(unsafe { BorrowedFd::borrow_raw(CGROUP_FD) })
}
