//! macOS: a decided run as a Seatbelt profile (SBPL), for `sandbox-exec -f`.
//!
//! The plan is Tier B's (see [`crate::HostCapabilities::seatbelt`]): the
//! host's own root, with the Landlock lists saying what the command may
//! read, write and execute. The profile denies everything by default and
//! allows exactly those lists, the network the decision gave, and a small
//! base every program needs to start (see [`BASE`]). Text only: the broker
//! writes it to a private file, runs the command under it and removes it.

use crate::decision::Resolved;
use crate::host_executed::HOST_EXECUTED;
use palisade_protocol::Tier;
use palisade_protocol::attest::Network;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

/// What a profile starts from, whatever the plan: `(deny default)` and what
/// `sh`, `echo`, `ls` and `git` are meant to need to start and run (see
/// docs/macos.md for how it was chosen). Each allowance says what needs it;
/// none reaches a file, the network or another process.
pub const BASE: &str = r#"(version 1)
(deny default)

; Not every operation falls under (deny default) on every macOS release:
; other processes' details (open files, working directory, sockets), the
; hardware's properties (its serial number), the firmware's variables and
; code mapped executable are denied by name, then allowed below only where
; the run needs them (its own processes; the directories it may execute).
(deny process-info* iokit-get-properties nvram* file-map-executable)

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
    #[error(
        "the host-executed glob {0:?} ([policy] host_executed) has no Seatbelt rule: \
         write it with names, `*`, `?` and `**` only"
    )]
    HostExecuted(String),
    /// What sandbox-exec would refuse to read (palisade's own fault).
    #[error("the profile written does not read as one (sbpl): {0}")]
    Malformed(String),
}

/// The profile for `resolved`'s run; `host_executed`: the configured
/// globs (`[policy] host_executed`) that the run may not write, beside the
/// built-in ones ([`HOST_EXECUTED`]).
pub fn profile(resolved: &Resolved, host_executed: &[String]) -> Result<String, SeatbeltError> {
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
    files(resolved, host_executed, &mut out)?;
    network(&resolved.network, &mut out)?;
    sbpl::check(&out).map_err(SeatbeltError::Malformed)?;
    Ok(out)
}

/// The plan's Landlock lists as file rules, and the lookups of the
/// directories above them. macOS has no `/proc` (a rule for it is left
/// out), and `/etc`'s entries are read, never executed.
fn files(resolved: &Resolved, host_executed: &[String], out: &mut String) -> Result<(), SeatbeltError> {
    let l = &resolved.plan.landlock;
    if !l.list.is_empty() {
        // Listing a directory without reading its files has no rule here.
        return Err(SeatbeltError::ListOnly(l.list.clone()));
    }
    let on_a_mac = |p: &&String| *p != "/proc" && !p.starts_with("/proc/");
    let (devices, write): (Vec<&String>, Vec<&String>) = l.write.iter().partition(|p| p.starts_with("/dev/"));
    let read: Vec<&String> = l.read.iter().filter(on_a_mac).collect();
    rule(
        out,
        "Read: the system directories, /etc's entries and the read-only grants.",
        "file-read*",
        "subpath",
        &read,
    )?;
    rule(out, "Read: the writable grants and the run's own directories.", "file-read*", "subpath", &write)?;
    let roots: Vec<String> = resolved.writable.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    writes(&write, &roots.iter().collect::<Vec<_>>(), host_executed, out)?;
    let what = "Devices: read, write and control, never create or remove.";
    rule(out, what, "file-read* file-write-data file-ioctl", "literal", &devices)?;
    let etc = |p: &&String| !(p.starts_with("/private/etc/") || p.starts_with("/etc/"));
    let exec: Vec<&String> = l.execute.iter().filter(on_a_mac).filter(etc).collect();
    let what = "Programs and libraries: executed and mapped from these directories only.";
    rule(out, what, "process-exec file-map-executable", "subpath", &exec)?;
    let above = ancestors(read.iter().copied().chain(l.write.iter()).chain(exec.iter().copied()));
    let above: Vec<&String> = above.iter().collect();
    let what = "The directories above them: looked up (stat, realpath), not listed.";
    rule(out, what, "file-read-metadata", "literal", &above)
}

/// Writes: under the writable grants and the run's own directories, except
/// the files the host runs later outside any sandbox ([`held_writes`]).
fn writes(
    write: &[&String],
    roots: &[&String],
    host_executed: &[String],
    out: &mut String,
) -> Result<(), SeatbeltError> {
    if write.is_empty() {
        return Ok(());
    }
    let held = held_writes(roots, host_executed)?;
    out.push_str(
        "\n; Write: the writable grants and the run's own directories, but never a file\n\
         ; the host runs later outside any sandbox (git's hooks and configuration,\n\
         ; direnv, editors' tasks, shells' start-up files, agents' settings): on\n\
         ; macOS those writes are refused, in any case of their names.\n\
         (allow file-write*\n  (require-all\n    (require-any",
    );
    let unique: BTreeSet<&String> = write.iter().copied().collect();
    for p in unique {
        let _ = write!(out, "\n      (subpath {})", quoted(p)?);
    }
    out.push_str(")\n    (require-not\n      (require-any");
    for r in held {
        let _ = write!(out, "\n        (regex #\"{r}\")");
    }
    out.push_str("))))\n");
    Ok(())
}

/// git's hooks and configuration, in any repository and submodule (and a
/// worktree's own configuration), as a regular expression of the path:
/// also `.git` itself (made, replaced or renamed, as a directory, a file
/// pointing elsewhere or a link), `modules` and `worktrees` and their
/// entries, and the files that point git elsewhere (`commondir`,
/// `gitdir`), so that none can be written under another name and moved in.
const GIT_HELD: &str = "/[.]git(/((modules|worktrees)/[^/]+/)*((modules|worktrees)(/[^/]+)?|hooks(/.*)?|config([.]worktree)?|commondir|gitdir))?$";

