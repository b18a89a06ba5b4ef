//! The probe itself (see `main.rs`).

use crate::egress;

use nix::errno::Errno;
use std::io::{Read, Write};
use std::time::Duration;

pub(crate) type Outcome = Result<String, (Errno, String)>;

fn errno(e: impl Into<Errno>) -> (Errno, String) {
    (e.into(), String::new())
}

pub(crate) fn io(e: std::io::Error) -> (Errno, String) {
    (Errno::from_raw(e.raw_os_error().unwrap_or(0)), e.to_string())
}

fn sys(rc: libc::c_long) -> Result<libc::c_long, (Errno, String)> {
    Errno::result(rc).map_err(errno)
}

pub(crate) fn main() {
    if let Err((e, detail)) = run() {
        let _ = writeln!(std::io::stdout().lock(), "err {e:?} {detail}");
        std::process::exit(1)
    }
}

#[allow(clippy::too_many_lines, reason = "a table of the probe's verbs, one short arm each")]
fn run() -> Result<(), (Errno, String)> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // "-": the argument comes on stdin (a path the policy would refuse on the
    // command line, to test what the kernel does with it).
    let arg = |i: usize| match args.get(i).map(String::as_str) {
        Some("-") => {
            let mut s = String::new();
            let _ = std::io::stdin().read_to_string(&mut s);
            s
        }
        other => other.unwrap_or_default().to_string(),
    };
    let outcome = match args.first().map(String::as_str).unwrap_or("") {
        "read" => std::fs::read(arg(1))
            .map(|b| format!("{} bytes: {}", b.len(), String::from_utf8_lossy(&b)))
            .map_err(io),
        "write" => std::fs::write(arg(1), b"probe\n").map(|_| String::new()).map_err(io),
        "list" => std::fs::read_dir(arg(1))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .map_err(io),
        "put" => put(&args[1..]),
        "ops" => ops(&args[1..]),
        "rename" => std::fs::rename(arg(1), arg(2)).map(|_| String::new()).map_err(io),
        "truncate" => std::fs::OpenOptions::new()
            .write(true)
            .open(arg(1))
            .and_then(|f| f.set_len(arg(2).parse().unwrap_or(0)))
            .map(|_| String::new())
            .map_err(io),
        "link" => std::fs::hard_link(arg(1), arg(2)).map(|_| String::new()).map_err(io),
        "symlink" => std::os::unix::fs::symlink(arg(1), arg(2)).map(|_| String::new()).map_err(io),
        "connect" => connect(&arg(1)),
        "egress" => egress::run(&arg(1)),
        "egress-bind" => egress::bind(&arg(1)),
        "unix" => unix(&arg(1)),
        "fetch" => fetch(&arg(1)),
        "hold" => hold(&arg(1), arg(2).parse().unwrap_or(0), &arg(3)),
        "socketpair" => std::os::unix::net::UnixStream::pair().map(|_| String::new()).map_err(io),
        "limits" => limits(),
        "ifaces" => ifaces(),
        "pids" => pids(),
        "root" => Ok(root_view()),
        "serve" => serve(&arg(1)),
        "signal" => nix::sys::signal::kill(pid(&arg(1)), nix::sys::signal::Signal::SIGCONT)
            .map(|_| String::new())
            .map_err(errno),
        "ptrace" => nix::sys::ptrace::seize(pid(&arg(1)), nix::sys::ptrace::Options::empty())
            .map(|_| String::new())
            .map_err(errno),
        "mount" => mount(),
        "chroot" => chroot(),
        "userns" => {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map(|_| String::new()).map_err(errno)
        }
        "keyctl" => keyctl(),
        "bpf" => bpf(),
        "io_uring" => io_uring(),
        "status" => status(),
        "fds" => Ok(fds()),
        "env" => Ok(std::env::vars().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("\n")),
        "hostname" => nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).map_err(errno),
        "ids" => Ok(format!("uid={} gid={}", nix::unistd::getuid(), nix::unistd::getgid())),
        "cwd" => std::env::current_dir().map(|p| p.display().to_string()).map_err(io),
        "tiocsti" => tiocsti(),
        "forkbomb" => forkbomb(),
        "membomb" => membomb(arg(1).parse().unwrap_or(4096)),
        "spin" => spin(),
        "bigfile" => bigfile(&arg(1), arg(2).parse().unwrap_or(1024)),
        "hold-open" => hold_open(&arg(1)),
        "setuid-file" => setuid_file(&arg(1), arg(2).parse().unwrap_or(1)),
        "write-sleep" => {
            std::fs::write(arg(1), b"probe\n").map_err(io)?;
            std::thread::sleep(Duration::from_secs(arg(2).parse().unwrap_or(1)));
            Ok(String::new())
        }
        "fill" => fill(&args[1..]),
        "open-rw" => {
            std::fs::OpenOptions::new().read(true).write(true).open(arg(1)).map(|_| String::new()).map_err(io)
        }
        "sysv" => sysv(&arg(1), arg(2).parse().unwrap_or(0)),
        "traces" => traces(&arg(1)),
        "look" => Ok(look(&arg(1))),
        "no-landlock" => no_landlock(&args[1..]),
        "daemonize" => daemonize(&arg(1), arg(2) == "flood"),
        "sleep" => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
        "echo" => Ok(args[1..].join(" ")),
        // N lines `tick I`, MS milliseconds apart: output while a run goes on.
        "tick" => {
            for i in 0..arg(1).parse().unwrap_or(1) {
                println!("tick {i}");
                let _ = std::io::Write::flush(&mut std::io::stdout());
                std::thread::sleep(Duration::from_millis(arg(2).parse().unwrap_or(100)));
            }
            Ok(String::new())
        }
        "flood" => flood(),
        "pattern" => pattern(arg(1).parse().unwrap_or(0)),
        "readall" => Ok(readall(std::path::Path::new(&arg(1)))),
        "session" => Ok(format!(
            "pid={} sid={} pgid={}",
            nix::unistd::getpid(),
            nix::unistd::getsid(None).map(|p| p.as_raw()).unwrap_or(-1),
            nix::unistd::getpgrp()
        )),
        "ns" => Ok(namespaces()),
        "caller" => caller(&arg(1)),
        "cat" => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map(|_| s).map_err(io)
        }
        "exit" => std::process::exit(arg(1).parse().unwrap_or(0)),
        "kill-self" => {
            let sig = nix::sys::signal::Signal::try_from(arg(1).parse::<i32>().unwrap_or(9))
                .unwrap_or(nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::signal::raise(sig);
            Ok(String::new())
        }
        other => {
            eprintln!("probe: unknown check {other:?}");
            std::process::exit(2);
        }
    };
    let mut out = std::io::stdout().lock();
    match outcome {
        Ok(detail) => {
            let _ = writeln!(out, "ok {detail}");
            std::process::exit(0)
        }
        Err((e, detail)) => {
            let _ = writeln!(out, "err {e:?} {detail}");
            std::process::exit(1)
        }
    }
}

