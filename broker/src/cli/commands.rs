//! palisade: the command-line client. `palisade run` uses a running broker,
//! or an embedded one with the built-in default policy when none answers.

use crate::cli::approve::ToolsCommand;
use crate::cli::client::{Client, ClientError, Event};
use crate::cli::discovery::{self, BrokerArgs, Found, Route, Which};
pub use crate::cli::run::{EXIT_PALISADE, RunArgs, SandboxArgs};
use crate::cli::run::{Render, RenderSink, fail, request};
use crate::decide::service::Broker;
use crate::host::requester::Peer;
use clap::{Args as ClapArgs, Parser, Subcommand};
use palisade_policy::Config;
use palisade_protocol::wire::{ErrorKind, ErrorReply, RunRequest, Stream};
use std::io::Write;
use std::path::PathBuf;

/// Run commands in a kernel-enforced sandbox.
#[derive(Parser, Debug)]
#[command(name = "palisade", version, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a command in a sandbox: through the running broker, or an embedded one.
    ///
    /// Exits with the command's status, 128+N if it died of signal N, and 125
    /// when palisade refused or failed (with a one-line message naming the error kind).
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
    Doctor {
        /// Policy file (for cgroup_root, require_cgroup and the fallback policy).
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
    },
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
    /// The declared tools' trust stages (Draft, Trial, Verified) and declarations.
    #[command(subcommand)]
    Tools(ToolsCommand),
    /// Change sets: a run's writes held for review (a run palisade ended,
    /// --hold-changes, paths someone else changed meanwhile, files the host
    /// executes): list, show with a diff, apply, discard.
    #[command(subcommand)]
    Changes(crate::cli::changes::ChangesCommand),
    /// Read and check the audit journal (see docs/journal.md).
    #[command(subcommand)]
    Audit(crate::cli::audit::AuditCommand),
    /// WebAssembly skill plugins (Tier A): install, list, run, secrets.
    #[command(subcommand)]
    Plugin(crate::cli::plugin::PluginCommand),
    /// Serve palisade's tools to an agent over the Model Context Protocol
    /// (stdio): run_command, run_tool, run_plugin and explain, forwarded to the running
    /// broker, or to one embedded in this process when none answers.
    ///
    /// The sandbox flags are the person's, as for `palisade run`: with an
    /// embedded broker they edit its profile; through a daemon each call
    /// carries them as asks that can only narrow the daemon's policy. See
    /// docs/agents.md.
    Mcp(crate::cli::mcp::McpArgs),
}

#[derive(ClapArgs, Debug)]
pub struct ExplainArgs {
    /// Broker socket to ask [default: $PALISADE_SOCKET, else your broker's,
    /// else the system broker's; the built-in policy decides when none
    /// answers, unless the system configuration requires the system broker].
    #[arg(long, value_name = "PATH", conflicts_with = "policy")]
    pub socket: Option<PathBuf>,
    /// Policy file: decide with it here, instead of asking a running broker.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The writable workspace [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// A tool declared in the policy.
    #[arg(long, value_name = "NAME")]
    pub tool: Option<String>,
    /// A tool parameter, NAME=PATH (repeat NAME for a list).
    #[arg(long = "param", value_name = "NAME=PATH")]
    pub params: Vec<String>,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `palisade run` in its common forms, read without clap: building clap's
/// parser is a good part of a short run's start (its code and allocations
/// fault in pages that nothing else touches). Anything else, a help request,
/// a repeated or unknown option, a malformed value, is `None`: clap parses
/// it, and explains what is wrong. Gives what clap would.
pub fn parse_common_run(args: &[std::ffi::OsString]) -> Option<Cli> {
    let args: Vec<&str> = args.iter().map(|a| a.to_str()).collect::<Option<_>>()?;
    let (&"run", rest) = args.get(1..)?.split_first()? else { return None };
    let split = rest.iter().position(|a| *a == "--")?;
    let (options, command) = (&rest[..split], &rest[split + 1..]);
    if command.is_empty() {
        return None;
    }
    let mut run = RunArgs {
        socket: None,
        workspace: None,
        policy: None,
        timeout: None,
        max_output: None,
        json: false,
        no_stdin: false,
        tool: None,
        params: vec![],
        sandbox: SandboxArgs::default(),
        command: command.iter().map(|c| c.to_string()).collect(),
    };
    let mut i = 0;
    while i < options.len() {
        let (name, inline) = match options[i].split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v)),
            _ => (options[i], None),
        };
        let flag = |set: &mut bool| (!std::mem::replace(set, true) && inline.is_none()).then_some(());
        match name {
            "-n" | "--no-stdin" => flag(&mut run.no_stdin)?,
            "--json" => flag(&mut run.json)?,
            "--socket" | "--workspace" | "--timeout" | "--max-output" => {
                let value = match inline {
                    Some(v) => v,
                    None => {
                        i += 1;
                        options.get(i).copied()?
                    }
                };
                // A value that looks like an option is clap's to judge.
                if value.is_empty() || value.starts_with('-') {
                    return None;
                }
                let path = Some(PathBuf::from(value));
                match name {
                    "--socket" if run.socket.is_none() => run.socket = path,
                    "--workspace" if run.workspace.is_none() => run.workspace = path,
                    "--timeout" if run.timeout.is_none() => run.timeout = Some(value.parse().ok()?),
                    "--max-output" if run.max_output.is_none() => run.max_output = Some(value.parse().ok()?),
                    _ => return None,
                }
            }
            _ => return None,
        }
        i += 1;
    }
    Some(Cli { command: Command::Run(run) })
}

