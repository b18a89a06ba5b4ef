//! The run slots and their queue, shared fairly between requesters.
//!
//! `max_concurrent` runs at once, `max_queued` waiting; and, per requester
//! (uid), at most `max_concurrent_per_uid` running, `max_queued_per_uid`
//! waiting and `max_memory_mb_per_uid` of cgroup-enforced memory in its
//! runs together. A freed slot goes to the waiting requester with the
//! fewest runs in progress (the earliest of them on a tie), not to the
//! longest queue: one requester's flood waits behind everybody else's next
//! run instead of in front of it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use palisade_policy::config::BrokerConfig;
use tokio::sync::oneshot;

/// The limits as configured (or their defaults; see [`Limits::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub total: usize,
    pub queued: usize,
    pub per_uid: usize,
    pub queued_per_uid: usize,
    /// MiB; 0: no share.
    pub memory_mb_per_uid: u64,
}

impl Limits {
    /// The limits of `[broker]`. A requester's share defaults to three
    /// quarters of the whole (rounded down, at least 1) on a broker that
    /// serves other users (a system broker, with `allowed_uids` or
    /// `allowed_gids`: one user never takes every slot), and to the whole
    /// on one that serves its own user (and root) only.
    pub fn of(b: &BrokerConfig, serves_others: bool) -> Limits {
        let serves_others = serves_others && !(b.allowed_uids.is_empty() && b.allowed_gids.is_empty());
        let total = b.max_concurrent.max(1);
        let share = |n: usize| if serves_others { (n * 3 / 4).max(1) } else { n };
        Limits {
            total,
            queued: b.max_queued,
            per_uid: b.max_concurrent_per_uid.unwrap_or_else(|| share(total)).clamp(1, total),
            queued_per_uid: b.max_queued_per_uid.unwrap_or_else(|| share(b.max_queued)).min(b.max_queued),
            memory_mb_per_uid: b.max_memory_mb_per_uid,
        }
    }
}

/// Why a run got no slot: its error's kind (`Busy` or `Unavailable`), rule
/// and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub busy: bool,
    pub rule: &'static str,
    pub why: String,
}

/// What one requester holds and waits for.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub running: usize,
    pub queued: usize,
    /// MiB of the runs in progress (those a cgroup bounds).
    pub memory_mb: u64,
}

struct Waiter {
    seq: u64,
    uid: u32,
    memory_mb: u64,
    tx: oneshot::Sender<Result<(), Refused>>,
}

#[derive(Default)]
struct State {
    limits: Option<Limits>,
    running: usize,
    per_uid: HashMap<u32, Share>,
    waiting: VecDeque<Waiter>,
    /// Waiters given a slot whose ticket has not yet taken it.
    granted: HashSet<u64>,
    seq: u64,
    closed: bool,
}

/// The slots and the queue.
pub struct Slots {
    state: Mutex<State>,
}

/// A slot held: freed (and given to the next waiter) when dropped.
pub struct Slot {
    slots: Arc<Slots>,
    uid: u32,
    memory_mb: u64,
}

/// A place in the queue: [`Ticket::wait`] for the slot; dropped, the place
/// is given up (or the slot it was just given, freed).
pub struct Ticket {
    slots: Arc<Slots>,
    seq: u64,
    uid: u32,
    memory_mb: u64,
    rx: Option<oneshot::Receiver<Result<(), Refused>>>,
    claimed: bool,
}

/// A slot at once, or a place in the queue.
pub enum Taken {
    Now(Slot),
    Queued(Ticket),
}

