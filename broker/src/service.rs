//! The broker service, shared by palisaded and the CLI's embedded broker: a
//! peer's request decided by policy as the peer, its host directories
//! prepared, and its run executed.

use crate::cgroup::{CgroupLimits, Cgroups};
use crate::error::BrokerError;
use crate::etc_view::EtcView;
use crate::requester::{self, Acting, Requester};
use crate::run::{Engine, Planned, Sink};
use crate::spawn_thread::Spawner;
use crate::{host, paths};
use palisade_policy::{Config, Context, Decision, Host, HostCapabilities, Policy, Resolved};
use palisade_protocol::HostIds;
use palisade_protocol::wire::{ErrorKind, ErrorReply, RunRequest, RunResult};
use std::future::Future;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Broker {
    pub engine: Engine,
    pub cgroups: Cgroups,
    pub policy: Policy,
    /// What the host can enforce, probed at start-up.
    pub capabilities: HostCapabilities,
    /// The context every decision starts from; `run` is set per request.
    pub context: Context,
    /// The snapshot of /etc that Tier C sandboxes see; `None`: per-entry binds.
    pub etc: Option<EtcView>,
    next_run: AtomicU64,
}

/// A decided request, ready to run.
pub struct Decided {
    pub run_id: u64,
    pub resolved: Box<Resolved>,
    /// Why a person must approve the run first, if one must.
    pub approval: Option<String>,
    pub grants: Grants,
    etc: Option<std::sync::Arc<crate::etc_view::Snapshot>>,
    dirs: HostDirs,
}

/// An allowed run with its host paths opened (see [`Broker::decide`]).
struct Opened {
    resolved: Box<Resolved>,
    approval: Option<String>,
    dirs: HostDirs,
    descriptors: Vec<OwnedFd>,
}

/// What a run is given of the host: the requester it acts for, and the
/// plan's host paths, opened at decision time (in the plan's order).
pub struct Grants {
    pub requester: Requester,
    pub descriptors: Vec<OwnedFd>,
}

/// The refusal of a run that needed approval and did not get it.
pub fn not_approved(reason: &str, why: &str) -> ErrorReply {
    ErrorReply::with_rule(
        ErrorKind::NeedsApproval,
        format!("{reason} Not approved: {why}."),
        "fallback.request_approval",
    )
}

/// Who is asking: the peer's credentials from SO_PEERCRED and its groups
/// from SO_PEERGROUPS (or the CLI's own).
#[derive(Debug, Clone)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
    pub groups: Vec<u32>,
}

impl Peer {
    pub fn requester(&self) -> Requester {
        Requester { uid: self.uid, gid: self.gid, groups: self.groups.clone() }
    }
}

impl Broker {
    /// A broker for `config`. Call before starting any thread: the probe of
    /// user namespaces forks.
    pub fn assemble(config: Config, helper: Option<PathBuf>) -> Result<Broker, String> {
        let cgroups = Cgroups::discover(config.broker.cgroup_root.as_deref(), true);
        tracing::info!(cgroups = %cgroups.description, "cgroups");
        let mut capabilities = host::probe(&cgroups);
        if !config.broker.user_namespaces {
            capabilities.user_namespaces = false;
        }
        tracing::info!(
            user_namespaces = capabilities.user_namespaces,
            landlock_abi = capabilities.landlock_abi,
            "host capabilities"
        );
        if nix::unistd::geteuid().is_root() {
            check_sandbox_ids(config.broker.sandbox_ids)?;
        }
        let helper = helper.or_else(|| config.broker.helper.clone()).unwrap_or_else(paths::default_helper);
        paths::check_helper(&helper)?;
        let spawner = Spawner::start().map_err(|e| format!("cannot start the spawner thread: {e}"))?;
        let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let context = Context {
            parent_pid: std::process::id(),
            uid,
            gid,
            requester: HostIds { uid, gid },
            groups: Requester::me().groups,
            temp_root: paths::canonical_prefix(
                &config.policy.temp_root.clone().unwrap_or_else(paths::default_temp_root),
            ),
            instance: crate::instance::tag().to_string(),
            run: 0,
            etc_view: None,
        };
        remove_orphan_run_dirs(&context.temp_root);
        let etc = config.broker.etc_snapshot.then(|| etc_view(&context.temp_root)).flatten();
        Ok(Broker {
            engine: Engine::new(spawner, helper, config.broker.prespawn),
            etc,
            cgroups,
            // Only the installed interpreters are looked up now: the rest of the
            // host is read at each decision, as the requester.
            policy: Policy::new(config, &*host::files()),
            capabilities,
            context,
            next_run: AtomicU64::new(1),
        })
    }

