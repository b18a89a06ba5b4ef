//! The CLI's approval and tool commands: `palisade approvals`, `approve`,
//! `deny`, `tools show` and `tools approve`, through a running broker (the
//! tool commands also on the embedded broker's own state, with `--policy`).

use crate::cli::client::ClientError;
use crate::cli::discovery::BrokerArgs;
use crate::cli::discovery::Route;
use crate::cli::run::EXIT_PALISADE;
use crate::decide::approvals::{ApproverAction, Approvers};
use crate::decide::trust::TrustStore;
use crate::host::requester::Peer;
use crate::journal::Journal;
use palisade_policy::Config;
use palisade_protocol::wire::{ClientMessage, ErrorKind, PendingApproval, ServerMessage, ToolInfo};
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// `palisade tools`.
#[derive(clap::Subcommand, Debug)]
pub enum ToolsCommand {
    /// Print each declared tool (or NAME alone): its stage and its capability
    /// declaration, as an approver reviews it.
    Show {
        name: Option<String>,
        #[command(flatten)]
        broker: BrokerArgs,
        /// The embedded broker's tools under this policy file, instead of a running broker's.
        #[arg(long, value_name = "FILE", conflicts_with = "socket")]
        policy: Option<PathBuf>,
    },
    /// Approve tool NAME's declaration (an approver only): Draft → Trial,
    /// where each run is held for an approval until `trial_runs` of them
    /// succeed.
    Approve {
        name: String,
        #[command(flatten)]
        broker: BrokerArgs,
        /// The embedded broker's tools under this policy file, instead of a running broker's.
        #[arg(long, value_name = "FILE", conflicts_with = "socket")]
        policy: Option<PathBuf>,
    },
}

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

pub(crate) fn fail(kind: ErrorKind, message: impl std::fmt::Display) -> i32 {
    eprintln!("palisade: {kind}: {message}");
    EXIT_PALISADE
}

/// One request to the running broker (the user's own, else the system
/// broker: see `discovery`); its reply, or the exit status of a failure.
pub(crate) fn ask_broker(args: &BrokerArgs, msg: &ClientMessage) -> Result<ServerMessage, i32> {
    let mut found = match crate::cli::discovery::find(args.socket.as_deref(), false) {
        Ok(Route::Broker(found)) => found,
        Ok(Route::Embedded { tried }) => {
            return Err(fail(ErrorKind::Unavailable, format!("no broker answers on {tried}")));
        }
        Err(e) => return Err(fail(e.kind(), e)),
    };
    found.client.request(msg).map_err(|e| match e {
        ClientError::Reply(e) => fail(e.kind, e.message),
        ClientError::Io(e) => fail(ErrorKind::Unavailable, format!("{}: {e}", found.name())),
        e => fail(ErrorKind::ProtocolError, e),
    })
}

/// `palisade approvals`.
pub fn list(args: &BrokerArgs, json: bool) -> i32 {
    let pending = match ask_broker(args, &ClientMessage::ListApprovals) {
        Ok(ServerMessage::Approvals(p)) => p,
        Ok(other) => return fail(ErrorKind::ProtocolError, format!("unexpected reply {other:?}")),
        Err(code) => return code,
    };
    if json {
        println!("{}", serde_json::to_string(&pending).unwrap_or_default());
        return 0;
    }
    if pending.is_empty() {
        println!("no run is waiting for an approval");
    }
    for p in &pending {
        println!("{}: {}\n{}", p.id, p.reason, describe(p));
    }
    0
}

/// `palisade approve ID` and `palisade deny ID`.
pub fn answer(args: &BrokerArgs, approval: u64, approved: bool, reason: Option<String>) -> i32 {
    match ask_broker(args, &ClientMessage::Answer { approval, approved, reason }) {
        Ok(ServerMessage::Answered { approval, approved }) => {
            println!("approval {approval}: {}", if approved { "approved" } else { "denied" });
            0
        }
        Ok(other) => fail(ErrorKind::ProtocolError, format!("unexpected reply {other:?}")),
        Err(code) => code,
    }
}

/// `palisade tools show` and `palisade tools approve`.
pub fn tools(command: ToolsCommand) -> i32 {
    let (shown, name) = match command {
        ToolsCommand::Show { name, broker, policy: None } => (show_remote(&broker), name),
        ToolsCommand::Show { name, policy: Some(p), .. } => (embedded(&p, None), name),
        ToolsCommand::Approve { name, broker, policy: None } => {
            let approved = match ask_broker(&broker, &ClientMessage::ApproveTool { name: name.clone() }) {
                Ok(ServerMessage::Tools(t)) => Ok(t),
                Ok(other) => Err(fail(ErrorKind::ProtocolError, format!("unexpected reply {other:?}"))),
                Err(code) => Err(code),
            };
            (approved, Some(name))
        }
        ToolsCommand::Approve { name, policy: Some(p), .. } => (embedded(&p, Some(&name)), Some(name)),
    };
    let tools = match shown {
        Ok(t) => t,
        Err(code) => return code,
    };
    let mut found = false;
    for t in tools.iter().filter(|t| name.as_ref().is_none_or(|n| *n == t.name)) {
        found = true;
        print!("{}", render_tool(t));
    }
    match name {
        Some(n) if !found => fail(ErrorKind::InvalidRequest, format!("no tool {n:?} is declared")),
        _ => 0,
    }
}

fn show_remote(broker: &BrokerArgs) -> Result<Vec<ToolInfo>, i32> {
    match ask_broker(broker, &ClientMessage::ListTools) {
        Ok(ServerMessage::Tools(t)) => Ok(t),
        Ok(other) => Err(fail(ErrorKind::ProtocolError, format!("unexpected reply {other:?}"))),
        Err(code) => Err(code),
    }
}

/// The embedded broker's tools under `policy` (and `approve` one, by this
/// process's user, who must be an approver of that policy).
fn embedded(policy: &Path, approve: Option<&str>) -> Result<Vec<ToolInfo>, i32> {
    let config = Config::load(policy).map_err(|e| fail(ErrorKind::InvalidRequest, e))?;
    let refused = |e: crate::error::BrokerError| fail(e.kind(), e);
    let me = crate::host::requester::Requester::me();
    let peer = Peer { uid: me.uid, gid: me.gid, pid: Some(std::process::id() as i32), groups: me.groups };
    if let Some(name) = approve {
        // Authorized before anything is read or written.
        let ids =
            config.resolve_ids(&crate::host::Accounts).map_err(|e| fail(ErrorKind::InvalidRequest, e))?;
        let approvers = Approvers::new(&config, &ids, peer.uid);
        approvers.authorize(&peer, ApproverAction::ApproveTool(name)).map_err(refused)?;
    }
    // A transition is recorded as a daemon's is (no record, no change).
    let journal = Journal::from_config(&config).map_err(|e| fail(ErrorKind::JournalUnavailable, e))?;
    let store = TrustStore::open(&config, journal).map_err(|e| fail(ErrorKind::RuntimeFailure, e))?;
    let Some(store) = store else {
        let why = "keeps no trust stages ([trust] enabled = false, or no tool is declared)";
        return Err(fail(ErrorKind::InvalidRequest, format!("{} {why}", policy.display())));
    };
    match approve {
        Some(name) => store.approve(name, peer.uid).map(|t| vec![t]).map_err(refused),
        None => store.list().map_err(refused),
    }
}

/// A tool as `palisade tools show` prints it.
fn render_tool(t: &ToolInfo) -> String {
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
        let _ = writeln!(out, "  approve it (an approver): palisade tools approve {}", t.name);
    }
    out
}
