//! A tool call carried out through the broker's socket: its arguments made
//! into a request, the run, its output cut to what an agent can use, and
//! the result (or the MCP error carrying palisade's stable kind).

use super::progress::Progress;
use crate::cli::client::{Ask, Client, ClientError, Event};
use crate::cli::run::SandboxArgs;
use palisade_protocol::wire::{
    ClientMessage, ErrorKind, ErrorReply, Explanation, ParamValue, RunRequest, RunResult, RunStatus,
    ServerMessage, Stream,
};
use rmcp::model::{CallToolResult, ContentBlock, ErrorCode, ErrorData, JsonObject};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

/// The MCP error code of every refusal or failure of palisade's: the
/// error's `data` is palisade's error (`kind`, `message`, `rule`, `helper`).
pub const PALISADE_ERROR: ErrorCode = ErrorCode(-32050);

/// Characters that make a command line shell syntax rather than words.
const SHELL_SYNTAX: &[char] =
    &['|', '&', ';', '<', '>', '(', ')', '$', '`', '*', '?', '[', ']', '{', '}', '~', '!', '#', '\n', '\\'];

/// What every call starts from: the server's own settings.
pub struct Defaults {
    /// The workspace when a call names none, and what a relative one is relative to.
    pub workspace: PathBuf,
    /// The server's flags: asks every request carries.
    pub sandbox: SandboxArgs,
    /// `--params-outside-workspace`: the person lets a call's parameters
    /// name paths outside the workspace (the policy still decides them).
    pub params_anywhere: bool,
    /// The server's umask, which every request carries (`RunRequest::umask`).
    pub umask: Option<u32>,
}

/// A call's request, and how much of each stream goes back.
pub struct Call {
    pub request: RunRequest,
    pub output_limit: u64,
    /// The session the command runs in, if it names one.
    pub session: Option<String>,
}

/// What a call's arguments may hold.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    RunCommand,
    RunTool,
    Explain,
}

impl Shape {
    fn allows(self, key: &str) -> bool {
        match key {
            "argv" | "command" | "workspace" => true,
            "stdin" | "timeout_secs" | "output_limit_bytes" => self != Shape::Explain,
            "session" | "shell" => self == Shape::RunCommand,
            "tool" | "params" => self != Shape::RunCommand,
            _ => false,
        }
    }
}

fn invalid(message: String) -> ErrorData {
    ErrorData::invalid_params(message, None)
}