    /// Decides a request: the run it will be, and whether a person must
    /// approve it first. Nothing runs yet. The decision and everything it
    /// reads of the host is done as the requester (see [`Requester::act`]);
    /// call it where blocking is allowed.
    pub fn decide(&self, peer: &Peer, request: &RunRequest) -> Result<Decided, ErrorReply> {
        let run_id = self.next_run.fetch_add(1, Ordering::Relaxed);
        // Held until the run is over: the snapshot stays on disk meanwhile.
        let etc = self.etc.as_ref().and_then(etc_snapshot);
        let context = Context {
            run: run_id,
            requester: HostIds { uid: peer.uid, gid: peer.gid },
            groups: peer.groups.clone(),
            etc_view: etc.as_ref().map(|e| e.dir().to_path_buf()),
            ..self.context.clone()
        };
        let requester = peer.requester();
        let deciding = std::time::Instant::now();
        let decided = requester.act(|act| self.decide_as(act, peer, &context, request)).map_err(|e| {
            ErrorReply::new(ErrorKind::RuntimeFailure, format!("cannot act for uid {}: {e}", peer.uid))
        })?;
        tracing::debug!(run_id, decide_us = deciding.elapsed().as_micros(), "policy decided");
        let Opened { resolved, approval, dirs, descriptors } = decided.inspect_err(|e| {
            tracing::info!(run_id, uid = peer.uid, rule = e.rule, "denied: {}", e.message);
        })?;
        let grants = Grants { requester, descriptors };
        Ok(Decided { run_id, resolved, approval, grants, etc, dirs })
    }

    /// The host as a decision in `context` sees it now, read with the
    /// calling thread's credentials (see [`host::gather`]).
    pub fn host(&self, context: &Context) -> Host {
        host::gather(&self.capabilities, context.etc_view.is_none())
    }

