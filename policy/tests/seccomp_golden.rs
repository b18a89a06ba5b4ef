//! The compiled seccomp programs, as readable listings, must match the golden
//! files: any change to a profile or to seccompiler's output shows in a diff.
//! Regenerate with `PALISADE_BLESS=1 cargo test -p palisade-policy --test seccomp_golden`.

#![cfg(target_arch = "x86_64")]

use palisade_policy::seccomp::{Profile, default_program, listing, monitor_program};
use palisade_protocol::{BpfInstruction, Tier};
use std::path::PathBuf;

fn check(program: &[BpfInstruction], what: &str, file: &str) {
    let header = format!("# palisade seccomp program, x86_64, {what} ({} instructions)\n", program.len());
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

fn check_profile(tier: Tier, ip: bool, fork: bool, file: &str) {
    let program = default_program(Profile { tier, ip, fork }).expect("the profile compiles");
    let what = format!(
        "{tier}, {}, {}",
        match (ip, tier) {
            (false, _) => "no socket() (socketpair only)",
            (true, Tier::C) => "unix and IP sockets",
            (true, Tier::B) => "IP sockets, no unix socket, no host IPC",
        },
        if fork { "processes allowed" } else { "no_fork (threads only)" },
    );
    check(program, &what, file);
}

#[test]
fn tier_c_program_matches_golden() {
    check_profile(Tier::C, true, true, "seccomp-x86_64.txt");
}

#[test]
fn tier_c_no_fork_program_matches_golden() {
    check_profile(Tier::C, true, false, "seccomp-x86_64-no-fork.txt");
}

#[test]
fn tier_b_program_matches_golden() {
    check_profile(Tier::B, true, true, "seccomp-x86_64-tier-b.txt");
}

#[test]
fn tier_b_no_fork_program_matches_golden() {
    check_profile(Tier::B, true, false, "seccomp-x86_64-tier-b-no-fork.txt");
}

#[test]
fn tier_b_without_network_program_matches_golden() {
    check_profile(Tier::B, false, true, "seccomp-x86_64-tier-b-no-sockets.txt");
}

#[test]
fn tier_b_without_network_no_fork_program_matches_golden() {
    check_profile(Tier::B, false, false, "seccomp-x86_64-tier-b-no-sockets-no-fork.txt");
}

#[test]
fn monitor_program_matches_golden() {
    let program = monitor_program().expect("the monitor's program compiles");
    check(
        program,
        "the helper's monitor (pid 1): its list allowed, anything else kills",
        "seccomp-x86_64-monitor.txt",
    );
}
