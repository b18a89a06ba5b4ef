//! One run: spawn the helper, feed stdin, stream stdout and stderr as they
//! come, enforce the output quota and the deadline, kill the whole tree when
//! needed, then collect usage and build the result and its attestation.
//!
//! The streaming is a state machine, [`Run`], over two seams: the client's
//! [`Sink`] and the process's [`Child`]; its tests drive it with neither a
//! kernel sandbox nor a client socket.

use crate::attest::attestation;
use crate::cgroup::{CgroupLimits, Cgroups, RunCgroup};
use crate::egress::Egress;
use crate::error::BrokerError;
use crate::helper::{HelperChild, HelperCommand, Io, StatusRead, pidfd_kill, send_plan};
use crate::overlay;
use crate::pool::{Pool, Slot};
use crate::requester::Requester;
use crate::service::Grants;
use crate::spawn_thread::Spawner;
use palisade_policy::Resolved;
use palisade_protocol::attest::Built;
use palisade_protocol::plan::Listener;
use palisade_protocol::wire::{RunRequest, RunResult, RunStatus, ServerMessage, Stream};
use palisade_protocol::{ExitReport, HelperRecord, JailPlan, LandlockReport, Tier, WarmSpec, encode_plan};
use std::future::Future;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::time::Sleep;

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
/// A plan up to this size is sent from the runtime's thread: an empty Unix
/// stream socket takes it whole at once (its default buffer is larger).
const PLAN_AT_ONCE_BYTES: usize = 64 * 1024;

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

/// A decided run: its id, its plan and limits, and what it was given of the
/// host.
#[derive(Clone, Copy)]
pub struct Planned<'a> {
    pub id: u64,
    pub resolved: &'a Resolved,
    pub grants: &'a Grants,
}

/// A helper holding its plan, in the run's cgroup if it has one.
struct Launched<'a> {
    helper: HelperChild,
    cgroup: Option<&'a RunCgroup>,
    started: Instant,
}

pub struct Engine {
    spawner: Spawner,
    helper: PathBuf,
    pool: Arc<Pool>,
    cgroups: Cgroups,
}

/// The helper's resource usage, as `wait4` reported it.
struct Usage {
    user_ms: u64,
    system_ms: u64,
    max_rss_bytes: u64,
    code: Option<i32>,
    signal: Option<i32>,
}

/// Microseconds since the run started, at each step (logged at debug level).
#[derive(Default)]
struct Timeline {
    spawned_us: u128,
    exited_us: u128,
    closed_us: u128,
    status_read_us: u128,
}

impl Engine {
    /// `prespawn`: helpers kept started ahead of requests, building `warm`
    /// before their plan (see [`Pool`]); `cgroups`: where runs' cgroups go.
    pub fn new(
        spawner: Spawner,
        helper: PathBuf,
        prespawn: usize,
        warm: Option<WarmSpec>,
        cgroups: Cgroups,
    ) -> Engine {
        let pool = Pool::new(spawner.clone(), helper.clone(), prespawn, warm, cgroups.clone());
        Engine { spawner, helper, pool, cgroups }
    }

    /// Starts the helpers kept ahead of requests; call inside the runtime.
    pub fn warm_up(&self) {
        self.pool.refill();
    }

    /// Starts one helper for the next run, now (see [`Pool::start_one`]).
    pub fn start_one(&self) {
        self.pool.start_one();
    }

    /// Helpers started from now on build nothing ahead of their plan.
    pub fn stop_warming(&self) {
        self.pool.stop_warming();
    }

    /// The pool, to close at shutdown ([`Pool::close`]).
    pub fn pool(&self) -> Arc<Pool> {
        Arc::clone(&self.pool)
    }

    async fn spawn_fresh(
        &self,
        request: &RunRequest,
        cgroup: Option<&RunCgroup>,
    ) -> Result<HelperChild, BrokerError> {
        self.spawner
            .spawn(HelperCommand {
                warm: None,
                helper: self.helper.clone(),
                cgroup_dir: cgroup.map(RunCgroup::open_dir).transpose()?.flatten(),
                stdin: if request.stdin.is_empty() { Io::Null } else { Io::Piped },
                stdout: Io::Piped,
                stderr: Io::Piped,
                outer_limits: vec![],
            })
            .await
            .map_err(|source| BrokerError::Spawn { helper: self.helper.clone(), source })
    }

    pub fn helper(&self) -> &std::path::Path {
        &self.helper
    }

    /// A slot of the pool for `plan`, run in a cgroup or not (see
    /// [`Pool::claim`]). A warm slot's cgroup becomes the run's: the caller
    /// names it in the plan before the run is recorded.
    pub async fn claim(&self, plan: &JailPlan, in_cgroup: bool) -> Option<Slot> {
        self.pool.claim(plan, in_cgroup).await
    }

