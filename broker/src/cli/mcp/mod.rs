//! `palisade mcp`: a Model Context Protocol server over stdio (the `rmcp`
//! crate) whose tools forward to a broker: the one answering on the
//! socket, or one embedded in this process and served on a private socket
//! of its own, as `palisade run` embeds one. Every call is a connection
//! to that broker: its policy decides, its journal records, and a call the
//! client cancels is a connection closed, which kills the run.

mod call;
mod progress;
mod tools;

use crate::cli::client::{Ask, Client};
use crate::cli::discovery::{Route, Which};
use crate::cli::run::{EXIT_PALISADE, SandboxArgs, fail};
use crate::decide::service::Broker;
use crate::serve::server::Server;
use call::{Defaults, Shape};
use clap::Args as ClapArgs;
use palisade_policy::Config;
use palisade_protocol::wire::{ClientMessage, ErrorKind};
use progress::Progress;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ElicitRequestParams, ElicitationAction, ElicitationSchema,
    Implementation, ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use std::borrow::Cow;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;

/// How long an approval put to the person through elicitation may wait.
/// The broker's own `approval_timeout_secs` bounds the run's wait too.
const ELICITATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Serve palisade's tools to an agent over MCP (stdio).
#[derive(ClapArgs, Debug)]
pub struct McpArgs {
    /// Broker socket [default: $PALISADE_SOCKET, else your broker's, else
    /// the system broker's; an embedded broker serves the calls when none
    /// answers, unless the system configuration requires the system broker].
    #[arg(long, value_name = "PATH", conflicts_with = "policy")]
    pub socket: Option<PathBuf>,
    /// Policy file: serve the calls with an embedded broker under this policy.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The workspace of a call that names none, and what a relative one is
    /// relative to [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Let a call's tool parameters name paths outside the workspace (the
    /// policy still decides each); by default they must lie inside it.
    #[arg(long)]
    pub params_outside_workspace: bool,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

/// The MCP server: where its broker answers, and what each call starts from.
#[derive(Clone)]
struct Palisade {
    socket: Arc<PathBuf>,
    /// Which broker serves the calls, for people.
    broker: Arc<String>,
    defaults: Arc<Defaults>,
    /// The sessions this server started and has not stopped: they end with it.
    started: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
}

/// `palisade mcp`.
pub fn main(args: McpArgs) -> i32 {
    let cwd = match std::env::current_dir() {
        Ok(c) => c,
        Err(e) => return fail(ErrorKind::InvalidRequest, format!("current directory: {e}")),
    };
    let workspace = cwd.join(args.workspace.clone().unwrap_or_default());
    let defaults = Defaults {
        workspace,
        sandbox: args.sandbox.clone(),
        params_anywhere: args.params_outside_workspace,
        umask: crate::cli::run::own_umask(),
    };
    let route = match &args.policy {
        Some(_) => crate::cli::discovery::may_embed(crate::cli::discovery::POLICY_EMBEDS)
            .map(|()| Route::Embedded { tried: String::new() }),
        None => crate::cli::discovery::find(args.socket.as_deref(), true),
    };
    let serving = match route {
        Ok(Route::Broker(found)) => {
            if found.which == Which::System {
                eprintln!("palisade mcp: calls go to {}", found.name());
            }
            Serving::Socket(found.socket.clone(), found.name())
        }
        Ok(Route::Embedded { .. }) => match embedded_broker(args.policy.as_deref(), &args.sandbox, &cwd) {
            Ok(b) => Serving::Embedded(Box::new(b)),
            Err(e) => return fail(ErrorKind::InvalidRequest, e),
        },
        Err(e) => return fail(e.kind(), e),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => return fail(ErrorKind::RuntimeFailure, format!("cannot start the runtime: {e}")),
    };
    let served = runtime.block_on(async move {
        match serving {
            Serving::Embedded(broker) => serve_embedded(*broker, defaults).await,
            Serving::Socket(socket, broker) => {
                serve(Palisade {
                    socket: Arc::new(socket),
                    broker: Arc::new(broker),
                    defaults: Arc::new(defaults),
                    started: Arc::default(),
                })
                .await
            }
        }
    });
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("palisade mcp: {e}");
            EXIT_PALISADE
        }
    }
}

/// What serves the calls: a broker embedded in this process, or the one on
/// a socket (with its name, for people).
enum Serving {
    Embedded(Box<Broker>),
    Socket(PathBuf, String),
}

/// The embedded broker, under `policy` (or the built-in one) as the flags edit it.
fn embedded_broker(
    policy: Option<&std::path::Path>,
    sandbox: &SandboxArgs,
    cwd: &std::path::Path,
) -> Result<Broker, String> {
    let mut config = policy.map_or_else(Config::own_or_default, Config::load).map_err(|e| e.to_string())?;
    crate::cli::run::edit(sandbox, &mut config, cwd)?;
    // Before any thread exists: the probe of user namespaces forks.
    let broker = Broker::assemble(config, None).map_err(|e| e.to_string())?;
    broker.journal.check_newest().map_err(|e| e.to_string())?;
    Ok(broker)
}

