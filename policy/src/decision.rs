//! From a request to a decision: refuse (with a stable kind, a stable rule
//! and a reason that names the path, limit or rule), ask for approval, or
//! allow with a fully resolved plan.

use crate::capabilities::{
    Binding, BoundCapability, Capabilities, EnvironmentCapability, FsCapability, Mapping, NetworkCapability,
    ProcessCapability, Validation,
};
use crate::config::{Config, DiskMode, FallbackPolicy};
use crate::egress::{self, EgressMode};
use crate::jail::{ETC_ENTRIES, JailSpec, Limits, build_plan};
use crate::validate::{self, HOME_SENSITIVE_NAMES, Rules, SENSITIVE_NAMES};
use crate::{Preset, paths};
use palisade_protocol::attest::{Disk, Memory, Network, Scratch, TmpfsBudget, UpperLayers, WritableDirs};
use palisade_protocol::wire::{ErrorKind, ParamValue, RunRequest};
use palisade_protocol::{HostIds, JailPlan, LandlockFeatures, Tier};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// PATH inside the sandbox, also used to resolve a bare command name.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where a temporary workspace appears inside a Tier C sandbox (a tmpfs).
pub const TEMP_WORKSPACE: &str = "/workspace";

/// What the host can enforce, probed by the broker at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCapabilities {
    pub user_namespaces: bool,
    pub landlock_abi: u32,
    /// The cgroup subtree runs go in, or why there is none.
    pub cgroup: Result<CgroupRoot, String>,
}

/// Where run cgroups are created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupRoot {
    /// cgroup v2: the directory; v1: the path inside each hierarchy.
    pub path: PathBuf,
    pub v1: bool,
}

/// A run's cgroup, for the broker to create before spawning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupPlan {
    /// `run-N`, under the root.
    pub name: String,
    pub path: PathBuf,
    pub v1: bool,
    pub memory_bytes: u64,
    pub processes: u64,
    pub cpu_percent: u64,
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
    /// Who asks: the peer's uid and gid (the broker's own for the CLI's
    /// embedded broker). A broker running as root acts on its behalf: the
    /// sandbox gets its access and its own block of host ids.
    pub requester: HostIds,
    /// Where this run's host directories go (Tier B): `<temp_root>/run-<instance>-<run>`.
    pub temp_root: PathBuf,
    /// The broker's instance (`<pid>-<start time>`): runs' host directories
    /// and cgroups are named `run-<instance>-<run>`, apart from those of other
    /// brokers sharing the same root.
    pub instance: String,
    pub run: u64,
    /// A directory holding a copy of the curated /etc entries, bound at
    /// `/etc` in Tier C instead of each entry (see [`JailSpec::etc_view`]).
    pub etc_view: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub kind: ErrorKind,
    /// A stable name for the rule that refused (`scope.outside_roots`).
    pub rule: &'static str,
    pub reason: String,
}

impl Denial {
    pub fn new(kind: ErrorKind, rule: &'static str, reason: impl Into<String>) -> Denial {
        Denial { kind, rule, reason: reason.into() }
    }
}

/// An allowed run, ready for the helper.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub plan: JailPlan,
    /// Host directories the sandbox may write (the peer must own them).
    pub writable: Vec<PathBuf>,
    /// Host paths granted to the request, read or write: the requester must
    /// be able to read (and, for `writable` ones, write) each of them.
    pub granted: Vec<PathBuf>,
    /// Host directories the broker creates (mode 0700) before the run and removes after it.
    pub host_dirs: Vec<PathBuf>,
    pub timeout: Duration,
    pub max_output_bytes: u64,
    pub capture_chunk_bytes: usize,
    /// The run's cgroup, when the host has a subtree for runs.
    pub cgroup: Option<CgroupPlan>,
    /// The tool run, if any.
    pub tool: Option<String>,
    pub capabilities: Capabilities,
    /// What the attestation and `palisade explain` say was in force.
    pub network: Network,
    pub egress: EgressMode,
    pub disk: Disk,
    /// What bounded the run's memory, tmpfs mounts included.
    pub memory: Memory,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone)]
pub enum Decision {
    Deny(Denial),
    /// Allowed, once a person approves: the run it would be is resolved and
    /// checked like any other (the validation pipeline has passed).
    NeedsApproval {
        reason: String,
        resolved: Box<Resolved>,
    },
    Allow(Box<Resolved>),
}

/// A configuration with its rules compiled, ready to decide.
#[derive(Debug)]
pub struct Policy {
    pub config: Config,
    rules: Rules,
}

/// Everything that varies between the default profile and a tool.
struct Profile {
    tool: Option<String>,
    capabilities: Capabilities,
    egress: EgressMode,
    allowed_executables: Vec<PathBuf>,
    allow_interpreters: bool,
    allow_inline_code: bool,
    max_output_bytes: u64,
    max_open_files: u64,
    max_file_size_mb: u64,
    tmp_size_mb: u64,
    exec_in_writable: bool,
    require_cgroup: bool,
    bindings: BTreeMap<String, Binding>,
}

