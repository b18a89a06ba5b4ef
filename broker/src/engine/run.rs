//! One run on Linux: spawn the helper, feed stdin, stream stdout and stderr
//! as they come ([`crate::engine::stream`]: the output quota, the deadline, the
//! whole tree killed when needed), then collect usage and build the result
//! and its attestation.

use crate::egress::Egress;
use crate::engine::cgroup::{CgroupLimits, Cgroups, Membership, RunCgroup};
use crate::engine::exiting::{Exiting, StatusWatch, Teardowns};
use crate::engine::helper::{
    HelperChild, HelperCommand, Io, StatusRead, Usage, nonblocking, pidfd_kill, reap, release, send_plan,
};
use crate::engine::pool::{Pool, Slot};
use crate::engine::requesters::Requesters;
use crate::engine::spawn_thread::Spawner;
pub use crate::engine::stream::Sink;
use crate::engine::stream::{Bounds, Child, Input, Run};
use crate::error::BrokerError;
use crate::journal::attest::attestation;
use palisade_policy::Resolved;
use palisade_protocol::attest::Built;
use palisade_protocol::plan::Listener;
use palisade_protocol::wire::{Changes, ChangesOutcome, RunRequest, RunResult, RunStatus, ServerMessage};
use palisade_protocol::{
    ExitReport, HelperRecord, JailPlan, LandlockReport, SessionRole, Tier, WarmSpec, encode_plan,
};
use std::future::Future;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

/// What a run is given of the host: the requester it acts for, and the
/// plan's host paths, opened at decision time (in the plan's order).
pub struct Grants {
    pub requester: crate::host::requester::Requester,
    pub descriptors: Vec<OwnedFd>,
    /// What the copy-back must not apply.
    pub keep_out: crate::changes::KeepOut,
    /// The layers on disk the plan's overlays write to, taken when the run's
    /// writes are settled.
    pub layers: std::sync::Mutex<Option<crate::changes::Layers>>,
}

/// A plan up to this size is sent from the runtime's thread: an empty Unix
/// stream socket takes it whole at once (its default buffer is larger).
const PLAN_AT_ONCE_BYTES: usize = 64 * 1024;

/// A decided run: its id, its plan and limits, and what it was given of the
/// host.
#[derive(Clone, Copy)]
pub struct Planned<'a> {
    pub id: u64,
    pub resolved: &'a Resolved,
    pub grants: &'a Grants,
}

