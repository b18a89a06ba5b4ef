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
    /// Where this file exists and no broker answers, a run that an
    /// embedded broker serves says so on stderr, every time (the system
    /// broker's policy, approvals and journal do not apply to it). false:
    /// it says nothing (the test suites' own system configuration).
    pub announce_fallback: bool,
}

/// The system broker's socket, where `[clients] system_socket` does not
/// name another: the default of a broker that serves other users, and the
/// one every client tries after the user's own. One per system:
/// [`LINUX_SYSTEM_SOCKET`], or on macOS [`MACOS_SYSTEM_SOCKET`].
pub const SYSTEM_SOCKET: &str =
    if cfg!(target_os = "macos") { MACOS_SYSTEM_SOCKET } else { LINUX_SYSTEM_SOCKET };

/// The system socket on Linux: in the runtime directory the system unit
/// keeps (`RuntimeDirectory=palisade`).
pub const LINUX_SYSTEM_SOCKET: &str = "/run/palisade/palisade.sock";

/// The system socket on macOS: the one launchd makes for the LaunchDaemon
/// (launchd/daemon/, `SockPathName`), directly in `/var/run`.
pub const MACOS_SYSTEM_SOCKET: &str = "/var/run/palisade.sock";

impl Default for ClientsConfig {
    fn default() -> Self {
        ClientsConfig {
            system_socket: PathBuf::from(SYSTEM_SOCKET),
            require_system_broker: false,
            announce_fallback: true,
        }
    }
}

/// Where a user's own broker listens by default on Linux, for `uid`:
/// `$XDG_RUNTIME_DIR/palisade/palisade.sock`; without that variable,
/// `/run/user/UID/palisade/palisade.sock` where `/run/user/UID` exists;
/// else (a container, CI, SSH without logind) `palisade.sock` in the
/// directory `palisade-UID` of the system's temporary directory
/// (`$TMPDIR`, else `/tmp`), which must be the user's and private to it
/// ([`private_to`]): the broker makes it so, the CLI trusts nothing else.
pub fn user_socket(uid: u32) -> PathBuf {
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").filter(|r| !r.is_empty()) {
        return PathBuf::from(runtime).join("palisade/palisade.sock");
    }
    let run_user = PathBuf::from(format!("/run/user/{uid}"));
    if run_user.is_dir() {
        return run_user.join("palisade/palisade.sock");
    }
    user_temp_dir(uid).join("palisade.sock")
}

/// `palisade-UID` in the system's temporary directory: a user's private
/// directory where it has no runtime directory.
pub fn user_temp_dir(uid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("palisade-{uid}"))
}

/// Whether `dir` is a directory (not a link to one) of `uid` that nobody
/// else may enter or write to: one another user made first in a shared
/// `/tmp` is not.
#[cfg(unix)]
pub fn private_to(dir: &std::path::Path, uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0)
}

/// A user's own configuration, which `palisade init` writes and both the
/// user's daemon (`palisaded` without `--config`) and the CLI's embedded
/// broker (without `--policy`) read when it exists:
/// `$XDG_CONFIG_HOME/palisade/palisade.toml`, else
/// `$HOME/.config/palisade/palisade.toml`; `None` without either variable
/// (as an absolute path).
pub fn user_config() -> Option<PathBuf> {
    let absolute = |var: &str| std::env::var_os(var).map(PathBuf::from).filter(|p| p.is_absolute());
    let base = absolute("XDG_CONFIG_HOME").or_else(|| absolute("HOME").map(|h| h.join(".config")))?;
    Some(base.join("palisade/palisade.toml"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One system socket per system, and the default of `[clients]`: macOS's
    /// where launchd's LaunchDaemon listens, Linux's in the unit's runtime
    /// directory.
    #[test]
    fn the_system_socket_is_this_systems() {
        let expected = match cfg!(target_os = "macos") {
            true => "/var/run/palisade.sock",
            false => "/run/palisade/palisade.sock",
        };
        assert_eq!(SYSTEM_SOCKET, expected);
        assert_eq!(ClientsConfig::default().system_socket, PathBuf::from(expected));
        assert_ne!(LINUX_SYSTEM_SOCKET, MACOS_SYSTEM_SOCKET);
    }
}
