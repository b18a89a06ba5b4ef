//! `palisade`, the command-line client. It links no broker: a run and an
//! explanation go to the running broker's socket, and so do the approval
//! commands and `status`; without a broker, and for the commands that work
//! on the broker's own state (doctor, tools, changes, audit, plugin, mcp),
//! it hands the process over to `palisaded cli`, which serves the same
//! command line with the broker's code (an embedded broker for a run).

#[cfg(target_os = "linux")]
pub mod approve;
#[cfg(target_os = "linux")]
pub mod arena;
pub mod args;
#[cfg(target_os = "linux")]
pub mod client;
#[cfg(target_os = "linux")]
pub mod common;
#[cfg(target_os = "linux")]
pub mod discovery;
pub mod escape;
#[cfg(unix)]
pub mod init;
pub mod out;
#[cfg(unix)]
pub mod render;
#[cfg(target_os = "linux")]
pub mod run;
#[cfg(target_os = "linux")]
pub mod session;
#[cfg(target_os = "linux")]
pub mod status;
#[cfg(unix)]
pub mod tty;

use args::{BrokerArgs, ExplainArgs, RunArgs};
use clap::{Parser, Subcommand};
use palisade_protocol::wire::ErrorKind;
use std::ffi::OsString;

/// Run commands in a kernel-enforced sandbox.
#[derive(Parser, Debug)]
#[command(name = "palisade", version, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The commands. Those served by `palisaded cli` take their arguments
/// there ([`Handed`]); their help is its.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a command in a sandbox: through the running broker, or an embedded one.
    ///
    /// Exits with the command's status, 128+N if it died of signal N, and 125
    /// when palisade refused or failed (with a one-line message naming the error kind).
    /// When the command ended by itself but its writes did not all land in the
    /// workspace (held for review, partly applied, or discarded), 123: the
    /// command's own status is in the line on stderr and in --json's result.
    Run(RunArgs),
    /// Print the policy's decision for a command and, when it is allowed, the
    /// sandbox it would get (mounts, Landlock rules, limits, seccomp) and the
    /// Cedar policies that permitted it, without running anything. Exits 0
    /// when allowed, 1 otherwise. A declared tool's trust stage is not
    /// consulted: this is the run it would be once approved.
    Explain(ExplainArgs),
    /// Print what this host can enforce (cgroups, user namespaces, Landlock,
    /// seccomp) and the tier palisade will use. Changes nothing. Exits 0 when
    /// everything Tier C needs is there, 1 otherwise.
    Doctor(Handed),
    /// List the runs waiting for an approval: all of them for an approver,
    /// your own otherwise. Exits 0, or 125 when the broker cannot be asked.
    Approvals {
        #[command(flatten)]
        broker: BrokerArgs,
        /// Print them as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Approve the waiting run ID (an approver, or its requester with
    /// self_approval on): it starts at once. Exits 0, or 125 when refused.
    Approve {
        /// The approval's id, as `palisade approvals` lists it.
        id: u64,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// Deny the waiting run ID: it is refused with your reason. Exits 0, or
    /// 125 when refused.
    Deny {
        /// The approval's id, as `palisade approvals` lists it.
        id: u64,
        /// Why, shown to the requester.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// Print the running broker's state: its version, uptime, runs in
    /// flight and queued, the warm pool, the journal's head, its cgroups,
    /// and the configuration in force with when it was (re)loaded. Any user
    /// the broker serves may ask. Exits 0, or 125 when the broker cannot be
    /// asked.
    Status {
        #[command(flatten)]
        broker: BrokerArgs,
        /// Print it as one JSON object (docs/protocol.md, "Status").
        #[arg(long)]
        json: bool,
    },
    /// Sessions: sandboxes that stay for the commands run in them, through
    /// the running broker: start, exec, list, stop.
    #[cfg(target_os = "linux")]
    #[command(subcommand)]
    Session(session::SessionCommand),
    /// The declared tools' trust stages (Draft, Trial, Verified) and
    /// declarations: list (what `palisade tools` alone does), show, approve.
    Tools(Handed),
    /// Change sets: a run's writes held for review (a run palisade ended,
    /// --hold-changes, paths someone else changed meanwhile, files the host
    /// executes): list, show with a diff, apply, discard.
    Changes(Handed),
    /// Read and check the audit journal (see docs/journal.md).
    Audit(Handed),
    /// WebAssembly skill plugins (Tier A): install, list, run, secrets.
    Plugin(Handed),
    /// Serve palisade's tools to an agent over the Model Context Protocol
    /// (stdio): run_command, run_tool, run_plugin, explain and sessions, forwarded to the running
    /// broker, or to one embedded in this process when none answers.
    ///
    /// The sandbox flags are the person's, as for `palisade run`: with an
    /// embedded broker, or your own daemon, they widen its profile; through
    /// the system broker each call carries them as asks that can only narrow
    /// its policy. A
    /// declared tool's call (run_tool, or explain naming a tool) runs the
    /// tool as declared: without --profile and the flags that edit it, only
    /// --hold-changes, --no-fork and --no-toolchains go with it. See
    /// docs/agents.md.
    Mcp(Handed),
    /// Write the starter configuration of your own palisade (profiles the
    /// documentation's examples use, such as `sh`) where your daemon and an
    /// embedded broker read it: $XDG_CONFIG_HOME/palisade/palisade.toml, else
    /// ~/.config/palisade/palisade.toml. An existing file is kept unless
    /// --force. Exits 0, or 125.
    #[cfg(unix)]
    Init(init::InitArgs),
}

/// A command `palisaded cli` serves: its arguments, `--help` included, are
/// read there.
#[derive(clap::Args, Debug)]
#[command(disable_help_flag = true)]
pub struct Handed {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0.., value_name = "ARGS")]
    pub args: Vec<OsString>,
}