pub fn main(cli: Cli) -> i32 {
    // A run through a broker logs nothing of its own unless asked to: the
    // subscriber's set-up is a good part of a short-lived CLI's start. The
    // embedded broker, explain and doctor set it up (warnings).
    let asked = std::env::var_os("PALISADE_LOG").is_some() || std::env::var_os("RUST_LOG").is_some();
    if asked || !matches!(cli.command, Command::Run(_)) {
        crate::serve::daemon::init_tracing("warn");
    }
    match cli.command {
        Command::Run(args) => run(args),
        Command::Explain(args) => explain(args),
        Command::Audit(command) => crate::cli::audit::main(command),
        Command::Doctor { policy } => {
            let config = match policy.as_deref().map(Config::load).transpose() {
                Ok(c) => c.unwrap_or_default(),
                Err(e) => return fail(ErrorKind::InvalidRequest, e),
            };
            let (text, complete) = crate::cli::doctor::report(&config);
            print!("{text}");
            if complete { 0 } else { 1 }
        }
        Command::Approvals { broker, json } => crate::cli::approve::list(&broker, json),
        Command::Approve { id, broker } => crate::cli::approve::answer(&broker, id, true, None),
        Command::Deny { id, reason, broker } => crate::cli::approve::answer(&broker, id, false, reason),
        Command::Tools(command) => crate::cli::approve::tools(command),
        Command::Status { broker, json } => crate::cli::status::status(&broker, json),
        Command::Changes(command) => crate::cli::changes::main(command),
        Command::Plugin(command) => crate::cli::plugin::main(command),
        Command::Mcp(args) => crate::cli::mcp::main(args),
    }
}

fn explain(args: ExplainArgs) -> i32 {
    let mut by = "decided here".to_string();
    if args.policy.is_none() {
        match discovery::find(args.socket.as_deref(), true) {
            Ok(Route::Broker(found)) => return explain_by(found, args),
            Ok(Route::Embedded { tried }) => by = format!("no broker answers on {tried}: decided here"),
            Err(e) => return fail(e.kind(), e),
        }
    }
    let mut config = match args.policy.as_deref().map(Config::load).transpose() {
        Ok(c) => c.unwrap_or_default(),
        Err(e) => return fail(ErrorKind::InvalidRequest, e),
    };
    // Nothing is written: the /etc entries are shown bound one by one, as the
    // CLI's embedded broker binds them (palisaded binds a copy of the same),
    // and the tools' trust stages are neither read nor reconciled.
    config.broker.etc_snapshot = false;
    // Nothing runs, so nothing is recorded.
    config.journal.enabled = false;
    config.trust.enabled = false;
    let run_args = RunArgs {
        workspace: args.workspace,
        tool: args.tool,
        params: args.params,
        ..explain_run(args.sandbox, args.command)
    };
    let edited = std::env::current_dir()
        .map_err(|e| format!("current directory: {e}"))
        .and_then(|cwd| run_args.sandbox.edit(&mut config, &cwd));
    if let Err(e) = edited {
        return fail(ErrorKind::InvalidRequest, e);
    }
    let request = match request(&run_args, false) {
        Ok(r) => r,
        Err(e) => return fail(ErrorKind::InvalidRequest, e),
    };
    let broker = match Broker::assemble(config, None) {
        Ok(b) => b,
        Err(e) => return fail(ErrorKind::RuntimeFailure, e),
    };
    let settings = broker.settings();
    let decision = settings.policy.decide(&broker.host(&broker.context), &broker.context, &request);
    let source = settings.config().source_name();
    let explained = palisade_policy::explain::explanation(&decision, source);
    show_explanation(&explained, &by)
}