/// The request a call's arguments make; a malformed argument is refused, naming it.
pub fn parse(args: &JsonObject, shape: Shape, defaults: &Defaults) -> Result<Call, ErrorData> {
    if let Some(key) = args.keys().find(|k| !shape.allows(k)) {
        return Err(invalid(format!("unknown argument {key:?}")));
    }
    let text = |key: &str| -> Result<Option<String>, ErrorData> {
        match args.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(invalid(format!("{key} must be a string"))),
        }
    };
    let number = |key: &str| -> Result<Option<u64>, ErrorData> {
        match args.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| invalid(format!("{key} must be a whole number"))),
        }
    };
    let argv = match (args.get("argv"), text("command")?) {
        (Some(v), None) => strings(v)
            .filter(|a| !a.is_empty())
            .ok_or_else(|| invalid("argv must be a non-empty list of strings".into()))?,
        (None, Some(line)) => argv_of(&line),
        _ => return Err(invalid("give argv or command (one of them)".into())),
    };
    let output_limit = number("output_limit_bytes")?
        .unwrap_or(super::tools::DEFAULT_OUTPUT_LIMIT)
        .clamp(256, super::tools::MAX_OUTPUT_LIMIT);
    let shell = match args.get("shell") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => return Err(invalid("shell must be true or false".into())),
    };
    let argv = match (shell, text("command")?, args.contains_key("session")) {
        (false, _, _) => argv,
        (true, Some(line), true) => palisade_protocol::shell::argv(&line),
        (true, None, _) => return Err(invalid("shell runs a command line: give command, not argv".into())),
        (true, _, false) => return Err(invalid("shell is a session's: give session too".into())),
    };
    if let Some(session) = text("session")? {
        // The session's sandbox is decided: only the command's own fields go.
        if args.contains_key("workspace") {
            return Err(invalid("a command in a session runs in the session's workspace: give none".into()));
        }
        let stdin = text("stdin")?.unwrap_or_default().into_bytes();
        let request =
            RunRequest { argv, stdin, timeout_secs: number("timeout_secs")?, ..RunRequest::default() };
        return Ok(Call { request, output_limit, session: Some(session) });
    }
    let workspace = match text("workspace")? {
        Some(w) => within_workspace(&defaults.workspace, &w)?,
        None => defaults.workspace.clone(),
    };
    let params = match args.get("params") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(p)) => p
            .iter()
            .map(|(k, v)| match (v, strings(v)) {
                (Value::String(s), _) => Ok((k.clone(), ParamValue::One(s.clone()))),
                (_, Some(list)) => Ok((k.clone(), ParamValue::Many(list))),
                _ => Err(invalid(format!("params.{k} must be a path or a list of paths"))),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(invalid("params must be an object".into())),
    };
    if !defaults.params_anywhere {
        for (name, value) in &params {
            confine_param(&defaults.workspace, &workspace, name, value)?;
        }
    }
    let workspace_text = workspace.to_string_lossy().into_owned();
    let mut request = RunRequest {
        argv,
        env: std::env::vars().collect(),
        cwd: Some(workspace_text.clone()),
        workspace: Some(workspace_text),
        stdin: text("stdin")?.unwrap_or_default().into_bytes(),
        timeout_secs: number("timeout_secs")?,
        tool: text("tool")?,
        params,
        umask: defaults.umask,
        ..RunRequest::default()
    };
    if shape == Shape::RunTool && request.tool.is_none() {
        return Err(invalid("run_tool needs the tool's name (tool)".into()));
    }
    // A declared tool runs as declared: the server's profile (`--profile`)
    // and the flags that edit it are its commands', never a tool's.
    let sandbox = match request.tool {
        Some(_) => defaults.sandbox.for_tool(),
        None => defaults.sandbox.clone(),
    };
    sandbox.ask(&mut request, &defaults.workspace).map_err(invalid)?;
    Ok(Call { request, output_limit, session: None })
}

/// A call's workspace: inside the server's, which the person chose. A
/// model cannot move the writable directory elsewhere (its home, say).
fn within_workspace(base: &std::path::Path, asked: &str) -> Result<PathBuf, ErrorData> {
    let joined = base.join(asked);
    let refuse = |why: String| {
        let message = format!("workspace {asked}: {why}");
        refusal(&ErrorReply::with_rule(ErrorKind::WorkspaceScopeDenied, message, "mcp.workspace"))
    };
    let canonical = joined.canonicalize().map_err(|e| refuse(format!("{}: {e}", joined.display())))?;
    let root =
        base.canonicalize().map_err(|e| refuse(format!("the server's workspace {}: {e}", base.display())))?;
    if !canonical.starts_with(&root) {
        return Err(refuse(format!(
            "{} is outside the server's workspace {} (palisade mcp --workspace)",
            canonical.display(),
            root.display()
        )));
    }
    Ok(canonical)
}

/// A parameter's paths: inside the server's workspace, as the person chose
/// it (relative ones are relative to the call's workspace, as the policy
/// reads them). A path that does not exist yet is judged by what it would
/// be: its longest existing part resolved.
fn confine_param(
    base: &std::path::Path,
    cwd: &std::path::Path,
    name: &str,
    value: &ParamValue,
) -> Result<(), ErrorData> {
    let values = match value {
        ParamValue::One(v) => std::slice::from_ref(v),
        ParamValue::Many(vs) => vs.as_slice(),
    };
    let root = base
        .canonicalize()
        .map_err(|e| failure(format!("the server's workspace {}: {e}", base.display())))?;
    for v in values {
        let resolved = crate::host::paths::canonical_prefix(&cwd.join(v));
        let outside = !resolved.starts_with(&root)
            || resolved.components().any(|c| c == std::path::Component::ParentDir);
        if outside {
            let message = format!(
                "params.{name}: {v} is outside the server's workspace {} (palisade mcp --workspace; \
                 --params-outside-workspace lets parameters name other paths)",
                root.display()
            );
            return Err(refusal(&ErrorReply::with_rule(
                ErrorKind::WorkspaceScopeDenied,
                message,
                "mcp.workspace",
            )));
        }
    }
    Ok(())
}

