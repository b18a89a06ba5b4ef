//! The broker service, shared by palisaded and the CLI's embedded broker,
//! on every system: a peer's request decided by policy as the peer,
//! recorded, held for approval where it must be, and run by the
//! system's [`Executor`].

use crate::decide::approvals::Pending;
use crate::decide::settings::Settings;
use crate::engine::executor::{Deciding, Executor, Opened, Parts, Prepared};
use crate::engine::stream::Sink;
use crate::error::BrokerError;
use crate::host::paths;
use crate::host::peer::Peer;
pub use crate::journal::events::journal_refusal;
use crate::journal::{Event, Journal, RefusalRecord, events};
use palisade_policy::Approval;
use palisade_policy::host::OwnedPath;
use palisade_policy::trust::EscalationReason;
use palisade_policy::{Config, ConfigError, Context, Host, Resolved};
use palisade_protocol::HostIds;
use palisade_protocol::wire::{
    Approved, ErrorKind, ErrorReply, Explanation, PendingApproval, RunRequest, RunResult, RunStatus, ToolInfo,
};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// The executor of the system this is built for.
#[cfg(target_os = "linux")]
pub type Native = crate::engine::linux::Linux;
/// The executor of the system this is built for.
#[cfg(target_os = "macos")]
pub type Native = crate::seatbelt::executor::Macos;

/// The broker: what every system's palisaded and embedded broker are.
pub struct Broker<E: Executor = Native> {
    /// Where its runs run.
    pub executor: E,
    /// What decides each request; replaced whole by a reload (see [`crate::decide::settings`]).
    settings: RwLock<Arc<Settings>>,
    /// Reloads that took effect since the broker started.
    reloads: AtomicU64,
    /// The context every decision starts from; `run` is set per request.
    pub context: Context,
    /// The audit journal every request, decision, approval, trust
    /// transition and run is recorded in.
    pub journal: Journal,
    /// The runs held for approval now.
    pub pending: Pending,
    /// Tier A: the skills, their stores, and the plugin-host, where they are served.
    #[cfg(target_os = "linux")]
    pub plugins: Option<Arc<crate::plugins::Plugins>>,
    /// What the broker keeps, out of every run's reach (see [`crate::decide::owned::owned`]);
    /// a reload may add to it, never take away.
    owned: RwLock<Arc<[OwnedPath]>>,
    /// Where the runs' host directories go (`context.temp_root`), kept
    /// while the broker is (one of an unpredictable name goes with it).
    _temp_root: paths::TempRoot,
    next_run: AtomicU64,
}

/// A run held for approval: what is shown, and the run it would be.
pub struct Question {
    pub pending: PendingApproval,
    /// Why it is held, and the rule a refusal for want of an answer carries.
    pub approval: Approval,
    pub run: Arc<Resolved>,
    /// How long it waits for an answer (`approval_timeout_secs` of the
    /// settings the run was decided with).
    pub timeout_secs: u64,
}

/// A decided request, ready to run.
pub struct Decided<H> {
    pub run_id: u64,
    pub resolved: Box<Resolved>,
    /// Why a person must approve the run first, if one must.
    pub approval: Option<Approval>,
    /// The approval was an approver's: only then does a tool's successful
    /// run count towards its Verified stage.
    pub approver_approved: bool,
    /// The uid that approved it (the result's `approved` names it).
    pub approved_by: Option<u32>,
    /// What the run holds of the host until it ends (the executor's).
    held: H,
    /// The settings it was decided with, which its run keeps whatever a reload does.
    pub settings: Arc<Settings>,
    /// The request's and the decision's records, written with the run's start.
    pending: Vec<Event>,
}

/// The refusal of a run that needed `approval` and did not get it: the
/// rule that asked (a tool's Trial or escalation, or the fallback).
pub fn not_approved(approval: &Approval, why: &str) -> ErrorReply {
    ErrorReply::with_rule(
        ErrorKind::NeedsApproval,
        format!("{} Not approved: {why}.", approval.reason),
        approval.rule,
    )
}

