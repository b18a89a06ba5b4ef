//! Helpers started ahead of requests.
//!
//! Each one has exec'd and waits, having done nothing else, for its plan on
//! its socket; a run takes one and writes the plan, so starting a process is not
//! on the run's path. Only runs without a cgroup use them: a run's cgroup
//! must hold the helper from the start. A dead or stale one is skipped.

use crate::helper::{HelperChild, HelperCommand, Io};
use crate::spawn_thread::Spawner;
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
}

impl Pool {
    pub fn new(spawner: Spawner, helper: PathBuf, size: usize) -> Arc<Pool> {
        Arc::new(Pool {
            idle: Mutex::new(Vec::new()),
            ahead: Mutex::new(None),
            size,
            refilling: AtomicBool::new(false),
            spawner,
            helper,
        })
    }

    fn command(&self) -> HelperCommand {
        HelperCommand {
            helper: self.helper.clone(),
            cgroup_dir: None,
            stdin: Io::Piped,
            stdout: Io::Piped,
            stderr: Io::Piped,
            outer_limits: vec![],
        }
    }

    /// An idle helper, if one is ready. The caller calls [`Pool::refill`]
    /// once its run is over: a replacement started now would compete with
    /// the run for the CPU.
    pub fn take(self: &Arc<Pool>) -> Option<HelperChild> {
        if self.size == 0 {
            return None;
        }
        let mut taken = None;
        let mut empty = true;
        if let Ok(mut idle) = self.idle.lock() {
            while let Some(mut h) = idle.pop() {
                if matches!(h.try_wait(), Ok(None)) {
                    taken = Some(h);
                    break;
                }
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

    /// The helper of [`Pool::start_one`], once started, if it is still there;
    /// else one of [`Pool::take`].
    pub async fn claim(self: &Arc<Pool>) -> Option<HelperChild> {
        let ahead = self.ahead.lock().ok().and_then(|mut a| a.take());
        if let Some(rx) = ahead {
            match rx.await {
                Ok(Ok(mut h)) => {
                    if matches!(h.try_wait(), Ok(None)) {
                        return Some(h);
                    }
                }
                Ok(Err(e)) => tracing::warn!("the helper started ahead of the run failed: {e}"),
                Err(_) => {}
            }
        }
        self.take()
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
