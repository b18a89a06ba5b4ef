//! Tier A, WebAssembly skill plugins: a skill's manifest (strictly parsed),
//! the grants of a call (the manifest's request intersected with the
//! policy's `[plugins]` allow lists), and the jail the plugin-host runs in.

use crate::config::{PluginsConfig, line_column};
use crate::jail::{BuildError, JailSpec, Layout, Limits, build_plan};
use palisade_protocol::plugin::HostFn;
use palisade_protocol::{HostIds, JailPlan, LandlockFeatures, Tier};
use serde::{Deserialize, Serialize};
use std::path::{Component, Path, PathBuf};

/// The entry point a manifest that names none gets.
pub const DEFAULT_ENTRY: &str = "palisade_plugin_main";
/// A skill's name is a directory of the skills index: short, plain.
const MAX_NAME_BYTES: usize = 64;
/// A secret's key or a storage key is a file name: short, plain.
pub const MAX_KEY_BYTES: usize = 128;

/// A skill's manifest (`skill.toml`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub name: String,
    pub version: String,
    /// The module file, relative to the manifest's directory.
    pub module: PathBuf,
    /// The module's bytes' sha256, lowercase hex.
    pub sha256: String,
    #[serde(default = "default_entry")]
    pub entry: String,
    #[serde(default)]
    pub capabilities: Requested,
}

fn default_entry() -> String {
    DEFAULT_ENTRY.into()
}

/// What a manifest asks for; a call gets at most what the policy allows too.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Requested {
    /// Exact names or `*.suffix`.
    pub http_hosts: Vec<String>,
    pub secrets: Vec<String>,
    pub storage_prefixes: Vec<String>,
    pub log: bool,
}

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("{path}:{line}:{column}: {message}")]
    Invalid { path: String, line: usize, column: usize, message: String },
    #[error("{path}: {message}")]
    Field { path: String, message: String },
}

impl Manifest {
    /// Parses and checks a manifest; `path` only names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Manifest, ManifestError> {
        let shown = path.display().to_string();
        let manifest: Manifest = toml::from_str(text).map_err(|e| {
            let (line, column) = line_column(text, e.span().map_or(0, |s| s.start));
            ManifestError::Invalid { path: shown.clone(), line, column, message: e.message().into() }
        })?;
        manifest.check().map_err(|message| ManifestError::Field { path: shown, message })?;
        Ok(manifest)
    }

    fn check(&self) -> Result<(), String> {
        if !plain_name(&self.name, MAX_NAME_BYTES) || self.name.starts_with('.') {
            return Err(format!(
                "name {:?}: letters, digits, '-', '_' and '.', at most {MAX_NAME_BYTES} bytes, not starting with '.'",
                self.name
            ));
        }
        if self.version.is_empty() {
            return Err("version is empty".into());
        }
        if self.sha256.len() != 64
            || !self.sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!("sha256 {:?} is not 64 lowercase hex digits", self.sha256));
        }
        if self.module.as_os_str().is_empty()
            || !self.module.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(format!(
                "module {:?} must be a path relative to the manifest, without '..'",
                self.module.display()
            ));
        }
        if self.entry.is_empty() || !self.entry.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!("entry {:?} is not an export name (letters, digits, '_')", self.entry));
        }
        let c = &self.capabilities;
        if let Some(bad) = c.secrets.iter().find(|k| !key_name(k)) {
            return Err(format!(
                "capabilities.secrets: {bad:?} is not a key (see `palisade plugin secret set`)"
            ));
        }
        if let Some(bad) = c.storage_prefixes.iter().find(|p| !storage_key(p)) {
            return Err(format!("capabilities.storage_prefixes: {bad:?} is not a key prefix"));
        }
        if let Some(bad) = c.http_hosts.iter().find(|h| !host_pattern(h)) {
            return Err(format!("capabilities.http_hosts: {bad:?} is not a host name or *.suffix"));
        }
        Ok(())
    }
}

