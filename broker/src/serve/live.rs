//! The runs the broker holds now, for `palisade status`: who asked, what,
//! since when and in which state. A run is in it from its decision to its
//! end ([`Tracked`] removes it when dropped).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use palisade_protocol::wire::{LiveRun, Operations};

/// What of a run's command is kept for `status`: its first words, each cut
/// to its first bytes (a status must fit in a frame whatever the runs ask).
const ARGV_WORDS: usize = 32;
const WORD_BYTES: usize = 256;
/// Runs listed at most in one status; the rest are counted as omitted.
pub const LISTED_MAX: usize = 256;

/// `argv` as kept: at most [`ARGV_WORDS`] words of at most [`WORD_BYTES`]
/// bytes (cut on a character's boundary), a cut marked with `…`.
fn kept(argv: &[String]) -> Vec<String> {
    let word = |w: &String| match w.len() <= WORD_BYTES {
        true => w.clone(),
        false => {
            let end = (0..=WORD_BYTES).rev().find(|i| w.is_char_boundary(*i)).unwrap_or(0);
            format!("{}…", &w[..end])
        }
    };
    let mut out: Vec<String> = argv.iter().take(ARGV_WORDS).map(word).collect();
    if argv.len() > ARGV_WORDS {
        out.push(format!("… ({} more words)", argv.len() - ARGV_WORDS));
    }
    out
}

struct Entry {
    uid: u32,
    argv: Vec<String>,
    session: Option<String>,
    state: &'static str,
    since: Instant,
}

/// The runs in the broker, by run id.
#[derive(Default)]
pub struct Live {
    runs: Mutex<BTreeMap<u64, Entry>>,
}

/// A run listed while it is held.
pub struct Tracked<'a> {
    live: &'a Live,
    run_id: u64,
}

impl Live {
    fn runs(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Entry>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lists run `run_id` of `uid` in `state` until the returned guard drops.
    pub fn track(
        &self,
        run_id: u64,
        uid: u32,
        argv: &[String],
        session: Option<&str>,
        state: &'static str,
    ) -> Tracked<'_> {
        let entry = Entry {
            uid,
            argv: kept(argv),
            session: session.map(str::to_string),
            state,
            since: Instant::now(),
        };
        self.runs().insert(run_id, entry);
        Tracked { live: self, run_id }
    }

    /// The runs `shown` lets the asker see (their `user` not yet named: see
    /// [`name_users`]), and how many others there are.
    pub fn list(&self, shown: impl Fn(u32) -> bool) -> (Vec<LiveRun>, u64) {
        let runs = self.runs();
        let mut omitted = 0;
        let mut listed = Vec::new();
        for (id, e) in runs.iter() {
            if !shown(e.uid) || listed.len() >= LISTED_MAX {
                omitted += 1;
                continue;
            }
            listed.push(LiveRun {
                run_id: *id,
                uid: e.uid,
                user: None,
                argv: e.argv.clone(),
                session: e.session.clone(),
                state: e.state.into(),
                age_secs: e.since.elapsed().as_secs(),
            });
        }
        (listed, omitted)
    }
}

/// Gives the runs and sessions of `operations` their requesters' names,
/// looked up on a blocking thread (the host's accounts may be a network
/// service's: a slow lookup holds up no other client).
pub async fn name_users(operations: &mut Operations) {
    let mut uids: Vec<u32> =
        operations.runs.iter().map(|r| r.uid).chain(operations.sessions.iter().map(|s| s.uid)).collect();
    uids.sort_unstable();
    uids.dedup();
    let lookup = move || {
        let name = |uid: u32| nix::unistd::User::from_uid(uid.into()).ok().flatten().map(|u| u.name);
        uids.into_iter().map(|uid| (uid, name(uid))).collect::<BTreeMap<u32, Option<String>>>()
    };
    let Ok(names) = tokio::task::spawn_blocking(lookup).await else { return };
    for run in &mut operations.runs {
        run.user = names.get(&run.uid).cloned().flatten();
    }
    for session in &mut operations.sessions {
        session.user = names.get(&session.uid).cloned().flatten();
    }
}

impl Tracked<'_> {
    /// The run is now `state` (`queued`, `running`).
    pub fn now(&self, state: &'static str) {
        if let Some(e) = self.live.runs().get_mut(&self.run_id) {
            e.state = state;
        }
    }
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        self.live.runs().remove(&self.run_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_listed_while_held_and_others_are_counted() {
        let live = Live::default();
        let argv = vec!["git".to_string(), "push".to_string()];
        let mine = live.track(1, 1000, &argv, None, "approval");
        let theirs = live.track(2, 1001, &argv, Some("s1"), "running");
        mine.now("queued");
        let (runs, omitted) = live.list(|uid| uid == 1000);
        assert_eq!(omitted, 1);
        assert_eq!((runs.len(), runs[0].state.as_str()), (1, "queued"));
        let (all, omitted) = live.list(|_| true);
        assert_eq!((all.len(), omitted, all[1].session.as_deref()), (2, 0, Some("s1")));
        drop(theirs);
        drop(mine);
        let long: Vec<String> = (0..40).map(|i| format!("{i}{}", "é".repeat(200))).collect();
        let long_run = live.track(3, 1, &long, None, "running");
        let (runs, _) = live.list(|_| true);
        let argv = &runs[0].argv;
        assert_eq!((argv.len(), argv[32].as_str()), (33, "… (8 more words)"));
        assert!(argv[0].len() <= 256 + "…".len() && argv[0].ends_with('…'), "{}", argv[0]);
        drop(long_run);
        assert!(live.list(|_| true).0.is_empty());
    }
}
