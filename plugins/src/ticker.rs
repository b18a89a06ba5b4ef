//! The epoch ticker: the clock of the calls' wall-clock deadlines. It ticks
//! only while a call runs, so an idle host does not wake every millisecond.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use wasmtime::Engine;

/// One epoch: the resolution of a call's deadline (a deadline of N ms is N ticks).
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(1);

#[derive(Default)]
struct Shared {
    active: AtomicBool,
    stop: AtomicBool,
}

pub(crate) struct EpochTicker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Ticking lasts as long as this guard.
pub(crate) struct Ticking<'a>(&'a EpochTicker);

impl EpochTicker {
    pub(crate) fn start(engine: Engine) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let theirs = Arc::clone(&shared);
        let thread = thread::Builder::new().name("epoch-ticker".into()).spawn(move || {
            while !theirs.stop.load(Ordering::Acquire) {
                if theirs.active.load(Ordering::Acquire) {
                    thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                } else {
                    thread::park();
                }
            }
        })?;
        Ok(EpochTicker { shared, thread: Some(thread) })
    }

    pub(crate) fn ticking(&self) -> Ticking<'_> {
        self.shared.active.store(true, Ordering::Release);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
        Ticking(self)
    }
}

impl Drop for Ticking<'_> {
    fn drop(&mut self) {
        self.0.shared.active.store(false, Ordering::Release);
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
