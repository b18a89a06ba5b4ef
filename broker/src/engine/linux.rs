//! The Linux executor: a decided run in palisade-helper's jail (namespaces,
//! Landlock, seccomp), in a cgroup where the host has them, from the warm
//! pool where it can be, with the plan's host paths opened as the
//! requester and the run's writes a change set.

use crate::changes::KeepOut;
use crate::engine::cgroup::{CgroupLimits, Cgroups};
use crate::engine::etc_view::EtcView;
use crate::engine::executor::{Deciding, Executor, Opened, Parts, Prepared, decision};
use crate::engine::pool::Slot;
use crate::engine::run::{Engine, Grants, InCgroup, Planned, Sink};
use crate::engine::spawn_thread::Spawner;
use crate::error::BrokerError;
use crate::host::paths::HostDirs;
use crate::host::peer::Peer;
use crate::host::requester::{self, Acting, Requester};
use crate::host::{self, paths};
use crate::journal::{Event, Journal, events};
use palisade_policy::{Config, Context, Host, HostCapabilities, Resolved};
use palisade_protocol::wire::{CgroupStatus, ErrorKind, ErrorReply, PoolStatus, RunRequest, RunResult};
use palisade_protocol::{HostIds, Namespaces, WarmSpec};
use std::future::Future;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

/// The executor on Linux, and what its broker has beside it.
pub struct Linux {
    pub engine: Engine,
    pub cgroups: Cgroups,
    /// What the host can enforce, probed at start-up.
    pub capabilities: HostCapabilities,
    /// The snapshot of /etc that Tier C sandboxes see; `None`: per-entry binds.
    pub etc: Option<EtcView>,
    /// The change sets held for review.
    pub changes: Arc<crate::changes::Store>,
    /// The broker's own uid.
    uid: u32,
}

/// What a run holds of the host until it ends.
pub struct Held {
    grants: Grants,
    /// The run's own directories (Tier B).
    _dirs: HostDirs,
    /// The /etc snapshot it sees, kept on disk meanwhile.
    _etc: Option<Arc<crate::engine::etc_view::Snapshot>>,
    /// A command of a session in a cgroup: the session's, which it joins.
    session_cgroup: Option<Arc<crate::engine::cgroup::Membership>>,
}

