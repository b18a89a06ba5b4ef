//! Client ⇄ broker messages and their two encodings.
//!
//! A connection starts with the client's `Hello` (magic, protocol version,
//! encoding). The broker tells the encodings apart by the first byte:
//!
//! - **bincode**: frames of a u32 big-endian length followed by a bincode 2
//!   body (the length's first byte is 0 for any frame under 16 MiB);
//! - **JSON lines**: one JSON object per line, starting with `{`.
//!
//! Both carry the same messages; `docs/protocol.md` documents the JSON form.
//! Decoding is sans-IO: [`Decoder`] takes bytes as they arrive and yields
//! messages, refusing frames over the size limit before buffering them.

pub use crate::attest::{Attestation, Enforcement, Executor, LandlockEnforcement, MemorySource};
pub use crate::kind::ErrorKind;
use crate::status::HelperFailure;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

pub const MAGIC: &str = "palisade";
/// The version both sides say in their hello; a change of any message's
/// bincode form changes it (2: `ErrorReply` gained `helper`, and the
/// attestation is typed; 3: `JournalUnavailable`, the attestation's
/// journal record, approvals by id, approvers and trust stages; 4: strict
/// egress, the run request's `allow_domains` and the attestation's egress
/// traffic; 5: WebAssembly skill plugins, `RunPlugin` and `PluginResult`; 6: the
/// plugin-host's cgroup in a plugin result's attestation; 7: the warm pool,
/// the attestation's `built`; 8: the `macos-seatbelt` executor and the
/// attestation's `seatbelt_sha256`; 9: the request's asks and `profile`,
/// `Explain` and `Explained`; 10: the rlimit `DATA`, and `memory` naming
/// RLIMIT_DATA and RLIMIT_AS; 11: the result's `changes`, a plugin
/// result's `store`, `Status`; 12: the request's `no_toolchains`, the
/// enforcement's `deadline_secs` and `max_output_bytes`; 13: the hello's
/// `min_version`, the range a client speaks; 14: `RunWithStdin`, `Stdin`
/// and `StdinEnd`, a run's stdin streamed during it; 15: `RunInTerminal` and
/// `Resize`, a run in a terminal; 16: sessions, `StartSession`,
/// `RunInSession`, `ListSessions`, `StopSession`, `SessionStarted` and
/// `Sessions`; 17: `Publish` and `Published`, a session's port published
/// to its requester, `RunInSessionWithStdin` and `RunInSessionInTerminal`;
/// 18: inspected requests in the egress traffic; 19: a run's writes that
/// did not all land say so: `Changes`' outcome `partial`, its counts
/// `dirs`, `held` and `discarded`, the withheld reason `not_carried`; 20:
/// the run request's `allow_ports` and `allow_addresses`, the run status
/// `stopped` and a change set's `broker`; 21: the status's runs, sessions,
/// shares and last reload, the result's `approved`).
pub const PROTOCOL_VERSION: u32 = 21;

pub use crate::plan::{WINDOW_MAX, WindowSize};
/// The oldest version a broker still speaks: the one before its own, for
/// one release (docs/protocol.md, "Versions").
pub const OLDEST_PROTOCOL_VERSION: u32 = 12;
/// Largest frame (or JSON line) either side accepts.
pub const MAX_FRAME_BYTES: usize = 8 << 20;
/// Largest frame (or JSON line) of a client message other than a `run`
/// carrying `stdin`, where the broker asks for it
/// ([`Decoder::set_small_limit`]): only stdin needs more. A request at the
/// default limits of its arguments (128 of 4 KiB) fits, with a large
/// environment beside them.
pub const SMALL_FRAME_BYTES: usize = 1 << 20;
/// `ClientMessage::Run`'s variant index, the first byte of its bincode body
/// (a varint: one byte below 251).
const RUN_VARIANT: u8 = 1;
/// How far into a JSON line over [`SMALL_FRAME_BYTES`] its `{"run"` is
/// looked for (whitespace included): a run's line names it first.
#[cfg(feature = "json")]
const JSON_RUN_SCAN: usize = 64;

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    Bincode,
    Json,
}

/// A client's hello: it speaks the versions from `min_version` (absent:
/// `version` alone) to `version`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub magic: String,
    pub version: u32,
    pub encoding: Encoding,
    #[serde(default)]
    pub min_version: Option<u32>,
}

impl Hello {
    pub fn new(encoding: Encoding) -> Hello {
        Hello {
            magic: MAGIC.into(),
            version: PROTOCOL_VERSION,
            encoding,
            min_version: Some(OLDEST_PROTOCOL_VERSION),
        }
    }

    /// The highest version both this hello's client and this broker speak,
    /// or why there is none.
    pub fn agreed_version(&self) -> Result<u32, String> {
        let lowest = self.min_version.unwrap_or(self.version);
        if lowest > self.version {
            return Err(format!("min_version {lowest} is above version {}", self.version));
        }
        let agreed = self.version.min(PROTOCOL_VERSION);
        if agreed < lowest.max(OLDEST_PROTOCOL_VERSION) {
            let theirs = if lowest == self.version {
                format!("{lowest}")
            } else {
                format!("{lowest} to {}", self.version)
            };
            return Err(format!(
                "protocol version {theirs} is not supported; this broker speaks {OLDEST_PROTOCOL_VERSION} to {PROTOCOL_VERSION}"
            ));
        }
        Ok(agreed)
    }
}

/// A hello of version 12 in bincode, which has no `min_version` (its
/// fields have no names: a shorter frame). A broker reads a first frame
/// that is not a hello of its own version as one of these.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum HelloBeforeRanges {
    Hello { magic: String, version: u32, encoding: Encoding },
}

/// A parameter of a declared tool: one value or a list. In JSON a string
/// or a list of strings, as an MCP call gives them (`{"one": ...}` and
/// `{"many": [...]}`, version 12's form, are read too); in bincode an enum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamValue {
    One(String),
    Many(Vec<String>),
}

/// [`ParamValue`]'s bincode form (and version 12's JSON form).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum TaggedParam {
    One(String),
    Many(Vec<String>),
}

impl From<TaggedParam> for ParamValue {
    fn from(t: TaggedParam) -> ParamValue {
        match t {
            TaggedParam::One(v) => ParamValue::One(v),
            TaggedParam::Many(v) => ParamValue::Many(v),
        }
    }
}

impl Serialize for ParamValue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match (self, s.is_human_readable()) {
            (ParamValue::One(v), true) => v.serialize(s),
            (ParamValue::Many(v), true) => v.serialize(s),
            (ParamValue::One(v), false) => s.serialize_newtype_variant("ParamValue", 0, "one", v),
            (ParamValue::Many(v), false) => s.serialize_newtype_variant("ParamValue", 1, "many", v),
        }
    }
}

impl<'de> Deserialize<'de> for ParamValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ParamValue, D::Error> {
        if d.is_human_readable() {
            d.deserialize_any(ParamVisitor)
        } else {
            TaggedParam::deserialize(d).map(Into::into)
        }
    }
}

/// A JSON parameter: a string, a list of strings, or version 12's object.
struct ParamVisitor;

impl<'de> serde::de::Visitor<'de> for ParamVisitor {
    type Value = ParamValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a path (a string) or a list of paths")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ParamValue, E> {
        Ok(ParamValue::One(v.into()))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ParamValue, A::Error> {
        let mut all = Vec::new();
        while let Some(v) = seq.next_element::<String>()? {
            all.push(v);
        }
        Ok(ParamValue::Many(all))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<ParamValue, A::Error> {
        TaggedParam::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Into::into)
    }
}

/// Run a command. `argv` and `cwd` are required (a request without `cwd` is
/// refused, rule `request.cwd`); everything else is optional.
/// Unknown fields are refused (in JSON; a misspelt `timeout_sec` would
/// otherwise not apply), naming the field.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The command and its arguments; `argv[0]` is a name looked up in PATH or a path.
    pub argv: Vec<String>,
    /// Environment offered by the client; the policy decides what passes.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The client's working directory: relative paths are relative to it.
    #[serde(default)]
    pub cwd: Option<String>,
    /// The writable workspace (default: `cwd`).
    #[serde(default)]
    pub workspace: Option<String>,
    /// Bytes fed to the command's stdin (then closed): in JSON a string
    /// (UTF-8 text) or `{"base64": "..."}`.
    #[serde(default, with = "crate::bytes")]
    pub stdin: Vec<u8>,
    /// Not on the wire: the run's stdin is streamed while it runs (a
    /// `RunWithStdin`), so the policy judges it as stdin given, whatever
    /// `stdin` holds. Set by the broker that received it.
    #[serde(skip)]
    pub stdin_streamed: bool,
    /// Not on the wire: the run's stdio is a terminal of this size (a
    /// `RunInTerminal`). Set by the broker that received it.
    #[serde(skip)]
    pub terminal: Option<WindowSize>,
    /// Lowers the policy's deadline (`max_execution_time`): a larger one is
    /// refused (`request.widens`), 0 is invalid.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Lowers the policy's output quota (stdout and stderr together): a
    /// larger one is refused (`request.widens`), 0 is invalid.
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
    /// A tool declared in the configuration, instead of the default profile.
    #[serde(default)]
    pub tool: Option<String>,
    /// The tool's parameters.
    #[serde(default)]
    pub params: BTreeMap<String, ParamValue>,
    /// Narrows the network to these names (exact, or `*.suffix`): each
    /// must be within the tool's (or default profile's) `allow_domains`, or
    /// the run is refused (`CapabilityDenied`, rule
    /// `egress.domain_not_granted`). `None`: the profile's list as it is.
    #[serde(default)]
    pub allow_domains: Option<Vec<String>>,
    /// A profile the configuration declares (`[profiles.NAME]`) instead of
    /// `[defaults]`; not with `tool`.
    #[serde(default)]
    pub profile: Option<String>,
    /// The asks below can only narrow the profile (or tool): one it does not
    /// allow is refused (`CapabilityDenied`, rule `request.widens`), naming
    /// the field and the configuration key an operator would change.
    /// Interpreters may run (the profile must allow them).
    #[serde(default)]
    pub allow_interpreters: bool,
    /// Inline code (`sh -c`, `python3 -c`) may run (the profile must allow it).
    #[serde(default)]
    pub allow_inline_code: bool,
    /// Paths the command needs to read: each must lie inside what the
    /// profile grants (a relative path is relative to `cwd`).
    #[serde(default)]
    pub read_only: Vec<String>,
    /// Paths the command needs to write: each must lie inside what the
    /// profile grants writable.
    #[serde(default)]
    pub read_write: Vec<String>,
    /// Variables of `env` to pass to the command, beyond those the
    /// profile's `environment` passes: each must be named by the profile's
    /// `pass_env` (or `environment = "full"`).
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Lowers the profile's memory limit (MiB).
    #[serde(default)]
    pub max_memory_mb: Option<u64>,
    /// Lowers the profile's process limit.
    #[serde(default)]
    pub max_processes: Option<u64>,
    /// No new processes (`fork`/`clone` refused by seccomp).
    #[serde(default)]
    pub no_fork: bool,
    /// JSON only: each piece of output comes as the line
    /// `{"output": {"stream": S, "bytes": N}}` followed by exactly N bytes
    /// of output, raw, rather than in the line (bincode's output is raw
    /// already, and this changes nothing there).
    #[serde(default)]
    pub raw_output: bool,
    /// What to do with the run's writes (default: the profile's
    /// `keep_changes`); `always_hold` is `palisade run --hold-changes`.
    #[serde(default)]
    pub keep_changes: Option<KeepChanges>,
    /// What to do with a path someone else changed on the host while the
    /// run ran (default: the profile's `on_conflict`).
    #[serde(default)]
    pub on_conflict: Option<OnConflict>,
    /// Write the workspace in place (`disk = "direct"`): live writes, no
    /// change set. The profile must allow it (`allow_direct`), or be direct.
    #[serde(default)]
    pub direct: bool,
    /// The requester's umask (its permission bits, at most [`MAX_UMASK`]):
    /// the command runs with it, so what it creates has the modes it would
    /// have outside (a system broker's own umask is its unit's). `None`:
    /// the broker's own umask.
    #[serde(default)]
    pub umask: Option<u32>,
    /// The command's toolchain (its `#!` interpreters and where they are
    /// installed under a home) is not made visible, whatever the profile's
    /// `toolchains` says.
    #[serde(default)]
    pub no_toolchains: bool,
    /// Strict egress: ports the run needs to connect to, each one the
    /// policy's `[egress] ports` lists, or the run is refused
    /// (`CapabilityDenied`, rule `request.widens`). From version 20: an
    /// older connection's form has neither this nor `allow_addresses`.
    #[serde(
        default,
        skip_serializing_if = "crate::form::before_20",
        deserialize_with = "crate::form::field_of_20"
    )]
    pub allow_ports: Vec<u16>,
    /// Strict egress: loopback, private, link-local, multicast or
    /// unspecified addresses (or CIDR ranges) the run needs to connect to,
    /// each within one the policy's `[egress] allow_addresses` lists, or
    /// the run is refused (`CapabilityDenied`, rule `request.widens`; one
    /// that is neither: `InvalidRequest`, rule `request.address`).
    #[serde(
        default,
        skip_serializing_if = "crate::form::before_20",
        deserialize_with = "crate::form::field_of_20"
    )]
    pub allow_addresses: Vec<String>,
}

