//! The executor on macOS: a decided run under Seatbelt ([`Seatbelt`]), on
//! the host as a function describes it (`mac::host` on a Mac; a Linux
//! layout with a stand-in for `sandbox-exec` in tests).

use crate::engine::executor::{Deciding, Executor, Opened, Parts, Prepared, decision, not_recorded};
use crate::engine::stream::Sink;
use crate::error::BrokerError;
use crate::host::peer::Peer;
use crate::journal::{Journal, events};
use crate::seatbelt::Seatbelt;
use palisade_policy::host::OwnedPath;
use palisade_policy::{Config, Context, Host, Resolved};
use palisade_protocol::HostIds;
use palisade_protocol::wire::{CgroupStatus, ErrorReply, PoolStatus, RunRequest, RunResult};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

/// The executor on macOS: Seatbelt, on the host a function describes.
pub struct Macos {
    seatbelt: Seatbelt,
    host: Box<dyn Fn() -> Host + Send + Sync>,
}

impl Macos {
    /// The executor for `config`, running commands through `launcher` (see
    /// [`crate::seatbelt::SANDBOX_EXEC`]) on the host `host` describes, and
    /// the parts of its broker.
    pub fn assemble(
        config: &Config,
        launcher: PathBuf,
        host: impl Fn() -> Host + Send + Sync + 'static,
    ) -> Result<(Macos, Parts), String> {
        unserved(config)?;
        // A glob the profile cannot hold is refused now, not at every run.
        palisade_policy::seatbelt::held_writes(&[], &host_executed(config)).map_err(|e| e.to_string())?;
        let ids = config.resolve_ids(&crate::host::accounts::Accounts).map_err(|e| e.to_string())?;
        let kept = crate::host::paths::temp_root(config.policy.temp_root.as_deref())?;
        let temp_root = kept.path.clone();
        let seatbelt = Seatbelt::new(launcher, temp_root.join("profiles"))?;
        // What brokers no longer running left: their runs' processes, directories and profiles.
        seatbelt.kill_leftovers();
        crate::host::instance::remove_orphans(&temp_root, "run-");
        crate::host::instance::remove_orphans(&temp_root.join("profiles"), "");
        let journal = Journal::from_config(config)?;
        let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let context = Context {
            parent_pid: std::process::id(),
            uid,
            gid,
            serves_others: uid == 0,
            requester: HostIds { uid, gid },
            groups: groups(),
            temp_root,
            instance: crate::host::instance::tag().to_string(),
            run: 0,
            etc_view: None,
            trust: None,
            homes: None,
        };
        let macos = Macos { seatbelt, host: Box::new(host) };
        Ok((macos, Parts { ids, context, temp_root: kept, journal }))
    }
}

/// `[policy] host_executed`: what no run may write, beside the built-in list.
fn host_executed(config: &Config) -> Vec<String> {
    config.policy.host_executed.iter().map(|g| g.get_ref().clone()).collect()
}

/// A Seatbelt failure as the client hears it, under `rule`.
fn failed(e: crate::seatbelt::ExecError, rule: &str) -> BrokerError {
    BrokerError::Reply(ErrorReply::with_rule(e.kind(), e.to_string(), rule))
}

impl Executor for Macos {
    type Held = ();
    type Taken = crate::seatbelt::Prepared;

    fn broker_name(&self) -> String {
        format!("palisaded {} (macOS)", env!("CARGO_PKG_VERSION"))
    }

    fn refusal(&self, me: u32, peer: &Peer) -> Option<String> {
        (peer.uid != me).then(|| {
            format!("palisaded on macOS serves its own user (uid {me}) only; uid {} is not", peer.uid)
        })
    }

    fn host(&self, _context: &Context, owned: Arc<[OwnedPath]>) -> Host {
        Host { owned, ..(self.host)() }
    }

    /// The broker serves its own uid only: it is the requester.
    fn as_requester<T: Send>(&self, _peer: &Peer, f: impl FnOnce() -> T + Send) -> Result<T, ErrorReply> {
        Ok(f())
    }