fn strings(v: &Value) -> Option<Vec<String>> {
    v.as_array()?.iter().map(|s| s.as_str().map(String::from)).collect()
}

/// A command line as argv: its words, split as a shell splits them (quotes
/// respected), when it has no shell syntax; otherwise `sh -c LINE`.
pub fn argv_of(line: &str) -> Vec<String> {
    if !line.contains(SHELL_SYNTAX) {
        if let Some(words) = shlex::split(line) {
            // `NAME=value cmd` sets a variable: the shell's to do.
            if words.first().is_some_and(|w| !w.contains('=')) {
                return words;
            }
        }
    }
    vec!["sh".into(), "-c".into(), line.into()]
}

/// A stream's output as returned to the agent: all of it when it fits
/// `limit`, else its first and last halves with a marker between.
pub struct Capped {
    half: usize,
    head: Vec<u8>,
    tail: Vec<u8>,
    total: u64,
}

impl Capped {
    pub fn new(limit: u64) -> Capped {
        Capped { half: (limit / 2) as usize, head: Vec::new(), tail: Vec::new(), total: 0 }
    }

    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let room = self.half.saturating_sub(self.head.len());
        let into_head = room.min(data.len());
        self.head.extend_from_slice(&data[..into_head]);
        data = &data[into_head..];
        self.tail.extend_from_slice(data);
        // Trimmed now and then, to the last half: what stays is always at least that.
        if self.tail.len() > 2 * self.half {
            self.tail.drain(..self.tail.len() - self.half);
        }
    }

    /// The text returned, and whether anything was cut.
    pub fn text(&self) -> (String, bool) {
        let kept = (self.head.len() + self.tail.len()) as u64;
        if kept == self.total {
            return (String::from_utf8_lossy(&[&self.head[..], &self.tail[..]].concat()).into_owned(), false);
        }
        let last = &self.tail[self.tail.len() - self.half.min(self.tail.len())..];
        let cut = self.total - (self.head.len() + last.len()) as u64;
        let marker = format!("\n[palisade: {cut} bytes cut here, of {} in all]\n", self.total);
        let text =
            format!("{}{marker}{}", String::from_utf8_lossy(&self.head), String::from_utf8_lossy(last));
        (text, true)
    }
}

/// A run through the broker: its result or error, and its output.
pub struct Ran {
    pub outcome: Result<RunResult, ClientError>,
    pub stdout: Capped,
    pub stderr: Capped,
}

/// Runs `call` over `stream` (connected to the broker), putting an
/// approval to `ask`.
pub fn run(
    stream: UnixStream,
    call: Call,
    ask: impl FnMut(Ask<'_>) -> Option<bool>,
    progress: &Progress,
) -> Ran {
    let (mut stdout, mut stderr) = (Capped::new(call.output_limit), Capped::new(call.output_limit));
    let outcome = Client::over(stream).and_then(|mut client| {
        if let Some(session) = call.session {
            client.in_session(session);
        }
        let on = |event: Event<'_>| {
            if let Event::Output(s, data) = event {
                progress.output(data);
                match s {
                    Stream::Stdout => stdout.push(data),
                    Stream::Stderr => stderr.push(data),
                }
            }
        };
        client.run_events(call.request, on, ask)
    });
    Ran { outcome, stdout, stderr }
}

