//! The transparent pool: which loopback address stands for which name.
//! Exact allowed names have theirs from the plan; a name that matches a
//! `*.suffix` pattern takes the next spare address at its first lookup and
//! keeps it for the run.

use palisade_policy::PoolEntry;
use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::Mutex;

#[derive(Default)]
pub struct Pool {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    by_name: HashMap<String, Ipv4Addr>,
    by_address: HashMap<Ipv4Addr, String>,
    spares: VecDeque<Ipv4Addr>,
}

impl Pool {
    pub fn new(entries: &[PoolEntry]) -> Pool {
        let mut state = State::default();
        for entry in entries {
            match &entry.name {
                Some(name) => {
                    // In the form the resolver and the allowlist compare.
                    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
                    state.by_name.insert(name.clone(), entry.address);
                    state.by_address.insert(entry.address, name);
                }
                None => state.spares.push_back(entry.address),
            }
        }
        Pool { state: Mutex::new(state) }
    }

    /// The address of `name` (allowed, normalized), a spare given to it if
    /// it has none yet; `None` when no spare is left.
    pub fn address_for(&self, name: &str) -> Option<Ipv4Addr> {
        let mut state = self.lock();
        if let Some(address) = state.by_name.get(name) {
            return Some(*address);
        }
        let address = state.spares.pop_front()?;
        tracing::debug!(name, %address, "transparent pool: spare address assigned");
        state.by_name.insert(name.to_owned(), address);
        state.by_address.insert(address, name.to_owned());
        Some(address)
    }

    /// The name `address` stands for, if it was given one.
    pub fn name_of(&self, address: Ipv4Addr) -> Option<String> {
        self.lock().by_address.get(&address).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
