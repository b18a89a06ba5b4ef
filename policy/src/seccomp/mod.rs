//! The default seccomp profile, compiled with seccompiler into the classic BPF
//! program the helper installs.
//!
//! An allow-list: a syscall not listed fails with EPERM. `clone3` fails with
//! ENOSYS instead, so that libc falls back to `clone`, whose flags the filter
//! can inspect (clone3 passes them in memory, out of the filter's reach).
//! Argument checks compare 32-bit values as 32 bits (`Dword`): the kernel
//! ignores the upper half of an `int` argument, so a filter comparing 64 bits
//! could be bypassed by setting it (the TIOCSTI bypass of CVE-2017-5226).
//!
//! Three parts: [`profile`] (the syscall tables and argument rules),
//! [`compile`] (the tables into BPF) and [`listing`] (a program as people
//! read it, for the golden files and `palisade explain`).

#[cfg(target_os = "linux")]
mod compile;
#[cfg(not(target_os = "linux"))]
mod elsewhere;
#[cfg(target_os = "linux")]
mod listing;
#[cfg(target_os = "linux")]
mod profile;

#[cfg(target_os = "linux")]
pub use compile::{default_program, monitor_program};
#[cfg(not(target_os = "linux"))]
pub use elsewhere::{Profile, default_program, monitor_program, summary};
#[cfg(target_os = "linux")]
pub use listing::{listing, summary};
#[cfg(target_os = "linux")]
pub use profile::{DENIED, Profile, allowed_names};

