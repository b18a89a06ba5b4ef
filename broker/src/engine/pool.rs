//! Helpers started ahead of requests: the warm pool.
//!
//! With a [`WarmSpec`] (user namespaces; a system broker keeps a pool per
//! requester, `engine/requesters.rs`), each one builds a sandbox as far as
//! nothing request-specific is involved (its user namespace and maps, the
//! other namespaces, the monitor and its pid 1) and waits there for its plan; without one, it has exec'd and waits,
//! having done nothing else. A run takes one and writes the plan, so
//! starting a process, and building what the spec names, is not on the
//! run's path. A sandbox serves exactly one run, then is gone with it.
//!
//! Where runs get cgroups, each warm slot has a cgroup of its own from the
//! start (`run-<instance>-pool-<n>`, no limits): on v2 the helper joins it
//! before its namespaces; on v1 the broker places the helper in it, in every
//! hierarchy, before sending its spec ([`place_then_send`]). Either way the
//! monitor and pid 1 are born in it. The run that claims the slot takes that
//! cgroup for its own (nothing is renamed) and its limits are set then,
//! before its plan is sent. A helper that built nothing serves
//! only a run without a cgroup (which must hold the helper from its start);
//! a warm one only a run whose plan its spec admits. Any other run gets a
//! cold helper. A dead one is skipped. The engine keeps a second pool of
//! one helper that built nothing, for the commands of sessions
//! (`Engine::claim_join`).

use crate::engine::cgroup::{Cgroups, RunCgroup};
use crate::engine::helper::{HelperChild, HelperCommand, Io};
use crate::engine::spawn_thread::{AfterSpawn, Spawner};
use palisade_protocol::{JailPlan, WarmSpec};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

type Started = tokio::sync::oneshot::Receiver<std::io::Result<HelperChild>>;

/// A helper to start ([`Pool::command`]): its command, its slot's cgroup,
/// and on cgroup v1 what the spawner thread does once it has started it.
struct Start {
    command: HelperCommand,
    cgroup: Option<RunCgroup>,
    after: Option<AfterSpawn>,
}

/// How long [`Pool::close`] waits for a refill under way (one helper's start).
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A helper started ahead, and its cgroup when it is a warm slot's.
pub struct Slot {
    pub helper: HelperChild,
    pub cgroup: Option<RunCgroup>,
}

impl Slot {
    /// Whether it can run `plan`, in a cgroup (`in_cgroup`) or not.
    fn fits(&self, plan: &JailPlan, in_cgroup: bool) -> bool {
        match self.helper.warm {
            Some(spec) => spec.admits(plan).is_ok() && self.cgroup.is_some() == in_cgroup,
            None => !in_cgroup,
        }
    }

    fn alive(&mut self) -> bool {
        matches!(self.helper.try_wait(), Ok(None))
    }

    /// Kills it, and removes its cgroup (its pid 1, killed with it, has
    /// left it within a few polls).
    pub fn discard(self) {
        self.helper.discard();
        if let Some(cgroup) = self.cgroup {
            cgroup.remove();
        }
    }
}

pub struct Pool {
    idle: Mutex<Vec<Slot>>,
    /// One helper being started for the next run only ([`Pool::start_one`]).
    ahead: Mutex<Option<(Started, Option<RunCgroup>)>>,
    size: usize,
    /// One refill at a time.
    refilling: AtomicBool,
    /// Shut down: nothing is started any more ([`Pool::close`]).
    closed: AtomicBool,
    /// [`Pool::say_unfit`] has said it.
    said_unfit: AtomicBool,
    spawner: Spawner,
    helper: PathBuf,
    /// What a helper builds before its plan; `None`: nothing.
    warm: Mutex<Option<WarmSpec>>,
    /// Where warm slots' cgroups go, with `warm`'s `cgroup`.
    cgroups: Cgroups,
}