impl Slots {
    pub fn new(limits: Limits) -> Arc<Slots> {
        let state = State { limits: Some(limits), ..State::default() };
        Arc::new(Slots { state: Mutex::new(state) })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a run of `uid` whose memory a cgroup bounds at
    /// `memory_mb` MiB (`None`: nothing bounds it).
    pub fn take(self: &Arc<Self>, uid: u32, memory_mb: Option<u64>) -> Result<Taken, Refused> {
        let mut state = self.state();
        let limits = state.limits();
        if state.closed {
            return Err(Refused {
                busy: true,
                rule: "queue.closed",
                why: "the broker is shutting down".into(),
            });
        }
        let memory_mb = fits_at_all(&limits, memory_mb)?;
        state.seq += 1;
        let seq = state.seq;
        let (tx, mut rx) = oneshot::channel();
        state.waiting.push_back(Waiter { seq, uid, memory_mb, tx });
        state.per_uid.entry(uid).or_default().queued += 1;
        state.dispatch();
        if state.granted.remove(&seq) {
            let _ = rx.try_recv();
            return Ok(Taken::Now(Slot { slots: self.clone(), uid, memory_mb }));
        }
        // Not at once: a place in the queue, if there is room.
        let queued = state.waiting.len() - 1;
        let mine = state.per_uid.get(&uid).map_or(0, |s| s.queued) - 1;
        // A full queue makes room for a requester with nothing waiting: the
        // newest waiter of the one with the most waiting gives its place up.
        let full = if queued >= limits.queued && !(mine == 0 && state.make_room(uid)) {
            Some((
                "queue.full",
                format!(
                    "all {} run slots are in use and {queued} requests are already waiting; try again later",
                    limits.total
                ),
            ))
        } else if mine >= limits.queued_per_uid {
            Some((
                "queue.per_uid",
                format!(
                    "you have {} runs in progress and {mine} waiting, the most one requester may have waiting \
                 (max_queued_per_uid = {}); try again when one has ended",
                    state.per_uid.get(&uid).map_or(0, |s| s.running),
                    limits.queued_per_uid
                ),
            ))
        } else {
            None
        };
        if let Some((rule, why)) = full {
            state.leave(seq);
            return Err(Refused { busy: true, rule, why });
        }
        drop(state);
        Ok(Taken::Queued(Ticket { slots: self.clone(), seq, uid, memory_mb, rx: Some(rx), claimed: false }))
    }

    /// Applies a reload's limits: more slots are given out at once; fewer
    /// are taken back as the runs holding them end. A waiter that can no
    /// longer fit is refused.
    pub fn set_limits(&self, limits: Limits) {
        let mut state = self.state();
        state.limits = Some(limits);
        let (keep, refuse): (VecDeque<Waiter>, VecDeque<Waiter>) =
            state.waiting.drain(..).partition(|w| fits_at_all(&limits, Some(w.memory_mb)).is_ok());
        state.waiting = keep;
        for w in refuse {
            if let Some(s) = state.per_uid.get_mut(&w.uid) {
                s.queued -= 1;
            }
            let _ = w.tx.send(fits_at_all(&limits, Some(w.memory_mb)).map(|_| ()));
        }
        state.forget_idle();
        state.dispatch();
    }

    /// No more slots: every waiter is told the broker is shutting down.
    pub fn close(&self) {
        let mut state = self.state();
        state.closed = true;
        for w in std::mem::take(&mut state.waiting) {
            if let Some(s) = state.per_uid.get_mut(&w.uid) {
                s.queued -= 1;
            }
            let why = "the broker is shutting down".into();
            let _ = w.tx.send(Err(Refused { busy: true, rule: "queue.closed", why }));
        }
        state.forget_idle();
    }

    /// Runs in progress and waiting, all requesters together.
    pub fn counts(&self) -> (usize, usize) {
        let state = self.state();
        (state.running, state.waiting.len())
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.state().limits()
    }

    /// What each requester holds and waits for (those with anything).
    pub fn shares(&self) -> Vec<(u32, Share)> {
        let mut all: Vec<_> = self.state().per_uid.iter().map(|(u, s)| (*u, *s)).collect();
        all.sort_by_key(|(u, _)| *u);
        all
    }
}

/// The memory a run counts against its requester's share: refused when
/// there is a share and nothing bounds the run's memory, or when the run
/// alone needs more than the share.
fn fits_at_all(limits: &Limits, memory_mb: Option<u64>) -> Result<u64, Refused> {
    let share = limits.memory_mb_per_uid;
    match memory_mb {
        _ if share == 0 => Ok(memory_mb.unwrap_or(0)),
        None => Err(Refused {
            busy: false,
            rule: "memory.per_uid",
            why: format!(
                "this broker shares memory between requesters (max_memory_mb_per_uid = {share}) and no \
                 cgroup bounds this run's memory on this host"
            ),
        }),
        Some(m) if m > share => Err(Refused {
            busy: false,
            rule: "memory.per_uid",
            why: format!(
                "the run's memory limit ({m} MiB) is more than one requester's share \
                 (max_memory_mb_per_uid = {share}): ask for less"
            ),
        }),
        Some(m) => Ok(m),
    }
}

impl State {
    fn limits(&self) -> Limits {
        self.limits.unwrap_or(Limits {
            total: 1,
            queued: 0,
            per_uid: 1,
            queued_per_uid: 0,
            memory_mb_per_uid: 0,
        })
    }

