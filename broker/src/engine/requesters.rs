//! A system broker's warm pools: one per requester. Its sandboxes run as
//! host ids chosen per requester (`broker.sandbox_ids`), which a sandbox
//! takes before its namespaces, so a sandbox built ahead serves only the
//! requester it was built for. The requesters who asked most recently keep
//! a pool each (at most [`MOST`], the least recently used dropped for a new
//! one); a requester's pool is dropped once it has served nothing for
//! [`IDLE`]. A requester's first run, and the first after its pool was
//! dropped, is cold, and starts its pool. Every rule of [`Pool`] holds in
//! each.

use crate::engine::cgroup::Cgroups;
use crate::engine::pool::{Pool, Slot};
use crate::engine::spawn_thread::Spawner;
use palisade_protocol::{HostIds, JailPlan, WarmSpec};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Requesters with a pool at once, at most.
pub const MOST: usize = 8;
/// A requester's pool is dropped after this long without a run.
pub const IDLE: Duration = Duration::from_secs(600);
/// How often idle pools are looked for.
const SWEEP: Duration = Duration::from_secs(30);

pub struct Requesters {
    /// Every pool's spec but its host ids and requester (the plan's).
    base: WarmSpec,
    pools: Mutex<Vec<Kept>>,
    /// Shut down, or no user namespaces: no pool is made any more.
    stopped: AtomicBool,
    spawner: Spawner,
    helper: PathBuf,
    size: usize,
    cgroups: Cgroups,
}

struct Kept {
    requester: HostIds,
    ids: HostIds,
    pool: Arc<Pool>,
    used: Instant,
}

impl Requesters {
    pub fn new(
        spawner: Spawner,
        helper: PathBuf,
        size: usize,
        base: WarmSpec,
        cgroups: Cgroups,
    ) -> Requesters {
        let stopped = AtomicBool::new(size == 0);
        Requesters { base, pools: Mutex::new(Vec::new()), stopped, spawner, helper, size, cgroups }
    }

    /// A slot of the pool of `plan`'s requester, if one is ready; that
    /// pool is made (and starts filling) when the requester has none.
    pub async fn claim(&self, plan: &JailPlan, in_cgroup: bool) -> Option<Slot> {
        let (ids, requester) = (plan.host_ids?, plan.acting_for?);
        // A plan no slot of the requester's could run (a session's, the
        // host's network) neither makes a pool nor keeps one in use.
        let built = WarmSpec { host_ids: Some(ids), acting_for: Some(requester), ..self.base };
        if built.admits(plan).is_err() {
            return None;
        }
        let pool = self.pool_of(ids, requester)?;
        pool.claim(plan, in_cgroup).await
    }

    /// Refills the pool of `plan`'s requester, if it has one.
    pub fn refill(&self, plan: &JailPlan) {
        let mine = |k: &&Kept| Some(k.requester) == plan.acting_for && Some(k.ids) == plan.host_ids;
        let pool = self.pools.lock().ok().and_then(|p| p.iter().find(mine).map(|k| k.pool.clone()));
        if let Some(pool) = pool {
            pool.refill();
        }
    }

    /// The pool of `requester`, whose sandboxes run as `ids`: kept, or made.
    fn pool_of(&self, ids: HostIds, requester: HostIds) -> Option<Arc<Pool>> {
        if self.stopped.load(Ordering::Acquire) {
            return None;
        }
        let mut pools = self.pools.lock().ok()?;
        if let Some(kept) = pools.iter_mut().find(|k| k.requester == requester && k.ids == ids) {
            kept.used = Instant::now();
            return Some(kept.pool.clone());
        }
        if pools.len() >= MOST {
            let oldest = (0..pools.len()).min_by_key(|i| pools[*i].used)?;
            discard(vec![pools.swap_remove(oldest).pool]);
        }
        // Host ids changed by a reload: the requester's old pool goes.
        if let Some(i) = pools.iter().position(|k| k.requester == requester) {
            discard(vec![pools.swap_remove(i).pool]);
        }
        let spec = WarmSpec { host_ids: Some(ids), acting_for: Some(requester), ..self.base };
        let pool =
            Pool::new(self.spawner.clone(), self.helper.clone(), self.size, Some(spec), self.cgroups.clone());
        pools.push(Kept { requester, ids, pool: pool.clone(), used: Instant::now() });
        Some(pool)
    }

    /// Slots idle now, in every pool.
    pub fn idle(&self) -> usize {
        self.pools.lock().map_or(0, |p| p.iter().map(|k| k.pool.idle()).sum())
    }

    /// Whether pools are made (not shut down, user namespaces here).
    pub fn warm(&self) -> bool {
        !self.stopped.load(Ordering::Acquire)
    }

