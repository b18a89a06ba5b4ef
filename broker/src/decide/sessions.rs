//! Sessions: sandboxes that stay for the commands run in them, each of its
//! requester alone (docs/protocol.md, "Sessions"). The registry: names,
//! owners, how many, and when each was last used; the server starts,
//! joins and stops them.

use crate::engine::executor::Sandbox;
use palisade_protocol::wire::{ErrorKind, ErrorReply, RunRequest, RunResult, SessionInfo};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

/// A session with no command running and none started for this long ends.
pub const IDLE_TIMEOUT_DEFAULT_SECS: u64 = 15 * 60;
/// A session ends this long after it started, whatever runs in it.
pub const MAX_LIFETIME_DEFAULT_SECS: u64 = 8 * 60 * 60;
/// The longest lifetime (and idle timeout) a session may ask for.
pub const MAX_LIFETIME_CAP_SECS: u64 = 7 * 24 * 60 * 60;
/// A session's name: 1 to 64 of `A-Z a-z 0-9 . _ -`, not starting with `.` or `-`.
pub const NAME_MAX: usize = 64;

/// How a session ended, once it has: its own run's result.
pub type Ended = Option<Result<RunResult, ErrorReply>>;

/// When a session was last used, and how many of its commands run now.
#[derive(Default)]
pub struct Activity {
    last: Mutex<Option<Instant>>,
    running: AtomicU64,
    runs: AtomicU64,
}

impl Activity {
    /// A command of the session starts; dropping the guard ends it.
    pub fn enter(self: &Arc<Activity>) -> Entered {
        self.running.fetch_add(1, Ordering::SeqCst);
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.touch();
        Entered(self.clone())
    }

    /// The session was used: its idle time starts again.
    pub fn touch(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Completes once the session has been idle for `idle`: no command
    /// running, and none started or ended for that long.
    pub async fn idle_for(&self, idle: Duration) {
        self.touch();
        loop {
            let since = self.last.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or_else(Instant::now);
            let left = idle.saturating_sub(since.elapsed());
            if left.is_zero() && self.running.load(Ordering::SeqCst) == 0 {
                return;
            }
            tokio::time::sleep(left.max(Duration::from_secs(1))).await;
        }
    }
}

/// A command of a session, running.
pub struct Entered(Arc<Activity>);

impl Drop for Entered {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        self.0.touch();
    }
}

/// A session's published ports, and the socket on the host of each:
/// shared by the session and the task that runs it, which removes the
/// sockets before the session's end is told.
pub type Published = Arc<Mutex<BTreeMap<u16, String>>>;

/// Removes published sockets: every one (`None`: the session has ended) or
/// `port`'s. A socket's file is removed by whoever takes its entry from the
/// map, once: never a later socket at the same path (a new session of the
/// same name publishing the same port).
pub fn withdraw(published: &Published, port: Option<u16>) {
    let sockets: Vec<String> = {
        let mut map = published.lock().unwrap_or_else(|e| e.into_inner());
        match port {
            None => std::mem::take(&mut *map).into_values().collect(),
            Some(port) => map.remove(&port).into_iter().collect(),
        }
    };
    for socket in &sockets {
        if let Err(e) = std::fs::remove_file(socket)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("removing the published socket {socket}: {e}");
        }
    }
}

/// A live session.
pub struct Session {
    pub uid: u32,
    pub info: SessionInfo,
    /// The request it was started with: every command's request but the
    /// command's own fields (see [`command_request`]).
    pub request: RunRequest,
    pub sandbox: Sandbox,
    pub activity: Arc<Activity>,
    /// Its published ports, and the socket on the host of each.
    pub published: Published,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    ended: watch::Receiver<Ended>,
}

impl Session {
    pub fn new(
        uid: u32,
        info: SessionInfo,
        request: RunRequest,
        sandbox: Sandbox,
        activity: Arc<Activity>,
        published: Published,
        (stop, ended): (oneshot::Sender<()>, watch::Receiver<Ended>),
    ) -> Session {
        Session { uid, info, request, sandbox, activity, published, stop: Mutex::new(Some(stop)), ended }
    }

