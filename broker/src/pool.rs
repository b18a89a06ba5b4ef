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

pub struct Pool {
    idle: Mutex<Vec<HelperChild>>,
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