impl RunRequest {
    /// Whether it asks for what only a broker of [`REACH_VERSION`] or later
    /// reads (`allow_ports`, `allow_addresses`).
    pub fn reaches(&self) -> bool {
        !self.allow_ports.is_empty() || !self.allow_addresses.is_empty()
    }
}

/// The largest umask a request may carry: permission bits only.
pub const MAX_UMASK: u32 = 0o777;

/// What a client sends. Unknown fields of a message are refused (in JSON),
/// naming the field; the hello alone takes fields it does not know, so that
/// a newer client hears which protocol versions this broker speaks.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
// A connection holds one message at a time: boxing the request saves nothing.
#[allow(clippy::large_enum_variant)]
pub enum ClientMessage {
    Hello(Hello),
    Run(RunRequest),
    /// Stop the run in progress (as a disconnect would).
    Cancel,
    /// The answer to `ApprovalRequired`: a person's decision.
    Approve {
        approved: bool,
    },
    /// The approvals waiting for an answer: all of them for an approver,
    /// the client's own (read-only) for anyone else. Answered `Approvals`.
    ListApprovals,
    /// An answer to the pending approval `approval` (its id), from any
    /// connection of an approver. Answered `Answered`, or `Unauthorized`.
    Answer {
        approval: u64,
        approved: bool,
        /// Why, shown to the requester (a denial's reason).
        #[serde(default)]
        reason: Option<String>,
    },
    /// The declared tools with their trust stage and declaration. Answered `Tools`.
    ListTools,
    /// An approver's review of a tool's declaration: Draft → Trial.
    /// Answered `Tools` (the tool alone), or `Unauthorized`.
    ApproveTool {
        name: String,
    },
    /// Call an installed skill (Tier A, a WebAssembly plugin in the
    /// plugin-host's jail). Answered `PluginResult` or an error.
    RunPlugin {
        /// The installed skill (`palisade plugin list`); with
        /// `inline_module`, the name the call is recorded under.
        skill: String,
        /// The plugin's input, JSON text.
        input: String,
        /// A module of the request's own (WAT text, or base64 of a binary
        /// module): only where `[plugins] allow_inline_modules`; it gets no
        /// grant but `log`.
        #[serde(default)]
        inline_module: Option<String>,
        /// Lowers the policy's deadline (`[plugins] timeout_ms`).
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
    /// The policy's decision on a run, and the sandbox it would get,
    /// without running anything (`palisade explain`). Answered `Explained`.
    Explain(RunRequest),
    /// The client's held change sets. Answered `ChangeSets`.
    ListChanges,
    /// One of them, with its paths and a diff. Answered `ChangeSet`.
    ShowChanges {
        id: String,
    },
    /// Applies one of them (`overwrite`: conflicts too; `host_executed`:
    /// files the host executes too). Answered `ChangesApplied`.
    ApplyChanges {
        id: String,
        #[serde(default)]
        overwrite: bool,
        #[serde(default)]
        host_executed: bool,
    },
    /// Drops one of them. Answered `ChangesDiscarded`.
    DiscardChanges {
        id: String,
    },
    /// The broker's state (version, uptime, runs, pool, journal head,
    /// cgroups, configuration), for operators. Answered `Status`.
    /// The bincode index of every variant above stays what it was.
    Status,
    /// A run whose stdin comes as `Stdin` messages while it runs, ended by
    /// `StdinEnd` (its `stdin` field must be empty). Answered as `Run` is.
    RunWithStdin(RunRequest),
    /// A piece of the running command's stdin (a `RunWithStdin`'s), sent
    /// after `Started`. The broker reads the next message only once the
    /// piece is on its way to the command: a command that does not read
    /// holds the client back. Pieces after the command closed its stdin,
    /// or after the run ended, are dropped. In JSON `data` is a string
    /// (UTF-8 text) or `{"base64": "..."}`.
    Stdin {
        #[serde(with = "crate::bytes")]
        data: Vec<u8>,
    },
    /// The end of a `RunWithStdin`'s stdin: the command reads end of file
    /// once the pieces before it are read. In a `RunInTerminal`, nothing
    /// more is written to the terminal (a command reads end of file when
    /// it reads `^D`, which is a piece of input like any other).
    StdinEnd,
    /// A run whose stdin, stdout and stderr are one terminal of the
    /// sandbox's own, `size` to start with: its stdin comes as `Stdin`
    /// messages (the terminal's keyboard: `\u0003` is Ctrl-C), its output
    /// as stdout alone, and `Resize` changes its window. `run`'s `stdin`
    /// field must be empty. Answered as `Run` is.
    RunInTerminal {
        run: RunRequest,
        size: WindowSize,
    },
    /// The running `RunInTerminal`'s new window size (the command gets
    /// SIGWINCH). Ignored in any other run, and after the run ended.
    Resize(WindowSize),
    /// Starts a session: a sandbox that stays, for the commands of
    /// `RunInSession`. Answered `SessionStarted` once it is built.
    StartSession(StartSession),
    /// Runs `run` in the requester's session `session`: decided by the
    /// policy like a run, in the session's sandbox. Its `stdin` is the
    /// one-field form. Answered as `Run` is.
    RunInSession {
        session: String,
        run: RunRequest,
    },
    /// The requester's sessions. Answered `Sessions`.
    ListSessions,
    /// Ends the requester's session `session`, killing everything in it.
    /// Answered `Finished`, with the session's own result.
    StopSession {
        session: String,
    },
    /// Publishes `port` of the loopback of the requester's session
    /// `session` to the requester, as a Unix socket on the host that only
    /// the requester may connect to, until the session ends. Answered
    /// `Published` (again for a port published already).
    Publish {
        session: String,
        port: u16,
    },
    /// `RunInSession`, its stdin streamed as `RunWithStdin`'s is (`Stdin`
    /// pieces, then `StdinEnd`); `run`'s `stdin` field must be empty.
    RunInSessionWithStdin {
        session: String,
        run: RunRequest,
    },
    /// `RunInSession` in a terminal of `size`, as `RunInTerminal` runs on
    /// its own: its stdin streamed (what is typed), its output all stdout,
    /// `Resize` its window; `run`'s `stdin` field must be empty.
    RunInSessionInTerminal {
        session: String,
        run: RunRequest,
        size: WindowSize,
    },
}

/// A session to start: `run` is what it may reach, as a run request
/// without `argv` (see docs/protocol.md, "Sessions").
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct StartSession {
    /// Unique among the requester's sessions; `None`: the broker names it.
    #[serde(default)]
    pub name: Option<String>,
    pub run: RunRequest,
    /// Ends the session once no command has run in it for this long.
    #[serde(default)]
    pub idle_timeout_secs: Option<u64>,
    /// Ends the session this long after it started, whatever runs in it.
    #[serde(default)]
    pub max_lifetime_secs: Option<u64>,
}

/// A live session, as listed.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionInfo {
    pub name: String,
    /// The session's own run id: its records in the journal, and its result's.
    pub run_id: u64,
    /// Seconds since the epoch.
    pub started_unix: u64,
    pub idle_timeout_secs: u64,
    pub max_lifetime_secs: u64,
    /// Commands run in it so far, and running now.
    pub runs: u64,
    pub running: u64,
    /// Where it runs: the workspace, as the session sees it.
    pub workspace: String,
}

impl ClientMessage {
    /// The run request it carries, if it carries one.
    pub fn run_request(&self) -> Option<&RunRequest> {
        match self {
            ClientMessage::Run(run)
            | ClientMessage::Explain(run)
            | ClientMessage::RunWithStdin(run)
            | ClientMessage::RunInTerminal { run, .. }
            | ClientMessage::StartSession(StartSession { run, .. })
            | ClientMessage::RunInSession { run, .. }
            | ClientMessage::RunInSessionWithStdin { run, .. }
            | ClientMessage::RunInSessionInTerminal { run, .. } => Some(run),
            _ => None,
        }
    }

    /// The message's name, as JSON spells it (`run`, `stdin`, ...): what a
    /// reply may quote of a message it did not expect, never its content.
    pub fn name(&self) -> &'static str {
        match self {
            ClientMessage::Hello(_) => "hello",
            ClientMessage::Run(_) => "run",
            ClientMessage::Cancel => "cancel",
            ClientMessage::Approve { .. } => "approve",
            ClientMessage::ListApprovals => "list_approvals",
            ClientMessage::Answer { .. } => "answer",
            ClientMessage::ListTools => "list_tools",
            ClientMessage::ApproveTool { .. } => "approve_tool",
            ClientMessage::RunPlugin { .. } => "run_plugin",
            ClientMessage::Explain(_) => "explain",
            ClientMessage::ListChanges => "list_changes",
            ClientMessage::ShowChanges { .. } => "show_changes",
            ClientMessage::ApplyChanges { .. } => "apply_changes",
            ClientMessage::DiscardChanges { .. } => "discard_changes",
            ClientMessage::Status => "status",
            ClientMessage::RunWithStdin(_) => "run_with_stdin",
            ClientMessage::Stdin { .. } => "stdin",
            ClientMessage::StdinEnd => "stdin_end",
            ClientMessage::RunInTerminal { .. } => "run_in_terminal",
            ClientMessage::Resize(_) => "resize",
            ClientMessage::StartSession(_) => "start_session",
            ClientMessage::RunInSession { .. } => "run_in_session",
            ClientMessage::ListSessions => "list_sessions",
            ClientMessage::StopSession { .. } => "stop_session",
            ClientMessage::Publish { .. } => "publish",
            ClientMessage::RunInSessionWithStdin { .. } => "run_in_session_with_stdin",
            ClientMessage::RunInSessionInTerminal { .. } => "run_in_session_in_terminal",
        }
    }
}

/// Why a tool's run escalated: it asks for more than its approved range.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum EscalationReason {
    /// A parameter names a path outside the tool's approved range.
    PathOutOfScope,
    /// A parameter names a sensitive path (`~/.ssh`, ...): never granted.
    SensitiveDirectory,
    /// A parameter the tool's bindings do not declare.
    UndeclaredBinding,
    /// The first run of a tool in Trial.
    FirstExecution,
}

impl EscalationReason {
    pub fn name(self) -> &'static str {
        match self {
            EscalationReason::PathOutOfScope => "PathOutOfScope",
            EscalationReason::SensitiveDirectory => "SensitiveDirectory",
            EscalationReason::UndeclaredBinding => "UndeclaredBinding",
            EscalationReason::FirstExecution => "FirstExecution",
        }
    }
}

/// What set off an escalation: the reason, the path asked for (or the
/// undeclared parameter's name) and the tool's approved paths.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct EscalationTrigger {
    pub reason: EscalationReason,
    #[serde(default)]
    pub requested_path: Option<String>,
    #[serde(default)]
    pub approved_paths: Vec<String>,
}

/// A run held for a person's approval, as the requester and the approvers see it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PendingApproval {
    /// The approval's id, for `Answer` (`palisade approve ID`).
    pub id: u64,
    pub run_id: u64,
    /// Who asked: the requesting peer's ids and pid.
    pub uid: u32,
    pub gid: u32,
    #[serde(default)]
    pub pid: Option<i32>,
    #[serde(default)]
    pub tool: Option<String>,
    /// Why it needs approval.
    pub reason: String,
    /// What the run is about to do.
    pub argv: Vec<String>,
    /// Host paths granted read-only and read-write, resolved.
    pub read_only: Vec<String>,
    pub read_write: Vec<String>,
    /// The network the sandbox gets (`none`, `loopback`, `host`) and its egress rule.
    pub network: String,
    pub egress: String,
    /// Its limits, as `palisade explain` names them (`timeout_secs`, `memory_bytes`, ...).
    pub limits: BTreeMap<String, u64>,
    #[serde(default)]
    pub trigger: Option<EscalationTrigger>,
    /// When it was asked and when it expires, in seconds since the epoch.
    pub created_unix: u64,
    pub expires_unix: u64,
}

/// The policy's decision on a run that was not run (`Explain`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// `"allow"`, `"needs_approval"` or `"deny"`.
    pub decision: String,
    /// A refusal's kind.
    pub kind: Option<ErrorKind>,
    /// A refusal's rule.
    pub rule: Option<String>,
    /// Why: a refusal's reason, or the question an approval would ask.
    pub reason: Option<String>,
    /// The decision and the sandbox (mounts, Landlock, limits, seccomp), as
    /// `palisade explain` prints them.
    pub text: String,
    /// The policy that decided: the configuration file the broker loaded,
    /// or `built-in` (its default policy).
    pub policy: String,
}

/// A declared tool as `palisade tools show` prints it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ToolInfo {
    pub name: String,
    /// `draft`, `trial` or `verified`; `untracked` where trust stages are off.
    pub stage: String,
    /// Approved runs that succeeded in Trial (Verified at `trial_runs`).
    pub trial_successes: u32,
    pub trial_runs: u32,
    /// The capability declaration, as a person reads it.
    pub declaration: String,
    /// sha256 (lowercase hex) of `declaration`: a change puts the tool back to Draft.
    pub capabilities_sha256: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    pub kind: ErrorKind,
    pub message: String,
    /// The policy rule that refused the request (`scope.outside_roots`, ...), stable like `kind`.
    #[serde(default)]
    pub rule: Option<String>,
    /// The step of the helper that failed, when the sandbox could not be
    /// built (`kind` is then `RuntimeFailure`). Boxed: most errors have none.
    #[serde(default)]
    pub helper: Option<Box<HelperFailureReply>>,
}