impl Linux {
    /// The executor for `config`, running commands in palisade-helper's
    /// jail (`helper`, else the configured one, else the one beside this
    /// binary), and the parts of its broker; `one_run`: the CLI's embedded
    /// broker, whose helper starts while the broker is put together. Call
    /// before starting any thread: the probe of user namespaces forks.
    pub fn assemble(
        config: &Config,
        helper: Option<PathBuf>,
        one_run: bool,
    ) -> Result<(Linux, Parts), String> {
        let (ids, helper) = check_config(config, helper)?;
        // Before any child: a broker living in its delegated cgroup moves to a
        // leaf and enables the controllers, which the kernel refuses (EBUSY)
        // while another process (the probe's child) is still in that cgroup.
        let cgroups = Cgroups::discover(config.broker.cgroup_root.as_deref(), true);
        tracing::info!(cgroups = %cgroups.description, "cgroups");
        // Its child tries the namespaces while the broker is put together.
        let userns = host::UserNsProbe::start();
        let spawner = Spawner::start().map_err(|e| format!("cannot start the spawner thread: {e}"))?;
        let warm = warm_spec(config, &cgroups);
        let pooling = (config.broker.prespawn, warm, crate::host::privilege::serves_others());
        let engine = Engine::new(spawner.clone(), helper.clone(), pooling, cgroups.clone());
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
            // A broker serving only its user keeps each workspace's HOME in its state.
            homes: match crate::host::privilege::serves_others() {
                true => None,
                false => paths::default_state_dir().ok().map(|s| paths::canonical_prefix(&s.join("homes"))),
            },
        };
        crate::host::instance::remove_orphans(&context.temp_root, "run-");
        let journal = Journal::from_config(config)?;
        let etc = config.broker.etc_snapshot.then(|| etc_view(&context.temp_root)).flatten();
        let changes = Arc::new(changes_store(config)?);
        // Made before any decision: a run's layers are made there after its
        // decision, and a workspace that holds the store hides it only if
        // it exists when the run is decided.
        changes.make_root().map_err(|e| format!("[changes] dir {}: {e}", changes.root().display()))?;
        // A daemon's start sweeps; a run of the CLI pays nothing for it.
        if !one_run {
            sweep_changes(&changes, &journal);
        }
        let user_namespaces = config.broker.user_namespaces;
        let capabilities = host::probe(cgroups.for_policy(), userns.passed() && user_namespaces);
        if !capabilities.user_namespaces {
            engine.stop_warming();
        }
        tracing::info!(
            user_namespaces = capabilities.user_namespaces,
            landlock_abi = capabilities.landlock_abi,
            "host capabilities"
        );
        let linux = Linux { engine, cgroups, capabilities, etc, changes, uid };
        Ok((linux, Parts { ids, context, temp_root, journal }))
    }

    /// The policy's decision, then the plan's host paths opened and the
    /// grants checked, with the credentials `act` gives.
    fn decide_as(
        &self,
        act: &Acting,
        deciding: &Deciding<'_>,
        context: &Context,
        request: &RunRequest,
    ) -> Result<Opened<(HostDirs, Vec<OwnedFd>)>, ErrorReply> {
        let host = self.host(context, deciding.owned.clone());
        let (resolved, approval) = decision(deciding.policy, &host, context, request)?;
        // The run's own directories (Tier B), made by the broker for the sandbox's uid.
        let owner = (resolved.plan.uid, resolved.plan.gid);
        let dirs = act.as_broker(|| HostDirs::create(&resolved.host_dirs, owner)).map_err(|e| {
            ErrorReply::new(ErrorKind::RuntimeFailure, format!("cannot create the run's directories: {e}"))
        })?;
        if let Some(home) = &resolved.home {
            crate::host::paths::create_dirs(home, 0o700).map_err(|e| {
                let why = format!("cannot create the workspace's home {}: {e}", home.display());
                ErrorReply::new(ErrorKind::RuntimeFailure, why)
            })?;
        }
        let peer = deciding.peer;
        let descriptors = requester::open_paths(&resolved.plan, &resolved.host_dirs, act, peer.uid)?;
        self.check_grants(peer, &resolved, &descriptors)?;
        Ok(Opened { resolved, approval, held: (dirs, descriptors) })
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
            if writable && peer.uid != self.uid && peer.uid != 0 && owner != peer.uid {
                return Err(ErrorReply::with_rule(
                    ErrorKind::WorkspaceScopeDenied,
                    format!(
                        "{shown} is not owned by uid {0} (the requesting peer): a root broker writes for a \
                         peer only in what the peer owns, and no flag or key lifts that; use a directory \
                         uid {0} owns",
                        peer.uid
                    ),
                    "scope.not_the_peers",
                ));
            }
        }
        Ok(())
    }
}

impl Linux {
    /// Each overlay of the plan writes to a layer on disk, in the change set
    /// made for the run ([`crate::changes::layer`]): its path named in the
    /// plan, its descriptor sent with the others, the layers kept with the
    /// run's grants until its writes are settled.
    async fn give_layers(
        &self,
        run_id: u64,
        resolved: &mut Resolved,
        held: &mut Held,
    ) -> Result<(), BrokerError> {
        use palisade_protocol::Mount;
        let plan = &mut resolved.plan;
        let roots: Vec<String> = (plan.mounts.iter())
            .filter_map(|m| match m {
                Mount::Overlay { source, .. } => Some(source.clone()),
                _ => None,
            })
            .collect();
        if roots.is_empty() {
            return self.in_place_draft(run_id, resolved, held).await;
        }
        let (store, requester) = (self.changes.clone(), held.grants.requester.clone());
        // A system broker's layers are the requester's, which its sandbox writes through an idmap.
        let owner = plan.host_ids.and(plan.acting_for);
        let since = crate::changes::clock::Since::now();
        let made =
            tokio::task::spawn_blocking(move || store.layers(&requester, run_id, &roots, owner, since));
        let layers = made.await.map_err(|e| BrokerError::Internal(e.to_string()))?.map_err(|e| {
            BrokerError::CopyBack { path: format!("a layer in {}", self.changes.root().display()), source: e }
        })?;
        let mut dirs = layers.dirs.iter();
        for m in plan.mounts.iter_mut() {
            let Mount::Overlay { layer, .. } = m else { continue };
            let (path, fd) = dirs.next().ok_or_else(|| BrokerError::Internal("a layer short".into()))?;
            *layer = Some(path.clone());
            plan.descriptors.push(palisade_protocol::HostPath { path: path.clone(), host_layout: true });
            held.grants.descriptors.push(fd.try_clone()?);
        }
        *held.grants.layers.lock().unwrap_or_else(|e| e.into_inner()) = Some(layers);
        Ok(())
    }
}

