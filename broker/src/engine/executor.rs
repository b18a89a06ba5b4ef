//! The seam between deciding a run and running it.
//!
//! The broker ([`crate::decide::service::Broker`]) decides every request the
//! same way on every system, records it, asks for approval, applies the
//! queue, and is served by one server ([`crate::serve::server`]). What it
//! takes of the host and how a decided run is run belong to an
//! [`Executor`]: Linux's (`engine/linux.rs`'s `Linux`: the helper's
//! namespaces, Landlock and seccomp, cgroups, the warm pool, change sets)
//! and macOS's (`seatbelt/executor.rs`'s `Macos`: Seatbelt). One request, one
//! implementation per system.

use crate::engine::stream::{SessionCgroup, Sink};
use crate::error::BrokerError;
use crate::host::paths::TempRoot;
use crate::host::peer::Peer;
use crate::journal::{Event, Journal};
use palisade_policy::Approval;
use palisade_policy::host::OwnedPath;
use palisade_policy::host_executed::HostExecuted;
use palisade_policy::ids::ResolvedIds;
use palisade_policy::{Config, Context, Host, Policy, Resolved};
use palisade_protocol::wire::{CgroupStatus, ErrorReply, PoolStatus, RunRequest, RunResult};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

/// What a decision is made with, besides the request.
pub struct Deciding<'a> {
    pub peer: &'a Peer,
    /// The decision's context, its run number set.
    pub context: &'a Context,
    /// The policy the run is decided with, and keeps.
    pub policy: &'a Policy,
    /// The files the host executes, which no run's writes may reach.
    pub host_executed: Arc<HostExecuted>,
    /// What the broker keeps out of every run's reach now.
    pub owned: Arc<[OwnedPath]>,
    pub journal: &'a Journal,
}

/// An allowed run, with what it holds of the host until it ends.
pub struct Opened<H> {
    pub resolved: Box<Resolved>,
    /// Why a person must approve the run first, if one must.
    pub approval: Option<Approval>,
    pub held: H,
}

/// A run prepared to start: what the executor took for it, and the record
/// of its start (written before it starts).
pub struct Prepared<P> {
    pub taken: P,
    pub started: Event,
}

/// What an executor's assembly gives the broker: the configuration's names
/// resolved, the context every decision starts from, the runs' directory
/// and the journal.
pub struct Parts {
    pub ids: ResolvedIds,
    pub context: Context,
    pub temp_root: TempRoot,
    pub journal: Journal,
}