impl ErrorReply {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ErrorReply {
        ErrorReply { kind, message: message.into(), rule: None, helper: None }
    }

    /// A refusal by the policy rule `rule`.
    pub fn with_rule(kind: ErrorKind, message: impl Into<String>, rule: impl Into<String>) -> ErrorReply {
        ErrorReply { rule: Some(rule.into()), ..ErrorReply::new(kind, message) }
    }
}

/// A step of the helper failed and it exec'd nothing: which step, and the
/// kernel's answer, as the helper reported them (see [`HelperFailure`]).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct HelperFailureReply {
    /// The step, as [`Stage::name`](crate::status::Stage::name) spells it: `rlimits`, `mount`, `landlock`, ...
    pub stage: String,
    /// The kernel's errno, or 0 when the failure is not a system call's.
    pub errno: i32,
    /// Its symbolic name (`EPERM`), or `-` for 0.
    pub errno_name: String,
    /// What was attempted and how it failed.
    pub message: String,
}

impl From<&HelperFailure> for HelperFailureReply {
    fn from(f: &HelperFailure) -> HelperFailureReply {
        HelperFailureReply {
            stage: f.stage.name().to_string(),
            errno: f.errno,
            errno_name: f.errno_name.clone(),
            message: f.message.clone(),
        }
    }
}

/// How a run ended. On a connection of a version before
/// [`crate::form::STOPPED_VERSION`], `Stopped` is said as `Cancelled`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case", into = "RunStatusForm")]
pub enum RunStatus {
    Exited {
        code: i32,
    },
    Signaled {
        signal: i32,
    },
    TimedOut,
    QuotaExceeded,
    MemoryLimitExceeded,
    DiskLimitExceeded,
    Cancelled,
    /// A session its requester stopped (`StopSession`): every process of
    /// it killed, its writes settled as a command's that exited.
    Stopped,
}

impl RunStatus {
    /// The error kind of a run palisade ended; `None` for a command that
    /// ended by itself (an exit or a signal of its own) and for a session
    /// its requester stopped. A cancelled run (its client gone, or the
    /// broker shutting down) is a `RuntimeFailure`.
    pub fn error_kind(self) -> Option<ErrorKind> {
        match self {
            RunStatus::Exited { .. } | RunStatus::Signaled { .. } | RunStatus::Stopped => None,
            RunStatus::TimedOut => Some(ErrorKind::TimedOut),
            RunStatus::QuotaExceeded => Some(ErrorKind::QuotaExceeded),
            RunStatus::MemoryLimitExceeded => Some(ErrorKind::MemoryLimitExceeded),
            RunStatus::DiskLimitExceeded => Some(ErrorKind::DiskLimitExceeded),
            RunStatus::Cancelled => Some(ErrorKind::RuntimeFailure),
        }
    }
}

/// [`RunStatus`] as it is written: its own form, or on a connection of a
/// version before [`crate::form::STOPPED_VERSION`], `Stopped` said as
/// `Cancelled` (what that version said of a stopped session).
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum RunStatusForm {
    Exited { code: i32 },
    Signaled { signal: i32 },
    TimedOut,
    QuotaExceeded,
    MemoryLimitExceeded,
    DiskLimitExceeded,
    Cancelled,
    Stopped,
}

impl From<RunStatus> for RunStatusForm {
    fn from(s: RunStatus) -> Self {
        match s {
            RunStatus::Exited { code } => RunStatusForm::Exited { code },
            RunStatus::Signaled { signal } => RunStatusForm::Signaled { signal },
            RunStatus::TimedOut => RunStatusForm::TimedOut,
            RunStatus::QuotaExceeded => RunStatusForm::QuotaExceeded,
            RunStatus::MemoryLimitExceeded => RunStatusForm::MemoryLimitExceeded,
            RunStatus::DiskLimitExceeded => RunStatusForm::DiskLimitExceeded,
            RunStatus::Stopped if crate::form::form_before(crate::form::STOPPED_VERSION) => {
                RunStatusForm::Cancelled
            }
            RunStatus::Cancelled => RunStatusForm::Cancelled,
            RunStatus::Stopped => RunStatusForm::Stopped,
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct RunResult {
    pub run_id: u64,
    pub status: RunStatus,
    pub wall_ms: u64,
    pub cpu_user_ms: u64,
    pub cpu_system_ms: u64,
    pub peak_memory_bytes: u64,
    /// Where `cpu_*_ms` and `peak_memory_bytes` come from.
    pub memory_source: MemorySource,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Bytes of files the run wrote to its workspace and that were kept
    /// (copied back from its overlay).
    pub written_bytes: u64,
    /// What became of the run's writes: what was applied to the host, and
    /// what was withheld from it, and why.
    pub changes: Changes,
    pub attestation: Attestation,
    /// Who approved the run, where it was held for approval (`None`: it
    /// was not). From version 21 (at the end; an older form has none).
    #[serde(
        default,
        skip_serializing_if = "crate::form::before_21",
        deserialize_with = "crate::form::field_of_21"
    )]
    pub approved: Option<Approved>,
}

/// Who approved a run held for approval, and the rule that held it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Approved {
    /// The uid of whoever answered yes: an approver, or the requester
    /// itself where it may answer its own runs.
    pub uid: u32,
    /// Their user name, where the broker's host knows the uid.
    pub name: Option<String>,
    /// The rule that held the run (`cedar.ask`, `trust.trial`,
    /// `trust.escalation`, `fallback.request_approval`).
    pub rule: String,
    /// The question put to them.
    pub reason: String,
}

/// What to do with a path someone else changed on the host while the run ran.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnConflict {
    /// Keep the host's version; the run's goes to a held change set, and
    /// the rest is applied.
    #[default]
    KeepHost,
    /// Apply nothing; hold the whole change set.
    Hold,
    /// Apply the run's version over the host's.
    Overwrite,
}

/// What to do with a run's writes.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KeepChanges {
    /// Applied when the command exits by itself (whatever its status); held
    /// when palisade ends the run (deadline, cancel, a quota, shutdown).
    #[default]
    ApplyUnlessEnded,
    /// Always held for review.
    AlwaysHold,
    /// Applied when the command exits by itself; discarded when palisade ends it.
    DiscardWhenEnded,
}

/// A held change set, as listed.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ChangeSetInfo {
    pub id: String,
    pub run_id: u64,
    /// Seconds since the epoch.
    pub created: u64,
    /// `held`, or `partly_applied` (an apply that stopped: applying it again finishes it).
    pub status: String,
    pub reason: String,
    /// The granted directories its paths are in.
    pub roots: Vec<String>,
    /// Entries: files, links, directories and removals.
    pub entries: u64,
    pub bytes: u64,
    pub conflicts: u64,
    /// Entries that are files the host executes.
    pub host_executed: u64,
    /// The broker that ran the run, `<pid>-<start time>` as the journal's
    /// records name it: with `run_id`, which counts from 1 in each broker
    /// (every embedded `palisade run` is one), the run. `None`: a change set
    /// kept before brokers said it. From version 20 (at the end; an older
    /// form has none).
    #[serde(
        default,
        skip_serializing_if = "crate::form::before_20",
        deserialize_with = "crate::form::field_of_20"
    )]
    pub broker: Option<String>,
}

/// A held change set, shown.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ChangeSetDetail {
    pub info: ChangeSetInfo,
    pub entries: Vec<ChangeEntry>,
    /// A unified diff of each text file against the host's (bounded; see
    /// docs/protocol.md).
    pub diff: String,
}

/// One path of a change set.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ChangeEntry {
    /// The host path.
    pub path: String,
    /// `file`, `symlink`, `dir` or `delete`.
    pub kind: String,
    pub size: u64,
    pub conflict: bool,
    /// What it is, when it is a file the host executes.
    pub host_executed: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ServerHello {
    pub version: u32,
    pub broker: String,
    pub encoding: Encoding,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ServerMessage {
    Hello(ServerHello),
    Started {
        run_id: u64,
        executor: Executor,
    },
    Output {
        stream: Stream,
        // As bytes, not a sequence of u8: in bincode a length, then the
        // bytes, without a call per byte; in JSON text or base64 (crate::bytes).
        #[serde(with = "crate::bytes")]
        data: Vec<u8>,
    },
    Finished(Box<RunResult>),
    Error(ErrorReply),
    /// The run needs a person's approval first (the fallback policy
    /// `request_approval`, or the tool's trust stage); nothing runs until
    /// it is answered: by this client (`Approve`) when `may_answer`, or by
    /// an approver from another connection (`Answer`).
    ApprovalRequired {
        reason: String,
        /// Whether this client's own `Approve` is taken (it is an approver,
        /// or `self_approval` is on); otherwise it waits for an approver.
        may_answer: bool,
        approval: Box<PendingApproval>,
    },
    /// The answer to `ListApprovals`.
    Approvals(Vec<PendingApproval>),
    /// The answer to `Answer`: it reached the waiting run.
    Answered {
        approval: u64,
        approved: bool,
    },
    /// The answer to `ListTools` and `ApproveTool`.
    Tools(Vec<ToolInfo>),
    /// The answer to `RunPlugin`: the plugin's output (JSON text) and what
    /// the call used and was given.
    PluginResult {
        output: String,
        fuel_used: u64,
        memory_peak_bytes: u64,
        /// Microseconds inside the plugin-host: instantiating the module,
        /// and running its entry point (host function calls included).
        instantiate_us: u64,
        call_us: u64,
        attestation: Box<crate::plugin::PluginAttestation>,
    },
    /// The answer to `Explain`.
    Explained(Box<Explanation>),
    /// The answer to `ListChanges`: the client's held change sets, oldest first.
    ChangeSets(Vec<ChangeSetInfo>),
    /// The answer to `ShowChanges`.
    ChangeSet(Box<ChangeSetDetail>),
    /// The answer to `ApplyChanges`: what was applied, and what is still held.
    ChangesApplied(Box<Changes>),
    /// The answer to `DiscardChanges`.
    ChangesDiscarded {
        id: String,
    },
    /// The answer to `Status`.
    Status(Box<BrokerStatus>),
    /// A session started (`StartSession`).
    SessionStarted(SessionInfo),
    /// The requester's sessions (`ListSessions`).
    Sessions(Vec<SessionInfo>),
    /// A session's port, published (`Publish`).
    Published(PublishedPort),
}

/// A port of a session's loopback, reached from the host through `socket`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PublishedPort {
    pub session: String,
    pub port: u16,
    /// The Unix socket on the host: a connection to it is a connection to
    /// the port, from the session's own loopback.
    pub socket: String,
}

/// The broker's state, as `palisade status` shows it (docs/protocol.md,
/// "Status").
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct BrokerStatus {
    /// palisaded's version.
    pub version: String,
    /// The protocol version it speaks.
    pub protocol: u32,
    pub pid: u32,
    /// The uid it runs as.
    pub uid: u32,
    /// When it started serving, in seconds since the epoch, and how long ago.
    pub started_unix: u64,
    pub uptime_secs: u64,
    /// Runs holding a run slot now, and requests waiting for one.
    pub runs_in_flight: u64,
    pub runs_queued: u64,
    /// `[broker] max_concurrent` and `max_queued` in force.
    pub max_concurrent: u64,
    pub max_queued: u64,
    /// Connections open now (those refused not counted).
    pub connections: u64,
    /// Runs waiting for an approval's answer.
    pub approvals_pending: u64,
    pub pool: PoolStatus,
    /// The audit journal; `None` when it is off.
    pub journal: Option<JournalHead>,
    pub cgroup: CgroupStatus,
    pub config: ConfigStatus,
    /// From version 21: what an operator of a shared broker looks at.
    #[serde(
        default,
        skip_serializing_if = "crate::form::before_21",
        deserialize_with = "crate::form::field_of_21"
    )]
    pub operations: Option<Operations>,
}

/// The broker's socket, its shares, the runs and sessions in it and its
/// last reload. Runs and sessions are listed to their own requester, and
/// to an operator (root, the broker's uid, an approver) all of them; the
/// others' are only counted.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct Operations {
    /// The socket it serves.
    pub socket: String,
    /// Whether it serves other users than its own (a system broker).
    pub system: bool,
    /// What one requester may hold (`[broker]`'s `_per_uid` keys in force).
    pub per_uid: PerUidLimits,
    /// What each requester holds now (the asker's own, or everybody's for an operator).
    pub requesters: Vec<RequesterShare>,
    pub runs: Vec<LiveRun>,
    /// Runs not listed (other requesters').
    pub runs_omitted: u64,
    pub sessions: Vec<LiveSession>,
    /// Sessions not listed (other requesters').
    pub sessions_omitted: u64,
    /// The last reload, if there was one since the start.
    pub last_reload: Option<ReloadOutcome>,
}

/// The per-requester limits in force.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PerUidLimits {
    pub max_concurrent: u64,
    pub max_queued: u64,
    pub max_sessions: u64,
    /// MiB; 0: no memory share.
    pub max_memory_mb: u64,
}

/// What one requester holds.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct RequesterShare {
    pub uid: u32,
    pub running: u64,
    pub queued: u64,
    /// MiB of its runs in progress that a cgroup bounds.
    pub memory_mb: u64,
}