impl Linux {
    /// A run writing its trees in place (Tier C, `disk = "direct"`): a
    /// draft for what it makes there that the host executes, made before it
    /// starts (with what the plan mounts in them: see
    /// [`crate::changes::in_place`]), so that a broker killed meanwhile
    /// leaves it for the next one.
    async fn in_place_draft(
        &self,
        run_id: u64,
        resolved: &Resolved,
        held: &mut Held,
    ) -> Result<(), BrokerError> {
        let plan = &resolved.plan;
        let joins = plan.session == Some(palisade_protocol::SessionRole::Join);
        if !resolved.in_place || plan.tier() != palisade_protocol::Tier::C || joins {
            return Ok(());
        }
        let (roots, record) = crate::changes::in_place::of_plan(plan, &resolved.in_place_code);
        if roots.is_empty() {
            return Ok(());
        }
        let (store, requester) = (self.changes.clone(), held.grants.requester.clone());
        let owner = plan.host_ids.and(plan.acting_for);
        let since = crate::changes::clock::Since::now();
        let made = tokio::task::spawn_blocking(move || {
            let layers = store.layers(&requester, run_id, &roots, owner, since)?;
            crate::changes::in_place::begin(&layers, &record).map(|()| layers)
        });
        let layers = made.await.map_err(|e| BrokerError::Internal(e.to_string()))?.map_err(|e| {
            BrokerError::CopyBack { path: format!("a draft in {}", self.changes.root().display()), source: e }
        })?;
        *held.grants.layers.lock().unwrap_or_else(|e| e.into_inner()) = Some(layers);
        Ok(())
    }
}

/// A requester the broker cannot act for.
fn cannot_act(peer: &Peer, e: std::io::Error) -> ErrorReply {
    ErrorReply::new(ErrorKind::RuntimeFailure, format!("cannot act for uid {}: {e}", peer.uid))
}

impl Executor for Linux {
    type Held = Held;
    type Taken = Option<Slot>;

    fn broker_name(&self) -> String {
        format!("palisaded {}", env!("CARGO_PKG_VERSION"))
    }

    fn refusal(&self, me: u32, peer: &Peer) -> Option<String> {
        let alone = !crate::host::privilege::serves_others() && peer.uid != me && peer.uid != 0;
        alone.then(|| {
            format!(
                "this broker runs as uid {me} and can act only as itself, not for uid {}: \
                 serving other users takes a system broker (root, or a dedicated user holding \
                 CAP_SETUID and the unit's other capabilities)",
                peer.uid
            )
        })
    }

    fn host(&self, context: &Context, owned: Arc<[palisade_policy::host::OwnedPath]>) -> Host {
        host::gather(&self.capabilities, context.etc_view.is_none(), owned)
    }

    fn as_requester<T: Send>(&self, peer: &Peer, f: impl FnOnce() -> T + Send) -> Result<T, ErrorReply> {
        peer.requester().act(|_| f()).map_err(|e| cannot_act(peer, e))
    }

    fn decide(&self, deciding: Deciding<'_>, request: &RunRequest) -> Result<Opened<Held>, ErrorReply> {
        // Held until the run is over: the snapshot stays on disk meanwhile.
        let etc = self.etc.as_ref().and_then(etc_snapshot);
        let etc_view = etc.as_ref().map(|e| e.dir().to_path_buf());
        let context = Context { etc_view, ..deciding.context.clone() };
        let requester = deciding.peer.requester();
        let opened = requester
            .act(|act| self.decide_as(act, &deciding, &context, request))
            .map_err(|e| cannot_act(deciding.peer, e))?;
        let Opened { resolved, approval, held: (dirs, descriptors) } = opened?;
        let keep_out = KeepOut {
            owned: deciding.owned,
            host_executed: deciding.host_executed,
            store: self.changes.clone(),
            journal: deciding.journal.clone(),
        };
        let grants = Grants { requester, descriptors, keep_out, layers: std::sync::Mutex::new(None) };
        Ok(Opened { resolved, approval, held: Held { grants, _dirs: dirs, _etc: etc, session_cgroup: None } })
    }

