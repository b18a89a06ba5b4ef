//! `palisade changes`: a run's writes held for review, listed, shown with a
//! diff, applied or discarded, through the running broker, or in the
//! embedded broker's own store where none answers (or with `--policy`).

use crate::cli::client::ClientError;
use crate::cli::discovery::BrokerArgs;
use crate::cli::discovery::Route;
use crate::cli::run::EXIT_PALISADE;
use crate::host::requester::Requester;
use clap::Subcommand;
use palisade_cli::json_reply;
use palisade_policy::Config;
use palisade_protocol::wire::{ChangeSetInfo, ClientMessage, ErrorKind, ErrorReply, ServerMessage};
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum ChangesCommand {
    /// Your held change sets: id, run, why it is held, its size.
    List {
        #[command(flatten)]
        at: At,
    },
    /// A change set's paths (each file, link, directory and removal, and
    /// which conflict or are files the host executes) and a unified diff of
    /// its text files against the workspace's.
    Show {
        id: String,
        /// Print the run's names and the diff as they are, control
        /// characters and all (by default they are shown escaped: a
        /// terminal acts on them).
        #[arg(long)]
        raw: bool,
        #[command(flatten)]
        at: At,
    },
    /// Apply a change set to the workspace: each entry swapped into place
    /// and checked. A path someone else changed since stays as it is (the
    /// change set keeps the run's version) unless --overwrite; a file the
    /// host executes (a git hook, ...) stays unless --host-executed.
    /// Applying a change set a stopped apply left finishes it. Exits 123
    /// when part of it stays held.
    Apply {
        id: String,
        /// Apply the run's version over paths someone else changed since.
        #[arg(long)]
        overwrite: bool,
        /// Apply files the host executes too (a git hook, .envrc, ...):
        /// look at `palisade changes show` first.
        #[arg(long)]
        host_executed: bool,
        #[command(flatten)]
        at: At,
    },
    /// Drop a change set: its writes are not applied.
    Discard {
        id: String,
        #[command(flatten)]
        at: At,
    },
}

/// Where the change sets are, and how to print them.
#[derive(clap::Args, Debug)]
pub struct At {
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// The embedded broker's change sets under this policy file, instead of a running broker's.
    #[arg(long, value_name = "FILE", conflicts_with = "socket")]
    pub policy: Option<PathBuf>,
    /// Print the reply as JSON.
    #[arg(long)]
    pub json: bool,
}

fn fail(kind: ErrorKind, message: impl std::fmt::Display) -> i32 {
    eprintln!("palisade: {kind}: {message}");
    EXIT_PALISADE
}

/// `palisade changes`.
pub fn main(command: ChangesCommand) -> i32 {
    let mut raw = false;
    let (message, at) = match command {
        ChangesCommand::List { at } => (ClientMessage::ListChanges, at),
        ChangesCommand::Show { id, raw: bytes, at } => {
            raw = bytes;
            (ClientMessage::ShowChanges { id }, at)
        }
        ChangesCommand::Apply { id, overwrite, host_executed, at } => {
            if host_executed && !person_confirms(&id) {
                return fail(
                    ErrorKind::NeedsApproval,
                    "files the host executes are applied by a person at a terminal: look at `palisade changes show` and answer yes",
                );
            }
            (ClientMessage::ApplyChanges { id, overwrite, host_executed }, at)
        }
        ChangesCommand::Discard { id, at } => (ClientMessage::DiscardChanges { id }, at),
    };
    let reply = match ask(&at, message) {
        Ok(r) => r,
        Err(e) => return json_reply(at.json, e),
    };
    if at.json {
        return match reply {
            ServerMessage::Error(e) => json_reply(true, e),
            other => {
                palisade_cli::outln!("{}", serde_json::to_string(&reply_value(&other)).unwrap_or_default());
                not_all_applied(&other)
            }
        };
    }
    print(reply, raw)
}

/// A person at this process's terminal says yes to applying what the host
/// executes (no terminal: nobody does).
fn person_confirms(id: &str) -> bool {
    use std::io::{BufRead, Write};
    let Ok(mut tty) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty") else {
        return false;
    };
    let asked =
        write!(tty, "Apply the files of change set {id} that the host executes (git hooks, ...)? [y/N] ");
    let mut answer = String::new();
    asked.is_ok()
        && std::io::BufReader::new(tty).read_line(&mut answer).is_ok()
        && matches!(answer.trim(), "y" | "yes")
}

/// The reply's body, as JSON.
fn reply_value(reply: &ServerMessage) -> serde_json::Value {
    let value = serde_json::to_value(reply).unwrap_or_default();
    value.as_object().and_then(|o| o.values().next().cloned()).unwrap_or(value)
}

/// The reply of the running broker; else of the embedded broker's store.
fn ask(at: &At, message: ClientMessage) -> Result<ServerMessage, ErrorReply> {
    if at.policy.is_none() {
        // Only the user's own change sets are read here without a broker:
        // nothing runs, so a required system broker does not stop it.
        match crate::cli::discovery::find(at.broker.socket.as_deref(), false) {
            Ok(Route::Broker(mut found)) => {
                return match found.client.request(&message) {
                    Ok(r) => Ok(r),
                    Err(ClientError::Reply(e)) => Ok(ServerMessage::Error(e)),
                    Err(e) => Err(ErrorReply::new(ErrorKind::Unavailable, format!("{}: {e}", found.name()))),
                };
            }
            Ok(Route::Embedded { .. }) => {}
            Err(e) => return Err(ErrorReply::new(e.kind(), e.to_string())),
        }
    }
    let config = match at.policy.as_deref().map(Config::load).transpose() {
        Ok(c) => c.unwrap_or_default(),
        Err(e) => return Err(ErrorReply::new(ErrorKind::InvalidRequest, e.to_string())),
    };
    let store = crate::engine::linux::changes_store(&config)
        .map_err(|e| ErrorReply::new(ErrorKind::RuntimeFailure, e))?;
    let journal = crate::journal::Journal::from_config(&config)
        .map_err(|e| ErrorReply::new(ErrorKind::JournalUnavailable, e))?;
    let store = std::sync::Arc::new(store);
    recover(&config, &store, &journal);
    // The embedded broker's user is the person at this terminal.
    Ok(crate::changes::review::serve(&store, &journal, &Requester::me(), true, message))
}