/// A run the broker holds: from its decision to its end: waiting for an approval, queued or running.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct LiveRun {
    pub run_id: u64,
    /// The requester.
    pub uid: u32,
    /// The requester's user name, where the broker's host knows it.
    pub user: Option<String>,
    pub argv: Vec<String>,
    /// The session it runs in, if any.
    pub session: Option<String>,
    /// `approval` (waiting for an approver's answer), `queued` (for a run
    /// slot) or `running`.
    pub state: String,
    /// Seconds since the broker took the request.
    pub age_secs: u64,
}

/// A live session.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct LiveSession {
    pub name: String,
    pub uid: u32,
    pub user: Option<String>,
    pub age_secs: u64,
    /// Commands running in it now.
    pub running: u64,
}

/// How the last reload (SIGHUP) ended.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ReloadOutcome {
    /// When, in seconds since the epoch.
    pub unix: u64,
    /// Whether the file loaded and took effect.
    pub ok: bool,
    /// Why it did not, in the file's own words: shown to an operator
    /// (others get `None` and `ok` alone).
    pub error: Option<String>,
}

/// The warm pool.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolStatus {
    /// Helpers started ahead of requests, waiting for a run now.
    pub idle: u64,
    /// How many it keeps (`[broker] prespawn`).
    pub size: u64,
    /// Whether they build their sandbox ahead (a warm pool), or only wait.
    pub warm: bool,
}

/// The journal's head: its newest record the broker appended.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct JournalHead {
    pub dir: String,
    /// The record's seq and hash (lowercase hex sha256).
    pub seq: u64,
    pub hash: String,
}

/// The cgroups runs get.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct CgroupStatus {
    /// `v2`, `v1` or `none`.
    pub mode: String,
    /// Where, or why there are none.
    pub description: String,
}

/// The configuration in force.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfigStatus {
    /// Its file; `None`: the built-in one.
    pub file: Option<String>,
    /// When it was read (at start, or by the last reload), seconds since the epoch.
    pub loaded_unix: u64,
    /// Reloads that took effect since the start.
    pub reloads: u64,
}

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    TooLarge {
        len: usize,
        max: usize,
    },
    /// Over [`SMALL_FRAME_BYTES`] (or the limit set), and not a `run` with `stdin`.
    LargeNotRun {
        len: usize,
        max: usize,
    },
    Malformed(String),
    Truncated {
        buffered: usize,
    },
    Unsupported(&'static str),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::TooLarge { len, max } => {
                write!(f, "frame of {len} bytes exceeds the {max}-byte limit")
            }
            WireError::LargeNotRun { len, max } => write!(
                f,
                "frame of {len} bytes exceeds the {max}-byte limit of any message but a run with stdin"
            ),
            WireError::Malformed(e) => write!(f, "malformed message: {e}"),
            WireError::Truncated { buffered } => {
                write!(f, "connection closed in the middle of a frame ({buffered} bytes buffered)")
            }
            WireError::Unsupported(what) => write!(f, "{what} is not supported by this build"),
        }
    }
}

impl std::error::Error for WireError {}

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

pub use crate::changes::{Changes, ChangesOutcome, Withheld, WithheldReason};
pub use crate::form::{INSPECTION_VERSION, OPERATIONS_VERSION, REACH_VERSION, in_form_of};

/// [`encode`] in the form of protocol `version` (a connection's).
pub fn encode_in<T: Serialize>(msg: &T, encoding: Encoding, version: u32) -> Result<Vec<u8>, WireError> {
    in_form_of(version, || encode(msg, encoding))
}

/// Encodes one message as a frame (bincode) or a line (JSON).
pub fn encode<T: Serialize>(msg: &T, encoding: Encoding) -> Result<Vec<u8>, WireError> {
    match encoding {
        Encoding::Bincode => {
            let mut out = vec![0u8; 4];
            bincode::serde::encode_into_std_write(msg, &mut out, bincode_config())
                .map_err(|e| WireError::Malformed(e.to_string()))?;
            let len = out.len() - 4;
            if len > MAX_FRAME_BYTES {
                return Err(WireError::TooLarge { len, max: MAX_FRAME_BYTES });
            }
            out[..4].copy_from_slice(&(len as u32).to_be_bytes());
            Ok(out)
        }
        #[cfg(feature = "json")]
        Encoding::Json => {
            let mut out = serde_json::to_vec(msg).map_err(|e| WireError::Malformed(e.to_string()))?;
            if out.len() > MAX_FRAME_BYTES {
                return Err(WireError::TooLarge { len: out.len(), max: MAX_FRAME_BYTES });
            }
            out.push(b'\n');
            Ok(out)
        }
        #[cfg(not(feature = "json"))]
        Encoding::Json => Err(WireError::Unsupported("the JSON encoding")),
    }
}