#[cfg(target_os = "linux")]
impl Broker {
    /// A broker for `config`. Call before starting any thread: the probe of
    /// user namespaces forks.
    pub fn assemble(config: Config, helper: Option<PathBuf>) -> Result<Broker, String> {
        Self::assemble_with(config, helper, false)
    }

    /// A broker for one run (the CLI's embedded one): its helper is started,
    /// on the spawner's thread, while the broker is put together and decides.
    pub fn assemble_one_run(config: Config) -> Result<Broker, String> {
        Self::assemble_with(config, None, true)
    }

    fn assemble_with(config: Config, helper: Option<PathBuf>, one_run: bool) -> Result<Broker, String> {
        let (linux, parts) = Native::assemble(&config, helper, one_run)?;
        let (engine, pid) = (&linux.engine, parts.context.parent_pid);
        let cgroups = linux.cgroups.clone();
        let plugins =
            crate::plugins::Plugins::new(&config, engine.spawner().clone(), engine.helper(), pid, cgroups)?;
        let mut broker = Broker::new(linux, config, parts)?;
        broker.plugins = Some(Arc::new(plugins));
        // The CLI's embedded broker holds its own user's only: a look at one directory.
        broker.recover_writes(one_run.then(|| nix::unistd::geteuid().as_raw()));
        Ok(broker)
    }

    /// Holds the writes of runs a broker killed meanwhile left unsettled
    /// (see [`crate::changes::recover`]), and records them.
    fn recover_writes(&self, only: Option<u32>) {
        let Some(store) = self.executor.changes().cloned() else { return };
        let keep_out = crate::changes::KeepOut {
            owned: self.owned(),
            host_executed: self.settings().host_executed.clone(),
            store,
            journal: self.journal.clone(),
        };
        let events = crate::changes::recover(&keep_out, only);
        if !events.is_empty() {
            if let Err(e) = self.journal.append_all_blocking(events, true) {
                tracing::error!("what became of the writes of runs left unsettled is not recorded: {e}");
            }
        }
    }
}

impl<E: Executor> Broker<E> {
    /// A broker for `config` running with `executor`, from the `parts` its
    /// assembly gave.
    pub fn new(executor: E, config: Config, parts: Parts) -> Result<Broker<E>, String> {
        let Parts { ids, context, temp_root, journal } = parts;
        let keeps = executor.keeps(&config);
        let owned = crate::decide::owned::owned(&config, journal.dir(), &context.temp_root, &keeps);
        // After the journal: a declaration changed since the last start is a transition it records.
        let settings = Settings::new(config, ids, context.uid, &journal)?;
        Ok(Broker {
            executor,
            settings: RwLock::new(Arc::new(settings)),
            reloads: AtomicU64::new(0),
            context,
            journal,
            pending: Pending::default(),
            #[cfg(target_os = "linux")]
            plugins: None,
            owned: RwLock::new(owned.into()),
            _temp_root: temp_root,
            next_run: AtomicU64::new(1),
        })
    }

    /// The policy's decision on `request` and the sandbox it would get,
    /// decided as the requester (as a run's is), without running anything:
    /// the plan's paths are not opened (nor, for a root broker, their
    /// owners checked) and a tool's trust stage is not consulted.
    pub fn explain(&self, peer: &Peer, request: &RunRequest) -> Result<Explanation, ErrorReply> {
        let context = Context {
            requester: HostIds { uid: peer.uid, gid: peer.gid },
            groups: peer.groups.clone(),
            trust: None,
            ..self.context.clone()
        };
        let settings = self.settings();
        let decision = self
            .executor
            .as_requester(peer, || settings.policy.decide(&self.host(&context), &context, request))?;
        Ok(palisade_policy::explain::explanation(&decision, settings.config().source_name()))
    }