/// The writes of this user's runs whose embedded broker was killed before
/// it settled them, held first (see [`crate::changes::recover`]).
fn recover(
    config: &Config,
    store: &std::sync::Arc<crate::changes::Store>,
    journal: &crate::journal::Journal,
) {
    let me = nix::unistd::geteuid().as_raw();
    if store.orphans(Some(me)).is_empty() {
        let events = crate::changes::stopped_applies(store, Some(me));
        if !events.is_empty() {
            if let Err(e) = journal.append_all_blocking(events, true) {
                tracing::error!("what became of an apply left part-way is not recorded: {e}");
            }
        }
        return;
    }
    let Ok(temp_root) = crate::host::paths::temp_root(config.policy.temp_root.as_deref()) else { return };
    let owned = crate::decide::owned::owned(config, journal.dir(), &temp_root.path, &[]);
    let extra: Vec<String> = config.policy.host_executed.iter().map(|g| g.get_ref().clone()).collect();
    let keep_out = crate::changes::KeepOut {
        owned: owned.into(),
        host_executed: std::sync::Arc::new(palisade_policy::host_executed::HostExecuted::new(&extra)),
        store: store.clone(),
        journal: journal.clone(),
    };
    let events = crate::changes::recover(&keep_out, Some(me));
    if events.is_empty() {
        return;
    }
    if let Err(e) = journal.append_all_blocking(events, true) {
        tracing::error!("what became of the writes of runs left unsettled is not recorded: {e}");
    }
}

/// A reply printed for a person; `raw` (`changes show --raw`): the run's
/// names and the diff as they are, else escaped (see [`palisade_cli::escape`]).
fn print(reply: ServerMessage, raw: bool) -> i32 {
    let shown =
        |name: &str| if raw { name.to_owned() } else { palisade_cli::escape::name(name).into_owned() };
    match reply {
        ServerMessage::ChangeSets(sets) if sets.is_empty() => palisade_cli::outln!("no change set is held"),
        ServerMessage::ChangeSets(sets) => sets.iter().for_each(|s| palisade_cli::outln!("{}", line(s))),
        ServerMessage::ChangeSet(d) => {
            palisade_cli::outln!("{}", line(&d.info));
            for e in &d.entries {
                let mut notes = Vec::new();
                if e.conflict {
                    notes.push("conflict: changed on the host since".to_string());
                }
                notes.extend(e.host_executed.iter().map(|w| format!("the host executes it: {}", shown(w))));
                let notes =
                    if notes.is_empty() { String::new() } else { format!("  ({})", notes.join("; ")) };
                palisade_cli::outln!("  {:<7} {}{notes}", e.kind, shown(&e.path));
            }
            match raw {
                true => palisade_cli::out!("{}", d.diff),
                false => palisade_cli::out!("{}", palisade_cli::escape::text(&d.diff)),
            }
        }
        ServerMessage::ChangesApplied(c) => {
            palisade_cli::outln!(
                "{}",
                crate::cli::run::summary(&c, false).unwrap_or_else(|| "nothing was left to apply".into())
            );
            return not_all_applied(&ServerMessage::ChangesApplied(c));
        }
        ServerMessage::ChangesDiscarded { id } => palisade_cli::outln!("change set {id}: discarded"),
        ServerMessage::Error(e) => return fail(e.kind, e.message),
        other => return fail(ErrorKind::ProtocolError, format!("unexpected reply {other:?}")),
    }
    0
}

/// The exit status of `reply`: an apply that left part of its change set
/// held (a conflict, a file the host executes, a write that failed) exits
/// as a run whose writes did not all land.
fn not_all_applied(reply: &ServerMessage) -> i32 {
    match reply {
        ServerMessage::ChangesApplied(c) if !c.all_landed() => palisade_cli::EXIT_NOT_APPLIED,
        _ => 0,
    }
}

fn line(s: &ChangeSetInfo) -> String {
    let mut flags = Vec::new();
    if s.conflicts > 0 {
        flags.push(format!("{} conflict(s)", s.conflicts));
    }
    if s.host_executed > 0 {
        flags.push(format!("{} the host executes", s.host_executed));
    }
    let flags = if flags.is_empty() { String::new() } else { format!(", {}", flags.join(", ")) };
    let roots: Vec<_> = s.roots.iter().map(|r| palisade_cli::escape::name(r)).collect();
    // Run ids count from 1 in each broker: the broker makes the run one.
    let broker = s.broker.as_deref().map(|b| format!(" (broker {})", palisade_cli::escape::name(b)));
    format!(
        "{} run {}{} {}: {} entries, {} bytes{flags} ({}) in {}",
        s.id,
        s.run_id,
        broker.unwrap_or_default(),
        s.status,
        s.entries,
        s.bytes,
        palisade_cli::escape::text(&s.reason),
        roots.join(", ")
    )
}