    /// A helper holding its plan, and the run's cgroup when it has one
    /// (`wanted`: its name and limits): the claimed slot's, or a fresh
    /// helper in a new cgroup.
    async fn launch(
        &self,
        resolved: &Resolved,
        grants: &Grants,
        request: &RunRequest,
        wanted: Option<(&str, CgroupLimits)>,
        claimed: Option<Slot>,
    ) -> Result<(HelperChild, Option<RunCgroup>), BrokerError> {
        let plan = encode_plan(&resolved.plan)?;
        let (mut helper, cgroup) = match (claimed, wanted) {
            (Some(Slot { helper, cgroup: Some(cgroup) }), Some((name, limits))) if cgroup.name() == name => {
                if let Err(e) = cgroup.set_limits(limits) {
                    helper.discard();
                    return Err(BrokerError::CgroupCreate(e));
                }
                (helper, Some(cgroup))
            }
            (Some(Slot { helper, cgroup: None }), None) => (helper, None),
            (claimed, wanted) => {
                // A slot claimed for another cgroup than the plan's: not used.
                if let Some(slot) = claimed {
                    slot.discard();
                }
                let cgroup = wanted.map(|(name, limits)| self.cgroups.create(name, limits));
                let cgroup = cgroup.transpose().map_err(BrokerError::CgroupCreate)?;
                (self.spawn_fresh(request, cgroup.as_ref()).await?, cgroup)
            }
        };
        if let Some(channel) = helper.plan_channel.take() {
            // cgroup v1: the broker places the helper before it has its plan.
            let handed =
                cgroup.as_ref().map_or(Ok(()), |c| c.place(helper.pid)).map_err(BrokerError::from).and_then(
                    |()| hand_over(channel, plan, &grants.descriptors).map_err(BrokerError::HandOver),
                );
            if let Err(e) = handed {
                let _ = pidfd_kill(&helper.pidfd, libc::SIGKILL);
                let _ = reap(helper.pid);
                return Err(e);
            }
        }
        Ok((helper, cgroup))
    }

    /// Runs `planned` on the slot `claimed` by [`Engine::claim`] or a fresh
    /// helper, in a cgroup of this name and limits when `cgroup` says so
    /// (removed after the run, whatever happened in it). `cancel` completing
    /// (a client gone, a shutdown) kills it.
    pub async fn execute<S: Sink + Send>(
        &self,
        planned: Planned<'_>,
        request: &RunRequest,
        sink: &mut S,
        cancel: impl Future<Output = ()> + Send,
        cgroup: Option<(&str, CgroupLimits)>,
        claimed: Option<Slot>,
    ) -> Result<RunResult, BrokerError> {
        let started = Instant::now();
        let (helper, cgroup) =
            self.launch(planned.resolved, planned.grants, request, cgroup, claimed).await?;
        let launched = Launched { helper, cgroup: cgroup.as_ref(), started };
        let result = self.finish(planned, request, sink, cancel, launched).await;
        if let Some(c) = cgroup {
            let _ = tokio::task::spawn_blocking(move || c.remove()).await;
        }
        result
    }

    /// The run of a launched helper, to its result.
    async fn finish<S: Sink + Send>(
        &self,
        planned: Planned<'_>,
        request: &RunRequest,
        sink: &mut S,
        cancel: impl Future<Output = ()> + Send,
        launched: Launched<'_>,
    ) -> Result<RunResult, BrokerError> {
        let Planned { id: run_id, resolved, grants } = planned;
        let Launched { helper, cgroup, started } = launched;
        let tier = resolved.plan.tier();
        let built = if helper.warm.is_some() { Built::Warm } else { Built::Cold };
        let HelperChild { pid, pidfd, status, stdin, stdout, stderr, .. } = helper;
        let mut timeline = Timeline { spawned_us: started.elapsed().as_micros(), ..Timeline::default() };
        tracing::debug!(run_id, pid, %tier, ?built, "helper started");
        let (status, early, egress) = match serve_egress(resolved, status).await {
            Ok(served) => served,
            Err(e) => {
                // Nothing of the run may outlive its refusal.
                let _ = pidfd_kill(&pidfd, libc::SIGKILL);
                let _ = reap(pid);
                return Err(e);
            }
        };
        // SAFETY: an OwnedFd's descriptor stays open as long as the AsyncFd owns it.
        let pidfd = unsafe { AsyncFd::register(pidfd) }.map_err(std::io::Error::from)?;
        let pipes = [pipe_reader(stdout)?, pipe_reader(stderr)?];
        feed_stdin(stdin, &request.stdin)?;
        let bounds = Bounds {
            max_output_bytes: resolved.max_output_bytes,
            timeout: resolved.timeout,
            chunk_bytes: resolved.capture_chunk_bytes,
            // Tier C: SIGKILL to the helper takes pid 1 of the sandbox with it, and
            // with it the whole pid namespace. Tier B: SIGTERM lets the helper (a
            // subreaper) kill every descendant before it exits.
            first_signal: if tier == Tier::C { libc::SIGKILL } else { libc::SIGTERM },
        };
        let child = Helper { pidfd, cgroup, run_id, pid };
        let started_msg = ServerMessage::Started { run_id, executor: tier.into() };
        let streamed = Run::new(sink, child, pipes, bounds, cancel).stream(started_msg).await;
        timeline.exited_us = streamed.exited_at.map_or(0, |at| at.duration_since(started).as_micros());
        let egress_traffic = match egress {
            Some(e) => Some(e.finish().await),
            None => None,
        };
        let wall_ms = started.elapsed().as_millis() as u64;
        timeline.closed_us = started.elapsed().as_micros();
        let usage = reap(pid)?;
        self.pool.refill();
        let (records, fds) = read_status_channel(status, early).await?;
        timeline.status_read_us = started.elapsed().as_micros();
        let mut ended = streamed.ended;
        let report = Report::read(records, fds, ended)?;
        let written_bytes = keep_writes(resolved, grants, report.overlays, &mut ended).await?;
        let cg_usage = cgroup.map(RunCgroup::usage);
        if cg_usage.is_some_and(|u| u.oom_kills > 0) && ended.is_none() {
            ended = Some(RunStatus::MemoryLimitExceeded);
        }
        let status = ended.unwrap_or_else(|| exit_status(report.exit, &usage));
        tracing::info!(run_id, pid, ?status, wall_ms, "run finished");
        let Timeline { spawned_us, exited_us, closed_us, status_read_us } = timeline;
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
            stdout_bytes: streamed.stdout_bytes,
            stderr_bytes: streamed.stderr_bytes,
            written_bytes,
            attestation: attestation(request, resolved, report.landlock, egress_traffic, Some(built)),
        })
    }
}