/// `palisade explain` through the broker `found`: its policy decides.
fn explain_by(found: Found, args: ExplainArgs) -> i32 {
    let name = found.name();
    let (mut client, socket) = (found.client, found.socket);
    let run_args = RunArgs {
        workspace: args.workspace,
        tool: args.tool,
        params: args.params,
        ..explain_run(args.sandbox, args.command)
    };
    let request = match request(&run_args, false) {
        Ok(r) => r,
        Err(e) => return fail(ErrorKind::InvalidRequest, e),
    };
    match client.request(&palisade_protocol::wire::ClientMessage::Explain(request)) {
        Ok(palisade_protocol::wire::ServerMessage::Explained(e)) => show_explanation(&e, &name),
        Ok(other) => fail(ErrorKind::RuntimeFailure, format!("the broker answered {other:?}")),
        Err(ClientError::Reply(e)) => fail(e.kind, e.message),
        Err(e) => fail(ErrorKind::RuntimeFailure, format!("{}: {e}", socket.display())),
    }
}

/// The decision, then which policy made it; 0 when the run is allowed.
fn show_explanation(e: &palisade_protocol::wire::Explanation, by: &str) -> i32 {
    print!("{}", e.text);
    println!("policy:   {} ({by})", e.policy);
    if e.decision == "allow" { 0 } else { 1 }
}

/// The run `palisade explain` asks about: no stdin, nothing else set.
fn explain_run(sandbox: SandboxArgs, command: Vec<String>) -> RunArgs {
    RunArgs {
        socket: None,
        workspace: None,
        policy: None,
        timeout: None,
        max_output: None,
        json: false,
        no_stdin: true,
        tool: None,
        params: vec![],
        sandbox,
        command,
    }
}

fn run(args: RunArgs) -> i32 {
    let mut render = Render::new(args.json);
    // Failures before any run are reported like the broker's: one line, or the JSON object.
    let refuse =
        |kind: ErrorKind, message: String| Render::new(args.json).finish(Err(ErrorReply::new(kind, message)));
    let request = match request(&args, !args.no_stdin) {
        Ok(r) => r,
        Err(e) => return refuse(ErrorKind::InvalidRequest, e),
    };
    // The embedded broker's policy, with the flags' edits.
    let own_policy = |config: Result<Config, String>| {
        let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
        let mut config = config?;
        args.sandbox.edit(&mut config, &cwd)?;
        Ok::<_, String>(config)
    };
    if let Some(policy) = &args.policy {
        if let Err(e) = discovery::may_embed(discovery::POLICY_EMBEDS) {
            return refuse(e.kind(), e.to_string());
        }
        return match own_policy(Config::load(policy).map_err(|e| e.to_string())) {
            Ok(config) => embedded(config, request, render),
            Err(e) => refuse(ErrorKind::InvalidRequest, e),
        };
    }
    match discovery::find(args.socket.as_deref(), true) {
        Ok(Route::Broker(found)) => {
            // Said once, and only of a broker that is not the user's own
            // (with --json, the object's `broker` says it).
            if found.which == Which::System && !args.json {
                eprintln!("palisade: run by {}", found.name());
            }
            render.by(found.name());
            via_socket(found.client, request, render)
        }
        Ok(Route::Embedded { tried }) => {
            tracing::debug!("no broker answers on {tried}: running an embedded one");
            match own_policy(Ok(Config::default())) {
                Ok(config) => embedded(config, request, render),
                Err(e) => refuse(ErrorKind::InvalidRequest, e),
            }
        }
        Err(e) => refuse(e.kind(), e.to_string()),
    }
}

/// The answer of the person at this process's terminal; `None` when there
/// is no terminal to ask (nobody answered).
fn terminal_answer(question: &str) -> Option<bool> {
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty") {
        Ok(tty) => Some(prompt(tty, question)),
        Err(_) => {
            eprintln!("palisade: the run needs approval and there is no terminal to ask: {question}");
            None
        }
    }
}

