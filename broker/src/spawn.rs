//! Starting `palisade-helper` with its calling convention: the plan on fd 3
//! (a sealed-size memfd, never argv), the status channel on fd 4, and the
//! run's cgroup directory on fd 5 when there is one. The environment is empty.

use palisade_protocol::HelperRecord;
use palisade_protocol::status::decode_records;
use std::fs::File;
use std::io::{self, Seek, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// An outer resource limit set on the helper process itself (hard and soft),
/// before it runs: a bound the sandbox cannot lift, used by tests.
#[derive(Debug, Clone, Copy)]
pub struct OuterLimit {
    pub resource: libc::__rlimit_resource_t,
    pub value: u64,
}

pub struct HelperCommand {
    pub helper: PathBuf,
    pub plan: Vec<u8>,
    pub cgroup_dir: Option<OwnedFd>,
    pub stdin: Stdio,
    pub stdout: Stdio,
    pub stderr: Stdio,
    pub outer_limits: Vec<OuterLimit>,
    /// Deliver the plan through a pipe the caller writes after spawning (so
    /// it can place the helper in cgroups first: the helper does nothing
    /// before it has read its plan).
    pub defer_plan: bool,
}

pub struct HelperChild {
    pub child: Child,
    /// A pidfd for the helper, opened before anyone could reap it: signals
    /// sent through it can never reach a recycled pid.
    pub pidfd: OwnedFd,
    /// Read end of the status channel.
    pub status: File,
    /// With `defer_plan`: write the plan here, then drop it.
    pub plan_writer: Option<File>,
}

impl HelperChild {
    /// Reads every status record; call after the helper has exited (the
    /// channel reaches end-of-file when the last holder closes it).
    pub fn read_status(&mut self) -> io::Result<Vec<HelperRecord>> {
        read_status(&self.status).map(|(records, _)| records)
    }
}

/// Reads a status channel to its end: the records, and the descriptors that
/// came with them (in order).
pub fn read_status(channel: &File) -> io::Result<(Vec<HelperRecord>, Vec<OwnedFd>)> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut bytes = Vec::new();
    let mut fds = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let mut cmsg = nix::cmsg_space!([RawFd; 4]);
        let mut iov = [io::IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(channel.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)?;
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(received) = c {
                // SAFETY: SCM_RIGHTS installed these descriptors in this process; nothing else owns them.
                fds.extend(
                    received
                        .into_iter()
                        .map(|fd| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }),
                );
            }
        }
        let n = msg.bytes;
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&buf[..n]);
        if bytes.len() > 1 << 20 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "status channel over 1 MiB"));
        }
    }
    let records = decode_records(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok((records, fds))
}

fn memfd_with(bytes: &[u8]) -> io::Result<File> {
    let fd = nix::sys::memfd::memfd_create(c"palisade-plan", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)?;
    let mut file = File::from(fd);
    file.write_all(bytes)?;
    file.rewind()?;
    Ok(file)
}

/// Moves `fds[i]` to descriptor `3 + i` in the child, between fork and exec.
/// Only async-signal-safe calls: first every source is duplicated above the
/// targets (so no target clobbers a source), then dup2 into place, which also
/// clears close-on-exec on the targets.
fn install_fds(fds: &[RawFd], limits: &[OuterLimit]) -> io::Result<()> {
    let mut high = [0; 3];
    for (i, fd) in fds.iter().enumerate() {
        // SAFETY: fcntl on a descriptor number; no memory is passed.
        high[i] = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 10) };
        if high[i] < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    for (i, fd) in high.iter().take(fds.len()).enumerate() {
        // SAFETY: dup2 between two descriptor numbers; no memory is passed.
        if unsafe { libc::dup2(*fd, 3 + i as RawFd) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    for limit in limits {
        let value = libc::rlimit { rlim_cur: limit.value, rlim_max: limit.value };
        // SAFETY: `value` is a valid rlimit that outlives the call.
        if unsafe { libc::setrlimit(limit.resource, &value) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

pub fn spawn(cmd: HelperCommand) -> io::Result<HelperChild> {
    let (plan, plan_writer) = if cmd.defer_plan {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        (File::from(r), Some(File::from(w)))
    } else {
        (memfd_with(&cmd.plan)?, None)
    };
    // A socket, not a pipe: the helper hands over descriptors on it.
    let (status_read, status_write) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Stream,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )?;
    let mut fds = vec![plan.as_raw_fd(), status_write.as_raw_fd()];
    if let Some(dir) = &cmd.cgroup_dir {
        fds.push(dir.as_raw_fd());
    }
    let limits = cmd.outer_limits.clone();
    let mut command = Command::new(&cmd.helper);
    command.env_clear().stdin(cmd.stdin).stdout(cmd.stdout).stderr(cmd.stderr);
    // SAFETY: the closure only calls async-signal-safe functions (fcntl, dup2, setrlimit).
    unsafe {
        command.pre_exec(move || install_fds(&fds, &limits));
    }
    let child = command.spawn()?;
    drop(status_write);
    drop(plan);
    let pidfd = pidfd_open(child.id())?;
    Ok(HelperChild { child, pidfd, status: File::from(status_read), plan_writer })
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as RawFd) })
}

/// Sends `signal` through a pidfd. ESRCH (already exited) is not an error.
pub fn pidfd_kill(pidfd: &OwnedFd, signal: i32) -> io::Result<()> {
    // SAFETY: pidfd_send_signal with a null siginfo; no memory is passed.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), signal, 0usize, 0u32) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            return Err(e);
        }
    }
    Ok(())
}
