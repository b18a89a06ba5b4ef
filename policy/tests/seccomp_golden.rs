//! The compiled default seccomp programs, as readable listings, must match the
//! golden files: any change to the profile or to seccompiler's output shows in
//! a diff. Regenerate with `PALISADE_BLESS=1 cargo test -p palisade-policy --test seccomp_golden`.

#![cfg(target_arch = "x86_64")]

use palisade_policy::seccomp::{default_program, listing};
use std::path::PathBuf;

fn check(ip: bool, fork: bool, file: &str) {
    let program = default_program(ip, fork).expect("the default profile compiles");
    let header = format!(
        "# palisade default seccomp program, x86_64, {}, {} ({} instructions)\n",
        if ip { "IP sockets allowed" } else { "no socket() (socketpair only)" },
        if fork { "processes allowed" } else { "no_fork (threads only)" },
        program.len()
    );
    let actual = header + &listing(program);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(file);
    if std::env::var_os("PALISADE_BLESS").is_some() {
        std::fs::write(&path, &actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    if expected != actual {
        let first = expected.lines().zip(actual.lines()).position(|(a, b)| a != b);
        panic!(
            "{} differs from the compiled program (first differing line: {:?}); \
             review the change and re-bless with PALISADE_BLESS=1",
            path.display(),
            first.map(|l| l + 1)
        );
    }
}

#[test]
fn default_program_matches_golden() {
    check(true, true, "seccomp-x86_64.txt");
}

#[test]
fn unix_only_program_matches_golden() {
    check(false, true, "seccomp-x86_64-no-sockets.txt");
}

#[test]
fn no_fork_program_matches_golden() {
    check(true, false, "seccomp-x86_64-no-fork.txt");
}

#[test]
fn unix_only_no_fork_program_matches_golden() {
    check(false, false, "seccomp-x86_64-no-sockets-no-fork.txt");
}
