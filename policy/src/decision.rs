//! From a request to a decision: refuse (with a stable kind, a stable rule
//! and a reason that names the path, limit or rule), ask for approval, or
//! allow with a fully resolved plan.
//!
//! [`Policy::resolve`] is its phases, in order, each a function from what
//! the earlier ones found to what it adds: the profile (a tool's or the
//! defaults), the request's directories and parameters, the tier, the
//! grants, the sandbox's view (cwd and environment); then the checks: the
//! request's shape, the executable, interpreters, the workspace scope,
//! blocked patterns, egress, Landlock, the cgroup, sensitive paths inside
//! the grants; then the limits and the plan; last, when the configuration
//! names a Cedar file, its policies ([`crate::cedar`]), which can only
//! narrow. The first refusal ends it.

use crate::capabilities::{
    Binding, BoundCapability, Capabilities, EnvironmentCapability, FsCapability, Mapping, NetworkCapability,
    ProcessCapability, Validation,
};
use crate::cedar::{self, CedarVerdict, Principal};
use crate::config::{Config, DiskMode, FallbackPolicy, PolicyConfig};
use crate::egress::{self, EgressMode};
use crate::egress_plan::{self, EgressPlan};
use crate::host::{Host, HostCapabilities, HostFiles, OwnedPath};
use crate::host_executed::{HostExecuted, InPlace, InTree};
use crate::jail::{ETC_ENTRIES, JailSpec, Limits, build_plan};
use crate::trust::{self, Approval, EscalationReason, EscalationTrigger, ToolTrust, TrustStage};
use crate::validate::{self, HOME_SENSITIVE_NAMES, Rules, SENSITIVE_NAMES};
use crate::{Preset, paths};
use palisade_protocol::attest::{Disk, Memory, Network, Scratch, TmpfsBudget, WritableDirs};
use palisade_protocol::wire::{ErrorKind, KeepChanges, OnConflict, ParamValue, RunRequest};
use palisade_protocol::{HostIds, JailPlan, LandlockFeatures, Tier};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::denial::Denial;
pub use crate::paths::SANDBOX_PATH;

/// Where a temporary workspace appears inside a Tier C sandbox (a tmpfs).
pub const TEMP_WORKSPACE: &str = "/workspace";

/// RLIMIT_AS is this many times the memory limit, and so is RLIMIT_DATA
/// where a cgroup holds the memory limit: looser floors. Address space is
/// not memory: runtimes reserve far more than they use (V8 about 768 MiB
/// before it runs anything), so without a cgroup RLIMIT_DATA, which counts
/// only private writable mappings, carries the limit itself.
const ADDRESS_SPACE_SLACK: u64 = 4;
/// With a cgroup holding the process count (pids.max), RLIMIT_NPROC is this
/// many times the limit: a looser floor (it counts every process of the uid).
const PROCESSES_SLACK: u64 = 2;
/// The smallest chunk output is captured in, whatever is configured: a frame
/// for every few bytes would cost more than it carries.
const MIN_CAPTURE_CHUNK_BYTES: usize = 512;
/// Names the sandbox's resolver under strict egress.
const RESOLV_CONF: &str = "/etc/resolv.conf";
/// The hostname a Tier C sandbox has (its own UTS namespace).
const HOSTNAME: &str = "palisade";
/// The most paths the host executes that a tree written in place may hold:
/// each is a read-only mount of its own, and a descriptor of the plan's.
pub const MAX_HELD_IN_PLACE: usize = 64;

