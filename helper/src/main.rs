//! palisade-helper: builds one sandbox from a JailPlan, then execs the command.
//!
//! The broker spawns it with the plan on fd 3 (a Unix socket, with the
//! descriptors of the host paths the plan names), the status channel on fd 4
//! and, when the plan names a cgroup, that cgroup's directory on fd 5. It has no
//! setuid bit and no privilege of its own: everything it may do beyond an
//! ordinary process comes from the user namespace it creates. Each step below
//! either succeeds or reports `(stage, errno)` on fd 4, and the helper exits
//! without exec. Nothing after a failed step runs.

// The helper's work exists on Linux only: elsewhere it is a binary that refuses.
#[cfg(target_os = "linux")]
mod jail;

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!(
        "palisade-helper: the jail needs Linux (user namespaces, Landlock, seccomp); this system is {}",
        std::env::consts::OS
    );
    std::process::exit(2);
}

#[cfg(target_os = "linux")]
fn main() {
    if std::env::args_os().len() > 1 {
        eprintln!("palisade-helper takes no arguments: the broker passes its plan on fd 3 (ARCHITECTURE.md)");
        std::process::exit(2);
    }
    let Err(err) = jail::contain();
    jail::error::report(&err);
    std::process::exit(jail::error::EXIT_HELPER_FAILED);
}