/// Serves MCP with `broker` answering on a socket in a private directory
/// of this process's (mode 0700), removed at the end.
async fn serve_embedded(broker: Broker, defaults: Defaults) -> Result<(), String> {
    // Before the directory: a signal from here on ends the server the same way.
    let signals = termination_signals();
    let dir = private_dir().map_err(|e| format!("a private directory for the embedded broker: {e}"))?;
    let socket = dir.join("broker.sock");
    crate::serve::daemon::keep_socket_out_of_reach(&broker, &socket);
    let listener =
        crate::serve::socket::bind(&socket, 0o600).map_err(|e| format!("{}: {e}", socket.display()))?;
    let source = broker.settings().config().source_name();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(Arc::new(Server::new(broker)).serve(listener, stopped));
    let name = format!("an embedded broker (policy: {source})");
    let mcp = Palisade {
        socket: Arc::new(socket),
        broker: Arc::new(name),
        defaults: Arc::new(defaults),
        started: Arc::default(),
    };
    // An agent host ends its server with SIGTERM (or SIGINT) as often as by
    // closing stdin: either way the runs are killed and the directory goes.
    let served = tokio::select! {
        served = serve(mcp) => served,
        () = terminated(signals) => Ok(()),
    };
    // The directory first (the listener holds its socket open): a host
    // that kills the server soon after it asked it to stop leaves nothing.
    let _ = std::fs::remove_dir_all(&dir);
    // The runs still in progress are killed, their clients told.
    let _ = stop.send(true);
    let _ = server.await;
    served
}

type Signals = Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>;

/// SIGTERM's and SIGINT's handlers, installed now (None where they cannot be).
fn termination_signals() -> Signals {
    use tokio::signal::unix::{SignalKind, signal};
    signal(SignalKind::terminate()).ok().zip(signal(SignalKind::interrupt()).ok())
}

/// SIGTERM or SIGINT (never, where their handlers could not be installed).
async fn terminated(signals: Signals) {
    match signals {
        Some((mut term, mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        None => std::future::pending().await,
    }
}

/// `$XDG_RUNTIME_DIR/palisade-mcp-broker-PID-N` (or under the temporary
/// directory), a directory of this process's own that nobody else may enter.
fn private_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::var_os("XDG_RUNTIME_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let dir = base.join(format!("palisade-mcp-broker-{}-{nanos:x}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

async fn serve(server: Palisade) -> Result<(), String> {
    let (socket, started) = (server.socket.clone(), server.started.clone());
    let running = match server.serve(rmcp::transport::stdio()).await {
        Ok(r) => r,
        // The client went away before it began: nothing to say.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(e) => return Err(format!("MCP: {e}")),
    };
    let waited = running.waiting().await.map_err(|e| format!("MCP: {e}"));
    // This server's sessions end with it, as their agent's stop would end them.
    let names = std::mem::take(&mut *started.lock().unwrap_or_else(|e| e.into_inner()));
    let stopping = tokio::task::spawn_blocking(move || {
        for session in names {
            let stop = ClientMessage::StopSession { session: session.clone() };
            let stopped = Client::connect(&socket).and_then(|mut c| c.request(&stop));
            if let Err(e) = stopped {
                eprintln!("palisade mcp: session {session} was not stopped: {e}");
            }
        }
    });
    let _ = stopping.await;
    waited.map(drop)
}

impl Palisade {
    /// `work` on a blocking thread with a connection to the broker, until it
    /// is done or the client cancels the call: then the connection is
    /// closed, which cancels (the broker kills the run).
    async fn on_broker(
        &self,
        context: &RequestContext<RoleServer>,
        work: impl FnOnce(UnixStream, &str) -> Result<CallToolResponse, ErrorData> + Send + 'static,
    ) -> Result<CallToolResponse, ErrorData> {
        let stream = UnixStream::connect(&*self.socket)
            .map_err(|e| call::failure(format!("{} does not answer: {e}", self.broker)))?;
        let closer = stream.try_clone().map_err(|e| call::failure(format!("the broker's socket: {e}")))?;
        let broker = self.broker.clone();
        let work = tokio::task::spawn_blocking(move || work(stream, &broker));
        tokio::select! {
            done = work => done.map_err(|e| call::failure(format!("the call's thread: {e}")))?,
            () = context.ct.cancelled() => {
                let _ = closer.shutdown(std::net::Shutdown::Both);
                Err(call::failure("cancelled by the client".into()))
            }
        }
    }
}

impl ServerHandler for Palisade {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("palisade", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "palisade runs commands in a sandbox the kernel enforces, served by {}. Use run_command \
                 for commands, run_tool for the tools the policy declares, explain to see what a command \
                 would be allowed before running it. A refusal is an error carrying palisade's stable \
                 kind and rule: change the command rather than retrying it.",
                self.broker
            ))
    }

    // Elicitation is a request from server to client in the protocol
    // versions up to 2025-11-25; later ones carry it differently.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::all()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.clone();
        let answer = self.call(request, context).await;
        // A refusal is the agent's answer, not this server's trouble.
        if let Err(e) = &answer {
            tracing::debug!("{name}: {}", e.message);
        }
        answer
    }
}

