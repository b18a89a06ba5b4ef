//! The server's side of sessions: `StartSession` (a run decided with the
//! session's fields, its sandbox held by a task of its own until it is
//! stopped, idle or too old, or the broker stops), `ListSessions` and
//! `StopSession`. A command in a session is a run (`serve_run`) that joins
//! it.

use crate::decide::service::not_approved;
use crate::decide::sessions::{
    Activity, Ended, IDLE_TIMEOUT_DEFAULT_SECS, MAX_LIFETIME_CAP_SECS, MAX_LIFETIME_DEFAULT_SECS, Session,
};
use crate::engine::executor::{Executor, Sandbox};
use crate::engine::stream::Built;
use crate::engine::stream::Sink;
use crate::error::BrokerError;
use crate::host::peer::Peer;
use crate::serve::server::Server;
use palisade_protocol::wire::{ErrorKind, ErrorReply, RunRequest, ServerMessage, SessionInfo, StartSession};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{oneshot, watch};

/// The program a session's start is decided as: what the session may
/// reach is the request's other fields; no command runs at its start.
pub const SESSION_START_PROGRAM: &str = "true";

/// Where a held session's run sends its messages: nowhere (its process
/// writes nothing, and its commands have their own runs), but its
/// namespaces, once it is built, to whoever waits for them.
struct HoldSink {
    held: Option<oneshot::Sender<Built>>,
    /// Its requester stopped it.
    stopped: Arc<AtomicBool>,
}

impl Sink for HoldSink {
    async fn send(&mut self, _msg: ServerMessage) -> bool {
        true
    }

    fn session_held(&mut self, built: Built) {
        if let Some(tx) = self.held.take() {
            let _ = tx.send(built);
        }
    }

    fn session_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }
}

fn invalid(why: impl Into<String>, rule: &str) -> BrokerError {
    ErrorReply::with_rule(ErrorKind::InvalidRequest, why, rule).into()
}

/// The idle timeout and the lifetime a start asks for, checked.
fn bounds(start: &StartSession) -> Result<(Duration, Duration), BrokerError> {
    let idle = start.idle_timeout_secs.unwrap_or(IDLE_TIMEOUT_DEFAULT_SECS);
    let lifetime = start.max_lifetime_secs.unwrap_or(MAX_LIFETIME_DEFAULT_SECS);
    if !(1..=MAX_LIFETIME_CAP_SECS).contains(&idle) || !(1..=MAX_LIFETIME_CAP_SECS).contains(&lifetime) {
        let why = format!(
            "a session's idle_timeout_secs and max_lifetime_secs are 1 to {MAX_LIFETIME_CAP_SECS} (got {idle} and {lifetime})"
        );
        return Err(invalid(why, "session.bounds"));
    }
    if !start.run.argv.is_empty() || !start.run.stdin.is_empty() {
        let why = "a session starts with no command (its run's argv and stdin are empty): \
                   its commands come with run_in_session";
        return Err(invalid(why, "session.argv"));
    }
    Ok((Duration::from_secs(idle), Duration::from_secs(lifetime)))
}

impl<E: Executor> Server<E> {
    /// `StartSession`: answered once the session's sandbox is built and held.
    pub(super) async fn start_session(
        &self,
        peer: &Peer,
        start: StartSession,
        shutdown: watch::Receiver<bool>,
    ) -> Result<ServerMessage, BrokerError> {
        let (idle, lifetime) = bounds(&start)?;
        let max = self.broker.settings().config().broker.max_sessions_per_uid;
        let name = self.sessions.reserve(peer.uid, start.name.clone(), max)?;
        let started = self.build_session(peer, start.run, &name, (idle, lifetime), shutdown).await;
        match started {
            Ok(session) => {
                let info = session.info.clone();
                self.sessions.started(session.clone());
                // It may have ended already: its task removed it before it was listed.
                if session.has_ended() {
                    self.sessions.remove(peer.uid, &name);
                }
                tracing::info!(uid = peer.uid, session = name, run_id = info.run_id, "session started");
                Ok(ServerMessage::SessionStarted(info))
            }
            Err(e) => {
                self.sessions.release(peer.uid, &name);
                Err(e)
            }
        }
    }

