//! Starting `palisade-helper` with its calling convention: the plan on fd 3
//! (a Unix stream socket, never argv; the descriptors of the host paths it
//! names come with it), the status channel on fd 4, and the run's cgroup
//! directory on fd 5 when there is one. The environment is empty.

use nix::fcntl::OFlag;
use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags, posix_spawn};
use nix::sys::signal::SigSet;
use nix::sys::stat::Mode;
use palisade_protocol::status::decode_records;
use palisade_protocol::{ExitReport, HelperRecord, WarmSpec};
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;

/// An rlimit resource.
pub use rustix::process::Resource;

/// An outer resource limit set on the helper process itself (hard and soft),
/// before it reads its plan: a bound the sandbox cannot lift, used by tests.
#[derive(Debug, Clone, Copy)]
pub struct OuterLimit {
    pub resource: Resource,
    pub value: u64,
}

/// What one of the helper's standard descriptors is.
#[derive(Debug)]
pub enum Io {
    /// `/dev/null`.
    Null,
    /// The caller's own.
    Inherit,
    /// A new pipe; the caller's end is in [`HelperChild`].
    Piped,
    /// This descriptor.
    Fd(OwnedFd),
}

/// A helper to start. It does nothing before it has its plan, which the
/// caller sends on [`HelperChild::plan_channel`] (with [`send_plan`]) once it
/// has placed the helper where it belongs (a cgroup v1 hierarchy), and its
/// command waits, the sandbox built, for the caller's [`release`].
pub struct HelperCommand {
    pub helper: PathBuf,
    pub cgroup_dir: Option<OwnedFd>,
    pub stdin: Io,
    pub stdout: Io,
    pub stderr: Io,
    pub outer_limits: Vec<OuterLimit>,
    /// A sandbox of the warm pool: the spec goes on fd 3 before anything
    /// else, and the helper builds it while its plan is decided.
    pub warm: Option<WarmSpec>,
}

pub struct HelperChild {
    pub pid: u32,
    /// A pidfd for the helper, opened before anyone could reap it: signals
    /// sent through it can never reach a recycled pid.
    pub pidfd: OwnedFd,
    /// Read end of the status channel.
    pub status: File,
    /// The broker's end of fd 3: send the plan here (see [`send_plan`]).
    pub plan_channel: Option<UnixStream>,
    /// The caller's ends of `Io::Piped` descriptors.
    pub stdin: Option<File>,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
    /// What it was built with ahead of its plan, if it is a warm pool's.
    pub warm: Option<WarmSpec>,
}

impl HelperChild {
    /// Reads every status record; call after the helper has exited (the
    /// channel reaches end-of-file when the last holder closes it).
    pub fn read_status(&mut self) -> io::Result<Vec<HelperRecord>> {
        read_status(&self.status).map(|(records, _)| records)
    }

    /// Waits for the helper to exit and reaps it.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        self.reap(0).map(|s| s.unwrap_or_else(|| ExitStatus::from_raw(0)))
    }

    /// Reaps the helper if it has exited.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.reap(libc::WNOHANG)
    }

    fn reap(&mut self, flags: i32) -> io::Result<Option<ExitStatus>> {
        let mut status = 0;
        loop {
            // SAFETY: waitpid writes the status into a local that outlives the call.
            let rc = unsafe { libc::waitpid(self.pid as libc::pid_t, &mut status, flags) };
            match rc {
                0 => return Ok(None),
                r if r > 0 => return Ok(Some(ExitStatus::from_raw(status))),
                _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => continue,
                _ => return Err(io::Error::last_os_error()),
            }
        }
    }

    /// SIGKILL to the helper (through its pidfd).
    pub fn kill(&mut self) -> io::Result<()> {
        pidfd_kill(&self.pidfd, libc::SIGKILL)
    }

    /// Kills and reaps a helper that will get no plan. A warm one's pid 1
    /// dies with it (its death signal), and with pid 1 the whole sandbox.
    pub fn discard(mut self) {
        if let Err(e) = self.kill().and_then(|()| self.wait().map(drop)) {
            tracing::warn!(pid = self.pid, "cannot discard a helper started ahead: {e}");
        }
    }
}