impl Palisade {
    async fn call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        let shape = match request.name.as_ref() {
            "run_plugin" => {
                let message = call::plugin_call(&arguments)?;
                let work = |stream, broker: &str| call::plugin(stream, message, broker).map(Into::into);
                return self.on_broker(&context, work).await;
            }
            name @ ("list_changes" | "show_changes" | "apply_changes" | "discard_changes") => {
                let message = call::changes_call(name, &arguments)?;
                let work = |stream, _: &str| call::changes(stream, message).map(Into::into);
                return self.on_broker(&context, work).await;
            }
            name @ ("session_start" | "session_stop" | "session_list") => {
                let message = call::session_call(name, &arguments, &self.defaults)?;
                let started = self.started.clone();
                let work = move |stream, _: &str| {
                    let (starts, stops) = match &message {
                        ClientMessage::StartSession(_) => (true, None),
                        ClientMessage::StopSession { session } => (false, Some(session.clone())),
                        _ => (false, None),
                    };
                    let result = call::sessions(stream, message)?;
                    let name = result.structured_content.as_ref().and_then(|v| v["name"].as_str());
                    let mut held = started.lock().unwrap_or_else(|e| e.into_inner());
                    if let (true, Some(name)) = (starts, name) {
                        held.insert(name.to_string());
                    }
                    if let Some(session) = stops {
                        held.remove(&session);
                    }
                    drop(held);
                    Ok(result.into())
                };
                return self.on_broker(&context, work).await;
            }
            "session_exec" if !arguments.contains_key("session") => {
                return Err(ErrorData::invalid_params("session_exec needs the session (session)", None));
            }
            "run_command" | "session_exec" => Shape::RunCommand,
            "run_tool" => Shape::RunTool,
            "explain" => Shape::Explain,
            other => return Err(ErrorData::invalid_params(format!("no tool {other:?}"), None)),
        };
        let call = call::parse(&arguments, shape, &self.defaults)?;
        match shape {
            Shape::Explain => {
                let work = |stream, broker: &str| {
                    call::explain(stream, call).map(|e| call::explained(e, broker).into())
                };
                self.on_broker(&context, work).await
            }
            Shape::RunCommand | Shape::RunTool => {
                let progress = Progress::of(&context);
                let ask = elicit(context.clone(), progress.clone(), self.socket.clone());
                // Stopped when the call is done, or dropped.
                let _reporting = progress.reporting();
                let work = move |stream, broker: &str| {
                    call::result(call::run(stream, call, ask, &progress), broker).map(Into::into)
                };
                self.on_broker(&context, work).await
            }
        }
    }
}

/// A run held for approval, put to the person through the client's
/// elicitation (called on the call's blocking thread). `None` waits for an
/// answer from elsewhere (`palisade approve ID`, on the broker's `socket`):
/// an approver's when this requester may not answer, or the person's when
/// the client cannot ask (no elicitation). The command that answers goes
/// to stderr, the server's log, for a person: never to the client, whose
/// model could run it; a progress notification says only that the run
/// waits, and where the command is.
fn elicit(
    context: RequestContext<RoleServer>,
    progress: Progress,
    socket: Arc<PathBuf>,
) -> impl FnMut(Ask<'_>) -> Option<bool> + Send + 'static {
    let runtime = tokio::runtime::Handle::current();
    move |ask: Ask<'_>| {
        let id = ask.approval.id;
        let how = format!("palisade approve {id} --socket {} (or palisade deny {id})", socket.display());
        let waiting = if !ask.may_answer {
            Some(("waiting for an approver", format!("an approver answers with {how}")))
        } else if context.client_capabilities().and_then(|c| c.elicitation).is_none() {
            let why = "this MCP client cannot ask you (it has no elicitation)";
            Some(("waiting for a person's approval", format!("{why}: approve the run with {how}")))
        } else {
            None
        };
        if let Some((what, answer)) = waiting {
            eprintln!("palisade mcp: {what}: {} {answer}", ask.reason);
            progress.say(format!(
                "{what}: {} (the command that answers it is in palisade mcp's log, its stderr)",
                ask.reason
            ));
            return None;
        }
        let message = format!(
            "palisade: {}\n{}Approve this run?",
            ask.reason,
            palisade_cli::approve::describe(ask.approval)
        );
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"approve": {"type": "boolean", "title": "Approve the run", "default": false}},
            "required": ["approve"],
        });
        let Some(requested_schema) =
            schema.as_object().and_then(|s| ElicitationSchema::from_json_schema(s.clone()).ok())
        else {
            return Some(false);
        };
        let params = ElicitRequestParams::FormElicitationParams { meta: None, message, requested_schema };
        let answer =
            runtime.block_on(context.peer.create_elicitation_with_timeout(params, Some(ELICITATION_TIMEOUT)));
        Some(match answer {
            Ok(r) if r.action == ElicitationAction::Accept => {
                r.content.as_ref().and_then(|c| c.get("approve")).and_then(|a| a.as_bool()) == Some(true)
            }
            Ok(_) => false,
            Err(e) => {
                tracing::warn!("elicitation: {e}");
                false
            }
        })
    }
}