/// `mib` MiB, then mode 04755: a program the sandbox's uid may make setuid
/// on its own file (what copy-back must never carry over as another owner's).
fn setuid_file(path: &str, mib: usize) -> Outcome {
    use std::os::unix::fs::PermissionsExt;
    bigfile(path, mib)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o4755)).map_err(io)?;
    Ok("mode 4755".into())
}

/// Writes 16 MiB files into each directory until it is full; reports the
/// bytes written in all (what those mounts hold together). Bounded: never
/// more than 512 MiB in all, whatever the mounts would take.
fn fill(dirs: &[String]) -> Outcome {
    let chunk = vec![7u8; 1 << 20];
    let mut total = 0u64;
    for dir in dirs {
        'files: for i in 0.. {
            if total >= 512 << 20 {
                break;
            }
            let Ok(mut f) = std::fs::File::create(format!("{dir}/fill-{i}")) else { break };
            for _ in 0..16 {
                match f.write(&chunk) {
                    Ok(n) if n == chunk.len() => total += n as u64,
                    Ok(n) => {
                        total += n as u64;
                        break 'files;
                    }
                    Err(_) => break 'files,
                }
            }
        }
    }
    Ok(format!("total {total}"))
}

/// Opens an existing System V IPC object of the host by its key:
/// `shm` (and attaches it), `msg` or `sem`.
fn sysv(kind: &str, key: i32) -> Outcome {
    // SAFETY: the calls take integers; shmat maps the segment at an address
    // the kernel picks and the pointer is only compared.
    unsafe {
        match kind {
            "shm" => {
                let id = sys(libc::shmget(key, 0, 0) as libc::c_long)?;
                let at = libc::shmat(id as i32, std::ptr::null(), libc::SHM_RDONLY);
                if at as isize == -1 {
                    return Err(errno(Errno::last()));
                }
                Ok(format!("attached segment {id}"))
            }
            "msg" => sys(libc::msgget(key, 0) as libc::c_long).map(|id| format!("queue {id}")),
            _ => sys(libc::semget(key, 0, 0) as libc::c_long).map(|id| format!("semaphores {id}")),
        }
    }
}

