//! The request's own asks (`allow_interpreters`, `read_only`,
//! `max_memory_mb`, `pass_env`, ...): each narrows the profile it is made
//! of, or is refused naming the field and the configuration key an
//! operator would change to allow it. A request never widens its policy.

use super::{Denial, Grants, Profile, RequestDirs};
use crate::capabilities::EnvironmentCapability;
use crate::config::DefaultProfile;
use crate::host::Host;
use crate::paths;
use palisade_protocol::wire::{ErrorKind, RunRequest};
use std::path::PathBuf;

/// Rule of a refused ask.
pub const WIDENS_RULE: &str = "request.widens";

/// Variables `environment = "restricted"` passes without being asked.
pub const RESTRICTED_ENV: [&str; 5] = ["PATH", "HOME", "USER", "LANG", "TERM"];

/// The profile `d` (of `[table]`) as its owner's request widens it, as
/// `palisade run`'s flags widen an embedded broker's (`[broker]
/// owner_widens`): interpreters, inline code, domains, paths, variables,
/// memory and processes as asked; the deadline and the output quota up to
/// the profile's ceilings, past which the request is refused naming the
/// ceiling; how writes land. The narrowing that follows then finds each
/// ask within the profile.
pub(super) fn widen(d: &DefaultProfile, table: &str, req: &RunRequest) -> Result<DefaultProfile, Denial> {
    use crate::capabilities::NetworkCapability;
    let mut w = d.clone();
    w.allow_interpreters |= req.allow_interpreters;
    w.allow_inline_code |= req.allow_inline_code;
    if let Some(asked) = req.allow_domains.as_ref().filter(|a| !a.is_empty()) {
        if let NetworkCapability::AllowDomains(domains) = &mut w.network {
            domains.extend(asked.iter().filter(|a| !domains.contains(a)).cloned().collect::<Vec<_>>());
        } else if w.network != NetworkCapability::AllowAll {
            w.network = NetworkCapability::AllowDomains(asked.clone());
        }
        w.egress = crate::egress::EgressMode::Strict;
    }
    let cwd = req.cwd.as_deref().map(PathBuf::from).unwrap_or_default();
    let home = req.env.get("HOME").map(PathBuf::from);
    let resolve = |p: &String| paths::resolve(p, &cwd, home.as_deref());
    w.read_only.extend(req.read_only.iter().map(resolve));
    w.read_write.extend(req.read_write.iter().map(resolve));
    w.pass_env.extend(req.pass_env.iter().filter(|n| !d.pass_env.contains(n)).cloned());
    w.max_memory_mb = req.max_memory_mb.unwrap_or(w.max_memory_mb);
    w.max_processes = req.max_processes.unwrap_or(w.max_processes);
    for (field, asked, value, ceiling, key) in [
        (
            "timeout_secs",
            req.timeout_secs,
            &mut w.max_execution_time,
            d.timeout_ceiling_secs,
            "timeout_ceiling_secs",
        ),
        (
            "max_output_bytes",
            req.max_output_bytes,
            &mut w.max_output_bytes,
            d.max_output_ceiling_bytes,
            "max_output_ceiling_bytes",
        ),
    ] {
        match asked {
            Some(a) if a > ceiling => {
                let reason = format!(
                    "{field} {a} is above the profile's ceiling of {ceiling} ([{table}] {key}); raise it there"
                );
                return Err(Denial::new(ErrorKind::CapabilityDenied, WIDENS_RULE, reason));
            }
            Some(a) if a > *value => *value = a,
            _ => {}
        }
    }
    if req.keep_changes.is_some() {
        w.keep_changes = req.keep_changes.unwrap_or(w.keep_changes);
    }
    w.on_conflict = req.on_conflict.unwrap_or(w.on_conflict);
    w.allow_direct |= req.direct;
    Ok(w)
}

/// The asks that change the profile itself: interpreters, inline code,
/// the process limits, the environment.
pub(super) fn narrow(profile: &mut Profile, req: &RunRequest) -> Result<(), Denial> {
    if req.allow_interpreters && !profile.allow_interpreters {
        return Err(widens(
            profile,
            "allow_interpreters",
            "interpreters are refused",
            "allow_interpreters = true",
        ));
    }
    if req.allow_inline_code && !profile.allow_inline_code {
        return Err(widens(
            profile,
            "allow_inline_code",
            "inline code is refused",
            "allow_inline_code = true",
        ));
    }
    if let Some(umask) = req.umask.filter(|m| *m > palisade_protocol::wire::MAX_UMASK) {
        let reason = format!("umask {umask:#o} is not a umask: at most 0o777 (permission bits only)");
        return Err(Denial::new(ErrorKind::InvalidRequest, "request.umask", reason));
    }
    let current = profile.capabilities.process;
    for (field, asked, limit) in [
        ("max_memory_mb", req.max_memory_mb, current.max_memory_mb),
        ("max_processes", req.max_processes, current.max_processes),
        ("timeout_secs", req.timeout_secs, current.max_execution_time),
        ("max_output_bytes", req.max_output_bytes, profile.max_output_bytes),
    ] {
        match asked {
            Some(0) => {
                let reason = format!("{field} must be at least 1");
                return Err(Denial::new(ErrorKind::InvalidRequest, "request.limit", reason));
            }
            Some(a) if a > limit => {
                let why = format!("{a} is above the policy's {limit}");
                let key = if field == "timeout_secs" { "max_execution_time" } else { field };
                return Err(widens(profile, field, &why, &format!("{key} = {a}")));
            }
            _ => {}
        }
    }
    if req.direct && profile.disk != crate::config::DiskMode::Direct {
        if !profile.allow_direct {
            let why = "the workspace is an overlay whose writes are applied as a change set";
            return Err(widens(profile, "direct", why, "allow_direct = true"));
        }
        profile.disk = crate::config::DiskMode::Direct;
    }
    narrow_changes(profile, req)?;
    let process = &mut profile.capabilities.process;
    process.max_memory_mb = req.max_memory_mb.unwrap_or(process.max_memory_mb);
    process.max_processes = req.max_processes.unwrap_or(process.max_processes);
    process.no_fork |= req.no_fork;
    profile.toolchains &= !req.no_toolchains;
    for name in &req.pass_env {
        let passes = match profile.capabilities.environment {
            EnvironmentCapability::Full => true,
            EnvironmentCapability::None => false,
            EnvironmentCapability::Restricted => {
                RESTRICTED_ENV.contains(&name.as_str()) || profile.pass_env.contains(name)
            }
        };
        if !passes {
            let why = format!("{name} is not passed to the command");
            return Err(widens(profile, "pass_env", &why, &format!("pass_env = [\"{name}\"]")));
        }
        if !req.env.contains_key(name) {
            let reason = format!("pass_env names {name}, which env does not hold");
            return Err(Denial::new(ErrorKind::InvalidRequest, "request.pass_env", reason));
        }
    }
    Ok(())
}