/// The cgroup a run goes in.
pub enum InCgroup<'a> {
    /// None: its limits are rlimits.
    None,
    /// Its own, of this name and limits: made (or a claimed slot's
    /// limited), and removed after the run.
    Own(&'a str, CgroupLimits),
    /// Its session's (a command of a session): joined, never made, limited
    /// or removed by this run.
    Session(&'a Membership),
}

/// A helper holding its plan, in the run's cgroup if it has one.
struct Launched<'a> {
    helper: HelperChild,
    /// Kills and reaps `helper` if the run is left before its end.
    abandon: Abandon,
    cgroup: Option<&'a RunCgroup>,
    /// A command in its session's cgroup: the cgroup, and its OOM kills
    /// before the command started.
    session: Option<(&'a Membership, u64)>,
    started: Instant,
    /// The run's view of the host's files, taken before the sandbox was
    /// made: what the host changes after it is someone else's change.
    since: crate::changes::clock::Since,
}

pub struct Engine {
    spawner: Spawner,
    helper: PathBuf,
    pool: Arc<Pool>,
    /// A system broker's pools of sandboxes built ahead, one per requester
    /// (its `pool` builds nothing ahead).
    requesters: Option<Arc<Requesters>>,
    /// Helpers started ahead for sessions' commands (one, once a session
    /// ran a command): they build nothing, and join a session's sandbox.
    joins: Arc<Pool>,
    cgroups: Cgroups,
    /// Helpers exiting after their run was answered.
    teardowns: Teardowns,
}

/// Whether `e` is a hand-over whose other end was closed: the helper is gone.
fn channel_closed(e: &BrokerError) -> bool {
    matches!(e, BrokerError::HandOver(io)
        if matches!(io.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset))
}

/// Releases the command of `helper` once `recorded` says the run's start is
/// on disk: before its first instruction, as docs/journal.md promises.
async fn release_when(
    recorded: impl Future<Output = bool>,
    helper: &HelperChild,
    since: &crate::changes::clock::Since,
) -> Result<(), BrokerError> {
    if !recorded.await {
        return Err(crate::engine::executor::not_recorded());
    }
    // What the host changes from here on has a file time after the run's view.
    since.fence().await;
    release(&helper.status).map_err(BrokerError::HandOver)
}

/// Microseconds since the run started, at each step (logged at debug level).
#[derive(Default, Clone, Copy)]
struct Timeline {
    spawned_us: u128,
    exited_us: u128,
    closed_us: u128,
    status_read_us: u128,
}

impl Timeline {
    /// Logs the steps of run `run_id`, started at `started`, at debug level.
    fn log(&self, run_id: u64, started: Instant) {
        let Timeline { spawned_us, exited_us, closed_us, status_read_us } = *self;
        tracing::debug!(
            run_id,
            spawned_us,
            exited_us,
            closed_us,
            status_read_us,
            done_us = started.elapsed().as_micros(),
            "run timeline"
        );
    }
}

impl Engine {
    /// `prespawn`: helpers kept started ahead of requests, building `warm`
    /// before their plan (see [`Pool`]), or for a system broker
    /// (`per_requester`) building it with each requester's host ids in a
    /// pool of the requester's own ([`Requesters`]); `cgroups`: where runs'
    /// cgroups go.
    pub fn new(
        spawner: Spawner,
        helper: PathBuf,
        (prespawn, warm, per_requester): (usize, Option<WarmSpec>, bool),
        cgroups: Cgroups,
    ) -> Engine {
        let requesters = warm.filter(|_| per_requester).map(|base| {
            Arc::new(Requesters::new(spawner.clone(), helper.clone(), prespawn, base, cgroups.clone()))
        });
        let shared = if per_requester { None } else { warm };
        let pool = Pool::new(spawner.clone(), helper.clone(), prespawn, shared, cgroups.clone());
        let joins = Pool::new(spawner.clone(), helper.clone(), prespawn.min(1), None, cgroups.clone());
        Engine { spawner, helper, pool, requesters, joins, cgroups, teardowns: Teardowns::new() }
    }

    /// The thread that starts helpers (and the plugin-host).
    pub fn spawner(&self) -> &Spawner {
        &self.spawner
    }

    /// Starts the helpers kept ahead of requests; call inside the runtime.
    pub fn warm_up(&self) {
        self.pool.refill();
        if let Some(requesters) = &self.requesters {
            requesters.sweep_idle();
        }
    }

    /// Starts one helper for the next run, now (see [`Pool::start_one`]).
    pub fn start_one(&self) {
        self.pool.start_one();
    }

    /// Helpers started from now on build nothing ahead of their plan.
    pub fn stop_warming(&self) {
        self.pool.stop_warming();
        if let Some(requesters) = &self.requesters {
            requesters.stop_warming();
        }
    }

    /// The pool, for its status.
    pub fn pool(&self) -> Arc<Pool> {
        Arc::clone(&self.pool)
    }

    /// The sandboxes torn down after their run was answered, for a shutdown
    /// to wait for.
    pub(crate) fn teardowns(&self) -> Teardowns {
        self.teardowns.clone()
    }

    /// Once a run is over: its pool (and, for a system broker, its
    /// requester's) starts what the run took.
    fn refill(&self, plan: &JailPlan) {
        self.pool.refill();
        if let Some(requesters) = &self.requesters {
            requesters.refill(plan);
        }
    }

    /// A system broker's pools per requester, if it keeps them.
    pub fn requesters(&self) -> Option<Arc<Requesters>> {
        self.requesters.clone()
    }

    /// Every pool, to close at shutdown (blocking; [`Pool::close`]).
    pub fn closer(&self) -> impl FnOnce() + Send + 'static {
        let (pools, requesters) =
            ([Arc::clone(&self.pool), Arc::clone(&self.joins)], self.requesters.clone());
        move || {
            requesters.iter().for_each(|r| r.close());
            pools.iter().for_each(|p| p.close());
        }
    }

    /// A helper started now, given `cgroup_dir` (cgroup v2: the cgroup it joins).
    async fn spawn_fresh(
        &self,
        piped_stdin: bool,
        cgroup_dir: Option<OwnedFd>,
    ) -> Result<HelperChild, BrokerError> {
        self.spawner
            .spawn(HelperCommand {
                warm: None,
                helper: self.helper.clone(),
                cgroup_dir,
                stdin: if piped_stdin { Io::Piped } else { Io::Null },
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

    /// A helper started ahead for a command of a session (see
    /// [`Engine::joins`]), if one is ready; another is started for the next.
    pub async fn claim_join(&self, plan: &JailPlan) -> Option<Slot> {
        self.joins.claim(plan, false).await
    }

    /// A slot of the pool for `plan`, run in a cgroup or not (see
    /// [`Pool::claim`]). A warm slot's cgroup becomes the run's: the caller
    /// names it in the plan before the run is recorded.
    pub async fn claim(&self, plan: &JailPlan, in_cgroup: bool) -> Option<Slot> {
        if let Some(requesters) = &self.requesters
            && let Some(slot) = requesters.claim(plan, in_cgroup).await
        {
            return Some(slot);
        }
        self.pool.claim(plan, in_cgroup).await
    }

    /// A helper holding its plan, and the run's own cgroup when it has one
    /// (`wanted`): the claimed slot's, or a fresh helper in a new cgroup (or
    /// in its session's); its stdin a pipe when `piped_stdin`.
    async fn launch(
        &self,
        resolved: &Resolved,
        grants: &Grants,
        piped_stdin: bool,
        wanted: &InCgroup<'_>,
        claimed: Option<Slot>,
    ) -> Result<(HelperChild, Option<RunCgroup>), BrokerError> {
        let plan = encode_plan(&resolved.plan)?;
        // A warm slot's helper is in its cgroup already (v1: placed before it built anything).
        let (mut helper, cgroup, fresh) = match (claimed, wanted) {
            (Some(Slot { helper, cgroup: Some(cgroup) }), InCgroup::Own(name, limits))
                if cgroup.name() == *name =>
            {
                if let Err(e) = cgroup.set_limits(*limits) {
                    helper.discard();
                    return Err(BrokerError::CgroupCreate(e));
                }
                (helper, Some(cgroup), false)
            }
            // A helper started ahead, outside any cgroup: its session's is given it below.
            (Some(Slot { helper, cgroup: None }), InCgroup::None | InCgroup::Session(_)) => {
                (helper, None, true)
            }
            (claimed, wanted) => {
                // A slot claimed for another cgroup than the plan's: not used.
                if let Some(slot) = claimed {
                    slot.discard();
                }
                let cgroup = match wanted {
                    InCgroup::Own(name, limits) => Some(self.cgroups.create(name, *limits)),
                    _ => None,
                };
                let cgroup = cgroup.transpose().map_err(BrokerError::CgroupCreate)?;
                let dir = cgroup.as_ref().map(RunCgroup::open_dir).transpose()?.flatten();
                (self.spawn_fresh(piped_stdin, dir).await?, cgroup, true)
            }
        };
        if let Some(channel) = helper.plan_channel.take() {
            // cgroup v1, and a session's cgroup: the broker places the helper before it has its plan.
            let placed = match (wanted, &cgroup) {
                (InCgroup::Session(session), _) => session.place(helper.pid),
                (_, Some(own)) if fresh => own.place(helper.pid),
                _ => Ok(()),
            };
            let handed = placed.map_err(BrokerError::from).and_then(|()| {
                hand_over(channel, plan, &resolved.plan, &grants.descriptors).map_err(BrokerError::HandOver)
            });
            if let Err(e) = handed {
                let _ = pidfd_kill(&helper.pidfd, libc::SIGKILL);
                let usage = reap(helper.pid);
                // Its end of the channel closed: the helper was gone (killed from outside) before
                // it read its plan; answered with how it ended, as before its release.
                return Err(match usage {
                    Ok(usage) if channel_closed(&e) => lost(&usage),
                    _ => e,
                });
            }
        }
        Ok((helper, cgroup))
    }

    /// Runs `planned` on the slot `claimed` by [`Engine::claim`] or a fresh
    /// helper, in a cgroup of this name and limits when `cgroup` says so
    /// (removed after the run, whatever happened in it). The helper builds
    /// the sandbox while `recorded` waits for the run's start to be on disk;
    /// its command is released once it is (`false`: it is never released,
    /// and the run is not run). `cancel` completing (a client gone, a
    /// shutdown) kills it.
    #[allow(clippy::too_many_arguments)]
    pub async fn execute<S: Sink + Send>(
        &self,
        planned: Planned<'_>,
        request: &RunRequest,
        sink: &mut S,
        recorded: impl Future<Output = bool> + Send,
        cancel: impl Future<Output = ()> + Send,
        wanted: InCgroup<'_>,
        claimed: Option<Slot>,
    ) -> Result<RunResult, BrokerError> {
        let started = Instant::now();
        // The run's view of the host's files: its command is released after it.
        let since = crate::changes::clock::Since::now();
        let input = Input::of(request, sink.take_stdin());
        // A terminal's input goes to its master, never to the helper's stdin.
        let piped = input.piped() && planned.resolved.plan.terminal.is_none();
        let session = match wanted {
            InCgroup::Session(m) => Some((m, m.oom_kills())),
            _ => None,
        };
        let (helper, cgroup) = self.launch(planned.resolved, planned.grants, piped, &wanted, claimed).await?;
        // Nothing of the run outlives it, however it is left from here (a shutdown's abort, a panic).
        let abandon = Abandon::arm(helper.pid, &helper.pidfd, libc::SIGKILL)?;
        if let Err(e) = release_when(recorded, &helper, &since).await {
            abandon.disarm();
            // Its end of the channel closed: the helper was gone (killed from outside) before its release.
            let gone = channel_closed(&e);
            let _ = pidfd_kill(&helper.pidfd, libc::SIGKILL);
            let ended =
                tokio::task::spawn_blocking(move || (reap(helper.pid), cgroup.map(|c| c.remove()))).await;
            return Err(match ended {
                Ok((Ok(usage), _)) if gone => lost(&usage),
                _ => e,
            });
        }
        let launched = Launched { helper, abandon, cgroup: cgroup.as_ref(), session, started, since };
        let mut exiting = None;
        let result = self.finish(planned, request, (sink, input), cancel, launched, &mut exiting).await;
        let after_answer = exiting.is_some();
        let teardown = async move {
            if let Some(helper) = exiting {
                helper.reap().await;
            }
            if let Some(c) = cgroup {
                let _ = tokio::task::spawn_blocking(move || c.remove()).await;
            }
        };
        // A helper that reported its sandbox gone exits (and its cgroup goes) after the answer.
        if after_answer {
            self.teardowns.spawn(teardown)
        } else {
            teardown.await
        }
        result
    }

    /// The run of a launched helper, to its result. A helper that reported
    /// its sandbox gone before its exit is left in `exiting`, to be reaped.
    async fn finish<S: Sink + Send>(
        &self,
        planned: Planned<'_>,
        request: &RunRequest,
        (sink, input): (&mut S, Input),
        cancel: impl Future<Output = ()> + Send,
        launched: Launched<'_>,
        exiting: &mut Option<Exiting>,
    ) -> Result<RunResult, BrokerError> {
        let Planned { id: run_id, resolved, grants } = planned;
        let Launched { helper, abandon, cgroup, session, started, since } = launched;
        let tier = resolved.plan.tier();
        let built = if helper.warm.is_some() { Built::Warm } else { Built::Cold };
        let HelperChild { pid, pidfd, status, stdin, stdout, stderr, .. } = helper;
        let mut timeline = Timeline { spawned_us: started.elapsed().as_micros(), ..Timeline::default() };
        tracing::debug!(run_id, pid, %tier, ?built, "helper started");
        // Tier C: SIGKILL to the helper takes pid 1 of the sandbox with it, and
        // with it the whole pid namespace. Tier B: SIGTERM lets the helper (a
        // subreaper) kill every descendant before it exits.
        // A command of a session: SIGTERM has its helper kill the command's
        // process group, and nothing else of the session.
        let joins = resolved.plan.session == Some(SessionRole::Join);
        let first_signal = if tier == Tier::C && !joins { libc::SIGKILL } else { libc::SIGTERM };
        // From here, a run left kills its helper with `first_signal`.
        let abandon = abandon.first(first_signal);
        let (status, early, egress) = serve_egress(resolved, status).await?;
        let (status, early, terminal) = take_terminal(resolved, status, early).await?;
        let (status, early) = take_session(resolved, (status, early), cgroup, sink).await?;
        // SAFETY: an OwnedFd's descriptor stays open as long as the AsyncFd owns it.
        let pidfd = unsafe { AsyncFd::register(pidfd) }.map_err(std::io::Error::from)?;
        let copying = terminal.is_some();
        let (pipes, stdin) = match terminal {
            // The command's stdin, stdout and stderr: all of it is stdout.
            Some(master) => {
                let writer = master.try_clone()?;
                ([terminal_reader(master)?, pipe_reader(stderr)?], Some(std::fs::File::from(writer)))
            }
            None => ([pipe_reader(stdout)?, pipe_reader(stderr)?], stdin),
        };
        feed_stdin(stdin, input, copying)?;
        crate::fault::panic_if_named(&request.argv);
        let bounds = Bounds {
            max_output_bytes: resolved.max_output_bytes,
            timeout: resolved.timeout,
            chunk_bytes: resolved.capture_chunk_bytes,
            first_signal,
        };
        let watch = StatusWatch::new(status, early)?;
        let child = Helper { pidfd, status: &watch, cgroup, run_id, pid };
        let started_msg = ServerMessage::Started { run_id, executor: tier.into() };
        // A run whose writes pass their bound on disk is stopped as a cancel stops it, and said so.
        let (cancel, disk_bound) = bound_writes(grants, resolved, cancel);
        let run = Run::new(sink, child, pipes, bounds, cancel);
        let run = if copying { run.copying() } else { run };
        let streamed = run.stream(started_msg).await;
        timeline.exited_us = streamed.exited_at.map_or(0, |at| at.duration_since(started).as_micros());
        let egress_traffic = match egress {
            Some(e) => Some(e.finish().await),
            None => None,
        };
        // Until its processes were gone; delivering the output that was left
        // to a slow client is not the command's time.
        let wall_ms =
            streamed.exited_at.unwrap_or_else(Instant::now).duration_since(started).as_millis() as u64;
        timeline.closed_us = started.elapsed().as_micros();
        let (usage, records, fds) = helper_done(watch, abandon, pid, exiting).await?;
        self.refill(&resolved.plan);
        timeline.status_read_us = started.elapsed().as_micros();
        let mut ended = streamed.ended;
        let bound = disk_bound.passed(&mut ended).await;
        let report = Report::read(records, fds, ended)?;
        let cg_usage = cgroup.map(RunCgroup::usage);
        // A command in its session's cgroup: killed by the kernel as the cgroup counted an OOM kill.
        let killed = matches!(report.exit, Some(ExitReport::Signal(libc::SIGKILL)));
        let session_oom = session.is_some_and(|(m, before)| killed && m.oom_kills() > before);
        if (cg_usage.is_some_and(|u| u.oom_kills > 0) || session_oom) && ended.is_none() {
            ended = Some(RunStatus::MemoryLimitExceeded);
        }
        // A session its requester stopped ended as a command that exits by
        // itself does: its writes are settled so (its result says stopped).
        let stopped = ended == Some(RunStatus::Cancelled) && sink.session_stopped();
        let mut settle = if stopped { None } else { ended };
        let (written_bytes, changes) =
            keep_writes(resolved, grants, report.overlays, (&mut settle, bound), (run_id, since)).await?;
        ended = match settle {
            None if stopped => Some(RunStatus::Stopped),
            settle => settle,
        };
        let status = match ended {
            Some(ended) => ended,
            None => exit_status(report.exit, &usage)?,
        };
        tracing::info!(run_id, pid, ?status, wall_ms, "run finished");
        timeline.log(run_id, started);
        Ok(RunResult {
            run_id,
            status,
            wall_ms,
            cpu_user_ms: cg_usage.map_or(usage.user_ms, |u| u.cpu_user_usec / 1000),
            cpu_system_ms: cg_usage.map_or(usage.system_ms, |u| u.cpu_system_usec / 1000),
            // Not the helper's own rusage: its peak counts the broker's
            // resident set, which the helper inherited when it was forked.
            peak_memory_bytes: cg_usage.map_or(report.peak_rss_bytes.unwrap_or(0), |u| u.peak_memory_bytes),
            memory_source: match cg_usage {
                Some(_) => palisade_protocol::wire::MemorySource::Cgroup,
                None => palisade_protocol::wire::MemorySource::Rusage,
            },
            stdout_bytes: streamed.stdout_bytes,
            stderr_bytes: streamed.stderr_bytes,
            written_bytes,
            changes,
            attestation: attestation(request, resolved, report.landlock, egress_traffic, Some(built)),
            // The broker's, once the run is over (`Broker::execute`).
            approved: None,
        })
    }
}

/// The helper's usage and every record it sent, with their descriptors:
/// from its [`HelperRecord::Reaped`] when it sent one, the helper then left
/// in `exiting`, to be reaped after the answer; else reaped now, its status
/// channel read to its end.
async fn helper_done(
    watch: StatusWatch,
    abandon: Abandon,
    pid: u32,
    exiting: &mut Option<Exiting>,
) -> Result<(Usage, Vec<HelperRecord>, Vec<OwnedFd>), BrokerError> {
    let (status, read) = watch.into_parts()?;
    match crate::engine::exiting::reaped(&read.records) {
        // Every record is in: the helper sends nothing after this one.
        Some(reaped) => {
            *exiting = abandon.exiting();
            Ok((Usage::reported(reaped), read.records, read.fds))
        }
        None => {
            abandon.disarm();
            let usage = reap(pid)?;
            let (records, fds) = read_status_channel(status, read).await?;
            Ok((usage, records, fds))
        }
    }
}

/// How the command ended by itself, as the sandbox's supervisor (pid 1, or
/// Tier B's reaper) reported it. Without its report the supervisor died
/// first (killed from outside, say): how the command ended is not known,
/// and the run is an error rather than a status it may not have had.
fn exit_status(exit: Option<ExitReport>, usage: &Usage) -> Result<RunStatus, BrokerError> {
    match exit {
        Some(ExitReport::Code(code)) => Ok(RunStatus::Exited { code }),
        Some(ExitReport::Signal(signal)) => Ok(RunStatus::Signaled { signal }),
        None => Err(lost(usage)),
    }
}

/// The sandbox's supervisor gone before it said how the command ended:
/// how it ended itself.
fn lost(usage: &Usage) -> BrokerError {
    BrokerError::SandboxLost(match (usage.code, usage.signal) {
        (Some(code), _) => format!("exited with {code}"),
        (_, Some(signal)) => format!("was killed by signal {signal}"),
        _ => "ended".into(),
    })
}

/// Writes the run's input to the command's stdin (or its terminal's
/// master) from a task of its own: a command that does not read its stdin
/// must not hold up the run. Without input, the stdin is closed.
fn feed_stdin(stdin: Option<std::fs::File>, input: Input, terminal: bool) -> std::io::Result<()> {
    let Some(stdin) = stdin.filter(|_| input.piped()) else { return Ok(()) };
    let tx = match terminal {
        true => {
            nonblocking(&stdin, true)?;
            pipe::Sender::from_owned_fd_unchecked(OwnedFd::from(stdin))?
        }
        false => pipe::Sender::from_owned_fd(OwnedFd::from(stdin))?,
    };
    tokio::spawn(input.feed(tx));
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
        Some(listeners) => {
            let authority = crate::egress::authority::for_plan(plan)
                .map_err(|e| BrokerError::Status(std::io::Error::other(format!("strict egress: {e}"))))?;
            Some(Egress::start(Arc::new(plan.clone()), listeners, authority)?)
        }
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
    let is_listeners = |r: &HelperRecord| matches!(r, HelperRecord::Listeners(_));
    let (channel, mut read, found) =
        read_until(channel, StatusRead::default(), is_listeners, within, "open the egress listeners").await?;
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

/// Reads the status channel, after what `read` holds, until a record that
/// is `wanted` comes (its index), or the helper stopped before it (`None`:
/// a failure record, or the channel's end). Bounded by `within`, the run's
/// own deadline; `what` the helper did not do in time otherwise.
async fn read_until(
    channel: std::fs::File,
    read: StatusRead,
    wanted: impl Fn(&HelperRecord) -> bool,
    within: Duration,
    what: &str,
) -> Result<(std::fs::File, StatusRead, Option<usize>), BrokerError> {
    let watch = StatusWatch::new(channel, read)?;
    let stops = |r: &HelperRecord| wanted(r) || matches!(r, HelperRecord::Failed(_));
    tokio::time::timeout(within, watch.until(stops))
        .await
        .map_err(|_| {
            BrokerError::Status(std::io::Error::other(format!("the helper did not {what} in time")))
        })?
        .map_err(BrokerError::Status)?;
    let (channel, read) = watch.into_parts()?;
    // A failure record stops the read, but the wanted record wins wherever it is.
    let found = read.records.iter().position(&wanted);
    Ok((channel, read, found))
}

/// Reads the status channel until the record `is` picks (see
/// [`read_until`]), takes it out of what was read, and with it the `count`
/// descriptors that came with it (after those of the overlays' records
/// before it). `None` when the helper stopped before it.
async fn take_record(
    (channel, read): (std::fs::File, StatusRead),
    is: impl Fn(&HelperRecord) -> bool,
    count: usize,
    within: Duration,
    what: &str,
) -> Result<(std::fs::File, StatusRead, Option<Vec<OwnedFd>>), BrokerError> {
    let (channel, mut read, found) = read_until(channel, read, is, within, what).await?;
    let Some(at) = found else { return Ok((channel, read, None)) };
    read.records.remove(at);
    let before = read.records[..at].iter().filter(|r| matches!(r, HelperRecord::Overlay { .. })).count();
    if read.fds.len() < before + count {
        let why = format!("the helper did {what} without sending its {count} descriptor(s)");
        return Err(BrokerError::Status(std::io::Error::other(why)));
    }
    let fds = read.fds.drain(before..before + count).collect();
    Ok((channel, read, Some(fds)))
}

/// The run's terminal: its master, which the helper sends just before the
/// command's exec (after any egress listeners, whose record and descriptors
/// `read` no longer holds). `None` without a terminal, or when the helper
/// stopped before (the run ends with that failure).
async fn take_terminal(
    resolved: &Resolved,
    channel: std::fs::File,
    read: StatusRead,
) -> Result<(std::fs::File, StatusRead, Option<OwnedFd>), BrokerError> {
    if resolved.plan.terminal.is_none() {
        return Ok((channel, read, None));
    }
    let is_terminal = |r: &HelperRecord| matches!(r, HelperRecord::Terminal);
    let (channel, read, master) =
        take_record((channel, read), is_terminal, 1, resolved.timeout, "open the terminal").await?;
    Ok((channel, read, master.and_then(|mut fds| fds.pop())))
}

/// A session's sandbox: its namespaces, which the helper sends once it is
/// built (after any terminal's master), go to the session's sink with its
/// cgroup (`cgroup`, the run's) for its commands to join. Nothing to wait
/// for in any other run, or when the helper stopped before.
async fn take_session<S: Sink + Send>(
    resolved: &Resolved,
    (channel, read): (std::fs::File, StatusRead),
    cgroup: Option<&RunCgroup>,
    sink: &mut S,
) -> Result<(std::fs::File, StatusRead), BrokerError> {
    if resolved.plan.session != Some(SessionRole::Hold) {
        return Ok((channel, read));
    }
    let is_session = |r: &HelperRecord| matches!(r, HelperRecord::Session);
    let count = resolved.plan.namespaces.names().len();
    let (channel, read, namespaces) =
        take_record((channel, read), is_session, count, resolved.timeout, "build the session").await?;
    if let Some(namespaces) = namespaces {
        let cgroup = cgroup.and_then(RunCgroup::membership).map(Arc::new);
        sink.session_held(crate::engine::stream::Built { namespaces, cgroup });
    }
    Ok((channel, read))
}

/// What the helper reported on its status channel.
struct Report {
    landlock: Option<LandlockReport>,
    exit: Option<ExitReport>,
    /// The command tree's peak resident set (bytes), as the helper saw it.
    peak_rss_bytes: Option<u64>,
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
        let mut report = Report { landlock: None, exit: None, peak_rss_bytes: None, overlays: Vec::new() };
        for r in records {
            match r {
                HelperRecord::Landlock(l) => report.landlock = Some(l),
                // Its figures are the run's usage (see `Engine::finish`).
                HelperRecord::Reaped { .. } => {}
                HelperRecord::Exit(e) => report.exit = Some(e),
                HelperRecord::Peak { max_rss_kib } => {
                    report.peak_rss_bytes = Some(max_rss_kib.saturating_mul(1024))
                }
                HelperRecord::Failed(f) if ended.is_none() => return Err(BrokerError::Helper(f)),
                HelperRecord::Failed(_) => {}
                // Read at the start of the run (strict egress, a terminal), never here.
                HelperRecord::Listeners(_) => {
                    return Err(BrokerError::Status(std::io::Error::other(
                        "egress listeners after the command started",
                    )));
                }
                HelperRecord::Terminal | HelperRecord::Session => {
                    return Err(BrokerError::Status(std::io::Error::other(
                        "a terminal or a session's namespaces after the command started",
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

/// What becomes of the writes held in the run's layers (see
/// [`crate::changes`]): applied, held or discarded as the run's policy
/// says, with what palisade ended the run for (a run that filled its bound
/// is ended so, and its writes are held like any ended run's). The bytes
/// written on the host, and what became of the rest.
async fn keep_writes(
    resolved: &Resolved,
    grants: &Grants,
    overlays: Vec<(String, OwnedFd)>,
    (ended, bound): (&mut Option<RunStatus>, Option<String>),
    (run_id, since): (u64, crate::changes::clock::Since),
) -> Result<(u64, Changes), BrokerError> {
    if let Some((target, _)) = overlays.into_iter().next() {
        // Every overlay the broker plans has its layer on disk, and no helper hands one over.
        return Err(BrokerError::UnplannedOverlay(target));
    }
    if resolved.in_place {
        return hold_made_in_place(resolved, grants, (*ended, bound), (run_id, since)).await;
    }
    let layers = grants.layers.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(layers) = layers else { return Ok((0, Changes::default())) };
    let dests = layer_targets(&resolved.plan, grants, &layers.record.roots)?;
    let (requester, keep_out) = (grants.requester.clone(), grants.keep_out.clone());
    let (keep, on_conflict, ended) = (resolved.keep_changes, resolved.on_conflict, *ended);
    let settled = tokio::task::spawn_blocking(move || {
        let s = crate::changes::Settle {
            run_id,
            requester: &requester,
            keep_out: &keep_out,
            since,
            keep,
            on_conflict,
            ended,
            bound,
        };
        let settled = crate::changes::settle(&s, layers, dests)?;
        if let Err(e) = keep_out.journal.append_all_blocking(settled.events, true) {
            tracing::error!(run_id, "what became of the run's writes is not recorded: {e}");
        }
        Ok::<_, BrokerError>(settled.changes)
    })
    .await??;
    Ok((settled.bytes, settled))
}

/// A run that wrote its trees in place (Tier C, `disk = "direct"`): what
/// it made there that the host executes is taken out and held (see
/// [`crate::changes::in_place`]), in the draft made for it before it
/// started; the rest is the host's already. Tier B holds nothing
/// read-only, so nothing there tells what the run made.
async fn hold_made_in_place(
    resolved: &Resolved,
    grants: &Grants,
    (ended, bound): (Option<RunStatus>, Option<String>),
    (run_id, since): (u64, crate::changes::clock::Since),
) -> Result<(u64, Changes), BrokerError> {
    let in_place = Changes { outcome: ChangesOutcome::InPlace, ..Changes::default() };
    let layers = grants.layers.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(layers) = layers else { return Ok((0, in_place)) };
    let (_, record) = crate::changes::in_place::of_plan(&resolved.plan, &resolved.in_place_code);
    let dests = layer_targets(&resolved.plan, grants, &layers.record.roots)?;
    let (requester, keep_out) = (grants.requester.clone(), grants.keep_out.clone());
    let (keep, on_conflict) = (resolved.keep_changes, resolved.on_conflict);
    let settled = tokio::task::spawn_blocking(move || {
        let s = crate::changes::Settle {
            run_id,
            requester: &requester,
            keep_out: &keep_out,
            since,
            keep,
            on_conflict,
            ended,
            bound,
        };
        let Some(settled) = crate::changes::in_place::hold_made(&s, layers, dests, &record)? else {
            return Ok::<_, BrokerError>(in_place);
        };
        if let Err(e) = keep_out.journal.append_all_blocking(settled.events, true) {
            tracing::error!(run_id, "what became of the run's writes is not recorded: {e}");
        }
        Ok(settled.changes)
    })
    .await??;
    Ok((0, settled))
}

/// `cancel`, or the run's writes passing their bound on disk (see
/// [`crate::changes::bound`]), whichever comes first; in the second case
/// the [`DiskBound`] returned holds why, in words naming the key.
fn bound_writes(
    grants: &Grants,
    resolved: &Resolved,
    cancel: impl Future<Output = ()> + Send,
) -> (impl Future<Output = ()> + Send, DiskBound) {
    let bound = resolved.plan.mounts.iter().find_map(|m| match m {
        palisade_protocol::Mount::Overlay { size_bytes, layer: Some(_), .. } => Some(*size_bytes),
        _ => None,
    });
    let layers = grants.layers.lock().unwrap_or_else(|e| e.into_inner());
    let watch = layers.as_ref().zip(bound).map(|(l, bound)| {
        let uppers = l.uppers.iter().filter_map(|fd| fd.try_clone().ok()).collect();
        crate::changes::bound::Watch::new(uppers, bound, grants.keep_out.store.limits.min_free_bytes)
    });
    let at_end = watch.as_ref().and_then(|w| w.try_clone().ok());
    let hit = Arc::new(std::sync::Mutex::new(None));
    let slot = hit.clone();
    let cancel = async move {
        let Some(watch) = watch else { return cancel.await };
        tokio::select! {
            () = cancel => {}
            why = watch.exceeded() => *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(why),
        }
    };
    (cancel, DiskBound { hit, at_end })
}

/// What [`bound_writes`] learns of the run's writes on disk: why they were
/// stopped, if they were, and the look taken once the run is over.
struct DiskBound {
    hit: Arc<std::sync::Mutex<Option<String>>>,
    at_end: Option<crate::changes::bound::Watch>,
}

impl DiskBound {
    /// Why the writes passed their bound: while the run went on (it was
    /// stopped), or, for a command that ended by itself (`ended` is
    /// `None`), as it left them (the whole of it written between two
    /// looks); `ended` then becomes `DiskLimitExceeded`.
    async fn passed(self, ended: &mut Option<RunStatus>) -> Option<String> {
        let hit = self.hit.lock().unwrap_or_else(|e| e.into_inner()).take();
        if hit.is_some() {
            if *ended == Some(RunStatus::Cancelled) {
                *ended = Some(RunStatus::DiskLimitExceeded);
            }
            return hit;
        }
        let why = match (&ended, self.at_end) {
            (None, Some(watch)) => watch.passed_at_end().await,
            _ => None,
        };
        if why.is_some() {
            *ended = Some(RunStatus::DiskLimitExceeded);
        }
        why
    }
}

/// A started helper.
struct Helper<'a> {
    /// Readable once the helper has exited.
    pidfd: AsyncFd<OwnedFd>,
    status: &'a StatusWatch,
    /// Holds every process of the run, whatever it did.
    cgroup: Option<&'a RunCgroup>,
    run_id: u64,
    pid: u32,
}

impl Child for Helper<'_> {
    /// The helper's exit, or its report that every process of the sandbox
    /// is gone, whichever comes first (see [`crate::engine::exiting`]).
    async fn exited(&self) {
        tokio::select! {
            ready = self.pidfd.readable() => {
                if let Ok(mut guard) = ready {
                    guard.retain_ready();
                }
            }
            () = self.status.reaped() => {}
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

/// Kills and reaps a helper whose run is left before it was reaped: an
/// error on the way, or the run's future dropped (a panic caught, a
/// connection aborted at shutdown). Disarmed just before the reaping.
struct Abandon {
    pid: u32,
    pidfd: Option<OwnedFd>,
    first_signal: i32,
}

impl Abandon {
    /// Holds a descriptor of its own for the helper; without one (out of
    /// descriptors) the helper is killed and reaped at once, and the run fails.
    fn arm(pid: u32, pidfd: &OwnedFd, first_signal: i32) -> std::io::Result<Abandon> {
        match pidfd.try_clone() {
            Ok(own) => Ok(Abandon { pid, pidfd: Some(own), first_signal }),
            Err(e) => {
                let _ = pidfd_kill(pidfd, libc::SIGKILL);
                let _ = reap(pid);
                Err(e)
            }
        }
    }

    fn disarm(mut self) {
        self.pidfd = None;
    }

    /// The same guard, which kills with `signal` first.
    fn first(mut self, signal: i32) -> Abandon {
        self.first_signal = signal;
        self
    }

    /// The helper reported its sandbox gone and exits by itself: it is
    /// reaped after the answer ([`Exiting`]), not killed.
    fn exiting(mut self) -> Option<Exiting> {
        self.pidfd.take().map(|pidfd| Exiting { pid: self.pid, pidfd })
    }
}

impl Drop for Abandon {
    fn drop(&mut self) {
        let Some(pidfd) = self.pidfd.take() else { return };
        let (pid, first) = (self.pid, self.first_signal);
        tracing::warn!(pid, "a run was left before its end: killing its sandbox");
        // Waiting (the grace of SIGTERM, then the reaping) is not for this thread.
        std::thread::spawn(move || {
            let _ = pidfd_kill(&pidfd, first);
            if first != libc::SIGKILL && !exits_within(&pidfd, crate::engine::stream::TERM_GRACE) {
                let _ = pidfd_kill(&pidfd, libc::SIGKILL);
            }
            if let Err(e) = reap(pid) {
                tracing::error!(pid, "cannot reap an abandoned helper: {e}");
            }
        });
    }
}

/// Whether the process of `pidfd` exits within `grace`.
fn exits_within(pidfd: &OwnedFd, grace: Duration) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let timeout = PollTimeout::try_from(grace).unwrap_or(PollTimeout::MAX);
    let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
    poll(&mut fds, timeout).is_ok_and(|n| n > 0)
}

/// Sends the plan (`plan`, encoded from `decoded`) and the descriptors of
/// its host paths on the helper's fd 3, or a system broker's trees of its
/// mounts ([`crate::engine::capture`]). Into an empty socket a plan that
/// fits its buffer goes at once; a larger one is written from a blocking
/// thread while the helper reads it.
fn hand_over(
    channel: UnixStream,
    plan: Vec<u8>,
    decoded: &JailPlan,
    descriptors: &[OwnedFd],
) -> std::io::Result<()> {
    let sent = crate::engine::capture::sent(decoded, descriptors)?;
    if plan.len() <= PLAN_AT_ONCE_BYTES {
        return send_plan(channel, &plan, &sent.fds());
    }
    let owned = sent.owned()?;
    tokio::task::spawn_blocking(move || {
        let fds: Vec<BorrowedFd<'_>> = owned.iter().map(AsFd::as_fd).collect();
        send_plan(channel, &plan, &fds)
    });
    Ok(())
}

/// The granted directories of the run's layers (host paths, in order), as
/// the descriptors opened at decision time, never the paths again.
fn layer_targets(
    plan: &palisade_protocol::JailPlan,
    grants: &Grants,
    roots: &[String],
) -> Result<Vec<OwnedFd>, BrokerError> {
    let mut out = Vec::new();
    for source in roots {
        let dest = plan.descriptor(source).and_then(|i| grants.descriptors.get(i));
        let dest = dest.ok_or_else(|| BrokerError::UnplannedOverlay(source.clone()))?;
        out.push(dest.try_clone()?);
    }
    Ok(out)
}

/// Pipe capacity asked for the command's stdout and stderr: fewer wake-ups
/// per byte than the default 64 KiB. Best effort (the kernel may refuse
/// past the user's pipe-buffer allowance; the default then stays).
const PIPE_BYTES: usize = 256 * 1024;

fn pipe_reader<T: Into<OwnedFd>>(end: Option<T>) -> std::io::Result<pipe::Receiver> {
    let fd: OwnedFd = end.ok_or_else(|| std::io::Error::other("missing pipe"))?.into();
    // Best effort: a smaller pipe only means more wake-ups.
    let _ = rustix::pipe::fcntl_setpipe_size(&fd, PIPE_BYTES);
    pipe::Receiver::from_owned_fd(fd)
}

/// The run's terminal's master, read as the command's output: tokio's pipe
/// reader takes any descriptor epoll watches, non-blocking. It reads `EIO`
/// once every process of the run has closed the terminal: its end.
fn terminal_reader(master: OwnedFd) -> std::io::Result<pipe::Receiver> {
    let master = std::fs::File::from(master);
    nonblocking(&master, true)?;
    pipe::Receiver::from_owned_fd_unchecked(OwnedFd::from(master))
}
