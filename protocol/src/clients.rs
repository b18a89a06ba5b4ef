//! `[clients]` of the system configuration: what every user's CLI reads
//! there to find the system broker. Here, below the policy and the CLI,
//! because both read it: the policy as a table of the broker's file, the
//! CLI without the rest of the policy.

use serde::Deserialize;
use std::path::PathBuf;

/// `[clients]` of the system configuration (`/etc/palisade/palisade.toml`):
/// what the CLI (`palisade`) of every user of the machine reads there, and
/// only there, when no broker of the user's own answers. The broker ignores
/// it; it is in the broker's file because that is the file an admin edits.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ClientsConfig {
    /// Where the system broker answers: set it when `[broker] socket`
    /// names another socket than the default.
    pub system_socket: PathBuf,
    /// No embedded broker: a run that no broker of the user's own (nor one
    /// named with `--socket` or `PALISADE_SOCKET`) takes goes to the system
    /// broker, or is refused with the reason; so is `--policy`.
    pub require_system_broker: bool,
}

/// The system broker's socket, where `[clients] system_socket` does not
/// name another: a root broker's default.
pub const SYSTEM_SOCKET: &str =
    if cfg!(target_os = "macos") { "/var/run/palisade/palisade.sock" } else { "/run/palisade/palisade.sock" };

impl Default for ClientsConfig {
    fn default() -> Self {
        ClientsConfig { system_socket: PathBuf::from(SYSTEM_SOCKET), require_system_broker: false }
    }
}
