//! One run: spawn the helper, feed stdin, stream stdout and stderr as they
//! come, enforce the output quota and the deadline, kill the whole tree when
//! needed, then collect usage and build the result and its attestation.

use crate::attest::attestation;
use crate::broker::Grants;
use crate::cgroup::RunCgroup;
use crate::overlay;
use crate::pool::Pool;
use crate::requester::Requester;
use crate::spawn::{HelperChild, HelperCommand, Io, pidfd_kill, send_plan};
use crate::spawner::Spawner;
use palisade_policy::Resolved;
use palisade_protocol::wire::{
    ErrorKind, ErrorReply, RunRequest, RunResult, RunStatus, ServerMessage, Stream,
};
use palisade_protocol::{ExitReport, HelperRecord, Tier, encode_plan};
use std::future::Future;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

/// After the helper exits, how long stray holders of the output pipes may keep
/// them open before the run is finished without their end-of-file.
const DRAIN_GRACE: Duration = Duration::from_millis(200);
/// Tier B: time between SIGTERM (the helper kills its descendants) and SIGKILL.
const TERM_GRACE: Duration = Duration::from_millis(500);
/// A timer that is armed later.
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);
/// Once a run has ended (deadline, quota, cancel), how long a message to a
/// client that does not read may stay unsent before the client is given up.
const SEND_GRACE: Duration = Duration::from_secs(5);
/// How long `Started` may wait to go out with the run's first output or its
/// result: a short run's whole answer is then one write, read by the client
/// in one wake-up. A longer run has it sent when this has passed.
const STARTED_HOLD: Duration = Duration::from_millis(20);
/// Output waiting in a pipe is spliced into a client's socket from this size
/// on; less is read, to go out with its frame's header in one write.
const SPLICE_MIN_BYTES: usize = 16 * 1024;

/// Where a run's messages go. `false`: the client is gone.
pub trait Sink {
    fn send(&mut self, msg: ServerMessage) -> impl Future<Output = bool> + Send;

    /// One piece of output; the same as sending `ServerMessage::Output`, which
    /// a sink may do without copying `data` into a message first.
    fn send_output(&mut self, stream: Stream, data: &[u8]) -> impl Future<Output = bool> + Send {
        self.send(ServerMessage::Output { stream, data: data.to_vec() })
    }

    /// Whether [`Sink::splice_output`] moves output without copying it.
    fn splices(&self) -> bool {
        false
    }

    /// The next `len` bytes of `pipe` (a pipe holding at least that many,
    /// read by no one else) as one piece of output. A sink that
    /// [`splices`](Sink::splices) moves them into its socket with `splice(2)`;
    /// this default reads them and sends them as [`Sink::send_output`] does.
    fn splice_output(
        &mut self,
        stream: Stream,
        pipe: BorrowedFd<'_>,
        len: usize,
    ) -> impl Future<Output = bool> + Send
    where
        Self: Send,
    {
        async move {
            let mut data = vec![0u8; len];
            match read_exact_now(pipe, &mut data) {
                Ok(()) => self.send_output(stream, &data).await,
                Err(e) => {
                    tracing::error!("reading output the pipe said it held: {e}");
                    false
                }
            }
        }
    }

    /// Keeps `msg` to go out in front of the next message, in the same write
    /// (one wake-up of the client instead of two). `false`: this sink does
    /// not hold messages, and the caller sends it now.
    fn hold(&mut self, _msg: &ServerMessage) -> bool {
        false
    }

    /// Writes what [`Sink::hold`] kept, if anything.
    fn flush(&mut self) -> impl Future<Output = bool> + Send {
        std::future::ready(true)
    }

    /// A send was dropped half done: nothing more can go through this sink.
    fn abandon(&mut self) {}
}

/// Reads `buf.len()` bytes that `fd` (non-blocking) already holds.
pub(crate) fn read_exact_now(fd: BorrowedFd<'_>, mut buf: &mut [u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match nix::unistd::read(fd, buf) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Bytes waiting in a pipe (`FIONREAD`); 0 also at its end.
fn pipe_holds(pipe: &pipe::Receiver) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which is valid for it.
    let rc = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(pipe), libc::FIONREAD, &mut n) };
    if rc < 0 { 0 } else { n.max(0) as usize }
}

