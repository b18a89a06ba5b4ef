//! Tier A: WebAssembly skill plugins. The broker keeps the skills index,
//! the module cache, the secret store and each requester's storage of each
//! skill, decides a call's grants and limits, serves its host functions,
//! and runs it in the plugin-host (a process of its own in a Tier C jail;
//! wasmtime never enters the broker).

pub mod cache;
pub mod host;
pub mod hostfn;
pub mod http;
pub mod index;
pub mod store;

use crate::engine::cgroup::{CgroupLimits, Cgroups, RunCgroup};
use crate::engine::spawn_thread::Spawner;
use cache::{Artifact, CacheError, ModuleCache};
use host::{HostError, Running};
use hostfn::CallContext;
use index::{Index, IndexError, sha256_hex};
use palisade_policy::config::{Config, EgressConfig, PluginsConfig};
use palisade_policy::plugins::{DEFAULT_ENTRY, PLUGIN_HOST_PROCESSES, PluginHostJail, Requested};
use palisade_policy::{EgressPlan, PluginGrants, plugin_host_plan};
use palisade_protocol::plugin::{
    CallOutcome, FromHost, PluginAttestation, PluginCall, PluginGrantsInForce, PluginHostCgroup,
    PluginLimits, ToHost,
};
use palisade_protocol::wire::{ErrorKind, ErrorReply};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use store::{Secrets, Storage};
use tokio::time::Instant;

/// How long past its deadline the broker waits for the plugin-host to end a
/// call itself (epoch interruption) before it kills the host.
const DEADLINE_GRACE: Duration = Duration::from_secs(2);
/// How long compiling a module may take.
const COMPILE_TIMEOUT: Duration = Duration::from_secs(60);
/// The skills index's directory under the state directory.
pub const SKILLS_DIR: &str = "skills";
pub use crate::host::paths::SECRETS_DIR;
/// WebAssembly text starts with a parenthesis (after blanks); anything else inline is base64.
const WAT_START: u8 = b'(';

/// What a call asks (`ClientMessage::RunPlugin`).
pub struct CallRequest {
    pub skill: String,
    pub input: String,
    pub inline_module: Option<String>,
    pub timeout_ms: Option<u64>,
}

/// A call's answer (`ServerMessage::PluginResult`).
pub struct CallResult {
    pub output: String,
    pub fuel_used: u64,
    pub memory_peak_bytes: u64,
    /// Inside the plugin-host, microseconds.
    pub instantiate_us: u64,
    pub call_us: u64,
    pub attestation: PluginAttestation,
}

impl From<CallResult> for palisade_protocol::wire::ServerMessage {
    fn from(r: CallResult) -> Self {
        palisade_protocol::wire::ServerMessage::PluginResult {
            output: r.output,
            fuel_used: r.fuel_used,
            memory_peak_bytes: r.memory_peak_bytes,
            instantiate_us: r.instantiate_us,
            call_us: r.call_us,
            attestation: Box::new(r.attestation),
        }
    }
}

/// The module a call runs, verified, and what it may use.
struct Prepared {
    skill: String,
    module: Vec<u8>,
    sha256: String,
    entry: String,
    grants: PluginGrants,
    /// An installed skill's (its artifact is cached), not the request's own module.
    installed: bool,
}

pub struct Plugins {
    pub config: PluginsConfig,
    pub index: Index,
    pub secrets: Secrets,
    /// The compiled modules, authenticated (`cache.rs`).
    cache: Arc<ModuleCache>,
    egress: EgressConfig,
    host_program: PathBuf,
    helper: PathBuf,
    spawner: Spawner,
    /// The broker's ids and pid, and a root broker's host ids for the plugin-host.
    ids: (u32, u32, u32, Option<palisade_protocol::HostIds>),
    /// Where the plugin-host's own cgroup is created, when there is one.
    cgroups: Cgroups,
    /// The plugin-host, started at the first call; `None` after it died.
    host: tokio::sync::Mutex<Option<Running>>,
    next_call: AtomicU64,
    /// Plugin-hosts started (each names its cgroup).
    next_host: AtomicU64,
}

