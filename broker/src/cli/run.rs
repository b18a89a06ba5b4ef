//! `palisade run`'s side that every system shares: its arguments, the
//! request they make, and how a run's messages are shown and its end
//! becomes the exit status.

use crate::engine::stream::Sink;
use clap::Args as ClapArgs;
use palisade_protocol::wire::{
    ErrorKind, ErrorReply, KeepChanges, OnConflict, ParamValue, RunRequest, RunResult, RunStatus,
    ServerMessage, Stream,
};
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

/// Exit status when palisade refused or failed (not the command).
pub const EXIT_PALISADE: i32 = 125;

#[derive(ClapArgs, Debug)]
pub struct RunArgs {
    /// Broker socket [default: $PALISADE_SOCKET, else your broker's, else
    /// the system broker's; an embedded broker runs when none answers,
    /// unless the system configuration requires the system broker].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The writable workspace [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Policy file: run with an embedded broker under this policy.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Deadline in seconds (can only lower the policy's).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Output quota in bytes, stdout and stderr together (can only lower the policy's).
    #[arg(long = "max-output", value_name = "BYTES")]
    pub max_output: Option<u64>,
    /// Print the result and its attestation as one JSON object: "result"
    /// (or "error" for a refusal or failure), "broker" (which ran it),
    /// and each stream as "stdout"/"stderr" text when it is UTF-8, else
    /// its bytes as "stdout_base64"/"stderr_base64".
    #[arg(long)]
    pub json: bool,
    /// Give the command an empty stdin. Without it, palisade's stdin, when it
    /// is not a terminal, is read to its end and passed to the command.
    #[arg(short = 'n', long = "no-stdin")]
    pub no_stdin: bool,
    /// Run as a tool declared in the policy.
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

/// What the sandbox may do. With an embedded broker, the person running
/// the CLI owns the policy: these flags edit the profile (`[defaults]`, or
/// `--profile`'s) before the run. Through a daemon, a request can only
/// narrow the daemon's policy: a flag that would widen it is refused,
/// naming the flag and the key an operator would change.
#[derive(ClapArgs, Debug, Default, Clone)]
#[command(next_help_heading = "Sandbox (embedded: edits the profile; through a daemon: may only narrow it)")]
pub struct SandboxArgs {
    /// Use the profile the configuration declares as [profiles.NAME] instead of [defaults].
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// Let interpreters run (shells, python3, node, ...).
    #[arg(long)]
    pub allow_interpreters: bool,
    /// Let inline code run (`sh -c`, `python3 -c`, a script on stdin).
    #[arg(long)]
    pub allow_inline_code: bool,
    /// Let the command reach this host name, exact or *.suffix (repeatable):
    /// through the egress proxy, enforced by the kernel (strict egress).
    #[arg(long = "allow-domain", value_name = "NAME")]
    pub allow_domains: Vec<String>,
    /// Make PATH visible read-only (repeatable).
    #[arg(long = "read-only", value_name = "PATH")]
    pub read_only: Vec<PathBuf>,
    /// Make PATH writable, as the workspace is (repeatable; it must exist).
    #[arg(long = "read-write", value_name = "PATH")]
    pub read_write: Vec<PathBuf>,
    /// Pass variable NAME to the command: its value here, or VALUE (repeatable).
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,
    /// Memory limit in MiB.
    #[arg(long, value_name = "MB")]
    pub memory: Option<u64>,
    /// Limit on the number of processes.
    #[arg(long, value_name = "N")]
    pub processes: Option<u64>,
    /// No new processes: fork and clone are refused.
    #[arg(long)]
    pub no_fork: bool,
    /// Hold the run's writes as a change set for review instead of applying
    /// them (palisade changes show ID, apply ID, discard ID).
    #[arg(long)]
    pub hold_changes: bool,
    /// A path someone else changed in the workspace while the run ran:
    /// keep_host (the default: the run's version is held), hold (apply
    /// nothing), overwrite (the run's version wins).
    #[arg(long, value_name = "WHAT", value_parser = on_conflict)]
    pub on_conflict: Option<OnConflict>,
    /// Write the workspace in place, live (no change set: nothing to review,
    /// no conflict found); the profile must allow it (allow_direct).
    #[arg(long)]
    pub direct: bool,
}

fn on_conflict(s: &str) -> Result<OnConflict, String> {
    match s {
        "keep_host" => Ok(OnConflict::KeepHost),
        "hold" => Ok(OnConflict::Hold),
        "overwrite" => Ok(OnConflict::Overwrite),
        other => Err(format!("{other:?}: one of keep_host, hold, overwrite")),
    }
}

impl SandboxArgs {
    /// The request's asks: what the daemon checks against its policy.
    pub fn ask(&self, req: &mut RunRequest, cwd: &std::path::Path) -> Result<(), String> {
        let absolute = |paths: &[PathBuf]| -> Vec<String> {
            paths.iter().map(|p| cwd.join(p).to_string_lossy().into_owned()).collect()
        };
        req.profile = self.profile.clone();
        req.allow_interpreters = self.allow_interpreters;
        req.allow_inline_code = self.allow_inline_code;
        req.allow_domains = (!self.allow_domains.is_empty()).then(|| self.allow_domains.clone());
        req.read_only = absolute(&self.read_only);
        req.read_write = absolute(&self.read_write);
        req.max_memory_mb = self.memory;
        req.max_processes = self.processes;
        req.no_fork = self.no_fork;
        req.keep_changes = self.hold_changes.then_some(KeepChanges::AlwaysHold);
        req.on_conflict = self.on_conflict;
        req.direct = self.direct;
        for spec in &self.env {
            let (name, value) = match spec.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (spec.as_str(), None),
            };
            if name.is_empty() {
                return Err(format!("--env {spec}: expected NAME or NAME=VALUE"));
            }
            match value {
                Some(v) => {
                    req.env.insert(name.into(), v.into());
                }
                None if !req.env.contains_key(name) => {
                    return Err(format!("--env {name}: {name} is not set here (give it as {name}=VALUE)"));
                }
                None => {}
            }
            req.pass_env.push(name.into());
        }
        Ok(())
    }

