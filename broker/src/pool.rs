//! Helpers started ahead of requests: the warm pool.
//!
//! With a [`WarmSpec`] (a broker that is not root, with user namespaces),
//! each one builds a sandbox as far as nothing request-specific is involved
//! (its user namespace and maps, the other namespaces, the monitor and its
//! pid 1) and waits there for its plan; without one, it has exec'd and waits,
//! having done nothing else. A run takes one and writes the plan, so
//! starting a process, and building what the spec names, is not on the
//! run's path. A sandbox serves exactly one run, then is gone with it.
//!
//! Only runs without a cgroup use them (a run's cgroup must hold the helper
//! from the start), and a warm one only for a plan its spec admits; any
//! other run gets a cold helper. A dead one is skipped.

use crate::helper::{HelperChild, HelperCommand, Io};
use crate::spawn_thread::Spawner;
use palisade_protocol::{JailPlan, WarmSpec};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

type Ahead = tokio::sync::oneshot::Receiver<std::io::Result<HelperChild>>;

pub struct Pool {
    idle: Mutex<Vec<HelperChild>>,
    /// One helper being started for the next run only ([`Pool::start_one`]).
    ahead: Mutex<Option<Ahead>>,
    size: usize,
    /// One refill at a time.
    refilling: AtomicBool,
    spawner: Spawner,
    helper: PathBuf,
    /// What a helper builds before its plan; `None`: nothing.
    warm: Mutex<Option<WarmSpec>>,
}

impl Pool {
    pub fn new(spawner: Spawner, helper: PathBuf, size: usize, warm: Option<WarmSpec>) -> Arc<Pool> {
        Arc::new(Pool {
            idle: Mutex::new(Vec::new()),
            ahead: Mutex::new(None),
            size,
            refilling: AtomicBool::new(false),
            spawner,
            helper,
            warm: Mutex::new(warm),
        })
    }

    /// Helpers started from now on build nothing ahead of their plan (the
    /// host turned out to have no user namespaces for the broker).
    pub fn stop_warming(&self) {
        if let Ok(mut warm) = self.warm.lock() {
            *warm = None;
        }
    }

    fn command(&self) -> HelperCommand {
        HelperCommand {
            helper: self.helper.clone(),
            cgroup_dir: None,
            stdin: Io::Piped,
            stdout: Io::Piped,
            stderr: Io::Piped,
            outer_limits: vec![],
            warm: self.warm.lock().ok().and_then(|w| *w),
        }
    }

    /// An idle helper that can run `plan`, if one is ready. The caller
    /// calls [`Pool::refill`] once its run is over: a replacement started
    /// now would compete with the run for the CPU.
    fn take(self: &Arc<Pool>, plan: &JailPlan) -> Option<HelperChild> {
        if self.size == 0 {
            return None;
        }
        let mut taken = None;
        let mut empty = true;
        if let Ok(mut idle) = self.idle.lock() {
            idle.retain_mut(|h| matches!(h.try_wait(), Ok(None)));
            if let Some(i) = idle.iter().position(|h| fits(h, plan)) {
                taken = Some(idle.swap_remove(i));
            }
            empty = idle.is_empty();
        }
        if empty {
            // No spare left for the next run: start one now after all.
            self.refill();
        }
        taken
    }

    /// Starts one helper now, on the spawner's thread, for the next run
    /// alone (no refill after it): a broker of one run (the CLI's embedded
    /// one) has its helper started while it decides. Call before any runtime.
    pub fn start_one(&self) {
        match self.spawner.submit(self.command()) {
            Ok(rx) => {
                if let Ok(mut ahead) = self.ahead.lock() {
                    *ahead = Some(rx);
                }
            }
            Err(e) => tracing::warn!("cannot start a helper ahead of the run: {e}"),
        }
    }

    /// A helper for `plan`: the one of [`Pool::start_one`], once started,
    /// if it is still there and can run it (else it is discarded); else an
    /// idle one that can.
    pub async fn claim(self: &Arc<Pool>, plan: &JailPlan) -> Option<HelperChild> {
        let ahead = self.ahead.lock().ok().and_then(|mut a| a.take());
        if let Some(rx) = ahead {
            match rx.await {
                Ok(Ok(mut h)) => match h.try_wait() {
                    Ok(None) if fits(&h, plan) => return Some(h),
                    Ok(None) => h.discard(),
                    _ => {}
                },
                Ok(Err(e)) => tracing::warn!("the helper started ahead of the run failed: {e}"),
                Err(_) => {}
            }
        }
        self.take(plan)
    }

    /// Starts helpers until `size` are idle (in the background).
    pub fn refill(self: &Arc<Pool>) {
        if self.size == 0 || self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let pool = Arc::clone(self);
        tokio::spawn(async move {
            while pool.idle.lock().is_ok_and(|idle| idle.len() < pool.size) {
                match pool.spawner.spawn(pool.command()).await {
                    Ok(h) => match pool.idle.lock() {
                        Ok(mut idle) => idle.push(h),
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

/// Whether `helper` can run `plan`: any helper that built nothing, a warm
/// one only for a plan its spec admits.
fn fits(helper: &HelperChild, plan: &JailPlan) -> bool {
    helper.warm.is_none_or(|spec| spec.admits(plan).is_ok())
}