/// How the command ended by itself: as the helper reported it, else as the
/// helper's own exit says.
fn exit_status(exit: Option<ExitReport>, usage: &Usage) -> RunStatus {
    match exit {
        Some(ExitReport::Code(code)) => RunStatus::Exited { code },
        Some(ExitReport::Signal(signal)) => RunStatus::Signaled { signal },
        None => match (usage.code, usage.signal) {
            (Some(code), _) => RunStatus::Exited { code },
            (_, Some(signal)) => RunStatus::Signaled { signal },
            _ => RunStatus::Signaled { signal: libc::SIGKILL },
        },
    }
}

/// Writes `data` to the command's stdin from a task of its own: a command
/// that does not read its stdin must not hold up the run. Without data, the
/// stdin is closed.
fn feed_stdin(stdin: Option<std::fs::File>, data: &[u8]) -> std::io::Result<()> {
    let Some(stdin) = stdin.filter(|_| !data.is_empty()) else { return Ok(()) };
    let mut tx = pipe::Sender::from_owned_fd(OwnedFd::from(stdin))?;
    let data = data.to_vec();
    tokio::spawn(async move {
        let _ = tx.write_all(&data).await;
    });
    Ok(())
}

/// Reads the helper's status channel to its end. Every holder of it is gone
/// once the helper has exited, so it reads to its end at once; should one
/// linger, the read waits in a thread.
async fn read_status_channel(
    channel: std::fs::File,
    read: StatusRead,
) -> Result<(Vec<HelperRecord>, Vec<OwnedFd>), BrokerError> {
    let mut read = read;
    let quick = nonblocking(&channel, true).and_then(|()| {
        while !read.ended {
            read.receive(&channel)?;
        }
        Ok(())
    });
    let read = match quick {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            tokio::task::spawn_blocking(move || {
                nonblocking(&channel, false).and_then(|()| read.to_end(&channel))
            })
            .await?
        }
        Err(e) => Err(e),
        Ok(()) => Ok(read),
    };
    read.map(|r| (r.records, r.fds)).map_err(BrokerError::Status)
}

/// Strict egress: the listeners the helper opened in the sandbox's network
/// namespace, served for the run. Without an egress plan, the channel as it is.
async fn serve_egress(
    resolved: &Resolved,
    status: std::fs::File,
) -> Result<(std::fs::File, StatusRead, Option<Egress>), BrokerError> {
    let Some(plan) = resolved.egress_plan.as_ref().filter(|_| !resolved.plan.listeners.is_empty()) else {
        return Ok((status, StatusRead::default(), None));
    };
    let (status, early, listeners) =
        read_listeners(status, &resolved.plan.listeners, resolved.timeout).await?;
    let egress = match listeners {
        Some(listeners) => Some(Egress::start(Arc::new(plan.clone()), listeners)?),
        None => None,
    };
    Ok((status, early, egress))
}

/// Strict egress: reads the status channel until the helper's listeners
/// come (it opens them as soon as the network namespace is up, before the
/// command runs), and takes them out of what was read. `None` when the
/// helper stopped before (a failure record, or the channel's end): the run
/// ends with that failure. Bounded by `within`, the run's own deadline.
async fn read_listeners(
    channel: std::fs::File,
    wanted: &[Listener],
    within: Duration,
) -> Result<(std::fs::File, StatusRead, Option<Vec<(Listener, OwnedFd)>>), BrokerError> {
    nonblocking(&channel, true)?;
    // SAFETY: a File's descriptor stays open as long as the AsyncFd owns it.
    let fd = unsafe { AsyncFd::register(channel) }.map_err(std::io::Error::from)?;
    let mut read = StatusRead::default();
    let found = tokio::time::timeout(within, async {
        loop {
            if let Some(at) = read.records.iter().position(|r| matches!(r, HelperRecord::Listeners(_))) {
                return Ok(Some(at));
            }
            if read.ended || read.records.iter().any(|r| matches!(r, HelperRecord::Failed(_))) {
                return Ok(None);
            }
            let mut ready = fd.readable().await?;
            match ready.try_io(|inner| read.receive(inner.get_ref())) {
                Ok(result) => result?,
                Err(_would_block) => continue,
            }
        }
    })
    .await
    .map_err(|_| {
        BrokerError::Status(std::io::Error::other("the helper did not open the egress listeners in time"))
    })?
    .map_err(BrokerError::Status)?;
    let channel = fd.into_inner();
    nonblocking(&channel, false)?;
    let Some(at) = found else { return Ok((channel, read, None)) };
    let HelperRecord::Listeners(sent) = read.records.remove(at) else { unreachable!("found above") };
    // The child may have sent an overlay's layer (a record with one
    // descriptor) before: the descriptors are in the order of the records.
    let before = read.records[..at].iter().filter(|r| matches!(r, HelperRecord::Overlay { .. })).count();
    if sent != wanted || read.fds.len() < before + sent.len() {
        return Err(BrokerError::Status(std::io::Error::other(format!(
            "the helper sent {} listeners with {} descriptors, the plan asked for {}",
            sent.len(),
            read.fds.len() - before.min(read.fds.len()),
            wanted.len()
        ))));
    }
    let fds: Vec<OwnedFd> = read.fds.drain(before..before + sent.len()).collect();
    Ok((channel, read, Some(sent.into_iter().zip(fds).collect())))
}

/// What the helper reported on its status channel.
struct Report {
    landlock: Option<LandlockReport>,
    exit: Option<ExitReport>,
    /// The upper layer of each overlay, by its target in the sandbox.
    overlays: Vec<(String, OwnedFd)>,
}