/// Awaits a send to the client while the run's deadline and cancellation
/// stay in force: a client that stops reading cannot hold a sandbox past
/// either. Once the run has ended, a send still stuck after [`SEND_GRACE`]
/// is dropped (`false`: the client is given up, its sink abandoned). A client
/// gone while the run goes on cancels the run.
macro_rules! watched_send {
    ($send:expr, $sink:expr, $deadline:ident, $cancel:ident, $ended:ident, $exited:expr, $kill:ident, $signal:expr) => {{
        let sent = {
            let send = $send;
            tokio::pin!(send);
            let grace = tokio::time::sleep(if $ended.is_some() { SEND_GRACE } else { NEVER });
            tokio::pin!(grace);
            loop {
                tokio::select! {
                    ok = &mut send => break Some(ok),
                    _ = &mut $deadline, if $ended.is_none() && !$exited => {
                        $ended = Some(RunStatus::TimedOut);
                        $kill($signal);
                        grace.as_mut().reset(tokio::time::Instant::now() + SEND_GRACE);
                    }
                    _ = &mut $cancel, if $ended.is_none() && !$exited => {
                        $ended = Some(RunStatus::Cancelled);
                        $kill($signal);
                        grace.as_mut().reset(tokio::time::Instant::now() + SEND_GRACE);
                    }
                    _ = &mut grace => break None,
                }
            }
        };
        let connected = match sent {
            Some(ok) => ok,
            None => {
                $sink.abandon();
                false
            }
        };
        if !connected && $ended.is_none() {
            $ended = Some(RunStatus::Cancelled);
            $kill($signal);
        }
        connected
    }};
}

/// A decided run: its id, its plan and limits, and what it was given of the
/// host.
#[derive(Clone, Copy)]
pub struct Run<'a> {
    pub id: u64,
    pub resolved: &'a Resolved,
    pub grants: &'a Grants,
}

pub struct Engine {
    spawner: Spawner,
    helper: PathBuf,
    pool: Arc<Pool>,
}

fn failure(kind: ErrorKind, message: impl Into<String>) -> ErrorReply {
    ErrorReply::new(kind, message)
}

struct Usage {
    user_ms: u64,
    system_ms: u64,
    max_rss_bytes: u64,
    code: Option<i32>,
    signal: Option<i32>,
}

impl Engine {
    /// `prespawn`: helpers kept started ahead of requests (see [`Pool`]).
    pub fn new(spawner: Spawner, helper: PathBuf, prespawn: usize) -> Engine {
        let pool = Pool::new(spawner.clone(), helper.clone(), prespawn);
        Engine { spawner, helper, pool }
    }

    /// Starts the helpers kept ahead of requests; call inside the runtime.
    pub fn warm_up(&self) {
        self.pool.refill();
    }

    async fn spawn_fresh(
        &self,
        request: &RunRequest,
        cgroup: Option<&RunCgroup>,
    ) -> Result<HelperChild, ErrorReply> {
        let io_err = |e: std::io::Error| failure(ErrorKind::RuntimeFailure, e.to_string());
        self.spawner
            .spawn(HelperCommand {
                helper: self.helper.clone(),
                cgroup_dir: cgroup.map(RunCgroup::open_dir).transpose().map_err(io_err)?.flatten(),
                stdin: if request.stdin.is_empty() { Io::Null } else { Io::Piped },
                stdout: Io::Piped,
                stderr: Io::Piped,
                outer_limits: vec![],
            })
            .await
            .map_err(|e| {
                failure(ErrorKind::RuntimeFailure, format!("cannot start {}: {e}", self.helper.display()))
            })
    }

    pub fn helper(&self) -> &std::path::Path {
        &self.helper
    }

