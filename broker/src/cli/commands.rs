//! `palisaded cli`: the whole command line of `palisade`, served with the
//! broker's code. `palisade run` uses a running broker, or an embedded one
//! with the built-in default policy when none answers. (Its help and manual
//! pages are these definitions'; the CLI's own are checked against them.)

use crate::cli::approve::ToolsArgs;
use crate::cli::discovery::{self, BrokerArgs, Route, Which};
pub use crate::cli::run::{EXIT_PALISADE, RunArgs, SandboxArgs};
use crate::cli::run::{Render, RenderSink, fail, request};
use crate::decide::service::Broker;
use crate::host::requester::Peer;
use clap::{Parser, Subcommand};
use palisade_cli::args::{ExplainArgs, explain_run};
use palisade_cli::json_fail;
use palisade_cli::run::{explain_by, show_explanation, terminal_answer, via_socket};
use palisade_policy::Config;
use palisade_protocol::wire::{ErrorKind, ErrorReply, RunRequest};
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
    Doctor {
        /// Policy file (for cgroup_root, require_cgroup and the fallback policy).
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Print it as one JSON object (README.md lists its fields).
        #[arg(long)]
        json: bool,
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
    /// Sessions: sandboxes that stay for the commands run in them, through
    /// the running broker: start, exec, list, stop.
    #[cfg(target_os = "linux")]
    #[command(subcommand)]
    Session(palisade_cli::session::SessionCommand),
    /// The declared tools' trust stages (Draft, Trial, Verified) and
    /// declarations: list (what `palisade tools` alone does), show, approve.
    Tools(ToolsArgs),
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
    Mcp(crate::cli::mcp::McpArgs),
    /// Write the starter configuration of your own palisade (profiles the
    /// documentation's examples use, such as `sh`) where your daemon and an
    /// embedded broker read it: $XDG_CONFIG_HOME/palisade/palisade.toml, else
    /// ~/.config/palisade/palisade.toml. An existing file is kept unless
    /// --force. Exits 0, or 125.
    Init(palisade_cli::init::InitArgs),
}

/// `palisaded cli ARGS...`: the command line `palisade` handed over
/// (`palisade_cli::hand_over`), read as `palisade ARGS...`; the exit status.
pub fn handed_over(args: impl Iterator<Item = std::ffi::OsString>) -> i32 {
    let argv: Vec<std::ffi::OsString> = std::iter::once("palisade".into()).chain(args).collect();
    // An embedded run in its common forms skips clap here too.
    if let Some(palisade_cli::Cli { command: palisade_cli::Command::Run(run) }) =
        palisade_cli::common::parse_common_run(&argv)
    {
        return main(Cli { command: Command::Run(run) });
    }
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        // --help and --version exit 0; a usage error is palisade failing, not the command.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let _ = e.print();
            return EXIT_PALISADE;
        }
    };
    main(cli)
}

pub fn main(cli: Cli) -> i32 {
    // A broker this process embeds is its user's, root's included (the audit
    // commands read the journals where they are).
    if !matches!(cli.command, Command::Audit(_)) {
        crate::host::privilege::mark_embedded();
    }
    // A run through a broker logs nothing of its own unless asked to: the
    // subscriber's set-up is a good part of a short-lived CLI's start. The
    // embedded broker, explain and doctor set it up (warnings).
    let asked = std::env::var_os("PALISADE_LOG").is_some() || std::env::var_os("RUST_LOG").is_some();
    if asked || !matches!(cli.command, Command::Run(_)) {
        // rmcp logs each error a call answers (a refusal, for the agent to
        // read) as a warning: those are palisade mcp's own, at debug.
        let mcp = matches!(cli.command, Command::Mcp(_));
        crate::serve::daemon::init_tracing(if mcp { "warn,rmcp::service=error" } else { "warn" });
    }
    match cli.command {
        Command::Run(args) => run(args),
        Command::Explain(args) => explain(args),
        Command::Audit(command) => crate::cli::audit::main(command),
        Command::Doctor { policy, json } => {
            let config = match policy.as_deref().map(Config::load).transpose() {
                Ok(c) => c.unwrap_or_default(),
                Err(e) => return json_fail(json, ErrorKind::InvalidRequest, e),
            };
            let mut report = crate::cli::doctor::report(&config);
            report.runs_go_to = Some(discovery::where_runs_go());
            if json {
                palisade_cli::outln!("{}", serde_json::to_string(&report).unwrap_or_default());
            } else {
                palisade_cli::out!("{}", report.text());
            }
            if report.complete { 0 } else { 1 }
        }
        Command::Approvals { broker, json } => palisade_cli::approve::list(&broker, json),
        Command::Approve { id, broker } => palisade_cli::approve::answer(&broker, id, true, None),
        Command::Deny { id, reason, broker } => palisade_cli::approve::answer(&broker, id, false, reason),
        Command::Tools(command) => crate::cli::approve::tools(command),
        Command::Status { broker, json } => palisade_cli::status::status(&broker, json),
        #[cfg(target_os = "linux")]
        Command::Session(command) => palisade_cli::session::main(command),
        Command::Changes(command) => crate::cli::changes::main(command),
        Command::Plugin(command) => crate::cli::plugin::main(command),
        Command::Mcp(args) => crate::cli::mcp::main(args),
        Command::Init(args) => palisade_cli::init::main(args),
    }
}