/// The state directory's skills index and secret store (`[plugins] skills_dir` first).
pub fn dirs(config: &PluginsConfig) -> Result<(PathBuf, PathBuf), String> {
    let state = crate::host::paths::default_state_dir();
    let skills = match &config.skills_dir {
        Some(d) => d.clone(),
        None => state.clone()?.join(SKILLS_DIR),
    };
    let secrets = match &config.secrets_dir {
        Some(d) => d.clone(),
        None => state?.join(SECRETS_DIR),
    };
    Ok((skills, secrets))
}

pub use crate::host::paths::plugin_host as host_program;

fn refusal(kind: ErrorKind, message: impl Into<String>, rule: &str) -> ErrorReply {
    ErrorReply::with_rule(kind, message, rule)
}

impl Plugins {
    pub fn new(
        config: &Config,
        spawner: Spawner,
        helper: &Path,
        parent_pid: u32,
        cgroups: Cgroups,
    ) -> Result<Plugins, String> {
        // Disabled plugins need no state directory (the CLI's `plugin install` names its own errors).
        let (skills, secrets) = match dirs(&config.plugins) {
            Ok(d) => d,
            Err(e) if config.plugins.enabled => return Err(format!("[plugins]: {e}")),
            Err(_) => (PathBuf::from("/nonexistent/skills"), PathBuf::from("/nonexistent/secrets")),
        };
        let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let host_ids = match crate::host::privilege::serves_others() {
            true => Some(config.broker.sandbox_ids.for_requester(0)?),
            false => None,
        };
        let index = Index { dir: skills };
        let cache = match ModuleCache::new(index.cache_dir(), &secrets, config.plugins.cache_max_bytes) {
            Ok(c) => c.read_by(host_ids.map(|h| h.gid)),
            Err(e) if config.plugins.enabled => return Err(format!("[plugins]: {e}")),
            // Disabled: never used.
            Err(_) => ModuleCache::new(index.cache_dir(), Path::new("/nonexistent/secrets"), 0)?,
        };
        if config.plugins.enabled {
            sweep_cache(&index, None);
        }
        Ok(Plugins {
            config: config.plugins.clone(),
            index,
            secrets: Secrets { dir: secrets },
            cache: Arc::new(cache),
            egress: config.egress.clone(),
            host_program: host_program(&config.plugins, helper),
            helper: helper.to_path_buf(),
            spawner,
            ids: (uid, gid, parent_pid, host_ids),
            cgroups,
            host: tokio::sync::Mutex::new(None),
            next_call: AtomicU64::new(1),
            next_host: AtomicU64::new(1),
        })
    }

    pub fn next_call_id(&self) -> u64 {
        self.next_call.fetch_add(1, Ordering::Relaxed)
    }

    /// The module and grants of a call, or its refusal.
    fn prepare(&self, request: &CallRequest) -> Result<Prepared, ErrorReply> {
        if !self.config.enabled {
            return Err(refusal(
                ErrorKind::PolicyDenied,
                "plugins are disabled ([plugins] enabled)",
                "plugins.disabled",
            ));
        }
        if let Some(inline) = &request.inline_module {
            if !self.config.allow_inline_modules {
                return Err(refusal(
                    ErrorKind::PolicyDenied,
                    "inline modules are not allowed ([plugins] allow_inline_modules)",
                    "plugins.inline_not_allowed",
                ));
            }
            let module = inline_bytes(inline)?;
            let grants = PluginGrants::of(&Requested { log: true, ..Requested::default() }, &self.config);
            let sha256 = sha256_hex(&module);
            return Ok(Prepared {
                skill: request.skill.clone(),
                module,
                sha256,
                entry: DEFAULT_ENTRY.into(),
                grants,
                installed: false,
            });
        }
        let skill = self.index.load(&request.skill).map_err(|e| match e {
            IndexError::Unknown(_) => {
                refusal(ErrorKind::InvalidRequest, e.to_string(), "plugins.unknown_skill")
            }
            IndexError::Mismatch { .. } => {
                refusal(ErrorKind::RuntimeFailure, e.to_string(), "plugins.module_mismatch")
            }
            other => ErrorReply::new(ErrorKind::RuntimeFailure, other.to_string()),
        })?;
        let grants = PluginGrants::of(&skill.manifest.capabilities, &self.config);
        Ok(Prepared {
            skill: skill.manifest.name,
            sha256: skill.manifest.sha256,
            module: skill.module,
            entry: skill.manifest.entry,
            grants,
            installed: true,
        })
    }