/// Letters, digits, `-`, `_`, `.`; at most `max` bytes.
fn plain_name(s: &str, max: usize) -> bool {
    s.len() <= max && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A key of the secret or storage store: a file name of its own.
pub fn key_name(s: &str) -> bool {
    !s.is_empty() && !s.starts_with('.') && plain_name(s, MAX_KEY_BYTES)
}

/// A storage key (or prefix): printable ASCII, at most [`MAX_KEY_BYTES`]
/// (the store names its file by the key's hex).
pub fn storage_key(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_KEY_BYTES && s.bytes().all(|b| b.is_ascii_graphic())
}

fn host_pattern(h: &str) -> bool {
    let name = h.strip_prefix("*.").unwrap_or(h);
    !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.'))
        && !name.starts_with('.')
}

/// What a call may use: the manifest's request within the policy's allow lists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grants {
    pub http_hosts: Vec<String>,
    pub secrets: Vec<String>,
    pub storage_prefixes: Vec<String>,
    pub log: bool,
}

impl Grants {
    /// The request intersected with the policy: an exact host the policy
    /// allows (exactly or by a `*.suffix`), a `*.suffix` within one of the
    /// policy's; a secret the policy names; a storage prefix that starts
    /// with one of the policy's. `log` is harmless (bounded by the broker).
    pub fn of(requested: &Requested, policy: &PluginsConfig) -> Grants {
        let host_ok = |h: &String| crate::egress::within(h, &policy.allow_http_hosts);
        Grants {
            http_hosts: requested.http_hosts.iter().filter(|h| host_ok(h)).cloned().collect(),
            secrets: requested.secrets.iter().filter(|k| policy.allow_secrets.contains(k)).cloned().collect(),
            storage_prefixes: (requested.storage_prefixes.iter())
                .filter(|p| policy.allow_storage_prefixes.iter().any(|q| p.starts_with(q.as_str())))
                .cloned()
                .collect(),
            log: requested.log,
        }
    }

    /// The host functions these grants make callable.
    pub fn host_functions(&self) -> Vec<HostFn> {
        let mut out = Vec::new();
        if !self.http_hosts.is_empty() {
            out.push(HostFn::HttpFetch);
        }
        if !self.secrets.is_empty() {
            out.push(HostFn::SecretGet);
        }
        if !self.storage_prefixes.is_empty() {
            out.extend([HostFn::StorageGet, HostFn::StoragePut]);
        }
        if self.log {
            out.push(HostFn::Log);
        }
        out
    }

    /// Whether storage key `key` lies under a granted prefix.
    pub fn storage_key(&self, key: &str) -> bool {
        storage_key(key) && self.storage_prefixes.iter().any(|p| key.starts_with(p.as_str()))
    }

    pub fn http_host(&self, host: &str) -> bool {
        crate::egress::allowed(host, &self.http_hosts)
    }
}

/// The plugin-host's own processes: the host and the threads of its
/// engine (the epoch ticker, wasmtime's), counted per uid by RLIMIT_NPROC.
pub const PLUGIN_HOST_PROCESSES: u64 = 64;
/// Descriptors: the channel, the module cache's files, the engine's.
const PLUGIN_HOST_OPEN_FILES: u64 = 256;
/// The host writes no file: /tmp and /dev/shm stay a page or so.
const PLUGIN_HOST_TMPFS_BYTES: u64 = 1 << 20;
const PLUGIN_HOST_HOSTNAME: &str = "palisade-plugins";

/// What the plugin-host's jail is built from (see [`plugin_host_plan`]).
pub struct PluginHostJail<'a> {
    /// palisade-plugin-host, canonical.
    pub program: &'a Path,
    /// The module cache (`skills_dir/.cache`), canonical: bound read-only.
    pub cache_dir: &'a Path,
    pub layout: &'a Layout,
    /// The broker's ids and pid (the lifeline).
    pub uid: u32,
    pub gid: u32,
    pub parent_pid: u32,
    /// A root broker: the unprivileged host ids the plugin-host runs as.
    pub host_ids: Option<HostIds>,
    /// cgroup v2: the host's own cgroup, which the helper joins through fd 5
    /// (v1: the broker places the helper; none: rlimits alone).
    pub cgroup: Option<String>,
}

