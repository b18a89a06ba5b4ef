//! The default seccomp profile, compiled with seccompiler into the classic BPF
//! program the helper installs.
//!
//! An allow-list: a syscall not listed fails with EPERM. `clone3` fails with
//! ENOSYS instead, so that libc falls back to `clone`, whose flags the filter
//! can inspect (clone3 passes them in memory, out of the filter's reach).
//! Argument checks compare 32-bit values as 32 bits (`Dword`): the kernel
//! ignores the upper half of an `int` argument, so a filter comparing 64 bits
//! could be bypassed by setting it (the TIOCSTI bypass of CVE-2017-5226).

use palisade_protocol::{BpfInstruction, Tier};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond,
    SeccompFilter, SeccompRule, TargetArch,
};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::OnceLock;

macro_rules! syscalls {
    ($($name:ident),* $(,)?) => { &[$((stringify!($name), libc::$name as i64)),*] };
}

/// Allowed whatever their arguments.
const ALLOWED: &[(&str, i64)] = syscalls![
    SYS_accept,
    SYS_accept4,
    SYS_bind,
    SYS_brk,
    SYS_capget,
    SYS_capset,
    SYS_chdir,
    SYS_chmod,
    SYS_chown,
    SYS_clock_getres,
    SYS_clock_gettime,
    SYS_clock_nanosleep,
    SYS_close,
    SYS_close_range,
    SYS_connect,
    SYS_copy_file_range,
    SYS_dup,
    SYS_dup3,
    SYS_epoll_create1,
    SYS_epoll_ctl,
    SYS_epoll_pwait,
    SYS_epoll_pwait2,
    SYS_eventfd2,
    SYS_execve,
    SYS_execveat,
    SYS_exit,
    SYS_exit_group,
    SYS_faccessat,
    SYS_faccessat2,
    SYS_fadvise64,
    SYS_fallocate,
    SYS_fchdir,
    SYS_fchmod,
    SYS_fchmodat,
    SYS_fchmodat2,
    SYS_fchown,
    SYS_fchownat,
    SYS_fcntl,
    SYS_fdatasync,
    SYS_fgetxattr,
    SYS_flistxattr,
    SYS_flock,
    SYS_fremovexattr,
    SYS_fsetxattr,
    SYS_fstatfs,
    SYS_fsync,
    SYS_ftruncate,
    SYS_futex,
    SYS_futex_waitv,
    SYS_get_mempolicy,
    SYS_get_robust_list,
    SYS_getcpu,
    SYS_getcwd,
    SYS_getdents64,
    SYS_getegid,
    SYS_geteuid,
    SYS_getgid,
    SYS_getgroups,
    SYS_getitimer,
    SYS_getpeername,
    SYS_getpgid,
    SYS_getpid,
    SYS_getppid,
    SYS_getpriority,
    SYS_getrandom,
    SYS_getresgid,
    SYS_getresuid,
    SYS_getrlimit,
    SYS_getrusage,
    SYS_getsid,
    SYS_getsockname,
    SYS_getsockopt,
    SYS_gettid,
    SYS_gettimeofday,
    SYS_getuid,
    SYS_getxattr,
    SYS_inotify_add_watch,
    SYS_inotify_init1,
    SYS_inotify_rm_watch,
    SYS_io_cancel,
    SYS_io_destroy,
    SYS_io_getevents,
    SYS_io_setup,
    SYS_io_submit,
    SYS_ioprio_get,
    SYS_ioprio_set,
    SYS_kill,
    SYS_landlock_add_rule,
    SYS_landlock_create_ruleset,
    SYS_landlock_restrict_self,
    SYS_lgetxattr,
    SYS_linkat,
    SYS_listen,
    SYS_listxattr,
    SYS_llistxattr,
    SYS_lremovexattr,
    SYS_lseek,
    SYS_lsetxattr,
    SYS_madvise,
    SYS_mbind,
    SYS_membarrier,
    SYS_memfd_create,
    SYS_mincore,
    SYS_mkdirat,
    SYS_mknodat,
    SYS_mlock,
    SYS_mlock2,
    SYS_mlockall,
    SYS_mmap,
    SYS_mprotect,
    SYS_mq_getsetattr,
    SYS_mq_notify,
    SYS_mq_open,
    SYS_mq_timedreceive,
    SYS_mq_timedsend,
    SYS_mq_unlink,
    SYS_mremap,
    SYS_msgctl,
    SYS_msgget,
    SYS_msgrcv,
    SYS_msgsnd,
    SYS_msync,
    SYS_munlock,
    SYS_munlockall,
    SYS_munmap,
    SYS_nanosleep,
    SYS_newfstatat,
    SYS_openat,
    SYS_openat2,
    SYS_pidfd_open,
    SYS_pidfd_send_signal,
    SYS_pipe2,
    SYS_pkey_alloc,
    SYS_pkey_free,
    SYS_pkey_mprotect,
    SYS_ppoll,
    SYS_prctl,
    SYS_pread64,
    SYS_preadv,
    SYS_preadv2,
    SYS_prlimit64,
    SYS_pselect6,
    SYS_pwrite64,
    SYS_pwritev,
    SYS_pwritev2,
    SYS_read,
    SYS_readahead,
    SYS_readlinkat,
    SYS_readv,
    SYS_recvfrom,
    SYS_recvmmsg,
    SYS_recvmsg,
    SYS_remap_file_pages,
    SYS_removexattr,
    SYS_renameat,
    SYS_renameat2,
    SYS_restart_syscall,
    SYS_rseq,
    SYS_rt_sigaction,
    SYS_rt_sigpending,
    SYS_rt_sigprocmask,
    SYS_rt_sigqueueinfo,
    SYS_rt_sigreturn,
    SYS_rt_sigsuspend,
    SYS_rt_sigtimedwait,
    SYS_rt_tgsigqueueinfo,
    SYS_sched_get_priority_max,
    SYS_sched_get_priority_min,
    SYS_sched_getaffinity,
    SYS_sched_getattr,
    SYS_sched_getparam,
    SYS_sched_getscheduler,
    SYS_sched_rr_get_interval,
    SYS_sched_setaffinity,
    SYS_sched_setattr,
    SYS_sched_setparam,
    SYS_sched_setscheduler,
    SYS_sched_yield,
    SYS_seccomp,
    SYS_semctl,
    SYS_semget,
    SYS_semop,
    SYS_semtimedop,
    SYS_sendfile,
    SYS_sendmmsg,
    SYS_sendmsg,
    SYS_sendto,
    SYS_set_mempolicy,
    SYS_set_robust_list,
    SYS_set_tid_address,
    SYS_setfsgid,
    SYS_setfsuid,
    SYS_setgid,
    SYS_setgroups,
    SYS_setitimer,
    SYS_setpgid,
    SYS_setpriority,
    SYS_setregid,
    SYS_setresgid,
    SYS_setresuid,
    SYS_setreuid,
    SYS_setrlimit,
    SYS_setsid,
    SYS_setsockopt,
    SYS_setuid,
    SYS_setxattr,
    SYS_shmat,
    SYS_shmctl,
    SYS_shmdt,
    SYS_shmget,
    SYS_shutdown,
    SYS_sigaltstack,
    SYS_signalfd4,
    SYS_socketpair,
    SYS_splice,
    SYS_statfs,
    SYS_statx,
    SYS_symlinkat,
    SYS_sync,
    SYS_sync_file_range,
    SYS_syncfs,
    SYS_sysinfo,
    SYS_tee,
    SYS_tgkill,
    SYS_timer_create,
    SYS_timer_delete,
    SYS_timer_getoverrun,
    SYS_timer_gettime,
    SYS_timer_settime,
    SYS_timerfd_create,
    SYS_timerfd_gettime,
    SYS_timerfd_settime,
    SYS_times,
    SYS_tkill,
    SYS_truncate,
    SYS_umask,
    SYS_uname,
    SYS_unlinkat,
    SYS_utimensat,
    SYS_vmsplice,
    SYS_wait4,
    SYS_waitid,
    SYS_write,
    SYS_writev,
];

