//! The broker's errors. Each has the stable kind a client sees
//! ([`ErrorKind`]); [`ErrorReply::from`] turns one into what goes on the
//! wire, with a failed helper step as fields of its own.

use palisade_protocol::HelperFailure;
use palisade_protocol::wire::{ErrorKind, ErrorReply, HelperFailureReply, ServerMessage};
use std::io;
use std::path::PathBuf;

/// What can go wrong while a connection is served and a run executed.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// An error already in the client's terms: a refusal of the policy, of
    /// the requester's access, of approval, with its kind and rule.
    #[error("{}", .0.message)]
    Reply(ErrorReply),
    /// A malformed, oversized or unexpected message, or a silent client.
    #[error("{0}")]
    Protocol(String),
    /// The peer may not use this broker.
    #[error("{0}")]
    Unauthorized(String),
    /// No run slot, no place in the queue, or no connection left.
    #[error("{0}")]
    Busy(String),
    /// A step of the helper failed; it exec'd nothing.
    #[error("sandbox setup failed: {0}")]
    Helper(HelperFailure),
    #[error("cannot create the run's cgroup: {0}")]
    CgroupCreate(#[source] CgroupError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("cannot start {}: {source}", .helper.display())]
    Spawn { helper: PathBuf, source: io::Error },
    #[error("cannot hand the helper its plan: {0}")]
    HandOver(#[source] io::Error),
    #[error("bad status from the helper: {0}")]
    Status(#[source] io::Error),
    #[error("the helper sent an overlay without its descriptor")]
    OverlayWithoutDescriptor,
    #[error("the helper sent an overlay for {0}, which the plan has not")]
    UnplannedOverlay(String),
    #[error("copying the run's writes back to {path}: {source}")]
    CopyBack { path: String, source: io::Error },
    #[error("the decision failed: {0}")]
    Decision(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Plan(#[from] palisade_protocol::PlanError),
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The audit journal cannot record an event: what needed it is refused
    /// (a run is never run unrecorded).
    #[error("{0}")]
    JournalUnavailable(String),
    /// The sandbox's supervisor died before it reported how the command
    /// ended (killed from outside, say): the helper's end, as `wait` saw it.
    #[error("the sandbox ended before reporting how its command did: its helper {0}")]
    SandboxLost(String),
    /// The broker failed (a panic, caught) while serving this request; the
    /// daemon's log has the details under the same run id.
    #[error("internal error while serving {0}: the broker's log has the details")]
    Internal(String),
    /// The tools' trust stages cannot be read or written: the run is refused.
    #[error("trust state {}: {source}", .path.display())]
    TrustState { path: PathBuf, source: io::Error },
}

impl BrokerError {
    /// The helper's failing step, when this is the helper's failure.
    pub fn helper_failure(&self) -> Option<&HelperFailure> {
        match self {
            BrokerError::Helper(f) => Some(f),
            _ => None,
        }
    }

    /// The kind the client branches on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            BrokerError::Reply(r) => r.kind,
            BrokerError::Protocol(_) => ErrorKind::ProtocolError,
            BrokerError::Unauthorized(_) => ErrorKind::Unauthorized,
            BrokerError::Busy(_) => ErrorKind::Busy,
            BrokerError::JournalUnavailable(_) => ErrorKind::JournalUnavailable,
            BrokerError::Helper(_)
            | BrokerError::CgroupCreate(_)
            | BrokerError::Cgroup(_)
            | BrokerError::Spawn { .. }
            | BrokerError::HandOver(_)
            | BrokerError::Status(_)
            | BrokerError::OverlayWithoutDescriptor
            | BrokerError::UnplannedOverlay(_)
            | BrokerError::CopyBack { .. }
            | BrokerError::Decision(_)
            | BrokerError::Plan(_)
            | BrokerError::Task(_)
            | BrokerError::TrustState { .. }
            | BrokerError::Internal(_)
            | BrokerError::SandboxLost(_)
            | BrokerError::Io(_) => ErrorKind::RuntimeFailure,
        }
    }
}

impl From<ErrorReply> for BrokerError {
    fn from(reply: ErrorReply) -> BrokerError {
        BrokerError::Reply(reply)
    }
}

impl From<BrokerError> for ErrorReply {
    fn from(e: BrokerError) -> ErrorReply {
        let helper = match e {
            BrokerError::Reply(reply) => return reply,
            BrokerError::Helper(ref f) => Some(Box::new(HelperFailureReply::from(f))),
            _ => None,
        };
        ErrorReply { helper, ..ErrorReply::new(e.kind(), e.to_string()) }
    }
}

impl From<BrokerError> for ServerMessage {
    fn from(e: BrokerError) -> ServerMessage {
        ServerMessage::Error(e.into())
    }
}

/// What can go wrong with the broker's cgroups: finding its subtree,
/// creating a run's cgroup and setting its limits, placing the helper.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup_root {} is not in a cgroup filesystem", .0.display())]
    NotCgroupFs(PathBuf),
    #[error("cgroup_root {} does not exist", .0.display())]
    Missing(PathBuf),
    #[error(
        "/sys/fs/cgroup is not a pure cgroup v2 mount (a v1 or hybrid host), and no cgroup_root is configured"
    )]
    NotPureV2,
    #[error("this process has no cgroup v2 path in /proc/self/cgroup")]
    NoOwnCgroup,
    #[error("{}: {source}", .path.display())]
    Stat { path: PathBuf, source: std::io::Error },
    #[error("{} is not delegated to uid {uid} (owned by {owner})", .dir.display())]
    NotDelegated { dir: PathBuf, uid: u32, owner: u32 },
    #[error(
        "{} carries no trusted.delegate mark: a root broker uses a cgroup only when systemd delegated it \
         (Delegate=yes) or the configuration names cgroup_root",
        .0.display()
    )]
    NoDelegateMark(PathBuf),
    #[error("{} lacks the {} controller(s) (available: {available})", .root.display(), .missing.join(", "))]
    MissingControllers { root: PathBuf, missing: Vec<&'static str>, available: String },
    #[error("mkdir {}: {source}", .path.display())]
    Mkdir { path: PathBuf, source: std::io::Error },
    #[error("write {value:?} to {}: {source}", .path.display())]
    Write { path: PathBuf, value: String, source: std::io::Error },
    /// Enabling the controllers failed: another process lives in the root.
    #[error("{source} (does another process live in {}?)", .root.display())]
    Enable { root: PathBuf, source: Box<CgroupError> },
    #[error("no cgroup v1 {0} hierarchy is mounted")]
    NoV1Hierarchy(&'static str),
    #[error("cgroup_root {} is not in the v1 memory hierarchy ({})", .root.display(), .memory.display())]
    NotInV1Memory { root: PathBuf, memory: PathBuf },
    /// The broker has no cgroups to create runs in (why, as discovery said).
    #[error("{0}")]
    Unavailable(String),
    #[error("no {0} controller")]
    NoController(&'static str),
    #[cfg(target_os = "linux")]
    #[error("set {what}: {source}")]
    Limit { what: &'static str, source: cgroups_rs::error::Error },
    #[cfg(target_os = "linux")]
    #[error("place pid {pid}: {source}")]
    Place { pid: u32, source: cgroups_rs::error::Error },
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_protocol::Stage;

    #[test]
    fn a_helper_failure_reaches_the_reply_as_fields_and_as_text() {
        let failure = HelperFailure {
            stage: Stage::Mounts,
            errno: libc::EPERM,
            errno_name: "EPERM".into(),
            message: "mount /usr read-only: EPERM".into(),
        };
        let reply = ErrorReply::from(BrokerError::Helper(failure));
        assert_eq!(reply.kind, ErrorKind::RuntimeFailure);
        assert_eq!(reply.message, "sandbox setup failed: (mount, EPERM) mount /usr read-only: EPERM");
        let helper = reply.helper.expect("the helper's fields");
        assert_eq!((helper.stage.as_str(), helper.errno), ("mount", libc::EPERM));
        assert_eq!(helper.message, "mount /usr read-only: EPERM");
    }

    #[test]
    fn a_reply_passes_through_unchanged_and_the_others_take_their_kind() {
        let denied =
            ErrorReply::with_rule(ErrorKind::WorkspaceScopeDenied, "/etc is outside", "scope.outside_roots");
        assert_eq!(ErrorReply::from(BrokerError::from(denied.clone())), denied);
        for (e, kind) in [
            (BrokerError::Busy("full".into()), ErrorKind::Busy),
            (BrokerError::Protocol("bad".into()), ErrorKind::ProtocolError),
            (BrokerError::Unauthorized("no".into()), ErrorKind::Unauthorized),
            (BrokerError::Cgroup(CgroupError::NoController("pids")), ErrorKind::RuntimeFailure),
            (BrokerError::Io(io::Error::other("gone")), ErrorKind::RuntimeFailure),
        ] {
            let text = e.to_string();
            let reply = ErrorReply::from(e);
            assert_eq!((reply.kind, reply.message, reply.rule, reply.helper), (kind, text, None, None));
        }
    }
}
