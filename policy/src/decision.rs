//! From a request to a decision: refuse (with a stable kind and a reason that
//! names the path, limit or rule), ask for approval, or allow with a fully
//! resolved plan.

use crate::config::Config;
use crate::jail::{JailSpec, Limits, build_plan};
use palisade_protocol::wire::{ErrorKind, RunRequest};
use palisade_protocol::{HostIds, JailPlan, LandlockFeatures, Tier};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// PATH inside the sandbox, also used to resolve a bare command name.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What the host can enforce, probed by the broker at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostCapabilities {
    pub user_namespaces: bool,
    pub landlock_abi: u32,
}

/// Who asks, and on whose behalf the broker runs.
#[derive(Debug, Clone)]
pub struct Context {
    pub host: HostCapabilities,
    /// The broker's pid: the helper's lifeline.
    pub parent_pid: u32,
    /// The broker's own ids.
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub kind: ErrorKind,
    pub reason: String,
}

impl Denial {
    pub fn new(kind: ErrorKind, reason: impl Into<String>) -> Denial {
        Denial { kind, reason: reason.into() }
    }
}

/// An allowed run, ready for the helper.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub plan: JailPlan,
    /// Host directories the sandbox may write.
    pub writable: Vec<PathBuf>,
    pub timeout: Duration,
    pub max_output_bytes: u64,
    /// Human labels for the attestation.
    pub network: String,
    pub egress: String,
    pub disk: String,
}

#[derive(Debug, Clone)]
pub enum Decision {
    Deny(Denial),
    NeedsApproval { reason: String },
    Allow(Box<Resolved>),
}

pub fn decide(config: &Config, ctx: &Context, req: &RunRequest) -> Decision {
    match resolve(config, ctx, req) {
        Ok(r) => Decision::Allow(Box::new(r)),
        Err(d) => Decision::Deny(d),
    }
}

fn resolve(config: &Config, ctx: &Context, req: &RunRequest) -> Result<Resolved, Denial> {
    let profile = &config.defaults;
    if req.tool.is_some() {
        return Err(Denial::new(ErrorKind::PolicyDenied, "no tools are declared in the configuration"));
    }
    let Some(command) = req.argv.first() else {
        return Err(Denial::new(ErrorKind::InvalidRequest, "empty command"));
    };
    let cwd = match &req.cwd {
        Some(c) => absolute_dir(c, "cwd")?,
        None => return Err(Denial::new(ErrorKind::InvalidRequest, "the request names no cwd")),
    };
    let workspace = match &req.workspace {
        Some(w) => absolute_dir(&cwd.join(w).to_string_lossy(), "workspace")?,
        None => cwd.clone(),
    };
    if workspace == Path::new("/") {
        return Err(Denial::new(ErrorKind::WorkspaceScopeDenied, "the workspace cannot be /"));
    }
    let program = resolve_program(command, &cwd)?;
    if !ctx.host.user_namespaces {
        return Err(Denial::new(
            ErrorKind::Unavailable,
            "Tier C needs unprivileged user namespaces, which this host does not allow; the fallback policy is deny",
        ));
    }
    let sandbox_cwd = if cwd.starts_with(&workspace) { cwd.clone() } else { workspace.clone() };
    let mut read_only: Vec<PathBuf> = profile.read_only.iter().filter(|p| p.exists()).cloned().collect();
    if !visible(&program, &workspace, &read_only) {
        return Err(Denial::new(
            ErrorKind::PolicyDenied,
            format!("{} is outside the system directories and the workspace", program.display()),
        ));
    }
    read_only.sort();
    let env = restricted_env(req, &workspace);
    let writable = vec![workspace.clone()];
    let timeout = req.timeout_secs.map_or(profile.timeout_secs, |t| t.min(profile.timeout_secs));
    let max_output_bytes =
        req.max_output_bytes.map_or(profile.max_output_bytes, |m| m.min(profile.max_output_bytes));
    let root = ctx.uid == 0;
    let spec = JailSpec {
        tier: Tier::C,
        program: program.to_string_lossy().into_owned(),
        argv: req.argv.clone(),
        env,
        cwd: sandbox_cwd,
        read_write: writable.clone(),
        exec_dirs: {
            let mut dirs = read_only.clone();
            dirs.push(workspace);
            dirs
        },
        read_only,
        tmp_dir: None,
        host_network: false,
        limits: Limits {
            memory_bytes: profile.memory_mb << 20,
            cpu_seconds: timeout,
            processes: profile.max_processes,
            open_files: profile.max_open_files,
            file_size_bytes: profile.max_file_size_mb << 20,
            tmp_bytes: profile.tmp_size_mb << 20,
        },
        landlock_required: LandlockFeatures::EMPTY,
        hostname: "palisade".into(),
        uid: ctx.uid,
        gid: ctx.gid,
        host_ids: root.then_some(HostIds { uid: config.broker.sandbox_uid, gid: config.broker.sandbox_gid }),
        parent_pid: ctx.parent_pid,
        cgroup: None,
    };
    let plan = build_plan(&spec).map_err(|e| Denial::new(ErrorKind::RuntimeFailure, e.to_string()))?;
    Ok(Resolved {
        plan,
        writable,
        timeout: Duration::from_secs(timeout),
        max_output_bytes,
        network: "none (network namespace with loopback only)".into(),
        egress: "none".into(),
        disk: format!("tmpfs /tmp of {} MiB; workspace bound read-write", profile.tmp_size_mb),
    })
}

