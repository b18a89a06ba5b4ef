//! The compiler: a profile's tables into the classic BPF program the helper
//! installs, with seccompiler for the argument rules and the architecture
//! check, and a range tree of its own for the syscall numbers.

use super::SeccompError;
use super::profile::{ALLOWED, ALLOWED_ARCH, MONITOR, Profile, conditional_rules};
use palisade_protocol::BpfInstruction;
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule, TargetArch};
use std::collections::BTreeMap;
use std::sync::OnceLock;

// Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
pub(super) const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
pub(super) const BPF_JA: u16 = 0x05;
pub(super) const BPF_RET_K: u16 = 0x06;
pub(super) const RET_ERRNO: u32 = 0x0005_0000;
pub(super) const RET_ALLOW: u32 = 0x7fff_0000;
/// The longest program the kernel loads (BPF_MAXINSNS).
const BPF_MAXINSNS: usize = 4096;

fn target_arch() -> Result<TargetArch, SeccompError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| SeccompError(e.to_string()))
}

/// The compiled default program of `profile`, cached.
pub fn default_program(profile: Profile) -> Result<&'static [BpfInstruction], SeccompError> {
    type Cell = OnceLock<Result<Vec<BpfInstruction>, String>>;
    static CELLS: [Cell; Profile::ALL.len()] = [const { Cell::new() }; Profile::ALL.len()];
    let index = Profile::ALL.iter().position(|p| *p == profile).unwrap_or(0);
    CELLS[index]
        .get_or_init(|| compile(profile).map_err(|e| e.0))
        .as_deref()
        .map_err(|e| SeccompError(e.clone()))
}

