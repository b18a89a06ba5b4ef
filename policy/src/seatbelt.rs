//! macOS: a decided run as a Seatbelt profile (SBPL), for `sandbox-exec -f`.
//!
//! The plan is Tier B's (see [`crate::HostCapabilities::seatbelt`]): the
//! host's own root, with the Landlock lists saying what the command may
//! read, write and execute. The profile denies everything by default and
//! allows exactly those lists, the network the decision gave, and a small
//! base every program needs to start (see [`BASE`]). Text only: the broker
//! writes it to a private file, runs the command under it and removes it.

use crate::decision::Resolved;
use palisade_protocol::attest::Network;
use palisade_protocol::{JailPlan, Tier};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

/// What a profile starts from, whatever the plan: `(deny default)` and what
/// `sh`, `echo`, `ls` and `git` are meant to need to start and run (see
/// docs/macos.md for how it was chosen). Each allowance says what needs it;
/// none reaches a file, the network or another process.
pub const BASE: &str = r#"(version 1)
(deny default)

; Processes: the command may signal and inspect only the processes of its
; own sandbox (and start others where the plan allows, below).
(allow signal (target same-sandbox))
(allow process-info* (target same-sandbox))

; Users and groups (getpwuid: sh's ~, ls -l, git's committer) are looked up
; through this service; libSystem asks it for any name lookup.
(allow mach-lookup (global-name "com.apple.system.opendirectoryd.libinfo"))

; What the machine is (libSystem, git and most runtimes size themselves by
; these); nothing about other processes.
(allow sysctl-read
  (sysctl-name "hw.activecpu")
  (sysctl-name "hw.byteorder")
  (sysctl-name "hw.cachelinesize")
  (sysctl-name "hw.cpufamily")
  (sysctl-name "hw.cputype")
  (sysctl-name "hw.logicalcpu")
  (sysctl-name "hw.logicalcpu_max")
  (sysctl-name "hw.machine")
  (sysctl-name "hw.memsize")
  (sysctl-name "hw.model")
  (sysctl-name "hw.ncpu")
  (sysctl-name "hw.pagesize")
  (sysctl-name "hw.physicalcpu")
  (sysctl-name "hw.physicalcpu_max")
  (sysctl-name-prefix "hw.optional.")
  (sysctl-name-prefix "hw.perflevel")
  (sysctl-name "kern.argmax")
  (sysctl-name "kern.hostname")
  (sysctl-name "kern.maxfilesperproc")
  (sysctl-name "kern.osproductversion")
  (sysctl-name "kern.osrelease")
  (sysctl-name "kern.ostype")
  (sysctl-name "kern.osversion")
  (sysctl-name "kern.usrstack64")
  (sysctl-name "kern.version")
  (sysctl-name "machdep.cpu.brand_string")
  (sysctl-name "sysctl.proc_cputype")
  (sysctl-name "vm.loadavg"))
"#;

/// Why a plan has no Seatbelt profile.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SeatbeltError {
    #[error("Seatbelt runs Tier B plans (the host's own root); this plan is Tier {0}")]
    Tier(Tier),
    #[error("Seatbelt cannot enforce this network: {0}")]
    Network(Network),
    #[error("a path of the plan cannot be written in a profile: {0:?}")]
    Path(String),
    #[error("Seatbelt has no rule for listing a directory without reading its files: {0:?}")]
    ListOnly(Vec<String>),
    /// What sandbox-exec would refuse to read (palisade's own fault).
    #[error("the profile written does not read as one (sbpl): {0}")]
    Malformed(String),
}

/// The profile for `resolved`'s run.
pub fn profile(resolved: &Resolved) -> Result<String, SeatbeltError> {
    let plan = &resolved.plan;
    if plan.tier() != Tier::B {
        return Err(SeatbeltError::Tier(plan.tier()));
    }
    let mut out = String::from(BASE);
    if !resolved.capabilities.process.no_fork {
        out.push_str(
            "\n; Processes: the command may start others; they inherit this profile.\n(allow process-fork)\n",
        );
    }
    files(plan, &mut out)?;
    network(&resolved.network, &mut out)?;
    sbpl::check(&out).map_err(SeatbeltError::Malformed)?;
    Ok(out)
}