/// The legacy x86_64 calls that newer architectures replaced with `*at` forms.
#[cfg(target_arch = "x86_64")]
const ALLOWED_ARCH: &[(&str, i64)] = syscalls![
    SYS_access,
    SYS_alarm,
    SYS_arch_prctl,
    SYS_creat,
    SYS_dup2,
    SYS_epoll_create,
    SYS_epoll_wait,
    SYS_eventfd,
    SYS_fork,
    SYS_fstat,
    SYS_futimesat,
    SYS_get_thread_area,
    SYS_getdents,
    SYS_getpgrp,
    SYS_inotify_init,
    SYS_lchown,
    SYS_link,
    SYS_lstat,
    SYS_mkdir,
    SYS_mknod,
    SYS_open,
    SYS_pause,
    SYS_pipe,
    SYS_poll,
    SYS_readlink,
    SYS_rename,
    SYS_rmdir,
    SYS_select,
    SYS_set_thread_area,
    SYS_signalfd,
    SYS_stat,
    SYS_symlink,
    SYS_time,
    SYS_unlink,
    SYS_utime,
    SYS_utimes,
    SYS_vfork,
];
#[cfg(not(target_arch = "x86_64"))]
const ALLOWED_ARCH: &[(&str, i64)] = &[];

/// Never allowed: listed so the tests can check that none slipped into the
/// allow-list, and so the golden listing shows them absent.
pub const DENIED: &[(&str, i64)] = syscalls![
    SYS_mount,
    SYS_umount2,
    SYS_pivot_root,
    SYS_chroot,
    SYS_ptrace,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_keyctl,
    SYS_add_key,
    SYS_request_key,
    SYS_bpf,
    SYS_perf_event_open,
    SYS_userfaultfd,
    SYS_io_uring_setup,
    SYS_io_uring_enter,
    SYS_io_uring_register,
    SYS_kexec_load,
    SYS_kexec_file_load,
    SYS_init_module,
    SYS_finit_module,
    SYS_delete_module,
    SYS_setns,
    SYS_open_by_handle_at,
    SYS_name_to_handle_at,
    SYS_reboot,
    SYS_swapon,
    SYS_swapoff,
    SYS_acct,
    SYS_syslog,
    SYS_open_tree,
    SYS_move_mount,
    SYS_fsopen,
    SYS_fsconfig,
    SYS_fsmount,
    SYS_fspick,
    SYS_mount_setattr,
    SYS_pidfd_getfd,
    SYS_process_madvise,
    SYS_kcmp,
    SYS_fanotify_init,
    SYS_quotactl,
    SYS_settimeofday,
    SYS_clock_settime,
    SYS_clock_adjtime,
    SYS_adjtimex,
    SYS_sethostname,
    SYS_setdomainname,
    SYS_migrate_pages,
    SYS_move_pages,
    SYS_lookup_dcookie,
    SYS_vhangup,
    SYS_clone3,
];