/// The plugin-host's jail: Tier C with every namespace (no network at all:
/// what a plugin reaches outside goes through the broker's host
/// functions), the system directories, the binary and the module cache
/// read-only, no workspace, Landlock required, the default seccomp
/// program, no fork. RLIMIT_AS and RLIMIT_DATA are unlimited: the pooling allocator
/// reserves many GiB of address space (guard regions around each memory
/// slot) that it never touches; memory is bounded per call by the engine.
pub fn plugin_host_plan(jail: &PluginHostJail<'_>) -> Result<JailPlan, BuildError> {
    let spec = JailSpec {
        tier: Tier::C,
        program: jail.program.to_string_lossy().into_owned(),
        argv: vec![PLUGIN_HOST_NAME.into()],
        env: vec![],
        cwd: PathBuf::from("/"),
        read_write: vec![],
        read_only: vec![jail.program.to_path_buf(), jail.cache_dir.to_path_buf()],
        exec_dirs: vec![jail.program.to_path_buf()],
        tmp_dir: None,
        host_network: false,
        limits: Limits {
            memory_bytes: 0,
            address_space_bytes: 0,
            // Long-lived: its CPU time adds up over every call; each call is
            // bounded by its fuel and deadline instead.
            cpu_seconds: palisade_protocol::RLIM_INFINITY,
            processes: PLUGIN_HOST_PROCESSES,
            open_files: PLUGIN_HOST_OPEN_FILES,
            file_size_bytes: PLUGIN_HOST_TMPFS_BYTES,
            tmp_bytes: PLUGIN_HOST_TMPFS_BYTES,
            shm_bytes: PLUGIN_HOST_TMPFS_BYTES,
        },
        landlock_required: LandlockFeatures::FS,
        hostname: PLUGIN_HOST_HOSTNAME.into(),
        // Inside, the broker's own ids (as a run's); a root broker's host is
        // not host root, and sees the broker's files (the cache) as its own.
        uid: jail.uid,
        gid: jail.gid,
        host_ids: jail.host_ids,
        acting_for: jail.host_ids.map(|_| HostIds { uid: jail.uid, gid: jail.gid }),
        parent_pid: jail.parent_pid,
        cgroup: jail.cgroup.clone(),
        no_fork: true,
        temp_workspace: None,
        write_bound: None,
        hidden: vec![],
        held: vec![],
        pinned: vec![],
        home: None,
        etc_view: None,
        layout: jail.layout.clone(),
        listeners: vec![],
        tcp_connect: None,
        files: vec![],
        // Writes nothing that outlives it.
        umask: None,
        terminal: None,
    };
    build_plan(&spec)
}

