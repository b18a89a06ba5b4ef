//! How a run's messages are shown and its end becomes the exit status:
//! the same through a broker's socket and with an embedded one.

use palisade_protocol::wire::{ErrorKind, ErrorReply, RunResult, RunStatus, ServerMessage, Stream};
use std::io::Write;

pub use crate::{EXIT_PALISADE, fail};

fn write_fd(fd: std::os::fd::RawFd, data: &[u8]) -> std::io::Result<()> {
    // SAFETY: the descriptor is one of the process's standard streams, open for
    // its whole life; ManuallyDrop keeps this File from closing it.
    let mut file =
        std::mem::ManuallyDrop::new(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    file.write_all(data)
}

/// Shows a run's messages: output streamed as it comes, or gathered for --json.
#[derive(Default)]
pub struct Render {
    json: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Which broker ran the command, for the JSON object.
    broker: Option<String>,
    /// The reader of stdout left (a write met EPIPE: `palisade run ... | head`).
    reader_gone: bool,
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

    /// Shows a piece of output. `false` once the reader of stdout has left
    /// (EPIPE): the caller ends the run, as SIGPIPE ends a command whose
    /// reader left, and the stdout that still comes goes nowhere.
    pub fn output(&mut self, stream: Stream, data: &[u8]) -> bool {
        match (self.json, stream) {
            (true, Stream::Stdout) => self.stdout.extend_from_slice(data),
            (true, Stream::Stderr) => self.stderr.extend_from_slice(data),
            (false, Stream::Stdout) if self.reader_gone => {}
            // Straight to the descriptors: no line buffering to scan
            // output for newlines, and nothing held back.
            (false, Stream::Stdout) => {
                let written = write_fd(libc::STDOUT_FILENO, data);
                if written.is_err_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) {
                    self.reader_gone();
                }
            }
            (false, Stream::Stderr) => {
                let _ = write_fd(libc::STDERR_FILENO, data);
            }
        }
        !self.reader_gone
    }

    /// The reader of stdout left: [`Render::finish`] ends the process as
    /// SIGPIPE would, once it has said what became of the run's writes.
    pub fn reader_gone(&mut self) {
        self.reader_gone = true;
    }

    pub fn finish(self, outcome: Result<RunResult, ErrorReply>) -> i32 {
        if self.json {
            crate::outln!("{}", self.json_value(&outcome));
        } else if let Ok(r) = &outcome {
            say_approved(r);
            say_egress(r);
            say_changes(r);
        }
        if self.reader_gone && outcome.is_ok() {
            // The run was cancelled when its reader left (or had ended):
            // palisade ends as the writer of a pipe nobody reads does.
            crate::out::closed();
        }
        match outcome {
            // The command ended by itself, but its writes did not all land: never as if they had.
            Ok(r)
                if matches!(
                    r.status,
                    RunStatus::Exited { .. } | RunStatus::Signaled { .. } | RunStatus::Stopped
                ) && !r.changes.all_landed() =>
            {
                crate::EXIT_NOT_APPLIED
            }
            Ok(r) => match r.status {
                RunStatus::Exited { code } => code,
                // As a shell reports a command killed by a signal.
                RunStatus::Signaled { signal } => 128 + signal,
                // A session its requester stopped: done as asked.
                RunStatus::Stopped => 0,
                // Interrupted (^C, or a SIGTERM or SIGHUP to palisade): as a
                // shell reports an interrupted command; the result says
                // `cancelled`.
                RunStatus::Cancelled => {
                    if !self.json {
                        eprintln!("palisade: cancelled: the run was interrupted and killed");
                    }
                    EXIT_INTERRUPTED
                }
                ended => {
                    let kind = ended.error_kind().unwrap_or(ErrorKind::RuntimeFailure);
                    let message = ended_by_palisade(&r);
                    quiet_fail(self.json, kind, message)
                }
            },
            Err(e) => quiet_fail(self.json, e.kind, e.message),
        }
    }
}

/// The exit status of a run interrupted (128 + SIGINT, as a shell's).
pub const EXIT_INTERRUPTED: i32 = 130;

/// What the CLI says of a run palisade ended (its kind is
/// [`RunStatus::error_kind`]'s): the limit it passed names its value and key.
pub fn ended_by_palisade(r: &RunResult) -> String {
    let limits = &r.attestation.enforcement;
    match r.status {
        RunStatus::TimedOut => {
            format!("killed at the deadline of {} s (max_execution_time; --timeout)", limits.deadline_secs)
        }
        RunStatus::QuotaExceeded => format!(
            "output exceeded its quota of {} bytes (max_output_bytes; --max-output); killed",
            limits.max_output_bytes
        ),
        RunStatus::MemoryLimitExceeded => "killed by the memory limit".into(),
        RunStatus::DiskLimitExceeded => match &r.changes.reason {
            Some(why) => why.clone(),
            None => "the run's writes reached their bound (max_disk_mb)".into(),
        },
        RunStatus::Cancelled => "the run was cancelled".into(),
        RunStatus::Stopped => "the session was stopped by its requester".into(),
        RunStatus::Exited { .. } | RunStatus::Signaled { .. } => "the command ended by itself".into(),
    }
}

