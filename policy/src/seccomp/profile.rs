//! The profile: which syscalls a sandbox may make, and with which
//! arguments. Tables and rules only; [`super::compile`] turns them into BPF.

use super::SeccompError;
use palisade_protocol::Tier;
use seccompiler::{SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond, SeccompRule};

macro_rules! syscalls {
    ($($name:ident),* $(,)?) => { &[$((stringify!($name), libc::$name as i64)),*] };
}

/// Allowed whatever their arguments.
pub(super) const ALLOWED: &[(&str, i64)] = syscalls![
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
pub(super) const ALLOWED_ARCH: &[(&str, i64)] = syscalls![
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
pub(super) const ALLOWED_ARCH: &[(&str, i64)] = &[];

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
pub(super) const TIOCSTI: u64 = libc::TIOCSTI as u64;
#[allow(clippy::unnecessary_cast)]
pub(super) const TIOCLINUX: u64 = libc::TIOCLINUX as u64;

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
pub(super) const HOST_IPC: [i64; 18] = [
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

/// Syscalls that create a process, refused under `no_fork` (clone stays, for threads only).
pub(super) const FORKING: [i64; 2] = [libc::SYS_fork, libc::SYS_vfork];

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

    pub(super) fn allows(self, nr: i64) -> bool {
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

fn cond(arg: u8, len: Len, op: Op, value: u64) -> Result<Cond, SeccompError> {
    Cond::new(arg, len, op, value).map_err(|e| SeccompError(e.to_string()))
}

fn rule(conds: Vec<Cond>) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conds).map_err(|e| SeccompError(e.to_string()))
}

/// A syscall allowed only when one of its rules matches.
type Conditional = (&'static str, i64, Vec<SeccompRule>);

pub(super) fn conditional_rules(profile: Profile) -> Result<Vec<Conditional>, SeccompError> {
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

/// The syscalls the profile allows unconditionally, by name.
pub fn allowed_names() -> Vec<&'static str> {
    ALLOWED.iter().chain(ALLOWED_ARCH).map(|(n, _)| n.trim_start_matches("SYS_")).collect()
}

/// The syscalls allowed with argument rules (see [`conditional_rules`]).
pub(super) const CONDITIONAL_NAMES: [(&str, i64); 5] = [
    ("SYS_ioctl", libc::SYS_ioctl),
    ("SYS_clone", libc::SYS_clone),
    ("SYS_unshare", libc::SYS_unshare),
    ("SYS_personality", libc::SYS_personality),
    ("SYS_socket", libc::SYS_socket),
];

/// Syscalls of the helper's monitor processes once the command runs (pid 1
/// of a Tier C sandbox): reading the broker's word that releases the
/// command (its one `read`, on the status channel, before the command
/// runs), waiting for signals and children, relaying signals, writing its
/// status record, allocating for it, exiting.
pub(super) const MONITOR: &[(&str, i64)] = syscalls![
    SYS_read,
    SYS_rt_sigtimedwait,
    SYS_rt_sigprocmask,
    SYS_rt_sigreturn,
    SYS_restart_syscall,
    SYS_wait4,
    SYS_waitid,
    SYS_getrusage,
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