/// The namespace flags of clone(2); CLONE_NEWTIME shares a bit with the exit
/// signal there and only exists for unshare and clone3.
const CLONE_NAMESPACES: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;
const CLONE_NEWTIME: u64 = 0x80;

// ioctl request numbers are c_ulong with glibc and c_int with musl.
#[allow(clippy::unnecessary_cast)]
const TIOCSTI: u64 = libc::TIOCSTI as u64;
#[allow(clippy::unnecessary_cast)]
const TIOCLINUX: u64 = libc::TIOCLINUX as u64;

/// personality(2) values a program may set: Linux, 32-bit Linux, UNAME26,
/// both, and the 0xffffffff query. ADDR_NO_RANDOMIZE and friends are refused.
const PERSONALITIES: [u64; 5] = [0, 0x0008, 0x0002_0000, 0x0002_0008, 0xffff_ffff];
/// Socket families a Tier C sandbox may create: its unix sockets reach only
/// what its own root holds (the mount namespace), abstract ones only its own
/// network namespace's (or, with the host's network, what Landlock's scope
/// leaves).
const SOCKET_FAMILIES_TIER_C: [i32; 4] = [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK];
/// Socket families a Tier B sandbox with network may create. Never a unix
/// socket: without a mount namespace one reaches any daemon on the host by its
/// path (a session bus, a container engine, palisaded itself), and Landlock
/// does not cover `connect` to a path. Without network, `socket` is refused
/// altogether. `socketpair` stays: it reaches nothing outside.
const SOCKET_FAMILIES_TIER_B: [i32; 3] = [libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK];