/// A plugin call's message: its skill, its input (JSON text) and deadline.
pub fn plugin_call(args: &JsonObject) -> Result<ClientMessage, ErrorData> {
    if let Some(key) = args.keys().find(|k| !["skill", "input", "timeout_ms"].contains(&k.as_str())) {
        return Err(invalid(format!("unknown argument {key:?}")));
    }
    let skill =
        args.get("skill").and_then(Value::as_str).ok_or_else(|| invalid("skill must be a string".into()))?;
    let timeout_ms = match args.get("timeout_ms") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| invalid("timeout_ms must be a whole number".into()))?),
    };
    let input = args.get("input").cloned().unwrap_or(Value::Null).to_string();
    Ok(ClientMessage::RunPlugin { skill: skill.into(), input, inline_module: None, timeout_ms })
}

/// Calls the plugin through the broker on `stream`: its output (JSON when
/// it is), what the call used, and the grants it ran with.
pub fn plugin(stream: UnixStream, message: ClientMessage, broker: &str) -> Result<CallToolResult, ErrorData> {
    let reply = Client::over(stream).and_then(|mut c| c.request(&message)).map_err(client_error)?;
    let ServerMessage::PluginResult {
        output,
        fuel_used,
        memory_peak_bytes,
        instantiate_us,
        call_us,
        attestation,
    } = reply
    else {
        return Err(failure(format!("the broker answered {reply:?}")));
    };
    let attestation = serde_json::to_value(&*attestation).unwrap_or(Value::Null);
    let parsed: Value = serde_json::from_str(&output).unwrap_or_else(|_| Value::String(output.clone()));
    let mut result = CallToolResult::structured(json!({
        "output": parsed,
        "fuel_used": fuel_used,
        "memory_peak_bytes": memory_peak_bytes,
        "instantiate_us": instantiate_us,
        "call_us": call_us,
        "plugin": {
            "broker": broker,
            "module_sha256": attestation["module_sha256"],
            "grants": attestation["grants"],
            "limits": attestation["limits"],
            "journal": attestation["journal"],
            "store": attestation["store"],
        },
    }));
    result.content = vec![ContentBlock::text(output)];
    Ok(result)
}

/// Asks the broker on `stream` for its decision on `call`.
pub fn explain(stream: UnixStream, call: Call) -> Result<Explanation, ErrorData> {
    let reply = Client::over(stream).and_then(|mut c| c.request(&ClientMessage::Explain(call.request)));
    match reply {
        Ok(ServerMessage::Explained(e)) => Ok(*e),
        Ok(other) => Err(failure(format!("the broker answered {other:?}"))),
        Err(e) => Err(client_error(e)),
    }
}

/// The MCP error of palisade's error `reply`.
pub fn refusal(reply: &ErrorReply) -> ErrorData {
    let data = serde_json::to_value(reply).ok();
    ErrorData::new(PALISADE_ERROR, format!("{}: {}", reply.kind, reply.message), data)
}

/// A failure of palisade's own (not the policy's), as an MCP error.
pub fn failure(message: String) -> ErrorData {
    refusal(&ErrorReply::new(ErrorKind::RuntimeFailure, message))
}

pub fn client_error(e: ClientError) -> ErrorData {
    match e {
        ClientError::Reply(reply) => refusal(&reply),
        other => failure(format!("the broker: {other}")),
    }
}

