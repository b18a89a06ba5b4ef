//! The plugin-host's own seccomp filter, installed first thing at start, on
//! top of whatever its jail already has: no `execve` or `execveat` (EPERM),
//! so a runtime compromised by a plugin cannot become another program.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp: this architecture ({0}) has no filter: {1}")]
    Arch(&'static str, String),
    #[error("seccomp: building the exec filter: {0}")]
    Build(String),
    #[error(
        "seccomp: installing the exec filter: {0} (Hint: this requires a kernel configured with CONFIG_SECCOMP_FILTER)"
    )]
    Install(String),
}

/// The compiled filter: every syscall allowed but the two that run a program.
pub fn exec_filter() -> Result<BpfProgram, SeccompError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| SeccompError::Arch(std::env::consts::ARCH, e.to_string()))?;
    let rules = BTreeMap::from([(libc::SYS_execve, vec![]), (libc::SYS_execveat, vec![])]);
    let filter =
        SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch)
            .map_err(|e| SeccompError::Build(e.to_string()))?;
    filter.try_into().map_err(|e: seccompiler::BackendError| SeccompError::Build(e.to_string()))
}

/// Installs `program` on the calling thread (and the threads it starts
/// later), after `no_new_privs` (seccompiler sets it, as the kernel
/// requires of an unprivileged filter). Call it before starting any thread.
pub fn apply_to_current_thread(program: &BpfProgram) -> Result<(), SeccompError> {
    seccompiler::apply_filter(program).map_err(|e| SeccompError::Install(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a forked child: install the filter, try to exec, report errno as
    /// the exit status. The program is built before the fork (no allocation after it).
    #[test]
    fn exec_is_refused_after_the_filter() {
        let program = exec_filter().expect("the filter builds");
        let path = c"/bin/true";
        let argv = [path.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null()];
        // SAFETY: the child calls only async-signal-safe functions (prctl and
        // seccomp through apply_filter, execve, _exit) on memory prepared before the fork.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let code = match apply_to_current_thread(&program) {
                Err(_) => 100,
                Ok(()) => {
                    // SAFETY: argv and envp are null-terminated arrays of valid C strings.
                    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
                    std::io::Error::last_os_error().raw_os_error().unwrap_or(101)
                }
            };
            // SAFETY: _exit ends the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for the child this test forked, into a local.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(rc, pid, "waitpid: {}", std::io::Error::last_os_error());
        assert!(libc::WIFEXITED(status), "the child died: status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), libc::EPERM, "execve after the filter: errno EPERM");
    }
}