fn denied<T>(kind: ErrorKind, rule: &'static str, reason: impl Into<String>) -> Result<T, Denial> {
    Err(Denial::new(kind, rule, reason))
}

impl Policy {
    pub fn new(config: Config) -> Policy {
        let rules = Rules::new(&config.policy);
        Policy { config, rules }
    }

    pub fn decide(&self, ctx: &Context, req: &RunRequest) -> Decision {
        match self.resolve(ctx, req) {
            Ok((r, None)) => Decision::Allow(Box::new(r)),
            Ok((r, Some(reason))) => Decision::NeedsApproval { reason, resolved: Box::new(r) },
            Err(d) => Decision::Deny(d),
        }
    }

    fn profile(&self, req: &RunRequest) -> Result<Profile, Denial> {
        let resolve_all = |names: &[toml::Spanned<String>]| -> Vec<PathBuf> {
            names.iter().filter_map(|n| validate::resolve_executable(n.get_ref()).ok()).collect()
        };
        let Some(name) = &req.tool else {
            let d = &self.config.defaults;
            let mut filesystem = vec![FsCapability::ReadWrite { path: "${WORKSPACE}".into() }];
            filesystem.extend(
                d.read_only.iter().map(|p| FsCapability::ReadOnly { path: p.to_string_lossy().into() }),
            );
            return Ok(Profile {
                tool: None,
                capabilities: Capabilities {
                    filesystem,
                    network: d.network.clone(),
                    process: ProcessCapability {
                        no_fork: d.no_fork,
                        max_execution_time: d.max_execution_time,
                        max_memory_mb: d.max_memory_mb,
                        max_processes: d.max_processes,
                        max_cpu_percent: d.max_cpu_percent,
                    },
                    environment: d.environment,
                },
                egress: d.egress,
                allowed_executables: resolve_all(&d.allowed_executables),
                allow_interpreters: d.allow_interpreters,
                allow_inline_code: d.allow_inline_code,
                max_output_bytes: d.max_output_bytes,
                max_open_files: d.max_open_files,
                max_file_size_mb: d.max_file_size_mb,
                tmp_size_mb: d.tmp_size_mb,
                exec_in_writable: d.exec_in_workspace,
                require_cgroup: self.config.policy.require_cgroup,
                bindings: BTreeMap::new(),
            });
        };
        let Some(tool) = self.config.tools.get(name) else {
            let known: Vec<&str> = self.config.tools.keys().map(String::as_str).collect();
            return denied(
                ErrorKind::InvalidRequest,
                "tools.unknown",
                format!(
                    "no tool {name:?} is declared (declared: {})",
                    if known.is_empty() { "none".into() } else { known.join(", ") }
                ),
            );
        };
        let base = tool
            .preset
            .as_ref()
            .and_then(|p| Preset::named(p.get_ref()))
            .map_or_else(Capabilities::default, |p| p.capabilities);
        let d = &self.config.defaults;
        Ok(Profile {
            tool: Some(name.clone()),
            capabilities: tool.overrides.apply(&base),
            egress: tool.egress,
            allowed_executables: resolve_all(&tool.allowed_executables),
            allow_interpreters: tool.allow_interpreters,
            allow_inline_code: tool.allow_inline_code,
            max_output_bytes: tool.max_output_bytes,
            max_open_files: d.max_open_files,
            max_file_size_mb: d.max_file_size_mb,
            tmp_size_mb: d.tmp_size_mb,
            exec_in_writable: false,
            require_cgroup: self.config.policy.require_cgroup || tool.require_cgroup,
            bindings: tool.parameters.clone(),
        })
    }