/// Serves `cli`, read from `argv` (this process's arguments, handed over
/// untouched when `palisaded cli` serves the command); the exit status.
#[cfg(target_os = "linux")]
pub fn main(cli: Cli, argv: &[OsString]) -> i32 {
    match cli.command {
        Command::Run(args) => run::run(args, argv),
        Command::Explain(args) => run::explain(args, argv),
        Command::Approvals { broker, json } => approve::list(&broker, json),
        Command::Approve { id, broker } => approve::answer(&broker, id, true, None),
        Command::Deny { id, reason, broker } => approve::answer(&broker, id, false, reason),
        Command::Status { broker, json } => status::status(&broker, json),
        Command::Session(command) => session::main(command),
        Command::Init(args) => init::main(args),
        Command::Doctor(_)
        | Command::Tools(_)
        | Command::Changes(_)
        | Command::Audit(_)
        | Command::Plugin(_)
        | Command::Mcp(_) => hand_over(argv),
    }
}

/// Elsewhere `palisaded cli` serves every command: macOS's embedded
/// broker and its client are its own (`mac/` of the broker), and a system
/// without a sandbox refuses there, with the reason.
#[cfg(not(target_os = "linux"))]
pub fn main(cli: Cli, argv: &[OsString]) -> i32 {
    match cli.command {
        #[cfg(unix)]
        Command::Init(args) => init::main(args),
        _ => hand_over(argv),
    }
}

/// Exit status when palisade refused or failed (not the command).
pub const EXIT_PALISADE: i32 = 125;

/// Exit status of a run whose command ended by itself but whose writes did
/// not all land on the host as it left them: held for review, partly
/// applied, or discarded (the command's own status is the result's, and
/// the line on stderr says what became of the writes).
pub const EXIT_NOT_APPLIED: i32 = 123;

/// Says why palisade refused or failed, in one line naming the error kind;
/// the exit status of that.
pub fn fail(kind: ErrorKind, message: impl std::fmt::Display) -> i32 {
    eprintln!("palisade: {kind}: {message}");
    EXIT_PALISADE
}

/// As [`fail`], or with `json` as one object on stdout,
/// `{"error": {"kind": ..., "message": ...}}`, for a program to read.
pub fn json_fail(json: bool, kind: ErrorKind, message: impl std::fmt::Display) -> i32 {
    json_reply(json, palisade_protocol::wire::ErrorReply::new(kind, message.to_string()))
}

/// A broker's error as it came (its `rule` and `helper` too): its line, or
/// with `json` the object `{"error": ...}` on stdout.
pub fn json_reply(json: bool, error: palisade_protocol::wire::ErrorReply) -> i32 {
    if !json {
        return fail(error.kind, error.message);
    }
    outln!("{}", serde_json::json!({ "error": error }));
    EXIT_PALISADE
}

/// The first argument of `palisaded` that makes it serve a `palisade`
/// command line (the rest of its arguments).
pub const HANDED_OVER: &str = "cli";

/// Replaces this process with `palisaded cli ARGS...` (`argv` without its
/// first word), the `palisaded` installed beside this executable: it
/// serves the command with the broker's code. Returns only on failure,
/// with the exit status of palisade failing. (Without `exec`, as on
/// Windows, it waits for `palisaded` and returns its status.)
pub fn hand_over(argv: &[OsString]) -> i32 {
    let kind = ErrorKind::RuntimeFailure;
    let daemon = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name(format!("palisaded{}", std::env::consts::EXE_SUFFIX)),
        Err(e) => return fail(kind, format!("own executable: {e}")),
    };
    let mut command = std::process::Command::new(&daemon);
    command.arg(HANDED_OVER).args(argv.iter().skip(1));
    #[cfg(unix)]
    let e = std::os::unix::process::CommandExt::exec(&mut command);
    #[cfg(not(unix))]
    let e = match command.status() {
        Ok(status) => return status.code().unwrap_or(EXIT_PALISADE),
        Err(e) => e,
    };
    let why = format!(
        "{}: {e}: palisade runs embedded brokers and its broker-side commands with the palisaded installed beside it",
        daemon.display()
    );
    fail(kind, why)
}