/// The program, in three parts:
/// 1. the architecture check (seccompiler's: any other architecture is killed),
///    then `clone3` → ENOSYS;
/// 2. a balanced decision tree over syscall-number ranges (`jge` splits, one
///    leaf per range): allowed ranges return ALLOW, gaps return EPERM, and a
///    syscall with argument rules jumps to its block;
/// 3. the argument rules, each compiled by seccompiler and copied verbatim.
///
/// seccompiler alone emits five instructions per allowed syscall and a linear
/// search; the tree keeps the program around 450 instructions, which the
/// kernel prepares, JITs and caches several times faster at every launch.
fn compile(profile: Profile) -> Result<Vec<BpfInstruction>, SeccompError> {
    let allowed: std::collections::BTreeSet<u32> = ALLOWED
        .iter()
        .chain(ALLOWED_ARCH)
        .filter(|(_, nr)| profile.allows(*nr))
        .map(|(_, nr)| *nr as u32)
        .collect();
    let mut blocks: BTreeMap<u32, Vec<BpfInstruction>> = BTreeMap::new();
    for (name, nr, rules) in conditional_rules(profile)? {
        blocks.insert(nr as u32, rule_block(name, nr, rules)?);
    }
    // Segments covering every number: [start, next start) → action.
    let mut segments: Vec<(u32, Leaf)> = Vec::new();
    let mut push = |start: u32, leaf: Leaf| {
        if segments.last().is_none_or(|(_, l)| *l != leaf) {
            segments.push((start, leaf));
        }
    };
    let top = allowed.iter().chain(blocks.keys()).max().copied().unwrap_or(0);
    for nr in 0..=top {
        let leaf = if blocks.contains_key(&nr) {
            Leaf::Rules(nr)
        } else if allowed.contains(&nr) {
            Leaf::Allow
        } else {
            Leaf::Deny
        };
        push(nr, leaf);
    }
    push(top + 1, Leaf::Deny);

    let mut asm = Asm::default();
    let arch = seccompiler_prefix()?;
    asm.code.extend(arch);
    asm.code.push(insn(BPF_LD_W_ABS, 0, 0, 0));
    asm.code.push(insn(BPF_JEQ_K, 0, 1, libc::SYS_clone3 as u32));
    asm.code.push(insn(BPF_RET_K, 0, 0, RET_ERRNO | libc::ENOSYS as u32));
    asm.tree(&segments);
    for (nr, block) in blocks {
        asm.bind(Label::Rules(nr));
        asm.code.extend(block);
    }
    let program = asm.finish()?;
    if program.len() > BPF_MAXINSNS {
        return Err(SeccompError(format!("program of {} instructions exceeds BPF_MAXINSNS", program.len())));
    }
    Ok(program)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Leaf {
    Allow,
    Deny,
    Rules(u32),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Label {
    Node(usize),
    Rules(u32),
}

/// A tiny assembler: conditional jumps only skip one instruction; every longer
/// jump is a `ja` to a label, patched at the end (so no offset overflows).
#[derive(Default)]
struct Asm {
    code: Vec<BpfInstruction>,
    labels: Vec<(Label, usize)>,
    fixups: Vec<(usize, Label)>,
    nodes: usize,
}

impl Asm {
    fn bind(&mut self, l: Label) {
        self.labels.push((l, self.code.len()));
    }

    fn jump(&mut self, l: Label) {
        self.fixups.push((self.code.len(), l));
        self.code.push(insn(BPF_JA, 0, 0, 0));
    }

    fn leaf(&mut self, leaf: Leaf) {
        match leaf {
            Leaf::Allow => self.code.push(insn(BPF_RET_K, 0, 0, RET_ALLOW)),
            Leaf::Deny => self.code.push(insn(BPF_RET_K, 0, 0, RET_ERRNO | libc::EPERM as u32)),
            Leaf::Rules(nr) => self.jump(Label::Rules(nr)),
        }
    }

    /// `segments[i]` covers [its start, the next start); the accumulator holds
    /// the syscall number, which is at least the first segment's start.
    fn tree(&mut self, segments: &[(u32, Leaf)]) {
        if let [(_, leaf)] = segments {
            return self.leaf(*leaf);
        }
        let mid = segments.len() / 2;
        let right = Label::Node(self.nodes);
        self.nodes += 1;
        // nr >= split: the next instruction jumps right; otherwise fall into the left half.
        self.code.push(insn(BPF_JGE_K, 0, 1, segments[mid].0));
        self.jump(right);
        self.tree(&segments[..mid]);
        self.bind(right);
        self.tree(&segments[mid..]);
    }

    fn finish(mut self) -> Result<Vec<BpfInstruction>, SeccompError> {
        for (at, label) in std::mem::take(&mut self.fixups) {
            let target = self.labels.iter().find(|(l, _)| *l == label).map(|(_, pc)| *pc);
            let target = target.ok_or_else(|| SeccompError(format!("unbound label {label:?}")))?;
            self.code[at].k = (target - at - 1) as u32;
        }
        Ok(self.code)
    }
}

/// seccompiler's architecture check (load, compare, kill), taken from the
/// program it compiles for an empty filter.
fn seccompiler_prefix() -> Result<Vec<BpfInstruction>, SeccompError> {
    let filter = SeccompFilter::new(
        BTreeMap::new(),
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        target_arch()?,
    )
    .map_err(|e| SeccompError(e.to_string()))?;
    let prog: BpfProgram =
        filter.try_into().map_err(|e: seccompiler::BackendError| SeccompError(e.to_string()))?;
    // [ld arch, jeq arch, ret kill, ret default]
    Ok(prog[..3].iter().map(|i| insn(i.code, i.jt, i.jf, i.k)).collect())
}

/// seccompiler's compiled argument rules for one syscall: the instructions
/// after its chain header, up to and including the chain's EPERM. Their jumps
/// are relative and stay inside the block.
fn rule_block(name: &str, nr: i64, rules: Vec<SeccompRule>) -> Result<Vec<BpfInstruction>, SeccompError> {
    let filter = SeccompFilter::new(
        BTreeMap::from([(nr, rules)]),
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        target_arch()?,
    )
    .map_err(|e| SeccompError(format!("{name}: {e}")))?;
    let prog: BpfProgram =
        filter.try_into().map_err(|e: seccompiler::BackendError| SeccompError(e.to_string()))?;
    // [ld arch, jeq arch, ret kill, ld nr, jeq nr, ja, ja, <block>, ret default]
    if prog.len() < 9 || prog[4].code != BPF_JEQ_K || prog[4].k != nr as u32 {
        return Err(SeccompError(format!(
            "{name}: unexpected seccompiler output ({} instructions)",
            prog.len()
        )));
    }
    Ok(prog[7..prog.len() - 1].iter().map(|i| insn(i.code, i.jt, i.jf, i.k)).collect())
}

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> BpfInstruction {
    BpfInstruction { code, jt, jf, k }
}

/// The monitor's program, cached: [`MONITOR`] allowed, anything else kills
/// the process. A monitor doing anything else has been subverted, and pid 1
/// dying takes the whole sandbox with it: that fails closed.
pub fn monitor_program() -> Result<&'static [BpfInstruction], SeccompError> {
    static CELL: OnceLock<Result<Vec<BpfInstruction>, String>> = OnceLock::new();
    CELL.get_or_init(|| compile_monitor().map_err(|e| e.0)).as_deref().map_err(|e| SeccompError(e.clone()))
}

fn compile_monitor() -> Result<Vec<BpfInstruction>, SeccompError> {
    let rules: BTreeMap<i64, Vec<SeccompRule>> = MONITOR.iter().map(|(_, nr)| (*nr, vec![])).collect();
    let filter = SeccompFilter::new(rules, SeccompAction::KillProcess, SeccompAction::Allow, target_arch()?)
        .map_err(|e| SeccompError(e.to_string()))?;
    let prog: BpfProgram =
        filter.try_into().map_err(|e: seccompiler::BackendError| SeccompError(e.to_string()))?;
    Ok(prog.iter().map(|i| insn(i.code, i.jt, i.jf, i.k)).collect())
}