/// The tool's result: the command's output and status, and a summary of
/// the sandbox it ran in; a refusal is an MCP error.
pub fn result(ran: Ran, broker: &str) -> Result<CallToolResult, ErrorData> {
    let r = ran.outcome.map_err(client_error)?;
    let ((stdout, cut_out), (stderr, cut_err)) = (ran.stdout.text(), ran.stderr.text());
    let (status, code, signal) = match r.status {
        RunStatus::Exited { code } => ("exited", Some(code), None),
        RunStatus::Signaled { signal } => ("signaled", None, Some(signal)),
        RunStatus::TimedOut => ("timed_out", None, None),
        RunStatus::QuotaExceeded => ("output_quota_exceeded", None, None),
        RunStatus::MemoryLimitExceeded => ("memory_limit_exceeded", None, None),
        RunStatus::DiskLimitExceeded => ("disk_limit_exceeded", None, None),
        RunStatus::Cancelled => ("cancelled", None, None),
        RunStatus::Stopped => ("stopped", None, None),
    };
    let error_kind = r.status.error_kind();
    let attestation = serde_json::to_value(&r.attestation).unwrap_or(Value::Null);
    let enforcement = &attestation["enforcement"];
    let structured = json!({
        "status": status,
        "exit_code": code,
        "signal": signal,
        "error_kind": error_kind,
        "stdout": stdout,
        "stderr": stderr,
        "stdout_bytes": r.stdout_bytes,
        "stderr_bytes": r.stderr_bytes,
        "output_cut": cut_out || cut_err,
        "wall_ms": r.wall_ms,
        "run_id": r.run_id,
        "sandbox": {
            "broker": broker,
            "executor": attestation["executor"],
            "execution_sha256": attestation["execution_sha256"],
            "network": enforcement["network"],
            "limits_by": enforcement["limits_by"],
            "warnings": attestation["warnings"],
            "journal": attestation["journal"],
            "store": attestation["store"],
        },
        "changes": serde_json::to_value(&r.changes).unwrap_or(Value::Null),
        "writes_landed": r.changes.all_landed(),
        "approved": serde_json::to_value(&r.approved).unwrap_or(Value::Null),
    });
    let mut summary = match (code, signal, error_kind) {
        (Some(c), _, _) => format!("exit status {c}"),
        (_, Some(s), _) => format!("killed by signal {s}"),
        (_, _, Some(kind)) => format!("ended by palisade: {status} ({kind})"),
        _ => status.to_string(),
    };
    summary.push_str(&format!(" ({} ms; {})\n", r.wall_ms, structured["sandbox"]["executor"]));
    if let Some(line) = crate::cli::run::approved_line(&r) {
        summary.push_str(&format!("{line}\n"));
    }
    if let Some(line) = crate::cli::run::summary(&r.changes, false) {
        summary.push_str(&format!("{line}\n"));
    }
    // The command may have succeeded; its writes did not all land, and an agent must not think they did.
    let not_landed = !r.changes.all_landed();
    if not_landed {
        summary.push_str("NOT ALL OF THE RUN'S WRITES WERE APPLIED: see the line above\n");
    }
    for (name, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        if !text.is_empty() {
            summary.push_str(&format!("--- {name} ---\n{text}"));
            if !text.ends_with('\n') {
                summary.push('\n');
            }
        }
    }
    let mut result = CallToolResult::structured(structured);
    result.content = vec![ContentBlock::text(summary)];
    result.is_error = Some(error_kind.is_some() || not_landed);
    Ok(result)
}

/// A session call's message: `session_start` (the server's workspace and
/// flags, as a run of `run_command` gets them), `session_stop` or `session_list`.
pub fn session_call(name: &str, args: &JsonObject, defaults: &Defaults) -> Result<ClientMessage, ErrorData> {
    let allowed: &[&str] = match name {
        "session_start" => &["name", "idle_timeout_secs", "max_lifetime_secs"],
        "session_stop" => &["session"],
        _ => &[],
    };
    if let Some(key) = args.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(invalid(format!("unknown argument {key:?}")));
    }
    let number = |key: &str| match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| invalid(format!("{key} must be a whole number"))),
    };
    let text = |key: &str| args.get(key).and_then(Value::as_str).map(String::from);
    match name {
        "session_start" => {
            let workspace = defaults.workspace.to_string_lossy().into_owned();
            let mut run = RunRequest {
                env: std::env::vars().collect(),
                cwd: Some(workspace.clone()),
                workspace: Some(workspace),
                umask: defaults.umask,
                ..RunRequest::default()
            };
            defaults.sandbox.ask(&mut run, &defaults.workspace).map_err(invalid)?;
            Ok(ClientMessage::StartSession(palisade_protocol::wire::StartSession {
                name: text("name"),
                run,
                idle_timeout_secs: number("idle_timeout_secs")?,
                max_lifetime_secs: number("max_lifetime_secs")?,
            }))
        }
        "session_stop" => {
            let session = text("session").ok_or_else(|| invalid("session must be a string".into()))?;
            Ok(ClientMessage::StopSession { session })
        }
        _ => Ok(ClientMessage::ListSessions),
    }
}