    /// Decides a request: the run it will be, and whether a person must
    /// approve it first. Nothing runs yet. The decision and everything it
    /// reads of the host is done as the requester (see the executor's
    /// [`Executor::decide`]); call it where blocking is allowed.
    pub fn decide(&self, peer: &Peer, request: &RunRequest) -> Result<Decided<E::Held>, ErrorReply> {
        let run_id = self.next_run.fetch_add(1, Ordering::Relaxed);
        // Taken once: the run keeps these whatever a reload does meanwhile.
        let settings = self.settings();
        let context = Context {
            run: run_id,
            requester: HostIds { uid: peer.uid, gid: peer.gid },
            groups: peer.groups.clone(),
            trust: tool_trust(&settings, request)?,
            ..self.context.clone()
        };
        let deciding = std::time::Instant::now();
        let owned = self.owned();
        let (policy, journal) = (&settings.policy, &self.journal);
        let host_executed = settings.host_executed.clone();
        let decided = self
            .executor
            .decide(Deciding { peer, context: &context, policy, owned, host_executed, journal }, request);
        tracing::debug!(run_id, decide_us = deciding.elapsed().as_micros(), "policy decided");
        let who = (peer.uid, peer.gid, peer.pid);
        let Opened { resolved, approval, held } = match escalated(&settings, request, decided) {
            Ok(opened) => opened,
            Err(e) => return Err(self.record_refusal(run_id, peer, request, e)),
        };
        let mut pending = vec![
            events::received(run_id, who, request),
            events::decision(run_id, if approval.is_some() { "needs_approval" } else { "allow" }, None),
        ];
        if approval.is_some() {
            // Recorded before anybody is asked.
            self.journal.start_all_blocking(std::mem::take(&mut pending), false).map_err(journal_refusal)?;
        }
        Ok(Decided {
            run_id,
            resolved,
            approval,
            approver_approved: false,
            approved_by: None,
            held,
            settings,
            pending,
        })
    }

    /// Makes a decided run a session's held sandbox (see [`Executor::hold`]).
    pub fn hold(
        &self,
        peer: &Peer,
        decided: &mut Decided<E::Held>,
        request: &RunRequest,
    ) -> Result<(), ErrorReply> {
        let held = self.executor.hold(&mut decided.resolved);
        held.map_err(|e| self.record_refusal(decided.run_id, peer, request, e))
    }

    /// Makes a decided run a command of the session `sandbox` (see [`Executor::join`]).
    pub fn join(
        &self,
        peer: &Peer,
        decided: &mut Decided<E::Held>,
        request: &RunRequest,
        sandbox: &crate::engine::executor::Sandbox,
    ) -> Result<(), ErrorReply> {
        let joined = self.executor.join(&mut decided.resolved, &mut decided.held, sandbox);
        joined.map_err(|e| self.record_refusal(decided.run_id, peer, request, e))
    }

    /// Records the refusal `e` of a request, in bounded form and at its
    /// uid's rate (see [`Journal::refusal_blocking`]); the refusal to send,
    /// or `JournalUnavailable` when it cannot be recorded.
    fn record_refusal(&self, run_id: u64, peer: &Peer, request: &RunRequest, e: ErrorReply) -> ErrorReply {
        let refused = events::refused(run_id, (peer.uid, peer.gid, peer.pid), request);
        let decision = events::decision(run_id, "deny", Some(&e));
        match self.journal.refusal_blocking(peer.uid, vec![refused, decision]) {
            Err(j) => return journal_refusal(j),
            Ok(RefusalRecord::Written) => {
                tracing::info!(run_id, uid = peer.uid, rule = e.rule, "denied: {}", e.message);
            }
            // Counted, as the journal counts it: a client refused in a loop is not a line each.
            Ok(RefusalRecord::Counted) => {
                tracing::debug!(run_id, uid = peer.uid, rule = e.rule, "denied: {}", e.message);
            }
        }
        e
    }