/// Most descriptors one status record brings: a plan's listeners, in one
/// `SCM_RIGHTS` message (the kernel's `SCM_MAX_FD`).
const STATUS_MAX_FDS: usize = palisade_protocol::plan::PLAN_MAX_LISTENERS;
/// Most bytes of records a helper may write on its status channel.
const STATUS_MAX_BYTES: usize = 1 << 20;

/// What was read of a status channel so far: whole records are decoded as
/// they arrive, in order, with the descriptors that came with them.
#[derive(Default)]
pub struct StatusRead {
    bytes: Vec<u8>,
    /// Bytes of `bytes` already decoded into `records`.
    decoded: usize,
    pub records: Vec<HelperRecord>,
    pub fds: Vec<OwnedFd>,
    pub ended: bool,
}

impl StatusRead {
    /// One `recvmsg` on `channel`: its bytes and descriptors, then every
    /// whole record they complete. An end of file sets `ended`, and so does
    /// `ECONNRESET`: a helper that ended before reading the broker's
    /// [`release`] closed the channel with that byte unread, which a Unix
    /// socket reports so once every byte sent before is read.
    pub fn receive(&mut self, channel: &File) -> io::Result<()> {
        use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
        let mut buf = [0u8; 16 * 1024];
        let mut cmsg = nix::cmsg_space!([RawFd; STATUS_MAX_FDS]);
        let mut iov = [io::IoSliceMut::new(&mut buf)];
        let msg =
            match recvmsg::<()>(channel.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
                Err(nix::errno::Errno::ECONNRESET) => {
                    self.ended = true;
                    return self.decode_whole(true);
                }
                other => other?,
            };
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(received) = c {
                for fd in received {
                    // SAFETY: SCM_RIGHTS installed this descriptor in this process; nothing else owns it.
                    self.fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "status record with too many descriptors",
            ));
        }
        let n = msg.bytes;
        if n == 0 {
            self.ended = true;
            return self.decode_whole(true);
        }
        self.bytes.extend_from_slice(&buf[..n]);
        if self.bytes.len() > STATUS_MAX_BYTES {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "status channel over 1 MiB"));
        }
        self.decode_whole(false)
    }

    /// Decodes the whole records received; at the end, a piece of one is an error.
    fn decode_whole(&mut self, at_end: bool) -> io::Result<()> {
        let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidData, e);
        loop {
            let rest = &self.bytes[self.decoded..];
            if rest.is_empty() {
                return Ok(());
            }
            match rest.first_chunk::<4>().map(|len| 4 + u32::from_be_bytes(*len) as usize) {
                Some(whole) if whole <= rest.len() => {
                    self.records.extend(decode_records(&rest[..whole]).map_err(invalid)?);
                    self.decoded += whole;
                }
                _ if at_end => return Err(invalid("truncated status record".into())),
                _ => return Ok(()),
            }
        }
    }

    /// Reads `channel` to its end.
    pub fn to_end(mut self, channel: &File) -> io::Result<StatusRead> {
        while !self.ended {
            self.receive(channel)?;
        }
        Ok(self)
    }
}

/// Reads a status channel to its end: the records, and the descriptors that
/// came with them (in order).
pub fn read_status(channel: &File) -> io::Result<(Vec<HelperRecord>, Vec<OwnedFd>)> {
    let read = StatusRead::default().to_end(channel)?;
    Ok((read.records, read.fds))
}

/// Sends an encoded plan and its descriptors (in the order of the plan's
/// `descriptors`) on a helper's fd 3, then closes the channel: the helper
/// reads to its end. The descriptors go with the first piece, in one
/// `SCM_RIGHTS` message. Blocks while the plan does not fit the socket's
/// buffer and the helper is not reading.
pub fn send_plan(channel: UnixStream, plan: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let first = plan.len().min(FIRST_PIECE_BYTES);
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &[ControlMessage::ScmRights(&raw)] };
    let sent = loop {
        match sendmsg::<()>(
            channel.as_raw_fd(),
            &[io::IoSlice::new(&plan[..first])],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other?,
        }
    };
    (&channel).write_all(&plan[sent..])
}