/// Puts `question` at the terminal `tty`; "y" or "yes" approves.
fn prompt(mut tty: std::fs::File, question: &str) -> bool {
    if write!(tty, "palisade: {question} [y/N] ").and_then(|()| tty.flush()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let mut reader = std::io::BufReader::new(tty);
    std::io::BufRead::read_line(&mut reader, &mut answer).is_ok()
        && matches!(answer.trim(), "y" | "Y" | "yes" | "Yes" | "YES")
}

/// A run held for approval, put to the requester: at its terminal when it
/// may answer, while an approver elsewhere may answer first (no terminal:
/// refused, as nobody here can answer); otherwise it says who can, and waits.
fn ask_requester(ask: crate::cli::client::Ask<'_>) -> Option<bool> {
    let details = crate::cli::approve::describe(ask.approval);
    let id = ask.approval.id;
    if !ask.may_answer {
        eprintln!(
            "palisade: {}\n{details}palisade: waiting for an approver: palisade approve {id} (or palisade deny {id})",
            ask.reason
        );
        return None;
    }
    let Ok(tty) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty") else {
        eprintln!("palisade: the run needs approval and there is no terminal to ask: {}", ask.reason);
        return Some(false);
    };
    let question = format!("{}\n{details}Run it? (or elsewhere: palisade approve {id})", ask.reason);
    let answerer = ask.answerer;
    // The prompt waits on its own thread: an answer from elsewhere ends the
    // wait, and the process, without it.
    std::thread::spawn(move || {
        let approved = prompt(tty, &question);
        let _ = answerer.send(approved);
    });
    None
}

fn via_socket(mut client: Client, request: RunRequest, mut render: Render) -> i32 {
    if !render.json() {
        // Large output into a pipe (`palisade run ... | next`) is spliced:
        // the CLI does not copy it through its own memory.
        for (stream, fd) in [(Stream::Stdout, libc::STDOUT_FILENO), (Stream::Stderr, libc::STDERR_FILENO)] {
            // SAFETY: the standard streams stay open for the process's whole life.
            client.splice_output_to(stream, unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) });
        }
    }
    let on = |event: Event<'_>| {
        if let Event::Output(stream, data) = event {
            render.output(stream, data);
        }
    };
    let outcome = client.run_events(request, on, ask_requester);
    match outcome {
        Ok(r) => render.finish(Ok(r)),
        Err(ClientError::Reply(e)) => render.finish(Err(e)),
        Err(e) => render.finish(Err(ErrorReply::new(ErrorKind::RuntimeFailure, e.to_string()))),
    }
}

/// A broker inside this process, under `config`.
fn embedded(mut config: Config, request: RunRequest, mut render: Render) -> i32 {
    crate::serve::daemon::init_tracing("warn");
    // One run: its helper is started while the broker decides, and no other.
    config.broker.prespawn = 0;
    // Nor a copy of /etc kept for runs to come: binding the entries is cheaper once.
    config.broker.etc_snapshot = false;
    // Before any thread exists: the probe of user namespaces forks.
    render.by(format!("embedded (policy: {})", config.source_name()));
    let broker = match Broker::assemble_one_run(config) {
        Ok(b) => b,
        Err(e) => return fail(ErrorKind::RuntimeFailure, e),
    };
    let (uid, gid) = (broker.context.uid, broker.context.gid);
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => return fail(ErrorKind::RuntimeFailure, e),
    };
    let groups = crate::host::requester::Requester::me().groups;
    let peer = Peer { uid, gid, pid: Some(std::process::id() as i32), groups };
    let outcome = runtime.block_on(async {
        let cancel = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        let mut decided = broker.decide(&peer, &request)?;
        if let Some(reason) = &decided.approval {
            let question = broker.pending_approval(&peer, &decided, &request, reason);
            ask_embedded(&broker, &peer, question).await?;
            // Only an approver answers here.
            decided.approver_approved = true;
        }
        broker.execute(&peer, decided, &request, &mut RenderSink(&mut render), cancel).await
    });
    // Not waiting for an output write given up on (a reader that never reads).
    runtime.shutdown_background();
    render.finish(outcome.map_err(ErrorReply::from))
}

