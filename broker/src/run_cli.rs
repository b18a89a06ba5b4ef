//! `palisade run`'s side that every system shares: its arguments, the
//! request they make, and how a run's messages are shown and its end
//! becomes the exit status.

use crate::stream::Sink;
use clap::Args as ClapArgs;
use palisade_protocol::wire::{
    ErrorKind, ErrorReply, ParamValue, RunRequest, RunResult, RunStatus, ServerMessage, Stream,
};
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

/// Exit status when palisade refused or failed (not the command).
pub const EXIT_PALISADE: i32 = 125;

#[derive(ClapArgs, Debug)]
pub struct RunArgs {
    /// Broker socket [default: $PALISADE_SOCKET, else the default socket; an
    /// embedded broker runs when none answers there].
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
    /// Print the result and its attestation as one JSON object (output
    /// included); a refusal or failure too, as {"error": ...}.
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
    /// Narrow the network to this name, exact or *.suffix (repeatable):
    /// each must be within the tool's (or default profile's) allow_domains.
    #[arg(long = "allow-domain", value_name = "NAME")]
    pub allow_domains: Vec<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
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
    Ok(RunRequest {
        argv: args.command.clone(),
        env: std::env::vars().collect(),
        cwd: Some(cwd.to_string_lossy().into_owned()),
        workspace: args.workspace.as_ref().map(|w| cwd.join(w).to_string_lossy().into_owned()),
        stdin,
        timeout_secs: args.timeout,
        max_output_bytes: args.max_output,
        tool: args.tool.clone(),
        params: params(&args.params)?,
        allow_domains: (!args.allow_domains.is_empty()).then(|| args.allow_domains.clone()),
    })
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
}

impl Render {
    /// Output streamed as it comes, or gathered for one JSON object (`json`).
    pub fn new(json: bool) -> Render {
        Render { json, ..Render::default() }
    }

    pub fn json(&self) -> bool {
        self.json
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
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            let value = match &outcome {
                Ok(r) => {
                    serde_json::json!({ "result": r, "stdout": text(&self.stdout), "stderr": text(&self.stderr) })
                }
                Err(e) => {
                    serde_json::json!({ "error": e, "stdout": text(&self.stdout), "stderr": text(&self.stderr) })
                }
            };
            println!("{value}");
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