/// Bytes in `v` MiB: the configuration gives sizes in MiB.
fn mib(v: u64) -> u64 {
    v << 20
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
    /// The broker's pid: the helper's lifeline.
    pub parent_pid: u32,
    /// The broker's own ids.
    pub uid: u32,
    pub gid: u32,
    /// The broker serves other users (root, or a user holding the system
    /// unit's capabilities): it acts as the requester, its sandboxes run as
    /// the requester's own block of host ids, and it may see another file
    /// system than the requester's (a system service's private /tmp).
    pub serves_others: bool,
    /// Who asks: the peer's uid and gid (the broker's own for the CLI's
    /// embedded broker). A broker running as root acts on its behalf: the
    /// sandbox gets its access and its own block of host ids.
    pub requester: HostIds,
    /// The requester's supplementary groups (`SO_PEERGROUPS`): Cedar
    /// policies see it a member of these and of its primary group.
    pub groups: Vec<u32>,
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
    /// The requested tool's trust stage; `None` where stages do not apply
    /// (they are off, the request names no tool, or `palisade explain`).
    pub trust: Option<ToolTrust>,
    /// Where a broker that serves only its user keeps each workspace's own
    /// `HOME` (a directory per workspace, kept between runs): the tools'
    /// state and caches land there, not in the project. `None`: a run's
    /// `HOME` is its workspace.
    pub homes: Option<PathBuf>,
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
    /// The workspace's own `HOME` (see [`Context::homes`]), which the broker
    /// makes (mode 0700) before the run and keeps.
    pub home: Option<PathBuf>,
    /// The toolchains' installations shown read-only (the command's, and
    /// those the caller's PATH leads to).
    pub toolchains: Vec<PathBuf>,
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
    /// Strict egress with allowed domains (Tier C): what the broker serves
    /// on the plan's listeners (`plan.listeners`, handed over by the helper
    /// in one `HelperRecord::Listeners`) and lets through. `None`: no
    /// listeners (any other egress, or strict with no domain allowed).
    pub egress_plan: Option<EgressPlan>,
    pub disk: Disk,
    /// What bounded the run's memory, tmpfs mounts included.
    pub memory: Memory,
    pub warnings: Vec<String>,
    /// What the result says of the run beside its warnings, which the
    /// broker does not log (every run without a cgroup has one).
    pub notes: Vec<String>,
    /// What set off the question a tool's trust stage asks, if it asks one.
    pub escalation: Option<EscalationTrigger>,
    /// The request's workspace, canonical.
    pub workspace: PathBuf,
    /// Whose run it is.
    pub requester: HostIds,
    /// What the Cedar policies decided (`None`: none are configured).
    pub cedar: Option<CedarVerdict>,
    /// What becomes of the run's writes, and of a path someone else
    /// changed meanwhile (the profile's, as the request narrowed them).
    pub keep_changes: KeepChanges,
    pub on_conflict: OnConflict,
    /// The run writes its workspace in place (Tier B, `disk = "direct"`):
    /// there is no change set.
    pub in_place: bool,
    /// Written in place in Tier C: what git's configurations name as code
    /// in the workspace (hooks directories, included files; there or not),
    /// where what the run makes is held when it ends.
    pub in_place_code: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
pub enum Decision {
    Deny(Denial),
    /// Allowed, once a person approves: the run it would be is resolved and
    /// checked like any other (the validation pipeline has passed).
    NeedsApproval {
        reason: String,
        /// The rule that asks: a tool's Trial or escalation, the fallback,
        /// or a Cedar `forbid` with `@ask` (`cedar.ask`).
        rule: &'static str,
        resolved: Box<Resolved>,
    },
    Allow(Box<Resolved>),
}

/// A configuration with its rules compiled, ready to decide.
#[derive(Debug)]
pub struct Policy {
    pub config: Config,
    rules: Rules,
    /// What the host executes (`[policy] host_executed` added), compiled.
    host_executed: HostExecuted,
}

/// Everything that varies between the default profile and a tool.
struct Profile {
    tool: Option<String>,
    /// The configuration table it comes from: `defaults`, `profiles.NAME`, `tools.NAME`.
    table: String,
    /// Variables a request may pass beyond those of `environment`.
    pass_env: Vec<String>,
    disk: DiskMode,
    max_disk_mb: u64,
    keep_changes: KeepChanges,
    on_conflict: OnConflict,
    allow_direct: bool,
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
    /// The command's toolchain (its `#!` interpreters and where they are
    /// installed) is made visible read-only.
    toolchains: bool,
    /// The requester's git `user.name` and `user.email` are given to the run.
    git_identity: bool,
    require_cgroup: bool,
    bindings: BTreeMap<String, Binding>,
    /// Strict egress's inspected domains and their request rules.
    inspect: crate::inspect::Inspection,
}

/// The directories a request names, canonical, and its `HOME` as given.
struct RequestDirs {
    cwd: PathBuf,
    workspace: PathBuf,
    home: Option<PathBuf>,
    /// The caller's PATH and the toolchains it leads to.
    tools: toolchains::CallerTools,
}

/// The tier a run gets and what choosing it added: a warning, or the
/// question a person must answer first.
struct TierChoice {
    tier: Tier,
    warnings: Vec<String>,
    approval: Option<String>,
}

/// What the sandbox is given of the host, in its tier.
struct Grants {
    tier: Tier,
    read_only: Vec<PathBuf>,
    read_write: Vec<PathBuf>,
    /// Tier C: [`TEMP_WORKSPACE`], a tmpfs; Tier B: a directory of the run's.
    temp_workspace: Option<PathBuf>,
    /// `run-<instance>-<run>`: the name of the run's cgroup and host directory.
    run_name: String,
    /// The run's private /tmp on the host (Tier B's).
    tier_b_tmp: PathBuf,
    /// The host directories the broker creates for the run (Tier B).
    host_dirs: Vec<PathBuf>,
    /// The workspace's own `HOME`, written in place (see [`Context::homes`]).
    home: Option<PathBuf>,
    /// What of `read_only` the command's toolchains added.
    toolchains: Vec<PathBuf>,
}

/// Where the command starts, and the environment it sees.
struct SandboxView {
    cwd: PathBuf,
    env: Vec<(String, String)>,
    /// Where a bare name is looked up: the caller's PATH, then the sandbox's default.
    search: Vec<PathBuf>,
}

/// What the phases before the plan found.
struct Draft {
    profile: Profile,
    /// Strict egress's plan, when it has domains to reach.
    egress: Option<EgressPlan>,
    warnings: Vec<String>,
    grants: Grants,
    view: SandboxView,
    program: PathBuf,
    /// The Landlock features the run requires.
    landlock: LandlockFeatures,
    cgroup: Option<CgroupPlan>,
    /// Sensitive entries inside the grants, hidden (whether each is a directory).
    hidden: Vec<(PathBuf, bool)>,
    /// What the host executes inside a tree written in place.
    held: InPlace,
}

/// A run's limits, from its profile, its request and whether a cgroup holds it.
struct RunLimits {
    timeout_secs: u64,
    max_output_bytes: u64,
    memory_bytes: u64,
    /// How many writable directories are overlays (Tier C, `disk = overlay`).
    overlays: u64,
    /// The bound of the overlays' writes, on disk (`max_disk_mb`).
    disk_bytes: u64,
    tmpfs: TmpfsSizes,
    rlimits: Limits,
}

/// Sorts `paths` and drops each that lies inside another of them: granted
/// the same way, it is already reached through that one, and a mount of it
/// inside that one's would need a mount point made in a directory the
/// sandbox gets read-only. (A read-only path inside a read-write one stays:
/// it takes writing away there.)
fn drop_nested(paths: &mut Vec<PathBuf>) {
    paths.sort();
    paths.dedup();
    let all = paths.clone();
    paths.retain(|p| !all.iter().any(|outer| outer != p && p.starts_with(outer)));
}

/// Whether `path` lies inside the approved `range` (in a writable part of
/// it, when it is to be written).
fn in_range(range: &[(PathBuf, bool)], path: &Path, writable: bool) -> bool {
    range.iter().any(|(root, w)| path.starts_with(root) && (*w || !writable))
}

/// A path of the approved range as the trigger shows it.
fn approved_path_text(path: &Path, writable: bool) -> String {
    format!("{} ({})", path.display(), if writable { "read-write" } else { "read-only" })
}

/// The fix of a refusal whose rule alone says what lifts it (the others
/// carry theirs from where they are made: a path, a host).
fn static_fix(d: Denial) -> Denial {
    let (flag, key) = match d.rule {
        "interpreters.denied" => (Some("--allow-interpreters"), "allow_interpreters = true"),
        "interpreters.inline_code" => (Some("--allow-inline-code"), "allow_inline_code = true"),
        "interpreters.loader" => (
            Some("--allow-interpreters --allow-inline-code"),
            "allow_interpreters = true and allow_inline_code = true",
        ),
        "fallback.deny" => (None, "[policy] fallback = \"warn_and_execute\" (or \"request_approval\")"),
        _ => return d,
    };
    if d.fix.is_some() { d } else { d.with_fix(flag.map(String::from), key) }
}

/// The question Cedar's `forbid`s with `@ask` put (see [`cedar`]), after
/// any the built-in checks asked, whose rule then stays the question's.
fn cedar_question(approval: Option<Approval>, verdict: Option<&CedarVerdict>) -> Option<Approval> {
    let Some(ask) = verdict.and_then(|v| v.asked.as_ref()) else { return approval };
    Some(match approval {
        Some(first) => Approval { reason: format!("{} {}", first.reason, ask.reason), rule: first.rule },
        None => Approval { reason: ask.reason.clone(), rule: cedar::RULE_ASK },
    })
}

fn denied<T>(kind: ErrorKind, rule: &'static str, reason: impl Into<String>) -> Result<T, Denial> {
    Err(Denial::new(kind, rule, reason))
}

impl Policy {
    /// A policy for `config`: the interpreters installed on the host (read
    /// through `files`) are looked up once, here.
    pub fn new(config: Config, files: &dyn HostFiles) -> Policy {
        let rules = Rules::new(&config.policy).with_installed(files);
        let extra: Vec<String> = config.policy.host_executed.iter().map(|g| g.get_ref().clone()).collect();
        Policy { host_executed: HostExecuted::new(&extra), config, rules }
    }

    /// Whether the request is the owner's, of a broker that serves only its
    /// owner and lets it widen (`[broker] owner_widens`), as an embedded
    /// broker's flags do.
    fn owner_widens(&self, ctx: &Context) -> bool {
        self.config.broker.owner_widens && !ctx.serves_others && ctx.requester.uid == ctx.uid
    }

    /// The decision on `req`, asked by `ctx.requester`, on `host`.
    pub fn decide(&self, host: &Host, ctx: &Context, req: &RunRequest) -> Decision {
        match self.resolve(host, ctx, req) {
            Ok((r, None)) => Decision::Allow(Box::new(r)),
            Ok((r, Some(Approval { reason, rule }))) => {
                Decision::NeedsApproval { reason, rule, resolved: Box::new(r) }
            }
            // A refusal names the flag that lifts it where the flag would.
            Err(d) => Decision::Deny(static_fix(d).finish(self.config.own || self.owner_widens(ctx))),
        }
    }

    /// The run, with why it needs approval first (if it does), or a refusal.
    fn resolve(
        &self,
        host: &Host,
        ctx: &Context,
        req: &RunRequest,
    ) -> Result<(Resolved, Option<Approval>), Denial> {
        let (files, uid) = (&*host.files, ctx.requester.uid);
        let mut profile = self.profile(files, req, self.owner_widens(ctx))?;
        // A request may only narrow its profile (widened first for its owner): its domains, and its other asks.
        profile.capabilities.network =
            egress_plan::narrow(&profile.capabilities.network, req.allow_domains.as_deref())?;
        let own = self.config.own || self.owner_widens(ctx);
        let reach = egress_plan::Reach::asked(&self.config.egress, req, own)?;
        asks::narrow(&mut profile, req)?;
        let trust = profile.tool.clone().zip(ctx.trust);
        if let Some((tool, ToolTrust { stage: TrustStage::Draft, .. })) = &trust {
            return denied(
                ErrorKind::PolicyDenied,
                trust::DRAFT_RULE,
                format!(
                    "tool {tool} is a Draft and does not run: an approver reviews its declaration \
                     (palisade tools show {tool}) and approves it (palisade tools approve {tool})"
                ),
            );
        }
        let dirs = RequestDirs::of(files, req, (uid, ctx.serves_others), &host.homes)?;
        let (bound, escalation) = self.bound_grants(files, req, &profile, &dirs, uid, trust.is_some())?;
        profile.capabilities.filesystem.extend(bound);
        let TierChoice { tier, warnings, approval } =
            choose_tier(&self.config.policy, &host.capabilities, profile.egress)?;
        seatbelt_network(&host.capabilities, &profile.capabilities.network)?;
        terminal(req, tier)?;
        let mut grants = self.grants(&profile, &dirs, ctx, tier, &host.owned)?;
        asks::check_paths(&profile, req, &dirs, &grants, host)?;
        // The command's chain (its executable, each `#!` interpreter), read
        // once: what the toolchains grant and what the executable's check sees.
        let chain =
            req.argv.first().and_then(|c| resolve_program(files, c, &dirs.cwd, &dirs.tools.path).ok());
        let chain = chain.map_or_else(Vec::new, |program| toolchains::chain(files, &program));
        if profile.toolchains {
            self.grant_toolchains(host, &chain, &dirs, ctx.requester.uid, &mut grants);
        }
        let mut view = SandboxView::new(host, req, &dirs, &grants, &profile);
        if profile.git_identity && profile.capabilities.environment != EnvironmentCapability::None {
            git::add_identity(&mut view.env, files, &req.env);
        }
        let egress = self.egress_plan(&profile, tier)?.map(|plan| plan.reaching(&reach)).transpose()?;

        // The checks, in order.
        validate::check_shape(&self.config.policy, &req.argv, &view.env)?;
        if egress.is_some() {
            // The sandbox's own settings, after the request's shape was checked.
            view.env.retain(|(k, _)| !EgressPlan::env().iter().any(|(p, _)| p == k));
            view.env.extend(EgressPlan::env());
        }
        let program = self.executable(host, req, &view, &grants, &profile, chain)?;
        self.check_interpreters(files, req, &program, &profile)?;
        self.check_scope(host, req, &dirs, &view, &grants)?;
        validate::check_patterns(&self.rules, &req.argv)?;
        check_egress(&req.argv, &profile)?;
        let landlock = required_landlock(&self.config.policy, tier, &host.capabilities)?;
        let cgroup = cgroup_plan(&host.capabilities, &grants.run_name, &profile)?;
        let mut hidden = self.hidden(host, &grants, dirs.home.as_deref())?;
        hidden.extend(broker_owned_inside(host, &grants, profile.disk)?);
        let held = self.held_in_place(host, &grants, (profile.disk, dirs.home.as_deref()), &hidden)?;

        let draft =
            Draft { profile, egress, warnings, grants, view, program, landlock, cgroup, hidden, held };
        let limits = self.limits(req, &draft);
        let mut resolved = self.plan(host, ctx, req, draft, limits, &dirs)?;
        let approval = approval.map(|reason| Approval { reason, rule: trust::FALLBACK_RULE });
        let approval = self.trust_question(&mut resolved, trust, escalation, approval);

        // Cedar, last: it can only narrow what the built-in checks allow (or ask a person first).
        resolved.cedar = self.check_cedar(ctx, &resolved, approval.is_some())?;
        let approval = cedar_question(approval, resolved.cedar.as_ref());
        Ok((resolved, approval))
    }

    /// The question a tool's trust stage asks before the run (Trial, an
    /// escalation), after any the tier asked; the trigger goes in `resolved`.
    fn trust_question(
        &self,
        resolved: &mut Resolved,
        trust: Option<(String, ToolTrust)>,
        escalation: Option<EscalationTrigger>,
        approval: Option<Approval>,
    ) -> Option<Approval> {
        let Some((tool, trust)) = trust else { return approval };
        let Some((question, trigger)) = trust::question(&tool, &trust, escalation) else { return approval };
        // The tool's own question names the rule: Trial's first run asks as a Trial run does.
        let rule = match &trigger {
            Some(t) if t.reason != EscalationReason::FirstExecution => trust::ESCALATION_RULE,
            _ => trust::TRIAL_RULE,
        };
        resolved.escalation = trigger;
        Some(match approval {
            Some(first) => Approval { reason: format!("{} {question}", first.reason), rule },
            None => Approval { reason: question, rule },
        })
    }

    /// Strict egress's plan: in Tier C (Tier B was refused when the tier was
    /// chosen), when the network allows some domains; with none, the
    /// sandbox has loopback alone and nothing to serve.
    fn egress_plan(&self, profile: &Profile, tier: Tier) -> Result<Option<EgressPlan>, Denial> {
        match (&profile.capabilities.network, profile.egress, tier) {
            (NetworkCapability::AllowDomains(d), EgressMode::Strict, Tier::C) if !d.is_empty() => {
                let mut plan = EgressPlan::new(&self.config.egress, d, &profile.inspect)?;
                plan.secrets_dir = self.config.plugins.secrets_dir.clone();
                Ok(Some(plan))
            }
            _ => Ok(None),
        }
    }

    /// The Cedar policies' decision on the run, asked by its requester
    /// (`run`, or `run_tool` for a tool); `None` when none are configured.
    fn check_cedar(
        &self,
        ctx: &Context,
        resolved: &Resolved,
        needs_approval: bool,
    ) -> Result<Option<CedarVerdict>, Denial> {
        let Some(policies) = &self.config.policy.cedar_policies else { return Ok(None) };
        let principal =
            Principal { uid: ctx.requester.uid, gid: ctx.requester.gid, groups: ctx.groups.clone() };
        policies.authorize(&principal, cedar::Action::of(resolved), resolved, needs_approval).map(Some)
    }

    /// Whether `approver` may approve the waiting run `resolved`, as the
    /// Cedar policies say (action `approve`, the run's resource and
    /// context): `Ok(None)` when none are configured (the built-in rules
    /// alone decide), the verdict when they permit it, a refusal (kind
    /// `PolicyDenied`, rule `cedar.forbid`, `cedar.no_permit` or
    /// `cedar.error`) when they do not.
    pub fn authorize_approval(
        &self,
        approver: &Principal,
        resolved: &Resolved,
    ) -> Result<Option<CedarVerdict>, Denial> {
        let Some(policies) = &self.config.policy.cedar_policies else { return Ok(None) };
        policies.authorize(approver, cedar::Action::Approve, resolved, true).map(Some)
    }

    /// The profile: the named tool's (its preset with its overrides), or the
    /// defaults when the request names none.
    fn profile(&self, files: &dyn HostFiles, req: &RunRequest, widen: bool) -> Result<Profile, Denial> {
        let resolve_all = |names: &[toml::Spanned<String>]| -> Vec<PathBuf> {
            names.iter().filter_map(|n| validate::resolve_executable(files, n.get_ref()).ok()).collect()
        };
        let Some(name) = &req.tool else {
            let (table, d) = self
                .config
                .profile_named(req.profile.as_deref())
                .map_err(|e| Denial::new(ErrorKind::InvalidRequest, "profiles.unknown", e))?;
            let widened = if widen { Some(asks::widen(d, &table, req)?) } else { None };
            let d = widened.as_ref().unwrap_or(d);
            let mut filesystem = vec![FsCapability::ReadWrite { path: "${WORKSPACE}".into() }];
            filesystem.extend(
                d.read_write.iter().map(|p| FsCapability::ReadWrite { path: p.to_string_lossy().into() }),
            );
            filesystem.extend(
                d.read_only.iter().map(|p| FsCapability::ReadOnly { path: p.to_string_lossy().into() }),
            );
            return Ok(Profile {
                tool: None,
                table,
                pass_env: d.pass_env.clone(),
                disk: d.disk,
                max_disk_mb: d.max_disk_mb,
                keep_changes: d.keep_changes,
                on_conflict: d.on_conflict,
                allow_direct: d.allow_direct,
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
                toolchains: d.toolchains,
                git_identity: d.git_identity,
                require_cgroup: self.config.policy.require_cgroup,
                bindings: BTreeMap::new(),
                inspect: d.inspect.clone(),
            });
        };
        if let Some(p) = &req.profile {
            let reason = format!("a request names a tool ({name}) or a profile ({p}), not both");
            return denied(ErrorKind::InvalidRequest, "request.profile_with_tool", reason);
        }
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
            table: format!("tools.{name}"),
            pass_env: vec![],
            disk: d.disk,
            max_disk_mb: d.max_disk_mb,
            keep_changes: d.keep_changes,
            on_conflict: d.on_conflict,
            allow_direct: d.allow_direct,
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
            // A tool gets what it declares.
            toolchains: false,
            git_identity: false,
            require_cgroup: self.config.policy.require_cgroup || tool.require_cgroup,
            bindings: tool.parameters.clone(),
            inspect: tool.inspect.clone(),
        })
    }

    /// Parameters bound to filesystem capabilities, as the grants they become.
    fn bound_grants(
        &self,
        files: &dyn HostFiles,
        req: &RunRequest,
        profile: &Profile,
        dirs: &RequestDirs,
        uid: u32,
        trusted: bool,
    ) -> Result<(Vec<FsCapability>, Option<EscalationTrigger>), Denial> {
        let tool = profile.tool.as_deref().unwrap_or("-");
        let range = if trusted { self.approved_range(profile, dirs) } else { Vec::new() };
        let escalate = |reason, requested: String| EscalationTrigger {
            reason,
            requested_path: Some(requested),
            approved_paths: range.iter().map(|(p, w)| approved_path_text(p, *w)).collect(),
        };
        let (mut out, mut escalation) = (Vec::new(), None);
        for (param, value) in &req.params {
            let Some(binding) = profile.bindings.get(param) else {
                if trusted {
                    // Held for an approval; approved, the run goes on without it (it binds nothing).
                    escalation
                        .get_or_insert_with(|| escalate(EscalationReason::UndeclaredBinding, param.clone()));
                    continue;
                }
                return denied(
                    ErrorKind::PolicyDenied,
                    "tools.undeclared_parameter",
                    format!("parameter {param} is not declared by tool {tool}"),
                );
            };
            let bound = Bound { param, binding, cwd: &dirs.cwd, home: dirs.home.as_deref(), uid };
            let paths = bound.paths(files, &self.rules, value).map_err(|d| match d.rule {
                "scope.sensitive_path" if trusted => Denial::new(
                    d.kind,
                    trust::SENSITIVE_RULE,
                    format!("{} (escalation SensitiveDirectory: tool {tool} is back to Draft)", d.reason),
                ),
                _ => d,
            })?;
            let writable = binding.capability == BoundCapability::ReadWrite;
            for path in paths {
                if trusted && escalation.is_none() && !in_range(&range, &path, writable) {
                    escalation =
                        Some(escalate(EscalationReason::PathOutOfScope, path.to_string_lossy().into()));
                }
                let path = path.to_string_lossy().into_owned();
                out.push(if writable {
                    FsCapability::ReadWrite { path }
                } else {
                    FsCapability::ReadOnly { path }
                });
            }
        }
        Ok((out, escalation))
    }

    /// A tool's approved range: the host paths its declared capabilities
    /// grant, `${WORKSPACE}` and `${PROJECT_ROOT}` resolved for this run, each
    /// with whether it is writable. A parameter's path must lie inside one
    /// of them (a writable one for a read-write binding), or the run escalates.
    fn approved_range(&self, profile: &Profile, dirs: &RequestDirs) -> Vec<(PathBuf, bool)> {
        let project_root = self.config.policy.project_root.clone().unwrap_or_else(|| dirs.workspace.clone());
        let mut range = Vec::new();
        for cap in &profile.capabilities.filesystem {
            let (path, writable) = match cap {
                FsCapability::ReadOnly { path } => (path, false),
                FsCapability::ReadWrite { path } => (path, true),
                FsCapability::TempWorkspace => continue,
            };
            let expanded = path
                .replace("${WORKSPACE}", &dirs.workspace.to_string_lossy())
                .replace("${PROJECT_ROOT}", &project_root.to_string_lossy());
            range.push((paths::resolve(&expanded, &dirs.cwd, dirs.home.as_deref()), writable));
        }
        range
    }

    /// The filesystem grants, with templates and the temporary workspace
    /// resolved, and the run's own host directories.
    fn grants(
        &self,
        profile: &Profile,
        dirs: &RequestDirs,
        ctx: &Context,
        tier: Tier,
        owned: &[OwnedPath],
    ) -> Result<Grants, Denial> {
        let run_name = format!("run-{}-{}", ctx.instance, ctx.run);
        let run_dir = ctx.temp_root.join(&run_name);
        let project_root = self.config.policy.project_root.clone().unwrap_or_else(|| dirs.workspace.clone());
        let (mut read_only, mut read_write) = (Vec::new(), Vec::new());
        let mut temp_workspace = None;
        for cap in &profile.capabilities.filesystem {
            match cap {
                FsCapability::ReadOnly { path } | FsCapability::ReadWrite { path } => {
                    let expanded = path
                        .replace("${WORKSPACE}", &dirs.workspace.to_string_lossy())
                        .replace("${PROJECT_ROOT}", &project_root.to_string_lossy());
                    let writable = matches!(cap, FsCapability::ReadWrite { .. });
                    let Some(p) =
                        self.granted_path(&expanded, writable, dirs.home.as_deref(), ctx.requester.uid)?
                    else {
                        continue;
                    };
                    // Before nested grants are folded into the ones holding them.
                    check_not_owned(&p, owned)?;
                    if writable { read_write.push(p) } else { read_only.push(p) }
                }
                FsCapability::TempWorkspace => {
                    temp_workspace = Some(match tier {
                        Tier::C => PathBuf::from(TEMP_WORKSPACE),
                        Tier::B => run_dir.join("workspace"),
                    });
                }
            }
        }
        read_only.retain(|p| !read_write.contains(p));
        drop_nested(&mut read_only);
        drop_nested(&mut read_write);
        let tier_b_tmp = run_dir.join("tmp");
        let host_dirs = match tier {
            Tier::B => [run_dir, tier_b_tmp.clone()].into_iter().chain(temp_workspace.clone()).collect(),
            Tier::C => vec![],
        };
        // A temporary workspace is its own home; so is a run with no writable
        // workspace, and one whose grants hold the homes (hidden there: the
        // broker's state). One home per workspace and profile: what a run of
        // one profile leaves there is no other profile's to run.
        let holds = |h: &PathBuf| read_write.iter().chain(&read_only).any(|g| h.starts_with(g));
        let home = match (&ctx.homes, &temp_workspace, read_write.first()) {
            (Some(homes), None, Some(_)) if !ctx.serves_others && !holds(homes) => {
                Some(homes.join(home_name(&dirs.workspace, &profile.table)))
            }
            _ => None,
        };
        let toolchains = Vec::new();
        Ok(Grants {
            tier,
            read_only,
            read_write,
            temp_workspace,
            run_name,
            tier_b_tmp,
            host_dirs,
            home,
            toolchains,
        })
    }

    /// A granted path, canonical; `None` for a read-only one that does not
    /// exist (it gives nothing).
    fn granted_path(
        &self,
        expanded: &str,
        writable: bool,
        home: Option<&Path>,
        uid: u32,
    ) -> Result<Option<PathBuf>, Denial> {
        let canonical = Path::new(expanded).canonicalize();
        if let Err(e) = &canonical {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                return Err(not_allowed(expanded, uid));
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
            return Ok(None);
        };
        if p == Path::new("/") {
            return denied(
                ErrorKind::WorkspaceScopeDenied,
                "scope.root",
                "/ cannot be granted as a whole, by any flag or key: grant the directories under it",
            );
        }
        // Deny beats allow: a grant cannot open a sensitive path.
        if self.rules.sensitive(&p, home) {
            return denied(
                ErrorKind::WorkspaceScopeDenied,
                "scope.sensitive_path",
                format!(
                    "{} is a sensitive path: sensitive paths are never granted, by any flag or key",
                    p.display()
                ),
            );
        }
        Ok(Some(p))
    }

    /// The executable: found where the sandbox would find it, inside a
    /// directory it may execute from, and on the allow-list if there is one.
    fn executable(
        &self,
        host: &Host,
        req: &RunRequest,
        view: &SandboxView,
        grants: &Grants,
        profile: &Profile,
        chain: Vec<PathBuf>,
    ) -> Result<PathBuf, Denial> {
        let program = resolve_program(&*host.files, &req.argv[0], &view.cwd, &view.search)?;
        let mut exec_roots: Vec<&PathBuf> = host.layout.canonical.iter().chain(&grants.read_only).collect();
        if profile.exec_in_writable {
            exec_roots.extend(&grants.read_write);
        }
        if !exec_roots.iter().any(|r| program.starts_with(r)) {
            let dir = program.parent().unwrap_or(&program).display().to_string();
            let why =
                format!("{} is outside the directories this sandbox may execute from", program.display());
            let denial = Denial::new(ErrorKind::PolicyDenied, "executables.not_visible", why);
            return Err(
                denial.with_fix(Some(format!("--read-only {dir}")), format!("read_only = [\"{dir}\"]"))
            );
        }
        // Read already, unless the sandbox's cwd finds another program.
        let chain =
            if chain.first() == Some(&program) { chain } else { toolchains::chain(&*host.files, &program) };
        if let Some(hidden) = chain.iter().skip(1).find(|i| !exec_roots.iter().any(|r| i.starts_with(r))) {
            let home = req.env.get("HOME").map(PathBuf::from);
            let show = toolchains::roots(hidden, home.as_deref(), true).swap_remove(0);
            let off = if profile.toolchains { "" } else { " (toolchains are off: --no-toolchains)" };
            let why = format!(
                "{} runs through the interpreter {}, which this sandbox does not see{off}",
                program.display(),
                hidden.display(),
            );
            let show = show.display();
            let denial = Denial::new(ErrorKind::PolicyDenied, "executables.interpreter_hidden", why);
            return Err(
                denial.with_fix(Some(format!("--read-only {show}")), format!("read_only = [\"{show}\"]"))
            );
        }
        validate::check_allowed(&program, &profile.allowed_executables)?;
        Ok(program)
    }

    /// Makes the command's toolchain visible read-only: for each link of
    /// its `chain` (the executable, its `#!` interpreters) that the sandbox
    /// would not see, and for each installation the caller's PATH leads to
    /// ([`toolchains::CallerTools`]), the directories it is installed in, unless one is
    /// sensitive or the broker's own (the executable's check then says
    /// what stays hidden).
    fn grant_toolchains(
        &self,
        host: &Host,
        chain: &[PathBuf],
        dirs: &RequestDirs,
        uid: u32,
        grants: &mut Grants,
    ) {
        let seen = |p: &Path, g: &Grants| {
            host.layout.canonical.iter().chain(&g.read_only).chain(&g.read_write).any(|r| p.starts_with(r))
        };
        let home = dirs.home.as_deref();
        let links = chain.iter().enumerate().filter(|(_, link)| !seen(link, grants));
        let from_links: Vec<PathBuf> =
            links.flat_map(|(i, link)| toolchains::roots(link, home, i > 0)).collect();
        // And the installations the caller's PATH leads to (a command run through `sh -c` or make).
        for root in from_links.into_iter().chain(dirs.tools.roots.iter().cloned()) {
            let granted = self.granted_path(&root.to_string_lossy(), false, home, uid);
            if let Ok(Some(p)) = granted {
                if check_not_owned(&p, &host.owned).is_ok() && !grants.read_only.contains(&p) {
                    grants.toolchains.push(p.clone());
                    grants.read_only.push(p);
                }
            }
        }
        drop_nested(&mut grants.read_only);
    }

    /// Interpreters (through launchers and `#!` lines) and inline code.
    fn check_interpreters(
        &self,
        files: &dyn HostFiles,
        req: &RunRequest,
        program: &Path,
        profile: &Profile,
    ) -> Result<(), Denial> {
        validate::check_interpreters(
            &self.rules,
            files,
            program,
            &req.argv,
            !req.stdin.is_empty() || req.stdin_streamed,
            profile.allow_interpreters,
            profile.allow_inline_code,
        )
    }

    /// The workspace scope: every path the arguments name lies in what the
    /// sandbox sees, and none is sensitive.
    fn check_scope(
        &self,
        host: &Host,
        req: &RunRequest,
        dirs: &RequestDirs,
        view: &SandboxView,
        grants: &Grants,
    ) -> Result<(), Denial> {
        let mut roots: Vec<PathBuf> = host.layout.canonical.clone();
        roots.extend(ETC_ENTRIES.iter().map(PathBuf::from));
        // Where /etc is a link (macOS: /private/etc), the entries as canonical paths name them.
        roots.extend(host.layout.etc.iter().map(PathBuf::from));
        roots.extend(grants.read_only.iter().cloned());
        roots.extend(grants.read_write.iter().cloned());
        roots.extend(grants.temp_workspace.iter().cloned());
        roots.push(PathBuf::from("/proc"));
        roots.extend(palisade_protocol::dev_entries().map(|d| Path::new("/dev").join(d)));
        let private = match grants.tier {
            Tier::C => vec![PathBuf::from("/tmp")],
            Tier::B => {
                roots.push(grants.tier_b_tmp.clone());
                vec![]
            }
        };
        let home = dirs.home.as_deref();
        validate::check_scope(&self.rules, &*host.files, &req.argv, &view.cwd, home, &roots, &private)
    }

    /// Sensitive entries inside a granted directory: at its top, in any home
    /// directory it holds, and the system's own (/etc/shadow, ...). Hidden
    /// in Tier C, a refusal in Tier B (which cannot hide them).
    fn hidden(
        &self,
        host: &Host,
        grants: &Grants,
        home: Option<&Path>,
    ) -> Result<Vec<(PathBuf, bool)>, Denial> {
        let granted: Vec<&PathBuf> = grants.read_write.iter().chain(&grants.read_only).collect();
        let mut hidden = Vec::new();
        for (root, p, is_dir) in sensitive_inside(&self.rules, host, &granted, home) {
            if grants.tier == Tier::B {
                return denied(
                    ErrorKind::WorkspaceScopeDenied,
                    "scope.sensitive_path",
                    format!(
                        "{} holds {}, which Tier B cannot hide from the sandbox: sensitive paths are never \
                         granted, by any flag or key; run it where Tier C is available, or from a directory \
                         that holds none",
                        root.display(),
                        p.display()
                    ),
                );
            }
            hidden.push((p, is_dir));
        }
        Ok(hidden)
    }

    /// What the host executes inside a tree the run writes in place (Tier
    /// C, `disk = "direct"`): each is mounted read-only over itself, the
    /// directories on the way to it pinned (see [`HostExecuted::in_tree`]),
    /// or the run is refused where mounts cannot hold it. What is hidden
    /// already needs none.
    fn held_in_place(
        &self,
        host: &Host,
        grants: &Grants,
        (disk, home): (DiskMode, Option<&Path>),
        hidden: &[(PathBuf, bool)],
    ) -> Result<InPlace, Denial> {
        let mut all = InPlace::default();
        if grants.tier != Tier::C || disk != DiskMode::Direct {
            return Ok(all);
        }
        for root in &grants.read_write {
            let room = MAX_HELD_IN_PLACE.saturating_sub(all.read_only.len() + all.pinned.len());
            let found = self
                .host_executed
                .in_tree(&*host.files, root, home, room)
                .map_err(|e| in_place_refusal(root, e))?;
            let hidden = |p: &PathBuf| hidden.iter().any(|(h, _)| p.starts_with(h));
            all.read_only.extend(found.read_only.into_iter().filter(|p| !hidden(p)));
            all.pinned.extend(found.pinned);
            all.code.extend(found.code);
        }
        Ok(all)
    }

    /// The run's limits: its deadline and output quota, the rlimits, and
    /// the sizes of its tmpfs mounts.
    fn limits(&self, req: &RunRequest, draft: &Draft) -> RunLimits {
        let (profile, grants, tier) = (&draft.profile, &draft.grants, draft.grants.tier);
        let process = &profile.capabilities.process;
        let timeout_secs =
            req.timeout_secs.map_or(process.max_execution_time, |t| t.min(process.max_execution_time));
        let max_output_bytes =
            req.max_output_bytes.map_or(profile.max_output_bytes, |m| m.min(profile.max_output_bytes));
        let overlays = match (tier, profile.disk) {
            (Tier::C, DiskMode::Overlay) => grants.read_write.len() as u64,
            _ => 0,
        };
        let memory_bytes = mib(process.max_memory_mb);
        let tmpfs = TmpfsSizes {
            tmp: mib(profile.tmp_size_mb),
            workspace: u64::from(grants.temp_workspace.is_some() && tier == Tier::C),
            // /dev/shm holds memory like any other: as much as the run may use.
            shm: memory_bytes,
        };
        // The overlays' writes are on disk (the broker's layers), bounded apart from memory.
        let disk_bytes = profile.max_disk_mb;
        let cgroup = draft.cgroup.is_some();
        let tmpfs = match (cgroup, tier) {
            // A cgroup charges tmpfs pages to the run; rlimits do not see them.
            (false, Tier::C) => tmpfs.fit_within(memory_bytes),
            _ => tmpfs,
        };
        let address_space_bytes = memory_bytes.saturating_mul(ADDRESS_SPACE_SLACK);
        let rlimits = Limits {
            memory_bytes: if cgroup { address_space_bytes } else { memory_bytes },
            address_space_bytes,
            cpu_seconds: timeout_secs,
            processes: if cgroup {
                process.max_processes.saturating_mul(PROCESSES_SLACK)
            } else {
                process.max_processes
            },
            open_files: profile.max_open_files,
            file_size_bytes: mib(profile.max_file_size_mb),
            tmp_bytes: tmpfs.tmp,
            shm_bytes: tmpfs.shm,
        };
        RunLimits {
            timeout_secs,
            max_output_bytes,
            memory_bytes,
            overlays,
            disk_bytes: mib(disk_bytes),
            tmpfs,
            rlimits,
        }
    }

    /// What the helper is to build: the sandbox's paths, ids, limits and
    /// mechanisms.
    fn jail_spec(
        &self,
        host: &Host,
        ctx: &Context,
        req: &RunRequest,
        draft: &Draft,
        limits: &RunLimits,
    ) -> Result<JailSpec, Denial> {
        let (grants, tier) = (&draft.grants, draft.grants.tier);
        let mut exec_dirs = grants.read_only.clone();
        if draft.profile.exec_in_writable {
            exec_dirs.extend(grants.read_write.iter().cloned());
        }
        // A system broker's sandboxes run as the requester's own block of host ids.
        let sandbox_ids = ctx
            .serves_others
            .then(|| self.config.broker.sandbox_ids.for_requester(ctx.requester.uid))
            .transpose()
            .map_err(|e| Denial::new(ErrorKind::Unauthorized, "broker.sandbox_ids", e))?;
        // Tier B has no user namespace to map a root broker's uid: the
        // command runs as the sandbox's ids on the host.
        let on_host = sandbox_ids.filter(|_| tier == Tier::B);
        Ok(JailSpec {
            tier,
            program: draft.program.to_string_lossy().into_owned(),
            argv: req.argv.clone(),
            env: draft.view.env.clone(),
            cwd: draft.view.cwd.clone(),
            read_write: match (&grants.temp_workspace, tier) {
                (Some(t), Tier::B) => grants.read_write.iter().cloned().chain([t.clone()]).collect(),
                _ => grants.read_write.clone(),
            },
            read_only: grants.read_only.clone(),
            exec_dirs,
            tmp_dir: Some(grants.tier_b_tmp.clone()),
            host_network: host_network(&draft.profile),
            limits: limits.rlimits.clone(),
            landlock_required: draft.landlock,
            hostname: HOSTNAME.into(),
            uid: on_host.map_or(ctx.uid, |ids| ids.uid),
            gid: on_host.map_or(ctx.gid, |ids| ids.gid),
            host_ids: sandbox_ids,
            acting_for: sandbox_ids.map(|_| ctx.requester),
            parent_pid: ctx.parent_pid,
            // cgroup v2: the helper joins through fd 5; v1: the broker places it.
            cgroup: draft.cgroup.as_ref().filter(|c| !c.v1).map(|c| c.path.to_string_lossy().into_owned()),
            no_fork: draft.profile.capabilities.process.no_fork,
            temp_workspace: if tier == Tier::C { grants.temp_workspace.clone() } else { None },
            write_bound: (limits.overlays > 0).then_some(limits.disk_bytes),
            hidden: draft.hidden.clone(),
            held: draft.held.read_only.clone(),
            pinned: draft.held.pinned.clone(),
            home: grants.home.clone(),
            etc_view: ctx.etc_view.clone(),
            layout: host.layout.clone(),
            listeners: draft.egress.as_ref().map_or_else(Vec::new, EgressPlan::listeners),
            // The network namespace already holds the boundary; Landlock's
            // TCP rules are a second one where the kernel has them.
            tcp_connect: draft.egress.as_ref().map(EgressPlan::connect_ports),
            files: match &draft.egress {
                Some(_) => vec![(RESOLV_CONF.to_string(), EgressPlan::resolv_conf())],
                None => vec![],
            },
            umask: req.umask,
            terminal: req.terminal,
        })
    }

    /// The plan, and the run as the broker, the attestation and `palisade
    /// explain` see it.
    fn plan(
        &self,
        host: &Host,
        ctx: &Context,
        req: &RunRequest,
        draft: Draft,
        limits: RunLimits,
        dirs: &RequestDirs,
    ) -> Result<Resolved, Denial> {
        let spec = self.jail_spec(host, ctx, req, &draft, &limits)?;
        let plan = build_plan(&spec).map_err(|e| Denial::new(e.kind(), e.rule(), e.to_string()))?;
        let Draft { profile, egress, warnings, grants, cgroup, held, .. } = draft;
        let labels = Labels {
            tier: grants.tier,
            host_network: spec.host_network,
            cgroup: cgroup.as_ref(),
            memory_bytes: limits.memory_bytes,
            address_space_bytes: limits.rlimits.address_space_bytes,
            tmpfs: limits.tmpfs,
            disk_bytes: limits.disk_bytes,
            disk: profile.disk,
        };
        let network = labels.network(&profile.capabilities.network, profile.egress, egress.as_ref());
        let disk = labels.disk(grants.temp_workspace.is_some(), !grants.read_write.is_empty());
        let memory = labels.memory();
        let mut notes = Vec::new();
        if cgroup.is_none() && !host.capabilities.seatbelt {
            notes.push(format!(
                "memory: no cgroup holds this run, so its limit of {} MiB holds each process (RLIMIT_DATA), \
                 not the process tree; an overrun fails an allocation in the program (a MemoryError) instead \
                 of ending the run (`palisade doctor` says how to give runs a cgroup: [broker] cgroup_root)",
                limits.memory_bytes >> 20
            ));
        }
        let writable = grants.read_write;
        let granted = writable.iter().chain(&spec.read_only).cloned().collect();
        Ok(Resolved {
            plan,
            writable,
            granted,
            host_dirs: grants.host_dirs,
            home: grants.home,
            toolchains: grants.toolchains,
            timeout: Duration::from_secs(limits.timeout_secs),
            max_output_bytes: limits.max_output_bytes,
            capture_chunk_bytes: self.config.policy.capture_chunk_bytes.max(MIN_CAPTURE_CHUNK_BYTES),
            cgroup,
            tool: profile.tool,
            capabilities: profile.capabilities,
            network,
            egress: profile.egress,
            egress_plan: egress,
            disk,
            memory,
            warnings,
            notes,
            escalation: None,
            workspace: dirs.workspace.clone(),
            requester: ctx.requester,
            cedar: None,
            keep_changes: profile.keep_changes,
            on_conflict: profile.on_conflict,
            in_place: grants.tier == Tier::B || profile.disk == DiskMode::Direct,
            in_place_code: held.code,
        })
    }
}