/// A session call through the broker on `stream`, as a tool result.
pub fn sessions(stream: UnixStream, message: ClientMessage) -> Result<CallToolResult, ErrorData> {
    let reply = Client::over(stream).and_then(|mut c| c.request(&message)).map_err(client_error)?;
    // A session's writes are settled when it stops: one that did not all land is an error.
    let landed = !matches!(&reply, ServerMessage::Finished(r) if !r.changes.all_landed());
    let (value, text) = match &reply {
        ServerMessage::SessionStarted(info) => (
            serde_json::to_value(info).unwrap_or(Value::Null),
            format!(
                "session {} started in {}: run commands in it with session_exec (or run_command's `session`)",
                info.name, info.workspace
            ),
        ),
        ServerMessage::Sessions(list) => {
            let lines: Vec<String> = list
                .iter()
                .map(|s| format!("{} ({} commands, in {})", s.name, s.runs, s.workspace))
                .collect();
            (
                json!({ "sessions": list }),
                if lines.is_empty() { "no sessions".into() } else { lines.join("\n") },
            )
        }
        ServerMessage::Finished(r) => {
            let changes =
                crate::cli::run::summary(&r.changes, false).map(|c| format!("; {c}")).unwrap_or_default();
            (
                json!({ "run_id": r.run_id, "changes": r.changes, "writes_landed": landed }),
                format!("session stopped (run {}){changes}", r.run_id),
            )
        }
        ServerMessage::Error(e) => return Err(refusal(e)),
        other => return Err(failure(format!("the broker answered {other:?}"))),
    };
    let mut result = CallToolResult::structured(value);
    result.content = vec![ContentBlock::text(text)];
    result.is_error = Some(!landed);
    Ok(result)
}

/// A change set call's message: `list_changes`, `show_changes`,
/// `apply_changes` (never over a change someone else made meanwhile, never
/// a file the host executes: a person applies those, with `palisade
/// changes apply --overwrite` or `--host-executed`) or `discard_changes`.
pub fn changes_call(name: &str, args: &JsonObject) -> Result<ClientMessage, ErrorData> {
    let allowed: &[&str] = match name {
        "list_changes" => &[],
        "apply_changes" => &["id"],
        _ => &["id"],
    };
    if let Some(key) = args.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(invalid(format!("unknown argument {key:?}")));
    }
    let id = || -> Result<String, ErrorData> {
        args.get("id")
            .and_then(Value::as_str)
            .map(String::from)
            .ok_or_else(|| invalid("id must be a string".into()))
    };
    Ok(match name {
        "list_changes" => ClientMessage::ListChanges,
        "show_changes" => ClientMessage::ShowChanges { id: id()? },
        // Never over someone else's change, never what the host executes: a person decides those.
        "apply_changes" => ClientMessage::ApplyChanges { id: id()?, overwrite: false, host_executed: false },
        _ => ClientMessage::DiscardChanges { id: id()? },
    })
}

/// A change set call through the broker on `stream`, as a tool result.
pub fn changes(stream: UnixStream, message: ClientMessage) -> Result<CallToolResult, ErrorData> {
    let reply = Client::over(stream).and_then(|mut c| c.request(&message)).map_err(client_error)?;
    // An apply that left part of the change set held is an error: not everything landed.
    let landed = !matches!(&reply, ServerMessage::ChangesApplied(c) if !c.all_landed());
    let (value, text) = match &reply {
        ServerMessage::ChangeSets(sets) => {
            let lines: Vec<String> =
                sets.iter().map(|s| format!("{} ({}): {}", s.id, s.status, s.reason)).collect();
            (
                json!({ "change_sets": sets }),
                if lines.is_empty() { "no change set is held".into() } else { lines.join("\n") },
            )
        }
        ServerMessage::ChangeSet(d) => (serde_json::to_value(&**d).unwrap_or(Value::Null), d.diff.clone()),
        ServerMessage::ChangesApplied(c) => (
            serde_json::to_value(&**c).unwrap_or(Value::Null),
            crate::cli::run::summary(c, false).unwrap_or_else(|| "nothing was left to apply".into()),
        ),
        ServerMessage::ChangesDiscarded { id } => {
            (json!({ "discarded": id }), format!("change set {id}: discarded"))
        }
        ServerMessage::Error(e) => return Err(refusal(e)),
        other => return Err(failure(format!("the broker answered {other:?}"))),
    };
    let mut result = CallToolResult::structured(value);
    result.content = vec![ContentBlock::text(text)];
    result.is_error = Some(!landed);
    Ok(result)
}