/// The plan's Landlock lists as file rules, and the lookups of the
/// directories above them.
fn files(plan: &JailPlan, out: &mut String) -> Result<(), SeatbeltError> {
    let l = &plan.landlock;
    if !l.list.is_empty() {
        // Listing a directory without reading its files has no rule here.
        return Err(SeatbeltError::ListOnly(l.list.clone()));
    }
    let (devices, write): (Vec<&String>, Vec<&String>) = l.write.iter().partition(|p| p.starts_with("/dev/"));
    let read: Vec<&String> = l.read.iter().collect();
    rule(
        out,
        "Read: the system directories, /etc's entries and the read-only grants.",
        "file-read*",
        "subpath",
        &read,
    )?;
    rule(
        out,
        "Read and write: the writable grants and the run's own directories.",
        "file-read* file-write*",
        "subpath",
        &write,
    )?;
    let what = "Devices: read, write and control, never create or remove.";
    rule(out, what, "file-read* file-write-data file-ioctl", "literal", &devices)?;
    let exec: Vec<&String> = l.execute.iter().collect();
    let what = "Programs and libraries: executed and mapped from these directories only.";
    rule(out, what, "process-exec file-map-executable", "subpath", &exec)?;
    let above = ancestors(l.read.iter().chain(&l.write).chain(&l.execute));
    let above: Vec<&String> = above.iter().collect();
    let what = "The directories above them: looked up (stat, realpath), not listed.";
    rule(out, what, "file-read-metadata", "literal", &above)
}

/// `(allow OPERATIONS (FILTER "path") ...)`, after a comment; nothing for no paths.
fn rule(
    out: &mut String,
    what: &str,
    operations: &str,
    filter: &str,
    paths: &[&String],
) -> Result<(), SeatbeltError> {
    if paths.is_empty() {
        return Ok(());
    }
    let _ = write!(out, "\n; {what}\n(allow {operations}");
    let unique: BTreeSet<&String> = paths.iter().copied().collect();
    for p in unique {
        let _ = write!(out, "\n  ({filter} {})", quoted(p)?);
    }
    out.push_str(")\n");
    Ok(())
}

/// The proper ancestors of `paths`, `/` included, sorted.
fn ancestors<'a>(paths: impl Iterator<Item = &'a String>) -> BTreeSet<String> {
    let mut above = BTreeSet::new();
    for p in paths {
        for a in Path::new(p).ancestors().skip(1) {
            above.insert(a.to_string_lossy().into_owned());
        }
    }
    above
}

/// `path` as an SBPL string: absolute, without a quote, a backslash or a
/// control character (none of which a canonical path the policy accepted
/// needs; refused rather than escaped, so no path can end the string early).
fn quoted(path: &str) -> Result<String, SeatbeltError> {
    let bad = |c: char| c == '"' || c == '\\' || c.is_control();
    if !path.starts_with('/') || path.chars().any(bad) {
        return Err(SeatbeltError::Path(path.to_string()));
    }
    Ok(format!("\"{path}\""))
}

/// The network as the decision gave it: none, or the host's whole network
/// (`allow_all`). The host's is IP sockets and the system's resolver
/// (`getaddrinfo` asks mDNSResponder over this Unix socket), not any other
/// Unix socket. Allowed domains are refused (the decision refuses them
/// first): a profile can only open every address, which would not enforce them.
fn network(network: &Network, out: &mut String) -> Result<(), SeatbeltError> {
    let what = match network {
        Network::NoSockets => {
            out.push_str("\n; Network: none (no rule allows it).\n");
            return Ok(());
        }
        Network::Host => "the host's, every address (allow_all)",
        Network::HostDomains { .. } | Network::LoopbackOnly | Network::StrictDomains { .. } => {
            return Err(SeatbeltError::Network(network.clone()));
        }
    };
    let _ = write!(out, "\n; Network: {what}.\n{HOST_NETWORK}");
    Ok(())
}

/// The host's network: IP sockets, and the system's resolver.
const HOST_NETWORK: &str = r#"(allow system-socket)
(allow network-outbound
  (remote ip "*:*")
  (remote unix-socket (path-literal "/private/var/run/mDNSResponder")))
(allow network-inbound (local ip "*:*"))
(allow network-bind (local ip "*:*"))
"#;

pub mod sbpl;
#[cfg(test)]
mod tests;