    /// The run, with why it needs approval first (if it does), or a refusal.
    fn resolve(&self, ctx: &Context, req: &RunRequest) -> Result<(Resolved, Option<String>), Denial> {
        let policy = &self.config.policy;
        let mut profile = self.profile(req)?;
        let Some(cwd) = &req.cwd else {
            return denied(
                ErrorKind::InvalidRequest,
                "request.cwd",
                "the request names no cwd (an absolute directory)",
            );
        };
        let uid = ctx.requester.uid;
        let cwd = absolute_dir(cwd, "cwd", uid)?;
        let workspace = match &req.workspace {
            Some(w) => absolute_dir(&cwd.join(w).to_string_lossy(), "workspace", uid)?,
            None => cwd.clone(),
        };
        let home = req.env.get("HOME").map(PathBuf::from);
        let home = home.as_deref();

        // Parameters bound to filesystem capabilities become concrete paths.
        for (param, value) in &req.params {
            let Some(binding) = profile.bindings.get(param) else {
                return denied(
                    ErrorKind::PolicyDenied,
                    "tools.undeclared_parameter",
                    format!(
                        "parameter {param} is not declared by tool {}",
                        profile.tool.as_deref().unwrap_or("-")
                    ),
                );
            };
            for path in bound_paths(param, value, binding, &cwd, home, &self.rules, uid)? {
                let path = path.to_string_lossy().into_owned();
                profile.capabilities.filesystem.push(match binding.capability {
                    BoundCapability::ReadOnly => FsCapability::ReadOnly { path },
                    BoundCapability::ReadWrite => FsCapability::ReadWrite { path },
                });
            }
        }

        // The tier, or the fallback policy where Tier C is unavailable.
        let mut warnings = Vec::new();
        let mut approval = None;
        let tier = if ctx.host.user_namespaces {
            Tier::C
        } else {
            let why = "Tier C needs unprivileged user namespaces, which this host does not allow";
            match policy.fallback {
                FallbackPolicy::Deny => {
                    return denied(
                        ErrorKind::Unavailable,
                        "fallback.deny",
                        format!("{why}; the fallback policy is deny"),
                    );
                }
                FallbackPolicy::RequestApproval => {
                    // Decided after every check: only a run that would be allowed is put to a person.
                    approval =
                        Some(format!("{why}; run it in Tier B (Landlock, seccomp, rlimits; no namespaces)?"));
                    Tier::B
                }
                FallbackPolicy::WarnAndExecute => {
                    warnings.push(format!(
                        "{why}: running in Tier B (Landlock, seccomp, rlimits; no namespaces)"
                    ));
                    Tier::B
                }
            }
        };
        if profile.egress == EgressMode::Strict && tier != Tier::C {
            return denied(
                ErrorKind::Unavailable,
                "egress.strict_unavailable",
                "egress = strict needs a network namespace, which this host cannot create",
            );
        }

        // Filesystem grants, with templates and the temporary workspace resolved.
        let run_name = format!("run-{}-{}", ctx.instance, ctx.run);
        let run_dir = ctx.temp_root.join(&run_name);
        let project_root = policy.project_root.clone().unwrap_or_else(|| workspace.clone());
        let (mut read_only, mut read_write) = (Vec::new(), Vec::new());
        let mut temp_workspace = None;
        let mut host_dirs = Vec::new();
        for cap in &profile.capabilities.filesystem {
            match cap {
                FsCapability::ReadOnly { path } | FsCapability::ReadWrite { path } => {
                    let expanded = path
                        .replace("${WORKSPACE}", &workspace.to_string_lossy())
                        .replace("${PROJECT_ROOT}", &project_root.to_string_lossy());
                    let writable = matches!(cap, FsCapability::ReadWrite { .. });
                    let canonical = Path::new(&expanded).canonicalize();
                    if let Err(e) = &canonical {
                        if e.kind() == std::io::ErrorKind::PermissionDenied {
                            return Err(not_allowed(&expanded, uid));
                        }
                    }
                    let Ok(p) = canonical else {
                        if writable {
                            return denied(
                                ErrorKind::InvalidRequest,
                                "filesystem.missing",
                                format!("{expanded} does not exist"),
                            );
                        }
                        // A read-only grant of a path that does not exist gives nothing.
                        continue;
                    };
                    if p == Path::new("/") {
                        return denied(
                            ErrorKind::WorkspaceScopeDenied,
                            "scope.root",
                            "/ cannot be granted as a whole",
                        );
                    }
                    // Deny beats allow: a grant cannot open a sensitive path.
                    if self.rules.sensitive(&p, home) {
                        return denied(
                            ErrorKind::WorkspaceScopeDenied,
                            "scope.sensitive_path",
                            format!("{} is a sensitive path and cannot be granted", p.display()),
                        );
                    }
                    if writable { read_write.push(p) } else { read_only.push(p) }
                }
                FsCapability::TempWorkspace => {
                    let dir = match tier {
                        Tier::C => PathBuf::from(TEMP_WORKSPACE),
                        Tier::B => run_dir.join("workspace"),
                    };
                    temp_workspace = Some(dir);
                }
            }
        }
        read_only.retain(|p| !read_write.contains(p));
        read_only.sort();
        read_only.dedup();
        read_write.sort();
        read_write.dedup();
        let tier_b_tmp = run_dir.join("tmp");
        if tier == Tier::B {
            host_dirs.push(run_dir.clone());
            host_dirs.push(tier_b_tmp.clone());
            host_dirs.extend(temp_workspace.clone());
        }

        // The working directory inside: the client's when the sandbox can see it.
        let visible_dirs: Vec<&PathBuf> =
            read_write.iter().chain(&read_only).chain(&temp_workspace).collect();
        let sandbox_cwd = if visible_dirs.iter().any(|d| cwd.starts_with(d)) {
            cwd.clone()
        } else if let Some(t) = &temp_workspace {
            t.clone()
        } else {
            read_write.first().or(read_only.first()).cloned().unwrap_or_else(|| PathBuf::from("/"))
        };
        let sandbox_home = temp_workspace
            .clone()
            .or_else(|| read_write.first().cloned())
            .unwrap_or_else(|| sandbox_cwd.clone());

        // The environment the command will see.
        let env: Vec<(String, String)> = match profile.capabilities.environment {
            EnvironmentCapability::None => vec![],
            EnvironmentCapability::Restricted => {
                let mut env = vec![
                    ("PATH".to_string(), SANDBOX_PATH.to_string()),
                    ("HOME".to_string(), sandbox_home.to_string_lossy().into_owned()),
                ];
                for key in ["USER", "LANG", "TERM"] {
                    if let Some(v) = req.env.get(key) {
                        env.push((key.to_string(), v.clone()));
                    }
                }
                if tier == Tier::B {
                    env.push(("TMPDIR".to_string(), tier_b_tmp.to_string_lossy().into_owned()));
                }
                env
            }
            EnvironmentCapability::Full => req.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        };

        // The validation pipeline.
        validate::check_shape(policy, &req.argv, &env)?;
        let program = resolve_program(&req.argv[0], &sandbox_cwd)?;
        let system: Vec<PathBuf> = crate::jail::host_layout().canonical;
        let mut exec_roots: Vec<&PathBuf> = system.iter().chain(&read_only).collect();
        if profile.exec_in_writable {
            exec_roots.extend(&read_write);
        }
        if !exec_roots.iter().any(|r| program.starts_with(r)) {
            return denied(
                ErrorKind::PolicyDenied,
                "executables.not_visible",
                format!("{} is outside the directories this sandbox may execute from", program.display()),
            );
        }
        validate::check_allowed(&program, &profile.allowed_executables)?;
        validate::check_interpreters(
            &self.rules,
            &program,
            &req.argv,
            !req.stdin.is_empty(),
            profile.allow_interpreters,
            profile.allow_inline_code,
        )?;
        let mut roots: Vec<PathBuf> = system.clone();
        roots.extend(ETC_ENTRIES.iter().map(PathBuf::from));
        roots.extend(read_only.iter().cloned());
        roots.extend(read_write.iter().cloned());
        roots.extend(temp_workspace.iter().cloned());
        roots.push(PathBuf::from("/proc"));
        roots.extend(palisade_protocol::dev_entries().map(|d| Path::new("/dev").join(d)));
        let private = match tier {
            Tier::C => vec![PathBuf::from("/tmp")],
            Tier::B => {
                roots.push(tier_b_tmp.clone());
                vec![]
            }
        };
        validate::check_scope(&self.rules, &req.argv, &sandbox_cwd, home, &roots, &private)?;
        validate::check_patterns(&self.rules, &req.argv)?;
        if profile.egress != EgressMode::None {
            check_egress(&req.argv, &profile.capabilities.network)?;
        }

        // Landlock features the policy requires, against what this kernel has.
        let mut required = policy.required_landlock();
        if tier == Tier::B {
            // Without namespaces, Landlock is the filesystem boundary: a Tier B
            // run without it would see the whole host. Never optional.
            required = required.union(LandlockFeatures::FS);
        }
        let missing = required.difference(LandlockFeatures::supported_by_abi(ctx.host.landlock_abi));
        if !missing.is_empty() {
            return denied(
                ErrorKind::Unavailable,
                "landlock.unsupported",
                format!(
                    "the policy requires Landlock {missing}, which this kernel (Landlock ABI {}) cannot enforce",
                    ctx.host.landlock_abi
                ),
            );
        }

        // The run's cgroup, required or not.
        let cgroup = match &ctx.host.cgroup {
            Ok(root) => {
                let name = run_name.clone();
                Some(CgroupPlan {
                    path: root.path.join(&name),
                    name,
                    v1: root.v1,
                    memory_bytes: profile.capabilities.process.max_memory_mb << 20,
                    processes: profile.capabilities.process.max_processes,
                    cpu_percent: profile.capabilities.process.max_cpu_percent,
                })
            }
            Err(why) if profile.require_cgroup => {
                return denied(
                    ErrorKind::Unavailable,
                    "cgroup.unavailable",
                    format!("the policy requires cgroup limits, and this broker has no usable cgroup: {why}"),
                );
            }
            Err(_) => None,
        };

        // Sensitive entries inside a granted directory: at its top, in any home
        // directory it holds, and the system's own (/etc/shadow, ...). Hidden
        // in Tier C, a refusal in Tier B (which cannot hide them).
        let mut hidden = Vec::new();
        let granted: Vec<&PathBuf> = read_write.iter().chain(&read_only).collect();
        for (root, p, is_dir) in sensitive_inside(&self.rules, &granted, home) {
            if tier == Tier::B {
                return denied(
                    ErrorKind::WorkspaceScopeDenied,
                    "scope.sensitive_path",
                    format!(
                        "{} holds {}, which Tier B cannot hide from the sandbox",
                        root.display(),
                        p.display()
                    ),
                );
            }
            hidden.push((p, is_dir));
        }

        // The plan.
        let process = profile.capabilities.process;
        let timeout =
            req.timeout_secs.map_or(process.max_execution_time, |t| t.min(process.max_execution_time));
        let max_output_bytes =
            req.max_output_bytes.map_or(profile.max_output_bytes, |m| m.min(profile.max_output_bytes));
        let host_network = match (&profile.capabilities.network, profile.egress) {
            (NetworkCapability::AllowAll, _) => true,
            (NetworkCapability::AllowDomains(_), EgressMode::Strict) => false,
            (NetworkCapability::AllowDomains(_), _) => true,
            (NetworkCapability::Deny, _) => false,
        };
        let mut exec_dirs = read_only.clone();
        if profile.exec_in_writable {
            exec_dirs.extend(read_write.iter().cloned());
        }
        // A root broker's sandboxes run as the requester's own block of host ids.
        let sandbox_ids = (ctx.uid == 0)
            .then(|| self.config.broker.sandbox_ids.for_requester(ctx.requester.uid))
            .transpose()
            .map_err(|e| Denial::new(ErrorKind::Unauthorized, "broker.sandbox_ids", e))?;
        let d = &self.config.defaults;
        let overlays = match (tier, d.disk) {
            (Tier::C, DiskMode::Overlay) => read_write.len() as u64,
            _ => 0,
        };
        let memory_bytes = process.max_memory_mb << 20;
        let tmpfs = TmpfsSizes {
            tmp: profile.tmp_size_mb << 20,
            workspace: u64::from(temp_workspace.is_some() && tier == Tier::C),
            upper: d.max_disk_mb << 20,
            overlays,
            // /dev/shm holds memory like any other: as much as the run may use.
            shm: memory_bytes,
        };
        let tmpfs = match (&cgroup, tier) {
            // A cgroup charges tmpfs pages to the run; rlimits do not see them.
            (None, Tier::C) => tmpfs.fit_within(memory_bytes),
            _ => tmpfs,
        };
        let spec = JailSpec {
            tier,
            program: program.to_string_lossy().into_owned(),
            argv: req.argv.clone(),
            env,
            cwd: sandbox_cwd,
            read_write: match (&temp_workspace, tier) {
                (Some(t), Tier::B) => read_write.iter().cloned().chain([t.clone()]).collect(),
                _ => read_write.clone(),
            },
            read_only,
            exec_dirs,
            tmp_dir: Some(tier_b_tmp),
            host_network,
            limits: Limits {
                // With a cgroup holding the memory limit, RLIMIT_AS stays a
                // looser floor (address space is not memory: runtimes reserve
                // far more than they use).
                memory_bytes: match cgroup {
                    Some(_) => (process.max_memory_mb << 20).saturating_mul(4),
                    None => process.max_memory_mb << 20,
                },
                cpu_seconds: timeout,
                // With a cgroup holding the process count (pids.max), RLIMIT_NPROC
                // stays a looser floor.
                processes: match cgroup {
                    Some(_) => process.max_processes.saturating_mul(2),
                    None => process.max_processes,
                },
                open_files: profile.max_open_files,
                file_size_bytes: profile.max_file_size_mb << 20,
                tmp_bytes: tmpfs.tmp,
                shm_bytes: tmpfs.shm,
            },
            landlock_required: required,
            hostname: "palisade".into(),
            // Tier B has no user namespace to map a root broker's uid: the
            // command runs as the sandbox's ids on the host.
            uid: sandbox_ids.filter(|_| tier == Tier::B).map_or(ctx.uid, |ids| ids.uid),
            gid: sandbox_ids.filter(|_| tier == Tier::B).map_or(ctx.gid, |ids| ids.gid),
            host_ids: sandbox_ids,
            acting_for: sandbox_ids.map(|_| ctx.requester),
            parent_pid: ctx.parent_pid,
            // cgroup v2: the helper joins through fd 5; v1: the broker places it.
            cgroup: cgroup.as_ref().filter(|c| !c.v1).map(|c| c.path.to_string_lossy().into_owned()),
            no_fork: process.no_fork,
            temp_workspace: if tier == Tier::C { temp_workspace.clone() } else { None },
            write_bound: (overlays > 0).then_some(tmpfs.upper),
            hidden,
            etc_view: ctx.etc_view.clone(),
        };
        let plan = build_plan(&spec).map_err(|e| Denial::new(e.kind(), e.rule(), e.to_string()))?;
        let labels =
            Labels { tier, host_network, cgroup: cgroup.as_ref(), memory_bytes, tmpfs, disk: d.disk };
        let network = labels.network(&profile.capabilities.network, profile.egress);
        let disk = labels.disk(temp_workspace.is_some(), !read_write.is_empty());
        let memory = labels.memory();
        let writable = read_write;
        let granted = writable.iter().chain(&spec.read_only).cloned().collect();
        let resolved = Resolved {
            plan,
            writable,
            granted,
            host_dirs,
            timeout: Duration::from_secs(timeout),
            max_output_bytes,
            capture_chunk_bytes: policy.capture_chunk_bytes.max(512),
            cgroup,
            tool: profile.tool,
            capabilities: profile.capabilities,
            network,
            egress: profile.egress,
            disk,
            memory,
            warnings,
        };
        Ok((resolved, approval))
    }
}