/// The explanation as a tool result (a refusal explained is not an error).
pub fn explained(e: Explanation, broker: &str) -> CallToolResult {
    let text = format!("{}policy:   {} ({broker})\n", e.text, e.policy);
    let mut result = CallToolResult::structured(json!({
        "decision": e.decision,
        "kind": e.kind,
        "rule": e.rule,
        "reason": e.reason,
        "policy": e.policy,
        "broker": broker,
        "text": e.text,
    }));
    result.content = vec![ContentBlock::text(text)];
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(defaults: &Defaults, params: Value) -> Result<Call, ErrorData> {
        let args = serde_json::json!({ "tool": "t", "argv": ["cat"], "params": params });
        parse(args.as_object().unwrap(), Shape::RunTool, defaults)
    }

    /// One server offers both: its profile and the flags that edit it go
    /// with its commands, never with a declared tool's run (a request
    /// naming a tool and a profile is refused), which keeps only what can
    /// only narrow it.
    #[test]
    fn a_tool_call_carries_none_of_the_servers_profile() {
        let sandbox = SandboxArgs {
            profile: Some("sh".into()),
            allow_interpreters: true,
            allow_inline_code: true,
            memory: Some(4096),
            hold_changes: true,
            no_fork: true,
            ..SandboxArgs::default()
        };
        let defaults =
            Defaults { workspace: std::env::temp_dir(), sandbox, params_anywhere: false, umask: None };
        let parsed = |shape, args: Value| parse(args.as_object().unwrap(), shape, &defaults).ok().unwrap();
        let command = parsed(Shape::RunCommand, serde_json::json!({ "command": "echo hi | cat" })).request;
        assert_eq!(command.profile.as_deref(), Some("sh"));
        assert!(
            command.allow_interpreters && command.allow_inline_code && command.max_memory_mb == Some(4096)
        );
        for shape in [Shape::RunTool, Shape::Explain] {
            let tool = parsed(shape, serde_json::json!({ "tool": "count", "argv": ["wc", "-l"] })).request;
            assert_eq!((tool.tool.as_deref(), tool.profile.as_deref()), (Some("count"), None));
            assert!(!tool.allow_interpreters && !tool.allow_inline_code && tool.max_memory_mb.is_none());
            assert!(
                tool.no_fork && tool.keep_changes == Some(palisade_protocol::wire::KeepChanges::AlwaysHold)
            );
        }
        // An explanation of a command (no tool) is the server's command's.
        let explained = parsed(Shape::Explain, serde_json::json!({ "argv": ["ls"] })).request;
        assert_eq!(explained.profile.as_deref(), Some("sh"));
    }

    fn rule(e: ErrorData) -> String {
        e.data.and_then(|d| d["rule"].as_str().map(String::from)).unwrap_or_default()
    }

    #[test]
    fn a_calls_parameters_stay_in_the_servers_workspace_unless_the_person_says_otherwise() {
        let dir = std::env::temp_dir().join(format!("palisade-mcp-params-{}", std::process::id()));
        let ws = dir.join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::write(ws.join("inside.txt"), "in").unwrap();
        std::fs::write(dir.join("outside.txt"), "out").unwrap();
        std::os::unix::fs::symlink(dir.join("outside.txt"), ws.join("link-out")).unwrap();
        let mut defaults = Defaults {
            workspace: ws.clone(),
            sandbox: SandboxArgs::default(),
            params_anywhere: false,
            umask: None,
        };
        let outside = dir.join("outside.txt").display().to_string();
        for refused in [
            serde_json::json!({ "file": "../outside.txt" }),
            serde_json::json!({ "file": outside }),
            serde_json::json!({ "file": "link-out" }),
            serde_json::json!({ "files": ["inside.txt", "sub/../../outside.txt"] }),
            serde_json::json!({ "file": "sub/../../not-yet/out.txt" }),
        ] {
            let e =
                call(&defaults, refused.clone()).err().unwrap_or_else(|| panic!("{refused} was let through"));
            palisade_policy::denial::names_a_fix_or_why_none("mcp.workspace", &e.message).unwrap();
            assert_eq!(rule(e), "mcp.workspace", "{refused}");
        }
        // A call's workspace outside the server's, refused the same way.
        let args = serde_json::json!({ "argv": ["ls"], "workspace": ".." });
        let e = parse(args.as_object().unwrap(), Shape::RunCommand, &defaults).err().unwrap();
        palisade_policy::denial::names_a_fix_or_why_none("mcp.workspace", &e.message).unwrap();
        assert_eq!(rule(e), "mcp.workspace");
        // Counter-tests: inside it (existing or not yet), and anywhere when
        // the person started the server so.
        for allowed in [
            serde_json::json!({ "file": "inside.txt" }),
            serde_json::json!({ "files": ["inside.txt", "sub/new.txt"] }),
            serde_json::json!({ "file": ws.join("sub").display().to_string() }),
        ] {
            assert!(call(&defaults, allowed.clone()).is_ok(), "{allowed}");
        }
        defaults.params_anywhere = true;
        assert!(call(&defaults, serde_json::json!({ "file": "../outside.txt" })).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A run held for approval says who approved it, in `approved` and in
    /// a line of its text; a run nobody was asked about has neither.
    #[test]
    fn the_result_names_who_approved_the_run() {
        let result = |approved: Value| {
            let json = serde_json::json!({
                "run_id": 3, "status": {"exited": {"code": 0}}, "wall_ms": 4, "cpu_user_ms": 0,
                "cpu_system_ms": 0, "peak_memory_bytes": 0, "memory_source": "rusage",
                "stdout_bytes": 0, "stderr_bytes": 0, "written_bytes": 0,
                "changes": {"outcome": "none", "id": null, "files": 0, "dirs": 0, "removed": 0, "bytes": 0,
                            "held": 0, "discarded": 0, "conflicts": [], "reason": null, "withheld": []},
                "attestation": {
                    "execution_sha256": "00", "executor": "linux-tier-c",
                    "enforcement": {
                        "namespaces": ["user"], "built": "cold", "host_uid": 1000, "landlock": null,
                        "seccomp_sha256": "00", "seccomp_instructions": 1, "rlimits": [], "cgroup": null,
                        "limits_by": "rlimits", "network": "none: a network namespace with only loopback",
                        "egress": "preflight", "disk": "tmpfs /tmp of 256 MiB",
                        "memory": "RLIMIT_DATA 512 MiB and RLIMIT_AS 2 GiB per process; /tmp and /dev/shm 512 MiB together (/tmp 256 MiB, /dev/shm 256 MiB)"
                    },
                    "warnings": [], "journal": null
                },
                "approved": approved
            });
            let ran = Ran {
                outcome: Ok(serde_json::from_value(json).unwrap()),
                stdout: Capped::new(1024),
                stderr: Capped::new(1024),
            };
            let r = super::result(ran, "b").unwrap();
            let text =
                r.content.first().and_then(|c| c.as_text()).map(|t| t.text.clone()).unwrap_or_default();
            (r.structured_content.unwrap()["approved"].clone(), text)
        };
        let who = serde_json::json!({"uid": 1002, "name": "alice", "rule": "cedar.ask", "reason": "pushes"});
        let (approved, text) = result(who.clone());
        assert_eq!(approved, who);
        assert!(text.contains("\napproved by alice (uid 1002): cedar.ask\n"), "{text}");
        let (approved, text) = result(Value::Null);
        assert_eq!(approved, Value::Null);
        assert!(!text.contains("approved"), "{text}");
    }
}