impl RequestDirs {
    /// The request's cwd (required) and workspace (the cwd by default),
    /// each an absolute directory, canonical. `root`: the broker serves
    /// other users (a system service, which may see another file system).
    fn of(
        files: &dyn HostFiles,
        req: &RunRequest,
        (uid, root): (u32, bool),
        homes: &[PathBuf],
    ) -> Result<RequestDirs, Denial> {
        let Some(cwd) = &req.cwd else {
            return denied(
                ErrorKind::InvalidRequest,
                "request.cwd",
                "the request names no cwd (an absolute directory)",
            );
        };
        let cwd = absolute_dir(files, cwd, "cwd", uid, root)?;
        let workspace = match &req.workspace {
            Some(w) => absolute_dir(files, &cwd.join(w).to_string_lossy(), "workspace", uid, root)?,
            None => cwd.clone(),
        };
        let tools = toolchains::CallerTools::of(files, &req.env, homes);
        Ok(RequestDirs { cwd, workspace, home: req.env.get("HOME").map(PathBuf::from), tools })
    }
}

/// The name of the home of `workspace` under the profile of `[table]`
/// among the homes: the workspace's last component (for a person to
/// recognise), then the profile's name unless it is the defaults, and a
/// hash of both (FNV-1a, 64 bits: stable, so that the next run finds it).
pub fn home_name(workspace: &Path, table: &str) -> String {
    let bytes = workspace.as_os_str().as_encoded_bytes().iter().chain(&[0u8]).chain(table.as_bytes());
    let hash =
        bytes.fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3));
    let clean = |s: &str| -> String {
        s.chars().filter(|c| c.is_alphanumeric() || "_-".contains(*c)).take(40).collect()
    };
    let base = workspace.file_name().map(|n| clean(&n.to_string_lossy())).filter(|b| !b.is_empty());
    let base = base.unwrap_or_else(|| "root".into());
    match table.strip_prefix("defaults") {
        Some("") => format!("{base}-{hash:016x}"),
        _ => format!("{base}.{}-{hash:016x}", clean(table.rsplit('.').next().unwrap_or(table))),
    }
}

