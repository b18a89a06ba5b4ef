//! The tool commands, `tools list`, `tools show` and `tools approve`: through a running
//! broker, or on the embedded broker's own state with `--policy`. The
//! approval commands are the CLI's own (`palisade_cli::approve`).

use crate::cli::discovery::BrokerArgs;
use crate::decide::approvals::{ApproverAction, Approvers};
use crate::decide::trust::TrustStore;
use crate::host::requester::Peer;
use crate::journal::Journal;
use palisade_cli::approve::{ask, render_tool};
use palisade_cli::{json_fail, json_reply};
use palisade_policy::Config;
use palisade_protocol::wire::{ClientMessage, ErrorKind, ErrorReply, ServerMessage, ToolInfo};
use std::path::{Path, PathBuf};

/// `palisade tools`: with no command, `palisade tools list` (its options too).
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ToolsArgs {
    #[command(subcommand)]
    pub command: Option<ToolsCommand>,
    #[command(flatten)]
    pub list: ListArgs,
}

/// `palisade tools list`'s options.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub at: ToolsAt,
    /// Print them as a JSON array, each tool an object: name, stage,
    /// trial_successes, trial_runs, declaration, capabilities_sha256.
    #[arg(long)]
    pub json: bool,
}

/// Where the tools are asked for: a running broker, or the embedded
/// broker's own state under a policy file.
#[derive(clap::Args, Debug)]
pub struct ToolsAt {
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// The embedded broker's tools under this policy file, instead of a running broker's.
    #[arg(long, value_name = "FILE", conflicts_with = "socket")]
    pub policy: Option<PathBuf>,
}

#[derive(clap::Subcommand, Debug)]
pub enum ToolsCommand {
    /// List the declared tools, one a line: each one's name and stage (what
    /// `palisade tools` alone prints).
    List(ListArgs),
    /// Print each declared tool (or NAME alone): its stage and its capability
    /// declaration, as an approver reviews it.
    Show {
        name: Option<String>,
        #[command(flatten)]
        at: ToolsAt,
        /// Print them as a JSON array, as `palisade tools list --json` does.
        #[arg(long)]
        json: bool,
    },
    /// Approve tool NAME's declaration (an approver only): Draft → Trial,
    /// where each run is held for an approval until `trial_runs` of them
    /// succeed.
    Approve {
        name: String,
        #[command(flatten)]
        at: ToolsAt,
    },
}

/// `palisade tools list`, `show` and `approve`.
pub fn tools(args: ToolsArgs) -> i32 {
    let command = args.command.unwrap_or(ToolsCommand::List(args.list));
    let (at, name, json, list) = match &command {
        ToolsCommand::List(ListArgs { at, json }) => (at, None, *json, true),
        ToolsCommand::Show { name, at, json } => (at, name.clone(), *json, false),
        ToolsCommand::Approve { name, at } => (at, Some(name.clone()), false, false),
    };
    let approve = matches!(command, ToolsCommand::Approve { .. });
    let tools = match (&at.policy, &name) {
        (Some(p), _) => embedded(p, name.as_deref().filter(|_| approve)),
        (None, Some(n)) if approve => remote(&at.broker, &ClientMessage::ApproveTool { name: n.clone() }),
        (None, _) => remote(&at.broker, &ClientMessage::ListTools),
    };
    let tools = match tools {
        Ok(t) => t,
        Err(e) => return json_reply(json, e),
    };
    let shown: Vec<&ToolInfo> = tools.iter().filter(|t| name.as_ref().is_none_or(|n| *n == t.name)).collect();
    if let (Some(n), true) = (&name, shown.is_empty()) {
        return json_fail(json, ErrorKind::InvalidRequest, format!("no tool {n:?} is declared"));
    }
    if json {
        palisade_cli::outln!("{}", serde_json::to_string(&shown).unwrap_or_default());
    } else if list {
        if shown.is_empty() {
            palisade_cli::outln!("no tool is declared");
        }
        for t in shown {
            palisade_cli::outln!("{}", list_line(t));
        }
    } else {
        for t in shown {
            palisade_cli::out!("{}", render_tool(t, at.policy.as_deref()));
        }
    }
    0
}

/// A tool's line in `palisade tools list`: its name and stage (and in
/// Trial, how far along), and what declares it.
fn list_line(t: &ToolInfo) -> String {
    let progress = match t.stage.as_str() {
        "trial" => format!(" ({} of {} approved runs succeeded)", t.trial_successes, t.trial_runs),
        _ => String::new(),
    };
    let sha = t.capabilities_sha256.get(..12).unwrap_or(&t.capabilities_sha256);
    format!("{}: {}{progress} (capabilities {sha})", palisade_cli::escape::name(&t.name), t.stage)
}

fn remote(broker: &BrokerArgs, message: &ClientMessage) -> Result<Vec<ToolInfo>, ErrorReply> {
    match ask(broker, message)? {
        ServerMessage::Tools(t) => Ok(t),
        other => Err(ErrorReply::new(ErrorKind::ProtocolError, format!("unexpected reply {other:?}"))),
    }
}

/// The embedded broker's tools under `policy` (and `approve` one, by this
/// process's user, who must be an approver of that policy); where it keeps
/// no trust stages, its tools `untracked`, as a daemon lists them.
fn embedded(policy: &Path, approve: Option<&str>) -> Result<Vec<ToolInfo>, ErrorReply> {
    let config =
        Config::load(policy).map_err(|e| ErrorReply::new(ErrorKind::InvalidRequest, e.to_string()))?;
    let me = crate::host::requester::Requester::me();
    let peer = Peer { uid: me.uid, gid: me.gid, pid: Some(std::process::id() as i32), groups: me.groups };
    if let Some(name) = approve {
        // Authorized before anything is read or written.
        let ids = config
            .resolve_ids(&crate::host::Accounts)
            .map_err(|e| ErrorReply::new(ErrorKind::InvalidRequest, e.to_string()))?;
        let approvers = Approvers::new(&config, &ids, peer.uid);
        approvers.authorize(&peer, ApproverAction::ApproveTool(name))?;
    }
    // A transition is recorded as a daemon's is (no record, no change).
    let journal = Journal::from_config(&config)
        .map_err(|e| ErrorReply::new(ErrorKind::JournalUnavailable, e.to_string()))?;
    let store =
        TrustStore::open(&config, journal).map_err(|e| ErrorReply::new(ErrorKind::RuntimeFailure, e))?;
    match (store, approve) {
        (Some(store), Some(name)) => Ok(vec![store.approve(name, peer.uid)?]),
        (Some(store), None) => Ok(store.list()?),
        (None, None) => Ok(crate::decide::trust::untracked(&config)),
        (None, Some(_)) => {
            let why = "keeps no trust stages ([trust] enabled = false, or no tool is declared)";
            Err(ErrorReply::new(ErrorKind::InvalidRequest, format!("{} {why}", policy.display())))
        }
    }
}
