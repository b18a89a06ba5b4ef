//! Refusals recorded at a rate per uid: the first `refusals_recorded` of a
//! uid in each period one by one, the others counted. A period that counted
//! some ends in a `refusals_summarized` record (written when it ends, or
//! when the broker stops), so a client refused in a loop writes a bounded
//! number of records and none of its refusals goes unrecorded.

use super::Event;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// What to do with one refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Record it one by one.
    Record,
    /// Count it: the period's summary says it.
    Count {
        /// The first counted in its period (the writer must learn when it ends).
        first: bool,
    },
}

/// One uid's current period.
struct Period {
    started: Instant,
    since: SystemTime,
    recorded: u32,
    counted: u64,
}

/// The rate, and every uid's period.
pub struct RefusalRate {
    per_period: u32,
    period: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    uids: HashMap<u32, Period>,
    /// Summaries of periods that ended, not yet written.
    ready: Vec<Event>,
}

impl RefusalRate {
    pub fn new(per_period: u32, period: Duration) -> RefusalRate {
        RefusalRate { per_period, period, state: Mutex::default() }
    }

    /// A refusal of `uid` at `now` (`wall`: the same instant by the clock).
    pub fn note(&self, uid: u32, now: Instant, wall: SystemTime) -> Admit {
        let mut s = self.lock();
        let ended = s.uids.get(&uid).is_some_and(|p| now.saturating_duration_since(p.started) >= self.period);
        if ended {
            if let Some(summary) = s.uids.remove(&uid).and_then(|p| self.summary(uid, &p)) {
                s.ready.push(summary);
            }
        }
        let p = s.uids.entry(uid).or_insert(Period { started: now, since: wall, recorded: 0, counted: 0 });
        if p.recorded < self.per_period {
            p.recorded += 1;
            return Admit::Record;
        }
        p.counted += 1;
        Admit::Count { first: p.counted == 1 }
    }

    /// When the writer must next write summaries: the end of the first
    /// period that counted refusals (now, when some are ready).
    pub fn next_due(&self) -> Option<Instant> {
        let s = self.lock();
        if !s.ready.is_empty() {
            return Some(Instant::now());
        }
        s.uids.values().filter(|p| p.counted > 0).map(|p| p.started + self.period).min()
    }

    /// The summaries to write at `now`: of every period that ended, and
    /// with `all` (the broker stops) of every period that counted refusals.
    pub fn take(&self, now: Instant, all: bool) -> Vec<Event> {
        let mut s = self.lock();
        let ended: Vec<u32> = s
            .uids
            .iter()
            .filter(|(_, p)| all || now.saturating_duration_since(p.started) >= self.period)
            .map(|(uid, _)| *uid)
            .collect();
        let mut out = std::mem::take(&mut s.ready);
        for uid in ended {
            if let Some(summary) = s.uids.remove(&uid).and_then(|p| self.summary(uid, &p)) {
                out.push(summary);
            }
        }
        out
    }

    /// Summaries that could not be written: written with the next batch.
    pub fn restore(&self, summaries: Vec<Event>) {
        let mut s = self.lock();
        let later = std::mem::replace(&mut s.ready, summaries);
        s.ready.extend(later);
    }

    fn summary(&self, uid: u32, p: &Period) -> Option<Event> {
        let since = p.since.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        (p.counted > 0).then(|| Event::RefusalsSummarized {
            uid,
            count: p.counted,
            recorded: p.recorded,
            since: super::record::rfc3339(since),
            period_secs: self.period.as_secs(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(events: &[Event]) -> Vec<(u32, u64, u32)> {
        let mut v: Vec<(u32, u64, u32)> = events
            .iter()
            .map(|e| match e {
                Event::RefusalsSummarized { uid, count, recorded, .. } => (*uid, *count, *recorded),
                other => panic!("{other:?}"),
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn past_the_rate_a_uids_refusals_are_counted_and_summarized_when_the_period_ends() {
        let rate = RefusalRate::new(3, Duration::from_secs(60));
        let (t0, wall) = (Instant::now(), SystemTime::now());
        let a: Vec<Admit> = (0..10).map(|_| rate.note(1000, t0, wall)).collect();
        assert_eq!(&a[..3], [Admit::Record; 3]);
        assert_eq!(a[3], Admit::Count { first: true });
        assert!(a[4..].iter().all(|x| *x == Admit::Count { first: false }));
        // Another uid has a rate of its own.
        assert_eq!(rate.note(1001, t0, wall), Admit::Record);
        assert_eq!(rate.next_due(), Some(t0 + Duration::from_secs(60)));
        // Nothing is due before the period ends.
        assert!(rate.take(t0 + Duration::from_secs(59), false).is_empty());
        let due = rate.take(t0 + Duration::from_secs(60), false);
        assert_eq!(counts(&due), [(1000, 7, 3)]);
        assert_eq!(rate.next_due(), None);
        // A new period records again.
        assert_eq!(rate.note(1000, t0 + Duration::from_secs(61), wall), Admit::Record);
    }

    #[test]
    fn at_shutdown_every_count_is_summarized_and_a_late_refusal_closes_the_last_period() {
        let rate = RefusalRate::new(1, Duration::from_secs(60));
        let (t0, wall) = (Instant::now(), SystemTime::now());
        for uid in [1, 1, 1, 2, 2, 3] {
            rate.note(uid, t0, wall);
        }
        // uid 1's period ends unseen by the writer; its next refusal starts another.
        assert_eq!(rate.note(1, t0 + Duration::from_secs(90), wall), Admit::Record);
        assert!(rate.next_due().is_some_and(|d| d <= Instant::now()));
        let all = rate.take(t0 + Duration::from_secs(1), true);
        // uid 3 had nothing counted: no record of it.
        assert_eq!(counts(&all), [(1, 2, 1), (2, 1, 1)]);
        assert!(rate.take(t0, true).is_empty());
        // A write that failed gives them back.
        rate.restore(all);
        assert_eq!(rate.take(t0, false).len(), 2);
    }
}