/// The tier: C where the host has user namespaces; B under Seatbelt, which
/// is that system's jail and no fallback; else what the fallback policy
/// says. Strict egress needs Tier C's network namespace.
fn choose_tier(
    policy: &PolicyConfig,
    host: &HostCapabilities,
    egress: EgressMode,
) -> Result<TierChoice, Denial> {
    let (mut warnings, mut approval) = (Vec::new(), None);
    let tier = if host.user_namespaces {
        Tier::C
    } else if host.seatbelt {
        Tier::B
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
                // What the run's result says once it is approved.
                warnings.push(format!(
                    "{why}: running in Tier B (Landlock, seccomp, rlimits; no namespaces), as approved"
                ));
                Tier::B
            }
            FallbackPolicy::WarnAndExecute => {
                warnings
                    .push(format!("{why}: running in Tier B (Landlock, seccomp, rlimits; no namespaces)"));
                Tier::B
            }
        }
    };
    if egress == EgressMode::Strict && tier != Tier::C {
        return denied(
            ErrorKind::Unavailable,
            "egress.strict_unavailable",
            "egress = strict needs a network namespace, which this host cannot create: \
             Tier B cannot have strict egress",
        );
    }
    Ok(TierChoice { tier, warnings, approval })
}

/// A terminal is a pseudo-terminal of the sandbox's own devpts: Tier C's
/// private /dev. Elsewhere it would be the host's, and it is refused.
fn terminal(req: &RunRequest, tier: Tier) -> Result<(), Denial> {
    let Some(size) = req.terminal else { return Ok(()) };
    if let Err(e) = size.check() {
        return denied(ErrorKind::InvalidRequest, "request.terminal", e);
    }
    if tier != Tier::C {
        return denied(
            ErrorKind::Unavailable,
            "terminal.unavailable",
            "a terminal is one of the sandbox's own, in Tier C's private /dev, and this run's \
             sandbox has no /dev of its own: run it without one (palisade run -T)",
        );
    }
    Ok(())
}