/// cgroup v1: what the spawner thread does with a warm slot's helper just
/// started. The helper has done nothing yet (it waits on fd 3): it is moved
/// into the slot's cgroup in every hierarchy, then sent its spec, so that
/// the monitor and pid 1 it forks are born there, before any run claims
/// it. (Moving them at a claim would need the right to move processes of
/// the sandbox's host ids, which a system unit's broker lacks on v1.) On a
/// failure the helper is killed; the slot's cgroup goes with its owner.
fn place_then_send(cgroup: &RunCgroup, spec: WarmSpec) -> std::io::Result<AfterSpawn> {
    let membership = cgroup.membership().ok_or_else(|| std::io::Error::other("the slot's cgroup is gone"))?;
    Ok(Box::new(move |mut helper: HelperChild| {
        let sent = membership.place(helper.pid).map_err(std::io::Error::other).and_then(|()| {
            let channel = helper.plan_channel.as_ref().ok_or(std::io::ErrorKind::BrokenPipe)?;
            // Into an empty socket's buffer: it cannot block.
            std::io::Write::write_all(&mut &*channel, &spec.encode())
        });
        match sent {
            Ok(()) => {
                helper.warm = Some(spec);
                Ok(helper)
            }
            Err(e) => {
                helper.discard();
                Err(e)
            }
        }
    }))
}

/// Warm slots' cgroups made by this broker, in all its pools (a system
/// broker has one per requester): each slot's name is its own.
static SLOTS_MADE: AtomicU64 = AtomicU64::new(0);

impl Pool {
    pub fn new(
        spawner: Spawner,
        helper: PathBuf,
        size: usize,
        warm: Option<WarmSpec>,
        cgroups: Cgroups,
    ) -> Arc<Pool> {
        Arc::new(Pool {
            idle: Mutex::new(Vec::new()),
            ahead: Mutex::new(None),
            size,
            refilling: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            said_unfit: AtomicBool::new(false),
            spawner,
            helper,
            warm: Mutex::new(warm),
            cgroups,
        })
    }

    /// Slots idle now, waiting for a run.
    pub fn idle(&self) -> usize {
        self.idle.lock().map_or(0, |idle| idle.len())
    }

    /// How many slots it keeps (`prespawn`).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether its slots build their sandbox ahead of a plan.
    pub fn warm(&self) -> bool {
        self.warm.lock().is_ok_and(|w| w.is_some())
    }

    /// Helpers started from now on build nothing ahead of their plan (the
    /// host turned out to have no user namespaces for the broker).
    pub fn stop_warming(&self) {
        if let Ok(mut warm) = self.warm.lock() {
            *warm = None;
        }
    }

    /// What to start next: the helper's command and, for a warm slot where
    /// runs get cgroups, that cgroup (v2: its directory goes to the helper
    /// as fd 5). On cgroup v1 the spec is not in the command: the spawner
    /// thread sends it once it has placed the helper ([`place_then_send`]).
    fn command(&self) -> std::io::Result<Start> {
        let warm = self.warm.lock().ok().and_then(|w| *w);
        let cgroup = match warm {
            Some(spec) if spec.cgroup || self.cgroups.is_v1() => {
                let n = SLOTS_MADE.fetch_add(1, Ordering::Relaxed) + 1;
                let name = format!("run-{}-pool-{n}", crate::host::instance::tag());
                Some(self.cgroups.create_unlimited(&name).map_err(std::io::Error::other)?)
            }
            _ => None,
        };
        let cgroup_dir = cgroup.as_ref().map(RunCgroup::open_dir).transpose()?.flatten();
        let after = match (warm, &cgroup) {
            (Some(spec), Some(c)) if !c.joins_itself() => Some(place_then_send(c, spec)?),
            _ => None,
        };
        let command = HelperCommand {
            helper: self.helper.clone(),
            cgroup_dir,
            stdin: Io::Piped,
            stdout: Io::Piped,
            stderr: Io::Piped,
            outer_limits: vec![],
            warm: if after.is_some() { None } else { warm },
        };
        Ok(Start { command, cgroup, after })
    }

