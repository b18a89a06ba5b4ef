//! The listing: a compiled program as people read it (one instruction per
//! line, then what each named syscall gets), and the summary `palisade
//! explain` prints. Both run the program rather than trust the tables.

use super::compile::{BPF_JA, BPF_LD_W_ABS, BPF_RET_K};
use super::profile::{ALLOWED, ALLOWED_ARCH, CONDITIONAL_NAMES, DENIED, MONITOR, Profile};
use palisade_protocol::{BpfInstruction, Tier};
use std::fmt::Write;

/// This architecture's `AUDIT_ARCH_*` value, as in `seccomp_data.arch`.
fn audit_arch() -> u32 {
    match std::env::consts::ARCH {
        "aarch64" => 0xc000_00b7,
        "riscv64" => 0xc000_00f3,
        _ => 0xc000_003e,
    }
}

/// Every syscall the profile names (allowed, denied or conditional), by number.
fn named_syscalls() -> impl Iterator<Item = (u32, &'static str)> {
    ALLOWED
        .iter()
        .chain(ALLOWED_ARCH)
        .chain(DENIED)
        .chain(CONDITIONAL_NAMES.iter())
        .chain(MONITOR)
        .map(|(name, nr)| (*nr as u32, name.trim_start_matches("SYS_")))
}

fn syscall_name(nr: u32) -> Option<&'static str> {
    named_syscalls().find(|(n, _)| *n == nr).map(|(_, name)| name)
}

fn action(k: u32) -> String {
    match k & 0xffff_0000 {
        0x7fff_0000 => "ALLOW".into(),
        0x0005_0000 => match (k & 0xffff) as i32 {
            libc::EPERM => "ERRNO(EPERM)".into(),
            libc::ENOSYS => "ERRNO(ENOSYS)".into(),
            e => format!("ERRNO({e})"),
        },
        0x8000_0000 => "KILL_PROCESS".into(),
        0 => "KILL_THREAD".into(),
        other => format!("{other:#x}"),
    }
}

/// Which `seccomp_data` offset the accumulator holds at each instruction
/// (`None` when paths disagree). Classic BPF only jumps forward, so one pass
/// in order sees every predecessor before its successors.
fn loaded_offsets(program: &[BpfInstruction]) -> Vec<Option<u32>> {
    let mut state: Vec<Option<Option<u32>>> = vec![None; program.len() + 1];
    state[0] = Some(None);
    let merge = |state: &mut Vec<Option<Option<u32>>>, at: usize, v: Option<u32>| {
        if let Some(slot) = state.get_mut(at) {
            *slot = match *slot {
                None => Some(v),
                Some(old) if old == v => Some(v),
                Some(_) => Some(None),
            };
        }
    };
    for (pc, i) in program.iter().enumerate() {
        let here = state[pc].flatten();
        match i.code {
            BPF_LD_W_ABS => merge(&mut state, pc + 1, Some(i.k)),
            0x05 => merge(&mut state, pc + 1 + i.k as usize, here),
            0x15 | 0x25 | 0x35 | 0x45 => {
                merge(&mut state, pc + 1 + usize::from(i.jt), here);
                merge(&mut state, pc + 1 + usize::from(i.jf), here);
            }
            BPF_RET_K => {}
            _ => merge(&mut state, pc + 1, None),
        }
    }
    state.into_iter().take(program.len()).map(Option::flatten).collect()
}

/// Runs a classic BPF program on (arch, nr, args) as the kernel would, and
/// says whether the path taken read any argument. `None` for an instruction
/// the programs here never contain, or a jump out of the program.
pub(super) fn evaluate(
    program: &[BpfInstruction],
    arch: u32,
    nr: u32,
    args: [u64; 6],
) -> Option<(u32, bool)> {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_ne_bytes());
    data[4..8].copy_from_slice(&arch.to_ne_bytes());
    for (i, a) in args.iter().enumerate() {
        data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
    }
    let (mut pc, mut acc, mut read_args) = (0usize, 0u32, false);
    loop {
        let i = *program.get(pc)?;
        pc += 1;
        match i.code {
            BPF_LD_W_ABS => {
                let at = i.k as usize;
                acc = u32::from_ne_bytes(data.get(at..at + 4)?.try_into().ok()?);
                read_args |= at >= 16;
            }
            0x54 => acc &= i.k,
            BPF_JA => pc += i.k as usize,
            0x15 | 0x25 | 0x35 | 0x45 => {
                let taken = match i.code {
                    0x15 => acc == i.k,
                    0x25 => acc > i.k,
                    0x35 => acc >= i.k,
                    _ => acc & i.k != 0,
                };
                pc += usize::from(if taken { i.jt } else { i.jf });
            }
            BPF_RET_K => return Some((i.k, read_args)),
            _ => return None,
        }
    }
}