    fn limits(&self, timeout_ms: Option<u64>) -> PluginLimits {
        let c = &self.config;
        PluginLimits {
            fuel_budget: c.fuel_budget,
            max_memory_bytes: c.max_memory_bytes,
            max_table_elements: c.max_table_elements,
            max_instances: c.max_instances,
            deadline_ms: timeout_ms.map_or(c.timeout_ms, |t| t.min(c.timeout_ms)),
        }
    }

    /// The plugin-host's own cgroup with its limits, where the broker has
    /// cgroups (`run-<instance>-plugin-host-<n>`: swept like a run's when
    /// its broker is gone).
    fn host_cgroup(&self) -> Result<Option<(RunCgroup, PluginHostCgroup)>, String> {
        if self.cgroups.available().is_err() {
            return Ok(None);
        }
        let n = self.next_host.fetch_add(1, Ordering::Relaxed);
        let name = format!("run-{}-plugin-host-{n}", crate::host::instance::tag());
        let limits = CgroupLimits {
            memory_bytes: self.config.host_memory_bytes,
            processes: PLUGIN_HOST_PROCESSES,
            cpu_percent: 0,
        };
        let cgroup = self.cgroups.create(&name, limits).map_err(|e| e.to_string())?;
        let reported = PluginHostCgroup {
            name,
            v1: cgroup.is_v1(),
            memory_bytes: limits.memory_bytes,
            processes: limits.processes,
        };
        Ok(Some((cgroup, reported)))
    }

    /// The plan of the plugin-host's jail and its host paths, opened.
    fn jail(
        &self,
        cgroup: Option<&RunCgroup>,
    ) -> Result<(palisade_protocol::JailPlan, Vec<OwnedFd>), String> {
        let cache = self.cache.ensure_dir().map_err(|e| e.to_string())?;
        let program =
            self.host_program.canonicalize().map_err(|e| format!("{}: {e}", self.host_program.display()))?;
        let cache = cache.canonicalize().map_err(|e| format!("{}: {e}", cache.display()))?;
        let layout = crate::host::layout(true, true);
        let (uid, gid, parent_pid, host_ids) = self.ids;
        let jail = PluginHostJail {
            program: &program,
            cache_dir: &cache,
            layout: &layout,
            uid,
            gid,
            parent_pid,
            host_ids,
            cgroup: cgroup.filter(|c| c.joins_itself()).map(RunCgroup::display),
        };
        let plan = plugin_host_plan(&jail).map_err(|e| e.to_string())?;
        let fds = open_host_paths(&plan)?;
        Ok((plan, fds))
    }