/// With --json the error is in the object; otherwise it gets its line.
pub fn quiet_fail(json: bool, kind: ErrorKind, message: impl std::fmt::Display) -> i32 {
    if json { EXIT_PALISADE } else { fail(kind, message) }
}

/// Who approved a run that was held for approval, and the rule that held it.
fn say_approved(r: &RunResult) {
    if let Some(line) = approved_line(r) {
        eprintln!("palisade: {line}");
    }
}

/// `approved by alice (uid 1002): cedar.ask`, for a run that was held for
/// approval (its name escaped, see [`crate::escape`]).
pub fn approved_line(r: &RunResult) -> Option<String> {
    let a = r.approved.as_ref()?;
    let rule = crate::escape::name(&a.rule);
    Some(match &a.name {
        Some(name) => format!("approved by {} (uid {}): {rule}", crate::escape::name(name), a.uid),
        None => format!("approved by uid {}: {rule}", a.uid),
    })
}

/// Strict egress: one line per name (and reason) a run was refused, once:
/// a refused connection is otherwise seen only by the program (curl
/// without `-f` exits 0 on the proxy's 403). `--json` has them all in the
/// attestation's `egress_traffic.denied`.
fn say_egress(r: &RunResult) {
    let Some(traffic) = &r.attestation.enforcement.egress_traffic else { return };
    let mut said: Vec<(&str, &str)> = Vec::new();
    for d in &traffic.denied {
        if said.contains(&(d.host.as_str(), d.reason.as_str())) {
            continue;
        }
        said.push((&d.host, &d.reason));
        let (host, detail) = (crate::escape::name(&d.host), crate::escape::text(&d.detail));
        eprintln!("palisade: egress refused: {host} ({}): {}", d.reason, detail.replace('\n', " "));
    }
    if traffic.denied_omitted > 0 {
        eprintln!("palisade: egress refused: {} more attempts (see --json)", traffic.denied_omitted);
    }
}

/// The change set's line under a run's output, and, where the command
/// ended by itself but its writes did not all land, its own status.
#[cfg(target_os = "linux")]
fn say_changes(r: &RunResult) {
    let Some(line) = summary(&r.changes, true) else { return };
    eprintln!("palisade: {line}");
    let status = match r.status {
        RunStatus::Exited { code } => format!("exited with {code}"),
        RunStatus::Signaled { signal } => format!("was killed by signal {signal}"),
        _ => return,
    };
    if !r.changes.all_landed() {
        eprintln!(
            "palisade: the command {status}; palisade exits {} as its writes did not all land",
            crate::EXIT_NOT_APPLIED
        );
    }
}

/// Change sets are Linux's: a macOS run writes in place.
#[cfg(not(target_os = "linux"))]
fn say_changes(_: &RunResult) {}

/// The one line about a run's writes: `quiet` says nothing of writes
/// simply applied (what `palisade run` does), only of what was held,
/// partly applied, discarded, conflicted or withheld. The run's names in
/// it are escaped (see [`crate::escape`]).
pub fn summary(c: &palisade_protocol::wire::Changes, quiet: bool) -> Option<String> {
    use palisade_protocol::wire::ChangesOutcome as O;
    let id = c.id.as_deref().unwrap_or("-");
    let reason = c.reason.as_deref().unwrap_or("");
    let applied = format!("{} file(s), {} dir(s), {} removed", c.files, c.dirs, c.removed);
    let mut line = match c.outcome {
        O::None | O::InPlace => return withheld_line(c),
        O::Applied if c.withheld.is_empty() && quiet => return None,
        O::Applied => format!("changes applied: {applied}"),
        O::Partial => format!(
            "changes partly applied ({applied}); change set {id} holds {} more: {reason} (palisade changes show {id})",
            c.held
        ),
        O::Held => format!(
            "changes held as {id} ({} entries), none applied: {reason} (palisade changes show {id})",
            c.held
        ),
        O::Discarded => format!("changes discarded ({} entries), none applied: {reason}", c.discarded),
    };
    if !c.conflicts.is_empty() {
        let names: Vec<_> = c.conflicts.iter().map(|p| crate::escape::name(p)).collect();
        line.push_str(&format!("; the host's version kept (changed meanwhile): {}", names.join(", ")));
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
    let each: Vec<String> =
        c.withheld.iter().map(|w| format!("{} ({})", crate::escape::name(&w.path), w.what)).collect();
    Some(format!("not applied: {}", each.join(", ")))
}