    async fn prepare(
        &self,
        run_id: u64,
        resolved: &mut Resolved,
        held: &mut Held,
        request: &RunRequest,
        _config: &Config,
    ) -> Result<Prepared<Option<Slot>>, BrokerError> {
        trust_authority(resolved)?;
        self.give_layers(run_id, resolved, held).await?;
        // A warm slot with a cgroup brings it: the run's cgroup is that one,
        // in the plan, its record and its attestation.
        // A session's sandbox is never a warm slot's; a command in one takes a helper started ahead.
        let claimed = match resolved.plan.session {
            Some(palisade_protocol::SessionRole::Hold) => None,
            Some(palisade_protocol::SessionRole::Join) => self.engine.claim_join(&resolved.plan).await,
            None => self.engine.claim(&resolved.plan, resolved.cgroup.is_some()).await,
        };
        if let Some(cgroup) = claimed.as_ref().and_then(|s| s.cgroup.as_ref()) {
            take_cgroup(resolved, cgroup);
        }
        Ok(Prepared { taken: claimed, started: events::run_started(run_id, request, resolved) })
    }

    async fn discard(&self, taken: Option<Slot>) {
        if let Some(slot) = taken {
            let _ = tokio::task::spawn_blocking(move || slot.discard()).await;
        }
    }

    async fn execute<S: Sink + Send>(
        &self,
        run_id: u64,
        resolved: &Resolved,
        held: &Held,
        taken: Option<Slot>,
        request: &RunRequest,
        sink: &mut S,
        recorded: impl Future<Output = bool> + Send,
        cancel: impl Future<Output = ()> + Send,
    ) -> Result<RunResult, BrokerError> {
        let limits = |c: &palisade_policy::CgroupPlan| CgroupLimits {
            memory_bytes: c.memory_bytes,
            processes: c.processes,
            cpu_percent: c.cpu_percent,
        };
        let cgroup = match (&held.session_cgroup, &resolved.cgroup) {
            (Some(session), _) => InCgroup::Session(session),
            (None, Some(c)) => InCgroup::Own(c.name.as_str(), limits(c)),
            (None, None) => InCgroup::None,
        };
        let planned = Planned { id: run_id, resolved, grants: &held.grants };
        // The run's own cgroup, if it has one, is made (or the slot's limited) and removed by the engine.
        self.engine.execute(planned, request, sink, recorded, cancel, cgroup, taken).await
    }

    fn tearing_down(&self) -> usize {
        self.engine.teardowns().under_way()
    }

    fn status(&self) -> (PoolStatus, CgroupStatus) {
        let (pool, requesters) = (self.engine.pool(), self.engine.requesters());
        // A system broker's: its helpers that built nothing, and every requester's sandboxes built ahead.
        let idle = pool.idle() + requesters.as_ref().map_or(0, |r| r.idle());
        let warm = pool.warm() || requesters.as_ref().is_some_and(|r| r.warm());
        let pool = PoolStatus { idle: idle as u64, size: pool.size() as u64, warm };
        let cgroup =
            CgroupStatus { mode: self.cgroups.mode().into(), description: self.cgroups.description.clone() };
        (pool, cgroup)
    }

