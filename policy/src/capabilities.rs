//! The capability model: what a sandbox may touch, in four dimensions, the
//! presets that bundle common profiles (with fields a tool may not override),
//! and the parameter bindings that turn request parameters into paths.

use serde::Deserialize;
use std::fmt;
use toml::Spanned;

/// One filesystem grant. Paths may use `${WORKSPACE}` (the request's
/// workspace) and `${PROJECT_ROOT}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsCapability {
    ReadOnly {
        path: String,
    },
    ReadWrite {
        path: String,
    },
    /// A fresh directory for this run, removed after it (a tmpfs in Tier C).
    TempWorkspace,
}

// TOML writes these as `{ read_only = "/p" }`, `{ read_write = "/p" }` or
// `"temp_workspace"`; serde's externally tagged form would want
// `{ read_only = { path = "/p" } }`, so the short form is mapped here, and a
// table must hold exactly one of the two keys (an extra key is an error, as
// everywhere in the file).
#[derive(Deserialize)]
#[serde(untagged)]
enum FsCapabilityToml {
    Word(String),
    Table(std::collections::BTreeMap<String, toml::Value>),
}

impl FsCapability {
    fn from_toml(v: FsCapabilityToml) -> Result<FsCapability, String> {
        const EXPECTED: &str = "expected temp_workspace, { read_only = PATH } or { read_write = PATH }";
        match v {
            FsCapabilityToml::Word(w) if w == "temp_workspace" => Ok(FsCapability::TempWorkspace),
            FsCapabilityToml::Word(w) => Err(format!("unknown filesystem capability {w:?} ({EXPECTED})")),
            FsCapabilityToml::Table(t) => {
                let mut keys = t.into_iter();
                match (keys.next(), keys.next()) {
                    (Some((k, toml::Value::String(path))), None) if k == "read_only" => {
                        Ok(FsCapability::ReadOnly { path })
                    }
                    (Some((k, toml::Value::String(path))), None) if k == "read_write" => {
                        Ok(FsCapability::ReadWrite { path })
                    }
                    (Some((k, v)), None) if k == "read_only" || k == "read_write" => {
                        Err(format!("{k} must be a path (a string), not {}", v.type_str()))
                    }
                    (Some((k, _)), None) => Err(format!("unknown filesystem capability {k:?} ({EXPECTED})")),
                    _ => Err(format!("a filesystem capability takes exactly one key ({EXPECTED})")),
                }
            }
        }
    }
}

fn fs_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Spanned<Vec<FsCapability>>>, D::Error> {
    let raw: Spanned<Vec<FsCapabilityToml>> = Spanned::deserialize(d)?;
    let span = raw.span();
    let caps = raw.into_inner().into_iter().map(FsCapability::from_toml).collect::<Result<Vec<_>, _>>();
    caps.map(|c| Some(Spanned::new(span, c))).map_err(serde::de::Error::custom)
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NetworkCapability {
    #[default]
    Deny,
    AllowDomains(Vec<String>),
    AllowAll,
}

impl<'de> Deserialize<'de> for NetworkCapability {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            Table(std::collections::BTreeMap<String, toml::Value>),
        }
        const EXPECTED: &str = "expected \"deny\", \"allow_all\" or { allow_domains = [...] }";
        let err = |m: String| serde::de::Error::custom(m);
        match Raw::deserialize(d)? {
            Raw::Word(w) if w == "deny" => Ok(NetworkCapability::Deny),
            Raw::Word(w) if w == "allow_all" => Ok(NetworkCapability::AllowAll),
            Raw::Word(w) => Err(err(format!("unknown network capability {w:?} ({EXPECTED})"))),
            Raw::Table(t) => {
                let mut keys = t.into_iter();
                match (keys.next(), keys.next()) {
                    (Some((k, toml::Value::Array(items))), None) if k == "allow_domains" => items
                        .into_iter()
                        .map(|i| match i {
                            toml::Value::String(s) => Ok(s),
                            other => Err(err(format!(
                                "allow_domains holds names (strings), not {}",
                                other.type_str()
                            ))),
                        })
                        .collect::<Result<_, _>>()
                        .map(NetworkCapability::AllowDomains),
                    (Some((k, v)), None) if k == "allow_domains" => {
                        Err(err(format!("allow_domains must be a list of names, not {}", v.type_str())))
                    }
                    _ => Err(err(format!(
                        "a network capability table takes exactly the key allow_domains ({EXPECTED})"
                    ))),
                }
            }
        }
    }
}