    /// What a run held for approval shows its requester and the approvers,
    /// and the run itself (for Cedar's `approve`).
    pub fn pending_approval(
        &self,
        peer: &Peer,
        decided: &Decided<E::Held>,
        request: &RunRequest,
        approval: &Approval,
    ) -> Question {
        let r = &decided.resolved;
        let timeout_secs = decided.settings.config().policy.approval_timeout_secs;
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let shown = |p: &PathBuf| p.to_string_lossy().into_owned();
        let mut limits = std::collections::BTreeMap::new();
        limits.insert("timeout_secs".to_string(), r.timeout.as_secs());
        limits.insert("max_output_bytes".to_string(), r.max_output_bytes);
        if let Some(c) = &r.cgroup {
            limits.insert("memory_bytes".to_string(), c.memory_bytes);
            limits.insert("processes".to_string(), c.processes);
            limits.insert("cpu_percent".to_string(), c.cpu_percent);
        }
        let pending = PendingApproval {
            id: 0,
            run_id: decided.run_id,
            uid: peer.uid,
            gid: peer.gid,
            pid: peer.pid,
            tool: r.tool.clone(),
            reason: approval.reason.clone(),
            argv: request.argv.clone(),
            read_only: r.granted.iter().filter(|p| !r.writable.contains(p)).map(shown).collect(),
            read_write: r.writable.iter().map(shown).collect(),
            network: r.network.to_string(),
            egress: r.egress.to_string(),
            limits,
            trigger: r.escalation.clone(),
            created_unix: now,
            expires_unix: now + timeout_secs,
        };
        Question { pending, approval: approval.clone(), run: Arc::new((**r).clone()), timeout_secs }
    }

    /// The declared tools with their stage and declaration (`untracked`
    /// where trust stages are off).
    pub fn tools(&self) -> Result<Vec<ToolInfo>, BrokerError> {
        let settings = self.settings();
        match &settings.trust {
            Some(trust) => trust.list(),
            None => Ok(crate::decide::trust::untracked(settings.config())),
        }
    }

    /// Approves `tool`'s declaration for `by_uid` (authorized by the caller): Draft → Trial.
    pub fn approve_tool(&self, tool: &str, by_uid: u32) -> Result<ToolInfo, BrokerError> {
        match &self.settings().trust {
            Some(trust) => trust.approve(tool, by_uid),
            None => Err(ErrorReply::new(
                ErrorKind::InvalidRequest,
                "this broker keeps no trust stages ([trust] enabled = false, or no tool is declared)",
            )
            .into()),
        }
    }
    /// The host as a decision in `context` sees it now, read with the
    /// calling thread's credentials.
    pub fn host(&self, context: &Context) -> Host {
        self.executor.host(context, self.owned())
    }

    /// Adds `path` (what it is: `what`) to what the broker keeps out of
    /// every run's reach: the socket's directory, once it serves one.
    pub fn keep_out_of_reach(&self, path: &std::path::Path, what: &str) {
        let path = paths::canonical_prefix(path);
        let mut owned = self.owned.write().unwrap_or_else(|e| e.into_inner());
        *owned = crate::decide::settings::with_owned(
            &owned,
            vec![OwnedPath { path, what: what.into(), hidden: true }],
        );
    }