/// Under Seatbelt (macOS) allowed domains are refused: its profile could
/// only open the host's whole network, every address the Mac's own local
/// services included, with the names checked on the command line alone.
/// Refused until strict egress's proxy serves macOS, never loosened.
fn seatbelt_network(host: &HostCapabilities, network: &NetworkCapability) -> Result<(), Denial> {
    if !host.seatbelt || !matches!(network, NetworkCapability::AllowDomains(_)) {
        return Ok(());
    }
    denied(
        ErrorKind::Unavailable,
        "egress.domains_unenforced",
        "network = { allow_domains = [...] } cannot be enforced on macOS: Seatbelt would open the \
         host's whole network (any address, the Mac's own local services included) and only the names \
         on the command line would be checked; palisade refuses it there until its egress proxy \
         serves macOS. Use network = \"deny\", or network = \"allow_all\" knowing it is the whole \
         network",
    )
}

impl SandboxView {
    /// The working directory inside (the client's when the sandbox can see
    /// it), and the environment the command will see.
    fn new(
        host: &Host,
        req: &RunRequest,
        dirs: &RequestDirs,
        grants: &Grants,
        profile: &Profile,
    ) -> SandboxView {
        let Grants { read_only, read_write, temp_workspace, .. } = grants;
        let visible_dirs: Vec<&PathBuf> = read_write.iter().chain(read_only).chain(temp_workspace).collect();
        let cwd = if visible_dirs.iter().any(|d| dirs.cwd.starts_with(d)) {
            dirs.cwd.clone()
        } else if let Some(t) = temp_workspace {
            t.clone()
        } else {
            read_write.first().or(read_only.first()).cloned().unwrap_or_else(|| PathBuf::from("/"))
        };
        let home = (temp_workspace.clone().or_else(|| grants.home.clone()))
            .or_else(|| read_write.first().cloned())
            .unwrap_or_else(|| cwd.clone());
        let env: Vec<(String, String)> = match profile.capabilities.environment {
            EnvironmentCapability::None => vec![],
            EnvironmentCapability::Restricted => {
                let mut env = vec![
                    ("PATH".to_string(), sandbox_path(host, grants, &dirs.tools)),
                    ("HOME".to_string(), home.to_string_lossy().into_owned()),
                ];
                if profile.toolchains {
                    let shown = |d: &PathBuf| read_only.iter().any(|r| r.starts_with(d) || d.starts_with(r));
                    let vars = dirs.tools.env.iter().filter(|(_, d)| shown(d));
                    env.extend(vars.map(|(k, d)| (k.to_string(), d.to_string_lossy().into_owned())));
                }
                for key in ["USER", "LANG", "TERM"] {
                    if let Some(v) = req.env.get(key) {
                        env.push((key.to_string(), v.clone()));
                    }
                }
                // Asked for by name (checked against the profile's pass_env):
                // the client's value, over the sandbox's own.
                for key in &req.pass_env {
                    if let Some(v) = req.env.get(key) {
                        env.retain(|(k, _)| k != key);
                        env.push((key.clone(), v.clone()));
                    }
                }
                if grants.tier == Tier::B {
                    env.push(("TMPDIR".to_string(), grants.tier_b_tmp.to_string_lossy().into_owned()));
                }
                env
            }
            EnvironmentCapability::Full => req.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        };
        SandboxView { cwd, env, search: dirs.tools.path.clone() }
    }
}