/// Every named syscall and what the program does with it (all arguments 0),
/// computed by running the program: the listing's second half, so a change
/// in meaning shows in the golden file by name.
fn decisions(program: &[BpfInstruction]) -> String {
    let mut names: Vec<(u32, &str)> = named_syscalls().collect();
    names.sort();
    names.dedup();
    let mut out = String::new();
    for (nr, name) in names {
        let text = match evaluate(program, audit_arch(), nr, [0; 6]) {
            Some((k, false)) => action(k),
            Some((_, true)) => "by arguments".to_string(),
            None => "invalid program".to_string(),
        };
        let _ = writeln!(out, "{nr:>4} {name:<24} {text}");
    }
    out
}

/// A readable listing of a program: one instruction per line, jump targets as
/// absolute addresses, syscall numbers and actions by name.
pub fn listing(program: &[BpfInstruction]) -> String {
    let mut out = String::new();
    let loaded = loaded_offsets(program);
    for (pc, i) in program.iter().enumerate() {
        let target = |off: u8| pc + 1 + usize::from(off);
        let text = match i.code {
            BPF_LD_W_ABS => {
                let what = match i.k {
                    0 => "syscall number".to_string(),
                    4 => "architecture".to_string(),
                    k if k >= 16 => {
                        format!("args[{}] {}", (k - 16) / 8, if k % 8 == 0 { "low" } else { "high" })
                    }
                    k => format!("seccomp_data+{k}"),
                };
                format!("ld   [{}]  ; {what}", i.k)
            }
            0x15 | 0x25 | 0x35 | 0x45 => {
                let op = match i.code {
                    0x15 => "jeq ",
                    0x25 => "jgt ",
                    0x35 => "jge ",
                    _ => "jset",
                };
                let note = match (loaded[pc], i.code) {
                    (Some(0), 0x15) => syscall_name(i.k).map(|n| format!("  ; {n}")).unwrap_or_default(),
                    (Some(4), 0x15) => "  ; AUDIT_ARCH".to_string(),
                    (Some(0), 0x35) => syscall_name(i.k).map(|n| format!("  ; from {n}")).unwrap_or_default(),
                    _ => String::new(),
                };
                format!("{op} #{:#010x}  jt {:04} jf {:04}{note}", i.k, target(i.jt), target(i.jf))
            }
            0x05 => format!("ja   {:04}", pc + 1 + i.k as usize),
            0x54 => format!("and  #{:#010x}", i.k),
            BPF_RET_K => format!("ret  {}", action(i.k)),
            _ => format!("raw  code={:#06x} jt={} jf={} k={:#x}", i.code, i.jt, i.jf, i.k),
        };
        let _ = writeln!(out, "{pc:04}  {text}");
    }
    out.push_str("\n; what each named syscall gets (arguments all 0)\n");
    out.push_str(&decisions(program));
    out
}

/// A short human summary for `palisade explain`.
pub fn summary(program: &[BpfInstruction], profile: Profile) -> String {
    let allowed = ALLOWED.iter().chain(ALLOWED_ARCH).filter(|(_, nr)| profile.allows(*nr)).count();
    format!(
        "allow-list of {allowed} syscalls, plus ioctl (not TIOCSTI/TIOCLINUX), clone ({}), unshare (no namespace flags), \
         personality (Linux only), socket ({}){}; default ERRNO(EPERM); clone3 ERRNO(ENOSYS); {} instructions",
        if profile.fork { "no namespace flags" } else { "threads only: no_fork" },
        match (profile.ip, profile.tier) {
            (false, _) => "none: socketpair only",
            (true, Tier::C) => "unix, inet, inet6, netlink",
            (true, Tier::B) => "inet, inet6, netlink; no unix socket",
        },
        if profile.tier == Tier::B { "; no System V IPC or POSIX message queues (the host's)" } else { "" },
        program.len()
    )
}
