//! The broker's core, shared by palisaded and the CLI's embedded broker:
//! decide by policy, prepare the run's host directories, execute.

use crate::cgroup::{CgroupLimits, Cgroups};
use crate::etc_view::EtcView;
use crate::run::{Engine, Sink};
use crate::spawner::Spawner;
use crate::{host, paths};
use palisade_policy::{Config, Context, Decision, Policy};
use palisade_protocol::wire::{ErrorKind, ErrorReply, RunRequest, RunResult};
use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Broker {
    pub engine: Engine,
    pub cgroups: Cgroups,
    pub policy: Policy,
    /// The context every decision starts from; `run` is set per request.
    pub context: Context,
    /// The snapshot of /etc that Tier C sandboxes see; `None`: per-entry binds.
    pub etc: Option<EtcView>,
    next_run: AtomicU64,
}

/// A decided request, ready to run.
pub struct Decided {
    pub run_id: u64,
    pub resolved: Box<palisade_policy::Resolved>,
    /// Why a person must approve the run first, if one must.
    pub approval: Option<String>,
    etc: Option<std::sync::Arc<crate::etc_view::Snapshot>>,
}

/// The refusal of a run that needed approval and did not get it.
pub fn not_approved(reason: &str, why: &str) -> ErrorReply {
    ErrorReply {
        kind: ErrorKind::NeedsApproval,
        message: format!("{reason} Not approved: {why}."),
        rule: Some("fallback.request_approval".into()),
    }
}

/// Who is asking: the peer's credentials from SO_PEERCRED (or the CLI's own).
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
}

impl Broker {
    /// A broker for `config`. Call before starting any thread: the probe of
    /// user namespaces forks.
    pub fn assemble(config: Config, helper: Option<PathBuf>) -> Result<Broker, String> {
        let cgroups = Cgroups::discover(config.broker.cgroup_root.as_deref(), true);
        tracing::info!(cgroups = %cgroups.description, "cgroups");
        let mut host = host::probe(&cgroups);
        if !config.broker.user_namespaces {
            host.user_namespaces = false;
        }
        tracing::info!(
            user_namespaces = host.user_namespaces,
            landlock_abi = host.landlock_abi,
            "host capabilities"
        );
        let helper = helper.or_else(|| config.broker.helper.clone()).unwrap_or_else(paths::default_helper);
        paths::check_helper(&helper)?;
        let spawner = Spawner::start().map_err(|e| format!("cannot start the spawner thread: {e}"))?;
        let context = Context {
            host,
            parent_pid: std::process::id(),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            temp_root: config.policy.temp_root.clone().unwrap_or_else(paths::default_temp_root),
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
            policy: Policy::new(config),
            context,
            next_run: AtomicU64::new(1),
        })
    }

    /// Decides a request: the run it will be, and whether a person must
    /// approve it first. Nothing runs yet.
    pub fn decide(&self, peer: Peer, request: &RunRequest) -> Result<Decided, ErrorReply> {
        let run_id = self.next_run.fetch_add(1, Ordering::Relaxed);
        // Held until the run is over: the snapshot stays on disk meanwhile.
        let etc = self.etc.as_ref().and_then(etc_snapshot);
        let context = Context {
            run: run_id,
            etc_view: etc.as_ref().map(|e| e.dir().to_path_buf()),
            ..self.context.clone()
        };
        let deciding = std::time::Instant::now();
        let decision = self.policy.decide(&context, request);
        tracing::debug!(run_id, decide_us = deciding.elapsed().as_micros(), "policy decided");
        let (resolved, approval) = match decision {
            Decision::Allow(r) => (r, None),
            Decision::NeedsApproval { reason, resolved } => (resolved, Some(reason)),
            Decision::Deny(d) => {
                tracing::info!(run_id, uid = peer.uid, rule = d.rule, "denied: {}", d.reason);
                return Err(ErrorReply { kind: d.kind, message: d.reason, rule: Some(d.rule.into()) });
            }
        };
        self.check_ownership(peer, &resolved.writable)?;
        Ok(Decided { run_id, resolved, approval, etc })
    }

    /// Decides and runs a request that needs nobody's approval (one that does
    /// is refused with `NeedsApproval`: use [`Broker::decide`] and ask).
    pub async fn run<S: Sink + Send>(
        &self,
        peer: Peer,
        request: &RunRequest,
        sink: &mut S,
        cancel: impl Future<Output = ()> + Send,
    ) -> Result<RunResult, ErrorReply> {
        let decided = self.decide(peer, request)?;
        if let Some(reason) = &decided.approval {
            return Err(not_approved(reason, "nobody was asked"));
        }
        self.execute(peer, decided, request, sink, cancel).await
    }

    /// Runs what [`Broker::decide`] resolved (approved, where it had to be).
    pub async fn execute<S: Sink + Send>(
        &self,
        peer: Peer,
        decided: Decided,
        request: &RunRequest,
        sink: &mut S,
        cancel: impl Future<Output = ()> + Send,
    ) -> Result<RunResult, ErrorReply> {
        let Decided { run_id, resolved, approval, etc } = decided;
        if let Some(reason) = approval {
            tracing::info!(run_id, uid = peer.uid, "approved: {reason}");
        }
        for w in &resolved.warnings {
            tracing::warn!(run_id, "{w}");
        }
        let owner = (resolved.plan.uid, resolved.plan.gid);
        let dirs = HostDirs::create(&resolved.host_dirs, owner).map_err(|e| {
            ErrorReply::new(ErrorKind::RuntimeFailure, format!("cannot create the run's directories: {e}"))
        })?;
        let cgroup = match &resolved.cgroup {
            Some(c) => {
                let limits = CgroupLimits {
                    memory_bytes: c.memory_bytes,
                    processes: c.processes,
                    cpu_percent: c.cpu_percent,
                };
                Some(self.cgroups.create(&c.name, limits).map_err(|e| {
                    ErrorReply::new(ErrorKind::RuntimeFailure, format!("cannot create the run's cgroup: {e}"))
                })?)
            }
            None => None,
        };
        let result = self.engine.execute(run_id, &resolved, request, sink, cancel, cgroup.as_ref()).await;
        if let Some(c) = cgroup {
            // Removed after every run, whatever happened in it.
            let _ = tokio::task::spawn_blocking(move || c.remove()).await;
        }
        drop((dirs, etc));
        result
    }

    /// A broker serving other users must not lend them its own access: every
    /// writable path must belong to the peer (root peers excepted).
    fn check_ownership(&self, peer: Peer, writable: &[PathBuf]) -> Result<(), ErrorReply> {
        if peer.uid == self.context.uid || peer.uid == 0 {
            return Ok(());
        }
        for path in writable {
            let owner = std::fs::metadata(path).map(|m| m.uid()).unwrap_or(u32::MAX);
            if owner != peer.uid {
                return Err(ErrorReply {
                    kind: ErrorKind::WorkspaceScopeDenied,
                    message: format!(
                        "{} is not owned by uid {} (the requesting peer)",
                        path.display(),
                        peer.uid
                    ),
                    rule: Some("scope.not_the_peers".into()),
                });
            }
        }
        Ok(())
    }
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
