//! The broker service, shared by palisaded and the CLI's embedded broker: a
//! peer's request decided by policy as the peer, its host directories
//! prepared, and its run executed.

use crate::changes::KeepOut;
use crate::decide::approvals::Pending;
use crate::decide::settings::Settings;
use crate::engine::cgroup::{CgroupLimits, Cgroups};
use crate::engine::etc_view::EtcView;
use crate::engine::run::{Engine, Grants, Planned, Sink};
use crate::engine::spawn_thread::Spawner;
use crate::error::BrokerError;
use crate::host::paths::HostDirs;
use crate::host::requester::{self, Acting, Peer, Requester};
use crate::host::{self, paths};
pub use crate::journal::events::journal_refusal;
use crate::journal::{Event, Journal, RefusalRecord, events};
use palisade_policy::host::OwnedPath;
use palisade_policy::trust::EscalationReason;
use palisade_policy::{Config, ConfigError, Context, Decision, Host, HostCapabilities, Resolved};
use palisade_protocol::wire::{
    ErrorKind, ErrorReply, Explanation, PendingApproval, RunRequest, RunResult, RunStatus, ToolInfo,
};
use palisade_protocol::{HostIds, Namespaces, WarmSpec};
use std::future::Future;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

pub struct Broker {
    pub engine: Engine,
    pub cgroups: Cgroups,
    /// What decides each request; replaced whole by a reload (see [`crate::decide::settings`]).
    settings: RwLock<Arc<Settings>>,
    /// Reloads that took effect since the broker started.
    reloads: AtomicU64,
    /// What the host can enforce, probed at start-up.
    pub capabilities: HostCapabilities,
    /// The context every decision starts from; `run` is set per request.
    pub context: Context,
    /// The snapshot of /etc that Tier C sandboxes see; `None`: per-entry binds.
    pub etc: Option<EtcView>,
    /// The audit journal every request, decision, approval, trust
    /// transition and run is recorded in.
    pub journal: Journal,
    /// The runs held for approval now.
    pub pending: Pending,
    /// Tier A: the skills, their stores, and the plugin-host.
    pub plugins: Arc<crate::plugins::Plugins>,
    /// What the broker keeps, out of every run's reach (see [`crate::decide::owned::owned`]);
    /// a reload may add to it, never take away.
    owned: RwLock<Arc<[OwnedPath]>>,
    /// The change sets held for review.
    pub changes: Arc<crate::changes::Store>,
    /// Where the runs' host directories go (`context.temp_root`), kept
    /// while the broker is (one of an unpredictable name goes with it).
    _temp_root: paths::TempRoot,
    next_run: AtomicU64,
}

/// A run held for approval: what is shown, and the run it would be.
pub struct Question {
    pub pending: PendingApproval,
    pub run: Arc<Resolved>,
    /// How long it waits for an answer (`approval_timeout_secs` of the
    /// settings the run was decided with).
    pub timeout_secs: u64,
}

/// A decided request, ready to run.
pub struct Decided {
    pub run_id: u64,
    pub resolved: Box<Resolved>,
    /// Why a person must approve the run first, if one must.
    pub approval: Option<String>,
    /// The approval was an approver's: only then does a tool's successful
    /// run count towards its Verified stage.
    pub approver_approved: bool,
    pub grants: Grants,
    /// The settings it was decided with, which its run keeps whatever a reload does.
    pub settings: Arc<Settings>,
    etc: Option<std::sync::Arc<crate::engine::etc_view::Snapshot>>,
    dirs: HostDirs,
    /// The request's and the decision's records, written with the run's start.
    pending: Vec<Event>,
}

/// An allowed run with its host paths opened (see [`Broker::decide`]).
struct Opened {
    resolved: Box<Resolved>,
    approval: Option<String>,
    dirs: HostDirs,
    descriptors: Vec<OwnedFd>,
}

/// The refusal of a run that needed approval and did not get it.
pub fn not_approved(reason: &str, why: &str) -> ErrorReply {
    ErrorReply::with_rule(
        ErrorKind::NeedsApproval,
        format!("{reason} Not approved: {why}."),
        "fallback.request_approval",
    )
}