/// The sandbox's `PATH`: the caller's entries the sandbox sees (the
/// system's, the grants, the toolchains shown), in the caller's order,
/// then those of [`SANDBOX_PATH`] it lacks.
fn sandbox_path(host: &Host, grants: &Grants, caller: &toolchains::CallerTools) -> String {
    let Grants { read_only, read_write, temp_workspace, .. } = grants;
    let visible: Vec<&PathBuf> =
        host.layout.canonical.iter().chain(read_only).chain(read_write).chain(temp_workspace).collect();
    let sees = |c: &Option<PathBuf>| c.as_ref().is_some_and(|c| visible.iter().any(|v| c.starts_with(v)));
    let seen = caller.path.iter().zip(&caller.canonical).filter(|(_, c)| sees(c)).map(|(d, _)| d.clone());
    let mut path: Vec<String> = Vec::new();
    for dir in seen.chain(SANDBOX_PATH.split(':').map(PathBuf::from)) {
        let dir = dir.to_string_lossy().into_owned();
        if !dir.contains(':') && !path.contains(&dir) {
            path.push(dir);
        }
    }
    path.join(":")
}

/// Landlock features the policy requires, against what this kernel has.
fn required_landlock(
    policy: &PolicyConfig,
    tier: Tier,
    host: &HostCapabilities,
) -> Result<LandlockFeatures, Denial> {
    let abi = host.landlock_abi;
    let mut required = policy.required_landlock();
    if tier == Tier::B {
        // Without namespaces, Landlock is the filesystem boundary: a Tier B
        // run without it would see the whole host. Never optional.
        required = required.union(LandlockFeatures::FS);
    }
    if host.seatbelt {
        // The profile written from the plan's Landlock lists enforces them.
        return Ok(required);
    }
    let missing = required.difference(LandlockFeatures::supported_by_abi(abi));
    if !missing.is_empty() {
        return denied(
            ErrorKind::Unavailable,
            "landlock.unsupported",
            format!(
                "the policy requires Landlock {missing}, which this kernel (Landlock ABI {abi}) cannot enforce: \
                 no flag makes the kernel enforce it (a newer kernel does)"
            ),
        );
    }
    Ok(required)
}