/// What a run's attestation and explanation say was in force.
struct Labels<'a> {
    tier: Tier,
    host_network: bool,
    cgroup: Option<&'a CgroupPlan>,
    memory_bytes: u64,
    tmpfs: TmpfsSizes,
    disk: DiskMode,
}

impl Labels<'_> {
    fn network(&self, capability: &NetworkCapability, egress: EgressMode) -> Network {
        match (self.host_network, capability) {
            (false, _) if self.tier == Tier::C => Network::LoopbackOnly,
            (false, _) => Network::NoSockets,
            (true, NetworkCapability::AllowDomains(d)) => {
                Network::HostDomains { domains: d.clone(), preflight: egress == EgressMode::Preflight }
            }
            (true, _) => Network::Host,
        }
    }

    fn disk(&self, temp_workspace: bool, writable: bool) -> Disk {
        let writable = match (self.tier, self.disk, writable) {
            (_, _, false) => None,
            (Tier::C, DiskMode::Overlay, true) => {
                Some(WritableDirs::Overlay { upper_bytes: self.tmpfs.upper })
            }
            (_, _, true) => Some(WritableDirs::Direct),
        };
        let scratch = match (self.tier, temp_workspace) {
            (Tier::C, true) => {
                Scratch::WorkspaceAndTmp { workspace: TEMP_WORKSPACE.into(), bytes: self.tmpfs.tmp }
            }
            (Tier::C, false) => Scratch::Tmp { bytes: self.tmpfs.tmp },
            (Tier::B, _) => Scratch::Host,
        };
        Disk { scratch, writable }
    }

    fn memory(&self) -> Memory {
        let t = &self.tmpfs;
        let budget = TmpfsBudget {
            tmp: t.tmp,
            workspace: (t.workspace > 0).then(|| TEMP_WORKSPACE.to_string()),
            upper_layers: (t.overlays > 0).then_some(UpperLayers { count: t.overlays, bytes_each: t.upper }),
            shm: t.shm,
        };
        match (self.cgroup, self.tier) {
            (Some(c), _) => Memory::Cgroup { v1: c.v1, bytes: self.memory_bytes },
            (None, Tier::C) => Memory::Rlimit { address_space: self.memory_bytes, tmpfs: Some(budget) },
            (None, Tier::B) => Memory::Rlimit { address_space: self.memory_bytes, tmpfs: None },
        }
    }
}