/// The embedded broker's question: nobody else to ask, so the person at
/// this terminal answers, if they are an approver (the broker's own user
/// is one, unless `[approvers]` says otherwise); anyone else is refused.
async fn ask_embedded(
    broker: &Broker,
    peer: &Peer,
    question: crate::decide::service::Question,
) -> Result<(), crate::error::BrokerError> {
    use crate::journal::Event;
    let (reason, run_id) = (question.pending.reason.clone(), question.pending.run_id);
    let ticket = broker.pending.open(question.pending, Some(question.run));
    let approval = ticket.pending.id;
    let approvers = broker.settings().approvers.clone();
    if !approvers.is_approver(peer) {
        let why = format!(
            "uid {} is not an approver of this policy and nobody else can answer here: \
             a running broker (palisaded) with approvers is needed",
            peer.uid
        );
        return Err(crate::decide::service::not_approved(&reason, &why).into());
    }
    // An approver still answers only where the Cedar policies' `approve` permits it.
    let run = ticket.run.as_deref();
    approvers.authorize(peer, crate::decide::approvals::ApproverAction::Approve(&ticket.pending, run))?;
    let tool = ticket.pending.tool.clone();
    let asked = Event::ApprovalAsked { approval, run_id, uid: peer.uid, tool, reason: reason.clone() };
    broker.journal.append(asked).await?;
    let question = format!("{reason}\n{}Run it?", crate::cli::approve::describe(&ticket.pending));
    let answer = tokio::task::spawn_blocking(move || terminal_answer(&question)).await.unwrap_or(None);
    let approved = answer == Some(true);
    let why = match answer {
        Some(true) => "approved at the terminal",
        Some(false) => "refused",
        None => "no terminal to ask",
    };
    let by_uid = answer.map(|_| peer.uid);
    let answered = Event::ApprovalAnswered { approval, run_id, by_uid, approved, why: why.into() };
    broker.journal.append(answered).await?;
    if approved { Ok(()) } else { Err(crate::decide::service::not_approved(&reason, why).into()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<std::ffi::OsString> {
        std::iter::once("palisade").chain(words.iter().copied()).map(Into::into).collect()
    }

    /// Every sequence of up to four of these words before `-- cmd`: whenever
    /// the common form is recognized, clap reads the same; common forms are.
    #[test]
    fn the_common_run_forms_read_as_clap_reads_them() {
        let words = [
            "-n",
            "--no-stdin",
            "--json",
            "--json=1",
            "--socket",
            "/s",
            "--socket=/s",
            "--socket=",
            "--workspace",
            "w",
            "--timeout",
            "5",
            "--timeout=x",
            "--max-output",
            "-1",
            "10",
            "-h",
            "--tool",
            "t",
            "run",
            "--",
        ];
        let mut sequences: Vec<Vec<&str>> = vec![vec![]];
        for _ in 0..4 {
            let longer: Vec<Vec<&str>> = sequences
                .iter()
                .filter(|s| s.len() == sequences.last().map_or(0, Vec::len))
                .flat_map(|s| words.iter().map(move |w| [s.clone(), vec![*w]].concat()))
                .collect();
            sequences.extend(longer);
        }
        let mut recognized = 0;
        for options in &sequences {
            for command in [&["cmd", "--json"][..], &[][..]] {
                let line: Vec<&str> =
                    ["run"].iter().chain(options).chain(&["--"]).chain(command).copied().collect();
                let args = argv(&line);
                if let Some(fast) = parse_common_run(&args) {
                    recognized += 1;
                    let clap =
                        Cli::try_parse_from(&args).map(|c| format!("{c:?}")).map_err(|e| e.to_string());
                    assert_eq!(Ok(format!("{fast:?}")), clap, "{line:?}");
                }
            }
        }
        assert!(recognized > 1000, "only {recognized} forms recognized");
        for common in [
            &["run", "--", "true"][..],
            &["run", "-n", "--socket", "/run/p.sock", "--", "ls", "-la"],
            &["run", "--json", "--timeout=30", "--max-output", "1000", "--workspace", "ws", "--", "make"],
        ] {
            assert!(parse_common_run(&argv(common)).is_some(), "{common:?}");
        }
        for other in [
            &["run", "--help"][..],
            &["run", "--policy", "p.toml", "--", "true"],
            &["run", "--tool", "t", "--", "true"],
            &["run", "true"],
            &["run", "--"],
            &["explain", "--", "true"],
            &["--version"],
        ] {
            assert!(parse_common_run(&argv(other)).is_none(), "{other:?}");
        }
    }
}