    /// An idle slot that can run `plan`, if one is ready. The caller calls
    /// [`Pool::refill`] once its run is over: a replacement started now
    /// would compete with the run for the CPU.
    fn take(self: &Arc<Pool>, plan: &JailPlan, in_cgroup: bool) -> Option<Slot> {
        if self.size == 0 {
            return None;
        }
        let mut taken = None;
        let mut empty = true;
        if let Ok(mut idle) = self.idle.lock() {
            idle.retain_mut(Slot::alive);
            match idle.iter().position(|s| s.fits(plan, in_cgroup)) {
                Some(i) => taken = Some(idle.swap_remove(i)),
                None => self.say_unfit(idle.first(), plan),
            }
            empty = idle.is_empty();
        }
        if empty {
            // No spare left for the next run: start one now after all.
            self.refill();
        }
        taken
    }

    /// Once: why the pool's sandboxes fit a run that then runs cold, for an
    /// operator whose runs none of them fits (`warm = false` spares them).
    fn say_unfit(&self, slot: Option<&Slot>, plan: &JailPlan) {
        let Some(Err(why)) = slot.and_then(|s| s.helper.warm).map(|spec| spec.admits(plan)) else { return };
        if !self.said_unfit.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "a run does not fit the warm pool's sandboxes and runs cold ({why}); \
                 if none does, [broker] warm = false spares building them"
            );
        }
    }

    /// Starts one helper now, on the spawner's thread, for the next run
    /// alone (no refill after it): a broker of one run (the CLI's embedded
    /// one) has its helper started while it decides. Call before any runtime.
    pub fn start_one(&self) {
        let submitted = self.command().and_then(|s| Ok((self.spawner.submit(s.command, s.after)?, s.cgroup)));
        match submitted {
            Ok(started) => {
                if let Ok(mut ahead) = self.ahead.lock() {
                    *ahead = Some(started);
                }
            }
            Err(e) => tracing::warn!("cannot start a helper ahead of the run: {e}"),
        }
    }

    /// A slot for `plan`, run in a cgroup (`in_cgroup`) or not: the one of
    /// [`Pool::start_one`], once started, if it is still there and can run
    /// it (else it is discarded); else an idle one that can.
    pub async fn claim(self: &Arc<Pool>, plan: &JailPlan, in_cgroup: bool) -> Option<Slot> {
        let ahead = self.ahead.lock().ok().and_then(|mut a| a.take());
        if let Some((started, cgroup)) = ahead {
            match started.await {
                Ok(Ok(helper)) => {
                    let mut slot = Slot { helper, cgroup };
                    if slot.alive() && slot.fits(plan, in_cgroup) {
                        return Some(slot);
                    }
                    slot.discard();
                }
                Ok(Err(e)) => tracing::warn!("the helper started ahead of the run failed: {e}"),
                Err(_) => {}
            }
        }
        self.take(plan, in_cgroup)
    }

    /// At shutdown (blocking): starts nothing more, waits for a refill
    /// under way, and discards the idle slots, their cgroups with them.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let start = std::time::Instant::now();
        while self.refilling.load(Ordering::Acquire) && start.elapsed() < CLOSE_WAIT {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let idle = self.idle.lock().map(|mut idle| std::mem::take(&mut *idle)).unwrap_or_default();
        idle.into_iter().for_each(Slot::discard);
    }

    /// Starts helpers until `size` are idle (in the background).
    pub fn refill(self: &Arc<Pool>) {
        if self.size == 0 || self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let pool = Arc::clone(self);
        tokio::spawn(async move {
            while !pool.closed.load(Ordering::Acquire)
                && pool.idle.lock().is_ok_and(|idle| idle.len() < pool.size)
            {
                let started = match pool.command() {
                    Ok(Start { command, cgroup, after }) => {
                        pool.spawner.spawn_then(command, after).await.map(|helper| Slot { helper, cgroup })
                    }
                    Err(e) => Err(e),
                };
                match started {
                    // Closed meanwhile (a requester's pool dropped, a shutdown): not kept.
                    Ok(slot) if pool.closed.load(Ordering::Acquire) => {
                        let _ = tokio::task::spawn_blocking(move || slot.discard()).await;
                    }
                    Ok(slot) => match pool.idle.lock() {
                        Ok(mut idle) => idle.push(slot),
                        Err(_) => break,
                    },
                    Err(e) => {
                        tracing::warn!("cannot start a helper ahead of requests: {e}");
                        break;
                    }
                }
            }
            pool.refilling.store(false, Ordering::Release);
        });
    }
}