/// Egress preflight: every host the command line names is on the allow-list,
/// and no option of a known tool sends a connection somewhere it does not
/// name. (The host's network is given: this checks names, not connections.)
fn check_egress(argv: &[String], network: &NetworkCapability) -> Result<(), Denial> {
    let allow: &[String] = match network {
        NetworkCapability::Deny => &[],
        NetworkCapability::AllowDomains(d) => d,
        NetworkCapability::AllowAll => return Ok(()),
    };
    // The command a launcher (env, nice, timeout, ...) would run is what connects.
    let (command, args) = validate::through_launchers(argv);
    let launched: Vec<String> = std::iter::once(command).chain(args).collect();
    if let Some(option) = egress::redirection(&launched).filter(|_| !allow.is_empty()) {
        return denied(
            ErrorKind::CapabilityDenied,
            "egress.redirected",
            format!(
                "{option} would connect somewhere the command line does not name; \
                 preflight checks only the hosts it names (network: {network})"
            ),
        );
    }
    let mut hosts = egress::hosts_in(argv);
    if launched != argv {
        hosts.extend(egress::hosts_in(&launched));
    }
    match hosts.into_iter().find(|h| !egress::allowed(h, allow)) {
        Some(host) => denied(
            ErrorKind::CapabilityDenied,
            "egress.host_not_allowed",
            format!("network access to {host} is not allowed (network: {network})"),
        ),
        None => Ok(()),
    }
}

