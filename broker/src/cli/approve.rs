//! The tool commands, `tools show` and `tools approve`: through a running
//! broker, or on the embedded broker's own state with `--policy`. The
//! approval commands are the CLI's own (`palisade_cli::approve`).

use crate::cli::discovery::BrokerArgs;
use crate::decide::approvals::{ApproverAction, Approvers};
use crate::decide::trust::TrustStore;
use crate::host::requester::Peer;
use crate::journal::Journal;
use palisade_cli::approve::{ask_broker, render_tool};
use palisade_cli::render::fail;
use palisade_policy::Config;
use palisade_protocol::wire::{ClientMessage, ErrorKind, ServerMessage, ToolInfo};
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

/// `palisade tools show` and `palisade tools approve`.
pub fn tools(command: ToolsCommand) -> i32 {
    let policy = match &command {
        ToolsCommand::Show { policy, .. } | ToolsCommand::Approve { policy, .. } => policy.clone(),
    };
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
        palisade_cli::out!("{}", render_tool(t, policy.as_deref()));
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