    /// What the broker keeps out of every run's reach now.
    pub fn owned(&self) -> Arc<[OwnedPath]> {
        self.owned.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The settings that decide a request now (see [`crate::decide::settings`]).
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How many reloads took effect since the broker started.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// Reads the configuration file `path` again, checked as a start checks
    /// it, and makes it decide every request from now on; runs decided
    /// before keep what they were decided with. The keys that need a
    /// restart keep their running values (the result names those that
    /// differed). Recorded in the journal before it takes effect: an error
    /// (the file's, or the journal's) changes nothing.
    pub fn reload(&self, path: &Path) -> Result<Vec<&'static str>, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source }.to_string())?;
        let mut config = Config::parse(&text, path).map_err(|e| e.to_string())?;
        let ids = config.resolve_ids(&crate::host::accounts::Accounts).map_err(|e| e.to_string())?;
        let running = self.settings();
        let needs_restart = crate::decide::settings::keep_restart_only(running.config(), &mut config);
        let keeps = self.executor.keeps(&config);
        let more = crate::decide::owned::owned(&config, self.journal.dir(), &self.context.temp_root, &keeps);
        let settings = Settings::new(config, ids, self.context.uid, &self.journal)?;
        let event = Event::ConfigReloaded {
            path: path.display().to_string(),
            sha256: crate::journal::attest::sha256_hex(text.as_bytes()),
            needs_restart: needs_restart.iter().map(|k| k.to_string()).collect(),
        };
        self.journal.append_blocking(event).map_err(|e| e.to_string())?;
        {
            let mut owned = self.owned.write().unwrap_or_else(|e| e.into_inner());
            *owned = crate::decide::settings::with_owned(&owned, more);
        }
        *self.settings.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(settings);
        self.reloads.fetch_add(1, Ordering::Relaxed);
        Ok(needs_restart)
    }

    /// Decides and runs a request that needs nobody's approval (one that does
    /// is refused with `NeedsApproval`: use [`Broker::decide`] and ask).
    pub async fn run<S: Sink + Send>(
        &self,
        peer: &Peer,
        request: &RunRequest,
        sink: &mut S,
        cancel: impl Future<Output = ()> + Send,
    ) -> Result<RunResult, BrokerError> {
        let decided = self.decide(peer, request)?;
        if let Some(reason) = &decided.approval {
            return Err(not_approved(reason, "nobody was asked").into());
        }
        self.execute(peer, decided, request, sink, cancel).await
    }

    /// Runs what [`Broker::decide`] resolved (approved, where it had to be).
    pub async fn execute<S: Sink + Send>(
        &self,
        peer: &Peer,
        decided: Decided<E::Held>,
        request: &RunRequest,
        sink: &mut S,
        cancel: impl Future<Output = ()> + Send,
    ) -> Result<RunResult, BrokerError> {
        let Decided {
            run_id,
            mut resolved,
            approval,
            approver_approved,
            approved_by,
            mut held,
            settings,
            mut pending,
        } = decided;
        // Who approved it, for its result.
        let approved = match (&approval, approved_by) {
            (Some(a), Some(uid)) => Some(approved(uid, a).await),
            _ => None,
        };
        // A run of a tool an approver approved: its success counts towards Verified.
        let counts = approval.is_some() && approver_approved;
        let trial = counts.then(|| settings.trust.clone()).flatten().zip(resolved.tool.clone());
        if approval.is_some() && !approver_approved && resolved.tool.is_some() {
            tracing::info!(
                run_id,
                uid = peer.uid,
                "approved by its requester: it counts for nothing towards Verified"
            );
        }
        if let Some(approval) = approval {
            tracing::info!(run_id, uid = peer.uid, "approved: {}", approval.reason);
        }
        let Prepared { taken, started } =
            match self.executor.prepare(run_id, &mut resolved, &mut held, request, settings.config()).await {
                Ok(prepared) => prepared,
                Err(e) => {
                    // What could not be made ready is recorded as the run's failure.
                    self.journal.start_all(pending, false).await?;
                    return self.record_end(run_id, Err(e)).await;
                }
            };
        // Synced while the sandbox is built, and on disk before the command's
        // first instruction: a run that cannot be recorded does not run.
        pending.push(started);
        let recording = self.journal.start_all(pending, true);
        let (on_disk, recorded) = tokio::sync::oneshot::channel();
        let recording = async move {
            let outcome = recording.await;
            #[cfg(target_os = "linux")]
            let outcome = crate::fault::start_not_recorded().await.map_or(outcome, Err);
            let _ = on_disk.send(outcome.is_ok());
            outcome
        };
        for w in &resolved.warnings {
            tracing::warn!(run_id, "{w}");
        }
        let recorded = async move { recorded.await.unwrap_or(false) };
        let running = self.executor.execute(run_id, &resolved, &held, taken, request, sink, recorded, cancel);
        let (recording, result) = tokio::join!(recording, crate::decide::panics::Caught::new(running));
        let result = result.unwrap_or_else(|panic| {
            tracing::error!(run_id, uid = peer.uid, pid = peer.pid, "the run's handling panicked: {panic}");
            Err(BrokerError::Internal(format!("run {run_id}")))
        });
        drop(held);
        let result = result.map(|r| RunResult { approved, ..r });
        // Not recorded: the command was never released, and the run is the journal's refusal.
        recording?;
        if let (Some((trust, tool)), Ok(RunResult { status: RunStatus::Exited { code: 0 }, .. })) =
            (trial, &result)
        {
            let counted = tokio::task::spawn_blocking(move || trust.succeeded(&tool)).await;
            if let Err(e) = counted.map_err(BrokerError::from).and_then(|r| r) {
                tracing::error!(
                    run_id,
                    "the run's success is not counted towards its tool's Verified stage: {e}"
                );
            }
        }
        self.record_end(run_id, result).await
    }

