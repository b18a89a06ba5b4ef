//! vmcheck: the cgroup checks, run inside a throwaway guest with a pure
//! cgroup v2 hierarchy (tests/vm/run-in-vm.sh), as root and as an
//! unprivileged user in a delegated subtree; with `--v1`, in a guest whose
//! cgroup v1 controllers it mounts itself. It drives the real palisaded,
//! palisade, palisade-helper and probe, prints one PASS/FAIL line per check,
//! and exits with the number of failures.

#[cfg(target_os = "linux")]
mod linux;

#[cfg(target_os = "linux")]
fn main() {
    linux::main();
}

/// Its checks are of Linux's cgroups.
#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("vmcheck: runs in a Linux guest only");
    std::process::exit(2);
}