    /// Ends the session (everything in it is killed); its result.
    pub async fn stop(&self) -> Result<RunResult, ErrorReply> {
        if let Some(stop) = self.stop.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = stop.send(());
        }
        let mut ended = self.ended.clone();
        match ended.wait_for(Option::is_some).await {
            Ok(result) => result.clone().unwrap_or_else(|| Err(gone(&self.info.name))),
            Err(_) => Err(gone(&self.info.name)),
        }
    }

    /// Completes once the session has ended.
    pub async fn ended(&self) {
        let _ = self.ended.clone().wait_for(Option::is_some).await;
    }

    pub fn has_ended(&self) -> bool {
        self.ended.borrow().is_some()
    }

    pub fn listed(&self) -> SessionInfo {
        SessionInfo {
            runs: self.activity.runs.load(Ordering::SeqCst),
            running: self.activity.running.load(Ordering::SeqCst),
            ..self.info.clone()
        }
    }
}

fn gone(name: &str) -> ErrorReply {
    ErrorReply::new(ErrorKind::RuntimeFailure, format!("session {name} ended without a result"))
}

/// The live sessions, by requester and name, and the names being started.
#[derive(Default)]
pub struct Sessions {
    state: Mutex<State>,
    named: AtomicU64,
}

#[derive(Default)]
struct State {
    live: BTreeMap<(u32, String), Arc<Session>>,
    starting: BTreeSet<(u32, String)>,
}

impl Sessions {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `name` (or a name of the broker's) for a session of `uid` about
    /// to start; [`Sessions::started`] or [`Sessions::release`] gives it back.
    /// `max`: the sessions one requester may have (`[broker] max_sessions_per_uid`).
    pub fn reserve(&self, uid: u32, name: Option<String>, max: usize) -> Result<String, ErrorReply> {
        let name = match name {
            Some(n) => check_name(&n).map(|()| n)?,
            None => format!("s{}", self.named.fetch_add(1, Ordering::Relaxed) + 1),
        };
        let mut state = self.state();
        let key = (uid, name.clone());
        if state.live.contains_key(&key) || state.starting.contains(&key) {
            let why = format!("you already have a session named {name}");
            return Err(ErrorReply::with_rule(ErrorKind::InvalidRequest, why, "session.name"));
        }
        let mine = state.live.keys().chain(state.starting.iter()).filter(|(u, _)| *u == uid).count();
        if mine >= max {
            let why = format!(
                "you have {mine} sessions, the most one requester may have (max_sessions_per_uid = {max}): stop one first"
            );
            return Err(ErrorReply::with_rule(ErrorKind::Busy, why, "session.limit"));
        }
        state.starting.insert(key);
        Ok(name)
    }

    /// A reserved name whose session did not start.
    pub fn release(&self, uid: u32, name: &str) {
        self.state().starting.remove(&(uid, name.to_string()));
    }

    pub fn started(&self, session: Arc<Session>) {
        let mut state = self.state();
        let key = (session.uid, session.info.name.clone());
        state.starting.remove(&key);
        state.live.insert(key, session);
    }

    /// A session that ended.
    pub fn remove(&self, uid: u32, name: &str) {
        self.state().live.remove(&(uid, name.to_string()));
    }

    /// `uid`'s session `name`: another requester's is as absent as one that never was.
    pub fn get(&self, uid: u32, name: &str) -> Result<Arc<Session>, ErrorReply> {
        self.state().live.get(&(uid, name.to_string())).cloned().ok_or_else(|| {
            let why = format!("you have no session named {name} (`palisade session list` lists yours)");
            ErrorReply::with_rule(ErrorKind::InvalidRequest, why, "session.unknown")
        })
    }

    /// Every live session, with its requester.
    pub fn all(&self) -> Vec<(u32, SessionInfo)> {
        self.state().live.values().map(|s| (s.uid, s.listed())).collect()
    }

    pub fn list(&self, uid: u32) -> Vec<SessionInfo> {
        self.state().live.values().filter(|s| s.uid == uid).map(|s| s.listed()).collect()
    }
}

fn check_name(name: &str) -> Result<(), ErrorReply> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    let fine = !name.is_empty()
        && name.len() <= NAME_MAX
        && name.chars().all(allowed)
        && !name.starts_with(['.', '-']);
    if fine {
        return Ok(());
    }
    let why = format!(
        "a session's name is 1 to {NAME_MAX} of A-Z, a-z, 0-9, '.', '_' and '-', not starting with '.' or '-' (got {name:?})"
    );
    Err(ErrorReply::with_rule(ErrorKind::InvalidRequest, why, "session.name"))
}