    /// The embedded broker's policy, edited: the profile grants what the
    /// flags ask for (the person running the CLI owns it).
    pub fn edit(&self, config: &mut palisade_policy::Config, cwd: &std::path::Path) -> Result<(), String> {
        use palisade_policy::capabilities::NetworkCapability;
        let profile = match &self.profile {
            None => &mut config.defaults,
            Some(name) => config
                .profiles
                .get_mut(name)
                .ok_or_else(|| format!("--profile {name}: the policy declares no [profiles.{name}]"))?,
        };
        profile.allow_interpreters |= self.allow_interpreters;
        profile.allow_inline_code |= self.allow_inline_code;
        if !self.allow_domains.is_empty() {
            let mut domains = match &profile.network {
                NetworkCapability::AllowDomains(d) => d.clone(),
                _ => vec![],
            };
            domains.extend(self.allow_domains.iter().cloned());
            if profile.network != NetworkCapability::AllowAll {
                profile.network = NetworkCapability::AllowDomains(domains);
            }
            profile.egress = palisade_policy::egress::EgressMode::Strict;
        }
        profile.read_only.extend(self.read_only.iter().map(|p| cwd.join(p)));
        profile.read_write.extend(self.read_write.iter().map(|p| cwd.join(p)));
        profile.pass_env.extend(self.env.iter().map(|e| e.split('=').next().unwrap_or(e).to_string()));
        profile.max_memory_mb = self.memory.unwrap_or(profile.max_memory_mb);
        profile.max_processes = self.processes.unwrap_or(profile.max_processes);
        profile.no_fork |= self.no_fork;
        if self.hold_changes {
            profile.keep_changes = KeepChanges::AlwaysHold;
        }
        profile.on_conflict = self.on_conflict.unwrap_or(profile.on_conflict);
        if self.direct {
            profile.disk = palisade_policy::config::DiskMode::Direct;
        }
        Ok(())
    }
}

pub fn params(pairs: &[String]) -> Result<std::collections::BTreeMap<String, ParamValue>, String> {
    let mut out: std::collections::BTreeMap<String, ParamValue> = Default::default();
    for p in pairs {
        let (k, v) = p.split_once('=').ok_or_else(|| format!("--param {p}: expected NAME=PATH"))?;
        let value = match out.remove(k) {
            None => ParamValue::One(v.into()),
            Some(ParamValue::One(first)) => ParamValue::Many(vec![first, v.into()]),
            Some(ParamValue::Many(mut all)) => {
                all.push(v.into());
                ParamValue::Many(all)
            }
        };
        out.insert(k.into(), value);
    }
    Ok(out)
}

pub fn fail(kind: ErrorKind, message: impl std::fmt::Display) -> i32 {
    eprintln!("palisade: {kind}: {message}");
    EXIT_PALISADE
}