/// The SysV message queue key `traces` leaves.
const TRACE_KEY: i32 = 0x5057;

/// Leaves what a run could leave to the next one in its sandbox: a file in
/// /tmp, a SysV message queue and shared memory segment, and a detached
/// process (`probe sleep TOKEN`); then reports, as `look` would, that they
/// are there (the counter-test of `look` run in a later sandbox).
fn traces(token: &str) -> Outcome {
    let step = |what: &'static str| move |(e, _): (Errno, String)| (e, what.to_string());
    std::fs::write(format!("/tmp/trace-{token}"), b"trace").map_err(io).map_err(step("file"))?;
    // SAFETY: the calls take integers only.
    unsafe {
        sys(libc::msgget(TRACE_KEY, libc::IPC_CREAT | 0o600) as libc::c_long).map_err(step("sysv"))?;
        sys(libc::shmget(TRACE_KEY, 4096, libc::IPC_CREAT | 0o600) as libc::c_long).map_err(step("shm"))?;
    }
    let child = detach_sleeper(token)?;
    match nix::sys::wait::waitpid(child, None) {
        Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => {}
        other => return Err((Errno::ECHILD, format!("sleeper's parent: {other:?}"))),
    }
    // The sleeper is seen once it has exec'd `probe sleep TOKEN` (an exec
    // that failed says so on stderr).
    let started = std::time::Instant::now();
    while !look(token).contains("process=yes") && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(look(token))
}

/// Which of the traces of `traces TOKEN` this process sees, and where it is
/// (host name and namespaces).
fn look(token: &str) -> String {
    let yes = |b: bool| if b { "yes" } else { "no" };
    let file = std::path::Path::new(&format!("/tmp/trace-{token}")).exists();
    // SAFETY: as in `traces`.
    let (sysv, shm) = unsafe { (libc::msgget(TRACE_KEY, 0) != -1, libc::shmget(TRACE_KEY, 0, 0) != -1) };
    let me = std::process::id().to_string();
    let process = std::fs::read_dir("/proc").into_iter().flatten().flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        // Processes only ("self" is this one), and not this one: a sleeper
        // exec'd as `probe sleep TOKEN`, not a fork still running as another.
        name.parse::<u32>().is_ok()
            && name != me
            && args.windows(2).any(|w| w == [b"sleep", token.as_bytes()])
    });
    let host = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    format!(
        "file={} sysv={} shm={} process={} host={host} ns={}",
        yes(file),
        yes(sysv),
        yes(shm),
        yes(process),
        namespaces()
    )
}

/// This process's namespaces, as their links read.
fn namespaces() -> String {
    ["user", "mnt", "pid", "net", "uts", "ipc", "cgroup"]
        .iter()
        .map(|n| std::fs::read_link(format!("/proc/self/ns/{n}")).map(|l| l.display().to_string()))
        .map(Result::unwrap_or_default)
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs a command under a seccomp filter that answers ENOSYS to Landlock's
/// system calls: a kernel without Landlock, as the command sees it.
fn no_landlock(command: &[String]) -> Outcome {
    use std::os::unix::process::CommandExt;
    const LD_ABS: u16 = 0x20;
    const JEQ: u16 = 0x15;
    const RET: u16 = 0x06;
    let f = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let enosys = 0x0005_0000 | libc::ENOSYS as u32;
    let program = [
        f(LD_ABS, 0, 0, 0),
        f(JEQ, 3, 0, libc::SYS_landlock_create_ruleset as u32),
        f(JEQ, 2, 0, libc::SYS_landlock_add_rule as u32),
        f(JEQ, 1, 0, libc::SYS_landlock_restrict_self as u32),
        f(RET, 0, 0, 0x7fff_0000),
        f(RET, 0, 0, enosys),
    ];
    let fprog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr() as *mut _ };
    nix::sys::prctl::set_no_new_privs().map_err(errno)?;
    // SAFETY: `fprog` points at `program`, which outlives the call.
    sys(unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &fprog) })?;
    let (cmd, rest) = command.split_first().ok_or((Errno::EINVAL, "no command".to_string()))?;
    Err(io(std::process::Command::new(cmd).args(rest).exec()))
}