    /// Runs `run`. `cancel` completing (a client gone, a shutdown) kills it.
    pub async fn execute<S: Sink + Send>(
        &self,
        run: Run<'_>,
        request: &RunRequest,
        sink: &mut S,
        cancel: impl Future<Output = ()> + Send,
        cgroup: Option<&RunCgroup>,
    ) -> Result<RunResult, ErrorReply> {
        let Run { id: run_id, resolved, grants } = run;
        let io_err = |e: std::io::Error| failure(ErrorKind::RuntimeFailure, e.to_string());
        let plan =
            encode_plan(&resolved.plan).map_err(|e| failure(ErrorKind::RuntimeFailure, e.to_string()))?;
        let tier = resolved.plan.tier();
        let started = Instant::now();
        let pooled = if cgroup.is_none() { self.pool.take() } else { None };
        let mut helper = match pooled {
            Some(h) => h,
            None => self.spawn_fresh(request, cgroup).await?,
        };
        let pid = helper.pid;
        let spawned_us = started.elapsed().as_micros();
        tracing::debug!(run_id, pid, %tier, "helper started");
        if let Some(channel) = helper.plan_channel.take() {
            // cgroup v1: the broker places the helper before it has its plan.
            let handed = cgroup.map_or(Ok(()), |c| c.place(pid)).and_then(|()| {
                hand_over(channel, plan, &grants.descriptors)
                    .map_err(|e| format!("cannot hand the helper its plan: {e}"))
            });
            if let Err(e) = handed {
                let _ = pidfd_kill(&helper.pidfd, libc::SIGKILL);
                let _ = reap(pid);
                return Err(failure(ErrorKind::RuntimeFailure, e));
            }
        }
        // SAFETY: an OwnedFd's descriptor stays open as long as the AsyncFd owns it.
        let pidfd = unsafe { AsyncFd::register(helper.pidfd) }.map_err(|e| io_err(e.into()))?;
        let out = pipe_reader(helper.stdout.take()).map_err(io_err)?;
        let err = pipe_reader(helper.stderr.take()).map_err(io_err)?;
        if let Some(stdin) = helper.stdin.take().filter(|_| !request.stdin.is_empty()) {
            let mut tx = pipe::Sender::from_owned_fd(OwnedFd::from(stdin)).map_err(io_err)?;
            let data = request.stdin.clone();
            // A command that does not read its stdin must not hold up the run.
            tokio::spawn(async move {
                let _ = tx.write_all(&data).await;
            });
        }
        let kill = |signal: i32| {
            // The cgroup holds every process of the run, whatever it did.
            if let Some(c) = cgroup {
                c.kill();
            }
            if let Err(e) = pidfd_kill(pidfd.get_ref(), signal) {
                tracing::error!(run_id, pid, "cannot signal the helper: {e}");
            }
        };
        // Tier C: SIGKILL to the helper takes pid 1 of the sandbox with it, and
        // with it the whole pid namespace. Tier B: SIGTERM lets the helper (a
        // subreaper) kill every descendant before it exits.
        let first_signal = if tier == Tier::C { libc::SIGKILL } else { libc::SIGTERM };

        let max = resolved.max_output_bytes;
        let (mut total, mut stdout_bytes, mut stderr_bytes) = (0u64, 0u64, 0u64);
        let chunk_bytes = resolved.capture_chunk_bytes;
        let (mut out_buf, mut err_buf) = (vec![0u8; chunk_bytes], vec![0u8; chunk_bytes]);
        let (mut out_open, mut err_open, mut exited) = (true, true, false);
        let mut ended: Option<RunStatus> = None;
        let deadline = tokio::time::sleep(resolved.timeout);
        let drain = tokio::time::sleep(NEVER);
        let escalate = tokio::time::sleep(NEVER);
        let started_msg = ServerMessage::Started { run_id, executor: tier.into() };
        let mut started_held = sink.hold(&started_msg);
        let release_started = tokio::time::sleep(if started_held { STARTED_HOLD } else { NEVER });
        tokio::pin!(deadline, drain, escalate, cancel, release_started);
        let mut connected = started_held
            || watched_send!(
                sink.send(started_msg),
                sink,
                deadline,
                cancel,
                ended,
                exited,
                kill,
                first_signal
            );
        let mut escalation_armed = false;
        let mut exited_us = 0;

        let splices = sink.splices();
        while !(exited && !out_open && !err_open) {
            let mut ready: Option<Stream> = None;
            let mut release = false;
            tokio::select! {
                _ = &mut release_started, if started_held => release = true,
                r = out.readable(), if out_open => match r {
                    Ok(()) => ready = Some(Stream::Stdout),
                    Err(_) => out_open = false,
                },
                r = err.readable(), if err_open => match r {
                    Ok(()) => ready = Some(Stream::Stderr),
                    Err(_) => err_open = false,
                },
                r = pidfd.readable(), if !exited => {
                    if let Ok(mut guard) = r {
                        guard.retain_ready();
                    }
                    exited = true;
                    exited_us = started.elapsed().as_micros();
                    drain.as_mut().reset(tokio::time::Instant::now() + DRAIN_GRACE);
                }
                _ = &mut deadline, if ended.is_none() && !exited => {
                    ended = Some(RunStatus::TimedOut);
                    kill(first_signal);
                }
                _ = &mut cancel, if ended.is_none() && !exited => {
                    ended = Some(RunStatus::Cancelled);
                    kill(first_signal);
                }
                _ = &mut escalate, if escalation_armed && !exited => {
                    escalation_armed = false;
                    kill(libc::SIGKILL);
                }
                _ = &mut drain, if exited => break,
            }
            if release {
                started_held = false;
                if connected {
                    connected = watched_send!(
                        sink.flush(),
                        sink,
                        deadline,
                        cancel,
                        ended,
                        exited,
                        kill,
                        first_signal
                    );
                }
            }
            if ended.is_some() && first_signal == libc::SIGTERM && !escalation_armed && !exited {
                escalation_armed = true;
                escalate.as_mut().reset(tokio::time::Instant::now() + TERM_GRACE);
            }
            let Some(stream) = ready else { continue };
            if ended == Some(RunStatus::QuotaExceeded) {
                continue;
            }
            let (pipe, buf, open) = match stream {
                Stream::Stdout => (&out, &mut out_buf, &mut out_open),
                Stream::Stderr => (&err, &mut err_buf, &mut err_open),
            };
            // What the pipe holds goes out by splice where the sink can take
            // it so; otherwise (and to see the pipe's end) it is read here.
            // Small pieces are read: header and bytes then go in one write.
            let held = if splices && connected { pipe_holds(pipe).min(chunk_bytes) } else { 0 };
            let held = if held >= SPLICE_MIN_BYTES { held } else { 0 };
            let n = if held > 0 {
                held
            } else {
                match pipe.try_read(buf) {
                    Ok(n) if n > 0 => n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    _ => {
                        *open = false;
                        continue;
                    }
                }
            };
            let room = max.saturating_sub(total);
            let deliver = (n as u64).min(room) as usize;
            if deliver < n {
                // Over the quota: the whole tree dies now, and no byte past the limit leaves.
                ended = Some(RunStatus::QuotaExceeded);
                kill(first_signal);
                out_open = false;
                err_open = false;
            }
            if deliver > 0 {
                total += deliver as u64;
                *(if stream == Stream::Stdout { &mut stdout_bytes } else { &mut stderr_bytes }) +=
                    deliver as u64;
                if connected {
                    // Whatever is held goes out in front of this piece.
                    started_held = false;
                    let send = async {
                        if held > 0 {
                            sink.splice_output(stream, pipe.as_fd(), deliver).await
                        } else {
                            sink.send_output(stream, &buf[..deliver]).await
                        }
                    };
                    connected =
                        watched_send!(send, sink, deadline, cancel, ended, exited, kill, first_signal);
                }
            }
        }
        if !exited {
            if ended.is_some() && first_signal == libc::SIGTERM {
                tokio::select! {
                    _ = pidfd.readable() => {}
                    _ = tokio::time::sleep(TERM_GRACE) => kill(libc::SIGKILL),
                }
            }
            let _ = pidfd.readable().await;
        }
        let wall_ms = started.elapsed().as_millis() as u64;
        let closed_us = started.elapsed().as_micros();
        let usage = reap(pid).map_err(io_err)?;
        self.pool.refill();
        let status_channel = helper.status;
        // Every holder of the channel is gone once the helper has exited, so
        // it reads to its end at once; should one linger, wait in a thread.
        let quick =
            nonblocking(&status_channel, true).and_then(|()| crate::spawn::read_status(&status_channel));
        let status = match quick {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => tokio::task::spawn_blocking(move || {
                nonblocking(&status_channel, false).and_then(|()| crate::spawn::read_status(&status_channel))
            })
            .await
            .map_err(|e| failure(ErrorKind::RuntimeFailure, e.to_string()))?,
            other => other,
        };
        let (records, fds) = status
            .map_err(|e| failure(ErrorKind::RuntimeFailure, format!("bad status from the helper: {e}")))?;
        let status_read_us = started.elapsed().as_micros();
        let mut fds = fds.into_iter();
        let mut overlays: Vec<(String, OwnedFd)> = Vec::new();
        let mut landlock = None;
        let mut exit = None;
        for r in records {
            match r {
                HelperRecord::Landlock(l) => landlock = Some(l),
                HelperRecord::Exit(e) => exit = Some(e),
                HelperRecord::Failed(f) if ended.is_none() => {
                    return Err(failure(ErrorKind::RuntimeFailure, format!("sandbox setup failed: {f}")));
                }
                HelperRecord::Failed(_) => {}
                HelperRecord::Overlay { target } => match fds.next() {
                    Some(fd) => overlays.push((target, fd)),
                    None => {
                        return Err(failure(
                            ErrorKind::RuntimeFailure,
                            "the helper sent an overlay without its descriptor",
                        ));
                    }
                },
            }
        }
        // Writes held in overlays: kept when the command ended by itself within
        // its bound, dropped when it filled it or palisade ended the run.
        let mut written_bytes = 0;
        if !overlays.is_empty() && ended.is_none() {
            if overlays.iter().any(|(_, fd)| overlay::full(fd)) {
                ended = Some(RunStatus::DiskLimitExceeded);
            } else if !overlays.iter().all(|(_, fd)| overlay::untouched(fd)) {
                let targets = copy_back_targets(&resolved.plan, grants, overlays)?;
                let requester = grants.requester.clone();
                written_bytes = tokio::task::spawn_blocking(move || commit_all(&requester, targets))
                    .await
                    .map_err(|e| failure(ErrorKind::RuntimeFailure, e.to_string()))??;
            }
        }
        let cg_usage = cgroup.map(RunCgroup::usage);
        if cg_usage.is_some_and(|u| u.oom_kills > 0) && ended.is_none() {
            ended = Some(RunStatus::MemoryLimitExceeded);
        }
        let status = ended.unwrap_or(match exit {
            Some(ExitReport::Code(code)) => RunStatus::Exited { code },
            Some(ExitReport::Signal(signal)) => RunStatus::Signaled { signal },
            None => match (usage.code, usage.signal) {
                (Some(code), _) => RunStatus::Exited { code },
                (_, Some(signal)) => RunStatus::Signaled { signal },
                _ => RunStatus::Signaled { signal: libc::SIGKILL },
            },
        });
        tracing::info!(run_id, pid, ?status, wall_ms, "run finished");
        tracing::debug!(
            run_id,
            spawned_us,
            exited_us,
            closed_us,
            status_read_us,
            done_us = started.elapsed().as_micros(),
            "run timeline"
        );
        Ok(RunResult {
            run_id,
            status,
            wall_ms,
            cpu_user_ms: cg_usage.map_or(usage.user_ms, |u| u.cpu_user_usec / 1000),
            cpu_system_ms: cg_usage.map_or(usage.system_ms, |u| u.cpu_system_usec / 1000),
            peak_memory_bytes: cg_usage.map_or(usage.max_rss_bytes, |u| u.peak_memory_bytes),
            memory_source: match cg_usage {
                Some(_) => palisade_protocol::wire::MemorySource::Cgroup,
                None => palisade_protocol::wire::MemorySource::Rusage,
            },
            stdout_bytes,
            stderr_bytes,
            written_bytes,
            attestation: attestation(request, resolved, landlock),
        })
    }
}

