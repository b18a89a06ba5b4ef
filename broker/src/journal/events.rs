//! The records of a run's way through the broker, as both engines write them.

use super::Event;
use palisade_policy::Resolved;
use palisade_protocol::wire::{ErrorKind, ErrorReply, RunRequest, RunResult};

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
    run_started_as(run_id, crate::attest::attestation(request, resolved, None, None, None))
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

/// The record of a run's end.
pub fn run_finished(r: &RunResult) -> Event {
    use palisade_protocol::wire::RunStatus;
    let status = match r.status {
        RunStatus::Exited { code } => format!("exited {code}"),
        RunStatus::Signaled { signal } => format!("signaled {signal}"),
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

/// A request refused because the journal cannot record it.
pub fn journal_refusal(e: crate::journal::JournalError) -> ErrorReply {
    ErrorReply::new(ErrorKind::JournalUnavailable, e.to_string())
}