/// The run's cgroup, where the host has a subtree for runs; a refusal where
/// the profile requires one and there is none.
fn cgroup_plan(
    host: &HostCapabilities,
    run_name: &str,
    profile: &Profile,
) -> Result<Option<CgroupPlan>, Denial> {
    let process = &profile.capabilities.process;
    match &host.cgroup {
        Ok(root) => Ok(Some(CgroupPlan {
            path: root.path.join(run_name),
            name: run_name.to_string(),
            v1: root.v1,
            memory_bytes: mib(process.max_memory_mb),
            processes: process.max_processes,
            cpu_percent: process.max_cpu_percent,
        })),
        Err(why) if profile.require_cgroup => denied(
            ErrorKind::Unavailable,
            "cgroup.unavailable",
            format!(
                "the policy requires cgroup limits, and this broker has no usable cgroup: {why} \
                 (`palisade doctor` prints the lines that give runs one: [broker] cgroup_root)"
            ),
        )
        .map_err(|d: Denial| d.with_fix(None, "require_cgroup = false")),
        Err(_) => Ok(None),
    }
}

/// Whether the sandbox keeps the host's network.
fn host_network(profile: &Profile) -> bool {
    match (&profile.capabilities.network, profile.egress) {
        (NetworkCapability::AllowAll, _) => true,
        (NetworkCapability::AllowDomains(_), EgressMode::Strict) => false,
        (NetworkCapability::AllowDomains(_), _) => true,
        (NetworkCapability::Deny, _) => false,
    }
}

/// What a run's attestation and explanation say was in force.
struct Labels<'a> {
    tier: Tier,
    host_network: bool,
    cgroup: Option<&'a CgroupPlan>,
    memory_bytes: u64,
    address_space_bytes: u64,
    tmpfs: TmpfsSizes,
    disk_bytes: u64,
    disk: DiskMode,
}

impl Labels<'_> {
    fn network(
        &self,
        capability: &NetworkCapability,
        egress: EgressMode,
        plan: Option<&EgressPlan>,
    ) -> Network {
        if let Some(p) = plan {
            return Network::StrictDomains {
                domains: p.domains.clone(),
                ports: p.ports.clone(),
                transparent: p.transparent,
            };
        }
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
            (Tier::C, DiskMode::Overlay, true) => Some(WritableDirs::Layers { bound_bytes: self.disk_bytes }),
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
            upper_layers: None,
            shm: t.shm,
        };
        let (data, address_space) = (self.memory_bytes, self.address_space_bytes);
        match (self.cgroup, self.tier) {
            (Some(c), _) => Memory::Cgroup { v1: c.v1, bytes: self.memory_bytes },
            (None, Tier::C) => Memory::Rlimit { data, address_space, tmpfs: Some(budget) },
            (None, Tier::B) => Memory::Rlimit { data, address_space, tmpfs: None },
        }
    }
}

/// Egress preflight: every host the command line names is on the allow-list,
/// and no option of a known tool sends a connection somewhere it does not
/// name. (The host's network is given: this checks names, not connections.)
fn check_egress(argv: &[String], profile: &Profile) -> Result<(), Denial> {
    if profile.egress == EgressMode::None {
        return Ok(());
    }
    let network = &profile.capabilities.network;
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
        Some(host) => {
            let why = format!("network access to {host} is not allowed (network: {network})");
            let denial = Denial::new(ErrorKind::CapabilityDenied, "egress.host_not_allowed", why);
            let key = format!("network = {{ allow_domains = [\"{host}\"] }}");
            Err(denial.with_fix(Some(format!("--allow-domain {host}")), key))
        }
        None => Ok(()),
    }
}

/// The sizes of a Tier C run's tmpfs mounts.
#[derive(Debug, Clone, Copy)]
struct TmpfsSizes {
    /// `/tmp`, and a temporary workspace when there is one (`workspace` is 1).
    tmp: u64,
    workspace: u64,
    shm: u64,
}

impl TmpfsSizes {
    fn total(&self) -> u64 {
        self.tmp.saturating_mul(1 + self.workspace).saturating_add(self.shm)
    }

    /// Within `budget` bytes together (0: no limit), for a run whose memory
    /// no cgroup bounds (rlimits do not count tmpfs pages): /tmp, the
    /// temporary workspace keep their sizes
    /// when they fit, and /dev/shm gets what is left of the budget; when they
    /// do not fit, all of them, /dev/shm included, are scaled down in
    /// proportion.
    fn fit_within(self, budget: u64) -> TmpfsSizes {
        const PAGE: u64 = 4096;
        if budget == 0 || self.total() <= budget {
            return self;
        }
        // Down to whole MiB where there is one (the attestation then reads
        // "73 MiB", not "74896 KiB"), else to whole pages, at least one.
        let round = |b: u64| if b >= mib(1) { b / mib(1) * mib(1) } else { (b / PAGE * PAGE).max(PAGE) };
        let fixed = self.total() - self.shm;
        if fixed + PAGE <= budget {
            return TmpfsSizes { shm: round(budget - fixed), ..self };
        }
        let total = self.total();
        let scale = |b: u64| round((u128::from(b) * u128::from(budget) / u128::from(total)) as u64);
        TmpfsSizes { tmp: scale(self.tmp), shm: scale(self.shm), ..self }
    }
}

/// Why a tree cannot be written in place: `scope.host_executed`, in words.
fn in_place_refusal(root: &Path, e: InTree) -> Denial {
    let how = "a run writing in place (disk = \"direct\")";
    let why = match e {
        InTree::Itself(what) => format!("{} is {what}, which {how} would write on the host", root.display()),
        InTree::Link(link) => format!(
            "{} is a symbolic link where the host executes, or on the way there, which {how} could \
             replace: a mount holds what a link names, never the link",
            link.display()
        ),
        InTree::Linked(file) => format!(
            "{} is a file the host executes with another name (a hard link), through which {how} \
             could write it",
            file.display()
        ),
        InTree::Name(path) => {
            format!("{} is a name that is not UTF-8, which no mount of a plan names", path.display())
        }
        InTree::TooMany(_) => format!(
            "{} holds more paths the host executes than {MAX_HELD_IN_PLACE} mounts hold (git \
             directories, .envrc, editors' and agents' settings, and the directories on the way \
             to each), which {how} finds read-only by a mount each",
            root.display()
        ),
    };
    let why = format!("{why}: run it with a change set (without --direct), where such writes are held");
    Denial::new(ErrorKind::WorkspaceScopeDenied, "scope.host_executed", why)
}

/// What the broker owns inside the grants (its state, journal, secrets,
/// socket, configuration, ...), to hide, or the refusal (a grant of one is
/// refused by [`check_not_owned`]). Inside a grant, one is hidden by an
/// empty mount (Tier C), which holds where the run's writes go to an overlay
/// (whatever it does there, the broker applies nothing there: see the
/// copy-back), but not where it writes in place (Tier B, `disk = "direct"`):
/// there it could move a directory on the way and put its own in the place
/// the broker reads, so such a grant is refused, naming what it holds.
fn broker_owned_inside(host: &Host, grants: &Grants, disk: DiskMode) -> Result<Vec<(PathBuf, bool)>, Denial> {
    let refuse = |reason: String| denied(ErrorKind::WorkspaceScopeDenied, BROKER_STATE_RULE, reason);
    let mut hidden = Vec::new();
    let writable = grants.read_write.iter().map(|g| (g, true));
    for (grant, writable) in writable.chain(grants.read_only.iter().map(|g| (g, false))) {
        for owned in host.owned.iter() {
            // A program of the broker's is no secret: only writing it matters.
            if !owned.path.starts_with(grant) || !owned.hidden && !writable {
                continue;
            }
            if writable && (grants.tier == Tier::B || disk == DiskMode::Direct) {
                let how = if grants.tier == Tier::B { "Tier B" } else { "disk = \"direct\"" };
                return refuse(format!(
                    "{} holds {} ({}), which a run writing in place ({how}) could reach: \
                     choose a workspace that does not hold it",
                    grant.display(),
                    owned.what,
                    owned.path.display()
                ));
            }
            if !owned.hidden {
                // Under an overlay the copy-back never writes it.
                continue;
            }
            if let Ok(meta) = host.files.lstat(&owned.path) {
                if grants.tier == Tier::B {
                    return refuse(format!(
                        "{} holds {} ({}), which Tier B cannot hide from the sandbox: what the broker keeps \
                         is nobody's workspace; run it where Tier C is available, or from a directory that \
                         holds none",
                        grant.display(),
                        owned.what,
                        owned.path.display()
                    ));
                }
                if !hidden.iter().any(|(p, _)| *p == owned.path) {
                    hidden.push((owned.path.clone(), meta.is_dir()));
                }
            }
        }
    }
    Ok(hidden)
}