impl Report {
    /// The records in their order, with the descriptors that came with
    /// them. A failed step is the run's error, unless palisade had ended the
    /// run already (`ended`): the step may have failed of palisade's kill.
    fn read(
        records: Vec<HelperRecord>,
        fds: Vec<OwnedFd>,
        ended: Option<RunStatus>,
    ) -> Result<Report, BrokerError> {
        let mut fds = fds.into_iter();
        let mut report = Report { landlock: None, exit: None, overlays: Vec::new() };
        for r in records {
            match r {
                HelperRecord::Landlock(l) => report.landlock = Some(l),
                HelperRecord::Exit(e) => report.exit = Some(e),
                HelperRecord::Failed(f) if ended.is_none() => return Err(BrokerError::Helper(f)),
                HelperRecord::Failed(_) => {}
                // Read at the start of the run (strict egress), never here.
                HelperRecord::Listeners(_) => {
                    return Err(BrokerError::Status(std::io::Error::other(
                        "egress listeners after the command started",
                    )));
                }
                HelperRecord::Overlay { target } => {
                    let fd = fds.next().ok_or(BrokerError::OverlayWithoutDescriptor)?;
                    report.overlays.push((target, fd));
                }
            }
        }
        Ok(report)
    }
}

/// Writes held in overlays: kept when the command ended by itself within
/// its bound, dropped when it filled it (`ended` becomes
/// `DiskLimitExceeded`) or palisade ended the run. The bytes kept.
async fn keep_writes(
    resolved: &Resolved,
    grants: &Grants,
    overlays: Vec<(String, OwnedFd)>,
    ended: &mut Option<RunStatus>,
) -> Result<u64, BrokerError> {
    if overlays.is_empty() || ended.is_some() {
        return Ok(0);
    }
    if overlays.iter().any(|(_, fd)| overlay::full(fd)) {
        *ended = Some(RunStatus::DiskLimitExceeded);
        return Ok(0);
    }
    if overlays.iter().all(|(_, fd)| overlay::untouched(fd)) {
        return Ok(0);
    }
    let targets = copy_back_targets(&resolved.plan, grants, overlays)?;
    let requester = grants.requester.clone();
    tokio::task::spawn_blocking(move || commit_all(&requester, targets)).await?
}

/// The process side of a run, as its streaming sees it: when it has exited,
/// and how to kill it with everything it started.
pub(crate) trait Child {
    /// Completes once the process has exited (it is not reaped).
    fn exited(&self) -> impl Future<Output = ()> + Send;
    /// Sends `signal` to the process and everything it started.
    fn kill(&self, signal: i32);
}

/// A started helper.
struct Helper<'a> {
    /// Readable once the helper has exited.
    pidfd: AsyncFd<OwnedFd>,
    /// Holds every process of the run, whatever it did.
    cgroup: Option<&'a RunCgroup>,
    run_id: u64,
    pid: u32,
}

impl Child for Helper<'_> {
    async fn exited(&self) {
        if let Ok(mut guard) = self.pidfd.readable().await {
            guard.retain_ready();
        }
    }

    fn kill(&self, signal: i32) {
        if let Some(c) = self.cgroup {
            c.kill();
        }
        if let Err(e) = pidfd_kill(self.pidfd.get_ref(), signal) {
            tracing::error!(run_id = self.run_id, pid = self.pid, "cannot signal the helper: {e}");
        }
    }
}

/// What bounds a run's streaming.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// stdout and stderr together; not one byte more reaches the client.
    pub max_output_bytes: u64,
    pub timeout: Duration,
    /// The most read from a pipe at once.
    pub chunk_bytes: usize,
    /// What ends the run: SIGKILL, or SIGTERM followed by SIGKILL after [`TERM_GRACE`].
    pub first_signal: i32,
}

/// How a run's streaming ended.
#[derive(Debug)]
pub(crate) struct Streamed {
    /// Why palisade ended the run, if it did.
    pub ended: Option<RunStatus>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// When the process was seen to exit.
    pub exited_at: Option<Instant>,
}

/// One of the command's output streams.
struct Pipe {
    rx: pipe::Receiver,
    buf: Vec<u8>,
    open: bool,
    /// Bytes passed on to the client.
    bytes: u64,
}

/// A message on its way to the client (see [`Run::send`]).
enum Outgoing {
    Message(ServerMessage),
    /// What the sink holds.
    Flush,
    /// The first bytes of the stream's buffer.
    Read(Stream, usize),
    /// The next bytes of the stream's pipe.
    Splice(Stream, usize),
}

/// What a run waits for; one at a time happens.
#[derive(Debug)]
enum Event {
    ReleaseStarted,
    Readable(Stream),
    Closed(Stream),
    Exited,
    Deadline,
    Cancelled,
    Escalate,
    Drained,
}

/// What ends a run from outside its output, and the kill that follows.
struct Ending<K, C> {
    child: K,
    cancel: Pin<Box<C>>,
    deadline: Pin<Box<Sleep>>,
    first_signal: i32,
    /// Why palisade ended the run, once it has.
    ended: Option<RunStatus>,
    exited: bool,
}

impl<K: Child, C> Ending<K, C> {
    /// Neither ended by palisade nor exited: the deadline and a cancel still apply.
    fn live(&self) -> bool {
        self.ended.is_none() && !self.exited
    }

    /// Palisade ends the run: the whole tree is signalled.
    fn end(&mut self, status: RunStatus) {
        self.ended = Some(status);
        self.child.kill(self.first_signal);
    }
}

