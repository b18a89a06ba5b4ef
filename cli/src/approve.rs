//! The approval commands, `palisade approvals`, `approve` and `deny`,
//! through a running broker; how a waiting run and a declared tool are
//! shown.

use crate::client::ClientError;
use crate::discovery::{BrokerArgs, Route};
use crate::render::fail;
use crate::{json_fail, json_reply};
use palisade_protocol::wire::{
    ClientMessage, ErrorKind, ErrorReply, PendingApproval, ServerMessage, ToolInfo,
};
use std::fmt::Write;

/// What a run held for approval is about to do, one item a line.
pub fn describe(p: &PendingApproval) -> String {
    let mut out = String::new();
    let _ =
        writeln!(out, "  approval:   {} (run {}, uid {}, pid {})", p.id, p.run_id, p.uid, pid_text(p.pid));
    if let Some(tool) = &p.tool {
        let _ = writeln!(out, "  tool:       {tool}");
    }
    let _ = writeln!(out, "  command:    {}", shell_words(&p.argv));
    for path in &p.read_only {
        let _ = writeln!(out, "  read-only:  {path}");
    }
    for path in &p.read_write {
        let _ = writeln!(out, "  read-write: {path}");
    }
    let _ = writeln!(out, "  network:    {} (egress {})", p.network, p.egress);
    let limits: Vec<String> = p.limits.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(out, "  limits:     {}", limits.join(" "));
    if let Some(t) = &p.trigger {
        let _ = writeln!(
            out,
            "  trigger:    {}{}",
            t.reason.name(),
            t.requested_path.as_ref().map(|r| format!(" ({r})")).unwrap_or_default()
        );
        if !t.approved_paths.is_empty() {
            let _ = writeln!(out, "  approved:   {}", t.approved_paths.join(", "));
        }
    }
    let left = p.expires_unix.saturating_sub(now_unix());
    let _ = writeln!(out, "  expires in: {left} s");
    out
}

fn pid_text(pid: Option<i32>) -> String {
    pid.map_or_else(|| "-".into(), |p| p.to_string())
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// argv as a person would type it: words with spaces or quotes quoted.
fn shell_words(argv: &[String]) -> String {
    let quote = |w: &String| {
        if !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c)) {
            w.clone()
        } else {
            format!("'{}'", w.replace('\'', "'\\''"))
        }
    };
    argv.iter().map(quote).collect::<Vec<_>>().join(" ")
}

/// One request to the running broker (the user's own, else the system
/// broker: see `discovery`); its reply, or the exit status of a failure.
pub fn ask_broker(args: &BrokerArgs, msg: &ClientMessage) -> Result<ServerMessage, i32> {
    ask(args, msg).map_err(|e| fail(e.kind, e.message))
}

/// As [`ask_broker`], the error as the broker (or its absence) gave it.
pub fn ask(args: &BrokerArgs, msg: &ClientMessage) -> Result<ServerMessage, ErrorReply> {
    let mut found = match crate::discovery::find(args.socket.as_deref(), false) {
        Ok(Route::Broker(found)) => found,
        Ok(Route::Embedded { tried }) => {
            return Err(ErrorReply::new(ErrorKind::Unavailable, format!("no broker answers on {tried}")));
        }
        Err(e) => return Err(ErrorReply::new(e.kind(), e.to_string())),
    };
    found.client.request(msg).map_err(|e| match e {
        ClientError::Reply(e) => e,
        ClientError::Io(e) => ErrorReply::new(ErrorKind::Unavailable, format!("{}: {e}", found.name())),
        e => ErrorReply::new(ErrorKind::ProtocolError, e.to_string()),
    })
}

/// `palisade approvals`.
pub fn list(args: &BrokerArgs, json: bool) -> i32 {
    let pending = match ask(args, &ClientMessage::ListApprovals) {
        Ok(ServerMessage::Approvals(p)) => p,
        Ok(other) => return json_fail(json, ErrorKind::ProtocolError, format!("unexpected reply {other:?}")),
        Err(e) => return json_reply(json, e),
    };
    if json {
        crate::outln!("{}", serde_json::to_string(&pending).unwrap_or_default());
        return 0;
    }
    if pending.is_empty() {
        crate::outln!("no run is waiting for an approval");
    }
    for p in &pending {
        crate::outln!("{}: {}\n{}", p.id, p.reason, describe(p));
    }
    0
}

/// `palisade approve ID` and `palisade deny ID`.
pub fn answer(args: &BrokerArgs, approval: u64, approved: bool, reason: Option<String>) -> i32 {
    match ask_broker(args, &ClientMessage::Answer { approval, approved, reason }) {
        Ok(ServerMessage::Answered { approval, approved }) => {
            crate::outln!("approval {approval}: {}", if approved { "approved" } else { "denied" });
            0
        }
        Ok(other) => fail(ErrorKind::ProtocolError, format!("unexpected reply {other:?}")),
        Err(code) => code,
    }
}

/// A tool as `palisade tools show` prints it; `policy`: the `--policy` it
/// was shown under, which the hint to approve it keeps.
pub fn render_tool(t: &ToolInfo, policy: Option<&std::path::Path>) -> String {
    let mut out = String::new();
    let progress = match t.stage.as_str() {
        "trial" => format!(" ({} of {} approved runs succeeded)", t.trial_successes, t.trial_runs),
        _ => String::new(),
    };
    let _ = writeln!(out, "tool {}: {}{progress}", t.name, t.stage);
    let _ = writeln!(out, "  capabilities sha256: {}", t.capabilities_sha256);
    for line in t.declaration.lines() {
        let _ = writeln!(out, "  {line}");
    }
    if t.stage == "draft" {
        let under = policy.map(|p| format!(" --policy {}", p.display())).unwrap_or_default();
        let _ = writeln!(out, "  approve it (an approver): palisade tools approve {}{under}", t.name);
    }
    out
}
