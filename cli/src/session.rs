//! `palisade session`: sandboxes that stay for the commands run in them,
//! through a running broker (an embedded one would end with this process).

use crate::args::{SandboxArgs, own_umask};
use crate::client::ClientError;
use crate::discovery::{BrokerArgs, Route};
use crate::render::Render;
use crate::{json_fail, json_reply};
use clap::{Args as ClapArgs, Subcommand};
use palisade_protocol::wire::{
    ClientMessage, ErrorKind, ErrorReply, PublishedPort, RunRequest, ServerMessage, SessionInfo, StartSession,
};
use std::fmt::Write;
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum SessionCommand {
    /// Start a session: a sandbox that stays, for the commands `palisade
    /// session exec` runs in it (their processes, files and loopback are the
    /// session's; what one leaves running, the next finds). Prints its
    /// name. It ends when stopped, idle or too old, or with the broker.
    Start(Box<StartArgs>),
    /// Run a command in session NAME: decided by the policy like `palisade
    /// run`, in the session's sandbox, never a wider one. Its stdin is this
    /// one's, streamed as the command reads it (unless a terminal, or -n);
    /// in a terminal of the session's when this one is a terminal (or -t).
    /// Exits as `palisade run` does.
    Exec(ExecArgs),
    /// Publish PORT of session NAME's own loopback to you: a Unix socket on
    /// the host that only you may connect to (`curl --unix-socket SOCKET
    /// http://localhost/`), each connection reaching PORT from inside the
    /// session, until it ends. Prints the socket's path.
    Publish {
        name: String,
        port: u16,
        #[command(flatten)]
        broker: BrokerArgs,
        /// Print it as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// List your sessions.
    List {
        #[command(flatten)]
        broker: BrokerArgs,
        /// Print them as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Stop session NAME, killing everything in it; its writes are settled
    /// as those of a command that exited by itself. Prints its result.
    Stop {
        name: String,
        #[command(flatten)]
        broker: BrokerArgs,
        /// Print the result as `palisade run --json` does.
        #[arg(long)]
        json: bool,
    },
}

#[derive(ClapArgs, Debug)]
pub struct StartArgs {
    /// Its name, unique among your sessions [default: the broker's choice].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// End it once no command has run in it for this long [default: 900].
    #[arg(long, value_name = "SECS")]
    pub idle_timeout: Option<u64>,
    /// End it this long after it started [default: 28800].
    #[arg(long, value_name = "SECS")]
    pub max_lifetime: Option<u64>,
    /// The writable workspace [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Publish PORT of the session's loopback to you, as `palisade session
    /// publish` does (repeatable); each socket's path goes to stderr.
    #[arg(long, value_name = "PORT")]
    pub publish: Vec<u16>,
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// Print the session as one JSON object (with `published`, each port's socket).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

#[derive(ClapArgs, Debug)]
pub struct ExecArgs {
    /// The session, as `palisade session list` names it.
    pub name: String,
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// Wall-clock limit, in seconds [default: the policy's].
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Limit on stdout + stderr, in bytes [default: the policy's].
    #[arg(long, value_name = "BYTES")]
    pub max_output: Option<u64>,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Give the command no stdin.
    #[arg(short = 'n', long)]
    pub no_stdin: bool,
    /// Run the command in a terminal of the session's, this terminal's
    /// size (the default when stdin and stdout are terminals and neither
    /// --json nor --no-stdin is given), as `palisade run -t` does.
    #[arg(short = 't', long = "tty", conflicts_with = "no_tty")]
    pub tty: bool,
    /// No terminal: stdin, stdout and stderr stay pipes.
    #[arg(short = 'T', long = "no-tty")]
    pub no_tty: bool,
    /// Run COMMAND (its words joined by spaces) as a line of the session's
    /// shell: the working directory and the exported variables one line
    /// leaves, the next `--shell` line starts with (`cd src`, then `make`).
    /// It runs as `sh -c`: the policy must allow interpreters and inline code.
    #[arg(long)]
    pub shell: bool,
    /// The command and its arguments.
    #[arg(trailing_var_arg = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `palisade session ...`; the exit status.
pub fn main(command: SessionCommand) -> i32 {
    match command {
        SessionCommand::Start(args) => start(*args),
        SessionCommand::Exec(args) => exec(args),
        SessionCommand::Publish { name, port, broker, json } => publish_one(&broker, name, port, json),
        SessionCommand::List { broker, json } => list(&broker, json),
        SessionCommand::Stop { name, broker, json } => stop(&broker, name, json),
    }
}

/// Says the session stopped and what became of its writes (or prints its
/// result as JSON); 0 once it is stopped, whatever ran in it.
fn stop(broker: &BrokerArgs, name: String, json: bool) -> i32 {
    let result = match crate::approve::ask(broker, &ClientMessage::StopSession { session: name.clone() }) {
        Ok(ServerMessage::Finished(result)) => result,
        Ok(other) => return json_reply(json, unexpected(&other)),
        Err(e) => return json_reply(json, e),
    };
    if json {
        crate::outln!("{}", serde_json::to_string(&result).unwrap_or_default());
        return 0;
    }
    let changes = crate::render::summary(&result.changes, false);
    let changes = changes.map(|c| format!("; {c}")).unwrap_or_default();
    crate::outln!("session {name} stopped (run {}){changes}", result.run_id);
    0
}

fn unexpected(reply: &ServerMessage) -> ErrorReply {
    ErrorReply::new(ErrorKind::ProtocolError, format!("unexpected reply {reply:?}"))
}

fn start(args: StartArgs) -> i32 {
    let json = args.json;
    let cwd = match std::env::current_dir() {
        Ok(cwd) => cwd,
        Err(e) => return json_fail(json, ErrorKind::InvalidRequest, format!("current directory: {e}")),
    };
    let mut run = RunRequest {
        env: std::env::vars().collect(),
        cwd: Some(cwd.to_string_lossy().into_owned()),
        workspace: args.workspace.as_ref().map(|w| cwd.join(w).to_string_lossy().into_owned()),
        umask: own_umask(),
        ..RunRequest::default()
    };
    if let Err(e) = args.sandbox.ask(&mut run, &cwd) {
        return json_fail(json, ErrorKind::InvalidRequest, e);
    }
    let start = StartSession {
        name: args.name,
        run,
        idle_timeout_secs: args.idle_timeout,
        max_lifetime_secs: args.max_lifetime,
    };
    let info = match crate::approve::ask(&args.broker, &ClientMessage::StartSession(start)) {
        Ok(ServerMessage::SessionStarted(info)) => info,
        Ok(other) => return json_reply(json, unexpected(&other)),
        Err(e) => return json_reply(json, e),
    };
    let published = match publish_all(&args.broker, &info.name, &args.publish) {
        Ok(p) => p,
        Err(e) => return json_reply(json, e),
    };
    if json {
        let mut value = serde_json::to_value(&info).unwrap_or_default();
        value["published"] = serde_json::to_value(&published).unwrap_or_default();
        crate::outln!("{value}");
        return 0;
    }
    crate::outln!("{}", info.name);
    for p in &published {
        eprintln!("palisade: port {} of session {} published at {}", p.port, p.session, p.socket);
    }
    0
}

/// Publishes `ports` of the session just started; a port refused stops
/// the session (nothing half made is left) and is the error.
fn publish_all(broker: &BrokerArgs, name: &str, ports: &[u16]) -> Result<Vec<PublishedPort>, ErrorReply> {
    let mut published = Vec::new();
    for &port in ports {
        match publish(broker, name, port) {
            Ok(p) => published.push(p),
            Err(e) => {
                let _ = crate::approve::ask(broker, &ClientMessage::StopSession { session: name.into() });
                let why = format!("{} (session {name} stopped: it was to publish port {port})", e.message);
                return Err(ErrorReply { message: why, ..e });
            }
        }
    }
    Ok(published)
}

fn publish(broker: &BrokerArgs, name: &str, port: u16) -> Result<PublishedPort, ErrorReply> {
    match crate::approve::ask(broker, &ClientMessage::Publish { session: name.into(), port })? {
        ServerMessage::Published(p) => Ok(p),
        other => Err(unexpected(&other)),
    }
}

/// `palisade session publish`: prints the socket's path (or the JSON object).
fn publish_one(broker: &BrokerArgs, name: String, port: u16, json: bool) -> i32 {
    match publish(broker, &name, port) {
        Ok(p) if json => {
            crate::outln!("{}", serde_json::to_string(&p).unwrap_or_default());
            0
        }
        Ok(p) => {
            crate::outln!("{}", p.socket);
            0
        }
        Err(e) => json_reply(json, e),
    }
}

fn exec(args: ExecArgs) -> i32 {
    let render = Render::new(args.json);
    let mut found = match crate::discovery::find(args.broker.socket.as_deref(), false) {
        Ok(Route::Broker(found)) => found,
        Ok(Route::Embedded { tried }) => {
            let why =
                format!("no broker answers on {tried}: a session lives in a running broker (palisaded)");
            return render.finish(Err(ErrorReply::new(ErrorKind::Unavailable, why)));
        }
        Err(e) => return render.finish(Err(ErrorReply::new(e.kind(), e.to_string()))),
    };
    let argv = match args.shell {
        true => palisade_protocol::shell::argv(&args.command.join(" ")),
        false => args.command,
    };
    #[cfg(unix)]
    let terminal = crate::tty::wanted(args.tty, args.no_tty, args.json || args.no_stdin);
    #[cfg(not(unix))]
    let terminal = None;
    let stdin = std::io::stdin();
    let request = RunRequest {
        argv,
        timeout_secs: args.timeout,
        max_output_bytes: args.max_output,
        stdin_streamed: terminal.is_some()
            || (!args.no_stdin && !stdin.is_terminal() && !crate::args::is_dev_null(&stdin)),
        terminal,
        ..RunRequest::default()
    };
    let client = &mut found.client;
    client.in_session(args.name);
    let mut render = render;
    match crate::run::once(client, request, &mut render, args.no_stdin) {
        Ok(r) => render.finish(Ok(r)),
        Err(ClientError::Reply(e)) => render.finish(Err(e)),
        Err(e) => render.finish(Err(ErrorReply::new(ErrorKind::RuntimeFailure, e.to_string()))),
    }
}

fn list(broker: &BrokerArgs, json: bool) -> i32 {
    let sessions = match crate::approve::ask(broker, &ClientMessage::ListSessions) {
        Ok(ServerMessage::Sessions(s)) => s,
        Ok(other) => return json_reply(json, unexpected(&other)),
        Err(e) => return json_reply(json, e),
    };
    if json {
        crate::outln!("{}", serde_json::to_string(&sessions).unwrap_or_default());
    } else {
        crate::out!("{}", table(&sessions));
    }
    0
}

/// The sessions, one a line under a header; a line saying so when there are none.
fn table(sessions: &[SessionInfo]) -> String {
    if sessions.is_empty() {
        return "no sessions\n".into();
    }
    let mut out =
        format!("{:<20} {:>8} {:>6} {:>8} {:>9}  WORKSPACE\n", "NAME", "RUN", "RUNS", "RUNNING", "IDLE_SECS");
    for s in sessions {
        let _ = writeln!(
            out,
            "{:<20} {:>8} {:>6} {:>8} {:>9}  {}",
            s.name, s.run_id, s.runs, s.running, s.idle_timeout_secs, s.workspace
        );
    }
    out
}