/// The plugin-host's file name, next to palisade-helper.
pub const PLUGIN_HOST_NAME: &str = "palisade-plugin-host";

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn manifest(extra: &str) -> Result<Manifest, ManifestError> {
        let text = format!(
            "name = \"echo\"\nversion = \"1.0\"\nmodule = \"echo.wasm\"\nsha256 = \"{SHA}\"\n{extra}"
        );
        Manifest::parse(&text, Path::new("skill.toml"))
    }

    #[test]
    fn a_manifest_is_parsed_strictly() {
        let m = manifest("[capabilities]\nsecrets = [\"api_key\"]\nlog = true\n").unwrap();
        assert_eq!(m.entry, DEFAULT_ENTRY);
        assert_eq!(m.capabilities.secrets, ["api_key"]);
        let e = manifest("[capabilities]\nfiles = [\"/\"]\n").unwrap_err().to_string();
        assert!(e.starts_with("skill.toml:6:"), "{e}");
        let e = manifest("extra = 1\n").unwrap_err().to_string();
        assert!(e.contains("skill.toml:5:"), "{e}");
        let bad_sha = Manifest::parse(
            "name = \"x\"\nversion = \"1\"\nmodule = \"x.wasm\"\nsha256 = \"AB\"\n",
            Path::new("m.toml"),
        );
        assert!(bad_sha.unwrap_err().to_string().contains("sha256"));
        let escape = Manifest::parse(
            &format!("name = \"x\"\nversion = \"1\"\nmodule = \"../x.wasm\"\nsha256 = \"{SHA}\"\n"),
            Path::new("m.toml"),
        );
        assert!(escape.unwrap_err().to_string().contains(".."));
        let name = Manifest::parse(
            &format!("name = \"../x\"\nversion = \"1\"\nmodule = \"x.wasm\"\nsha256 = \"{SHA}\"\n"),
            Path::new("m.toml"),
        );
        assert!(name.unwrap_err().to_string().contains("name"));
        assert!(manifest("[capabilities]\nsecrets = [\"../etc\"]\n").is_err());
        assert!(manifest("entry = \"a b\"\n").is_err());
    }

    #[test]
    fn grants_are_the_request_within_the_policy() {
        let policy = PluginsConfig {
            allow_http_hosts: vec!["api.example.com".into(), "*.corp.test".into()],
            allow_secrets: vec!["token".into()],
            allow_storage_prefixes: vec!["cache/".into()],
            ..PluginsConfig::default()
        };
        let requested = Requested {
            http_hosts: vec![
                "api.example.com".into(),
                "evil.com".into(),
                "x.corp.test".into(),
                "*.a.corp.test".into(),
                "*.test".into(),
            ],
            secrets: vec!["token".into(), "other".into()],
            storage_prefixes: vec!["cache/x".into(), "cache/".into(), "data/".into()],
            log: true,
        };
        let g = Grants::of(&requested, &policy);
        assert_eq!(g.http_hosts, ["api.example.com", "x.corp.test", "*.a.corp.test"]);
        assert_eq!(g.secrets, ["token"]);
        assert_eq!(g.storage_prefixes, ["cache/x", "cache/"]);
        assert!(g.storage_key("cache/1") && !g.storage_key("data/1") && !g.storage_key("cache/\n"));
        assert!(g.http_host("b.a.corp.test") && !g.http_host("a.corp.test") && !g.http_host("evil.com"));
        assert_eq!(
            g.host_functions(),
            [HostFn::HttpFetch, HostFn::SecretGet, HostFn::StorageGet, HostFn::StoragePut, HostFn::Log]
        );
        let none = Grants::of(&requested, &PluginsConfig::default());
        assert_eq!(none.host_functions(), [HostFn::Log]);
    }

    #[test]
    fn the_plugin_host_jail_has_every_namespace_and_no_address_space_limit() {
        let layout = Layout { real: vec!["/usr".into()], ..Layout::default() };
        let plan = plugin_host_plan(&PluginHostJail {
            program: Path::new("/opt/palisade/palisade-plugin-host"),
            cache_dir: Path::new("/var/lib/palisade/skills/.cache"),
            layout: &layout,
            uid: 1000,
            gid: 1000,
            parent_pid: 1,
            host_ids: None,
            cgroup: None,
        })
        .unwrap();
        assert_eq!(plan.namespaces, palisade_protocol::Namespaces::ALL);
        assert_eq!(
            plan.rlimits.address_space,
            palisade_protocol::Rlimit::both(palisade_protocol::RLIM_INFINITY)
        );
        assert!(plan.landlock.required.contains(LandlockFeatures::FS));
        assert!(plan.mounts.iter().any(|m| matches!(m,
            palisade_protocol::Mount::Bind { target, writable: false, .. } if target.ends_with("/.cache"))));
        assert!(
            !plan.mounts.iter().any(|m| matches!(m, palisade_protocol::Mount::Bind { writable: true, .. }))
        );
    }
}