    /// Records how a run ended, on disk before the client hears of it; the
    /// result's attestation gets the record's seq and hash. A run whose end
    /// cannot be recorded is answered `JournalUnavailable` instead.
    async fn record_end(
        &self,
        run_id: u64,
        result: Result<RunResult, BrokerError>,
    ) -> Result<RunResult, BrokerError> {
        let records = match &result {
            Ok(r) => events::run_ended(r),
            Err(e) => vec![events::run_failed(run_id, e.kind(), e.to_string(), e.helper_failure())],
        };
        let receipt = self.journal.append_many(records).await?;
        let mut result = result?;
        if self.journal.enabled() {
            let record = palisade_protocol::attest::JournalRecord { seq: receipt.seq, hash: receipt.hash };
            result.attestation.journal = Some(record);
        }
        Ok(result)
    }
}

/// Who approved a run held for `approval`: `uid`, and its name where the host knows it.
async fn approved(uid: u32, approval: &Approval) -> Approved {
    let name = tokio::task::spawn_blocking(move || crate::host::accounts::user_name(uid)).await;
    Approved {
        uid,
        name: name.ok().flatten(),
        rule: approval.rule.to_string(),
        reason: approval.reason.clone(),
    }
}

/// The requested tool's trust stage, where stages apply.
fn tool_trust(
    settings: &Settings,
    request: &RunRequest,
) -> Result<Option<palisade_policy::ToolTrust>, ErrorReply> {
    let (Some(trust), Some(tool)) = (&settings.trust, &request.tool) else { return Ok(None) };
    trust.stage(tool).map(Some).map_err(ErrorReply::from)
}

/// A decision on a tool's run that escalated puts the tool back to
/// Draft before anything else happens (the first run of a Trial tool
/// does not: it is what Trial is for). The change must be recorded, or
/// the run is refused.
fn escalated<H>(
    settings: &Settings,
    request: &RunRequest,
    decided: Result<Opened<H>, ErrorReply>,
) -> Result<Opened<H>, ErrorReply> {
    let (Some(trust), Some(tool)) = (&settings.trust, &request.tool) else { return decided };
    let why = match &decided {
        Err(e) if e.rule.as_deref() == Some(palisade_policy::trust::SENSITIVE_RULE) => {
            format!("escalation SensitiveDirectory: {}", e.message)
        }
        Ok(o) => match &o.resolved.escalation {
            Some(t) if t.reason != EscalationReason::FirstExecution => {
                format!("escalation {}: {}", t.reason.name(), t.requested_path.as_deref().unwrap_or("-"))
            }
            _ => return decided,
        },
        Err(_) => return decided,
    };
    trust.escalate(tool, &why).map_err(ErrorReply::from)?;
    decided
}