    /// Gives the free slots to the waiters that may take one: each to the
    /// requester with the fewest runs in progress, its earliest waiter.
    fn dispatch(&mut self) {
        let limits = self.limits();
        while self.running < limits.total {
            let Some(w) = self.next().and_then(|i| self.waiting.remove(i)) else { break };
            let share = self.per_uid.entry(w.uid).or_default();
            share.queued -= 1;
            share.running += 1;
            share.memory_mb += w.memory_mb;
            self.running += 1;
            self.granted.insert(w.seq);
            let _ = w.tx.send(Ok(()));
        }
    }

    /// The waiter a free slot goes to: of the requesters under their share
    /// of runs, the one with the fewest runs in progress, its earliest
    /// waiter; a requester whose earliest waiter does not fit its memory
    /// share waits for it (its smaller runs never pass it for ever).
    fn next(&self) -> Option<usize> {
        let limits = self.limits();
        let mut held_back = HashSet::new();
        let mut best: Option<(usize, (usize, u64))> = None;
        for (i, w) in self.waiting.iter().enumerate() {
            let s = self.per_uid.get(&w.uid).copied().unwrap_or_default();
            if held_back.contains(&w.uid) || s.running >= limits.per_uid {
                continue;
            }
            let share = limits.memory_mb_per_uid;
            if share != 0 && s.memory_mb + w.memory_mb > share {
                held_back.insert(w.uid);
                continue;
            }
            let key = (s.running, w.seq);
            if best.is_none_or(|(_, k)| key < k) {
                best = Some((i, key));
            }
        }
        best.map(|(i, _)| i)
    }

    /// Refuses the newest waiter of the requester (not `uid`) with the most
    /// waiting, two or more; whether there was one.
    fn make_room(&mut self, uid: u32) -> bool {
        let most = (self.per_uid.iter())
            .filter(|(u, s)| **u != uid && s.queued >= 2)
            .max_by_key(|(u, s)| (s.queued, std::cmp::Reverse(**u)))
            .map(|(u, _)| *u);
        let Some(victim) = most else { return false };
        let Some(i) = self.waiting.iter().rposition(|w| w.uid == victim) else { return false };
        let Some(w) = self.waiting.remove(i) else { return false };
        if let Some(s) = self.per_uid.get_mut(&victim) {
            s.queued -= 1;
        }
        let why = "the queue was full and another requester had nothing waiting: your newest waiting run \
                   gave its place up to it; try again later"
            .into();
        let _ = w.tx.send(Err(Refused { busy: true, rule: "queue.full", why }));
        true
    }

    /// Frees a slot of `uid` holding `memory_mb`.
    fn release(&mut self, uid: u32, memory_mb: u64) {
        self.running -= 1;
        if let Some(s) = self.per_uid.get_mut(&uid) {
            s.running -= 1;
            s.memory_mb -= memory_mb;
        }
        self.forget_idle();
        self.dispatch();
    }

    /// Gives up waiter `seq`'s place, or the slot it was given.
    fn leave(&mut self, seq: u64) {
        if let Some(i) = self.waiting.iter().position(|w| w.seq == seq) {
            if let Some(w) = self.waiting.remove(i)
                && let Some(s) = self.per_uid.get_mut(&w.uid)
            {
                s.queued -= 1;
            }
            self.forget_idle();
        }
    }