/// The sizes of a Tier C run's tmpfs mounts.
#[derive(Debug, Clone, Copy)]
struct TmpfsSizes {
    /// `/tmp`, and a temporary workspace when there is one (`workspace` is 1).
    tmp: u64,
    workspace: u64,
    /// Each overlay's upper layer (`overlays` of them).
    upper: u64,
    overlays: u64,
    shm: u64,
}

impl TmpfsSizes {
    fn total(&self) -> u64 {
        self.tmp
            .saturating_mul(1 + self.workspace)
            .saturating_add(self.upper.saturating_mul(self.overlays))
            .saturating_add(self.shm)
    }

    /// Within `budget` bytes together (0: no limit), for a run whose memory
    /// no cgroup bounds (rlimits do not count tmpfs pages): /tmp, the
    /// temporary workspace and the overlays' upper layers keep their sizes
    /// when they fit, and /dev/shm gets what is left of the budget; when they
    /// do not fit, all of them, /dev/shm included, are scaled down in
    /// proportion.
    fn fit_within(self, budget: u64) -> TmpfsSizes {
        const PAGE: u64 = 4096;
        if budget == 0 || self.total() <= budget {
            return self;
        }
        let fixed = self.total() - self.shm;
        if fixed + PAGE <= budget {
            return TmpfsSizes { shm: (budget - fixed) / PAGE * PAGE, ..self };
        }
        let total = self.total();
        let scale = |b: u64| {
            ((u128::from(b) * u128::from(budget) / u128::from(total)) as u64 / PAGE * PAGE).max(PAGE)
        };
        TmpfsSizes { tmp: scale(self.tmp), upper: scale(self.upper), shm: scale(self.shm), ..self }
    }
}