/// The request a command of `session` is decided with: the session's, with
/// the command's own fields (argv, env added to the session's, cwd, stdin,
/// timeout, output bound, raw output, and the asks for interpreters and
/// inline code). Any other field set is refused: it is the session's.
pub fn command_request(session: &RunRequest, run: RunRequest) -> Result<RunRequest, ErrorReply> {
    let own = RunRequest {
        argv: run.argv.clone(),
        env: run.env.clone(),
        cwd: run.cwd.clone(),
        stdin: run.stdin.clone(),
        timeout_secs: run.timeout_secs,
        max_output_bytes: run.max_output_bytes,
        raw_output: run.raw_output,
        allow_interpreters: run.allow_interpreters,
        allow_inline_code: run.allow_inline_code,
        ..RunRequest::default()
    };
    if own != run {
        let why = "a command in a session sets only argv, env, cwd, stdin, timeout_secs, max_output_bytes, \
                   raw_output, allow_interpreters and allow_inline_code: the rest is the session's";
        return Err(ErrorReply::with_rule(ErrorKind::InvalidRequest, why, "session.field"));
    }
    let mut env = session.env.clone();
    env.extend(run.env);
    Ok(RunRequest {
        argv: run.argv,
        env,
        cwd: run.cwd.or_else(|| session.cwd.clone()),
        stdin: run.stdin,
        timeout_secs: run.timeout_secs,
        max_output_bytes: run.max_output_bytes,
        raw_output: run.raw_output,
        allow_interpreters: run.allow_interpreters,
        allow_inline_code: run.allow_inline_code,
        ..session.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[broker] max_sessions_per_uid`'s default.
    const MAX_SESSIONS_PER_UID: usize = 8;
    use palisade_policy::denial::names_a_fix_or_why_none;

    /// The refusal's rule and message.
    fn rule(e: ErrorReply) -> (String, String) {
        (e.rule.unwrap_or_default(), e.message)
    }

    #[test]
    fn names_are_checked_and_each_requester_has_its_own() {
        let s = Sessions::default();
        assert_eq!(s.reserve(1000, Some("dev".into()), MAX_SESSIONS_PER_UID).unwrap(), "dev");
        let (taken, why) = rule(s.reserve(1000, Some("dev".into()), MAX_SESSIONS_PER_UID).unwrap_err());
        assert_eq!(taken, "session.name");
        names_a_fix_or_why_none("session.name", &why).unwrap();
        assert_eq!(
            s.reserve(1001, Some("dev".into()), MAX_SESSIONS_PER_UID).unwrap(),
            "dev",
            "another uid's names are its own"
        );
        for bad in ["", ".x", "-x", "a/b", "a b", &"x".repeat(NAME_MAX + 1)] {
            let (refused, why) = rule(s.reserve(1000, Some(bad.into()), MAX_SESSIONS_PER_UID).unwrap_err());
            assert_eq!(refused, "session.name", "{bad:?}");
            names_a_fix_or_why_none("session.name", &why).unwrap();
        }
        s.release(1000, "dev");
        assert_eq!(s.reserve(1000, Some("dev".into()), MAX_SESSIONS_PER_UID).unwrap(), "dev");
        let (unknown, why) = rule(s.get(1001, "dev").err().unwrap());
        assert_eq!(unknown, "session.unknown", "another uid's session is not found");
        names_a_fix_or_why_none("session.unknown", &why).unwrap();
        for _ in 1..MAX_SESSIONS_PER_UID {
            s.reserve(1000, None, MAX_SESSIONS_PER_UID).unwrap();
        }
        let (limit, why) = rule(s.reserve(1000, None, MAX_SESSIONS_PER_UID).unwrap_err());
        assert_eq!(limit, "session.limit");
        names_a_fix_or_why_none("session.limit", &why).unwrap();
    }

    #[test]
    fn a_command_sets_only_its_own_fields() {
        let session = RunRequest {
            workspace: Some("/w".into()),
            env: [("A".to_string(), "1".to_string())].into(),
            ..RunRequest::default()
        };
        let run = RunRequest {
            argv: vec!["ls".into()],
            env: [("B".to_string(), "2".to_string())].into(),
            ..RunRequest::default()
        };
        let merged = command_request(&session, run).unwrap();
        assert_eq!(merged.workspace.as_deref(), Some("/w"));
        assert_eq!(merged.env.len(), 2);
        let wider =
            RunRequest { argv: vec!["ls".into()], read_write: vec!["/etc".into()], ..RunRequest::default() };
        let (field, why) = rule(command_request(&session, wider).unwrap_err());
        assert_eq!(field, "session.field");
        names_a_fix_or_why_none("session.field", &why).unwrap();
    }
}
