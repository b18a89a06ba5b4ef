//! The stable kinds of error a client branches on (never on messages).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Stable error kinds: clients branch on these, never on messages.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The policy refuses the request.
    PolicyDenied,
    /// A path argument leaves the allowed roots.
    WorkspaceScopeDenied,
    /// A capability the request needs is not granted, or a preset forbids it.
    CapabilityDenied,
    /// The host lacks a mechanism the policy requires (fail closed).
    Unavailable,
    /// The policy wants a human's approval first.
    NeedsApproval,
    /// Output exceeded `max_output_bytes`; the sandbox was killed.
    QuotaExceeded,
    /// The deadline passed; the sandbox was killed.
    TimedOut,
    /// The cgroup's memory limit was hit and the OOM killer fired.
    MemoryLimitExceeded,
    /// The run's writes filled their bound; none of them was kept.
    DiskLimitExceeded,
    /// Building or running the sandbox failed (a helper `(stage, errno)` among others).
    RuntimeFailure,
    /// The broker is at its concurrency limit and its queue is full.
    Busy,
    /// The peer's uid/gid is not allowed.
    Unauthorized,
    /// A malformed, oversized or unexpected frame.
    ProtocolError,
    /// A well-formed request that cannot be served as given.
    InvalidRequest,
    /// The audit journal cannot record an event, so what needed it is
    /// refused: a run is not run (or its result is withheld), a transition
    /// or an answer not made; the message gives the OS's reason (a full disk, ...).
    JournalUnavailable,
}

impl ErrorKind {
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::PolicyDenied => "PolicyDenied",
            ErrorKind::WorkspaceScopeDenied => "WorkspaceScopeDenied",
            ErrorKind::CapabilityDenied => "CapabilityDenied",
            ErrorKind::Unavailable => "Unavailable",
            ErrorKind::NeedsApproval => "NeedsApproval",
            ErrorKind::QuotaExceeded => "QuotaExceeded",
            ErrorKind::TimedOut => "TimedOut",
            ErrorKind::MemoryLimitExceeded => "MemoryLimitExceeded",
            ErrorKind::DiskLimitExceeded => "DiskLimitExceeded",
            ErrorKind::RuntimeFailure => "RuntimeFailure",
            ErrorKind::Busy => "Busy",
            ErrorKind::Unauthorized => "Unauthorized",
            ErrorKind::ProtocolError => "ProtocolError",
            ErrorKind::InvalidRequest => "InvalidRequest",
            ErrorKind::JournalUnavailable => "JournalUnavailable",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