/// The existing sensitive paths that granted directories would expose, each
/// with its granted directory and whether it is a directory: the sensitive
/// names at a granted directory's top and in every home directory inside it
/// (the users' of /etc/passwd and the request's `HOME`), and the absolute
/// sensitive paths under it (`/etc/shadow`, configured ones, ...). Deeper
/// copies elsewhere in a tree are not searched for (that would walk the
/// whole tree at every run); naming one in the command line is refused.
fn sensitive_inside<'a>(
    rules: &Rules,
    granted: &[&'a PathBuf],
    home: Option<&Path>,
) -> Vec<(&'a PathBuf, PathBuf, bool)> {
    let mut homes = passwd_homes();
    homes.extend(home.and_then(|h| h.canonicalize().ok()));
    let absolute = rules.absolute_sensitive(home);
    let mut found: Vec<(&PathBuf, PathBuf, bool)> = Vec::new();
    let mut add = |root: &'a PathBuf, p: PathBuf| {
        if let Ok(meta) = std::fs::symlink_metadata(&p) {
            if !found.iter().any(|(_, q, _)| *q == p) {
                found.push((root, p, meta.is_dir()));
            }
        }
    };
    for &root in granted {
        let bases = std::iter::once(root).chain(homes.iter().filter(|h| h.starts_with(root) && *h != root));
        for base in bases {
            let home_names = if homes.contains(base) { HOME_SENSITIVE_NAMES } else { &[] };
            for name in SENSITIVE_NAMES.iter().chain(home_names) {
                add(root, base.join(name));
            }
        }
        for pattern in &absolute {
            let Some((dir, name)) = pattern.rsplit_once('/') else { continue };
            let dir = Path::new(if dir.is_empty() { "/" } else { dir });
            if dir.to_string_lossy().contains('*') || !dir.starts_with(root) {
                continue;
            }
            if !name.contains('*') {
                add(root, dir.join(name));
            } else if let Ok(glob) = globset::Glob::new(name).map(|g| g.compile_matcher()) {
                for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                    if glob.is_match(e.file_name()) {
                        add(root, e.path());
                    }
                }
            }
        }
    }
    found
}

/// The home directories of the users in /etc/passwd that exist, canonical.
/// Kept between decisions while /etc/passwd is the same file, unchanged
/// (resolving every home costs more than the rest of a decision).
fn passwd_homes() -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    use std::sync::Mutex;
    type Key = (u64, u64, i64, i64, u64);
    static CACHE: Mutex<Option<(Key, Vec<PathBuf>)>> = Mutex::new(None);
    let key = std::fs::metadata("/etc/passwd")
        .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.size()))
        .unwrap_or_default();
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((k, homes)) = cache.as_ref() {
        if *k == key {
            return homes.clone();
        }
    }
    let text = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let mut homes: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(':').nth(5))
        .filter(|h| h.starts_with('/') && *h != "/")
        .filter_map(|h| Path::new(h).canonicalize().ok())
        .filter(|h| h != Path::new("/"))
        .collect();
    homes.sort();
    homes.dedup();
    *cache = Some((key, homes.clone()));
    homes
}

/// The paths a parameter names, validated.
fn bound_paths(
    param: &str,
    value: &ParamValue,
    binding: &Binding,
    cwd: &Path,
    home: Option<&Path>,
    rules: &Rules,
    uid: u32,
) -> Result<Vec<PathBuf>, Denial> {
    let values: Vec<&String> = match (value, binding.mapping) {
        (ParamValue::One(v), _) => vec![v],
        (ParamValue::Many(vs), Mapping::EachElement) => vs.iter().collect(),
        (ParamValue::Many(_), Mapping::Single) => {
            return denied(
                ErrorKind::InvalidRequest,
                "tools.parameter_validation",
                format!("parameter {param} takes a single path"),
            );
        }
    };
    let mut out = Vec::new();
    for v in values {
        if v.contains('\0') || v.is_empty() {
            return denied(
                ErrorKind::InvalidRequest,
                "tools.parameter_validation",
                format!("parameter {param}: {v:?} is not a path"),
            );
        }
        let p = paths::resolve(v, cwd, home);
        if rules.sensitive(&p, home) || rules.sensitive(&paths::resolve_lexically(v, cwd, home), home) {
            return denied(
                ErrorKind::WorkspaceScopeDenied,
                "scope.sensitive_path",
                format!("parameter {param}: {v} is a sensitive path"),
            );
        }
        let meta = std::fs::metadata(&p);
        if meta.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied) {
            return Err(not_allowed(&format!("parameter {param}: {v}"), uid));
        }
        let ok = match (binding.validation, meta) {
            (_, Err(_)) => false,
            (Validation::IsFile, Ok(m)) => m.is_file(),
            (Validation::IsDirectory, Ok(m)) => m.is_dir(),
            (Validation::IsPath, Ok(_)) => true,
        };
        if !ok {
            let want = match binding.validation {
                Validation::IsFile => "an existing file",
                Validation::IsDirectory => "an existing directory",
                Validation::IsPath => "an existing path",
            };
            return denied(
                ErrorKind::InvalidRequest,
                "tools.parameter_validation",
                format!("parameter {param}: {v} is not {want}"),
            );
        }
        if p == Path::new("/") {
            return denied(
                ErrorKind::WorkspaceScopeDenied,
                "scope.root",
                format!("parameter {param}: / cannot be granted"),
            );
        }
        out.push(p);
    }
    Ok(out)
}