/// Refuses a grant that is, or lies inside, what the broker keeps.
fn check_not_owned(grant: &Path, owned: &[OwnedPath]) -> Result<(), Denial> {
    let Some(owned) = owned.iter().find(|o| grant.starts_with(&o.path)) else { return Ok(()) };
    let place = if grant == owned.path { "is" } else { "lies inside" };
    denied(
        ErrorKind::WorkspaceScopeDenied,
        BROKER_STATE_RULE,
        format!(
            "{} {place} {} ({}): what the broker keeps is nobody's workspace",
            grant.display(),
            owned.what,
            owned.path.display()
        ),
    )
}

/// The rule that refuses a grant of, or around, what the broker owns.
pub const BROKER_STATE_RULE: &str = "scope.broker_state";

/// The existing sensitive paths that granted directories would expose, each
/// with its granted directory and whether it is a directory: the sensitive
/// names at a granted directory's top and in every home directory inside it
/// (the users' of /etc/passwd and the request's `HOME`), a home's names
/// under a grant inside that home (`~/.config` shows no `gh`), and the absolute
/// sensitive paths under it (`/etc/shadow`, configured ones, ...). Deeper
/// copies elsewhere in a tree are not searched for (that would walk the
/// whole tree at every run); naming one in the command line is refused.
fn sensitive_inside<'a>(
    rules: &Rules,
    host: &Host,
    granted: &[&'a PathBuf],
    home: Option<&Path>,
) -> Vec<(&'a PathBuf, PathBuf, bool)> {
    let files = &*host.files;
    let mut homes = host.homes.clone();
    homes.extend(home.and_then(|h| h.canonicalize().ok()));
    let absolute = rules.absolute_sensitive(home);
    let mut found: Vec<(&PathBuf, PathBuf, bool)> = Vec::new();
    let mut add = |root: &'a PathBuf, p: PathBuf| {
        if let Ok(meta) = files.lstat(&p) {
            if !found.iter().any(|(_, q, _)| *q == p) {
                found.push((root, p, meta.is_dir()));
            }
        }
    };
    for &root in granted {
        // The grant, the homes inside it, and a home it lies inside
        // (`~/.config`): each one's names that fall under the grant.
        let around = homes.iter().filter(|h| *h != root && (h.starts_with(root) || root.starts_with(h)));
        for base in std::iter::once(root).chain(around) {
            let home_names = if homes.contains(base) { HOME_SENSITIVE_NAMES } else { &[] };
            for name in SENSITIVE_NAMES.iter().chain(home_names) {
                let p = base.join(name);
                if p.starts_with(root) && p != *root {
                    add(root, p);
                }
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
                for entry in files.list_dir(dir) {
                    if glob.is_match(&entry) {
                        add(root, dir.join(entry));
                    }
                }
            }
        }
    }
    found
}

/// A parameter bound to a filesystem capability, and where its paths are
/// taken from.
struct Bound<'a> {
    param: &'a str,
    binding: &'a Binding,
    cwd: &'a Path,
    home: Option<&'a Path>,
    uid: u32,
}

impl Bound<'_> {
    /// The paths `value` names, validated.
    fn paths(
        &self,
        files: &dyn HostFiles,
        rules: &Rules,
        value: &ParamValue,
    ) -> Result<Vec<PathBuf>, Denial> {
        let param = self.param;
        let values: Vec<&String> = match (value, self.binding.mapping) {
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
        values.into_iter().map(|v| self.path(files, rules, v)).collect()
    }

    /// One path of the parameter: not sensitive, reachable, of the kind the
    /// binding validates, and not `/`.
    fn path(&self, files: &dyn HostFiles, rules: &Rules, v: &str) -> Result<PathBuf, Denial> {
        let (param, home) = (self.param, self.home);
        if v.contains('\0') || v.is_empty() {
            return denied(
                ErrorKind::InvalidRequest,
                "tools.parameter_validation",
                format!("parameter {param}: {v:?} is not a path"),
            );
        }
        let p = paths::resolve(v, self.cwd, home);
        if rules.sensitive(&p, home) || rules.sensitive(&paths::resolve_lexically(v, self.cwd, home), home) {
            return denied(
                ErrorKind::WorkspaceScopeDenied,
                "scope.sensitive_path",
                format!(
                    "parameter {param}: {v} is a sensitive path: sensitive paths are never granted, by any flag or key"
                ),
            );
        }
        let meta = files.stat(&p);
        if meta.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied) {
            return Err(not_allowed(&format!("parameter {param}: {v}"), self.uid));
        }
        let validation = self.binding.validation;
        let ok = match (validation, meta) {
            (_, Err(_)) => false,
            (Validation::IsFile, Ok(m)) => m.is_file(),
            (Validation::IsDirectory, Ok(m)) => m.is_dir(),
            (Validation::IsPath, Ok(_)) => true,
        };
        if !ok {
            let want = match validation {
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
                format!("parameter {param}: / cannot be granted, by any flag or key"),
            );
        }
        Ok(p)
    }
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

/// Rule of a cwd or workspace a root broker does not find: it sees another
/// file system than its client (a system service's own /tmp and /var/tmp).
pub const NOT_VISIBLE_RULE: &str = "request.not_visible";

fn absolute_dir(
    files: &dyn HostFiles,
    path: &str,
    what: &str,
    uid: u32,
    root: bool,
) -> Result<PathBuf, Denial> {
    if !path.starts_with('/') {
        return denied(ErrorKind::InvalidRequest, "request.path", format!("{what} {path:?} is not absolute"));
    }
    let p = Path::new(path).canonicalize().map_err(|e| match e.kind() {
        std::io::ErrorKind::PermissionDenied => not_allowed(&format!("{what} {path}"), uid),
        std::io::ErrorKind::NotFound if root => Denial::new(
            ErrorKind::InvalidRequest,
            NOT_VISIBLE_RULE,
            format!(
                "{what} {path}: the broker does not find it; if it is there for you, the broker \
                 sees another file system: the system service (palisade.service) has a /tmp and \
                 /var/tmp of its own and serves no workspace there; use one under /home or /srv, \
                 or a directory added to the service's ReadWritePaths (systemctl edit palisade.service)"
            ),
        ),
        _ => Denial::new(ErrorKind::InvalidRequest, "request.path", format!("{what} {path}: {e}")),
    })?;
    if !files.stat(&p).is_ok_and(|m| m.is_dir()) {
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
pub fn resolve_program(
    files: &dyn HostFiles,
    command: &str,
    cwd: &Path,
    path: &[PathBuf],
) -> Result<PathBuf, Denial> {
    let not_found = |why: String| Denial::new(ErrorKind::InvalidRequest, "command.not_found", why);
    if command.contains('/') {
        let p = cwd.join(command);
        let c = files.canonicalize(&p).map_err(|_| not_found(format!("command not found: {command}")))?;
        validate::resolve_executable(files, &c.to_string_lossy()).map_err(not_found)
    } else {
        // As the caller's shell would: the first in its PATH, else in the sandbox's default one.
        let is_executable = |p: &Path| files.stat(p).is_ok_and(|m| m.is_executable());
        let first = path.iter().map(|d| d.join(command)).find(|p| is_executable(p));
        match first.and_then(|p| files.canonicalize(&p).ok()) {
            Some(found) if is_executable(&found) => Ok(found),
            _ => validate::resolve_executable(files, command),
        }
        .map_err(|_| not_found(format!("command not found: {command}")))
    }
}

mod asks;
mod cedar_run;
pub mod explain;
mod git;
mod toolchains;

#[cfg(test)]
pub(crate) mod table;

#[cfg(test)]
mod tests {
    use super::TmpfsSizes;

    const MIB: u64 = 1 << 20;

    fn sizes(tmp: u64, shm: u64) -> TmpfsSizes {
        TmpfsSizes { tmp: tmp * MIB, workspace: 0, shm: shm * MIB }
    }

    /// Without a cgroup the tmpfs mounts hold memory that no rlimit counts:
    /// together they stay within the run's memory limit. (An overlay's
    /// writes are on disk, bounded apart.)
    #[test]
    fn tmpfs_sizes_fit_the_memory_limit_together() {
        // All fit: unchanged.
        let s = sizes(64, 64).fit_within(512 * MIB);
        assert_eq!((s.tmp, s.shm), (64 * MIB, 64 * MIB));
        // /tmp fits: /dev/shm gets what is left.
        let s = sizes(256, 512).fit_within(512 * MIB);
        assert_eq!((s.tmp, s.shm), (256 * MIB, 256 * MIB));
        // Nothing fits: all scaled, each at least a page, the sum within the limit.
        for budget in [4096, 64 * MIB, 512 * MIB, 3 * MIB + 17] {
            let mut with_ws = sizes(1024, 512);
            with_ws.workspace = 1;
            for s in [sizes(1024, 512), with_ws] {
                let f = s.fit_within(budget);
                assert!(f.tmp >= 4096 && f.shm >= 4096, "{f:?}");
                // Whole MiB from one MiB up: the attestation names them so.
                assert!([f.tmp, f.shm].iter().all(|b| *b < MIB || b % MIB == 0), "{f:?}");
                assert!(f.total() <= budget.max(4096 * (2 + s.workspace)), "{f:?} over {budget}");
            }
        }
        // No limit: unchanged.
        let s = sizes(256, 0).fit_within(0);
        assert_eq!(s.tmp, 256 * MIB);
    }
}