    /// The running plugin-host, started if there is none.
    async fn running<'g>(&self, slot: &'g mut Option<Running>) -> Result<&'g mut Running, ErrorReply> {
        if let Some(gone) = slot.take_if(|r| !r.alive()) {
            tracing::warn!(pid = gone.pid, "the plugin-host died between calls: starting another");
            gone.kill();
        }
        if slot.is_none() {
            let failed = |m: String| refusal(ErrorKind::RuntimeFailure, m, "plugins.host_start");
            let cannot = |e: String| failed(format!("cannot start the plugin-host: {e}"));
            // On an error below, the cgroup dropped is removed (RunCgroup's Drop).
            let cgroup = self.host_cgroup().map_err(cannot)?;
            let (plan, fds) = self.jail(cgroup.as_ref().map(|(c, _)| c)).map_err(cannot)?;
            let running = host::start(&self.spawner, self.helper.clone(), &plan, fds, cgroup)
                .await
                .map_err(|e| failed(e.to_string()))?;
            tracing::info!(pid = running.pid, engine = %running.engine, "plugin-host started");
            // Its engine known: the entries of any other engine go too.
            sweep_cache(&self.index, Some(&running.engine));
            *slot = Some(running);
        }
        Ok(slot.as_mut().expect("started above"))
    }

    /// The call's precompiled module: an installed skill's from the cache
    /// when its MAC verifies, else compiled by the host and written (cached
    /// when it is an installed skill's and fits the bound, else for this
    /// call only).
    async fn artifact(
        &self,
        host: &mut Running,
        id: u64,
        prepared: &Prepared,
    ) -> Result<Artifact, CallError> {
        let (cache, sha256, engine) = (self.cache.clone(), prepared.sha256.clone(), host.engine.clone());
        if prepared.installed {
            let found = blocking(move || cache.lookup(&sha256, &engine)).await?;
            if let Some(path) = found {
                return Ok(Artifact { path, transient: false });
            }
        }
        host.send(&ToHost::Compile { id, module: prepared.module.clone() }).await?;
        let artifact = match tokio::time::timeout(COMPILE_TIMEOUT, host.receive()).await {
            Err(_) => return Err(CallError::Host(HostError::Died("compiling took too long".into()))),
            Ok(r) => match r? {
                FromHost::Compiled { id: got, artifact } if got == id => artifact,
                FromHost::Failed { message, .. } => return Err(CallError::BadModule(message)),
                other => {
                    return Err(CallError::Host(HostError::Protocol(format!(
                        "{other:?} instead of Compiled"
                    ))));
                }
            },
        };
        let (cache, sha256, engine) = (self.cache.clone(), prepared.sha256.clone(), host.engine.clone());
        let (installed, index) = (prepared.installed, Index { dir: self.index.dir.clone() });
        let written = blocking(move || {
            let keep = installed && fits(&cache, &index, &engine, artifact.len() as u64)?;
            cache.store(id, &sha256, &engine, &artifact, keep)
        })
        .await?;
        tracing::info!(module = %prepared.sha256, cached = !written.transient, "module compiled by the plugin-host");
        Ok(written)
    }
}

/// Why a call failed once it reached the plugin-host.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("the module does not compile: {0}")]
    BadModule(String),
    #[error("the call ran {0:?} past its deadline and the plugin-host did not end it: restarted")]
    Stuck(Duration),
    #[error("the module cache: {0}")]
    Cache(#[from] CacheError),
}

/// The cache's file work (reading and authenticating an artifact of
/// megabytes, writing one), off the runtime's threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, CacheError> + Send + 'static,
) -> Result<T, CallError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| CallError::Host(HostError::Protocol(format!("the module cache's task: {e}"))))?
        .map_err(CallError::Cache)
}

/// Whether an artifact of `len` bytes fits the cache's bound, after a sweep
/// of what no installed skill names when it does not at first.
fn fits(cache: &ModuleCache, index: &Index, engine: &str, len: u64) -> Result<bool, CacheError> {
    if cache.fits(len)? {
        return Ok(true);
    }
    sweep_cache(index, Some(engine));
    let fits = cache.fits(len)?;
    if !fits {
        tracing::info!(cache = %cache.dir().display(), "module cache: full ([plugins] cache_max_bytes): this module is compiled for its call only");
    }
    Ok(fits)
}

/// Sweeps the cache of what no installed skill names (for `engine`, when
/// it is known); a failure is logged, and the cache is left as it is.
pub fn sweep_cache(index: &Index, engine: Option<&str>) {
    let swept = index
        .modules()
        .map_err(|e| e.to_string())
        .and_then(|modules| cache::sweep(&index.cache_dir(), &modules, engine).map_err(|e| e.to_string()));
    if let Err(e) = swept {
        tracing::warn!(cache = %index.cache_dir().display(), "module cache: not swept: {e}");
    }
}