pub fn request(args: &RunArgs, read_stdin: bool) -> Result<RunRequest, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let mut stdin = Vec::new();
    if read_stdin && !std::io::stdin().is_terminal() {
        std::io::stdin().read_to_end(&mut stdin).map_err(|e| format!("reading stdin: {e}"))?;
    }
    let mut req = RunRequest {
        argv: args.command.clone(),
        env: std::env::vars().collect(),
        cwd: Some(cwd.to_string_lossy().into_owned()),
        workspace: args.workspace.as_ref().map(|w| cwd.join(w).to_string_lossy().into_owned()),
        stdin,
        timeout_secs: args.timeout,
        max_output_bytes: args.max_output,
        tool: args.tool.clone(),
        params: params(&args.params)?,
        umask: own_umask(),
        ..RunRequest::default()
    };
    args.sandbox.ask(&mut req, &cwd)?;
    Ok(req)
}

/// This process's umask, which a request carries so that what the command
/// creates gets the modes it would get here: read from `/proc/self/status`
/// (Linux 4.7 and later), which changes nothing (setting it to read it
/// back would change it for every thread meanwhile). `None` where it cannot
/// be read: the broker's own umask applies.
pub fn own_umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(field.trim(), 8).ok()
}

fn write_fd(fd: std::os::fd::RawFd, data: &[u8]) {
    // SAFETY: the descriptor is one of the process's standard streams, open for
    // its whole life; ManuallyDrop keeps this File from closing it.
    let mut file =
        std::mem::ManuallyDrop::new(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    let _ = file.write_all(data);
}

/// Shows a run's messages: output streamed as it comes, or gathered for --json.
#[derive(Default)]
pub struct Render {
    json: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Which broker ran the command, for the JSON object.
    broker: Option<String>,
}

impl Render {
    /// Output streamed as it comes, or gathered for one JSON object (`json`).
    pub fn new(json: bool) -> Render {
        Render { json, ..Render::default() }
    }

    pub fn json(&self) -> bool {
        self.json
    }

    /// Names the broker that runs the command (`the broker on PATH`, `embedded`).
    pub fn by(&mut self, broker: impl Into<String>) {
        self.broker = Some(broker.into());
    }

    /// The JSON object: the result or the error, which broker, and each
    /// stream as text when it is UTF-8, else its bytes in base64
    /// (`stdout_base64`), never altered.
    fn json_value(&self, outcome: &Result<RunResult, ErrorReply>) -> serde_json::Value {
        use base64::Engine;
        let mut value = match outcome {
            Ok(r) => serde_json::json!({ "result": r }),
            Err(e) => serde_json::json!({ "error": e }),
        };
        value["broker"] = self.broker.clone().into();
        for (name, bytes) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            match std::str::from_utf8(bytes) {
                Ok(text) => value[name] = text.into(),
                Err(_) => {
                    value[format!("{name}_base64")] =
                        base64::engine::general_purpose::STANDARD.encode(bytes).into()
                }
            }
        }
        value
    }

    pub fn on(&mut self, msg: &ServerMessage) {
        if let ServerMessage::Output { stream, data } = msg {
            self.output(*stream, data);
        }
    }

    pub fn output(&mut self, stream: Stream, data: &[u8]) {
        match (self.json, stream) {
            (true, Stream::Stdout) => self.stdout.extend_from_slice(data),
            (true, Stream::Stderr) => self.stderr.extend_from_slice(data),
            // Straight to the descriptors: no line buffering to scan
            // output for newlines, and nothing held back.
            (false, Stream::Stdout) => write_fd(libc::STDOUT_FILENO, data),
            (false, Stream::Stderr) => write_fd(libc::STDERR_FILENO, data),
        }
    }

    pub fn finish(self, outcome: Result<RunResult, ErrorReply>) -> i32 {
        if self.json {
            println!("{}", self.json_value(&outcome));
        } else if let Ok(r) = &outcome {
            say_changes(r);
        }
        match outcome {
            Ok(r) => match r.status {
                RunStatus::Exited { code } => code,
                // As a shell reports a command killed by a signal.
                RunStatus::Signaled { signal } => 128 + signal,
                ended => {
                    let kind = ended.error_kind().unwrap_or(ErrorKind::RuntimeFailure);
                    quiet_fail(self.json, kind, ended_by_palisade(ended))
                }
            },
            Err(e) => quiet_fail(self.json, e.kind, e.message),
        }
    }
}

