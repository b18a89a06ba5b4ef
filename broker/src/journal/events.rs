//! The records of a run's way through the broker, as both engines write them.

use super::Event;
use super::bound::{Text, Texts};
use palisade_policy::Resolved;
use palisade_protocol::HelperFailure;
use palisade_protocol::wire::{ErrorKind, ErrorReply, ParamValue, RunRequest, RunResult};

/// The record of a request as it came in.
pub fn received(run_id: u64, (uid, gid, pid): (u32, u32, Option<i32>), request: &RunRequest) -> Event {
    Event::RequestReceived {
        run_id,
        uid,
        gid,
        pid,
        tool: request.tool.clone(),
        argv: request.argv.clone(),
        workspace: request.workspace.clone(),
    }
}

/// What the record of a refused request holds of it: counts, sizes, sha256
/// and first bytes of its variable-size fields (see [`super::bound`]), never
/// the fields themselves; of the environment and the parameters, the names
/// (their values may be secrets) and the size of the values.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RefusedRequest {
    pub run_id: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
    /// Always true: the record is the bounded form.
    pub bounded: bool,
    pub tool: Option<Text>,
    pub argv: Texts,
    pub workspace: Option<Text>,
    pub cwd: Option<Text>,
    pub profile: Option<Text>,
    pub env: Texts,
    pub env_values_bytes: u64,
    pub params: Texts,
    pub param_values_bytes: u64,
    pub read_only: Texts,
    pub read_write: Texts,
    pub pass_env: Texts,
    pub allow_domains: Option<Texts>,
    pub stdin_bytes: u64,
}

/// The record of a request that was refused, in bounded form.
pub fn refused(run_id: u64, (uid, gid, pid): (u32, u32, Option<i32>), request: &RunRequest) -> Event {
    let text = |s: &Option<String>| s.as_deref().map(Text::of);
    let names = |keys: Vec<&String>| Texts::of(&keys);
    let param_values = request.params.values().map(|v| match v {
        ParamValue::One(s) => s.len() as u64,
        ParamValue::Many(list) => list.iter().map(|s| s.len() as u64).sum(),
    });
    Event::RequestRefused(Box::new(RefusedRequest {
        run_id,
        uid,
        gid,
        pid,
        bounded: true,
        tool: text(&request.tool),
        argv: Texts::of(&request.argv),
        workspace: text(&request.workspace),
        cwd: text(&request.cwd),
        profile: text(&request.profile),
        env: names(request.env.keys().collect()),
        env_values_bytes: request.env.values().map(|v| v.len() as u64).sum(),
        params: names(request.params.keys().collect()),
        param_values_bytes: param_values.sum(),
        read_only: Texts::of(&request.read_only),
        read_write: Texts::of(&request.read_write),
        pass_env: Texts::of(&request.pass_env),
        allow_domains: request.allow_domains.as_deref().map(Texts::of),
        stdin_bytes: request.stdin.len() as u64,
    }))
}

/// The record of a decision; a refusal's kind, rule and reason with it.
pub fn decision(run_id: u64, decision: &str, refusal: Option<&ErrorReply>) -> Event {
    Event::Decision {
        run_id,
        decision: decision.into(),
        kind: refusal.map(|e| e.kind.name().to_string()),
        rule: refusal.and_then(|e| e.rule.clone()),
        reason: refusal.map(|e| e.message.clone()),
    }
}

/// The record of a run about to start: what its attestation will pin.
pub fn run_started(run_id: u64, request: &RunRequest, resolved: &Resolved) -> Event {
    run_started_as(run_id, crate::journal::attest::attestation(request, resolved, None, None, None))
}

/// The record of a run about to start, from the attestation its executor
/// planned (macOS: with the Seatbelt profile's hash).
pub fn run_started_as(run_id: u64, planned: palisade_protocol::wire::Attestation) -> Event {
    Event::RunStarted {
        run_id,
        execution_sha256: planned.execution_sha256,
        tier: planned.executor.to_string(),
        enforcement: Box::new(planned.enforcement),
    }
}

/// The record of a run that could not be carried out: the error the client
/// gets, and the helper's failing step when the helper reported one.
pub fn run_failed(run_id: u64, kind: ErrorKind, message: String, helper: Option<&HelperFailure>) -> Event {
    Event::RunFailed {
        run_id,
        kind: kind.name().into(),
        message,
        stage: helper.map(|f| f.stage.name().to_string()),
        errno: helper.map(|f| f.errno),
    }
}

/// The records of a run's end: one per inspected request, then its
/// `run_finished` (whose `egress` leaves the requests to those records).
pub fn run_ended(r: &RunResult) -> Vec<Event> {
    let mut finished = run_finished(r);
    let requests = match &mut finished {
        Event::RunFinished { egress: Some(e), .. } => std::mem::take(&mut e.requests),
        _ => Vec::new(),
    };
    let mut records: Vec<Event> =
        requests.into_iter().map(|request| Event::InspectedRequest { run_id: r.run_id, request }).collect();
    records.push(finished);
    records
}

/// The record of a run's end.
pub fn run_finished(r: &RunResult) -> Event {
    use palisade_protocol::wire::RunStatus;
    let status = match r.status {
        RunStatus::Exited { code } => format!("exited {code}"),
        RunStatus::Signaled { signal } => format!("signaled {signal}"),
        RunStatus::Stopped => "stopped".into(),
        ended => ended.error_kind().map_or("ended".into(), |k| k.name().to_string()),
    };
    Event::RunFinished {
        run_id: r.run_id,
        status,
        wall_ms: r.wall_ms,
        cpu_user_ms: r.cpu_user_ms,
        cpu_system_ms: r.cpu_system_ms,
        peak_memory_bytes: r.peak_memory_bytes,
        stdout_bytes: r.stdout_bytes,
        stderr_bytes: r.stderr_bytes,
        written_bytes: r.written_bytes,
        withheld: r.changes.withheld.clone(),
        egress: r.attestation.enforcement.egress_traffic.clone(),
    }
}

/// A request refused because the journal cannot record it (naming the
/// floor's key when it is the free-space floor that refuses).
pub fn journal_refusal(e: crate::journal::JournalError) -> ErrorReply {
    match e.rule() {
        Some(rule) => ErrorReply::with_rule(ErrorKind::JournalUnavailable, e.to_string(), rule),
        None => ErrorReply::new(ErrorKind::JournalUnavailable, e.to_string()),
    }
}