/// Plays the broker for one run: reads a plan on stdin, names itself as the
/// plan's parent, spawns the helper (`path`) and waits. Killing this process
/// must kill the whole sandbox.
fn caller(helper: &str) -> Outcome {
    let mut bytes = Vec::new();
    std::io::stdin().read_to_end(&mut bytes).map_err(io)?;
    let mut plan = palisade_protocol::decode_plan(&bytes).map_err(|e| (Errno::EINVAL, e.to_string()))?;
    plan.parent_pid = std::process::id();
    let encoded = palisade_protocol::encode_plan(&plan).map_err(|e| (Errno::EINVAL, e.to_string()))?;
    let mut child = palisade_broker::engine::helper::spawn(palisade_broker::engine::helper::HelperCommand {
        warm: None,
        helper: helper.into(),
        cgroup_dir: None,
        stdin: palisade_broker::engine::helper::Io::Null,
        stdout: palisade_broker::engine::helper::Io::Inherit,
        stderr: palisade_broker::engine::helper::Io::Inherit,
        outer_limits: vec![],
    })
    .map_err(io)?;
    let fds = palisade_tests::open_descriptors(&plan);
    let sent = palisade_broker::engine::capture::sent(&plan, &fds).map_err(io)?;
    let fds = sent.fds();
    let channel = child.plan_channel.take().ok_or((Errno::EBADF, "no plan channel".to_string()))?;
    palisade_broker::engine::helper::send_plan(channel, &encoded, &fds).map_err(io)?;
    palisade_broker::engine::helper::release(&child.status).map_err(io)?;
    let status = child.wait().map_err(io)?;
    Ok(format!("helper exited: {status}"))
}

fn pid(s: &str) -> nix::unistd::Pid {
    nix::unistd::Pid::from_raw(s.parse().unwrap_or(0))
}

pub(crate) fn connect(addr: &str) -> Outcome {
    let addr: std::net::SocketAddr =
        addr.parse().map_err(|_| (Errno::EINVAL, format!("bad address {addr}")))?;
    std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)).map(|_| String::new()).map_err(io)
}

/// A server on `addr` (TCP) that says `hello` to each connection, forever.
fn serve(addr: &str) -> Outcome {
    let listener = std::net::TcpListener::bind(addr).map_err(io)?;
    for mut stream in listener.incoming().flatten() {
        let _ = stream.write_all(b"hello\n");
    }
    Ok(String::new())
}

/// Connects to a unix socket: a path, or `@name` for the abstract namespace.
fn unix(addr: &str) -> Outcome {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixStream};
    let stream = match addr.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name).and_then(|a| UnixStream::connect_addr(&a)),
        None => UnixStream::connect(addr),
    };
    stream.map(|_| String::new()).map_err(io)
}

/// Connects to the unix socket at `path` and reads what comes until it
/// closes (5 s at most): `ok` and that, trimmed.
fn fetch(path: &str) -> Outcome {
    let mut stream = std::os::unix::net::UnixStream::connect(path).map_err(io)?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(io)?;
    let mut got = String::new();
    stream.read_to_string(&mut got).map_err(io)?;
    Ok(got.trim().to_string())
}

/// A client of a broker's socket that never gets through: `n` connections,
/// each sent `first` (nothing, or the start of a hello), held open until
/// stdin ends (`held N` on stdout says they are all open). Then the broker's
/// answer on each, counted by kind (`none`: closed without one).
fn hold(socket: &str, n: usize, first: &str) -> Outcome {
    use palisade_protocol::wire::{Decoder, ServerMessage};
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = std::os::unix::net::UnixStream::connect(socket).map_err(io)?;
        // The broker may have answered and closed it already.
        let _ = s.write_all(first.as_bytes());
        held.push(s);
    }
    println!("held {n}");
    let _ = std::io::stdout().flush();
    let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for mut s in held {
        // An outer bound: the broker answers within seconds.
        s.set_read_timeout(Some(Duration::from_secs(30))).map_err(io)?;
        let mut answer = Vec::new();
        // A reset after the answer (the broker closed with the hello unread) ends it too.
        let _ = s.read_to_end(&mut answer);
        let mut d = Decoder::default();
        d.push(&answer);
        let kind = match d.next_message::<ServerMessage>() {
            Ok(Some(ServerMessage::Error(e))) => e.kind.name().to_string(),
            Ok(Some(other)) => format!("{other:?}"),
            _ => "none".into(),
        };
        *kinds.entry(kind).or_default() += 1;
    }
    Ok(kinds.iter().map(|(k, n)| format!("{k}={n}")).collect::<Vec<_>>().join(" "))
}

