//! The log of refused connections, without a line for each: a client that
//! connects in a loop past its limits, or a user the broker does not serve,
//! would otherwise fill the log. Each kind of refusal has its own
//! [`Refusals`], so that one kind never hides another. The first refusal of every
//! [`REFUSAL_LOG_EVERY`] is logged; the others are counted, and the count
//! goes out with the next refusal logged, or on its own a period later.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a refused connection is logged at most.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// When the last refusal was logged, and how many were not since.
#[derive(Default)]
pub struct Refusals {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    logged_at: Option<Instant>,
    unlogged: u64,
}

impl State {
    /// Whether a period has passed since the last refusal logged.
    fn due(&self, now: Instant) -> bool {
        self.logged_at.is_none_or(|at| now.saturating_duration_since(at) >= REFUSAL_LOG_EVERY)
    }

    /// A line goes out at `now`: the count it carries, from zero again.
    fn log(&mut self, now: Instant) -> u64 {
        self.logged_at = Some(now);
        std::mem::take(&mut self.unlogged)
    }
}

impl Refusals {
    /// A refusal at `now`: `Some(n)` when it is to be logged, `n` the
    /// refusals not logged before it; `None` when it is only counted.
    pub fn note(&self, now: Instant) -> Option<u64> {
        let mut s = self.lock();
        if !s.due(now) {
            s.unlogged += 1;
            return None;
        }
        Some(s.log(now))
    }

    /// Whether some refusals are counted and not logged yet.
    pub fn pending(&self) -> bool {
        self.lock().unlogged > 0
    }

    /// The refusals not logged, once a period has passed since the last
    /// logged one and no other refusal came to carry their count.
    pub fn overdue(&self, now: Instant) -> Option<u64> {
        let mut s = self.lock();
        (s.unlogged > 0 && s.due(now)).then(|| s.log(now))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a logged refusal adds about those that were not.
pub fn unlogged_suffix(unlogged: u64) -> String {
    match unlogged {
        0 => String::new(),
        n => format!(" ({n} more refused before it, not logged)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_refusal_of_each_period_is_logged_with_the_count_of_the_others() {
        let r = Refusals::default();
        let t0 = Instant::now();
        assert_eq!(r.note(t0), Some(0));
        let later = |ms| t0 + Duration::from_millis(ms);
        for ms in [1, 500, 9_999] {
            assert_eq!(r.note(later(ms)), None);
        }
        assert_eq!(r.note(later(10_000)), Some(3));
        assert_eq!(r.note(later(10_001)), None);
        assert_eq!(r.note(later(25_000)), Some(1));
        // The count of the last ones goes out on its own when no refusal follows.
        assert_eq!(r.note(later(25_001)), None);
        assert!(r.pending());
        assert_eq!(r.overdue(later(30_000)), None);
        assert_eq!(r.overdue(later(35_000)), Some(1));
        assert_eq!(r.overdue(later(50_000)), None);
        assert!(!r.pending());
        assert_eq!(unlogged_suffix(0), "");
        assert_eq!(unlogged_suffix(3), " (3 more refused before it, not logged)");
    }
}