    /// Requesters with a pool now.
    pub fn requesters(&self) -> usize {
        self.pools.lock().map_or(0, |p| p.len())
    }

    /// No pool is made from now on (no user namespaces here).
    pub fn stop_warming(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    /// Drops, every [`SWEEP`], the pools idle for [`IDLE`]; call inside the
    /// runtime. Ends when `self` is gone.
    pub fn sweep_idle(self: &Arc<Requesters>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SWEEP).await;
                let Some(requesters) = weak.upgrade() else { return };
                discard(requesters.take_idle(IDLE));
            }
        });
    }

    /// Takes out the pools without a run for `idle`.
    fn take_idle(&self, idle: Duration) -> Vec<Arc<Pool>> {
        let taken = self.pools.lock().map(|mut pools| {
            let (gone, kept): (Vec<Kept>, _) =
                std::mem::take(&mut *pools).into_iter().partition(|k| k.used.elapsed() >= idle);
            *pools = kept;
            gone.into_iter().map(|k| k.pool).collect()
        });
        taken.unwrap_or_default()
    }

    /// At shutdown (blocking): makes no more pools and closes every one.
    pub fn close(&self) {
        self.stopped.store(true, Ordering::Release);
        let pools = self.pools.lock().map(|mut p| std::mem::take(&mut *p)).unwrap_or_default();
        pools.into_iter().for_each(|k| k.pool.close());
    }
}

/// Closes pools dropped from the list, off the runtime's threads (a close
/// waits for a refill under way).
fn discard(pools: Vec<Arc<Pool>>) {
    if pools.is_empty() {
        return;
    }
    let close = move || pools.iter().for_each(|p| p.close());
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(close)),
        Err(_) => close(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requesters(size: usize) -> Requesters {
        let base = WarmSpec {
            uid: 0,
            gid: 0,
            namespaces: palisade_protocol::Namespaces::ALL,
            parent_pid: std::process::id(),
            cgroup: false,
            host_ids: None,
            acting_for: None,
        };
        let spawner = Spawner::start().unwrap();
        Requesters::new(spawner, "/nonexistent/helper".into(), size, base, Cgroups::none("a test"))
    }

    fn ids(uid: u32) -> (HostIds, HostIds) {
        (HostIds { uid: 0x7000_0000 + uid, gid: 0x7000_0000 + uid }, HostIds { uid, gid: uid })
    }

    #[test]
    fn each_requester_has_its_own_pool_built_as_its_own_ids() {
        let r = requesters(1);
        let (a_ids, a) = ids(1000);
        let (b_ids, b) = ids(1001);
        let pool_a = r.pool_of(a_ids, a).unwrap();
        assert!(Arc::ptr_eq(&pool_a, &r.pool_of(a_ids, a).unwrap()), "the same requester, the same pool");
        let pool_b = r.pool_of(b_ids, b).unwrap();
        assert!(!Arc::ptr_eq(&pool_a, &pool_b));
        assert_eq!(r.requesters(), 2);
        // Other host ids for the same requester (a reload): a new pool, the old one gone.
        let moved = HostIds { uid: 0x6000_0000, gid: 0x6000_0000 };
        assert!(!Arc::ptr_eq(&pool_a, &r.pool_of(moved, a).unwrap()));
        assert_eq!(r.requesters(), 2);
    }

    #[test]
    fn the_least_recently_used_requesters_pool_goes_first() {
        let r = requesters(1);
        let first = (0..MOST as u32)
            .map(|n| r.pool_of(ids(2000 + n).0, ids(2000 + n).1).unwrap())
            .collect::<Vec<_>>();
        // 2000 is used again: 2001 is now the least recently used.
        std::thread::sleep(Duration::from_millis(2));
        r.pool_of(ids(2000).0, ids(2000).1).unwrap();
        r.pool_of(ids(3000).0, ids(3000).1).unwrap();
        assert_eq!(r.requesters(), MOST);
        assert!(Arc::ptr_eq(&first[0], &r.pool_of(ids(2000).0, ids(2000).1).unwrap()));
        assert!(!Arc::ptr_eq(&first[1], &r.pool_of(ids(2001).0, ids(2001).1).unwrap()), "2001's was dropped");
    }

    #[test]
    fn idle_pools_are_dropped_and_none_is_made_once_stopped() {
        let r = requesters(1);
        r.pool_of(ids(1000).0, ids(1000).1).unwrap();
        assert!(r.take_idle(Duration::from_secs(3600)).is_empty());
        assert_eq!(r.take_idle(Duration::ZERO).len(), 1);
        assert_eq!(r.requesters(), 0);
        r.close();
        assert!(r.pool_of(ids(1000).0, ids(1000).1).is_none());
        assert!(requesters(0).pool_of(ids(1000).0, ids(1000).1).is_none(), "prespawn = 0 pools nothing");
    }
}