fn explain(args: ExplainArgs) -> i32 {
    let json = args.json;
    let mut by = "decided here".to_string();
    if args.policy.is_none() {
        match discovery::find(args.socket.as_deref(), true) {
            Ok(Route::Broker(found)) => return explain_by(*found, args),
            Ok(Route::Embedded { tried }) => by = format!("no broker answers on {tried}: decided here"),
            Err(e) => return json_fail(json, e.kind(), e),
        }
    }
    let config = args.policy.as_deref().map_or_else(Config::own_or_default, Config::load);
    let mut config = match config {
        Ok(c) => c,
        Err(e) => return json_fail(json, ErrorKind::InvalidRequest, e),
    };
    // Nothing is written: the /etc entries are shown bound one by one, as the
    // CLI's embedded broker binds them (palisaded binds a copy of the same),
    // and the tools' trust stages are neither read nor reconciled.
    config.broker.etc_snapshot = false;
    // Nothing runs, so nothing is recorded.
    config.journal.enabled = false;
    config.trust.enabled = false;
    let run_args = explain_run(args);
    let edited = std::env::current_dir()
        .map_err(|e| format!("current directory: {e}"))
        .and_then(|cwd| crate::cli::run::edit(&run_args.sandbox, &mut config, &cwd))
        .and_then(|()| crate::cli::run::raise_limits(&run_args, &mut config));
    if let Err(e) = edited {
        return json_fail(json, ErrorKind::InvalidRequest, e);
    }
    let request = match request(&run_args) {
        Ok(r) => r,
        Err(e) => return json_fail(json, ErrorKind::InvalidRequest, e),
    };
    let broker = match Broker::assemble(config, None) {
        Ok(b) => b,
        Err(e) => return json_fail(json, ErrorKind::RuntimeFailure, e),
    };
    let settings = broker.settings();
    let decision = settings.policy.decide(&broker.host(&broker.context), &broker.context, &request);
    let source = settings.config().source_name();
    let explained = palisade_policy::explain::explanation(&decision, source);
    show_explanation(&explained, &by, json)
}

fn run(args: RunArgs) -> i32 {
    let mut render = Render::new(args.json);
    // Failures before any run are reported like the broker's: one line, or the JSON object.
    let refuse =
        |kind: ErrorKind, message: String| Render::new(args.json).finish(Err(ErrorReply::new(kind, message)));
    // Its stdin is streamed to the run, never read whole first.
    let request = match request(&args) {
        Ok(r) => r,
        Err(e) => return refuse(ErrorKind::InvalidRequest, e),
    };
    // The embedded broker's policy, with the flags' edits.
    let own_policy = |config: Result<Config, String>| {
        let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
        let mut config = config?;
        crate::cli::run::edit(&args.sandbox, &mut config, &cwd)?;
        crate::cli::run::raise_limits(&args, &mut config)?;
        Ok::<_, String>(config)
    };
    if let Some(policy) = &args.policy {
        if let Err(e) = discovery::may_embed(discovery::POLICY_EMBEDS) {
            return refuse(e.kind(), e.to_string());
        }
        return match own_policy(Config::load(policy).map_err(|e| e.to_string())) {
            Ok(config) => embedded(config, request, render, &args),
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
            via_socket(found.client, request, render, &args)
        }
        Ok(Route::Embedded { tried }) => {
            tracing::debug!("no broker answers on {tried}: running an embedded one");
            // Where a system broker is installed, never silently without it.
            if discovery::SystemConfig::load().is_ok_and(|s| s.installed && s.clients.announce_fallback) {
                eprintln!(
                    "palisade: no broker answers on {tried}: run by an embedded broker{}",
                    discovery::FALLBACK
                );
            }
            match own_policy(Config::own_or_default().map_err(|e| e.to_string())) {
                Ok(config) => embedded(config, request, render, &args),
                Err(e) => refuse(ErrorKind::InvalidRequest, e),
            }
        }
        Err(e) => refuse(e.kind(), e.to_string()),
    }
}