/// Where decided runs run: one implementation per system.
pub trait Executor: Send + Sync + Sized + 'static {
    /// What a decided run holds of the host until it ends (the paths
    /// opened for it, its own directories).
    type Held: Send + Sync;
    /// What preparing a run took (a warm sandbox, a profile).
    type Taken: Send;

    /// The broker, as its hello and `status` name it.
    fn broker_name(&self) -> String;

    /// Why `peer` may not use a broker running as uid `me` with this
    /// executor, beyond what `[broker]` allows; `None` if it may.
    fn refusal(&self, me: u32, peer: &Peer) -> Option<String>;

    /// The host as a decision in `context` sees it now, read with the
    /// calling thread's credentials.
    fn host(&self, context: &Context, owned: Arc<[OwnedPath]>) -> Host;

    /// `f`, with the credentials of `peer` where this broker acts for it.
    fn as_requester<T: Send>(&self, peer: &Peer, f: impl FnOnce() -> T + Send) -> Result<T, ErrorReply>;

    /// The policy's decision on `request`, made as the requester, and what
    /// the run will use opened. Blocks: call it where blocking is allowed.
    fn decide(&self, deciding: Deciding<'_>, request: &RunRequest) -> Result<Opened<Self::Held>, ErrorReply>;

    /// Takes what run `run_id` needs before it is recorded as started (the
    /// record is the result's): `resolved` and `held` may change (a warm
    /// sandbox's cgroup becomes the run's; its overlays get their layers).
    fn prepare(
        &self,
        run_id: u64,
        resolved: &mut Resolved,
        held: &mut Self::Held,
        request: &RunRequest,
        config: &Config,
    ) -> impl Future<Output = Result<Prepared<Self::Taken>, BrokerError>> + Send;

    /// Gives back what [`Executor::prepare`] took, for a run that does not start.
    fn discard(&self, taken: Self::Taken) -> impl Future<Output = ()> + Send;

    /// Runs run `run_id` to its result; `cancel` completing (the client
    /// gone, a shutdown) kills it, and so does dropping the future. The
    /// command's first instruction waits for `recorded`: `true` once the
    /// run's start is on disk; `false`, it is never run (and the result is
    /// the journal's error, which the caller has).
    #[allow(clippy::too_many_arguments)]
    fn execute<S: Sink + Send>(
        &self,
        run_id: u64,
        resolved: &Resolved,
        held: &Self::Held,
        taken: Self::Taken,
        request: &RunRequest,
        sink: &mut S,
        recorded: impl Future<Output = bool> + Send,
        cancel: impl Future<Output = ()> + Send,
    ) -> impl Future<Output = Result<RunResult, BrokerError>> + Send;

    /// The warm pool and the cgroups, for `status`.
    fn status(&self) -> (PoolStatus, CgroupStatus);

    /// Sandboxes whose run was answered and which are still being torn
    /// down (a Tier C helper's exit follows its answer), for `status`.
    fn tearing_down(&self) -> usize {
        0
    }

    /// What the broker keeps out of every run's reach besides its state
    /// (see [`crate::decide::owned::owned`]): each path, what it is, and
    /// whether runs may not even see it.
    fn keeps(&self, config: &Config) -> Vec<(PathBuf, &'static str, bool)>;

    /// Makes `resolved` a session's: a sandbox held until the session ends,
    /// its command never run. `Unavailable` where sessions are not built.
    fn hold(&self, _resolved: &mut Resolved) -> Result<(), ErrorReply> {
        Err(sessions_unavailable())
    }

    /// Makes `resolved`, decided for a command of a session, a run in the
    /// session's sandbox (`session`): refused if it would reach anything
    /// the session's own plan does not.
    fn join(
        &self,
        _resolved: &mut Resolved,
        _held: &mut Self::Held,
        _session: &Sandbox,
    ) -> Result<(), ErrorReply> {
        Err(sessions_unavailable())
    }

    /// Unconnected TCP sockets of the session's own network (IPv4, then
    /// IPv6 where it has it): a port of its loopback, published, is
    /// reached through them. Blocking. `Unavailable` where sessions are not built.
    fn loopback_sockets(&self, _session: &Sandbox) -> Result<Vec<std::os::fd::OwnedFd>, ErrorReply> {
        Err(sessions_unavailable())
    }

    /// The change sets held for review, where this executor keeps them.
    #[cfg(target_os = "linux")]
    fn changes(&self) -> Option<&Arc<crate::changes::Store>> {
        None
    }
}

/// A held session's sandbox: the plan it was built from, and its namespaces.
pub struct Sandbox {
    pub plan: palisade_protocol::JailPlan,
    pub namespaces: Vec<std::os::fd::OwnedFd>,
    /// The session's cgroup where its runs get one: the limits decided for
    /// it (a command decided others is refused), and how its commands join it.
    pub cgroup: Option<(palisade_policy::CgroupPlan, Option<Arc<SessionCgroup>>)>,
}

/// What [`Executor::execute`] answers when its `recorded` says `false`: the
/// caller answers the journal's own error in its place.
pub fn not_recorded() -> BrokerError {
    BrokerError::JournalUnavailable("the run's start could not be recorded".into())
}

/// Sessions, where an executor has none.
pub fn sessions_unavailable() -> ErrorReply {
    ErrorReply::with_rule(
        palisade_protocol::wire::ErrorKind::Unavailable,
        "a session is a Tier C sandbox (Linux's namespaces), which this broker's executor does not have",
        "session.unavailable",
    )
}

/// The policy's decision on `request`: the run (and why a person must
/// approve it first, if one must), or the refusal.
pub fn decision(
    policy: &Policy,
    host: &Host,
    context: &Context,
    request: &RunRequest,
) -> Result<(Box<Resolved>, Option<Approval>), ErrorReply> {
    match policy.decide(host, context, request) {
        palisade_policy::Decision::Allow(r) => Ok((r, None)),
        palisade_policy::Decision::NeedsApproval { reason, rule, resolved } => {
            Ok((resolved, Some(Approval { reason, rule })))
        }
        palisade_policy::Decision::Deny(d) => Err(ErrorReply::with_rule(d.kind, d.reason, d.rule)),
    }
}