/// The regular expressions of the paths a run may not write: git's
/// ([`GIT_HELD`]) and those of [`HOST_EXECUTED`] and `extra`, each letter
/// in either case (APFS usually ignores case). A glob of `**/NAME` holds at
/// any depth, any other under each of `roots` (the writable grants).
pub fn held_writes(roots: &[&String], extra: &[String]) -> Result<Vec<String>, SeatbeltError> {
    let (mut anywhere, mut rooted, mut parents) = (Vec::new(), Vec::new(), BTreeSet::new());
    for glob in HOST_EXECUTED.iter().copied().chain(extra.iter().map(String::as_str)) {
        match glob.strip_prefix("**/") {
            Some(rest) => anywhere.push(glob_regex(glob, rest)?),
            None => {
                rooted.push(glob_regex(glob, glob)?);
                // `.config/git/**`: `.config` itself too, or it could be
                // renamed away, written under its new name, and moved back.
                let parts: Vec<&str> = glob.strip_suffix("/**").unwrap_or(glob).split('/').collect();
                for end in 1..parts.len() {
                    parents.insert(glob_regex(glob, &parts[..end].join("/"))?);
                }
            }
        }
    }
    let parents: Vec<String> = parents.into_iter().collect();
    let mut held = vec![any_case(GIT_HELD)];
    if !anywhere.is_empty() {
        held.push(format!("/({})(/|$)", anywhere.join("|")));
    }
    for root in roots.iter().filter(|_| !rooted.is_empty()) {
        let Some(root) = root.chars().map(literal).collect::<Option<String>>() else {
            return Err(SeatbeltError::Path(root.to_string()));
        };
        held.push(format!("^{root}/({})(/|$)", rooted.join("|")));
        if !parents.is_empty() {
            held.push(format!("^{root}/({})$", parents.join("|")));
        }
    }
    Ok(held)
}

/// The regular expression of `rest` (what is left of `glob` past a leading
/// `**/`), a trailing `/**` left out, each letter in either case.
fn glob_regex(glob: &str, rest: &str) -> Result<String, SeatbeltError> {
    let unwritable = || SeatbeltError::HostExecuted(glob.to_string());
    let rest = rest.strip_suffix("/**").unwrap_or(rest);
    let mut body = String::new();
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            // `a/**/b`: any directories between.
            '*' if chars.next_if_eq(&'*').is_some() => match chars.next_if_eq(&'/') {
                Some(_) => body.push_str("(.*/)?"),
                None => return Err(unwritable()),
            },
            '*' => body.push_str("[^/]*"),
            '?' => body.push_str("[^/]"),
            c => body.push_str(&literal(c).ok_or_else(unwritable)?),
        }
    }
    Ok(any_case(&body))
}

/// `c` matched literally in a regular expression without a backslash
/// (which an SBPL string would have to escape): `None` for what a glob or
/// a bracket cannot say that way (`[`, `]`, `{`, `}`, `^`, `\`, a quote).
fn literal(c: char) -> Option<String> {
    match c {
        // A character past ASCII is no operator, and a bracket may hold one byte of it only.
        c if !c.is_ascii() && !c.is_control() => Some(c.to_string()),
        c if c.is_alphanumeric() || matches!(c, '/' | '-' | '_' | ' ' | ',' | '=' | '@' | '%' | ':') => {
            Some(c.to_string())
        }
        '[' | ']' | '{' | '}' | '^' | '\\' | '"' => None,
        c if c.is_control() => None,
        c => Some(format!("[{c}]")),
    }
}

/// `regex` with every ASCII letter outside a bracket matched in either case.
fn any_case(regex: &str) -> String {
    let mut out = String::new();
    let mut in_bracket = false;
    for c in regex.chars() {
        match c {
            '[' => in_bracket = true,
            ']' => in_bracket = false,
            c if c.is_ascii_alphabetic() && !in_bracket => {
                out.push('[');
                out.push(c.to_ascii_lowercase());
                out.push(c.to_ascii_uppercase());
                out.push(']');
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    out
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
        match SUBPATHS_LEFT_OUT.iter().find(|(within, _)| filter == "subpath" && p == within) {
            Some((_, left_out)) => {
                let _ = write!(
                    out,
                    "\n  (require-all ({filter} {}) (require-not (subpath {})))",
                    quoted(p)?,
                    quoted(left_out)?
                );
            }
            None => {
                let _ = write!(out, "\n  ({filter} {})", quoted(p)?);
            }
        }
    }
    out.push_str(")\n");
    Ok(())
}

/// What a system directory's rule leaves out: `/System/Volumes` mounts
/// the other volumes, the data volume (every user's home) among them. What
/// the system needs there (the cryptex of the dyld shared cache) is a
/// system directory of its own (see the broker's Mac layout).
const SUBPATHS_LEFT_OUT: &[(&str, &str)] = &[("/System", "/System/Volumes")];

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
pub fn quoted(path: &str) -> Result<String, SeatbeltError> {
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

/// The host's network: IP sockets, and the system's resolver (a Unix
/// socket); no other kind of socket (kernel control, routing, ...).
const HOST_NETWORK: &str = r#"(allow system-socket (socket-domain AF_INET) (socket-domain AF_INET6) (socket-domain AF_UNIX))
(allow network-outbound
  (remote ip "*:*")
  (remote unix-socket (path-literal "/private/var/run/mDNSResponder")))
(allow network-inbound (local ip "*:*"))
(allow network-bind (local ip "*:*"))
"#;

pub mod sbpl;
#[cfg(test)]
mod tests;