fn absolute_dir(path: &str, what: &str) -> Result<PathBuf, Denial> {
    if !path.starts_with('/') {
        return Err(Denial::new(ErrorKind::InvalidRequest, format!("{what} {path:?} is not absolute")));
    }
    let p = Path::new(path)
        .canonicalize()
        .map_err(|e| Denial::new(ErrorKind::InvalidRequest, format!("{what} {path}: {e}")))?;
    if !p.is_dir() {
        return Err(Denial::new(ErrorKind::InvalidRequest, format!("{what} {path} is not a directory")));
    }
    Ok(p)
}

fn is_executable(p: &Path) -> bool {
    p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A bare name is looked up in the sandbox's PATH; a path is taken relative
/// to the client's cwd. The result is canonical.
pub fn resolve_program(command: &str, cwd: &Path) -> Result<PathBuf, Denial> {
    let found = if command.contains('/') {
        Some(cwd.join(command))
    } else {
        SANDBOX_PATH.split(':').map(|d| Path::new(d).join(command)).find(|p| is_executable(p))
    };
    let not_found = || Denial::new(ErrorKind::InvalidRequest, format!("command not found: {command}"));
    let path = found.ok_or_else(not_found)?.canonicalize().map_err(|_| not_found())?;
    if !is_executable(&path) {
        return Err(Denial::new(
            ErrorKind::InvalidRequest,
            format!("{} is not an executable file", path.display()),
        ));
    }
    Ok(path)
}

fn visible(program: &Path, workspace: &Path, read_only: &[PathBuf]) -> bool {
    let system = crate::jail::SYSTEM_DIRS.iter().filter_map(|d| Path::new(d).canonicalize().ok());
    program.starts_with(workspace)
        || read_only.iter().any(|r| program.starts_with(r))
        || system.into_iter().any(|s| program.starts_with(s))
}

/// The restricted environment: PATH (the sandbox's), HOME (the workspace),
/// and USER, LANG and TERM from the request.
fn restricted_env(req: &RunRequest, workspace: &Path) -> Vec<(String, String)> {
    let mut env = vec![
        ("PATH".to_string(), SANDBOX_PATH.to_string()),
        ("HOME".to_string(), workspace.to_string_lossy().into_owned()),
    ];
    for key in ["USER", "LANG", "TERM"] {
        if let Some(v) = req.env.get(key) {
            env.push((key.to_string(), v.clone()));
        }
    }
    env
}