/// System V IPC and POSIX message queues: objects of the IPC namespace, which
/// a Tier B sandbox shares with the host (a segment or queue of the same uid
/// would be open to it). Tier C has an IPC namespace of its own.
const HOST_IPC: [i64; 18] = [
    libc::SYS_msgctl,
    libc::SYS_msgget,
    libc::SYS_msgrcv,
    libc::SYS_msgsnd,
    libc::SYS_semctl,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semtimedop,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_shmdt,
    libc::SYS_shmget,
    libc::SYS_mq_getsetattr,
    libc::SYS_mq_notify,
    libc::SYS_mq_open,
    libc::SYS_mq_timedreceive,
    libc::SYS_mq_timedsend,
    libc::SYS_mq_unlink,
];

/// Which variant of the default program a sandbox gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    pub tier: Tier,
    /// Whether sockets may be created at all (its own network namespace, or
    /// the host's network by policy).
    pub ip: bool,
    /// Whether new processes may be created (`no_fork` leaves threads only).
    pub fork: bool,
}

impl Profile {
    fn socket_families(self) -> &'static [i32] {
        match (self.ip, self.tier) {
            (false, _) => &[],
            (true, Tier::C) => &SOCKET_FAMILIES_TIER_C,
            (true, Tier::B) => &SOCKET_FAMILIES_TIER_B,
        }
    }

    fn allows(self, nr: i64) -> bool {
        (self.fork || !FORKING.contains(&nr)) && (self.tier == Tier::C || !HOST_IPC.contains(&nr))
    }

    const fn new(tier: Tier, ip: bool, fork: bool) -> Profile {
        Profile { tier, ip, fork }
    }

    /// Every profile a plan can ask for.
    pub const ALL: [Profile; 8] = [
        Profile::new(Tier::C, true, true),
        Profile::new(Tier::C, true, false),
        Profile::new(Tier::C, false, true),
        Profile::new(Tier::C, false, false),
        Profile::new(Tier::B, true, true),
        Profile::new(Tier::B, true, false),
        Profile::new(Tier::B, false, true),
        Profile::new(Tier::B, false, false),
    ];
}

#[derive(Debug, thiserror::Error)]
#[error("cannot compile the seccomp profile: {0}")]
pub struct SeccompError(String);

fn cond(arg: u8, len: Len, op: Op, value: u64) -> Result<Cond, SeccompError> {
    Cond::new(arg, len, op, value).map_err(|e| SeccompError(e.to_string()))
}

fn rule(conds: Vec<Cond>) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conds).map_err(|e| SeccompError(e.to_string()))
}