/// Sends the plan and the descriptors of its host paths on the helper's fd 3.
/// Into an empty socket a plan that fits its buffer goes at once; a larger
/// one is written from a blocking thread while the helper reads it.
fn hand_over(channel: UnixStream, plan: Vec<u8>, descriptors: &[OwnedFd]) -> std::io::Result<()> {
    if plan.len() <= 64 * 1024 {
        let fds: Vec<BorrowedFd<'_>> = descriptors.iter().map(AsFd::as_fd).collect();
        return send_plan(channel, &plan, &fds);
    }
    let owned = descriptors.iter().map(OwnedFd::try_clone).collect::<std::io::Result<Vec<_>>>()?;
    tokio::task::spawn_blocking(move || {
        let fds: Vec<BorrowedFd<'_>> = owned.iter().map(AsFd::as_fd).collect();
        send_plan(channel, &plan, &fds)
    });
    Ok(())
}

/// Each overlay the helper handed over, with the host directory it copies
/// back to: the descriptor opened at decision time, never the path again.
fn copy_back_targets(
    plan: &palisade_protocol::JailPlan,
    grants: &Grants,
    overlays: Vec<(String, OwnedFd)>,
) -> Result<Vec<(String, OwnedFd, OwnedFd)>, ErrorReply> {
    let mut out = Vec::new();
    for (target, upper) in overlays {
        let source = plan.mounts.iter().find_map(|m| match m {
            palisade_protocol::Mount::Overlay { source, target: t, .. } if *t == target => Some(source),
            _ => None,
        });
        let dest = source.and_then(|s| plan.descriptor(s)).and_then(|i| grants.descriptors.get(i));
        let (Some(source), Some(dest)) = (source, dest) else {
            return Err(failure(
                ErrorKind::RuntimeFailure,
                format!("the helper sent an overlay for {target}, which the plan has not"),
            ));
        };
        let dest = dest.try_clone().map_err(|e| failure(ErrorKind::RuntimeFailure, e.to_string()))?;
        out.push((source.clone(), upper, dest));
    }
    Ok(out)
}