/// The broker's word that the run's start is on disk: one byte on the
/// helper's status channel (`status`, the broker's end), which its pid 1
/// (Tier B's reaper, a session command's helper) waits for before it
/// releases the command. Every caller that sends a plan sends this too,
/// once what must precede the command's first instruction is done. A
/// helper that already ended (its own failure, reported on the channel)
/// is not an error here.
pub fn release(status: &impl AsFd) -> io::Result<()> {
    use nix::sys::socket::{MsgFlags, send};
    loop {
        match send(status.as_fd().as_raw_fd(), &[1], MsgFlags::MSG_NOSIGNAL) {
            Ok(_) | Err(nix::errno::Errno::EPIPE | nix::errno::Errno::ECONNRESET) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The first piece of a plan, which carries its descriptors: what a Unix
/// socket's default buffer takes at once.
const FIRST_PIECE_BYTES: usize = 64 * 1024;

/// A descriptor duplicated to 10 or above (close-on-exec), so that placing
/// the helper's descriptors 0-5 can never overwrite a source before it is used.
fn high(fd: impl AsFd) -> io::Result<OwnedFd> {
    Ok(rustix::io::fcntl_dupfd_cloexec(fd, 10)?)
}

fn pipe() -> io::Result<(File, File)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    Ok((File::from(r), File::from(w)))
}

/// posix_spawn's file actions and attributes.
struct SpawnSetup {
    actions: PosixSpawnFileActions,
    attr: PosixSpawnAttr,
}

impl SpawnSetup {
    /// Empty signal mask and default dispositions for every signal in the
    /// child (the broker ignores SIGPIPE; the sandbox must not inherit that).
    fn new() -> io::Result<SpawnSetup> {
        let mut attr = PosixSpawnAttr::init()?;
        attr.set_flags(PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF)?;
        attr.set_sigmask(&SigSet::empty())?;
        attr.set_sigdefault(&SigSet::all())?;
        Ok(SpawnSetup { actions: PosixSpawnFileActions::init()?, attr })
    }

    fn dup2(&mut self, from: RawFd, to: RawFd) -> io::Result<()> {
        Ok(self.actions.add_dup2(from, to)?)
    }

    fn open_null(&mut self, to: RawFd) -> io::Result<()> {
        let flags = if to == 0 { OFlag::O_RDONLY } else { OFlag::O_WRONLY };
        Ok(self.actions.add_open(to, c"/dev/null", flags, Mode::empty())?)
    }
}

/// Starts the helper with `posix_spawn` (glibc: a vfork-style clone, so the
/// broker's address space is not copied, and no code of ours runs in the
/// child), an empty environment and descriptors 0-5 as the convention says.
pub fn spawn(cmd: HelperCommand) -> io::Result<HelperChild> {
    if let Some(e) = crate::fault::spawn_error() {
        return Err(e);
    }
    // A socket: the plan's descriptors come with it.
    let (plan_channel, plan) = UnixStream::pair()?;
    if let Some(spec) = &cmd.warm {
        // Into an empty socket's buffer: it cannot block.
        (&plan_channel).write_all(&spec.encode())?;
    }
    // A socket, not a pipe: the helper hands over descriptors on it.
    let (status_read, status_write) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Stream,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )?;
    let mut setup = SpawnSetup::new()?;
    // Every source is held above 9 until the spawn, so no placement overwrites another's source.
    let mut keep: Vec<OwnedFd> = Vec::new();
    let mut ours: [Option<File>; 3] = [None, None, None];
    for (target, io) in [cmd.stdin, cmd.stdout, cmd.stderr].into_iter().enumerate() {
        let source = match io {
            Io::Inherit => continue,
            Io::Null => {
                setup.open_null(target as RawFd)?;
                continue;
            }
            Io::Fd(fd) => high(fd)?,
            Io::Piped => {
                let (r, w) = pipe()?;
                let (theirs, mine) = if target == 0 { (r, w) } else { (w, r) };
                ours[target] = Some(mine);
                high(&theirs)?
            }
        };
        setup.dup2(source.as_raw_fd(), target as RawFd)?;
        keep.push(source);
    }
    let mut convention = vec![high(&plan)?, high(&status_write)?];
    if let Some(dir) = &cmd.cgroup_dir {
        convention.push(high(dir)?);
    }
    for (i, fd) in convention.iter().enumerate() {
        setup.dup2(fd.as_raw_fd(), 3 + i as RawFd)?;
    }
    let path = CString::new(cmd.helper.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in the helper's path"))?;
    // Empty, but for a test hook of debug builds (see crate::fault).
    let env: Vec<CString> = crate::fault::helper_env().into_iter().collect();
    let pid = posix_spawn(path.as_c_str(), &setup.actions, &setup.attr, &[&path], &env)?;
    drop((keep, convention, status_write, plan));
    // Until the child is handed over, a failure kills and reaps it (it has
    // not read its plan yet, so it has done nothing).
    let abandon = |e: io::Error| {
        // Our own child, not reaped yet: the pid is still its.
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(pid, None);
        e
    };
    let pid = pid.as_raw();
    let pidfd = pidfd_open(pid as u32).map_err(abandon)?;
    for limit in &cmd.outer_limits {
        let value = rustix::process::Rlimit { current: Some(limit.value), maximum: Some(limit.value) };
        let target = rustix::process::Pid::from_raw(pid);
        rustix::process::prlimit(target, limit.resource, value).map_err(|e| abandon(e.into()))?;
    }
    let pid = pid as u32;
    let [stdin, stdout, stderr] = ours;
    let plan_channel = Some(plan_channel);
    let warm = cmd.warm;
    Ok(HelperChild { pid, pidfd, status: File::from(status_read), plan_channel, stdin, stdout, stderr, warm })
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid as i32)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    Ok(rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?)
}

/// Sends `signal` through a pidfd. ESRCH (already exited) is not an error.
pub fn pidfd_kill(pidfd: &OwnedFd, signal: i32) -> io::Result<()> {
    let signal = rustix::process::Signal::from_named_raw(signal)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    match rustix::process::pidfd_send_signal(pidfd, signal) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The helper's resource usage, as `wait4` reported it.
pub(crate) struct Usage {
    pub user_ms: u64,
    pub system_ms: u64,
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl Usage {
    /// The usage the helper reported before its exit
    /// ([`HelperRecord::Reaped`]): its exit status is pid 1's, as its
    /// monitor passes it on (a signal as 128 + its number).
    pub fn reported((exit, user_us, system_us): (ExitReport, u64, u64)) -> Usage {
        let code = match exit {
            ExitReport::Code(code) => code,
            ExitReport::Signal(signal) => (128 + signal) & 0xff,
        };
        Usage { user_ms: user_us / 1000, system_ms: system_us / 1000, code: Some(code), signal: None }
    }
}

/// Sets or clears `O_NONBLOCK` on `file`.
pub(crate) fn nonblocking(file: &std::fs::File, on: bool) -> std::io::Result<()> {
    let fd = std::os::fd::AsFd::as_fd(file);
    let flags = nix::fcntl::OFlag::from_bits_truncate(nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL)?);
    let flags =
        if on { flags | nix::fcntl::OFlag::O_NONBLOCK } else { flags - nix::fcntl::OFlag::O_NONBLOCK };
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// Reaps the exited helper, with the resource usage of its whole waited-for tree.
pub(crate) fn reap(pid: u32) -> std::io::Result<Usage> {
    let mut status = 0;
    // SAFETY: rusage is plain old data; all-zero is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `status` and `ru` are valid for writing for the duration of the call.
    let rc = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut ru) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let ms = |tv: libc::timeval| tv.tv_sec as u64 * 1000 + tv.tv_usec as u64 / 1000;
    Ok(Usage {
        user_ms: ms(ru.ru_utime),
        system_ms: ms(ru.ru_stime),
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
    })
}