impl Stream {
    /// Its name on the wire (JSON), as serde writes it.
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// The JSON line of `ServerMessage::Output { stream, data }`, written
/// straight into one buffer: what [`encode`] gives, without the base64
/// text's copy and escape scan. The tests check it against [`encode`].
#[cfg(feature = "json")]
pub fn output_json_line(stream: Stream, data: &[u8]) -> Vec<u8> {
    use base64::Engine;
    let name = stream.name();
    let mut line = Vec::with_capacity(64 + data.len().div_ceil(3) * 4);
    line.extend_from_slice(b"{\"output\":{\"stream\":\"");
    line.extend_from_slice(name.as_bytes());
    line.extend_from_slice(b"\",\"data\":");
    match crate::bytes::as_text(data) {
        // Writing into a Vec cannot fail.
        Some(text) => serde_json::to_writer(&mut line, text).unwrap_or(()),
        None => {
            // Encoded in place, at the end of the line.
            line.extend_from_slice(b"{\"base64\":\"");
            let start = line.len();
            line.resize(start + data.len().div_ceil(3) * 4, 0);
            let engine = base64::engine::general_purpose::STANDARD;
            // The room is exactly the padded encoding's length.
            let written = engine.encode_slice(data, &mut line[start..]).unwrap_or(0);
            line.truncate(start + written);
            line.extend_from_slice(b"\"}");
        }
    }
    line.extend_from_slice(b"}}\n");
    line
}

/// The JSON line that announces `len` raw bytes of `stream`'s output (a
/// run request's `raw_output`); the bytes follow it.
pub fn raw_output_header(stream: Stream, len: usize) -> Vec<u8> {
    let name = stream.name();
    format!("{{\"output\":{{\"stream\":\"{name}\",\"bytes\":{len}}}}}\n").into_bytes()
}

/// The bincode frame of `ServerMessage::Output { stream, data }` up to the
/// data: the frame length, the variant, the stream and the data length. Sent
/// before the bytes themselves, it spares the broker copying output into a
/// message to encode it. The tests check it against [`encode`].
pub fn output_frame_header(stream: Stream, len: usize) -> Vec<u8> {
    // bincode's standard configuration: variant indices and lengths as varints.
    const OUTPUT_VARIANT: u8 = 2;
    let mut body = vec![OUTPUT_VARIANT, stream as u8];
    match len {
        0..=250 => body.push(len as u8),
        251..=0xffff => {
            body.push(251);
            body.extend_from_slice(&(len as u16).to_le_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            body.push(252);
            body.extend_from_slice(&(len as u32).to_le_bytes());
        }
        _ => {
            body.push(253);
            body.extend_from_slice(&(len as u64).to_le_bytes());
        }
    }
    let mut out = ((body.len() + len) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// The canonical bytes of a value, for hashing (bincode, fixed configuration).
pub fn canonical_bytes<T: Serialize>(value: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, bincode::config::standard()).unwrap_or_default()
}

/// Whether a JSON line begins `{"run"`, whitespace allowed, within its
/// first [`JSON_RUN_SCAN`] bytes.
#[cfg(feature = "json")]
fn json_begins_as_run(line: &[u8]) -> bool {
    let head = &line[..line.len().min(JSON_RUN_SCAN)];
    let after_space = |from: usize| {
        head[from.min(head.len())..].iter().position(|b| !matches!(b, b' ' | b'\t' | b'\r')).map(|i| from + i)
    };
    let Some(open) = after_space(0).filter(|i| head[*i] == b'{') else { return false };
    after_space(open + 1).is_some_and(|key| head[key..].starts_with(b"\"run\""))
}

/// Incremental decoder for one connection.
#[derive(Debug)]
pub struct Decoder {
    encoding: Option<Encoding>,
    /// Storage: the bytes received and not yet decoded are `buf[start..end]`.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max: usize,
    /// Frames over this are refused unless they are a `run` (see
    /// [`Decoder::set_small_limit`]).
    small: Option<usize>,
    /// The body's length of the last frame decoded (a JSON line's, without
    /// its newline).
    last_len: usize,
    /// The protocol version whose form messages are read in.
    version: u32,
    /// JSON: how many pending bytes are known to hold no newline, so that
    /// each byte of a long line is looked at once, however many reads it
    /// takes to arrive.
    scanned: std::cell::Cell<usize>,
    /// Bytes looked at for a newline, in all (tests check it).
    #[cfg(test)]
    examined: std::cell::Cell<usize>,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new(None)
    }
}

impl Decoder {
    /// `None`: detect the encoding from the first byte.
    pub fn new(encoding: Option<Encoding>) -> Decoder {
        Decoder {
            encoding,
            buf: Vec::new(),
            start: 0,
            end: 0,
            max: MAX_FRAME_BYTES,
            small: None,
            last_len: 0,
            version: PROTOCOL_VERSION,
            scanned: std::cell::Cell::new(0),
            #[cfg(test)]
            examined: std::cell::Cell::new(0),
        }
    }

    pub fn encoding(&self) -> Option<Encoding> {
        self.encoding
    }

    /// Lowers (or restores) the largest frame accepted, e.g. while waiting
    /// for the hello of a peer not yet authenticated.
    pub fn set_limit(&mut self, max: usize) {
        self.max = max.min(MAX_FRAME_BYTES);
    }

    /// Frames over `small` bytes are taken only from a `run` (a broker
    /// reading a client, whose runs alone carry `stdin`): another message
    /// is refused ([`WireError::LargeNotRun`]) as soon as the first bytes
    /// of its frame show what it is, before the rest is buffered: in bincode
    /// the variant after the length, in JSON the line's first key, which
    /// must be `"run"` as it is (no escape), within the line's first 64
    /// bytes. Whether the run carries `stdin` is the caller's to check once
    /// it is decoded ([`Decoder::last_len`]).
    pub fn set_small_limit(&mut self, small: usize) {
        self.small = Some(small);
    }

    /// The length of the last frame decoded: a bincode frame's body, a JSON
    /// line without its newline.
    pub fn last_len(&self) -> usize {
        self.last_len
    }

    /// Frees storage beyond `keep` bytes that holds at most `keep` pending
    /// bytes: a connection that received one large frame does not keep its
    /// size for the rest of its life.
    pub fn release_storage(&mut self, keep: usize) {
        if self.buf.len() > keep && self.buffered() <= keep {
            self.buf = self.pending().to_vec();
            (self.start, self.end) = (0, self.buf.len());
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.space(bytes.len()).copy_from_slice(bytes);
        self.end += bytes.len();
    }

    /// Reads once from `source` straight into the buffer (at most `max`
    /// bytes); the count, 0 at end of input.
    pub fn read_from(&mut self, source: &mut impl std::io::Read, max: usize) -> std::io::Result<usize> {
        let n = source.read(self.space(max))?;
        self.end += n;
        Ok(n)
    }

    /// `len` writable bytes after the pending ones. When the storage's tail
    /// is too short, the pending bytes move to the front first (not on every
    /// read: a part of a frame waiting would be copied again and again), and
    /// the storage grows only when that is not enough.
    fn space(&mut self, len: usize) -> &mut [u8] {
        if self.buf.len() < self.end + len && self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() < self.end + len {
            self.buf.resize(self.end + len, 0);
        }
        &mut self.buf[self.end..self.end + len]
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.scanned.set(0);
        self.start += n;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
    }

    /// Bytes received but not yet decoded.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// A whole frame (or line) is pending: [`Decoder::next_message`] will not
    /// need more bytes.
    pub fn has_message(&self) -> bool {
        match self.encoding {
            Some(Encoding::Json) => self.line_end().is_some(),
            _ => self
                .pending()
                .first_chunk::<4>()
                .is_some_and(|len| self.buffered() >= 4 + u32::from_be_bytes(*len) as usize),
        }
    }

    /// The pending bytes begin an output frame whose header is complete:
    /// its stream, the header's length (frame length included) and the
    /// data's length.
    fn output_header(&self) -> Option<(Stream, usize, usize)> {
        if self.encoding != Some(Encoding::Bincode) {
            return None;
        }
        let p = self.pending();
        let len = u32::from_be_bytes(*p.first_chunk::<4>()?) as usize;
        if len > self.max {
            return None;
        }
        let body = &p[4..];
        let stream = match body.get(..2)? {
            [2, 0] => Stream::Stdout,
            [2, 1] => Stream::Stderr,
            _ => return None,
        };
        let (data_len, header) = match *body.get(2)? {
            n @ 0..=250 => (n as usize, 3),
            251 => (u16::from_le_bytes(*body.get(3..)?.first_chunk()?) as usize, 5),
            252 => (u32::from_le_bytes(*body.get(3..)?.first_chunk()?) as usize, 7),
            _ => return None,
        };
        (header + data_len == len).then_some((stream, 4 + header, data_len))
    }

    /// The next frame, when it is a complete bincode `ServerMessage::Output`
    /// (the frame [`output_frame_header`] begins): its stream and bytes, read
    /// in place rather than decoded into a message that owns a copy. The
    /// frame is consumed. `None` for anything else, which
    /// [`Decoder::next_message`] then decodes (or refuses).
    pub fn next_output(&mut self) -> Option<(Stream, &[u8])> {
        let (stream, header, data_len) = self.output_header()?;
        if self.buffered() < header + data_len {
            return None;
        }
        let start = self.start + header;
        self.consume(header + data_len);
        // consume() only moves the indices: the bytes stay until the next read.
        Some((stream, &self.buf[start..start + data_len]))
    }

    /// The start of an output frame, when its header is here, at least
    /// `min_rest` bytes of its data are not, and `wanted` accepts its
    /// stream: everything buffered is
    /// consumed, and the frame's stream, the data bytes already here, the
    /// number still to come and the header's length are returned. The
    /// caller takes those bytes from the connection itself (e.g. with
    /// `splice`) before it hands the decoder anything more.
    pub fn take_output_start(
        &mut self,
        min_rest: usize,
        wanted: impl FnOnce(Stream) -> bool,
    ) -> Option<(Stream, &[u8], usize, usize)> {
        let (stream, header, data_len) = self.output_header()?;
        let here = self.buffered() - header;
        if here >= data_len || data_len - here < min_rest.max(1) || !wanted(stream) {
            return None;
        }
        let start = self.start + header;
        let end = self.end;
        self.consume(self.buffered());
        Some((stream, &self.buf[start..end], data_len - here, header))
    }

    /// The client's first message, a hello: as [`Decoder::next_message`],
    /// and a bincode hello of version 12 (without `min_version`) too.
    pub fn next_hello(&mut self) -> Result<Option<ClientMessage>, WireError> {
        match self.next_message::<ClientMessage>() {
            Err(WireError::Malformed(why)) if self.encoding == Some(Encoding::Bincode) => {
                match self.next_message::<HelloBeforeRanges>() {
                    Ok(Some(HelloBeforeRanges::Hello { magic, version, encoding })) => {
                        Ok(Some(ClientMessage::Hello(Hello { magic, version, encoding, min_version: None })))
                    }
                    Ok(None) => Ok(None),
                    Err(_) => Err(WireError::Malformed(why)),
                }
            }
            other => other,
        }
    }

    /// The next complete message, `Ok(None)` when more bytes are needed.
    /// Reads later messages in the form of protocol `version` (the
    /// connection's, once the hellos agreed on it).
    pub fn set_version(&mut self, version: u32) {
        self.version = version;
    }

    /// The next complete message, `Ok(None)` when more bytes are needed,
    /// in the form of the version [`Decoder::set_version`] set. A bincode
    /// run request in the form before [`REACH_VERSION`] (without
    /// `allow_ports` and `allow_addresses`) is read on a connection of that
    /// version or later too: a client sends a request that needs neither in
    /// that form with its hello, before it knows the version it will speak.
    pub fn next_message<T: DeserializeOwned>(&mut self) -> Result<Option<T>, WireError> {
        let version = self.version;
        match in_form_of(version, || self.next_message_in_form()) {
            Err(WireError::Malformed(why))
                if self.encoding == Some(Encoding::Bincode) && version >= REACH_VERSION =>
            {
                in_form_of(REACH_VERSION - 1, || self.next_message_in_form())
                    .map_err(|_| WireError::Malformed(why))
            }
            other => other,
        }
    }

    fn next_message_in_form<T: DeserializeOwned>(&mut self) -> Result<Option<T>, WireError> {
        let Some(&first) = self.pending().first() else { return Ok(None) };
        let encoding =
            *self.encoding.get_or_insert(if first == b'{' { Encoding::Json } else { Encoding::Bincode });
        match encoding {
            Encoding::Bincode => {
                let Some(len) = self.pending().first_chunk::<4>() else { return Ok(None) };
                let len = u32::from_be_bytes(*len) as usize;
                if len > self.max {
                    return Err(WireError::TooLarge { len, max: self.max });
                }
                if let Some(small) = self.small.filter(|small| len > *small) {
                    let Some(&variant) = self.pending().get(4) else { return Ok(None) };
                    if variant != RUN_VARIANT {
                        return Err(WireError::LargeNotRun { len, max: small });
                    }
                }
                if self.buffered() < 4 + len {
                    return Ok(None);
                }
                let (msg, used) =
                    bincode::serde::decode_from_slice(&self.pending()[4..4 + len], bincode_config())
                        .map_err(|e| WireError::Malformed(e.to_string()))?;
                if used != len {
                    return Err(WireError::Malformed(format!("{} trailing bytes in frame", len - used)));
                }
                self.consume(4 + len);
                self.last_len = len;
                Ok(Some(msg))
            }
            Encoding::Json => self.next_json(),
        }
    }

    #[cfg(feature = "json")]
    fn next_json<T: DeserializeOwned>(&mut self) -> Result<Option<T>, WireError> {
        let Some(end) = self.line_end() else {
            if self.buffered() > self.max {
                return Err(WireError::TooLarge { len: self.buffered(), max: self.max });
            }
            self.json_within_small(self.buffered())?;
            return Ok(None);
        };
        if end > self.max {
            return Err(WireError::TooLarge { len: end, max: self.max });
        }
        self.json_within_small(end)?;
        let parsed = serde_json::from_slice(&self.pending()[..end]);
        self.consume(end + 1);
        self.last_len = end;
        parsed.map(Some).map_err(|e| WireError::Malformed(e.to_string()))
    }

    /// A JSON line of `len` bytes (so far) is within the small limit, or
    /// begins as a `run`.
    #[cfg(feature = "json")]
    fn json_within_small(&self, len: usize) -> Result<(), WireError> {
        match self.small {
            Some(small) if len > small && !json_begins_as_run(self.pending()) => {
                Err(WireError::LargeNotRun { len, max: small })
            }
            _ => Ok(()),
        }
    }

    #[cfg(not(feature = "json"))]
    fn next_json<T: DeserializeOwned>(&mut self) -> Result<Option<T>, WireError> {
        Err(WireError::Unsupported("the JSON encoding"))
    }

    /// Where the first pending line ends, looking only at bytes not looked at
    /// before.
    fn line_end(&self) -> Option<usize> {
        let pending = self.pending();
        let from = self.scanned.get().min(pending.len());
        #[cfg(test)]
        self.examined.set(self.examined.get() + pending.len() - from);
        match pending[from..].iter().position(|b| *b == b'\n') {
            Some(i) => Some(from + i),
            None => {
                self.scanned.set(pending.len());
                None
            }
        }
    }

    /// Call at end of input: leftover bytes mean a truncated frame.
    pub fn finish(&self) -> Result<(), WireError> {
        if self.pending().iter().all(|b| b.is_ascii_whitespace()) {
            Ok(())
        } else {
            Err(WireError::Truncated { buffered: self.buffered() })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_frame_header_matches_the_encoder() {
        for len in [0usize, 1, 250, 251, 4096, 65_535, 65_536, 262_144, 1 << 20] {
            for stream in [Stream::Stdout, Stream::Stderr] {
                let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let whole =
                    encode(&ServerMessage::Output { stream, data: data.clone() }, Encoding::Bincode).unwrap();
                let mut parts = output_frame_header(stream, len);
                parts.extend_from_slice(&data);
                assert_eq!(parts, whole, "{len} bytes on {stream:?}");
            }
        }
    }

    #[test]
    fn output_frames_are_read_in_place_and_nothing_else_is() {
        let mut wire = Vec::new();
        let mut sent = Vec::new();
        for (i, len) in [0usize, 1, 250, 251, 65_535, 65_536, 1 << 20].into_iter().enumerate() {
            let stream = if i % 2 == 0 { Stream::Stdout } else { Stream::Stderr };
            let data: Vec<u8> = (0..len).map(|b| (b * 7 + i) as u8).collect();
            wire.extend(
                encode(&ServerMessage::Output { stream, data: data.clone() }, Encoding::Bincode).unwrap(),
            );
            sent.push((stream, data));
            // Another message between them: left to next_message.
            wire.extend(
                encode(
                    &ServerMessage::Started { run_id: i as u64, executor: Executor::LinuxTierC },
                    Encoding::Bincode,
                )
                .unwrap(),
            );
        }
        let mut d = Decoder::new(Some(Encoding::Bincode));
        // In pieces, so that frames arrive incomplete first.
        for piece in wire.chunks(7919) {
            d.push(piece);
        }
        for (i, (stream, data)) in sent.iter().enumerate() {
            let (s, bytes) = d.next_output().expect("an output frame");
            assert_eq!((s, bytes), (*stream, data.as_slice()), "frame {i}");
            assert!(d.next_output().is_none(), "a started message is not output");
            let m: ServerMessage = d.next_message().unwrap().unwrap();
            assert!(matches!(m, ServerMessage::Started { run_id, .. } if run_id == i as u64));
        }
        assert!(d.next_output().is_none() && d.buffered() == 0);
        // Incomplete: nothing until the rest arrives.
        let frame =
            encode(&ServerMessage::Output { stream: Stream::Stdout, data: vec![9; 300] }, Encoding::Bincode)
                .unwrap();
        d.push(&frame[..100]);
        assert!(d.next_output().is_none());
        d.push(&frame[100..]);
        assert_eq!(d.next_output().map(|(_, b)| b.len()), Some(300));
        // A frame whose inner lengths disagree is not read in place (next_message refuses it).
        let mut bad = frame.clone();
        bad[7] = 1;
        d.push(&bad);
        assert!(d.next_output().is_none());
        assert!(d.next_message::<ServerMessage>().is_err());
    }

    #[test]
    fn a_whole_pending_frame_or_line_is_known_before_decoding() {
        // JSON lines when this build can encode them.
        for encoding in [Encoding::Bincode, Encoding::Json] {
            let Ok(wire) = encode(&ClientMessage::Cancel, encoding) else { continue };
            let mut d = Decoder::new(Some(encoding));
            assert!(!d.has_message());
            for (i, b) in wire.iter().enumerate() {
                d.push(&[*b]);
                assert_eq!(
                    d.has_message(),
                    i + 1 == wire.len(),
                    "{encoding:?}, {} of {} bytes",
                    i + 1,
                    wire.len()
                );
            }
            assert!(matches!(d.next_message::<ClientMessage>(), Ok(Some(ClientMessage::Cancel))));
            assert!(!d.has_message());
        }
    }

    /// A JSON line arriving in many pieces is scanned for its end once, not
    /// again from its start at every piece (8 MiB in 16 KiB pieces would be
    /// 2 GiB of scanning).
    #[test]
    fn each_byte_of_a_long_json_line_is_scanned_once() {
        let mut d = Decoder::new(Some(Encoding::Json));
        d.set_limit(MAX_FRAME_BYTES);
        let piece = vec![b' '; 16 * 1024];
        let mut pushed = 0;
        while pushed + piece.len() < MAX_FRAME_BYTES {
            d.push(&piece);
            pushed += piece.len();
            assert!(!d.has_message());
        }
        assert!(d.examined.get() <= pushed, "{} bytes examined for {pushed} received", d.examined.get());
        d.push(b"\n{");
        assert!(d.has_message());
        assert!(d.examined.get() <= pushed + 2);
    }

    #[test]
    fn the_start_of_a_large_output_frame_is_handed_over_with_what_remains() {
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let frame =
            encode(&ServerMessage::Output { stream: Stream::Stderr, data: data.clone() }, Encoding::Bincode)
                .unwrap();
        let header = output_frame_header(Stream::Stderr, data.len()).len();
        let mut d = Decoder::new(Some(Encoding::Bincode));
        // The header alone is not enough to know the frame's shape.
        d.push(&frame[..header - 1]);
        assert!(d.take_output_start(1, |_| true).is_none());
        d.push(&frame[header - 1..header + 500]);
        // Less than min_rest to come: left to the decoder.
        assert!(d.take_output_start(200_000, |_| true).is_none());
        // Not a stream the caller takes.
        assert!(d.take_output_start(4096, |s| s == Stream::Stdout).is_none());
        let (stream, here, rest, head) =
            d.take_output_start(4096, |s| s == Stream::Stderr).expect("the start of an output frame");
        assert_eq!((stream, here, rest, head), (Stream::Stderr, &data[..500], data.len() - 500, header));
        assert_eq!(d.buffered(), 0);
        // A complete frame is next_output's, and any other message next_message's.
        d.push(&frame);
        assert!(d.take_output_start(1, |_| true).is_none());
        assert_eq!(d.next_output().map(|(_, b)| b.len()), Some(data.len()));
        d.push(
            &encode(&ServerMessage::Started { run_id: 1, executor: Executor::LinuxTierC }, Encoding::Bincode)
                .unwrap(),
        );
        assert!(d.take_output_start(1, |_| true).is_none());
    }

    fn run() -> ClientMessage {
        ClientMessage::Run(RunRequest {
            argv: vec!["echo".into(), "hi".into()],
            stdin: b"in".to_vec(),
            timeout_secs: Some(5),
            ..RunRequest::default()
        })
    }

    #[test]
    fn a_parameter_is_a_string_or_a_list_in_json_and_an_enum_in_bincode() {
        let read = |json: &str| serde_json::from_str::<ParamValue>(json);
        let one = ParamValue::One("sub".into());
        let many = ParamValue::Many(vec!["a".into(), "b".into()]);
        assert_eq!(read(r#""sub""#).unwrap(), one);
        assert_eq!(read(r#"["a", "b"]"#).unwrap(), many);
        // Version 12's form.
        assert_eq!(read(r#"{"one": "sub"}"#).unwrap(), one);
        assert_eq!(read(r#"{"many": ["a", "b"]}"#).unwrap(), many);
        let bad = read("3").unwrap_err().to_string();
        assert!(bad.contains("a path (a string) or a list of paths"), "{bad}");
        assert!(read(r#"["a", 3]"#).is_err() && read(r#"{"two": "x"}"#).is_err());
        assert_eq!(serde_json::to_string(&one).unwrap(), r#""sub""#);
        assert_eq!(serde_json::to_string(&many).unwrap(), r#"["a","b"]"#);
        // bincode: the enum it always was.
        for (value, tagged) in
            [(&one, TaggedParam::One("sub".into())), (&many, TaggedParam::Many(vec!["a".into(), "b".into()]))]
        {
            let bytes = bincode::serde::encode_to_vec(value, bincode::config::standard()).unwrap();
            assert_eq!(bytes, bincode::serde::encode_to_vec(&tagged, bincode::config::standard()).unwrap());
            let (back, _): (ParamValue, usize) =
                bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
            assert_eq!(&back, value);
        }
    }

    #[test]
    fn bincode_frames_round_trip_across_split_reads() {
        let mut bytes =
            encode(&ClientMessage::Hello(Hello::new(Encoding::Bincode)), Encoding::Bincode).unwrap();
        bytes.extend(encode(&run(), Encoding::Bincode).unwrap());
        let mut d = Decoder::default();
        let mut got = vec![];
        for b in bytes {
            d.push(&[b]);
            while let Some(m) = d.next_message::<ClientMessage>().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got, vec![ClientMessage::Hello(Hello::new(Encoding::Bincode)), run()]);
        assert_eq!(d.encoding(), Some(Encoding::Bincode));
        d.finish().unwrap();
    }

    /// Bytes travel as text or base64 in JSON (anything else is refused,
    /// saying so), as raw bytes in bincode; unit messages are bare strings,
    /// or objects with a null.
    #[cfg(feature = "json")]
    #[test]
    fn json_carries_bytes_as_text_or_base64() {
        let output = ServerMessage::Output { stream: Stream::Stdout, data: b"total\n\xff".to_vec() };
        let line = encode(&output, Encoding::Json).unwrap();
        assert_eq!(line, b"{\"output\":{\"stream\":\"stdout\",\"data\":{\"base64\":\"dG90YWwK/w==\"}}}\n");
        let text =
            ServerMessage::Output { stream: Stream::Stdout, data: "t\u{e9}\"xt\n".as_bytes().to_vec() };
        let text_line = encode(&text, Encoding::Json).unwrap();
        assert_eq!(
            text_line,
            "{\"output\":{\"stream\":\"stdout\",\"data\":\"t\u{e9}\\\"xt\\n\"}}\n".as_bytes()
        );
        // A NUL is not text: base64 rather than six bytes of escape each.
        let nul = ServerMessage::Output { stream: Stream::Stdout, data: b"a\0".to_vec() };
        assert!(encode(&nul, Encoding::Json).unwrap().ends_with(b"{\"base64\":\"YQA=\"}}}\n"));
        let mut d = Decoder::new(Some(Encoding::Json));
        d.push(&line);
        assert_eq!(d.next_message::<ServerMessage>().unwrap(), Some(output.clone()));
        let frame = encode(&output, Encoding::Bincode).unwrap();
        assert!(frame.ends_with(b"total\n\xff"));
        let decode = |line: &str| {
            let mut d = Decoder::new(Some(Encoding::Json));
            d.push(format!("{line}\n").as_bytes());
            d.next_message::<ClientMessage>()
        };
        for (stdin, bytes) in [(r#""hi\n""#, &b"hi\n"[..]), (r#"{"base64": "aP8="}"#, b"h\xff")] {
            let line = format!(r#"{{"run": {{"argv": ["cat"], "stdin": {stdin}}}}}"#);
            let Ok(Some(ClientMessage::Run(r))) = decode(&line) else { panic!("{line}") };
            assert_eq!(r.stdin, bytes);
        }
        let err = decode(r#"{"run": {"argv": ["cat"], "stdin": [104, 105]}}"#).unwrap_err().to_string();
        assert!(err.contains(r#"expected a string (the bytes as UTF-8 text) or {"base64""#), "{err}");
        let err = decode(r#"{"run": {"argv": ["cat"], "stdin": {"base64": "h!"}}}"#).unwrap_err().to_string();
        assert!(err.contains("not base64"), "{err}");
        let err = decode(r#"{"run": {"argv": ["cat"], "stdin": {"hex": "00"}}}"#).unwrap_err().to_string();
        assert!(err.contains("one key, base64"), "{err}");
        for cancel in [r#""cancel""#, r#"{"cancel": null}"#] {
            assert_eq!(decode(cancel).unwrap(), Some(ClientMessage::Cancel), "{cancel}");
        }
    }

    #[cfg(feature = "json")]
    #[test]
    fn the_json_output_line_is_what_encode_gives() {
        for (stream, data) in [
            (Stream::Stdout, &b""[..]),
            (Stream::Stderr, b"a\xff\n\"\\"),
            (Stream::Stdout, &[7u8; 100_000][..]),
        ] {
            let message = ServerMessage::Output { stream, data: data.to_vec() };
            assert_eq!(output_json_line(stream, data), encode(&message, Encoding::Json).unwrap());
        }
    }

    #[cfg(feature = "json")]
    #[test]
    fn json_lines_round_trip_and_are_detected() {
        let bytes = encode(&run(), Encoding::Json).unwrap();
        assert_eq!(bytes[0], b'{');
        let mut d = Decoder::default();
        d.push(&bytes);
        assert_eq!(d.next_message::<ClientMessage>().unwrap(), Some(run()));
        assert_eq!(d.encoding(), Some(Encoding::Json));
        let mut d = Decoder::default();
        d.push(br#"{"run": {"argv": ["ls"]}}"#);
        d.push(b"\n");
        assert_eq!(
            d.next_message::<ClientMessage>().unwrap(),
            Some(ClientMessage::Run(RunRequest { argv: vec!["ls".into()], ..Default::default() }))
        );
    }

    /// The plugin messages, appended in version 5: the older indexes did not
    /// move, and the JSON reads as docs/protocol.md shows it.
    #[cfg(feature = "json")]
    #[test]
    fn plugin_messages_are_appended_and_read_as_documented() {
        let call = ClientMessage::RunPlugin {
            skill: "echo".into(),
            input: r#"{"q":1}"#.into(),
            inline_module: None,
            timeout_ms: Some(500),
        };
        assert_eq!(encode(&call, Encoding::Bincode).unwrap()[4], 8);
        let line = r#"{"run_plugin": {"skill": "echo", "input": "{\"q\":1}", "timeout_ms": 500}}"#;
        let mut d = Decoder::new(Some(Encoding::Json));
        d.push(format!("{line}\n").as_bytes());
        assert_eq!(d.next_message::<ClientMessage>().unwrap(), Some(call));
        let jail = crate::plugin::PluginHostJail {
            executor: Executor::LinuxTierC,
            pid: 1,
            namespaces: vec![],
            seccomp_sha256: String::new(),
            landlock: None,
            execution_sha256: String::new(),
            engine: String::new(),
            address_space_unlimited: true,
            cgroup: Some(crate::plugin::PluginHostCgroup {
                name: "run-1-2-plugin-host-1".into(),
                v1: false,
                memory_bytes: 512 << 20,
                processes: 64,
            }),
        };
        let limits = crate::plugin::PluginLimits {
            fuel_budget: 1,
            max_memory_bytes: 2,
            max_table_elements: 3,
            max_instances: 4,
            deadline_ms: 5,
        };
        let result = ServerMessage::PluginResult {
            output: "{}".into(),
            fuel_used: 1,
            memory_peak_bytes: 65536,
            instantiate_us: 3,
            call_us: 2,
            attestation: Box::new(crate::plugin::PluginAttestation {
                skill: "echo".into(),
                module_sha256: "ab".into(),
                entry: "palisade_plugin_main".into(),
                grants: Default::default(),
                limits,
                fuel_used: 1,
                memory_peak_bytes: 65536,
                host_calls: 0,
                host_calls_refused: 0,
                jail,
                journal: None,
                store: Some(crate::plugin::PluginStore { uid: 1000, skill: "echo".into(), quota_bytes: 1 }),
            }),
        };
        let bytes = encode(&result, Encoding::Bincode).unwrap();
        assert_eq!(bytes[4], 9);
        let json = String::from_utf8(encode(&result, Encoding::Json).unwrap()).unwrap();
        assert!(json.starts_with(r#"{"plugin_result":{"output":"{}","fuel_used":1,"#), "{json}");
    }

    /// `status`, appended last: every other message keeps its bincode
    /// index, a small frame (not a run), and the JSON docs/protocol.md shows.
    #[cfg(feature = "json")]
    #[test]
    fn status_comes_last_and_reads_as_documented() {
        let bincode_index = |m: &ClientMessage| encode(m, Encoding::Bincode).unwrap()[4];
        assert_eq!(bincode_index(&ClientMessage::ListChanges), 10);
        assert_eq!(bincode_index(&ClientMessage::DiscardChanges { id: "x".into() }), 13);
        assert_eq!(bincode_index(&ClientMessage::Status), 14);
        let server_index = |m: &ServerMessage| encode(m, Encoding::Bincode).unwrap()[4];
        assert_eq!(server_index(&ServerMessage::ChangesDiscarded { id: "x".into() }), 14);
        assert_eq!(server_index(&ServerMessage::Status(Box::default())), 15);
        let mut d = Decoder::new(Some(Encoding::Json));
        d.push(b"\"status\"\n");
        assert_eq!(d.next_message::<ClientMessage>().unwrap(), Some(ClientMessage::Status));
        let status = BrokerStatus { journal: None, ..Default::default() };
        let json = String::from_utf8(
            encode(&ServerMessage::Status(Box::new(status.clone())), Encoding::Json).unwrap(),
        )
        .unwrap();
        assert!(
            json.starts_with(r#"{"status":{"version":"","protocol":0,"#)
                && json.contains(r#""journal":null"#),
            "{json}"
        );
        let mut d = Decoder::new(Some(Encoding::Json));
        d.push(json.as_bytes());
        assert_eq!(d.next_message::<ServerMessage>().unwrap(), Some(ServerMessage::Status(Box::new(status))));
    }

    /// The streamed stdin's messages, appended in version 14: after
    /// `status`, small frames, read as docs/protocol.md shows them; the
    /// broker's flag for a streamed stdin is on no wire.
    #[cfg(feature = "json")]
    #[test]
    fn streamed_stdin_messages_come_after_status_and_read_as_documented() {
        let bincode_index = |m: &ClientMessage| encode(m, Encoding::Bincode).unwrap()[4];
        assert_eq!(bincode_index(&ClientMessage::RunWithStdin(RunRequest::default())), 15);
        assert_eq!(bincode_index(&ClientMessage::Stdin { data: vec![1] }), 16);
        assert_eq!(bincode_index(&ClientMessage::StdinEnd), 17);
        let mut d = Decoder::new(Some(Encoding::Json));
        d.push(b"{\"run_with_stdin\": {\"argv\": [\"wc\"], \"cwd\": \"/w\"}}\n");
        d.push(b"{\"stdin\": {\"data\": \"a\\n\"}}\n{\"stdin\": {\"data\": {\"base64\": \"AP8K\"}}}\n\"stdin_end\"\n");
        let Some(ClientMessage::RunWithStdin(r)) = d.next_message::<ClientMessage>().unwrap() else {
            panic!()
        };
        assert_eq!((r.argv, r.stdin_streamed), (vec!["wc".to_string()], false));
        assert_eq!(d.next_message().unwrap(), Some(ClientMessage::Stdin { data: b"a\n".to_vec() }));
        assert_eq!(d.next_message().unwrap(), Some(ClientMessage::Stdin { data: vec![0, 0xff, b'\n'] }));
        assert_eq!(d.next_message().unwrap(), Some(ClientMessage::StdinEnd));
        let flagged = RunRequest { stdin_streamed: true, ..RunRequest::default() };
        for encoding in [Encoding::Bincode, Encoding::Json] {
            let mut d = Decoder::new(Some(encoding));
            d.push(&encode(&ClientMessage::Run(flagged.clone()), encoding).unwrap());
            let Some(ClientMessage::Run(r)) = d.next_message::<ClientMessage>().unwrap() else { panic!() };
            assert!(!r.stdin_streamed, "{encoding:?}");
        }
        let mut d = Decoder::new(Some(Encoding::Json));
        d.push(b"{\"run\": {\"argv\": [\"wc\"], \"stdin_streamed\": true}}\n");
        assert!(d.next_message::<ClientMessage>().is_err());
        // A message's name is its JSON key.
        for m in [ClientMessage::RunWithStdin(RunRequest::default()), ClientMessage::Stdin { data: vec![] }] {
            let json = String::from_utf8(encode(&m, Encoding::Json).unwrap()).unwrap();
            assert!(json.starts_with(&format!("{{\"{}\"", m.name())), "{json}");
        }
        assert_eq!(ClientMessage::StdinEnd.name(), "stdin_end");
    }

    /// The terminal's messages, appended in version 15, read as documented;
    /// the broker's `terminal` is on no wire but in `run_in_terminal`.
    #[cfg(feature = "json")]
    #[test]
    fn terminal_messages_come_after_stdin_end_and_read_as_documented() {
        let bincode_index = |m: &ClientMessage| encode(m, Encoding::Bincode).unwrap()[4];
        let size = WindowSize { rows: 24, cols: 80 };
        let run = RunRequest::default();
        assert_eq!(bincode_index(&ClientMessage::RunInTerminal { run: run.clone(), size }), 18);
        assert_eq!(bincode_index(&ClientMessage::Resize(size)), 19);
        let mut d = Decoder::new(Some(Encoding::Json));
        d.push(b"{\"run_in_terminal\": {\"run\": {\"argv\": [\"sh\"], \"cwd\": \"/w\"}, \"size\": {\"rows\": 24, \"cols\": 80}}}\n");
        d.push(b"{\"resize\": {\"rows\": 40, \"cols\": 132}}\n");
        let Some(ClientMessage::RunInTerminal { run, size: got }) =
            d.next_message::<ClientMessage>().unwrap()
        else {
            panic!()
        };
        assert_eq!((run.argv, run.terminal, got), (vec!["sh".to_string()], None, size));
        assert_eq!(
            d.next_message().unwrap(),
            Some(ClientMessage::Resize(WindowSize { rows: 40, cols: 132 }))
        );
        d.push(b"{\"resize\": {\"rows\": 40, \"columns\": 132}}\n");
        assert!(d.next_message::<ClientMessage>().is_err(), "an unknown field is refused");
        let flagged = RunRequest { terminal: Some(size), ..RunRequest::default() };
        let json = String::from_utf8(encode(&ClientMessage::Run(flagged), Encoding::Json).unwrap()).unwrap();
        assert!(!json.contains("terminal"), "{json}");
        assert_eq!(ClientMessage::Resize(size).name(), "resize");
        assert_eq!(
            ClientMessage::RunInTerminal { run: RunRequest::default(), size }.name(),
            "run_in_terminal"
        );
        assert!(WindowSize { rows: 1, cols: WINDOW_MAX }.check().is_ok());
        assert!(WindowSize { rows: 0, cols: 1 }.check().is_err());
        assert!(WindowSize { rows: 1, cols: WINDOW_MAX + 1 }.check().is_err());
    }

    /// The sessions' messages, appended in version 16, read as documented.
    #[cfg(feature = "json")]
    #[test]
    fn session_messages_come_after_resize_and_read_as_documented() {
        let client_index = |m: &ClientMessage| encode(m, Encoding::Bincode).unwrap()[4];
        let server_index = |m: &ServerMessage| encode(m, Encoding::Bincode).unwrap()[4];
        let run = RunRequest::default();
        assert_eq!(client_index(&ClientMessage::StartSession(StartSession::default())), 20);
        assert_eq!(client_index(&ClientMessage::RunInSession { session: "s".into(), run }), 21);
        assert_eq!(client_index(&ClientMessage::ListSessions), 22);
        assert_eq!(client_index(&ClientMessage::StopSession { session: "s".into() }), 23);
        assert_eq!(server_index(&ServerMessage::SessionStarted(SessionInfo::default())), 16);
        assert_eq!(server_index(&ServerMessage::Sessions(vec![])), 17);
        // Version 17's, after them.
        assert_eq!(client_index(&ClientMessage::Publish { session: "s".into(), port: 3000 }), 24);
        assert_eq!(server_index(&ServerMessage::Published(PublishedPort::default())), 18);
        let streamed =
            ClientMessage::RunInSessionWithStdin { session: "s".into(), run: RunRequest::default() };
        assert_eq!(client_index(&streamed), 25);
        let size = WindowSize { rows: 24, cols: 80 };
        let in_terminal =
            ClientMessage::RunInSessionInTerminal { session: "s".into(), run: RunRequest::default(), size };
        assert_eq!(client_index(&in_terminal), 26);
        let mut d = Decoder::new(Some(Encoding::Json));
        d.push(b"{\"start_session\": {\"name\": \"dev\", \"run\": {\"argv\": [], \"cwd\": \"/w\"}}}\n");
        d.push(b"\"list_sessions\"\n");
        d.push(b"{\"publish\": {\"session\": \"dev\", \"port\": 3000}}\n");
        d.push(b"{\"start_session\": {\"run\": {\"argv\": []}, \"idle\": 5}}\n");
        let Some(ClientMessage::StartSession(start)) = d.next_message::<ClientMessage>().unwrap() else {
            panic!()
        };
        assert_eq!((start.name.as_deref(), start.idle_timeout_secs), (Some("dev"), None));
        assert_eq!(d.next_message().unwrap(), Some(ClientMessage::ListSessions));
        let publish = ClientMessage::Publish { session: "dev".into(), port: 3000 };
        assert_eq!(d.next_message().unwrap(), Some(publish));
        assert!(d.next_message::<ClientMessage>().is_err(), "an unknown field is refused");
        for m in [ClientMessage::ListSessions, ClientMessage::StopSession { session: "s".into() }] {
            let json = String::from_utf8(encode(&m, Encoding::Json).unwrap()).unwrap();
            assert!(
                json.starts_with(&format!("{{\"{}\"", m.name()))
                    || json.starts_with(&format!("\"{}\"", m.name())),
                "{json}"
            );
        }
    }

    /// The approval messages, appended in version 3: their bincode indexes
    /// follow the older ones (which did not move), and their JSON is the
    /// one docs/protocol.md shows.
    #[cfg(feature = "json")]
    #[test]
    fn approval_messages_keep_the_older_indexes_and_read_as_documented() {
        let bincode_index = |m: &ClientMessage| encode(m, Encoding::Bincode).unwrap()[4];
        assert_eq!(bincode_index(&ClientMessage::Cancel), 2);
        assert_eq!(bincode_index(&ClientMessage::Approve { approved: true }), 3);
        assert_eq!(bincode_index(&ClientMessage::ListApprovals), 4);
        let answer = ClientMessage::Answer { approval: 4, approved: false, reason: Some("no".into()) };
        assert_eq!(bincode_index(&answer), 5);
        assert_eq!(bincode_index(&ClientMessage::ApproveTool { name: "t".into() }), 7);
        let server_index = |m: &ServerMessage| encode(m, Encoding::Bincode).unwrap()[4];
        assert_eq!(server_index(&ServerMessage::Approvals(vec![])), 6);
        assert_eq!(server_index(&ServerMessage::Tools(vec![])), 8);
        assert_eq!(
            encode(&ErrorKind::JournalUnavailable, Encoding::Bincode).unwrap()[4],
            14,
            "JournalUnavailable comes last"
        );
        for (line, want) in [
            (r#""list_approvals""#, ClientMessage::ListApprovals),
            (r#"{"answer": {"approval": 4, "approved": false, "reason": "no"}}"#, answer.clone()),
            (
                r#"{"answer": {"approval": 4, "approved": true}}"#,
                ClientMessage::Answer { approval: 4, approved: true, reason: None },
            ),
            (r#"{"approve_tool": {"name": "t"}}"#, ClientMessage::ApproveTool { name: "t".into() }),
        ] {
            let mut d = Decoder::new(Some(Encoding::Json));
            d.push(format!("{line}\n").as_bytes());
            assert_eq!(d.next_message::<ClientMessage>().unwrap(), Some(want), "{line}");
        }
        let pending = PendingApproval {
            id: 4,
            trigger: Some(EscalationTrigger {
                reason: EscalationReason::PathOutOfScope,
                requested_path: Some("/srv/x".into()),
                approved_paths: vec!["/w (read-only)".into()],
            }),
            ..Default::default()
        };
        let asked = ServerMessage::ApprovalRequired {
            reason: "r".into(),
            may_answer: false,
            approval: Box::new(pending),
        };
        let json = String::from_utf8(encode(&asked, Encoding::Json).unwrap()).unwrap();
        assert!(
            json.contains(r#""may_answer":false"#) && json.contains(r#""reason":"PathOutOfScope""#),
            "{json}"
        );
        let mut d = Decoder::new(Some(Encoding::Bincode));
        d.push(&encode(&asked, Encoding::Bincode).unwrap());
        assert_eq!(d.next_message::<ServerMessage>().unwrap(), Some(asked));
    }

    #[cfg(feature = "json")]
    #[test]
    fn json_with_wrong_types_is_malformed() {
        let mut d = Decoder::default();
        d.push(b"{\"run\": {\"argv\": \"not a list\"}}\n");
        assert!(matches!(d.next_message::<ClientMessage>(), Err(WireError::Malformed(_))));
    }

    fn helper_failed() -> ErrorReply {
        let failure = HelperFailure {
            stage: crate::status::Stage::Rlimits,
            errno: 1,
            errno_name: "EPERM".into(),
            message: "setrlimit RLIMIT_NOFILE 100000/100000: EPERM".into(),
        };
        ErrorReply {
            helper: Some(Box::new(HelperFailureReply::from(&failure))),
            ..ErrorReply::new(ErrorKind::RuntimeFailure, format!("sandbox setup failed: {failure}"))
        }
    }

    #[test]
    fn an_error_carries_the_helpers_stage_and_errno_in_both_encodings() {
        let sent = ServerMessage::Error(helper_failed());
        for encoding in [Encoding::Bincode, Encoding::Json] {
            let Ok(bytes) = encode(&sent, encoding) else { continue };
            let mut d = Decoder::new(Some(encoding));
            d.push(&bytes);
            assert_eq!(d.next_message::<ServerMessage>().unwrap().as_ref(), Some(&sent), "{encoding:?}");
        }
    }

    #[cfg(feature = "json")]
    #[test]
    fn the_json_error_fields_are_named_as_documented_and_old_errors_still_read() {
        let v = serde_json::to_value(ServerMessage::Error(helper_failed())).unwrap();
        assert_eq!(
            v["error"]["helper"],
            serde_json::json!({"stage": "rlimits", "errno": 1, "errno_name": "EPERM",
                               "message": "setrlimit RLIMIT_NOFILE 100000/100000: EPERM"})
        );
        assert_eq!(v["error"]["kind"], "RuntimeFailure");
        // An error written before `rule` and `helper` existed.
        let mut d = Decoder::new(Some(Encoding::Json));
        d.push(b"{\"error\": {\"kind\": \"Busy\", \"message\": \"later\"}}\n");
        assert_eq!(
            d.next_message::<ServerMessage>().unwrap(),
            Some(ServerMessage::Error(ErrorReply::new(ErrorKind::Busy, "later")))
        );
    }

    #[test]
    fn every_status_palisade_ended_has_a_kind_and_no_other_does() {
        use RunStatus::*;
        let ended = [TimedOut, QuotaExceeded, MemoryLimitExceeded, DiskLimitExceeded, Cancelled];
        assert!(ended.iter().all(|s| s.error_kind().is_some()));
        assert_eq!(TimedOut.error_kind(), Some(ErrorKind::TimedOut));
        assert_eq!(Cancelled.error_kind(), Some(ErrorKind::RuntimeFailure));
        assert_eq!(Exited { code: 3 }.error_kind(), None);
        assert_eq!(Signaled { signal: 9 }.error_kind(), None);
        assert_eq!(Stopped.error_kind(), None, "a session its requester stopped is no error");
    }

    /// A stopped session says `stopped` from version 20, `cancelled` (what
    /// it said before) on an older connection, in both encodings; the
    /// other statuses are the same in both forms.
    #[test]
    fn a_stopped_session_is_said_cancelled_in_an_older_form() {
        use crate::form::{STOPPED_VERSION, in_form_of};
        let config = bincode::config::standard();
        let old = STOPPED_VERSION - 1;
        assert_eq!(serde_json::to_value(RunStatus::Stopped).unwrap(), "stopped");
        assert_eq!(in_form_of(old, || serde_json::to_value(RunStatus::Stopped).unwrap()), "cancelled");
        let bytes = bincode::serde::encode_to_vec(RunStatus::Stopped, config).unwrap();
        let (back, _): (RunStatus, usize) = bincode::serde::decode_from_slice(&bytes, config).unwrap();
        assert_eq!(back, RunStatus::Stopped);
        let earlier = in_form_of(old, || bincode::serde::encode_to_vec(RunStatus::Stopped, config).unwrap());
        let (back, _): (RunStatus, usize) =
            in_form_of(old, || bincode::serde::decode_from_slice(&earlier, config).unwrap());
        assert_eq!(back, RunStatus::Cancelled);
        for s in [RunStatus::Exited { code: 2 }, RunStatus::TimedOut, RunStatus::Cancelled] {
            let now = bincode::serde::encode_to_vec(s, config).unwrap();
            assert_eq!(in_form_of(old, || bincode::serde::encode_to_vec(s, config).unwrap()), now, "{s:?}");
            let (back, _): (RunStatus, usize) = bincode::serde::decode_from_slice(&now, config).unwrap();
            assert_eq!(back, s);
        }
    }

    /// A change set's `broker` is at the end of its info from version 20;
    /// an older connection's form has none, in either encoding.
    #[test]
    fn a_change_sets_broker_is_not_in_an_older_form() {
        use crate::form::{STOPPED_VERSION, in_form_of};
        let info = ChangeSetInfo {
            id: "0123456789ab".into(),
            run_id: 1,
            created: 1_800_000_000,
            status: "held".into(),
            reason: "held for review".into(),
            roots: vec!["/w".into()],
            entries: 1,
            bytes: 2,
            conflicts: 0,
            host_executed: 0,
            broker: Some("4121-1018522".into()),
        };
        let detail = ChangeSetDetail { info: info.clone(), entries: vec![], diff: "d".into() };
        let config = bincode::config::standard();
        let whole = bincode::serde::encode_to_vec(&detail, config).unwrap();
        let (back, _): (ChangeSetDetail, usize) = bincode::serde::decode_from_slice(&whole, config).unwrap();
        assert_eq!(back, detail);
        let old = STOPPED_VERSION - 1;
        let earlier = in_form_of(old, || bincode::serde::encode_to_vec(&detail, config).unwrap());
        let (back, _): (ChangeSetDetail, usize) =
            in_form_of(old, || bincode::serde::decode_from_slice(&earlier, config).unwrap());
        let said = ChangeSetInfo { broker: None, ..info.clone() };
        assert_eq!((back.info, back.diff.as_str()), (said, "d"));
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(json["broker"], "4121-1018522", "{json}");
        let old_json = in_form_of(old, || serde_json::to_value(&info).unwrap());
        assert!(old_json.get("broker").is_none(), "{old_json}");
        let read: ChangeSetInfo = serde_json::from_value(old_json).unwrap();
        assert_eq!(read.broker, None);
    }

    /// A result of version 21's form: the documented run, approved.
    fn approved_result() -> RunResult {
        let json = serde_json::json!({
            "run_id": 7, "status": {"exited": {"code": 0}}, "wall_ms": 4, "cpu_user_ms": 5,
            "cpu_system_ms": 0, "peak_memory_bytes": 2056192, "memory_source": "rusage",
            "stdout_bytes": 22, "stderr_bytes": 10, "written_bytes": 0,
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
            "approved": {"uid": 1002, "name": "alice", "rule": "cedar.ask", "reason": "git push publishes"}
        });
        serde_json::from_value(json).unwrap()
    }

    /// A result's `approved` is at its end from version 21; an older
    /// connection's form has none, in either encoding.
    #[test]
    fn a_results_approved_is_not_in_an_older_form() {
        use crate::form::{OPERATIONS_VERSION, in_form_of};
        let result = approved_result();
        let who = Approved {
            uid: 1002,
            name: Some("alice".into()),
            rule: "cedar.ask".into(),
            reason: "git push publishes".into(),
        };
        assert_eq!(result.approved.as_ref(), Some(&who));
        let config = bincode::config::standard();
        let whole = bincode::serde::encode_to_vec(&result, config).unwrap();
        let (back, _): (RunResult, usize) = bincode::serde::decode_from_slice(&whole, config).unwrap();
        assert_eq!(back, result);
        let old = OPERATIONS_VERSION - 1;
        let earlier = in_form_of(old, || bincode::serde::encode_to_vec(&result, config).unwrap());
        assert!(earlier.len() < whole.len());
        let (back, _): (RunResult, usize) =
            in_form_of(old, || bincode::serde::decode_from_slice(&earlier, config).unwrap());
        assert_eq!(back, RunResult { approved: None, ..result.clone() });
        // A run nobody was asked about: the same bytes as before, but the option's one.
        let unasked = RunResult { approved: None, ..result.clone() };
        let now = bincode::serde::encode_to_vec(&unasked, config).unwrap();
        assert_eq!(now.len(), earlier.len() + 1);
        let json = serde_json::to_value(&result).unwrap();
        assert_eq!(json["approved"]["name"], "alice", "{json}");
        assert_eq!(serde_json::to_value(&unasked).unwrap()["approved"], serde_json::Value::Null);
        let old_json = in_form_of(old, || serde_json::to_value(&result).unwrap());
        assert!(old_json.get("approved").is_none(), "{old_json}");
        let read: RunResult = serde_json::from_value(old_json).unwrap();
        assert_eq!(read.approved, None);
    }

    #[test]
    fn oversized_frames_are_refused_from_the_length_alone() {
        let mut d = Decoder::default();
        d.push(&(MAX_FRAME_BYTES as u32 + 1).to_be_bytes());
        assert!(matches!(d.next_message::<ClientMessage>(), Err(WireError::TooLarge { .. })));
    }

    /// A broker reading a client takes frames over the small limit from a
    /// `run` only, and refuses any other message from its first bytes,
    /// before the rest of it is buffered; within the limit, anything goes.
    #[test]
    fn frames_over_the_small_limit_are_runs_or_refused_from_their_first_bytes() {
        const SMALL: usize = 1000;
        let small_decoder = |encoding| {
            let mut d = Decoder::new(Some(encoding));
            d.set_small_limit(SMALL);
            d
        };
        assert_eq!(encode(&run(), Encoding::Bincode).unwrap()[4], RUN_VARIANT);
        // A bincode frame of another message: refused at its fifth byte.
        let mut d = small_decoder(Encoding::Bincode);
        d.push(&(SMALL as u32 + 1).to_be_bytes());
        assert_eq!(d.next_message::<ClientMessage>(), Ok(None));
        d.push(&[4]);
        let refused = d.next_message::<ClientMessage>();
        assert_eq!(refused, Err(WireError::LargeNotRun { len: SMALL + 1, max: SMALL }));
        assert!(refused.unwrap_err().to_string().contains("limit of any message but a run with stdin"));
        // A run over it is taken, and its length told; one within it too.
        let big = ClientMessage::Run(RunRequest { stdin: vec![7; 3 * SMALL], ..RunRequest::default() });
        let frame = encode(&big, Encoding::Bincode).unwrap();
        let mut d = small_decoder(Encoding::Bincode);
        d.push(&frame[..5]);
        assert_eq!(d.next_message::<ClientMessage>(), Ok(None));
        d.push(&frame[5..]);
        assert_eq!(d.next_message::<ClientMessage>(), Ok(Some(big.clone())));
        assert_eq!(d.last_len(), frame.len() - 4);
        d.push(&encode(&ClientMessage::ListApprovals, Encoding::Bincode).unwrap());
        assert_eq!(d.next_message::<ClientMessage>(), Ok(Some(ClientMessage::ListApprovals)));
        #[cfg(feature = "json")]
        {
            // A JSON line that is not a run: refused once it is longer than
            // the limit, with or without its end.
            let explain = encode(&ClientMessage::Explain(RunRequest::default()), Encoding::Json).unwrap();
            let mut padded = explain[..explain.len() - 2].to_vec();
            padded.extend(vec![b' '; SMALL]);
            let mut d = small_decoder(Encoding::Json);
            d.push(&padded[..SMALL]);
            assert_eq!(d.next_message::<ClientMessage>(), Ok(None));
            d.push(&padded[SMALL..]);
            assert!(matches!(d.next_message::<ClientMessage>(), Err(WireError::LargeNotRun { .. })));
            // A run's line is taken, whitespace before its key or not; a run
            // whose key is escaped, or comes after 64 bytes, is not.
            let line = encode(&big, Encoding::Json).unwrap();
            for prefix in [&b""[..], b"  ", b"\t{ "] {
                let mut d = small_decoder(Encoding::Json);
                let whole = [prefix, if prefix.ends_with(b"{ ") { &line[1..] } else { &line }].concat();
                d.push(&whole[..whole.len() - 1]);
                assert_eq!(d.next_message::<ClientMessage>(), Ok(None), "{prefix:?}");
                d.push(b"\n");
                assert_eq!(d.next_message::<ClientMessage>(), Ok(Some(big.clone())), "{prefix:?}");
                assert_eq!(d.last_len(), whole.len() - 1);
            }
            let escaped = [&b"{\"\\u0072un\""[..], &line[6..]].concat();
            let spaced = [&b"{"[..], &[b' '; JSON_RUN_SCAN], &line[1..]].concat();
            for line in [escaped, spaced] {
                let mut d = small_decoder(Encoding::Json);
                d.push(&line);
                assert!(matches!(d.next_message::<ClientMessage>(), Err(WireError::LargeNotRun { .. })));
            }
        }
        // Without the small limit (a client reading a broker), nothing changes.
        let mut d = Decoder::new(Some(Encoding::Bincode));
        let list = encode(
            &ClientMessage::Explain(RunRequest {
                argv: vec!["a".repeat(2 * SMALL)],
                ..RunRequest::default()
            }),
            Encoding::Bincode,
        )
        .unwrap();
        d.push(&list);
        assert!(matches!(d.next_message::<ClientMessage>(), Ok(Some(ClientMessage::Explain(_)))));
    }

    /// Storage grown for a large frame is given back once the frame is
    /// decoded, keeping what is pending.
    #[test]
    fn storage_is_released_after_a_large_frame() {
        let mut d = Decoder::new(Some(Encoding::Bincode));
        let big = encode(
            &ClientMessage::Run(RunRequest { stdin: vec![1; 1 << 20], ..RunRequest::default() }),
            Encoding::Bincode,
        )
        .unwrap();
        d.push(&big);
        let cancel = encode(&ClientMessage::Cancel, Encoding::Bincode).unwrap();
        d.push(&cancel[..3]);
        assert!(matches!(d.next_message::<ClientMessage>(), Ok(Some(ClientMessage::Run(_)))));
        assert!(d.buf.len() > 1 << 20);
        d.release_storage(64 << 10);
        assert_eq!(d.buf.len(), 3);
        d.push(&cancel[3..]);
        assert_eq!(d.next_message::<ClientMessage>(), Ok(Some(ClientMessage::Cancel)));
    }

    #[test]
    fn garbage_and_truncation_are_errors() {
        let mut d = Decoder::default();
        d.push(&[0, 0, 0, 3, 0xff, 0xff, 0xff]);
        assert!(matches!(d.next_message::<ClientMessage>(), Err(WireError::Malformed(_))));
        let mut d = Decoder::default();
        let bytes = encode(&run(), Encoding::Bincode).unwrap();
        d.push(&bytes[..bytes.len() - 2]);
        assert_eq!(d.next_message::<ClientMessage>().unwrap(), None);
        assert!(matches!(d.finish(), Err(WireError::Truncated { .. })));
    }

    /// The run request's `allow_ports` and `allow_addresses` are at its end
    /// from version 20: an older connection's bincode form has neither; a
    /// decoder of 20 reads a request in that form too (what a client sends
    /// with its hello), and one that has them in either encoding.
    #[test]
    fn a_run_requests_reach_is_not_in_an_older_form() {
        use crate::form::REACH_VERSION;
        let old = REACH_VERSION - 1;
        let plain = RunRequest { argv: vec!["ls".into()], ..RunRequest::default() };
        let reaching = RunRequest {
            allow_ports: vec![3000],
            allow_addresses: vec!["127.0.0.1".into()],
            ..plain.clone()
        };
        let read = |bytes: &[u8], version: u32| {
            let mut d = Decoder::new(Some(Encoding::Bincode));
            d.set_version(version);
            d.push(bytes);
            d.next_message::<ClientMessage>()
        };
        let earlier = encode_in(&ClientMessage::Run(plain.clone()), Encoding::Bincode, old).unwrap();
        let now = encode(&ClientMessage::Run(plain.clone()), Encoding::Bincode).unwrap();
        assert_eq!(now.len(), earlier.len() + 2, "two empty lists at its end");
        for (bytes, version) in [(&earlier, old), (&earlier, REACH_VERSION), (&now, REACH_VERSION)] {
            assert_eq!(read(bytes, version).unwrap(), Some(ClientMessage::Run(plain.clone())), "{version}");
        }
        assert!(matches!(read(&now, old), Err(WireError::Malformed(_))), "trailing bytes in an older form");
        let whole = encode(&ClientMessage::Run(reaching.clone()), Encoding::Bincode).unwrap();
        assert_eq!(read(&whole, REACH_VERSION).unwrap(), Some(ClientMessage::Run(reaching.clone())));
        // Not in an older form: an older broker would not know them.
        let older = encode_in(&ClientMessage::Run(reaching.clone()), Encoding::Bincode, old).unwrap();
        assert_eq!(older, earlier);
        assert!(reaching.reaches() && !plain.reaches());
        // JSON names them: read on a connection of any version.
        #[cfg(feature = "json")]
        {
            let json = encode(&ClientMessage::Run(reaching.clone()), Encoding::Json).unwrap();
            let text = String::from_utf8_lossy(&json);
            assert!(text.contains(r#""allow_ports":[3000],"allow_addresses":["127.0.0.1"]"#), "{text}");
            let mut d = Decoder::new(Some(Encoding::Json));
            d.set_version(old);
            d.push(&json);
            assert_eq!(d.next_message::<ClientMessage>().unwrap(), Some(ClientMessage::Run(reaching)));
        }
    }
}