/// A syscall allowed only when one of its rules matches.
type Conditional = (&'static str, i64, Vec<SeccompRule>);

fn conditional_rules(profile: Profile) -> Result<Vec<Conditional>, SeccompError> {
    let Profile { fork, .. } = profile;
    let ioctl =
        vec![rule(vec![cond(1, Len::Dword, Op::Ne, TIOCSTI)?, cond(1, Len::Dword, Op::Ne, TIOCLINUX)?])?];
    let mut clone_conditions = vec![cond(0, Len::Qword, Op::MaskedEq(CLONE_NAMESPACES), 0)?];
    if !fork {
        // no_fork: threads only.
        let thread = libc::CLONE_THREAD as u64;
        clone_conditions.push(cond(0, Len::Qword, Op::MaskedEq(thread), thread)?);
    }
    let clone = vec![rule(clone_conditions)?];
    let unshare = vec![rule(vec![cond(0, Len::Qword, Op::MaskedEq(CLONE_NAMESPACES | CLONE_NEWTIME), 0)?])?];
    let personality = PERSONALITIES
        .iter()
        .map(|p| rule(vec![cond(0, Len::Dword, Op::Eq, *p)?]))
        .collect::<Result<_, _>>()?;
    let mut rules = vec![
        ("SYS_ioctl", libc::SYS_ioctl, ioctl),
        ("SYS_clone", libc::SYS_clone, clone),
        ("SYS_unshare", libc::SYS_unshare, unshare),
        ("SYS_personality", libc::SYS_personality, personality),
    ];
    let families = profile.socket_families();
    if !families.is_empty() {
        let socket = families
            .iter()
            .map(|f| rule(vec![cond(0, Len::Dword, Op::Eq, *f as u64)?]))
            .collect::<Result<_, _>>()?;
        rules.push(("SYS_socket", libc::SYS_socket, socket));
    }
    Ok(rules)
}

fn target_arch() -> Result<TargetArch, SeccompError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| SeccompError(e.to_string()))
}

fn audit_arch() -> u32 {
    match std::env::consts::ARCH {
        "aarch64" => 0xc000_00b7,
        "riscv64" => 0xc000_00f3,
        _ => 0xc000_003e,
    }
}

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_RET_K: u16 = 0x06;
const RET_ERRNO: u32 = 0x0005_0000;

/// Syscalls that create a process, refused under `no_fork` (clone stays, for threads only).
const FORKING: [i64; 2] = [libc::SYS_fork, libc::SYS_vfork];

/// The compiled default program of `profile`, cached.
pub fn default_program(profile: Profile) -> Result<&'static [BpfInstruction], SeccompError> {
    type Cell = OnceLock<Result<Vec<BpfInstruction>, String>>;
    static CELLS: [Cell; 8] = [const { Cell::new() }; 8];
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
    if program.len() > 4096 {
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

const BPF_JA: u16 = 0x05;
const BPF_JGE_K: u16 = 0x35;
const RET_ALLOW: u32 = 0x7fff_0000;

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

/// The syscalls the profile allows unconditionally, by name.
pub fn allowed_names() -> Vec<&'static str> {
    ALLOWED.iter().chain(ALLOWED_ARCH).map(|(n, _)| n.trim_start_matches("SYS_")).collect()
}

/// The syscalls allowed with argument rules (see [`conditional_rules`]).
const CONDITIONAL_NAMES: [(&str, i64); 5] = [
    ("SYS_ioctl", libc::SYS_ioctl),
    ("SYS_clone", libc::SYS_clone),
    ("SYS_unshare", libc::SYS_unshare),
    ("SYS_personality", libc::SYS_personality),
    ("SYS_socket", libc::SYS_socket),
];

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
fn evaluate(program: &[BpfInstruction], arch: u32, nr: u32, args: [u64; 6]) -> Option<(u32, bool)> {
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

/// Syscalls of the helper's monitor processes once the command runs (pid 1
/// of a Tier C sandbox): waiting for signals and children, relaying signals,
/// writing its status record, allocating for it, exiting.
const MONITOR: &[(&str, i64)] = syscalls![
    SYS_rt_sigtimedwait,
    SYS_rt_sigprocmask,
    SYS_rt_sigreturn,
    SYS_restart_syscall,
    SYS_wait4,
    SYS_waitid,
    SYS_kill,
    SYS_getpid,
    SYS_write,
    SYS_writev,
    SYS_close,
    SYS_brk,
    SYS_mmap,
    SYS_munmap,
    SYS_mremap,
    SYS_madvise,
    SYS_futex,
    SYS_sched_yield,
    SYS_exit,
    SYS_exit_group,
];

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

#[cfg(test)]
mod tests {
    use super::*;

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