    /// The policy's decision, then the plan's host paths opened and the
    /// grants checked, with the credentials `act` gives.
    fn decide_as(
        &self,
        act: &Acting,
        peer: &Peer,
        context: &Context,
        request: &RunRequest,
    ) -> Result<Opened, ErrorReply> {
        let (resolved, approval) = match self.policy.decide(&self.host(context), context, request) {
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
        let Decided { run_id, resolved, approval, grants, etc, dirs } = decided;
        if let Some(reason) = approval {
            tracing::info!(run_id, uid = peer.uid, "approved: {reason}");
        }
        for w in &resolved.warnings {
            tracing::warn!(run_id, "{w}");
        }
        let cgroup = match &resolved.cgroup {
            Some(c) => {
                let limits = CgroupLimits {
                    memory_bytes: c.memory_bytes,
                    processes: c.processes,
                    cpu_percent: c.cpu_percent,
                };
                Some(self.cgroups.create(&c.name, limits).map_err(BrokerError::CgroupCreate)?)
            }
            None => None,
        };
        let result = self
            .engine
            .execute(
                Planned { id: run_id, resolved: &resolved, grants: &grants },
                request,
                sink,
                cancel,
                cgroup.as_ref(),
            )
            .await;
        if let Some(c) = cgroup {
            // Removed after every run, whatever happened in it.
            let _ = tokio::task::spawn_blocking(move || c.remove()).await;
        }
        drop((dirs, etc));
        result
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

/// The /etc snapshots' keeper, under `temp_root`. A broker running as root
/// hands sandboxes another uid, which must reach the snapshot: it creates
/// `temp_root` 0711 when missing (the runs' own directories inside are 0700).
/// `None`, with the reason logged, where a sandbox could not reach it.
fn etc_view(temp_root: &std::path::Path) -> Option<EtcView> {
    use std::os::unix::fs::DirBuilderExt;
    let root = nix::unistd::geteuid().is_root();
    if let Err(e) =
        std::fs::DirBuilder::new().recursive(true).mode(if root { 0o711 } else { 0o700 }).create(temp_root)
    {
        tracing::warn!("no /etc snapshot: cannot create {}: {e}", temp_root.display());
        return None;
    }
    // The copy must be the broker's alone: nobody else may replace what it holds.
    if !private_to_us(temp_root) {
        tracing::warn!(
            "no /etc snapshot: {} is not a directory of the broker's own that only it (or root) can change; /etc entries are bound one by one",
            temp_root.display()
        );
        return None;
    }
    if root && !crate::etc_view::reachable_by_others(temp_root) {
        tracing::warn!(
            "no /etc snapshot: the sandbox's uid cannot reach {} (a directory on the way is not searchable by others); /etc entries are bound one by one",
            temp_root.display()
        );
        return None;
    }
    let entries = palisade_policy::jail::ETC_ENTRIES.iter().map(std::path::PathBuf::from).collect();
    Some(EtcView::new(temp_root.to_path_buf(), entries))
}

/// Whether `dir` is the broker's own directory, writable by it alone, on a
/// path that nobody but the broker and root can change (a sticky directory
/// such as /tmp on the way is fine).
fn private_to_us(dir: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let Ok(dir) = dir.canonicalize() else { return false };
    let own = std::fs::metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == me && m.mode() & 0o022 == 0);
    own && dir.ancestors().skip(1).all(|a| {
        std::fs::metadata(a).is_ok_and(|m| {
            (m.uid() == me || m.uid() == 0) && (m.mode() & 0o022 == 0 || m.mode() & 0o1000 != 0)
        })
    })
}

/// The run's /etc snapshot. Taking a new one copies files: on a runtime with
/// worker threads to spare, the others go on serving meanwhile.
fn etc_snapshot(etc: &EtcView) -> Option<std::sync::Arc<crate::etc_view::Snapshot>> {
    use crate::etc_view::Lookup;
    use tokio::runtime::{Handle, RuntimeFlavor};
    match etc.lookup() {
        Lookup::Fresh(s) => s,
        Lookup::Stale => match Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(|| etc.retake()),
            _ => etc.retake(),
        },
    }
}

/// Removes the run directories (`run-<instance>-<n>`) that brokers no longer
/// running left under `temp_root`.
fn remove_orphan_run_dirs(temp_root: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(temp_root) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(instance) = name.strip_prefix("run-") else { continue };
        if !crate::instance::alive(instance) {
            tracing::warn!(dir = %e.path().display(), "removing a run directory left behind");
            if let Err(err) = std::fs::remove_dir_all(e.path()) {
                tracing::warn!("cannot remove {}: {err}", e.path().display());
            }
        }
    }
}

/// A run's host directories (Tier B's private /tmp and temporary workspace),
/// removed with everything in them when the run is over.
struct HostDirs(Vec<PathBuf>);

impl HostDirs {
    /// Creates them for the sandbox's host ids: a root broker's Tier B
    /// command runs as the sandbox's uid, which must own them.
    fn create(dirs: &[PathBuf], (uid, gid): (u32, u32)) -> std::io::Result<HostDirs> {
        use std::os::unix::fs::DirBuilderExt;
        let made = HostDirs(dirs.to_vec());
        let chown = uid != nix::unistd::geteuid().as_raw();
        for d in dirs {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(d)?;
            if chown {
                std::os::unix::fs::chown(d, Some(uid), Some(gid))?;
            }
        }
        Ok(made)
    }
}

impl Drop for HostDirs {
    fn drop(&mut self) {
        // The first is the run's own directory; the others live inside it.
        if let Some(root) = self.0.first() {
            if let Err(e) = std::fs::remove_dir_all(root) {
                tracing::warn!("cannot remove {}: {e}", root.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HostDirs;

    #[test]
    fn a_runs_host_directories_are_private_and_removed_afterwards() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("palisade-hostdirs-{}", std::process::id()));
        let run = base.join("run-1");
        let dirs = [run.clone(), run.join("tmp"), run.join("workspace")];
        let me = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        let made = HostDirs::create(&dirs, me).unwrap();
        std::fs::write(run.join("workspace/left"), "x").unwrap();
        assert_eq!(std::fs::metadata(&run).unwrap().permissions().mode() & 0o777, 0o700);
        drop(made);
        assert!(!run.exists(), "the run's directory outlived the run");
        let _ = std::fs::remove_dir_all(&base);
    }
}