/// The soft limits the process runs under, as `/proc/self/limits` gives them.
fn limits() -> Outcome {
    let text = std::fs::read_to_string("/proc/self/limits").map_err(io)?;
    let soft = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l[name.len()..].split_whitespace().next())
            .unwrap_or("?")
            .to_string()
    };
    Ok(format!(
        "nofile={} core={} nproc={} fsize={} as={} data={} cpu={}",
        soft("Max open files"),
        soft("Max core file size"),
        soft("Max processes"),
        soft("Max file size"),
        soft("Max address space"),
        soft("Max data size"),
        soft("Max cpu time")
    ))
}

fn ifaces() -> Outcome {
    let text = std::fs::read_to_string("/proc/net/dev").map_err(io)?;
    Ok(text.lines().skip(2).filter_map(|l| l.split(':').next()).map(str::trim).collect::<Vec<_>>().join(","))
}

fn pids() -> Outcome {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .map_err(io)?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort();
    Ok(pids.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
}

/// The part of the root every sandbox has, as the command sees it: the
/// names in /dev and /dev/pts (sorted), its processes, and whether /dev,
/// /dev/shm and /proc take a new file (`yes`, or the error's name).
fn root_view() -> String {
    let names = |dir: &str| {
        let mut found: Vec<String> = std::fs::read_dir(dir)
            .map(|d| d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned())).collect())
            .unwrap_or_default();
        found.sort();
        found.join(",")
    };
    let takes = |path: &str| match std::fs::write(path, b"x") {
        Ok(()) => "yes".to_string(),
        Err(e) => format!("{:?}", Errno::from_raw(e.raw_os_error().unwrap_or(0))),
    };
    format!(
        "dev={} pts={} pids={} dev_write={} shm_write={} proc_write={}",
        names("/dev"),
        names("/dev/pts"),
        pids().unwrap_or_default(),
        takes("/dev/new"),
        takes("/dev/shm/new"),
        takes("/proc/new")
    )
}

/// Tries every route to a mount: in a new user+mount namespace, in a new mount
/// namespace, and (if neither could be made) in place on a scratch directory.
fn mount() -> Outcome {
    use nix::sched::{CloneFlags, unshare};
    let private = unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).is_ok()
        || unshare(CloneFlags::CLONE_NEWNS).is_ok();
    let target = if private { "/tmp".to_string() } else { format!("probe-mnt-{}", std::process::id()) };
    if !private {
        let _ = std::fs::create_dir(&target);
    }
    let r = nix::mount::mount(
        Some("tmpfs"),
        target.as_str(),
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    );
    if !private {
        if r.is_ok() {
            let _ = nix::mount::umount(target.as_str());
        }
        let _ = std::fs::remove_dir(&target);
    }
    r.map(|_| format!("private namespace: {private}")).map_err(errno)
}