/// Completes at the first SIGINT, SIGTERM or SIGHUP this process gets (the
/// handlers are in place once this is called, inside a runtime; a signal
/// whose handler cannot be installed keeps its default).
fn interrupted() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt()).ok();
    let mut term = signal(SignalKind::terminate()).ok();
    let mut hup = signal(SignalKind::hangup()).ok();
    async move {
        async fn got(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => drop(s.recv().await),
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = got(&mut int) => {}
            () = got(&mut term) => {}
            () = got(&mut hup) => {}
        }
    }
}

/// A broker inside this process, under `config`.
fn embedded(mut config: Config, mut request: RunRequest, mut render: Render, args: &RunArgs) -> i32 {
    crate::serve::daemon::init_tracing("warn");
    // Before the broker's threads start: they must not take a resize (see tty::on_resize).
    #[cfg(unix)]
    if request.terminal.is_some() {
        palisade_cli::tty::block_resizes();
    }
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
    // A terminal's resizes are watched from here on.
    let mut own = crate::cli::run::own_input(&request, args.no_stdin);
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => return fail(ErrorKind::RuntimeFailure, e),
    };
    let groups = crate::host::requester::Requester::me().groups;
    let peer = Peer { uid, gid, pid: Some(std::process::id() as i32), groups };
    let outcome = runtime.block_on(async {
        // ^C, SIGTERM and SIGHUP end the run as a cancel does: its sandbox
        // killed, its writes held and said (this process is its broker).
        let cancel = interrupted();
        let mut decided = match broker.decide(&peer, &request) {
            // A terminal the CLI chose by itself that this host cannot give
            // (Tier B): the run is done without, with pipes.
            Err(e)
                if request.terminal.is_some()
                    && !args.tty
                    && e.rule.as_deref() == Some(palisade_cli::tty::UNAVAILABLE_RULE) =>
            {
                request.terminal = None;
                request.stdin_streamed = palisade_cli::args::streams_stdin(args);
                own = own.filter(|_| request.stdin_streamed);
                broker.decide(&peer, &request)?
            }
            decided => decided?,
        };
        if let Some(approval) = &decided.approval {
            let question = broker.pending_approval(&peer, &decided, &request, approval);
            ask_embedded(&broker, &peer, question).await?;
            // Only an approver answers here: this terminal's.
            (decided.approver_approved, decided.approved_by) = (true, Some(peer.uid));
        }
        let stdin = own.map(crate::cli::run::OwnInput::start);
        // Without input (`-t -n`), this terminal keeps its own keys: Ctrl-C ends palisade.
        let raw = request.terminal.is_some() && !args.no_stdin;
        let sink = &mut RenderSink::new(&mut render, stdin, raw);
        broker.execute(&peer, decided, &request, sink, cancel).await
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
    let held = question.approval.clone();
    let ticket = broker.pending.open(question.pending, Some(question.run));
    let approval = ticket.pending.id;
    let approvers = broker.settings().approvers.clone();
    if !approvers.is_approver(peer) {
        let why = format!(
            "uid {} is not an approver of this policy and nobody else can answer here: \
             a running broker (palisaded) with approvers is needed",
            peer.uid
        );
        return Err(crate::decide::service::not_approved(&held, &why).into());
    }
    // An approver still answers only where the Cedar policies' `approve` permits it.
    let run = ticket.run.as_deref();
    approvers.authorize(peer, crate::decide::approvals::ApproverAction::Approve(&ticket.pending, run))?;
    let tool = ticket.pending.tool.clone();
    let asked = Event::ApprovalAsked { approval, run_id, uid: peer.uid, tool, reason: reason.clone() };
    broker.journal.append(asked).await?;
    let question = format!("{reason}\n{}Run it?", palisade_cli::approve::describe(&ticket.pending));
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
    if approved { Ok(()) } else { Err(crate::decide::service::not_approved(&held, why).into()) }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// `palisade --help` is the CLI's, which hands most commands over here:
    /// it names every command of this command line, in the same order,
    /// with the same summary.
    #[test]
    fn the_cli_lists_the_commands_served_here_as_they_are_described_here() {
        let summaries = |c: clap::Command| -> Vec<(String, String)> {
            c.get_subcommands()
                .map(|s| (s.get_name().to_string(), s.get_about().map(|a| a.to_string()).unwrap_or_default()))
                .collect()
        };
        let (cli, here) = (summaries(palisade_cli::Cli::command()), summaries(super::Cli::command()));
        assert_eq!(cli, here);
        assert!(here.len() >= 12, "{here:?}");
        let (cli, here) = (palisade_cli::Cli::command(), super::Cli::command());
        assert_eq!((cli.get_name(), cli.get_version()), (here.get_name(), here.get_version()));
    }
}
