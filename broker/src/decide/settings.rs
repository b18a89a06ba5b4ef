//! What the configuration decides at each request, and its reload.
//!
//! A broker holds its [`Settings`] as one `Arc` behind a lock, which each
//! request takes once, when it is decided. A reload (palisaded's `SIGHUP`)
//! builds new settings from the file and swaps them in whole: a run decided
//! before keeps the ones it was decided with (its plan, its tool's trust
//! store, its approval's timeout), and every request after gets the new
//! ones. A file that does not load (a parse error, a bad value, a name of
//! nobody, Cedar policies that do not validate) changes nothing. The keys the
//! broker built its running parts from at start ([`keep_restart_only`]) keep
//! their running values, and the reload names them.

use crate::decide::approvals::Approvers;
use crate::decide::trust::TrustStore;
use palisade_policy::Config;
use palisade_policy::Policy;
use palisade_policy::host::OwnedPath;
use palisade_policy::host_executed::HostExecuted;
use palisade_policy::ids::ResolvedIds;
use std::sync::Arc;
use std::time::SystemTime;

/// What decides a request: the policy (with its configuration), who may
/// connect and who approves, the declared tools' trust stages, and the
/// files the host executes.
pub struct Settings {
    pub policy: Policy,
    /// The users and groups the configuration names, as numbers.
    pub ids: ResolvedIds,
    pub approvers: Approvers,
    /// The declared tools' trust stages; `None` where they are off (or no tool is declared).
    pub trust: Option<Arc<TrustStore>>,
    /// The files the host executes, which no copy-back applies by itself.
    pub host_executed: Arc<HostExecuted>,
    /// When the configuration was read.
    pub loaded: SystemTime,
}

impl Settings {
    /// The settings `config` gives a broker running as `uid`, its names
    /// resolved into `ids`. Opening the trust stages records, in `journal`,
    /// each declared tool put back to Draft because its declaration changed.
    pub fn new(
        config: Config,
        ids: ResolvedIds,
        uid: u32,
        journal: &crate::journal::Journal,
    ) -> Result<Settings, String> {
        let trust = TrustStore::open(&config, journal.clone())?.map(Arc::new);
        let approvers = Approvers::new(&config, &ids, uid);
        let extra: Vec<String> = config.policy.host_executed.iter().map(|g| g.get_ref().clone()).collect();
        let host_executed = Arc::new(HostExecuted::new(&extra));
        // Only the installed interpreters are looked up now: the rest of the
        // host is read at each decision, as the requester.
        let policy = Policy::new(config, &*crate::host::files::files());
        Ok(Settings { policy, ids, approvers, trust, host_executed, loaded: SystemTime::now() })
    }

    /// The configuration these settings come from.
    pub fn config(&self) -> &Config {
        &self.policy.config
    }

    /// The uids that may connect: `allowed_uids`, or, when none is listed,
    /// the broker's own (`broker_uid`) and, for a system broker that is not
    /// root (the unit's own user), root: the administrator it serves.
    pub fn allowed_uids(&self, broker_uid: u32) -> std::borrow::Cow<'_, [u32]> {
        match self.ids.allowed_uids.is_empty() {
            true if broker_uid != 0 && crate::host::privilege::serves_others() => {
                std::borrow::Cow::Owned(vec![broker_uid, 0])
            }
            true => std::borrow::Cow::Owned(vec![broker_uid]),
            false => std::borrow::Cow::Borrowed(&self.ids.allowed_uids),
        }
    }

    /// Whether a peer with these ids may connect by its uid or by any of
    /// its groups (primary or supplementary).
    pub fn allows(&self, broker_uid: u32, uid: u32, gid: u32, groups: &[u32]) -> bool {
        let gids = &self.ids.allowed_gids;
        self.allowed_uids(broker_uid).contains(&uid)
            || gids.contains(&gid)
            || groups.iter().any(|g| gids.contains(g))
    }
}

/// Gives `new` the running value of every key a reload cannot change (the
/// broker built its socket, helper, cgroups, sandbox ids, warm pool, `/etc`
/// snapshot, run directories, journal, trust state file, change sets and
/// skills from them at start); the keys whose values differed, to be
/// logged as needing a restart.
pub fn keep_restart_only(running: &Config, new: &mut Config) -> Vec<&'static str> {
    let mut kept = Vec::new();
    macro_rules! keep {
        ($($section:ident $(. $key:ident)?),+ $(,)?) => {$(
            if new.$section$(.$key)? != running.$section$(.$key)? {
                new.$section$(.$key)? = running.$section$(.$key)?.clone();
                kept.push(concat!(stringify!($section) $(, ".", stringify!($key))?));
            }
        )+};
    }
    keep!(
        broker.socket,
        broker.socket_mode,
        broker.helper,
        broker.cgroup_root,
        broker.sandbox_ids,
        broker.user_namespaces,
        broker.prespawn,
        broker.warm,
        broker.etc_snapshot,
        policy.temp_root,
        trust.state,
        journal,
        changes,
        plugins,
    );
    kept
}

/// `owned` and what `more` adds to it: a reload never takes anything out
/// of what the broker keeps out of reach (the Cedar file it read before,
/// the socket's directory), it can only add (a new Cedar file).
pub fn with_owned(owned: &[OwnedPath], more: Vec<OwnedPath>) -> Arc<[OwnedPath]> {
    let mut all = owned.to_vec();
    for o in more {
        if !all.iter().any(|a| a.path == o.path) {
            all.push(o);
        }
    }
    all.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(text: &str) -> Config {
        Config::parse(text, Path::new("p.toml")).unwrap()
    }

    #[test]
    fn keys_built_at_start_keep_their_running_values_and_are_named() {
        let running = parse("[broker]\nprespawn = 2\nmax_concurrent = 4\n[journal]\nsegment_bytes = 8192\n");
        let mut new = parse(
            "[broker]\nprespawn = 5\nmax_concurrent = 9\nallowed_uids = [7]\nsocket = \"/x.sock\"\n\
             [journal]\nsegment_bytes = 16384\n[policy]\ntemp_root = \"/srv/runs\"\napproval_timeout_secs = 9\n",
        );
        let kept = keep_restart_only(&running, &mut new);
        assert_eq!(kept, ["broker.socket", "broker.prespawn", "policy.temp_root", "journal"]);
        assert_eq!((new.broker.prespawn, new.broker.socket.as_deref()), (2, None));
        assert_eq!((new.journal.segment_bytes, new.policy.temp_root.as_deref()), (8192, None));
        // What a reload may change, changed.
        assert_eq!((new.broker.max_concurrent, new.broker.allowed_uids.len()), (9, 1));
        assert_eq!(new.policy.approval_timeout_secs, 9);
        // The same file again: nothing to name.
        let mut same = parse("[broker]\nprespawn = 2\nmax_concurrent = 4\n[journal]\nsegment_bytes = 8192\n");
        assert!(keep_restart_only(&running, &mut same).is_empty());
    }

    #[test]
    fn a_reload_only_adds_to_what_the_broker_keeps() {
        let at = |p: &str| OwnedPath { path: p.into(), what: p.into(), hidden: true };
        let all = with_owned(&[at("/a"), at("/b")], vec![at("/b"), at("/c")]);
        let paths: Vec<_> = all.iter().map(|o| o.path.to_string_lossy().into_owned()).collect();
        assert_eq!(paths, ["/a", "/b", "/c"]);
    }
}
