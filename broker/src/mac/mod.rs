//! palisade on macOS: the policy's decisions run under Seatbelt.
//!
//! [`Mac`] is the broker there: each request is decided by the same policy
//! as on Linux, on the host as [`host`] describes it (Tier B's plan, with
//! Seatbelt in place of Landlock and seccomp), recorded in the audit
//! journal, and run by [`crate::seatbelt`]. `palisaded` serves it on the
//! socket launchd hands over ([`serve`]); `palisade run` embeds it
//! ([`cli`]).
//!
//! What the Linux broker does and this one does not yet is refused, with
//! that reason, never done differently: peers of another uid (and so a
//! root broker serving other users), trust stages, runs that need a
//! person's approval, plugins, strict egress (the policy refuses it in Tier
//! B) and cgroups.
//!
//! Built on every Unix: on Linux its tests drive it through a stand-in for
//! `sandbox-exec`, so what is tested there is the broker's side.

pub mod cli;
pub mod host;
#[cfg(target_os = "macos")]
pub mod launchd;
#[cfg(all(test, target_os = "macos"))]
mod macos_tests;
pub mod serve;
#[cfg(all(test, target_os = "linux"))]
mod tests;

use crate::engine::stream::Sink;
use crate::journal::{Journal, events};
use crate::seatbelt::Seatbelt;
use palisade_policy::{Config, Context, Decision, Host, Policy};
use palisade_protocol::HostIds;
use palisade_protocol::attest::JournalRecord;
use palisade_protocol::wire::{ErrorKind, ErrorReply, RunRequest, RunResult};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// Who asks: uid, gid and pid (where the system tells it).
pub type Peer = (u32, u32, Option<i32>);

/// The broker on macOS.
pub struct Mac {
    policy: Policy,
    seatbelt: Seatbelt,
    journal: Journal,
    /// Every run's context but its number.
    context: Context,
    host: Box<dyn Fn() -> Host + Send + Sync>,
    next_run: AtomicU64,
    /// `[policy] host_executed`: what no run may write, beside the built-in list.
    host_executed: Vec<String>,
    /// Where the runs' directories and profiles go (`context.temp_root`).
    _temp_root: crate::host::paths::TempRoot,
}

impl Mac {
    /// A broker for `config`, running commands through `launcher` (see
    /// [`crate::seatbelt::SANDBOX_EXEC`]) on the host `host` describes.
    pub fn assemble(
        config: Config,
        launcher: PathBuf,
        host: impl Fn() -> Host + Send + Sync + 'static,
    ) -> Result<Mac, String> {
        unserved(&config)?;
        let kept = crate::host::paths::temp_root(config.policy.temp_root.as_deref())?;
        let temp_root = kept.path.clone();
        let seatbelt = Seatbelt::new(launcher, temp_root.join("profiles"))?;
        // What brokers no longer running left: their runs' processes, directories and profiles.
        seatbelt.kill_leftovers();
        crate::host::instance::remove_orphans(&temp_root, "run-");
        crate::host::instance::remove_orphans(&temp_root.join("profiles"), "");
        let journal = Journal::from_config(&config)?;
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
        };
        let owned: std::sync::Arc<[_]> =
            crate::decide::owned::owned(&config, journal.dir(), &context.temp_root, &[]).into();
        let host = move || Host { owned: owned.clone(), ..host() };
        let host_executed: Vec<String> =
            config.policy.host_executed.iter().map(|g| g.get_ref().clone()).collect();
        // A glob the profile cannot hold is refused now, not at every run.
        palisade_policy::seatbelt::held_writes(&[], &host_executed).map_err(|e| e.to_string())?;
        let policy = Policy::new(config, &*crate::host::files::files());
        Ok(Mac {
            policy,
            seatbelt,
            journal,
            context,
            host: Box::new(host),
            next_run: AtomicU64::new(1),
            host_executed,
            _temp_root: kept,
        })
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Decides `request` from `peer` and runs it: its result, or the
    /// refusal. Each step is in the journal before the next; a result is
    /// sent only once its record is on disk.
    pub async fn run<S: Sink + Send>(
        &self,
        peer: Peer,
        request: &RunRequest,
        sink: &mut S,
        cancel: impl Future<Output = ()> + Send,
    ) -> Result<RunResult, ErrorReply> {
        let run_id = self.next_run.fetch_add(1, Ordering::Relaxed);
        let context = Context { run: run_id, ..self.context.clone() };
        let refused = |e: ErrorReply| {
            let decision = events::decision(run_id, "deny", Some(&e));
            // In bounded form, at the uid's rate: a refusal costs the journal little.
            match self
                .journal
                .refusal_blocking(peer.0, vec![events::refused(run_id, peer, request), decision])
            {
                Ok(_) => e,
                Err(j) => events::journal_refusal(j),
            }
        };
        // The decision reads the host (a file on a stuck network filesystem
        // can block): on a runtime with workers to spare, the others serve on.
        let decide = || self.policy.decide(&(self.host)(), &context, request);
        let decision = match tokio::runtime::Handle::current().runtime_flavor() {
            tokio::runtime::RuntimeFlavor::CurrentThread => decide(),
            _ => tokio::task::block_in_place(decide),
        };
        let resolved = match decision {
            Decision::Allow(r) => r,
            Decision::Deny(d) => return Err(refused(ErrorReply::with_rule(d.kind, d.reason, d.rule))),
            Decision::NeedsApproval { reason, .. } => {
                let why = "a person's approval is not served by palisade on macOS yet";
                return Err(refused(ErrorReply::with_rule(
                    ErrorKind::NeedsApproval,
                    format!("{reason} Not run: {why}."),
                    "approval.unavailable",
                )));
            }
        };
        let prepared = match self.seatbelt.prepare(run_id, &resolved, request, &self.host_executed) {
            Ok(p) => p,
            Err(e) => {
                return Err(refused(ErrorReply::with_rule(e.kind(), e.to_string(), "seatbelt.profile")));
            }
        };
        let started = events::run_started_as(run_id, prepared.attestation.clone());
        let received = events::received(run_id, peer, request);
        let pending = vec![received, events::decision(run_id, "allow", None), started];
        // Written before the command starts: a run that cannot be recorded does not run.
        self.journal.start_all(pending, false).await.map_err(events::journal_refusal)?;
        for w in &resolved.warnings {
            tracing::warn!(run_id, "{w}");
        }
        let result = self.seatbelt.execute(run_id, &resolved, request, prepared, sink, cancel).await;
        let event = match &result {
            Ok(r) => events::run_finished(r),
            Err(e) => events::run_failed(run_id, e.kind(), e.to_string(), None),
        };
        let receipt = self.journal.append(event).await.map_err(events::journal_refusal)?;
        let mut result =
            result.map_err(|e| ErrorReply::with_rule(e.kind(), e.to_string(), "seatbelt.run"))?;
        if self.journal.enabled() {
            result.attestation.journal = Some(JournalRecord { seq: receipt.seq, hash: receipt.hash });
        }
        Ok(result)
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
