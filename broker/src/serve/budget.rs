//! The bytes of requests a broker holds for its clients: frames on their
//! way in, and the `stdin` of runs not finished. Beyond the first
//! [`UNBUDGETED_BYTES`] of each connection, they are drawn from two
//! budgets, every client's together (`[broker] request_buffer_bytes`) and
//! each uid's (`request_buffer_bytes_per_uid`): a connection that would
//! go over either is refused instead of buffering more, so the broker's
//! memory for requests stays below the budget plus that allowance for
//! each connection, however many clients send large frames and stall.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What each connection holds without drawing on the budgets: the hello
/// and every usual request (its arguments and environment) fit, so a
/// client that sends no large `stdin` is never refused for the budget,
/// whatever others hold. `max_connections` of these (64 MiB at the
/// default 1,024) is the rest of the bound.
pub const UNBUDGETED_BYTES: usize = 64 << 10;

/// The budgets, and what is drawn from them, in all and by uid.
pub struct RequestBudget {
    /// The budgets' sizes; a reload may change them (what is held stays held).
    all: AtomicUsize,
    per_uid: AtomicUsize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: usize,
    by_uid: HashMap<u32, usize>,
}

/// A budget that would be exceeded: which, and its size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error(
        "the broker holds all {0} bytes of requests it takes for its clients together \
         (request_buffer_bytes)"
    )]
    All(usize),
    #[error("uid {uid}'s requests hold all {max} bytes it may (request_buffer_bytes_per_uid)")]
    PerUid { uid: u32, max: usize },
}

impl RequestBudget {
    pub fn new(all: usize, per_uid: usize) -> Arc<RequestBudget> {
        Arc::new(RequestBudget {
            all: AtomicUsize::new(all),
            per_uid: AtomicUsize::new(per_uid),
            held: Mutex::default(),
        })
    }

    /// New sizes for the budgets: draws from now on are checked against them.
    pub fn set_limits(&self, all: usize, per_uid: usize) {
        self.all.store(all, Ordering::Relaxed);
        self.per_uid.store(per_uid, Ordering::Relaxed);
    }

    /// An empty draw for a connection of `uid`.
    pub fn draw(self: &Arc<Self>, uid: u32) -> Draw {
        Draw { budget: self.clone(), uid, bytes: 0 }
    }

    /// Bytes drawn in all.
    pub fn total(&self) -> usize {
        self.lock().total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What one connection has drawn from the budgets; given back when dropped.
pub struct Draw {
    budget: Arc<RequestBudget>,
    uid: u32,
    bytes: usize,
}

impl Draw {
    /// Holds `bytes` from now on: more is drawn if both budgets have it
    /// (else nothing changes), less is given back.
    pub fn set(&mut self, bytes: usize) -> Result<(), BudgetError> {
        let b = &self.budget;
        let mut held = b.lock();
        let of_uid = held.by_uid.get(&self.uid).copied().unwrap_or(0);
        if bytes > self.bytes {
            let more = bytes - self.bytes;
            let (all, per_uid) = (b.all.load(Ordering::Relaxed), b.per_uid.load(Ordering::Relaxed));
            if held.total + more > all {
                return Err(BudgetError::All(all));
            }
            if of_uid + more > per_uid {
                return Err(BudgetError::PerUid { uid: self.uid, max: per_uid });
            }
        }
        held.total = held.total - self.bytes + bytes;
        match of_uid - self.bytes + bytes {
            0 => held.by_uid.remove(&self.uid),
            n => held.by_uid.insert(self.uid, n),
        };
        self.bytes = bytes;
        Ok(())
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Draw {
    fn drop(&mut self) {
        let _ = self.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_within_both_budgets_and_are_given_back() {
        let budget = RequestBudget::new(100, 60);
        let (mut a, mut b, mut c) = (budget.draw(1), budget.draw(1), budget.draw(2));
        a.set(50).unwrap();
        // uid 1 has 10 left of its 60.
        assert_eq!(b.set(20), Err(BudgetError::PerUid { uid: 1, max: 60 }));
        assert_eq!(b.bytes(), 0, "a refused draw changes nothing");
        b.set(10).unwrap();
        // 40 left in all: uid 2's own 60 is not all there.
        assert_eq!(c.set(41), Err(BudgetError::All(100)));
        c.set(40).unwrap();
        assert_eq!(budget.total(), 100);
        // Less is given back, and a dropped draw gives back all it held.
        a.set(5).unwrap();
        b.set(15).unwrap();
        drop(c);
        assert_eq!(budget.total(), 20);
        let mut d = budget.draw(2);
        d.set(60).unwrap();
        drop((a, b, d));
        assert_eq!(budget.total(), 0);
        assert!(budget.lock().by_uid.is_empty());
        // New sizes apply to the next draw.
        let mut e = budget.draw(3);
        budget.set_limits(10, 10);
        assert_eq!(e.set(11), Err(BudgetError::All(10)));
        e.set(10).unwrap();
        let messages =
            [BudgetError::All(100).to_string(), BudgetError::PerUid { uid: 1, max: 60 }.to_string()];
        assert!(messages[0].contains("all 100 bytes") && messages[0].contains("request_buffer_bytes"));
        assert!(messages[1].contains("uid 1") && messages[1].contains("request_buffer_bytes_per_uid"));
    }
}