    /// Decides the session's start, and runs its held sandbox in a task of
    /// its own until it ends; the session once its sandbox is built.
    async fn build_session(
        &self,
        peer: &Peer,
        run: RunRequest,
        name: &str,
        (idle, lifetime): (Duration, Duration),
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<Arc<Session>, BrokerError> {
        let request = RunRequest { argv: vec![SESSION_START_PROGRAM.into()], ..run };
        let (decided, request) = self.decide(peer, request).await;
        let mut decided = decided?;
        if let Some(approval) = &decided.approval {
            let why = "a session is never started on a person's approval: start it with what needs none";
            return Err(not_approved(approval, why).into());
        }
        self.broker.hold(peer, &mut decided, &request)?;
        // The session's deadline is its lifetime, not a command's.
        decided.resolved.timeout = lifetime;
        let (plan, run_id) = (decided.resolved.plan.clone(), decided.run_id);
        let cgroup_plan = decided.resolved.cgroup.clone();
        let activity = Arc::new(Activity::default());
        let (held_tx, held_rx) = oneshot::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (end_tx, mut end_rx) = watch::channel::<Ended>(None);
        let (broker, sessions, who, watching) =
            (self.broker.clone(), self.sessions.clone(), peer.clone(), activity.clone());
        let (held_request, held_name) = (request.clone(), name.to_string());
        let published = crate::decide::sessions::Published::default();
        let withdrawn = published.clone();
        let task = tokio::spawn(async move {
            let stopped = Arc::new(AtomicBool::new(false));
            let mut sink = HoldSink { held: Some(held_tx), stopped: stopped.clone() };
            let (uid, idle_name) = (who.uid, held_name.clone());
            let cancel = async move {
                tokio::select! {
                    // Its sender dropped unused: the session was never listed.
                    asked = stop_rx => stopped.store(asked.is_ok(), Ordering::SeqCst),
                    () = watching.idle_for(idle) => {
                        tracing::info!(uid, session = idle_name, "session idle: ending it");
                    }
                    _ = shutdown.wait_for(|stop| *stop) => {}
                }
            };
            let result = broker.execute(&who, decided, &held_request, &mut sink, cancel).await;
            // Its published sockets are gone before its end is told.
            crate::decide::sessions::withdraw(&withdrawn, None);
            // Unlisted before its end is told: whoever stopped it lists it no more.
            sessions.remove(who.uid, &held_name);
            let _ = end_tx.send(Some(result.map_err(ErrorReply::from)));
            // A start that was given up before its session was listed leaves no name taken.
            sessions.release(who.uid, &held_name);
        });
        {
            let mut tasks = self.session_tasks.lock().unwrap_or_else(|e| e.into_inner());
            tasks.retain(|t| !t.is_finished());
            tasks.push(task);
        }
        let Ok(Built { namespaces, cgroup }) = held_rx.await else {
            // The run ended before its sandbox was held: why.
            let ended = end_rx.wait_for(Option::is_some).await.map(|e| e.clone()).ok().flatten();
            return Err(match ended {
                Some(Err(e)) => e.into(),
                Some(Ok(r)) => BrokerError::from(ErrorReply::new(
                    ErrorKind::RuntimeFailure,
                    format!("the session's sandbox ended as it was built ({:?})", r.status),
                )),
                None => BrokerError::Internal(format!("session {name}")),
            });
        };
        let info = SessionInfo {
            name: name.to_string(),
            run_id,
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            idle_timeout_secs: idle.as_secs(),
            max_lifetime_secs: lifetime.as_secs(),
            runs: 0,
            running: 0,
            workspace: plan.cwd.clone(),
        };
        let request = RunRequest { argv: Vec::new(), ..request };
        let sandbox = Sandbox { plan, namespaces, cgroup: cgroup_plan.map(|p| (p, cgroup)) };
        Ok(Arc::new(Session::new(peer.uid, info, request, sandbox, activity, published, (stop_tx, end_rx))))
    }

    /// `ListSessions` and `StopSession`.
    pub(super) async fn sessions(
        &self,
        peer: &Peer,
        stop: Option<String>,
    ) -> Result<ServerMessage, BrokerError> {
        let Some(name) = stop else { return Ok(ServerMessage::Sessions(self.sessions.list(peer.uid))) };
        let session = self.sessions.get(peer.uid, &name)?;
        tracing::info!(uid = peer.uid, session = name, "stopping the session");
        Ok(match session.stop().await {
            Ok(result) => ServerMessage::Finished(Box::new(result)),
            Err(e) => ServerMessage::Error(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_policy::denial::names_a_fix_or_why_none;

    /// The refusal's rule and message.
    fn refused(start: StartSession) -> (String, String) {
        let e = ErrorReply::from(bounds(&start).unwrap_err());
        (e.rule.unwrap_or_default(), e.message)
    }

    #[test]
    fn a_start_has_bounds_and_no_command() {
        let fine = StartSession::default();
        let (idle, lifetime) = bounds(&fine).unwrap();
        assert_eq!(
            (idle.as_secs(), lifetime.as_secs()),
            (IDLE_TIMEOUT_DEFAULT_SECS, MAX_LIFETIME_DEFAULT_SECS)
        );
        let zero = StartSession { idle_timeout_secs: Some(0), ..StartSession::default() };
        let (rule, why) = refused(zero);
        assert_eq!(rule, "session.bounds");
        names_a_fix_or_why_none("session.bounds", &why).unwrap();
        let long =
            StartSession { max_lifetime_secs: Some(MAX_LIFETIME_CAP_SECS + 1), ..StartSession::default() };
        assert_eq!(refused(long).0, "session.bounds");
        let run = RunRequest { argv: vec!["ls".into()], ..RunRequest::default() };
        let (rule, why) = refused(StartSession { run, ..StartSession::default() });
        assert_eq!(rule, "session.argv");
        names_a_fix_or_why_none("session.argv", &why).unwrap();
    }
}