/// The refusal of a path the requester may not reach: the same words whether
/// or not it exists, so that nothing is learnt of what it cannot see (the
/// broker decides as the requester; the kernel answers EACCES for both).
fn not_allowed(path: &str, uid: u32) -> Denial {
    Denial::new(
        ErrorKind::WorkspaceScopeDenied,
        "scope.not_allowed",
        format!("{path}: not allowed (uid {uid} cannot reach it)"),
    )
}

fn absolute_dir(path: &str, what: &str, uid: u32) -> Result<PathBuf, Denial> {
    if !path.starts_with('/') {
        return denied(ErrorKind::InvalidRequest, "request.path", format!("{what} {path:?} is not absolute"));
    }
    let p = Path::new(path).canonicalize().map_err(|e| match e.kind() {
        std::io::ErrorKind::PermissionDenied => not_allowed(&format!("{what} {path}"), uid),
        _ => Denial::new(ErrorKind::InvalidRequest, "request.path", format!("{what} {path}: {e}")),
    })?;
    if !p.is_dir() {
        return denied(
            ErrorKind::InvalidRequest,
            "request.path",
            format!("{what} {path} is not a directory"),
        );
    }
    if p == Path::new("/") {
        return denied(ErrorKind::WorkspaceScopeDenied, "scope.root", format!("the {what} cannot be /"));
    }
    Ok(p)
}

/// A bare name is looked up in the sandbox's PATH; a path is taken relative to
/// the sandbox's working directory. The result is canonical.
pub fn resolve_program(command: &str, cwd: &Path) -> Result<PathBuf, Denial> {
    let not_found = |why: String| Denial::new(ErrorKind::InvalidRequest, "command.not_found", why);
    if command.contains('/') {
        let p = cwd.join(command);
        let c = p.canonicalize().map_err(|_| not_found(format!("command not found: {command}")))?;
        validate::resolve_executable(&c.to_string_lossy()).map_err(not_found)
    } else {
        validate::resolve_executable(command).map_err(|_| not_found(format!("command not found: {command}")))
    }
}

#[cfg(test)]
mod tests {
    use super::TmpfsSizes;

    const MIB: u64 = 1 << 20;

    fn sizes(tmp: u64, upper: u64, shm: u64) -> TmpfsSizes {
        TmpfsSizes { tmp: tmp * MIB, workspace: 0, upper: upper * MIB, overlays: 1, shm: shm * MIB }
    }

    /// Without a cgroup the tmpfs mounts hold memory that no rlimit counts:
    /// together they stay within the run's memory limit.
    #[test]
    fn tmpfs_sizes_fit_the_memory_limit_together() {
        // All fit: unchanged.
        let s = sizes(64, 64, 64).fit_within(512 * MIB);
        assert_eq!((s.tmp, s.upper, s.shm), (64 * MIB, 64 * MIB, 64 * MIB));
        // /tmp and the overlay fit: /dev/shm gets what is left.
        let s = sizes(256, 16, 512).fit_within(512 * MIB);
        assert_eq!((s.tmp, s.upper, s.shm), (256 * MIB, 16 * MIB, 240 * MIB));
        // Nothing fits: all scaled, each at least a page, the sum within the limit.
        for budget in [4096, 64 * MIB, 512 * MIB, 3 * MIB + 17] {
            let mut with_ws = sizes(256, 1024, 512);
            with_ws.workspace = 1;
            with_ws.overlays = 3;
            for s in [sizes(256, 1024, 512), with_ws] {
                let f = s.fit_within(budget);
                assert!(f.tmp >= 4096 && f.upper >= 4096 && f.shm >= 4096, "{f:?}");
                assert!(
                    f.total() <= budget.max(4096 * (2 + s.workspace + s.overlays)),
                    "{f:?} over {budget}"
                );
            }
        }
        // No limit: unchanged.
        let s = sizes(256, 1024, 0).fit_within(0);
        assert_eq!((s.tmp, s.upper), (256 * MIB, 1024 * MIB));
    }
}