/// What becomes of the run's writes, as the request asks: only ever what
/// touches the host less than the profile's (holding rather than applying;
/// keeping the host's version rather than overwriting it).
fn narrow_changes(profile: &mut Profile, req: &RunRequest) -> Result<(), Denial> {
    use palisade_protocol::wire::{KeepChanges, OnConflict};
    if let Some(keep) = req.keep_changes {
        if profile.keep_changes == KeepChanges::AlwaysHold && keep != KeepChanges::AlwaysHold {
            let why = "the profile holds every run's writes for review";
            return Err(widens(profile, "keep_changes", why, "keep_changes = \"apply_unless_ended\""));
        }
        profile.keep_changes = keep;
    }
    if let Some(asked) = req.on_conflict {
        let rank = |c: OnConflict| match c {
            OnConflict::Hold => 2,
            OnConflict::KeepHost => 1,
            OnConflict::Overwrite => 0,
        };
        if rank(asked) < rank(profile.on_conflict) {
            let why = "the run's version would replace a change someone else made meanwhile";
            return Err(widens(profile, "on_conflict", why, "on_conflict = \"overwrite\""));
        }
        profile.on_conflict = asked;
    }
    Ok(())
}

/// The paths the request says the command reads or writes: each lies
/// inside what the sandbox is granted (writable, for `read_write`) or,
/// read-only, in the system's directories.
pub(super) fn check_paths(
    profile: &Profile,
    req: &RunRequest,
    dirs: &RequestDirs,
    grants: &Grants,
    host: &Host,
) -> Result<(), Denial> {
    let writable: Vec<&PathBuf> = grants.read_write.iter().chain(&grants.temp_workspace).collect();
    let readable: Vec<&PathBuf> =
        writable.iter().copied().chain(&grants.read_only).chain(&host.layout.canonical).collect();
    for (field, asked, roots) in
        [("read_only", &req.read_only, &readable), ("read_write", &req.read_write, &writable)]
    {
        for path in asked {
            let resolved = paths::resolve(path, &dirs.cwd, dirs.home.as_deref());
            let Ok(canonical) = resolved.canonicalize() else {
                let reason = format!("{field} {path}: {} does not exist", resolved.display());
                return Err(Denial::new(ErrorKind::InvalidRequest, "request.path", reason));
            };
            if !roots.iter().any(|r| canonical.starts_with(r)) {
                let why = format!("{} is not granted", canonical.display());
                return Err(widens(
                    profile,
                    field,
                    &why,
                    &format!("{field} = [\"{}\"]", canonical.display()),
                ));
            }
        }
    }
    Ok(())
}

/// The refusal of an ask: the request field, the CLI flag that sets it,
/// why it widens the policy, and the key an operator would change.
fn widens(profile: &Profile, field: &str, why: &str, setting: &str) -> Denial {
    let flag = match field {
        "pass_env" => "--env".to_string(),
        "max_memory_mb" => "--memory".to_string(),
        "max_processes" => "--processes".to_string(),
        "timeout_secs" => "--timeout".to_string(),
        "max_output_bytes" => "--max-output".to_string(),
        f => format!("--{}", f.replace('_', "-")),
    };
    let key = match &profile.tool {
        None => format!("[{}] {setting}", profile.table),
        Some(t) => match field {
            "max_memory_mb" | "max_processes" | "timeout_secs" => {
                format!("[tools.{t}.overrides] process = {{ {setting} }}")
            }
            "read_only" | "read_write" => format!("[tools.{t}.overrides] filesystem (a {field} grant)"),
            "pass_env" => format!("[tools.{t}.overrides] environment = \"full\""),
            "direct" | "keep_changes" | "on_conflict" => format!("[defaults] {setting}"),
            _ => format!("[tools.{t}] {setting}"),
        },
    };
    let reason = format!(
        "{field} ({flag}) would widen the policy: {why}; a request can only narrow it (an operator would set {key})"
    );
    Denial::new(ErrorKind::CapabilityDenied, WIDENS_RULE, reason)
}