fn chroot() -> Outcome {
    if nix::unistd::chroot(".").is_ok() {
        return Ok("in place".into());
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map_err(errno)?;
    nix::unistd::chroot(".").map(|_| "in a new user namespace".into()).map_err(errno)
}

fn keyctl() -> Outcome {
    const KEYCTL_GET_KEYRING_ID: libc::c_long = 0;
    const KEY_SPEC_SESSION_KEYRING: libc::c_long = -3;
    // SAFETY: keyctl with integer arguments only.
    sys(unsafe { libc::syscall(libc::SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 1) })
        .map(|id| format!("keyring {id}"))
}

fn bpf() -> Outcome {
    // BPF_MAP_CREATE of a one-entry array map.
    let mut attr = [0u32; 32];
    attr[0] = 2; // BPF_MAP_TYPE_ARRAY
    attr[1] = 4; // key_size
    attr[2] = 4; // value_size
    attr[3] = 1; // max_entries
    // SAFETY: `attr` is a valid, large enough attribute buffer that outlives the call.
    sys(unsafe { libc::syscall(libc::SYS_bpf, 0, attr.as_mut_ptr(), std::mem::size_of_val(&attr)) })
        .map(|fd| format!("map fd {fd}"))
}

fn io_uring() -> Outcome {
    let mut params = [0u8; 120];
    // SAFETY: `params` is a zeroed io_uring_params buffer that outlives the call.
    sys(unsafe { libc::syscall(libc::SYS_io_uring_setup, 1, params.as_mut_ptr()) })
        .map(|fd| format!("ring fd {fd}"))
}

fn status() -> Outcome {
    let text = std::fs::read_to_string("/proc/self/status").map_err(io)?;
    let keep = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"];
    Ok(text
        .lines()
        .filter(|l| keep.iter().any(|k| l.starts_with(&format!("{k}:"))))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join("="))
        .map(|l| l.replacen(":=", "=", 1))
        .collect::<Vec<_>>()
        .join(" "))
}

/// Open descriptors, found without opening any.
fn fds() -> String {
    (0..4096)
        .filter(|fd| {
            // SAFETY: F_GETFD on a descriptor number only inspects it.
            let flags = unsafe { libc::fcntl(*fd, libc::F_GETFD) };
            flags >= 0
        })
        .map(|fd: i32| fd.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn tiocsti() -> Outcome {
    let c: libc::c_char = b'#' as libc::c_char;
    // SAFETY: TIOCSTI reads one byte from `c`, which outlives the call.
    Errno::result(unsafe { libc::ioctl(0, libc::TIOCSTI, &c) }).map(|_| String::new()).map_err(errno)
}

/// Forks children that stay alive until fork fails; reports how many.
fn forkbomb() -> Outcome {
    let mut n = 0u32;
    loop {
        // SAFETY: the child only sleeps (async-signal-safe) until it is killed.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => loop {
                // SAFETY: pause has no arguments.
                unsafe { libc::pause() };
            },
            Ok(nix::unistd::ForkResult::Parent { .. }) => n += 1,
            Err(e) => return Err((e, format!("stopped after {n} forks"))),
        }
        if n >= 100_000 {
            return Ok(format!("{n} forks and never stopped"));
        }
    }
}

/// Allocates and touches memory in 16 MiB steps, up to `mib`.
fn membomb(mib: usize) -> Outcome {
    let mut held: Vec<Vec<u8>> = Vec::new();
    for step in 0..mib / 16 {
        let mut chunk = Vec::new();
        if let Err(e) = chunk.try_reserve_exact(16 << 20) {
            return Err((Errno::ENOMEM, format!("stopped after {} MiB: {e}", step * 16)));
        }
        chunk.resize(16 << 20, 1u8);
        held.push(chunk);
    }
    Ok(format!("allocated {mib} MiB"))
}

/// Reads every file it can find below `dir` (a walk the policy cannot
/// anticipate: names come from the directory listings, not the arguments).
/// Reports `path=content` for what it read and `path!ERRNO` for what it could not.
fn readall(dir: &std::path::Path) -> String {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) => {
                out.push(format!("{}!{:?}", d.display(), io(e).0));
                continue;
            }
        };
        for e in entries.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                _ => match std::fs::read(&p) {
                    Ok(b) => out.push(format!("{}={}", p.display(), String::from_utf8_lossy(&b))),
                    Err(e) => out.push(format!("{}!{:?}", p.display(), io(e).0)),
                },
            }
        }
    }
    out.sort();
    out.join(" ")
}

/// Writes to stdout until it cannot (the token in argv lets the host find it).
fn flood() -> Outcome {
    let chunk = vec![b'x'; 64 * 1024];
    let mut out = std::io::stdout().lock();
    loop {
        if let Err(e) = out.write_all(&chunk) {
            return Err(io(e));
        }
    }
}

/// `len` bytes of `palisade_tests::pattern` on stdout and as many (another
/// salt) on stderr, in pieces of many sizes taken in turn from each.
fn pattern(len: usize) -> Outcome {
    let (out, err) = (palisade_tests::pattern(len, 0), palisade_tests::pattern(len, 1));
    let sizes = [1, 100, 5000, 70_000, 300_000, 1 << 20, 17];
    let (mut o, mut e) = (std::io::stdout().lock(), std::io::stderr().lock());
    let mut at = 0;
    for size in sizes.iter().cycle() {
        if at == len {
            break;
        }
        let end = (at + size).min(len);
        o.write_all(&out[at..end]).and_then(|()| o.flush()).map_err(io)?;
        e.write_all(&err[at..end]).map_err(io)?;
        at = end;
    }
    Ok(String::new())
}