/// A run in progress: the helper's output goes to the client, under the
/// quota, the deadline and the client's own pace, until the helper has
/// exited and its output is drained.
pub(crate) struct Run<'s, S, K, C> {
    sink: &'s mut S,
    /// stdout and stderr, by [`Stream`].
    pipes: [Pipe; 2],
    ending: Ending<K, C>,
    /// After the exit, how long stray holders of the pipes may keep them open.
    drain: Pin<Box<Sleep>>,
    /// Tier B: SIGKILL after a SIGTERM that did not end the run.
    escalate: Pin<Box<Sleep>>,
    escalation_armed: bool,
    /// `Started` held to go out with the first output, until then.
    release_started: Pin<Box<Sleep>>,
    started_held: bool,
    max_output_bytes: u64,
    total: u64,
    /// The client still takes messages.
    connected: bool,
    splices: bool,
    exited_at: Option<Instant>,
}

impl<'s, S, K, C> Run<'s, S, K, C>
where
    S: Sink + Send,
    K: Child,
    C: Future<Output = ()> + Send,
{
    pub(crate) fn new(
        sink: &'s mut S,
        child: K,
        [out, err]: [pipe::Receiver; 2],
        bounds: Bounds,
        cancel: C,
    ) -> Self {
        let pipe = |rx| Pipe { rx, buf: vec![0u8; bounds.chunk_bytes], open: true, bytes: 0 };
        let splices = sink.splices();
        Run {
            sink,
            pipes: [pipe(out), pipe(err)],
            ending: Ending {
                child,
                cancel: Box::pin(cancel),
                deadline: Box::pin(tokio::time::sleep(bounds.timeout)),
                first_signal: bounds.first_signal,
                ended: None,
                exited: false,
            },
            drain: Box::pin(tokio::time::sleep(NEVER)),
            escalate: Box::pin(tokio::time::sleep(NEVER)),
            escalation_armed: false,
            release_started: Box::pin(tokio::time::sleep(NEVER)),
            started_held: false,
            max_output_bytes: bounds.max_output_bytes,
            total: 0,
            connected: false,
            splices,
            exited_at: None,
        }
    }

    /// Announces the run with `started`, then passes its output on until
    /// the helper has exited and its pipes are drained.
    pub(crate) async fn stream(mut self, started: ServerMessage) -> Streamed {
        self.announce(started).await;
        while !(self.ending.exited && !self.pipes[0].open && !self.pipes[1].open) {
            self.arm_escalation();
            match self.next_event().await {
                Event::ReleaseStarted => self.release_started().await,
                Event::Readable(stream) => self.forward(stream).await,
                Event::Closed(stream) => self.pipes[stream as usize].open = false,
                Event::Exited => {
                    self.ending.exited = true;
                    self.exited_at = Some(Instant::now());
                    self.drain.as_mut().reset(tokio::time::Instant::now() + DRAIN_GRACE);
                }
                Event::Deadline => self.ending.end(RunStatus::TimedOut),
                Event::Cancelled => self.ending.end(RunStatus::Cancelled),
                Event::Escalate => {
                    self.escalation_armed = false;
                    self.ending.child.kill(libc::SIGKILL);
                }
                Event::Drained => break,
            }
        }
        let [out, err] = &self.pipes;
        Streamed {
            ended: self.ending.ended,
            stdout_bytes: out.bytes,
            stderr_bytes: err.bytes,
            exited_at: self.exited_at,
        }
    }

    /// `Started` goes out now, or is held to go out with what comes next
    /// (within [`STARTED_HOLD`]).
    async fn announce(&mut self, started: ServerMessage) {
        self.started_held = self.sink.hold(&started);
        if self.started_held {
            self.release_started.as_mut().reset(tokio::time::Instant::now() + STARTED_HOLD);
        }
        self.connected = self.started_held || self.send(Outgoing::Message(started)).await;
    }

    async fn next_event(&mut self) -> Event {
        let [out, err] = &self.pipes;
        let ending = &mut self.ending;
        let live = ending.live();
        tokio::select! {
            _ = self.release_started.as_mut(), if self.started_held => Event::ReleaseStarted,
            r = out.rx.readable(), if out.open => match r {
                Ok(()) => Event::Readable(Stream::Stdout),
                Err(_) => Event::Closed(Stream::Stdout),
            },
            r = err.rx.readable(), if err.open => match r {
                Ok(()) => Event::Readable(Stream::Stderr),
                Err(_) => Event::Closed(Stream::Stderr),
            },
            _ = ending.child.exited(), if !ending.exited => Event::Exited,
            _ = ending.deadline.as_mut(), if live => Event::Deadline,
            _ = ending.cancel.as_mut(), if live => Event::Cancelled,
            _ = self.escalate.as_mut(), if self.escalation_armed && !ending.exited => Event::Escalate,
            _ = self.drain.as_mut(), if ending.exited => Event::Drained,
        }
    }

    /// Tier B: a SIGTERM that ended the run is followed by SIGKILL.
    fn arm_escalation(&mut self) {
        let ending = &self.ending;
        if ending.ended.is_some()
            && ending.first_signal == libc::SIGTERM
            && !self.escalation_armed
            && !ending.exited
        {
            self.escalation_armed = true;
            self.escalate.as_mut().reset(tokio::time::Instant::now() + TERM_GRACE);
        }
    }

    async fn release_started(&mut self) {
        self.started_held = false;
        if self.connected {
            self.connected = self.send(Outgoing::Flush).await;
        }
    }

    /// Passes on what `stream`'s pipe holds, up to the quota: the run dies
    /// at the first byte past it, which never leaves.
    async fn forward(&mut self, stream: Stream) {
        if self.ending.ended == Some(RunStatus::QuotaExceeded) {
            return;
        }
        let Some((n, spliced)) = self.take(stream) else { return };
        let room = self.max_output_bytes.saturating_sub(self.total);
        let deliver = (n as u64).min(room) as usize;
        if deliver < n {
            // Over the quota: the whole tree dies now, and no byte past the limit leaves.
            self.ending.end(RunStatus::QuotaExceeded);
            self.pipes[0].open = false;
            self.pipes[1].open = false;
        }
        if deliver == 0 {
            return;
        }
        self.total += deliver as u64;
        self.pipes[stream as usize].bytes += deliver as u64;
        if self.connected {
            // Whatever is held goes out in front of this piece.
            self.started_held = false;
            let out =
                if spliced { Outgoing::Splice(stream, deliver) } else { Outgoing::Read(stream, deliver) };
            self.connected = self.send(out).await;
        }
    }

    /// How many bytes of `stream` go out next, and whether they are still
    /// in the pipe (to be spliced) rather than in its buffer. What the pipe
    /// holds goes out by splice where the sink can take it so; otherwise
    /// (and to see the pipe's end) it is read here. Small pieces are read:
    /// header and bytes then go in one write. `None`: nothing to pass on.
    fn take(&mut self, stream: Stream) -> Option<(usize, bool)> {
        let pipe = &mut self.pipes[stream as usize];
        let held = if self.splices && self.connected { pipe_holds(&pipe.rx).min(pipe.buf.len()) } else { 0 };
        if held >= SPLICE_MIN_BYTES {
            return Some((held, true));
        }
        match pipe.rx.try_read(&mut pipe.buf) {
            Ok(n) if n > 0 => Some((n, false)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            _ => {
                pipe.open = false;
                None
            }
        }
    }

    /// Sends `out` while the run's deadline and cancellation stay in force:
    /// a client that stops reading cannot hold a sandbox past either. Once
    /// the run has ended, a send still stuck after [`SEND_GRACE`] is dropped
    /// (`false`: the client is given up, its sink abandoned). A client gone
    /// while the run goes on cancels the run.
    async fn send(&mut self, out: Outgoing) -> bool {
        let sent = {
            let (sink, pipes) = (&mut *self.sink, &self.pipes);
            let send = async move {
                match out {
                    Outgoing::Message(msg) => sink.send(msg).await,
                    Outgoing::Flush => sink.flush().await,
                    Outgoing::Read(stream, n) => {
                        sink.send_output(stream, &pipes[stream as usize].buf[..n]).await
                    }
                    Outgoing::Splice(stream, n) => {
                        sink.splice_output(stream, pipes[stream as usize].rx.as_fd(), n).await
                    }
                }
            };
            tokio::pin!(send);
            let grace = tokio::time::sleep(if self.ending.ended.is_some() { SEND_GRACE } else { NEVER });
            tokio::pin!(grace);
            loop {
                let live = self.ending.live();
                tokio::select! {
                    ok = &mut send => break Some(ok),
                    _ = self.ending.deadline.as_mut(), if live => {
                        self.ending.end(RunStatus::TimedOut);
                        grace.as_mut().reset(tokio::time::Instant::now() + SEND_GRACE);
                    }
                    _ = self.ending.cancel.as_mut(), if live => {
                        self.ending.end(RunStatus::Cancelled);
                        grace.as_mut().reset(tokio::time::Instant::now() + SEND_GRACE);
                    }
                    _ = &mut grace => break None,
                }
            }
        };
        let connected = sent.unwrap_or_else(|| {
            self.sink.abandon();
            false
        });
        if !connected && self.ending.ended.is_none() {
            self.ending.end(RunStatus::Cancelled);
        }
        connected
    }
}

/// Sends the plan and the descriptors of its host paths on the helper's fd 3.
/// Into an empty socket a plan that fits its buffer goes at once; a larger
/// one is written from a blocking thread while the helper reads it.
fn hand_over(channel: UnixStream, plan: Vec<u8>, descriptors: &[OwnedFd]) -> std::io::Result<()> {
    if plan.len() <= PLAN_AT_ONCE_BYTES {
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
) -> Result<Vec<(String, OwnedFd, OwnedFd)>, BrokerError> {
    let mut out = Vec::new();
    for (target, upper) in overlays {
        let source = plan.mounts.iter().find_map(|m| match m {
            palisade_protocol::Mount::Overlay { source, target: t, .. } if *t == target => Some(source),
            _ => None,
        });
        let dest = source.and_then(|s| plan.descriptor(s)).and_then(|i| grants.descriptors.get(i));
        let (Some(source), Some(dest)) = (source, dest) else {
            return Err(BrokerError::UnplannedOverlay(target));
        };
        let dest = dest.try_clone()?;
        out.push((source.clone(), upper, dest));
    }
    Ok(out)
}

/// Copies every overlay's changes back to its host directory, as the
/// requester (see [`crate::requester`]).
fn commit_all(requester: &Requester, targets: Vec<(String, OwnedFd, OwnedFd)>) -> Result<u64, BrokerError> {
    let mut bytes = 0;
    for (source, upper, dest) in targets {
        let done = requester
            .act(|act| overlay::commit(&upper, &dest, act))
            .and_then(|r| r)
            .map_err(|e| BrokerError::CopyBack { path: source.clone(), source: e })?;
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
        // ru_maxrss counts KiB.
        max_rss_bytes: ru.ru_maxrss as u64 * 1024,
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
    })
}

/// The run's state machine against a fake client and a fake process: real
/// pipes, no sandbox, no root, and tokio's paused clock for every timer.
#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::sync::watch;

    /// What the fake client does.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Client {
        /// Takes everything at once.
        Reads,
        /// Gone after taking this many messages: every send after fails.
        GoneAfter(usize),
        /// Takes messages but never the output: those sends never complete.
        StopsReading,
    }

    struct FakeSink {
        client: Client,
        /// What reached the client, in order.
        sent: Vec<ServerMessage>,
        /// Messages held to go in front of the next.
        held: Vec<ServerMessage>,
        holds: bool,
        splices: bool,
        abandoned: bool,
    }

    impl FakeSink {
        fn new(client: Client) -> FakeSink {
            FakeSink { client, sent: vec![], held: vec![], holds: false, splices: false, abandoned: false }
        }

        fn output(&self, stream: Stream) -> Vec<u8> {
            let data = |m: &ServerMessage| match m {
                ServerMessage::Output { stream: s, data } if *s == stream => Some(data.clone()),
                _ => None,
            };
            self.sent.iter().filter_map(data).flatten().collect()
        }

        fn deliver(&mut self, msg: ServerMessage) -> bool {
            if matches!(self.client, Client::GoneAfter(n) if self.sent.len() >= n) {
                return false;
            }
            self.sent.append(&mut self.held);
            self.sent.push(msg);
            true
        }
    }

    impl Sink for FakeSink {
        async fn send(&mut self, msg: ServerMessage) -> bool {
            self.deliver(msg)
        }

        async fn send_output(&mut self, stream: Stream, data: &[u8]) -> bool {
            if self.client == Client::StopsReading {
                std::future::pending::<()>().await;
            }
            self.deliver(ServerMessage::Output { stream, data: data.to_vec() })
        }

        fn splices(&self) -> bool {
            self.splices
        }

        fn hold(&mut self, msg: &ServerMessage) -> bool {
            if self.holds {
                self.held.push(msg.clone());
            }
            self.holds
        }

        async fn flush(&mut self) -> bool {
            self.sent.append(&mut self.held);
            true
        }

        fn abandon(&mut self) {
            self.abandoned = true;
        }
    }

    struct ChildState {
        /// Signals received, in order.
        kills: Vec<i32>,
        /// The write ends of stdout and stderr, while the process holds them.
        writers: Option<[OwnedFd; 2]>,
        /// The signals it dies of.
        dies_of: &'static [i32],
    }

    /// A process that writes what the test says and exits when told or killed.
    struct FakeChild {
        state: Arc<Mutex<ChildState>>,
        exit: Arc<watch::Sender<bool>>,
    }

    impl Child for FakeChild {
        fn exited(&self) -> impl Future<Output = ()> + Send {
            let mut exit = self.exit.subscribe();
            async move {
                let _ = exit.wait_for(|exited| *exited).await;
            }
        }

        fn kill(&self, signal: i32) {
            let mut state = self.state.lock().unwrap();
            state.kills.push(signal);
            if state.dies_of.contains(&signal) {
                state.writers = None;
                self.exit.send_replace(true);
            }
        }
    }

    /// The test's side of the fake process.
    struct Process {
        state: Arc<Mutex<ChildState>>,
        exit: Arc<watch::Sender<bool>>,
    }

    impl Process {
        fn write(&self, stream: Stream, data: &[u8]) {
            let state = self.state.lock().unwrap();
            let fd = &state.writers.as_ref().expect("the process holds its pipes")[stream as usize];
            assert_eq!(nix::unistd::write(fd, data).unwrap(), data.len());
        }

        /// Exits; `keep_pipes`: something it started still holds them.
        fn exit(&self, keep_pipes: bool) {
            if !keep_pipes {
                self.state.lock().unwrap().writers = None;
            }
            self.exit.send_replace(true);
        }

        fn kills(&self) -> Vec<i32> {
            self.state.lock().unwrap().kills.clone()
        }
    }

    fn process(dies_of: &'static [i32]) -> (FakeChild, [pipe::Receiver; 2], Process) {
        let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let ((out_r, out_w), (err_r, err_w)) = (pipe(), pipe());
        let state =
            Arc::new(Mutex::new(ChildState { kills: vec![], writers: Some([out_w, err_w]), dies_of }));
        let exit = Arc::new(watch::channel(false).0);
        let readers =
            [pipe::Receiver::from_owned_fd(out_r).unwrap(), pipe::Receiver::from_owned_fd(err_r).unwrap()];
        let child = FakeChild { state: state.clone(), exit: exit.clone() };
        (child, readers, Process { state, exit })
    }

    const TIMEOUT: Duration = Duration::from_secs(30);

    fn bounds(max_output_bytes: u64) -> Bounds {
        Bounds { max_output_bytes, timeout: TIMEOUT, chunk_bytes: 64 * 1024, first_signal: libc::SIGKILL }
    }

    async fn stream(
        sink: &mut FakeSink,
        child: FakeChild,
        pipes: [pipe::Receiver; 2],
        bounds: Bounds,
        cancel: impl Future<Output = ()> + Send,
    ) -> Streamed {
        let started =
            ServerMessage::Started { run_id: 1, executor: palisade_protocol::wire::Executor::LinuxTierC };
        Run::new(sink, child, pipes, bounds, cancel).stream(started).await
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn output_is_cut_at_exactly_the_quota_read_or_spliced() {
        // (spliced, bytes written, quota): one byte over, far over, exactly at it.
        for (splices, len, max) in [(false, 10, 9), (false, 10, 7), (true, 40_000, 20_001), (false, 7, 7)] {
            let (child, pipes, p) = process(&[libc::SIGKILL]);
            let data = pattern(len);
            p.write(Stream::Stdout, &data);
            let at_quota = len as u64 <= max;
            if at_quota {
                p.exit(false);
            }
            let mut sink = FakeSink { splices, ..FakeSink::new(Client::Reads) };
            let s = stream(&mut sink, child, pipes, bounds(max), std::future::pending()).await;
            let kept = len.min(max as usize);
            assert_eq!(sink.output(Stream::Stdout), data[..kept], "{len} bytes, quota {max}");
            assert_eq!((s.stdout_bytes, s.stderr_bytes), (kept as u64, 0));
            if at_quota {
                assert_eq!((s.ended, p.kills()), (None, vec![]), "{len} bytes, quota {max}");
            } else {
                assert_eq!((s.ended, p.kills()), (Some(RunStatus::QuotaExceeded), vec![libc::SIGKILL]));
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_quota_counts_both_streams_together() {
        let (child, pipes, p) = process(&[libc::SIGKILL]);
        p.write(Stream::Stdout, b"ooooo");
        p.write(Stream::Stderr, b"eeeee");
        let mut sink = FakeSink::new(Client::Reads);
        let s = stream(&mut sink, child, pipes, bounds(7), std::future::pending()).await;
        assert_eq!(s.ended, Some(RunStatus::QuotaExceeded));
        let (out, err) = (sink.output(Stream::Stdout), sink.output(Stream::Stderr));
        assert_eq!(out.len() + err.len(), 7, "{out:?} {err:?}");
        assert!(b"ooooo".starts_with(&out) && b"eeeee".starts_with(&err));
        assert_eq!((s.stdout_bytes, s.stderr_bytes), (out.len() as u64, err.len() as u64));
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_kills_the_run_and_tier_b_escalates_to_sigkill() {
        // Tier C dies of the first signal; Tier B's helper is given TERM_GRACE.
        for (first, dies_of, kills, took) in [
            (libc::SIGKILL, &[libc::SIGKILL][..], vec![libc::SIGKILL], TIMEOUT),
            (libc::SIGTERM, &[libc::SIGKILL][..], vec![libc::SIGTERM, libc::SIGKILL], TIMEOUT + TERM_GRACE),
        ] {
            let (child, pipes, p) = process(dies_of);
            p.write(Stream::Stdout, b"partial");
            let mut sink = FakeSink::new(Client::Reads);
            let t0 = tokio::time::Instant::now();
            let s =
                stream(&mut sink, child, pipes, Bounds { first_signal: first, ..bounds(1 << 20) }, async {
                    std::future::pending().await
                })
                .await;
            assert_eq!((s.ended, p.kills()), (Some(RunStatus::TimedOut), kills));
            assert_eq!(t0.elapsed(), took);
            assert_eq!(sink.output(Stream::Stdout), b"partial");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_disconnects_gets_its_run_cancelled() {
        // Seen by the connection (its end of input, or a cancel): the cancel future.
        let (child, pipes, p) = process(&[libc::SIGKILL]);
        let mut sink = FakeSink::new(Client::Reads);
        let t0 = tokio::time::Instant::now();
        let s = stream(&mut sink, child, pipes, bounds(1 << 20), tokio::time::sleep(Duration::from_secs(1)))
            .await;
        assert_eq!((s.ended, p.kills()), (Some(RunStatus::Cancelled), vec![libc::SIGKILL]));
        assert_eq!(t0.elapsed(), Duration::from_secs(1));
        // Seen by a send: the client takes `Started`, then its socket fails.
        let (child, pipes, p) = process(&[libc::SIGKILL]);
        p.write(Stream::Stdout, b"hello");
        let mut sink = FakeSink::new(Client::GoneAfter(1));
        let s = stream(&mut sink, child, pipes, bounds(1 << 20), std::future::pending()).await;
        assert_eq!((s.ended, p.kills()), (Some(RunStatus::Cancelled), vec![libc::SIGKILL]));
        assert!(matches!(sink.sent.as_slice(), [ServerMessage::Started { .. }]), "{:?}", sink.sent);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_cannot_hold_the_run_past_its_deadline() {
        let (child, pipes, p) = process(&[libc::SIGKILL]);
        p.write(Stream::Stdout, b"nobody reads this");
        let mut sink = FakeSink::new(Client::StopsReading);
        let t0 = tokio::time::Instant::now();
        let s = stream(&mut sink, child, pipes, bounds(1 << 20), std::future::pending()).await;
        assert_eq!((s.ended, p.kills()), (Some(RunStatus::TimedOut), vec![libc::SIGKILL]));
        // Killed at the deadline; the stuck send is given up SEND_GRACE later.
        assert!(sink.abandoned);
        assert_eq!(t0.elapsed(), TIMEOUT + SEND_GRACE);
        // A run already ended (here, over its quota) gives a stuck send SEND_GRACE too.
        let (child, pipes, p) = process(&[libc::SIGKILL]);
        p.write(Stream::Stdout, &pattern(100));
        let mut sink = FakeSink::new(Client::StopsReading);
        let t0 = tokio::time::Instant::now();
        let s = stream(&mut sink, child, pipes, bounds(10), std::future::pending()).await;
        assert_eq!((s.ended, p.kills()), (Some(RunStatus::QuotaExceeded), vec![libc::SIGKILL]));
        assert!(sink.abandoned);
        assert_eq!(t0.elapsed(), SEND_GRACE);
    }

    #[tokio::test(start_paused = true)]
    async fn started_goes_out_with_the_first_output_and_stray_pipe_holders_are_not_waited_for() {
        let (child, pipes, p) = process(&[libc::SIGKILL]);
        p.write(Stream::Stderr, b"warning\n");
        // The process exits; something it left behind keeps its pipes open.
        p.exit(true);
        let mut sink = FakeSink { holds: true, ..FakeSink::new(Client::Reads) };
        let t0 = tokio::time::Instant::now();
        let s = stream(&mut sink, child, pipes, bounds(1 << 20), std::future::pending()).await;
        assert_eq!((s.ended, p.kills()), (None, vec![]));
        assert!(
            matches!(sink.sent.as_slice(), [ServerMessage::Started { .. }, ServerMessage::Output { .. }]),
            "{:?}",
            sink.sent
        );
        assert_eq!(sink.output(Stream::Stderr), b"warning\n");
        assert_eq!(t0.elapsed(), DRAIN_GRACE);
    }
}
