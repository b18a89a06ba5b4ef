//! The final step. Everything execve needs is prepared before seccomp, so
//! nothing but execve and the failure report runs under the filter.

use super::error::{self, HelperError, Result, fail};
use nix::errno::Errno;
use palisade_protocol::{JailPlan, Stage};
use std::ffi::CString;

pub struct Prepared {
    program: CString,
    argv: Vec<CString>,
    env: Vec<CString>,
}

fn cstring(what: &str, s: String) -> Result<CString> {
    CString::new(s).map_err(|_| fail(Stage::Exec, Errno::EINVAL, format!("NUL byte in {what}")))
}

pub fn prepare(plan: &JailPlan) -> Result<Prepared> {
    let mut env = Vec::with_capacity(plan.env.len());
    for (k, v) in &plan.env {
        if k.is_empty() || k.contains('=') {
            return Err(fail(Stage::Env, Errno::EINVAL, format!("bad environment variable name {k:?}")));
        }
        env.push(cstring("the environment", format!("{k}={v}"))?);
    }
    Ok(Prepared {
        program: cstring("the program path", plan.program.clone())?,
        argv: plan.argv.iter().map(|a| cstring("an argument", a.clone())).collect::<Result<_>>()?,
        env,
    })
}

/// Execs; returns only on failure, after reporting `(exec, errno)`.
pub fn exec(p: Prepared) -> ! {
    let Err(errno) = nix::unistd::execve(&p.program, &p.argv, &p.env);
    let program = p.program.to_string_lossy();
    error::report(&HelperError { stage: Stage::Exec, errno, message: format!("exec {program}: {errno:?}") });
    std::process::exit(if errno == Errno::ENOENT { 127 } else { 126 })
}