/// What the warm pool's sandboxes are built with: the default plan's shape
/// for a broker that is not root (Tier C, every namespace, its own ids, no
/// host ids), in a cgroup of their own where runs get one (cgroup v2). A
/// root broker's sandboxes run as each requester's own host ids, so it
/// builds nothing ahead; nor does one with `warm = false`, nor on cgroup
/// v1, where the broker places a run's helper itself after its start.
pub(crate) fn warm_spec(config: &Config, cgroups: &Cgroups) -> Option<WarmSpec> {
    let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
    let usable =
        config.broker.warm && config.broker.user_namespaces && !crate::host::privilege::serves_others();
    let cgroup = cgroups.available().is_ok();
    let spec = WarmSpec { uid, gid, namespaces: Namespaces::ALL, parent_pid: std::process::id(), cgroup };
    (usable && !(cgroup && cgroups.is_v1())).then_some(spec)
}

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
        let (ids, helper) = check_config(&config, helper)?;
        // Before any child: a broker living in its delegated cgroup moves to a
        // leaf and enables the controllers, which the kernel refuses (EBUSY)
        // while another process (the probe's child) is still in that cgroup.
        let cgroups = Cgroups::discover(config.broker.cgroup_root.as_deref(), true);
        tracing::info!(cgroups = %cgroups.description, "cgroups");
        // Its child tries the namespaces while the broker is put together.
        let userns = host::UserNsProbe::start();
        let spawner = Spawner::start().map_err(|e| format!("cannot start the spawner thread: {e}"))?;
        let warm = warm_spec(&config, &cgroups);
        let engine =
            Engine::new(spawner.clone(), helper.clone(), config.broker.prespawn, warm, cgroups.clone());
        if one_run {
            engine.start_one();
        }
        let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let temp_root = paths::temp_root(config.policy.temp_root.as_deref())?;
        let context = Context {
            parent_pid: std::process::id(),
            uid,
            gid,
            serves_others: crate::host::privilege::serves_others(),
            requester: HostIds { uid, gid },
            groups: Requester::me().groups,
            temp_root: temp_root.path.clone(),
            instance: crate::host::instance::tag().to_string(),
            run: 0,
            etc_view: None,
            trust: None,
        };
        crate::host::instance::remove_orphans(&context.temp_root, "run-");
        let journal = Journal::from_config(&config)?;
        let etc = config.broker.etc_snapshot.then(|| etc_view(&context.temp_root)).flatten();
        let plugins = crate::plugins::Plugins::new(
            &config,
            spawner.clone(),
            &helper,
            context.parent_pid,
            cgroups.clone(),
        )?;
        let changes = Arc::new(changes_store(&config)?);
        // A daemon's start sweeps; a run of the CLI pays nothing for it.
        if !one_run {
            sweep_changes(&changes, &journal);
        }
        let owned = owned_by(&config, &journal, &context.temp_root, &changes, &helper).into();
        let user_namespaces = config.broker.user_namespaces;
        // After the journal: a declaration changed since the last start is a transition it records.
        let settings = Settings::new(config, ids, uid, &journal)?;
        let capabilities = host::probe(cgroups.for_policy(), userns.passed() && user_namespaces);
        if !capabilities.user_namespaces {
            engine.stop_warming();
        }
        tracing::info!(
            user_namespaces = capabilities.user_namespaces,
            landlock_abi = capabilities.landlock_abi,
            "host capabilities"
        );
        Ok(Broker {
            plugins: Arc::new(plugins),
            engine,
            etc,
            cgroups,
            settings: RwLock::new(Arc::new(settings)),
            reloads: AtomicU64::new(0),
            capabilities,
            context,
            journal,
            pending: Pending::default(),
            owned: RwLock::new(owned),
            changes,
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
        let decision = peer
            .requester()
            .act(|_| settings.policy.decide(&self.host(&context), &context, request))
            .map_err(|e| {
                ErrorReply::new(ErrorKind::RuntimeFailure, format!("cannot act for uid {}: {e}", peer.uid))
            })?;
        Ok(palisade_policy::explain::explanation(&decision, settings.config().source_name()))
    }

    /// Decides a request: the run it will be, and whether a person must
    /// approve it first. Nothing runs yet. The decision and everything it
    /// reads of the host is done as the requester (see [`Requester::act`]);
    /// call it where blocking is allowed.
    pub fn decide(&self, peer: &Peer, request: &RunRequest) -> Result<Decided, ErrorReply> {
        let run_id = self.next_run.fetch_add(1, Ordering::Relaxed);
        // Taken once: the run keeps these whatever a reload does meanwhile.
        let settings = self.settings();
        // Held until the run is over: the snapshot stays on disk meanwhile.
        let etc = self.etc.as_ref().and_then(etc_snapshot);
        let context = Context {
            run: run_id,
            requester: HostIds { uid: peer.uid, gid: peer.gid },
            groups: peer.groups.clone(),
            etc_view: etc.as_ref().map(|e| e.dir().to_path_buf()),
            trust: tool_trust(&settings, request)?,
            ..self.context.clone()
        };
        let requester = peer.requester();
        let deciding = std::time::Instant::now();
        let decided =
            requester.act(|act| self.decide_as(act, &settings, peer, &context, request)).map_err(|e| {
                ErrorReply::new(ErrorKind::RuntimeFailure, format!("cannot act for uid {}: {e}", peer.uid))
            })?;
        tracing::debug!(run_id, decide_us = deciding.elapsed().as_micros(), "policy decided");
        let decided = escalated(&settings, request, decided);
        let who = (peer.uid, peer.gid, peer.pid);
        let Opened { resolved, approval, dirs, descriptors } = match decided {
            Ok(opened) => opened,
            Err(e) => return Err(self.record_refusal(run_id, peer, request, e)),
        };
        let keep_out = KeepOut {
            owned: self.owned(),
            host_executed: settings.host_executed.clone(),
            store: self.changes.clone(),
            journal: self.journal.clone(),
        };
        let grants = Grants { requester, descriptors, keep_out };
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
            grants,
            settings,
            etc,
            dirs,
            pending,
        })
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
        decided: &Decided,
        request: &RunRequest,
        reason: &str,
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
            reason: reason.into(),
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
        Question { pending, run: Arc::new((**r).clone()), timeout_secs }
    }

    /// The declared tools with their stage and declaration (`untracked`
    /// where trust stages are off).
    pub fn tools(&self) -> Result<Vec<ToolInfo>, BrokerError> {
        let settings = self.settings();
        if let Some(trust) = &settings.trust {
            return trust.list();
        }
        let tools = &settings.config().tools;
        let trial_runs = settings.config().trust.trial_runs;
        Ok(tools
            .iter()
            .map(|(name, t)| {
                let declaration = t.declaration();
                ToolInfo {
                    name: name.clone(),
                    stage: "untracked".into(),
                    trial_successes: 0,
                    trial_runs,
                    capabilities_sha256: crate::journal::attest::sha256_hex(declaration.as_bytes()),
                    declaration,
                }
            })
            .collect())
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
    /// calling thread's credentials (see [`host::gather`]).
    pub fn host(&self, context: &Context) -> Host {
        host::gather(&self.capabilities, context.etc_view.is_none(), self.owned())
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
        let ids = config.resolve_ids(&host::Accounts).map_err(|e| e.to_string())?;
        let running = self.settings();
        let needs_restart = crate::decide::settings::keep_restart_only(running.config(), &mut config);
        let more =
            owned_by(&config, &self.journal, &self.context.temp_root, &self.changes, self.engine.helper());
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

    /// The policy's decision, then the plan's host paths opened and the
    /// grants checked, with the credentials `act` gives.
    fn decide_as(
        &self,
        act: &Acting,
        settings: &Settings,
        peer: &Peer,
        context: &Context,
        request: &RunRequest,
    ) -> Result<Opened, ErrorReply> {
        let (resolved, approval) = match settings.policy.decide(&self.host(context), context, request) {
            Decision::Allow(r) => (r, None),
            Decision::NeedsApproval { reason, resolved } => (resolved, Some(reason)),
            Decision::Deny(d) => {
                return Err(ErrorReply::with_rule(d.kind, d.reason, d.rule));
            }
        };
        // The run's own directories (Tier B), made by the broker for the sandbox's uid.
        let owner = (resolved.plan.uid, resolved.plan.gid);
        let dirs = act.as_broker(|| HostDirs::create(&resolved.host_dirs, owner)).map_err(|e| {
            ErrorReply::new(ErrorKind::RuntimeFailure, format!("cannot create the run's directories: {e}"))
        })?;
        let descriptors = requester::open_paths(&resolved.plan, &resolved.host_dirs, act, peer.uid)?;
        self.check_grants(peer, &resolved, &descriptors)?;
        Ok(Opened { resolved, approval, dirs, descriptors })
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
        decided: Decided,
        request: &RunRequest,
        sink: &mut S,
        cancel: impl Future<Output = ()> + Send,
    ) -> Result<RunResult, BrokerError> {
        let Decided {
            run_id,
            mut resolved,
            approval,
            approver_approved,
            grants,
            settings,
            etc,
            dirs,
            mut pending,
        } = decided;
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
        if let Some(reason) = approval {
            tracing::info!(run_id, uid = peer.uid, "approved: {reason}");
        }
        // A warm slot with a cgroup brings it: the run's cgroup is that one,
        // in the plan, its record and its attestation.
        let claimed = self.engine.claim(&resolved.plan, resolved.cgroup.is_some()).await;
        if let Some(cgroup) = claimed.as_ref().and_then(|s| s.cgroup.as_ref()) {
            take_cgroup(&mut resolved, cgroup);
        }
        // Written before the sandbox starts: a run that cannot be recorded does not run.
        pending.push(events::run_started(run_id, request, &resolved));
        if let Err(e) = self.journal.start_all(pending, false).await {
            if let Some(slot) = claimed {
                let _ = tokio::task::spawn_blocking(move || slot.discard()).await;
            }
            return Err(e.into());
        }
        for w in &resolved.warnings {
            tracing::warn!(run_id, "{w}");
        }
        let limits = |c: &palisade_policy::CgroupPlan| CgroupLimits {
            memory_bytes: c.memory_bytes,
            processes: c.processes,
            cpu_percent: c.cpu_percent,
        };
        let cgroup = resolved.cgroup.as_ref().map(|c| (c.name.as_str(), limits(c)));
        let planned = Planned { id: run_id, resolved: &resolved, grants: &grants };
        // The run's cgroup, if it has one, is made (or the slot's limited) and removed by the engine.
        let running = self.engine.execute(planned, request, sink, cancel, cgroup, claimed);
        let result = crate::decide::panics::Caught::new(running).await.unwrap_or_else(|panic| {
            tracing::error!(run_id, uid = peer.uid, pid = peer.pid, "the run's handling panicked: {panic}");
            Err(BrokerError::Internal(format!("run {run_id}")))
        });
        drop((dirs, etc));
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
        let event = match &result {
            Ok(r) => events::run_finished(r),
            Err(e) => events::run_failed(run_id, e.kind(), e.to_string(), e.helper_failure()),
        };
        let receipt = self.journal.append(event).await?;
        let mut result = result?;
        if self.journal.enabled() {
            let record = palisade_protocol::attest::JournalRecord { seq: receipt.seq, hash: receipt.hash };
            result.attestation.journal = Some(record);
        }
        Ok(result)
    }

    /// The requester may read every granted path (and write every writable
    /// one) itself, with the credentials it acts with. A broker serving
    /// other users also runs a request only on writable paths the requesting
    /// uid owns. Checked on the descriptors the run will use.
    fn check_grants(&self, peer: &Peer, resolved: &Resolved, fds: &[OwnedFd]) -> Result<(), ErrorReply> {
        for path in &resolved.granted {
            let shown = path.to_string_lossy();
            let fd = resolved.plan.descriptor(&shown).and_then(|i| fds.get(i)).ok_or_else(|| {
                ErrorReply::new(ErrorKind::RuntimeFailure, format!("{shown} is granted but was not opened"))
            })?;
            let writable = resolved.writable.contains(path);
            let allowed = requester::may(fd, writable)
                .map_err(|e| ErrorReply::new(ErrorKind::RuntimeFailure, format!("checking {shown}: {e}")))?;
            if !allowed {
                return Err(requester::not_allowed(&shown, peer.uid));
            }
            let owner = nix::sys::stat::fstat(fd).map(|st| st.st_uid).unwrap_or(u32::MAX);
            if writable && peer.uid != self.context.uid && peer.uid != 0 && owner != peer.uid {
                return Err(ErrorReply::with_rule(
                    ErrorKind::WorkspaceScopeDenied,
                    format!("{shown} is not owned by uid {} (the requesting peer)", peer.uid),
                    "scope.not_the_peers",
                ));
            }
        }
        Ok(())
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
fn escalated(
    settings: &Settings,
    request: &RunRequest,
    decided: Result<Opened, ErrorReply>,
) -> Result<Opened, ErrorReply> {
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

/// Makes a warm slot's cgroup the run's (cgroup v2 cannot rename one
/// with processes in it): its name and path, in the plan too.
fn take_cgroup(resolved: &mut Resolved, cgroup: &crate::engine::cgroup::RunCgroup) {
    if let Some(planned) = resolved.cgroup.as_mut() {
        planned.name = cgroup.name().to_string();
        planned.path = PathBuf::from(cgroup.display());
        resolved.plan.cgroup = Some(cgroup.display());
    }
}

/// Checks `config` as a start does, before anything is made: its users and
/// groups resolved, and, for a broker running as root, its sandbox ids
/// clear of the host's; and the helper (`helper`, else the configured one,
/// else the one beside this binary). Gives the ids and the helper's path.
pub fn check_config(
    config: &Config,
    helper: Option<PathBuf>,
) -> Result<(palisade_policy::ids::ResolvedIds, PathBuf), String> {
    let ids = config.resolve_ids(&host::Accounts).map_err(|e| e.to_string())?;
    if crate::host::privilege::serves_others() {
        check_sandbox_ids(config.broker.sandbox_ids)?;
    }
    let helper = helper.or_else(|| config.broker.helper.clone()).unwrap_or_else(paths::default_helper);
    paths::check_helper(&helper)?;
    Ok((ids, helper))
}

/// What `config` makes the broker keep out of every run's reach (see [`crate::decide::owned::owned`]).
/// What the broker keeps out of every run's reach (see [`crate::decide::owned::owned`]):
/// the change sets where the configuration puts them outside the state
/// directory, and the programs the broker runs before any sandbox (a
/// per-user install in a home used as a workspace), which a run may see
/// but never write.
fn owned_by(
    config: &Config,
    journal: &Journal,
    temp_root: &Path,
    changes: &crate::changes::Store,
    helper: &Path,
) -> Vec<OwnedPath> {
    let mut elsewhere: Vec<(PathBuf, &str, bool)> = Vec::new();
    if config.changes.dir.is_some() {
        elsewhere.push((changes.root().to_path_buf(), "the held change sets", true));
    }
    elsewhere.push((helper.to_path_buf(), "the sandbox helper", false));
    elsewhere.push((crate::plugins::host_program(&config.plugins, helper), "the plugin host", false));
    if let Ok(exe) = std::env::current_exe() {
        // The CLI beside it hands its process over to this program: neither
        // is a run's to replace.
        elsewhere.push((exe.with_file_name("palisade"), "the CLI's program", false));
        elsewhere.push((exe, "the broker's program", false));
    }
    crate::decide::owned::owned(config, journal.dir(), temp_root, &elsewhere)
}

/// Refuses a block of sandbox ids that holds an id the host already uses: a
/// user or group of /etc/passwd or /etc/group, or a subordinate range of
/// /etc/subuid or /etc/subgid. A sandbox sharing a uid with anything else
/// could signal or trace it.
fn check_sandbox_ids(ids: palisade_policy::config::SandboxIds) -> Result<(), String> {
    let (first, last) = (u64::from(ids.first), u64::from(ids.last()));
    let overlaps = |lo: u64, hi: u64| lo <= last && first <= hi;
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    for (file, field) in [("/etc/passwd", 2), ("/etc/group", 2)] {
        for line in read(file).lines() {
            let id = line.split(':').nth(field).and_then(|v| v.parse::<u64>().ok());
            if let Some(id) = id.filter(|id| overlaps(*id, *id)) {
                let name = line.split(':').next().unwrap_or("");
                return Err(sandbox_ids_taken(ids, format!("{name} ({id}) of {file}")));
            }
        }
    }
    for file in ["/etc/subuid", "/etc/subgid"] {
        for line in read(file).lines() {
            let mut f = line.split(':').skip(1).map(|v| v.trim().parse::<u64>().ok());
            if let (Some(Some(start)), Some(Some(count))) = (f.next(), f.next()) {
                if count > 0 && overlaps(start, start + count - 1) {
                    return Err(sandbox_ids_taken(ids, format!("the range {line:?} of {file}")));
                }
            }
        }
    }
    Ok(())
}

fn sandbox_ids_taken(ids: palisade_policy::config::SandboxIds, what: String) -> String {
    format!(
        "[broker] sandbox_ids ({} ids from {}) overlaps {what}: sandboxes must not share ids with anything on the host; choose another block",
        ids.count, ids.first
    )
}

/// The store of held change sets: `[changes] dir`, else `changes` in the
/// broker's state directory.
pub(crate) fn changes_store(config: &Config) -> Result<crate::changes::Store, String> {
    let c = &config.changes;
    let dir = match &c.dir {
        Some(d) => d.clone(),
        None => paths::default_state_dir().map_err(|e| format!("[changes] dir: {e}"))?.join("changes"),
    };
    let limits = crate::changes::Limits {
        max_bytes: c.max_bytes,
        max_sets: c.max_sets,
        max_age_secs: c.max_age_days.saturating_mul(86_400),
    };
    Ok(crate::changes::Store::new(dir, limits))
}

/// Removes the change sets past their age (each a journal record) and
/// what a broker that stopped left half made.
fn sweep_changes(store: &crate::changes::Store, journal: &Journal) {
    for (uid, id) in store.sweep(crate::changes::now_secs()) {
        tracing::info!(uid, id, "a held change set past [changes] max_age_days removed");
        let event = Event::Changes {
            run_id: 0,
            id: Some(id),
            outcome: "discarded".into(),
            reason: Some(format!("held by uid {uid} past [changes] max_age_days")),
            paths: vec![],
            paths_total: 0,
            conflicts: vec![],
            sha256: String::new(),
        };
        if let Err(e) = journal.append_blocking(event) {
            tracing::error!("the removal of an expired change set is not recorded: {e}");
        }
    }
}

/// The /etc snapshots' keeper, under `temp_root` (which [`paths::temp_root`]
/// made the broker's own). A broker running as root hands sandboxes another
/// uid, which must reach the snapshot. `None`, with the reason logged, where
/// a sandbox could not reach it.
fn etc_view(temp_root: &std::path::Path) -> Option<EtcView> {
    let root = crate::host::privilege::serves_others();
    if let Some((dir, mode)) = crate::engine::etc_view::unreachable_on_the_way(temp_root).filter(|_| root) {
        let mode = mode.map_or("cannot be looked at".to_string(), |m| format!("is mode {m:04o}"));
        tracing::warn!(
            "no /etc snapshot: the sandboxes' uids cannot reach {}: {} {mode}, not searchable by others \
             (chmod o+x it, or set [policy] temp_root elsewhere); /etc entries are bound one by one",
            temp_root.display(),
            dir.display()
        );
        return None;
    }
    let entries = palisade_policy::jail::ETC_ENTRIES.iter().map(std::path::PathBuf::from).collect();
    Some(EtcView::new(temp_root.to_path_buf(), entries))
}

/// The run's /etc snapshot. Taking a new one copies files: on a runtime with
/// worker threads to spare, the others go on serving meanwhile.
fn etc_snapshot(etc: &EtcView) -> Option<std::sync::Arc<crate::engine::etc_view::Snapshot>> {
    use crate::engine::etc_view::Lookup;
    use tokio::runtime::{Handle, RuntimeFlavor};
    match etc.lookup() {
        Lookup::Fresh(s) => s,
        Lookup::Stale => match Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(|| etc.retake()),
            _ => etc.retake(),
        },
    }
}
