//! The configuration file (TOML). Unknown keys and bad values are errors that
//! name the line and column.

use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub broker: BrokerConfig,
    #[serde(default)]
    pub defaults: DefaultProfile,
}

/// How palisaded serves (ignored by the CLI's embedded broker).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// Socket path; default `$XDG_RUNTIME_DIR/palisade/palisade.sock` for a user,
    /// `/run/palisade/palisade.sock` for root.
    pub socket: Option<PathBuf>,
    /// Permission bits of the socket.
    pub socket_mode: u32,
    /// Peers allowed to connect, by uid; empty: the broker's own uid only.
    pub allowed_uids: Vec<u32>,
    /// Peers allowed to connect, by primary gid.
    pub allowed_gids: Vec<u32>,
    /// Runs at once; further runs wait in the queue.
    pub max_concurrent: usize,
    /// Runs waiting for a slot; beyond this, requests get `Busy`.
    pub max_queued: usize,
    /// Path of palisade-helper; default: next to the running binary.
    pub helper: Option<PathBuf>,
    /// When the broker runs as root: the host uid and gid sandboxes run as.
    pub sandbox_uid: u32,
    pub sandbox_gid: u32,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            socket: None,
            socket_mode: 0o660,
            allowed_uids: vec![],
            allowed_gids: vec![],
            max_concurrent: 16,
            max_queued: 128,
            helper: None,
            sandbox_uid: 65534,
            sandbox_gid: 65534,
        }
    }
}

/// The profile `palisade run` uses when no tool is named.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DefaultProfile {
    pub timeout_secs: u64,
    pub max_output_bytes: u64,
    pub memory_mb: u64,
    pub max_processes: u64,
    pub max_open_files: u64,
    pub max_file_size_mb: u64,
    pub tmp_size_mb: u64,
    /// Extra paths visible read-only (and executable) in the sandbox.
    pub read_only: Vec<PathBuf>,
}

impl Default for DefaultProfile {
    fn default() -> Self {
        DefaultProfile {
            timeout_secs: 300,
            max_output_bytes: 64 << 20,
            memory_mb: 512,
            max_processes: 256,
            max_open_files: 1024,
            max_file_size_mb: 1024,
            tmp_size_mb: 256,
            read_only: vec![],
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}:{column}: {message}")]
    Parse { path: PathBuf, line: usize, column: usize, message: String },
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        Config::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map(|s| line_column(text, s.start)).unwrap_or((0, 0));
            ConfigError::Parse { path: path.to_path_buf(), line, column, message: e.message().to_string() }
        })
    }
}

/// 1-based line and column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_refused_with_line_and_column() {
        let text = "[broker]\nmax_concurrent = 4\nmax_concurent = 5\n";
        let err = Config::parse(text, Path::new("p.toml")).unwrap_err().to_string();
        assert!(err.starts_with("p.toml:3:1: unknown field `max_concurent`"), "{err}");
    }

    #[test]
    fn bad_values_are_refused_with_line_and_column() {
        let err = Config::parse("[defaults]\ntimeout_secs = \"soon\"\n", Path::new("p.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("p.toml:2:16: invalid type"), "{err}");
    }

    #[test]
    fn an_empty_file_gives_the_defaults() {
        let c = Config::parse("", Path::new("p.toml")).unwrap();
        assert_eq!(c.broker.socket_mode, 0o660);
        assert_eq!(c.defaults.timeout_secs, 300);
    }
}
