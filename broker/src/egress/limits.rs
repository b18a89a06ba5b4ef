//! The run's limits: the byte quota both ways, connections open at once,
//! and the resolver's query rate.

use super::refusal::Refusal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;

/// Queries a second the sandbox's resolver answers, sustained: far above
/// what a build or a package manager asks, low enough to bound the work a
/// looping process makes the broker do.
pub const DNS_RATE: u32 = 100;
/// Queries answered at once before the rate applies (a burst of lookups at
/// a tool's start).
pub const DNS_BURST: u32 = 200;

/// Bytes both ways, every connection of the run together.
pub struct Quota {
    max: u64,
    used: AtomicU64,
    exceeded: watch::Sender<bool>,
}

impl Quota {
    pub fn new(max: u64) -> Quota {
        Quota { max, used: AtomicU64::new(0), exceeded: watch::Sender::new(false) }
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// Takes room for `n` bytes and returns how many may pass: `n`, or
    /// fewer when this takes the run past its quota, which then ends every
    /// connection ([`Quota::reached`]).
    pub fn take(&self, n: usize) -> usize {
        let before = self.used.fetch_add(n as u64, Ordering::Relaxed);
        if before + n as u64 <= self.max {
            return n;
        }
        self.exceeded.send_replace(true);
        self.max.saturating_sub(before).min(n as u64) as usize
    }

    pub fn is_exceeded(&self) -> bool {
        *self.exceeded.borrow()
    }

    /// Resolves once the quota is exceeded.
    pub async fn reached(&self) {
        let mut rx = self.exceeded.subscribe();
        let _ = rx.wait_for(|exceeded| *exceeded).await;
    }
}

/// Connections open at once, proxy and transparent together.
pub struct Slots {
    max: u32,
    permits: Arc<Semaphore>,
}

impl Slots {
    pub fn new(max: u32) -> Slots {
        Slots { max, permits: Arc::new(Semaphore::new(max as usize)) }
    }

    /// A slot for a new connection, held as long as it is open; refused
    /// when the quota is used up or every slot is taken.
    pub fn admit(&self, quota: &Quota) -> Result<OwnedSemaphorePermit, Refusal> {
        if quota.is_exceeded() {
            return Err(Refusal::QuotaExceeded(quota.max()));
        }
        self.permits.clone().try_acquire_owned().map_err(|_| Refusal::TooManyConnections(self.max))
    }
}

/// A token bucket for the resolver.
pub struct Rate {
    tokens: f64,
    last: Instant,
    /// The current run of refusals was recorded already (one record per
    /// burst, not per query).
    limited: bool,
}

/// What the bucket says of one query.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// Over the rate; `first` of a run of refusals.
    Limited {
        first: bool,
    },
}

impl Rate {
    pub fn new() -> Rate {
        Rate { tokens: f64::from(DNS_BURST), last: Instant::now(), limited: false }
    }

    pub fn take(&mut self) -> Verdict {
        let now = Instant::now();
        let refill = now.duration_since(self.last).as_secs_f64() * f64::from(DNS_RATE);
        self.tokens = (self.tokens + refill).min(f64::from(DNS_BURST));
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            self.limited = false;
            return Verdict::Allowed;
        }
        let first = !self.limited;
        self.limited = true;
        Verdict::Limited { first }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quota_cuts_at_the_byte() {
        let q = Quota::new(10);
        assert_eq!(q.take(6), 6);
        assert!(!q.is_exceeded());
        assert_eq!(q.take(4), 4);
        assert!(!q.is_exceeded());
        assert_eq!(q.take(3), 0);
        assert!(q.is_exceeded());
        let q = Quota::new(10);
        assert_eq!(q.take(16), 10);
        assert!(q.is_exceeded());
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_refuses_past_the_burst_and_refills() {
        let mut rate = Rate::new();
        for _ in 0..DNS_BURST {
            assert_eq!(rate.take(), Verdict::Allowed);
        }
        assert_eq!(rate.take(), Verdict::Limited { first: true });
        assert_eq!(rate.take(), Verdict::Limited { first: false });
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        assert_eq!(rate.take(), Verdict::Allowed);
    }
}