    fn decide(&self, deciding: Deciding<'_>, request: &RunRequest) -> Result<Opened<()>, ErrorReply> {
        let host = self.host(deciding.context, deciding.owned);
        let (resolved, approval) = decision(deciding.policy, &host, deciding.context, request)?;
        Ok(Opened { resolved, approval, held: () })
    }

    async fn prepare(
        &self,
        run_id: u64,
        resolved: &mut Resolved,
        _held: &mut Self::Held,
        request: &RunRequest,
        config: &Config,
    ) -> Result<Prepared<crate::seatbelt::Prepared>, BrokerError> {
        let host_executed = host_executed(config);
        let prepared = self
            .seatbelt
            .prepare(run_id, resolved, request, &host_executed)
            .map_err(|e| failed(e, "seatbelt.profile"))?;
        let started = events::run_started_as(run_id, prepared.attestation.clone());
        Ok(Prepared { taken: prepared, started })
    }

    /// A profile not yet written holds nothing.
    async fn discard(&self, _taken: crate::seatbelt::Prepared) {}

    async fn execute<S: Sink + Send>(
        &self,
        run_id: u64,
        resolved: &Resolved,
        _held: &(),
        taken: crate::seatbelt::Prepared,
        request: &RunRequest,
        sink: &mut S,
        recorded: impl Future<Output = bool> + Send,
        cancel: impl Future<Output = ()> + Send,
    ) -> Result<RunResult, BrokerError> {
        // Nothing is built ahead here: the command starts once its start is on disk.
        if !recorded.await {
            return Err(not_recorded());
        }
        let ran = self.seatbelt.execute(run_id, resolved, request, taken, sink, cancel).await;
        ran.map_err(|e| failed(e, "seatbelt.run"))
    }

    fn status(&self) -> (PoolStatus, CgroupStatus) {
        let pool = PoolStatus { idle: 0, size: 0, warm: false };
        let description = "no cgroups on macOS: a run's memory and processes are held by rlimits".into();
        (pool, CgroupStatus { mode: "none".into(), description })
    }

    /// The programs the broker runs: a run may see them, never write them.
    fn keeps(&self, _config: &Config) -> Vec<(PathBuf, &'static str, bool)> {
        let Ok(exe) = std::env::current_exe() else { return Vec::new() };
        vec![
            (exe.with_file_name("palisade"), "the CLI's program", false),
            (exe, "the broker's program", false),
        ]
    }
}

/// This process's supplementary groups.
fn groups() -> Vec<libc::gid_t> {
    // SAFETY: with a size of 0, getgroups writes nothing and returns the count.
    let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut groups = vec![0 as libc::gid_t; count.max(0) as usize];
    // SAFETY: `groups` is valid for writing `groups.len()` gids.
    let count = unsafe { libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr()) };
    groups.truncate(count.max(0) as usize);
    groups
}

/// Refuses a configuration that asks for what this broker does not do yet.
fn unserved(config: &Config) -> Result<(), String> {
    let not_yet =
        |what: &str, fix: &str| Err(format!("{what} is not served by palisade on macOS yet: {fix}"));
    if !config.broker.allowed_uids.is_empty() || !config.broker.allowed_gids.is_empty() {
        return not_yet(
            "a broker serving other users ([broker] allowed_uids, allowed_gids)",
            "run one palisaded per user (launchd/: the LaunchAgent)",
        );
    }
    // Root's processes are not held by RLIMIT_NPROC (a run's process
    // limit) and a root broker would serve other users.
    if cfg!(target_os = "macos") && nix::unistd::getuid().is_root() {
        return not_yet(
            "a broker running as root",
            "run palisaded as the user it serves (launchd/: the LaunchAgent, or the LaunchDaemon's account)",
        );
    }
    if config.trust.enabled && !config.tools.is_empty() {
        return not_yet(
            "tools' trust stages ([trust])",
            "set [trust] enabled = false to run tools without them",
        );
    }
    Ok(())
}
