//! Installing the seccomp program the broker compiled. The helper does not
//! interpret it: policy lives in the broker, and the program is in the plan.

use super::error::{Context, Result, fail};
use nix::errno::Errno;
use palisade_protocol::{BpfInstruction, Stage};

pub fn install(program: &[BpfInstruction]) -> Result<()> {
    if program.is_empty() || program.len() > usize::from(u16::MAX) {
        let why = format!("seccomp program of {} instructions", program.len());
        return Err(fail(Stage::Seccomp, Errno::EINVAL, why));
    }
    let filter: Vec<libc::sock_filter> =
        program.iter().map(|i| libc::sock_filter { code: i.code, jt: i.jt, jf: i.jf, k: i.k }).collect();
    let fprog =
        libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `fprog` points at `filter`, which outlives the call; the kernel copies the program.
    let rc = unsafe {
        libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &fprog as *const libc::sock_fprog)
    };
    Errno::result(rc)
        .map(drop)
        .at(Stage::Seccomp, || format!("install the seccomp filter ({} instructions)", filter.len()))
}