fn spin() -> Outcome {
    let mut x = 0u64;
    loop {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}

/// Writes up to `mib` MiB into `path`; reports how far it got.
fn bigfile(path: &str, mib: usize) -> Outcome {
    // Report EFBIG instead of dying of SIGXFSZ.
    // SAFETY: setting a signal to SIG_IGN installs no handler code.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let mut f = std::fs::File::create(path).map_err(io)?;
    let chunk = vec![7u8; 1 << 20];
    let mut written = 0usize;
    for _ in 0..mib {
        match f.write(&chunk) {
            Ok(n) if n == chunk.len() => written += n,
            Ok(n) => return Err((Errno::EFBIG, format!("short write after {} bytes", written + n))),
            Err(e) => return Err((io(e).0, format!("stopped after {written} bytes"))),
        }
    }
    Ok(format!("wrote {written} bytes"))
}

/// Holds the next open of `path` (a fanotify permission event: the opener
/// waits, whatever its flags): prints `held`; when a process opens the file,
/// prints `opened` and reads a line on stdin before letting the open go on.
/// A test acts at that moment, while the opener waits.
fn hold_open(path: &str) -> Outcome {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let path = std::ffi::CString::new(path).map_err(|e| (Errno::EINVAL, e.to_string()))?;
    let class = libc::FAN_CLASS_CONTENT | libc::FAN_CLOEXEC;
    // SAFETY: fanotify_init takes flags only and returns a new descriptor or -1.
    let fan = sys(unsafe { libc::fanotify_init(class, libc::O_RDONLY as u32) }.into())?;
    // SAFETY: a descriptor fanotify_init just returned, owned by nobody else.
    let fan = unsafe { OwnedFd::from_raw_fd(fan as i32) };
    let mark = libc::FAN_MARK_ADD;
    // SAFETY: a live descriptor and a NUL-terminated path that outlives the call.
    let marked = unsafe {
        libc::fanotify_mark(fan.as_raw_fd(), mark, libc::FAN_OPEN_PERM, libc::AT_FDCWD, path.as_ptr())
    };
    sys(marked.into())?;
    say("held");
    let mut ready = [libc::pollfd { fd: fan.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
    // SAFETY: one pollfd that lives through the call.
    if sys(unsafe { libc::poll(ready.as_mut_ptr(), 1, 60_000) }.into())? == 0 {
        return Err((Errno::ETIMEDOUT, "nobody opened the file".into()));
    }
    let mut event = std::mem::MaybeUninit::<libc::fanotify_event_metadata>::uninit();
    let size = std::mem::size_of::<libc::fanotify_event_metadata>();
    // SAFETY: reads at most `size` bytes into memory of that size.
    let n = sys(unsafe { libc::read(fan.as_raw_fd(), event.as_mut_ptr().cast(), size) } as libc::c_long)?;
    if n as usize != size {
        return Err((Errno::EIO, format!("an event of {n} bytes")));
    }
    // SAFETY: the kernel filled all `size` bytes of one event's metadata.
    let event = unsafe { event.assume_init() };
    // SAFETY: the event's descriptor is this process's, to close.
    let opened = unsafe { OwnedFd::from_raw_fd(event.fd) };
    say("opened");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).map_err(io)?;
    let answer = libc::fanotify_response { fd: opened.as_raw_fd(), response: libc::FAN_ALLOW };
    let size = std::mem::size_of::<libc::fanotify_response>();
    // SAFETY: writes `size` bytes from a response that lives through the call.
    sys(unsafe { libc::write(fan.as_raw_fd(), (&raw const answer).cast(), size) } as libc::c_long)?;
    Ok(String::new())
}

/// `line` on stdout at once.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The exit codes of `detach_sleeper`'s middle child, and of its sleeper
/// whose exec failed.
const FORK_FAILED: i32 = 3;
const EXEC_FAILED: i32 = 4;

/// Double-forks a process that calls setsid and sleeps with `token` in its
/// argv (so the host can find it); returns the pid of the first child, which
/// exits at once (0, or `FORK_FAILED`).
fn detach_sleeper(token: &str) -> Result<nix::unistd::Pid, (Errno, String)> {
    use nix::unistd::{ForkResult, fork, setsid};
    let exe = std::env::current_exe().map_err(io)?;
    // SAFETY: the probe is single-threaded, so no lock is held across the
    // fork; the children only call setsid, fork, exec, write to stderr and exit.
    match unsafe { fork() }.map_err(errno)? {
        ForkResult::Child => {
            let _ = setsid();
            // SAFETY: as above.
            match unsafe { fork() } {
                Ok(ForkResult::Child) => {
                    let err = std::process::Command::new(&exe).args(["sleep", token]).exec_replace();
                    eprintln!("probe: exec failed: {err}");
                    std::process::exit(EXEC_FAILED);
                }
                Ok(ForkResult::Parent { .. }) => std::process::exit(0),
                Err(e) => {
                    eprintln!("probe: fork the sleeper: {e}");
                    std::process::exit(FORK_FAILED);
                }
            }
        }
        ForkResult::Parent { child } => Ok(child),
    }
}

/// Leaves a double-forked, setsid sleeper carrying `token`, then sleeps, or
/// with `flood`, writes to stdout without end.
fn daemonize(token: &str, flood_after: bool) -> Outcome {
    detach_sleeper(token)?;
    println!("ok daemonized");
    let _ = std::io::stdout().flush();
    if flood_after {
        return flood();
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

trait ExecReplace {
    fn exec_replace(&mut self) -> std::io::Error;
}

impl ExecReplace for std::process::Command {
    fn exec_replace(&mut self) -> std::io::Error {
        std::os::unix::process::CommandExt::exec(self)
    }
}

/// `put PATH TEXT [PATH TEXT ...]`: each file written with TEXT, its
/// directories made first; the first failure ends it.
fn put(pairs: &[String]) -> Result<String, (Errno, String)> {
    for pair in pairs.chunks(2) {
        let path = std::path::Path::new(&pair[0]);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        std::fs::write(path, pair.get(1).map_or("", String::as_str)).map_err(io)?;
    }
    Ok(String::new())
}

/// `ops OP ARGS... [OP ARGS...]`, in order, the first failure ending them:
/// `put PATH TEXT`, `rm PATH` (a file, link or tree), `mv FROM TO`, `ln
/// TARGET LINK` (symbolic), `link PATH NEW` (a hard link), `chmod OCTAL PATH`, `mkdir PATH`, `sparse PATH
/// BYTES` (a file of that size that takes no block), `sleep SECS`.
fn ops(args: &[String]) -> Result<String, (Errno, String)> {
    use std::os::unix::fs::PermissionsExt;
    let mut i = 0;
    let arg = |k: usize| args.get(k).cloned().unwrap_or_default();
    while i < args.len() {
        let (op, a, b) = (args[i].as_str(), arg(i + 1), arg(i + 2));
        let taken = match op {
            "put" => put(&[a.clone(), b]).map(drop),
            "rm" => match std::fs::symlink_metadata(&a) {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&a).map_err(io),
                _ => std::fs::remove_file(&a).map_err(io),
            }
            .map(drop),
            "mv" => std::fs::rename(&a, &b).map_err(io),
            "ln" => std::os::unix::fs::symlink(&a, &b).map_err(io),
            "link" => std::fs::hard_link(&a, &b).map_err(io),
            "chmod" => {
                let mode = u32::from_str_radix(&a, 8).unwrap_or(0o644);
                std::fs::set_permissions(&b, std::fs::Permissions::from_mode(mode)).map_err(io)
            }
            "mkdir" => std::fs::create_dir_all(&a).map_err(io),
            // A file of B bytes that takes none (a hole).
            "sparse" => std::fs::File::create(&a).and_then(|f| f.set_len(b.parse().unwrap_or(0))).map_err(io),
            "sleep" => {
                std::thread::sleep(Duration::from_secs(a.parse().unwrap_or(1)));
                Ok(())
            }
            _ => return Err((Errno::EINVAL, format!("unknown op {op}"))),
        };
        taken.map_err(|(e, m)| (e, format!("{op} {a}: {m}")))?;
        i += match op {
            "put" | "mv" | "ln" | "link" | "chmod" | "sparse" => 3,
            _ => 2,
        };
    }
    Ok(String::new())
}