impl fmt::Display for NetworkCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetworkCapability::Deny => f.write_str("deny"),
            NetworkCapability::AllowAll => f.write_str("allow_all"),
            NetworkCapability::AllowDomains(d) => write!(f, "allow_domains [{}]", d.join(", ")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EnvironmentCapability {
    /// No variables at all.
    None,
    /// PATH, HOME, USER, LANG and TERM.
    #[default]
    Restricted,
    /// Everything the client offers.
    Full,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessCapability {
    pub no_fork: bool,
    /// Seconds.
    pub max_execution_time: u64,
    pub max_memory_mb: u64,
    pub max_processes: u64,
    /// Percent of one CPU (cgroup cpu.max); 0: no limit.
    pub max_cpu_percent: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ProcessOverride {
    pub no_fork: Option<bool>,
    pub max_execution_time: Option<u64>,
    pub max_memory_mb: Option<u64>,
    pub max_processes: Option<u64>,
    pub max_cpu_percent: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    pub filesystem: Vec<FsCapability>,
    pub network: NetworkCapability,
    pub process: ProcessCapability,
    pub environment: EnvironmentCapability,
}

/// A declared tool's deadline in seconds without a preset: the default profile's.
const TOOL_MAX_EXECUTION_TIME: u64 = 300;
/// A declared tool's memory in MiB without a preset: the default profile's.
const TOOL_MAX_MEMORY_MB: u64 = 512;
/// A declared tool's processes, threads included, with any preset or none.
const TOOL_MAX_PROCESSES: u64 = 64;

impl Default for Capabilities {
    /// The conservative defaults a declared tool starts from: a temporary
    /// workspace, no network, no fork, 300 s, 512 MiB, a restricted environment.
    fn default() -> Self {
        Capabilities {
            filesystem: vec![FsCapability::TempWorkspace],
            network: NetworkCapability::Deny,
            process: ProcessCapability {
                no_fork: true,
                max_execution_time: TOOL_MAX_EXECUTION_TIME,
                max_memory_mb: TOOL_MAX_MEMORY_MB,
                max_processes: TOOL_MAX_PROCESSES,
                max_cpu_percent: 0,
            },
            environment: EnvironmentCapability::Restricted,
        }
    }
}

/// Which dimensions of a preset a tool may not override.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Immutable {
    pub filesystem: bool,
    pub network: bool,
    pub process: bool,
    pub environment: bool,
}

#[derive(Debug, Clone)]
pub struct Preset {
    pub name: &'static str,
    pub capabilities: Capabilities,
    pub immutable: Immutable,
}

impl Preset {
    pub const NAMES: [&'static str; 4] =
        ["file_processor", "web_scraper", "code_analyzer", "data_transformer"];

    pub fn named(name: &str) -> Option<Preset> {
        let process = |time, memory| ProcessCapability {
            no_fork: true,
            max_execution_time: time,
            max_memory_mb: memory,
            max_processes: TOOL_MAX_PROCESSES,
            max_cpu_percent: 0,
        };
        let (capabilities, immutable) = match name {
            "file_processor" => (
                Capabilities {
                    filesystem: vec![FsCapability::TempWorkspace],
                    network: NetworkCapability::Deny,
                    process: process(300, 512),
                    environment: EnvironmentCapability::Restricted,
                },
                Immutable { network: true, ..Immutable::default() },
            ),
            "web_scraper" => (
                Capabilities {
                    filesystem: vec![FsCapability::TempWorkspace],
                    network: NetworkCapability::AllowAll,
                    process: process(600, 1024),
                    environment: EnvironmentCapability::Restricted,
                },
                Immutable { filesystem: true, ..Immutable::default() },
            ),
            "code_analyzer" => (
                Capabilities {
                    filesystem: vec![FsCapability::ReadOnly { path: "${WORKSPACE}".into() }],
                    network: NetworkCapability::Deny,
                    process: process(900, 2048),
                    environment: EnvironmentCapability::Restricted,
                },
                Immutable { network: true, ..Immutable::default() },
            ),
            "data_transformer" => (
                Capabilities {
                    filesystem: vec![
                        FsCapability::TempWorkspace,
                        FsCapability::ReadOnly { path: "${PROJECT_ROOT}/data".into() },
                    ],
                    network: NetworkCapability::Deny,
                    process: process(1800, 4096),
                    environment: EnvironmentCapability::Restricted,
                },
                Immutable::default(),
            ),
            _ => return None,
        };
        let name = Preset::NAMES.iter().find(|n| **n == name)?;
        Some(Preset { name, capabilities, immutable })
    }
}

/// A tool's changes to its preset. Filesystem grants are added to the
/// preset's; network and environment replace; process fields replace one by one.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Overrides {
    #[serde(default, deserialize_with = "fs_list")]
    pub filesystem: Option<Spanned<Vec<FsCapability>>>,
    pub network: Option<Spanned<NetworkCapability>>,
    pub process: Option<Spanned<ProcessOverride>>,
    pub environment: Option<Spanned<EnvironmentCapability>>,
}

impl Overrides {
    /// The byte offset and name of the first override of an immutable field.
    pub fn check_against(&self, preset: &Preset) -> Result<(), (usize, &'static str)> {
        let im = preset.immutable;
        let hits = [
            (im.filesystem, self.filesystem.as_ref().map(|s| s.span().start), "filesystem"),
            (im.network, self.network.as_ref().map(|s| s.span().start), "network"),
            (im.process, self.process.as_ref().map(|s| s.span().start), "process"),
            (im.environment, self.environment.as_ref().map(|s| s.span().start), "environment"),
        ];
        match hits.into_iter().find(|(immutable, present, _)| *immutable && present.is_some()) {
            Some((_, Some(offset), field)) => Err((offset, field)),
            _ => Ok(()),
        }
    }

    /// The preset's capabilities with these overrides applied.
    pub fn apply(&self, base: &Capabilities) -> Capabilities {
        let mut caps = base.clone();
        if let Some(fs) = &self.filesystem {
            caps.filesystem.extend(fs.get_ref().iter().cloned());
        }
        if let Some(n) = &self.network {
            caps.network = n.get_ref().clone();
        }
        if let Some(e) = &self.environment {
            caps.environment = *e.get_ref();
        }
        if let Some(p) = &self.process {
            let p = p.get_ref();
            let pc = &mut caps.process;
            pc.no_fork = p.no_fork.unwrap_or(pc.no_fork);
            pc.max_execution_time = p.max_execution_time.unwrap_or(pc.max_execution_time);
            pc.max_memory_mb = p.max_memory_mb.unwrap_or(pc.max_memory_mb);
            pc.max_processes = p.max_processes.unwrap_or(pc.max_processes);
            pc.max_cpu_percent = p.max_cpu_percent.unwrap_or(pc.max_cpu_percent);
        }
        caps
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum BoundCapability {
    #[serde(rename = "filesystem.read_only")]
    ReadOnly,
    #[serde(rename = "filesystem.read_write")]
    ReadWrite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Validation {
    IsFile,
    IsDirectory,
    IsPath,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mapping {
    Single,
    EachElement,
}

/// A request parameter that grants filesystem access to the path(s) it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    pub capability: BoundCapability,
    pub validation: Validation,
    pub mapping: Mapping,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_carry_the_documented_values() {
        let fp = Preset::named("file_processor").unwrap();
        assert_eq!(fp.capabilities.filesystem, vec![FsCapability::TempWorkspace]);
        assert_eq!(fp.capabilities.network, NetworkCapability::Deny);
        assert_eq!(
            (fp.capabilities.process.max_execution_time, fp.capabilities.process.max_memory_mb),
            (300, 512)
        );
        assert!(fp.capabilities.process.no_fork && fp.immutable.network && !fp.immutable.filesystem);
        let ws = Preset::named("web_scraper").unwrap();
        assert_eq!(ws.capabilities.network, NetworkCapability::AllowAll);
        assert_eq!(
            (ws.capabilities.process.max_execution_time, ws.capabilities.process.max_memory_mb),
            (600, 1024)
        );
        assert!(ws.immutable.filesystem && !ws.immutable.network);
        let ca = Preset::named("code_analyzer").unwrap();
        assert_eq!(ca.capabilities.filesystem, vec![FsCapability::ReadOnly { path: "${WORKSPACE}".into() }]);
        assert_eq!(
            (ca.capabilities.process.max_execution_time, ca.capabilities.process.max_memory_mb),
            (900, 2048)
        );
        assert!(ca.immutable.network);
        let dt = Preset::named("data_transformer").unwrap();
        assert_eq!(dt.capabilities.filesystem.len(), 2);
        assert_eq!(
            (dt.capabilities.process.max_execution_time, dt.capabilities.process.max_memory_mb),
            (1800, 4096)
        );
        assert_eq!(dt.immutable, Immutable::default());
        assert!(Preset::named("other").is_none());
        let d = Capabilities::default();
        assert_eq!(d.filesystem, vec![FsCapability::TempWorkspace]);
        assert!(d.process.no_fork && d.environment == EnvironmentCapability::Restricted);
    }
}
