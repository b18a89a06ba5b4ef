//! The end of a Tier C run before its helper's exit. The helper reports
//! ([`HelperRecord::Reaped`]) once it has reaped pid 1, and so every
//! process of the sandbox, then exits; its exit tears the sandbox's
//! namespaces and mounts down, which takes longer than the rest of the end
//! of a short run. The run is answered from the report, and the exit is
//! waited for after, off the client's path ([`Exiting`]), its cgroup
//! removed only then. [`Teardowns`] counts those under way, for a shutdown
//! to wait for.

use crate::engine::helper::StatusRead;
use palisade_protocol::{ExitReport, HelperRecord};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

/// The status channel, read while the command runs for the helper's
/// [`HelperRecord::Reaped`].
pub(crate) struct StatusWatch {
    channel: AsyncFd<File>,
    read: Mutex<StatusRead>,
}

impl StatusWatch {
    /// Watches `channel`, after what `read` holds of it.
    pub fn new(channel: File, read: StatusRead) -> std::io::Result<StatusWatch> {
        super::helper::nonblocking(&channel, true)?;
        // SAFETY: a File's descriptor stays open as long as the AsyncFd owns it.
        let channel = unsafe { AsyncFd::register(channel) }.map_err(std::io::Error::from)?;
        Ok(StatusWatch { channel, read: Mutex::new(read) })
    }

    /// Reads the channel until a record that `stop` picks has come (its
    /// index), or the channel's end (`None`).
    pub async fn until(&self, stop: impl Fn(&HelperRecord) -> bool) -> std::io::Result<Option<usize>> {
        loop {
            {
                let read =
                    self.read.lock().map_err(|_| std::io::Error::other("the status read was poisoned"))?;
                if let Some(at) = read.records.iter().position(&stop) {
                    return Ok(Some(at));
                }
                if read.ended {
                    return Ok(None);
                }
            }
            let mut ready = self.channel.readable().await?;
            let received = ready.try_io(|inner| match self.read.lock() {
                Ok(mut read) => read.receive(inner.get_ref()),
                Err(_) => Err(std::io::Error::other("the status read was poisoned")),
            });
            match received {
                Ok(result) => result?,
                Err(_would_block) => continue,
            }
        }
    }

    /// Completes once the helper has reported every process of the sandbox
    /// gone; never when the channel ends, or cannot be read, without that
    /// report (the helper's exit then ends the run, as before there was one).
    pub async fn reaped(&self) {
        let is_reaped = |r: &HelperRecord| matches!(r, HelperRecord::Reaped { .. });
        match self.until(is_reaped).await {
            Ok(Some(_)) => {}
            Ok(None) => std::future::pending().await,
            Err(e) => {
                tracing::debug!("the status channel, while the command runs: {e}");
                std::future::pending().await
            }
        }
    }

    /// The channel, blocking again, and what was read of it.
    pub fn into_parts(self) -> std::io::Result<(File, StatusRead)> {
        let channel = self.channel.into_inner();
        super::helper::nonblocking(&channel, false)?;
        let read = self.read.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok((channel, read))
    }
}

/// The helper's [`HelperRecord::Reaped`] among `records`: pid 1's status
/// and the CPU times (µs, user and system).
pub(crate) fn reaped(records: &[HelperRecord]) -> Option<(ExitReport, u64, u64)> {
    records.iter().find_map(|r| match r {
        HelperRecord::Reaped { exit, user_us, system_us } => Some((*exit, *user_us, *system_us)),
        _ => None,
    })
}

/// A helper that reported its sandbox gone and is exiting: reaped once it
/// has, off the client's path.
pub(crate) struct Exiting {
    pub pid: u32,
    pub pidfd: OwnedFd,
}

impl Exiting {
    /// Waits for the helper's exit, then reaps it.
    pub async fn reap(self) {
        let Exiting { pid, pidfd } = self;
        // SAFETY: an OwnedFd's descriptor stays open as long as the AsyncFd owns it.
        match unsafe { AsyncFd::register(pidfd) } {
            Ok(fd) => {
                let _ = fd.readable().await;
            }
            // Without the runtime's watch, a thread waits for it.
            Err(_) => {
                let _ = tokio::task::spawn_blocking(move || super::helper::reap(pid)).await;
                return;
            }
        }
        if let Err(e) = super::helper::reap(pid) {
            tracing::error!(pid, "cannot reap a helper after its run: {e}");
        }
    }
}

/// The sandboxes being torn down after their run was answered.
#[derive(Clone)]
pub(crate) struct Teardowns(std::sync::Arc<watch::Sender<usize>>);

impl Teardowns {
    pub fn new() -> Teardowns {
        Teardowns(std::sync::Arc::new(watch::channel(0).0))
    }

    /// Runs `teardown` in a task of its own, counted until it is done.
    pub fn spawn(&self, teardown: impl std::future::Future<Output = ()> + Send + 'static) {
        self.0.send_modify(|n| *n += 1);
        let count = self.0.clone();
        tokio::spawn(async move {
            teardown.await;
            count.send_modify(|n| *n -= 1);
        });
    }

    /// How many are under way now.
    pub fn under_way(&self) -> usize {
        *self.0.borrow()
    }

    /// Waits, up to `within`, until none is under way; whether none is.
    pub async fn settle(&self, within: Duration) -> bool {
        let mut count = self.0.subscribe();
        tokio::time::timeout(within, count.wait_for(|n| *n == 0)).await.is_ok_and(|r| r.is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reaped_record_is_found_among_the_others() {
        let mut records =
            vec![HelperRecord::Peak { max_rss_kib: 1 }, HelperRecord::Exit(ExitReport::Code(3))];
        assert_eq!(reaped(&records), None);
        records.push(HelperRecord::Reaped { exit: ExitReport::Signal(9), user_us: 1500, system_us: 20 });
        assert_eq!(reaped(&records), Some((ExitReport::Signal(9), 1500, 20)));
    }

    #[tokio::test]
    async fn a_shutdown_waits_for_the_teardowns_under_way() {
        let teardowns = Teardowns::new();
        assert!(teardowns.settle(Duration::from_millis(1)).await, "none under way");
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        teardowns.spawn(async move {
            let _ = finished.await;
        });
        assert!(!teardowns.settle(Duration::from_millis(20)).await, "one under way");
        done.send(()).unwrap();
        assert!(teardowns.settle(Duration::from_secs(10)).await, "done");
    }
}
