//! Records the helper writes on its status channel (fd 4).
//!
//! The channel is close-on-exec: a command that execs successfully closes it
//! with nothing written by the step that execs. Records are a u32 big-endian
//! length followed by a bincode 2 body, each written with a single `write`.

use crate::plan::LandlockFeatures;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Largest record body accepted.
pub const STATUS_RECORD_MAX_BYTES: usize = 64 * 1024;

/// The step of the helper's order of operations that failed.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    NoNewPrivs,
    Plan,
    Fds,
    Lifeline,
    Cgroup,
    Namespaces,
    IdMap,
    Fork,
    Mounts,
    Hostname,
    Loopback,
    Rlimits,
    Ids,
    Capabilities,
    Landlock,
    Env,
    Cwd,
    Session,
    Seccomp,
    Exec,
    Monitor,
    /// A helper started by root becoming the sandbox's host ids. Last, so
    /// that the earlier stages keep their numbers in the status records.
    HostIds,
    /// Opening the strict egress listeners inside the network namespace.
    Listeners,
    /// Opening the run's terminal and making it the command's.
    Terminal,
    /// Joining a held session's namespaces (see [`crate::plan::SessionRole`]).
    Join,
    /// Tier C's outer helper, once it has sent [`HelperRecord::Reaped`]:
    /// nothing fails there; it names the place for the test hook.
    Reaped,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::NoNewPrivs => "no_new_privs",
            Stage::Plan => "plan",
            Stage::Fds => "fds",
            Stage::Lifeline => "lifeline",
            Stage::Cgroup => "cgroup",
            Stage::HostIds => "host_ids",
            Stage::Namespaces => "namespaces",
            Stage::IdMap => "idmap",
            Stage::Fork => "fork",
            Stage::Mounts => "mount",
            Stage::Hostname => "hostname",
            Stage::Loopback => "loopback",
            Stage::Rlimits => "rlimits",
            Stage::Ids => "ids",
            Stage::Capabilities => "capabilities",
            Stage::Landlock => "landlock",
            Stage::Env => "env",
            Stage::Cwd => "cwd",
            Stage::Session => "session",
            Stage::Seccomp => "seccomp",
            Stage::Exec => "exec",
            Stage::Monitor => "monitor",
            Stage::Listeners => "listeners",
            Stage::Terminal => "terminal",
            Stage::Join => "join",
            Stage::Reaped => "reaped",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A step failed; the helper did not exec.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct HelperFailure {
    pub stage: Stage,
    /// The kernel's errno, or 0 when the failure is not a system call's.
    pub errno: i32,
    /// Its symbolic name (`EPERM`), or `-` for 0.
    pub errno_name: String,
    /// What was attempted and how it failed, e.g. `mount /usr read-only: EPERM`.
    pub message: String,
}

impl fmt::Display for HelperFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {}) {}", self.stage, self.errno_name, self.message)
    }
}

/// How far the kernel enforced the Landlock ruleset (`full`, `partial`,
/// `not_enforced` in an attestation).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RulesetState {
    Full,
    Partial,
    NotEnforced,
}

/// What Landlock actually enforced for this sandbox.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct LandlockReport {
    /// The ABI used (the kernel's, capped at what the helper knows).
    pub abi: u32,
    /// The features the plan wanted and the kernel enforced.
    pub enforced: LandlockFeatures,
    pub ruleset: RulesetState,
}

/// How the command ended, as seen by the process that waited for it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReport {
    Code(i32),
    Signal(i32),
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum HelperRecord {
    Landlock(LandlockReport),
    Failed(HelperFailure),
    Exit(ExitReport),
    /// The upper layer of the overlay on `target` travels with this record,
    /// as a directory descriptor (SCM_RIGHTS).
    Overlay {
        target: String,
    },
    /// The plan's listeners, opened in the sandbox's network namespace, in
    /// the plan's order; their descriptors travel with this record.
    Listeners(Vec<crate::plan::Listener>),
    /// Before `Exit`: the largest resident set of a process of the
    /// command's tree (`RUSAGE_CHILDREN` of the process that waited for
    /// them), in KiB: the command's own peak, not the broker's.
    Peak {
        max_rss_kib: u64,
    },
    /// The master of the run's terminal (the plan's `terminal`) travels
    /// with this record, sent just before exec.
    Terminal,
    /// A session's namespaces (the plan's, in the order of
    /// [`crate::plan::Namespaces::names`]) travel with this record, sent by
    /// the process that holds the session (see [`crate::plan::SessionRole`]).
    Session,
    /// Tier C's outer helper has reaped pid 1, and so every process of the
    /// sandbox (the kernel kills and reaps the rest of a pid namespace
    /// before its pid 1 is reaped): the last record. `exit` is pid 1's
    /// status; the CPU times (µs) are the helper's own and those of every
    /// process it reaped, as `wait4` on the helper would give them. The
    /// helper's exit, which tears the sandbox's namespaces and mounts down,
    /// follows.
    Reaped {
        exit: ExitReport,
        user_us: u64,
        system_us: u64,
    },
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<STATUS_RECORD_MAX_BYTES>()
}

/// Encodes one record with its length prefix.
pub fn encode_record(record: &HelperRecord) -> Vec<u8> {
    let body = bincode::serde::encode_to_vec(record, config()).unwrap_or_default();
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Decodes every record in a status stream. A malformed stream is an error:
/// the helper that wrote it is not behaving.
pub fn decode_records(mut bytes: &[u8]) -> Result<Vec<HelperRecord>, String> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (len, rest) = bytes.split_first_chunk::<4>().ok_or("truncated status record length")?;
        let len = u32::from_be_bytes(*len) as usize;
        if len > STATUS_RECORD_MAX_BYTES || rest.len() < len {
            return Err(format!("bad status record length {len}"));
        }
        let (body, rest) = rest.split_at(len);
        let (record, used) = bincode::serde::decode_from_slice(body, config()).map_err(|e| e.to_string())?;
        if used != len {
            return Err("trailing bytes in status record".into());
        }
        out.push(record);
        bytes = rest;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_in_a_stream() {
        let records = vec![
            HelperRecord::Landlock(LandlockReport {
                abi: 7,
                enforced: LandlockFeatures::ALL,
                ruleset: RulesetState::Full,
            }),
            HelperRecord::Failed(HelperFailure {
                stage: Stage::Exec,
                errno: 2,
                errno_name: "ENOENT".into(),
                message: "exec /nope: ENOENT".into(),
            }),
            HelperRecord::Exit(ExitReport::Signal(9)),
        ];
        let bytes: Vec<u8> = records.iter().flat_map(encode_record).collect();
        assert_eq!(decode_records(&bytes).unwrap(), records);
        assert!(decode_records(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn failure_display_names_stage_and_errno() {
        let f = HelperFailure {
            stage: Stage::Mounts,
            errno: 1,
            errno_name: "EPERM".into(),
            message: "mount /usr read-only: EPERM".into(),
        };
        assert_eq!(f.to_string(), "(mount, EPERM) mount /usr read-only: EPERM");
    }
}