#[derive(Debug, thiserror::Error)]
#[error("cannot compile the seccomp profile: {0}")]
pub struct SeccompError(String);

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::compile::*;
    use super::listing::*;
    use super::profile::*;
    use palisade_protocol::{BpfInstruction, Tier};

    fn eval(program: &[BpfInstruction], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        evaluate(program, arch, nr, args).expect("a valid program").0
    }

    const X86_64: u32 = 0xc000_003e;
    const EPERM: u32 = RET_ERRNO | libc::EPERM as u32;

    #[test]
    fn the_program_means_what_the_profile_says() {
        for profile in Profile::ALL {
            let Profile { tier, ip, fork } = profile;
            let p = default_program(profile).unwrap();
            let conditional: Vec<i64> =
                conditional_rules(profile).unwrap().iter().map(|(_, n, _)| *n).collect();
            for nr in 0..1024u32 {
                let n = i64::from(nr);
                let want = if nr == libc::SYS_clone3 as u32 {
                    RET_ERRNO | libc::ENOSYS as u32
                } else if conditional.contains(&n) {
                    continue;
                } else if ALLOWED.iter().chain(ALLOWED_ARCH).any(|(_, a)| *a == n)
                    && (fork || !FORKING.contains(&n))
                    && (tier == Tier::C || !HOST_IPC.contains(&n))
                {
                    RET_ALLOW
                } else {
                    EPERM
                };
                assert_eq!(eval(p, X86_64, nr, [0; 6]), want, "syscall {nr} ({profile:?})");
            }
            // The host's IPC objects are out of Tier B's reach; Tier C has its own.
            for nr in [libc::SYS_shmget, libc::SYS_msgget, libc::SYS_semget, libc::SYS_mq_open] {
                let want = if tier == Tier::C { RET_ALLOW } else { EPERM };
                assert_eq!(eval(p, X86_64, nr as u32, [0; 6]), want, "{nr} ({profile:?})");
            }
            // x32 numbers, and another architecture.
            assert_eq!(eval(p, X86_64, 0x4000_0000, [0; 6]), EPERM);
            assert_eq!(eval(p, 0x4000_0003, 0, [0; 6]), 0x8000_0000, "foreign arch must be killed");
            // Argument rules.
            let ioctl = libc::SYS_ioctl as u32;
            assert_eq!(eval(p, X86_64, ioctl, [0, TIOCSTI, 0, 0, 0, 0]), EPERM);
            assert_eq!(
                eval(p, X86_64, ioctl, [0, TIOCSTI | 1 << 32, 0, 0, 0, 0]),
                EPERM,
                "upper half ignored"
            );
            assert_eq!(eval(p, X86_64, ioctl, [0, TIOCLINUX, 0, 0, 0, 0]), EPERM);
            assert_eq!(eval(p, X86_64, ioctl, [0, libc::TIOCGWINSZ, 0, 0, 0, 0]), RET_ALLOW);
            let clone = libc::SYS_clone as u32;
            assert_eq!(eval(p, X86_64, clone, [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0]), EPERM);
            let thread = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
            assert_eq!(eval(p, X86_64, clone, [thread, 0, 0, 0, 0, 0]), RET_ALLOW);
            assert_eq!(
                eval(p, X86_64, clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
                if fork { RET_ALLOW } else { EPERM }
            );
            let unshare = libc::SYS_unshare as u32;
            assert_eq!(eval(p, X86_64, unshare, [libc::CLONE_NEWNET as u64, 0, 0, 0, 0, 0]), EPERM);
            assert_eq!(eval(p, X86_64, unshare, [0x80, 0, 0, 0, 0, 0]), EPERM, "CLONE_NEWTIME");
            assert_eq!(eval(p, X86_64, unshare, [libc::CLONE_FILES as u64, 0, 0, 0, 0, 0]), RET_ALLOW);
            let personality = libc::SYS_personality as u32;
            assert_eq!(eval(p, X86_64, personality, [0xffff_ffff, 0, 0, 0, 0, 0]), RET_ALLOW);
            assert_eq!(eval(p, X86_64, personality, [0x0040000, 0, 0, 0, 0, 0]), EPERM, "ADDR_NO_RANDOMIZE");
            let socket = libc::SYS_socket as u32;
            assert_eq!(
                eval(p, X86_64, socket, [libc::AF_UNIX as u64, 1, 0, 0, 0, 0]),
                if ip && tier == Tier::C { RET_ALLOW } else { EPERM },
                "a unix socket ({profile:?})"
            );
            let socketpair = libc::SYS_socketpair as u32;
            assert_eq!(eval(p, X86_64, socketpair, [libc::AF_UNIX as u64, 1, 0, 0, 0, 0]), RET_ALLOW);
            assert_eq!(
                eval(p, X86_64, socket, [libc::AF_INET as u64, 1, 0, 0, 0, 0]),
                if ip { RET_ALLOW } else { EPERM }
            );
            assert_eq!(eval(p, X86_64, socket, [libc::AF_PACKET as u64, 3, 0, 0, 0, 0]), EPERM);
        }
    }

    #[test]
    fn compiles_and_fits() {
        for profile in Profile::ALL {
            let program = default_program(profile).unwrap();
            assert!(program.len() > 100 && program.len() <= 600, "{} instructions", program.len());
        }
    }

    #[test]
    fn the_monitor_program_allows_its_list_and_kills_the_rest() {
        let p = monitor_program().unwrap();
        for nr in 0..1024u32 {
            let want = if MONITOR.iter().any(|(_, n)| *n == i64::from(nr)) { RET_ALLOW } else { 0x8000_0000 };
            assert_eq!(eval(p, X86_64, nr, [0; 6]), want, "syscall {nr}");
        }
        assert_eq!(eval(p, 0x4000_0003, libc::SYS_write as u32, [0; 6]), 0x8000_0000, "foreign arch");
    }

    #[test]
    fn nothing_denied_is_allowed() {
        let allowed: Vec<i64> = ALLOWED.iter().chain(ALLOWED_ARCH).map(|(_, n)| *n).collect();
        for (name, nr) in DENIED {
            assert!(!allowed.contains(nr), "{name} is on the allow-list");
        }
        let conditional: Vec<i64> =
            conditional_rules(Profile::ALL[0]).unwrap().iter().map(|(_, n, _)| *n).collect();
        for (name, nr) in DENIED {
            assert!(!conditional.contains(nr), "{name} has a conditional rule");
        }
    }

    #[test]
    fn conditional_names_match_the_rules() {
        let rules: Vec<(&str, i64)> =
            conditional_rules(Profile::ALL[0]).unwrap().iter().map(|(n, nr, _)| (*n, *nr)).collect();
        assert_eq!(rules, CONDITIONAL_NAMES);
    }

    #[test]
    fn no_syscall_is_listed_twice() {
        let mut all: Vec<i64> = ALLOWED.iter().chain(ALLOWED_ARCH).map(|(_, n)| *n).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
    }

    #[test]
    fn listing_names_syscalls_and_actions() {
        let text = listing(default_program(Profile::ALL[0]).unwrap());
        assert!(text.contains("; clone3"));
        assert!(text.contains("ret  ERRNO(ENOSYS)"));
        assert!(text.contains("ret  ERRNO(EPERM)"));
        let line =
            |name: &str| text.lines().find(|l| l.split_whitespace().nth(1) == Some(name)).map(str::to_owned);
        assert!(line("openat").unwrap().ends_with(" ALLOW"));
        assert!(line("ptrace").unwrap().ends_with(" ERRNO(EPERM)"));
        assert!(line("clone3").unwrap().ends_with(" ERRNO(ENOSYS)"));
        assert!(line("ioctl").unwrap().ends_with(" by arguments"));
    }
}