    fn forget_idle(&mut self) {
        self.per_uid.retain(|_, s| *s != Share::default());
    }
}

impl Ticket {
    /// Waits for the slot; a refusal when the broker shuts down or a reload
    /// leaves the run no room.
    pub async fn wait(mut self) -> Result<Slot, Refused> {
        let rx = self.rx.take().expect("a queued ticket has its receiver");
        match rx.await {
            Ok(Ok(())) => {
                let granted = self.slots.state().granted.remove(&self.seq);
                debug_assert!(granted);
                Ok(self.into_slot())
            }
            Ok(Err(refused)) => {
                self.claimed = true;
                Err(refused)
            }
            Err(_) => {
                self.claimed = true;
                Err(Refused { busy: true, rule: "queue.closed", why: "the broker is shutting down".into() })
            }
        }
    }

    fn into_slot(mut self) -> Slot {
        self.claimed = true;
        Slot { slots: self.slots.clone(), uid: self.uid, memory_mb: self.memory_mb }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.claimed {
            return;
        }
        let mut state = self.slots.state();
        if state.granted.remove(&self.seq) {
            // Given a slot it did not take: the next waiter's.
            state.release(self.uid, self.memory_mb);
        } else {
            state.leave(self.seq);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.state().release(self.uid, self.memory_mb);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, queued: usize, per_uid: usize, queued_per_uid: usize, memory: u64) -> Limits {
        Limits { total, queued, per_uid, queued_per_uid, memory_mb_per_uid: memory }
    }

    fn now(t: Result<Taken, Refused>) -> Slot {
        match t {
            Ok(Taken::Now(s)) => s,
            Ok(Taken::Queued(_)) => panic!("queued"),
            Err(e) => panic!("{e:?}"),
        }
    }

    fn queued(t: Result<Taken, Refused>) -> Ticket {
        match t {
            Ok(Taken::Queued(t)) => t,
            Ok(Taken::Now(_)) => panic!("a slot at once"),
            Err(e) => panic!("{e:?}"),
        }
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_requester_with_fewest_runs() {
        let slots = Slots::new(limits(2, 10, 2, 10, 0));
        let a1 = now(slots.take(1, None));
        let _a2 = now(slots.take(1, None));
        // uid 1 floods the queue first; uid 2 arrives after.
        let a3 = queued(slots.take(1, None));
        let a4 = queued(slots.take(1, None));
        let b1 = queued(slots.take(2, None));
        assert_eq!(slots.counts(), (2, 3));
        drop(a1);
        // uid 2 (no run) before uid 1's earlier waiters (one run).
        let b1 = b1.wait().await.unwrap();
        assert_eq!(
            slots.shares(),
            vec![
                (1, Share { running: 1, queued: 2, memory_mb: 0 }),
                (2, Share { running: 1, queued: 0, memory_mb: 0 })
            ]
        );
        drop(b1);
        let a3 = a3.wait().await.unwrap();
        drop(a4);
        drop(a3);
        assert_eq!(slots.counts(), (1, 0));
    }

    #[tokio::test]
    async fn one_requester_takes_at_most_its_share_and_queues_at_most_its_own() {
        let slots = Slots::new(limits(4, 10, 3, 2, 0));
        let held: Vec<_> = (0..3).map(|_| now(slots.take(1, None))).collect();
        // A free slot, but uid 1 has its three: it waits.
        let w1 = queued(slots.take(1, None));
        let _w2 = queued(slots.take(1, None));
        let e = slots.take(1, None).err().unwrap();
        assert_eq!((e.busy, e.rule), (true, "queue.per_uid"));
        // Another requester still gets the free slot at once.
        let b = now(slots.take(2, None));
        drop(b);
        drop(held);
        let _a = w1.wait().await.unwrap();
    }

    #[test]
    fn the_whole_queue_is_bounded() {
        let slots = Slots::new(limits(1, 1, 1, 1, 0));
        let _a = now(slots.take(1, None));
        let _w = queued(slots.take(2, None));
        let e = slots.take(3, None).err().unwrap();
        assert_eq!((e.busy, e.rule), (true, "queue.full"));
    }

    #[tokio::test]
    async fn a_full_queue_makes_room_for_a_requester_with_nothing_waiting() {
        let slots = Slots::new(limits(1, 3, 1, 3, 0));
        let _a = now(slots.take(1, None));
        let first = queued(slots.take(1, None));
        let _second = queued(slots.take(1, None));
        let newest = queued(slots.take(1, None));
        // uid 2 has nothing waiting: uid 1's newest waiter gives its place up.
        let b = queued(slots.take(2, None));
        let e = newest.wait().await.err().unwrap();
        assert_eq!(e.rule, "queue.full");
        assert_eq!(slots.counts(), (1, 3));
        // uid 2 with one waiting is refused as before; uid 1's older waiters keep theirs.
        assert_eq!(slots.take(2, None).err().unwrap().rule, "queue.full");
        drop((first, b));
        assert_eq!(slots.counts(), (1, 1));
    }

    #[tokio::test]
    async fn memory_is_shared_where_a_cgroup_bounds_it() {
        let slots = Slots::new(limits(8, 8, 8, 8, 1024));
        let e = slots.take(1, None).err().unwrap();
        assert_eq!((e.busy, e.rule), (false, "memory.per_uid"));
        let e = slots.take(1, Some(2048)).err().unwrap();
        assert!(e.why.contains("2048 MiB"), "{}", e.why);
        let a = now(slots.take(1, Some(768)));
        // 768 + 512 > 1024: waits, while another requester's run starts.
        let w = queued(slots.take(1, Some(512)));
        let _b = now(slots.take(2, Some(1024)));
        drop(a);
        let _w = w.wait().await.unwrap();
        assert_eq!(slots.shares()[0].1.memory_mb, 512);
    }

    #[tokio::test]
    async fn a_run_waiting_for_memory_is_not_passed_by_its_requesters_smaller_ones() {
        let slots = Slots::new(limits(8, 8, 8, 8, 1024));
        let a = now(slots.take(1, Some(768)));
        let big = queued(slots.take(1, Some(512)));
        // It would fit now, but the larger run before it waits first.
        let small = queued(slots.take(1, Some(100)));
        assert_eq!(slots.counts(), (1, 2));
        drop(a);
        let big = big.wait().await.unwrap();
        let small = small.wait().await.unwrap();
        assert_eq!(slots.shares()[0].1.memory_mb, 612);
        drop((big, small));
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_frees_its_place_and_a_slot_given_to_it() {
        let slots = Slots::new(limits(1, 4, 1, 4, 0));
        let a = now(slots.take(1, None));
        let w = queued(slots.take(2, None));
        drop(w);
        assert_eq!(slots.counts(), (1, 0));
        let w = queued(slots.take(2, None));
        let x = queued(slots.take(3, None));
        drop(a); // given to uid 2's waiter, which leaves before taking it
        drop(w);
        let _x = x.wait().await.unwrap();
        assert_eq!(slots.counts(), (1, 0));
    }

    #[tokio::test]
    async fn closing_and_reloading_refuse_the_waiters() {
        let slots = Slots::new(limits(1, 4, 1, 4, 1024));
        let _a = now(slots.take(1, Some(100)));
        let w = queued(slots.take(2, Some(900)));
        slots.set_limits(limits(1, 4, 1, 4, 512));
        assert_eq!(w.wait().await.err().unwrap().rule, "memory.per_uid");
        let w = queued(slots.take(2, Some(100)));
        slots.close();
        assert_eq!(w.wait().await.err().unwrap().rule, "queue.closed");
        assert_eq!(slots.take(3, Some(1)).err().unwrap().rule, "queue.closed");
    }

    #[test]
    fn a_system_broker_shares_by_default_and_a_users_own_does_not() {
        let alone = BrokerConfig { max_concurrent: 4, max_queued: 8, ..BrokerConfig::default() };
        assert_eq!(Limits::of(&alone, true), limits(4, 8, 4, 8, 0), "root's broker serving root only");
        let b: BrokerConfig =
            toml::from_str("max_concurrent = 4\nmax_queued = 8\nallowed_gids = [\"devs\"]").unwrap();
        assert_eq!(Limits::of(&b, true), limits(4, 8, 3, 6, 0));
        assert_eq!(Limits::of(&b, false), limits(4, 8, 4, 8, 0));
        let b = BrokerConfig { max_concurrent: 2, max_queued: 8, ..b };
        assert_eq!(Limits::of(&b, true).per_uid, 1, "one of two slots");
        let b = BrokerConfig { max_concurrent: 1, max_concurrent_per_uid: Some(9), ..b };
        assert_eq!(Limits::of(&b, true).per_uid, 1);
    }
}