/// An inline module: WAT text as it is, else base64 of a binary module.
fn inline_bytes(text: &str) -> Result<Vec<u8>, ErrorReply> {
    let trimmed = text.trim_start();
    if trimmed.as_bytes().first() == Some(&WAT_START) {
        return Ok(trimmed.as_bytes().to_vec());
    }
    base64_decode(text.trim()).ok_or_else(|| {
        ErrorReply::with_rule(
            ErrorKind::InvalidRequest,
            "inline_module is neither WAT text nor base64",
            "plugins.inline_module",
        )
    })
}

/// Standard base64, padding optional.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let bytes: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    let bytes = bytes.strip_suffix(b"==").or_else(|| bytes.strip_suffix(b"=")).unwrap_or(&bytes);
    let (mut out, mut acc, mut bits) = (Vec::with_capacity(bytes.len() * 3 / 4), 0u32, 0);
    for &c in bytes {
        acc = (acc << 6) | value(c)? as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// The plan's host paths, opened as the broker (`O_PATH`, no magic link; no
/// symlink on the way for the binary and the cache).
fn open_host_paths(plan: &palisade_protocol::JailPlan) -> Result<Vec<OwnedFd>, String> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
    let mut out = Vec::new();
    for d in &plan.descriptors {
        let mut resolve = ResolveFlag::RESOLVE_NO_MAGICLINKS;
        if !d.host_layout {
            resolve |= ResolveFlag::RESOLVE_NO_SYMLINKS;
        }
        let how = OpenHow::new().flags(OFlag::O_PATH | OFlag::O_CLOEXEC).resolve(resolve);
        out.push(
            openat2(nix::fcntl::AT_FDCWD, d.path.as_str(), how).map_err(|e| format!("{}: {e}", d.path))?,
        );
    }
    Ok(out)
}

/// The egress checks `http_fetch` passes: the granted hosts, and strict
/// egress's ports, hosts map and address refusals.
fn egress_plan(grants: &PluginGrants, egress: &EgressConfig) -> EgressPlan {
    EgressPlan {
        domains: grants.http_hosts.clone(),
        ports: egress.ports.clone(),
        transparent: false,
        pool: vec![],
        allow_addresses: egress.allowed_addresses(),
        hosts: egress.host_map(),
        max_connections: egress.max_connections,
        max_bytes: egress.max_bytes,
        idle_timeout: Duration::from_secs(egress.idle_timeout_secs),
        inspect: vec![],
        requests: vec![],
        ca_bundle: None,
        credentials: vec![],
        secrets_dir: None,
        own: false,
    }
}

fn grants_in_force(g: &PluginGrants) -> PluginGrantsInForce {
    PluginGrantsInForce {
        http_hosts: g.http_hosts.clone(),
        secrets: g.secrets.clone(),
        storage_prefixes: g.storage_prefixes.clone(),
        log: g.log,
        functions: g.host_functions(),
    }
}

mod call;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_modules_are_wat_or_base64() {
        assert_eq!(inline_bytes("  (module)").unwrap(), b"(module)");
        assert_eq!(inline_bytes("AGFzbQEAAAA=").unwrap(), b"\0asm\x01\0\0\0");
        assert_eq!(base64_decode("aGk").unwrap(), b"hi");
        let e = inline_bytes("not base64!").unwrap_err();
        assert_eq!(e.rule.as_deref(), Some("plugins.inline_module"));
        palisade_policy::denial::names_a_fix_or_why_none("plugins.inline_module", &e.message).unwrap();
    }

    #[test]
    fn fetch_goes_through_strict_egress_checks_with_the_granted_hosts() {
        let grants = PluginGrants { http_hosts: vec!["api.test".into()], ..PluginGrants::default() };
        let plan = egress_plan(&grants, &EgressConfig::default());
        assert!(plan.allows("api.test") && !plan.allows("other.test"));
        assert_eq!(plan.ports, palisade_policy::config::DEFAULT_EGRESS_PORTS);
        assert!(plan.allow_addresses.is_empty());
    }
}