/// What the CLI says of a run palisade ended (its kind is
/// [`RunStatus::error_kind`]'s).
pub fn ended_by_palisade(status: RunStatus) -> &'static str {
    match status {
        RunStatus::TimedOut => "killed at the deadline",
        RunStatus::QuotaExceeded => "output exceeded its quota; killed",
        RunStatus::MemoryLimitExceeded => "killed by the memory limit",
        RunStatus::DiskLimitExceeded => "the run's writes filled their bound; none was kept",
        RunStatus::Cancelled => "the run was cancelled",
        RunStatus::Exited { .. } | RunStatus::Signaled { .. } => "the command ended by itself",
    }
}

/// With --json the error is in the object; otherwise it gets its line.
pub fn quiet_fail(json: bool, kind: ErrorKind, message: impl std::fmt::Display) -> i32 {
    if json { EXIT_PALISADE } else { fail(kind, message) }
}

pub struct RenderSink<'a>(pub &'a mut Render);

impl Sink for RenderSink<'_> {
    async fn send(&mut self, msg: ServerMessage) -> bool {
        match msg {
            ServerMessage::Output { stream, data } => self.send_output(stream, &data).await,
            other => {
                self.0.on(&other);
                true
            }
        }
    }

    /// Written asynchronously (tokio writes the standard streams from its
    /// blocking pool): a reader of ours that stalls must not stall the run's
    /// deadline with it.
    async fn send_output(&mut self, stream: Stream, data: &[u8]) -> bool {
        use tokio::io::AsyncWriteExt;
        if self.0.json {
            self.0.output(stream, data);
            return true;
        }
        // tokio hands the bytes to a blocking thread: the flush waits until they
        // are written (in order across the two streams, and before exit). A
        // reader gone (EPIPE) does not end the run: its output goes nowhere, as in a shell.
        async fn write(mut out: impl tokio::io::AsyncWrite + Unpin, data: &[u8]) -> std::io::Result<()> {
            out.write_all(data).await?;
            out.flush().await
        }
        let _ = match stream {
            Stream::Stdout => write(tokio::io::stdout(), data).await,
            Stream::Stderr => write(tokio::io::stderr(), data).await,
        };
        true
    }
}

/// The change set's line under a run's output. A run that filled its bound
/// says it kept nothing in its own line.
#[cfg(target_os = "linux")]
fn say_changes(r: &RunResult) {
    let summary = summary(&r.changes, true);
    if let Some(line) = summary.filter(|_| r.status != RunStatus::DiskLimitExceeded) {
        eprintln!("palisade: {line}");
    }
}

/// Change sets are Linux's: a macOS run writes in place.
#[cfg(not(target_os = "linux"))]
fn say_changes(_: &RunResult) {}

/// The one line about a run's writes: `quiet` says nothing of writes
/// simply applied (what `palisade run` does), only of what was held,
/// discarded, conflicted or withheld.
pub fn summary(c: &palisade_protocol::wire::Changes, quiet: bool) -> Option<String> {
    use palisade_protocol::wire::ChangesOutcome as O;
    let id = c.id.as_deref().unwrap_or("-");
    let plain = c.conflicts.is_empty() && c.id.is_none() && c.withheld.is_empty();
    let mut line = match c.outcome {
        O::None | O::InPlace => return withheld_line(c),
        O::Applied if plain && quiet => return None,
        O::Applied if plain => format!("changes applied: {} file(s), {} removed", c.files, c.removed),
        O::Applied => format!(
            "changes applied: {} file(s), {} removed; change set {id} holds the rest: {}",
            c.files,
            c.removed,
            c.reason.as_deref().unwrap_or("")
        ),
        O::Held => format!(
            "changes held as {id}: {} (palisade changes show {id})",
            c.reason.as_deref().unwrap_or("")
        ),
        O::Discarded => format!("changes discarded: {}", c.reason.as_deref().unwrap_or("")),
    };
    if !c.conflicts.is_empty() {
        line.push_str(&format!("; the host's version kept (changed meanwhile): {}", c.conflicts.join(", ")));
    }
    if let Some(w) = withheld_line(c) {
        line.push_str("; ");
        line.push_str(&w);
    }
    Some(line)
}

fn withheld_line(c: &palisade_protocol::wire::Changes) -> Option<String> {
    if c.withheld.is_empty() {
        return None;
    }
    let each: Vec<String> = c.withheld.iter().map(|w| format!("{} ({})", w.path, w.what)).collect();
    Some(format!("not applied: {}", each.join(", ")))
}