/// Copies every overlay's changes back to its host directory, as the
/// requester (see [`crate::requester`]).
fn commit_all(requester: &Requester, targets: Vec<(String, OwnedFd, OwnedFd)>) -> Result<u64, ErrorReply> {
    let mut bytes = 0;
    for (source, upper, dest) in targets {
        let done = requester.act(|act| overlay::commit(&upper, &dest, act)).and_then(|r| r).map_err(|e| {
            failure(ErrorKind::RuntimeFailure, format!("copying the run's writes back to {source}: {e}"))
        })?;
        tracing::debug!(%source, files = done.files, bytes = done.bytes, removed = done.removed, "writes copied back");
        bytes += done.bytes;
    }
    Ok(bytes)
}

fn nonblocking(file: &std::fs::File, on: bool) -> std::io::Result<()> {
    let fd = std::os::fd::AsFd::as_fd(file);
    let flags = nix::fcntl::OFlag::from_bits_truncate(nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL)?);
    let flags =
        if on { flags | nix::fcntl::OFlag::O_NONBLOCK } else { flags - nix::fcntl::OFlag::O_NONBLOCK };
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// Pipe capacity asked for the command's stdout and stderr: fewer wake-ups
/// per byte than the default 64 KiB. Best effort (the kernel may refuse
/// past the user's pipe-buffer allowance; the default then stays).
const PIPE_BYTES: i32 = 256 * 1024;

fn pipe_reader<T: Into<OwnedFd>>(end: Option<T>) -> std::io::Result<pipe::Receiver> {
    let fd: OwnedFd = end.ok_or_else(|| std::io::Error::other("missing pipe"))?.into();
    // SAFETY: fcntl on a descriptor this function owns; no memory is passed.
    unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::F_SETPIPE_SZ, PIPE_BYTES) };
    pipe::Receiver::from_owned_fd(fd)
}

/// Reaps the exited helper, with the resource usage of its whole waited-for tree.
fn reap(pid: u32) -> std::io::Result<Usage> {
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
        max_rss_bytes: ru.ru_maxrss as u64 * 1024,
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
    })
}