    /// The change sets where the configuration puts them outside the state
    /// directory, and the programs the broker runs before any sandbox (a
    /// per-user install in a home used as a workspace), which a run may see
    /// but never write.
    fn keeps(&self, config: &Config) -> Vec<(PathBuf, &'static str, bool)> {
        let helper = self.engine.helper();
        let mut keeps: Vec<(PathBuf, &'static str, bool)> = Vec::new();
        if config.changes.dir.is_some() {
            keeps.push((self.changes.root().to_path_buf(), "the held change sets", true));
        }
        keeps.push((helper.to_path_buf(), "the sandbox helper", false));
        keeps.push((paths::plugin_host(&config.plugins, helper), "the plugin host", false));
        if let Ok(exe) = std::env::current_exe() {
            // The CLI beside it hands its process over to this program: neither
            // is a run's to replace.
            keeps.push((exe.with_file_name("palisade"), "the CLI's program", false));
            keeps.push((exe, "the broker's program", false));
        }
        keeps
    }

    fn hold(&self, resolved: &mut Resolved) -> Result<(), ErrorReply> {
        crate::engine::session::hold(resolved)
    }

    fn join(
        &self,
        resolved: &mut Resolved,
        held: &mut Held,
        session: &crate::engine::executor::Sandbox,
    ) -> Result<(), ErrorReply> {
        held.session_cgroup = crate::engine::session::join(resolved, &mut held.grants.descriptors, session)?;
        Ok(())
    }

    fn loopback_sockets(
        &self,
        session: &crate::engine::executor::Sandbox,
    ) -> Result<Vec<std::os::fd::OwnedFd>, ErrorReply> {
        crate::engine::publish::loopback_sockets(session)
    }

    fn changes(&self) -> Option<&Arc<crate::changes::Store>> {
        Some(&self.changes)
    }
}

/// What the warm pool's sandboxes are built with: the default plan's shape
/// (Tier C, every namespace, the broker's ids inside), in a cgroup of their
/// own where runs get one. On cgroup v2 the helper joins it itself (the
/// plan names it); on v1 the broker places the helper there before the spec
/// is sent (`pool::place_then_send`), and the plan names none. A system broker's
/// sandboxes run as each requester's own host ids: each requester's pool
/// adds them to this. Nothing is built ahead with `warm = false`.
pub(crate) fn warm_spec(config: &Config, cgroups: &Cgroups) -> Option<WarmSpec> {
    let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
    let usable = config.broker.warm && config.broker.user_namespaces;
    let cgroup = cgroups.available().is_ok() && !cgroups.is_v1();
    let parent_pid = std::process::id();
    let (host_ids, acting_for) = (None, None);
    let spec = WarmSpec { uid, gid, namespaces: Namespaces::ALL, parent_pid, cgroup, host_ids, acting_for };
    usable.then_some(spec)
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
        min_free_bytes: c.min_free_mb.saturating_mul(1 << 20),
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
/// Strict egress with inspected domains: the run trusts the broker's
/// authority beside the host's roots, in a bundle bound over the host's
/// (`authority::run_bundle_path`) that the usual variables name.
fn trust_authority(resolved: &mut Resolved) -> Result<(), BrokerError> {
    use crate::egress::authority::{self, BUNDLE_VARIABLES};
    let Some(plan) = resolved.egress_plan.as_ref().filter(|_| !resolved.plan.listeners.is_empty()) else {
        return Ok(());
    };
    let failed = |e: String| BrokerError::Status(std::io::Error::other(format!("TLS inspection: {e}")));
    let Some(authority) = authority::for_plan(plan).map_err(failed)? else { return Ok(()) };
    let path = authority::run_bundle_path().map_err(failed)?;
    let bundle = authority.run_bundle(std::path::Path::new(path)).map_err(failed)?;
    let mut env: Vec<(String, String)> =
        BUNDLE_VARIABLES.iter().map(|v| (v.to_string(), path.to_string())).collect();
    // An env credential: the run's variable holds a placeholder of its own.
    if let Some(egress) = resolved.egress_plan.as_mut() {
        for c in egress.credentials.iter_mut() {
            if let Some(var) = &c.grant.env {
                c.placeholder = crate::egress::credentials::placeholder();
                env.push((var.clone(), c.placeholder.clone()));
            }
        }
    }
    let plan = &mut resolved.plan;
    plan.mounts.push(palisade_protocol::Mount::File { target: path.into(), contents: bundle });
    for (var, value) in env {
        plan.env.retain(|(k, _)| *k != var);
        plan.env.push((var, value));
    }
    Ok(())
}

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

/// Makes a warm slot's cgroup the run's (cgroup v2 cannot rename one
/// with processes in it): its name and path, in the plan too.
fn take_cgroup(resolved: &mut Resolved, cgroup: &crate::engine::cgroup::RunCgroup) {
    if let Some(planned) = resolved.cgroup.as_mut() {
        planned.name = cgroup.name().to_string();
        planned.path = PathBuf::from(cgroup.display());
        // cgroup v1: the broker placed the helper; the plan names no cgroup to join.
        if !cgroup.is_v1() {
            resolved.plan.cgroup = Some(cgroup.display());
        }
    }
}
