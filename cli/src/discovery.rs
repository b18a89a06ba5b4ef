//! Which broker a command of the CLI goes to. `--socket` names one, which
//! must answer; `$PALISADE_SOCKET` names one, or else an embedded broker
//! runs. With neither: the user's own broker, then the system broker, then
//! an embedded one, unless the system configuration requires the system
//! broker (`[clients] require_system_broker`). Only "nothing there" (no
//! socket, a socket nobody listens on) falls through to the next: a broker
//! that is there and refuses (the socket's permissions, or `Unauthorized`)
//! is an error that says what to do, never replaced by an embedded broker.
//!
//! The CLI reads two things of the system configuration
//! (`/etc/palisade/palisade.toml`, world-readable on an install, or
//! `$PALISADE_SYSTEM_CONFIG`), and only when it looks past the user's own
//! broker or journal: its `[clients]` table and `[journal] path`.

use crate::client::{Client, ClientError};
use palisade_protocol::clients::ClientsConfig;
use palisade_protocol::wire::ErrorKind;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

pub use crate::args::BrokerArgs;

/// The variable that names the system configuration instead of [`SYSTEM_CONFIG`].
pub const SYSTEM_CONFIG_ENV: &str = "PALISADE_SYSTEM_CONFIG";
/// The system broker's configuration, as the system unit starts it.
pub const SYSTEM_CONFIG: &str = "/etc/palisade/palisade.toml";
/// The system broker's journal, where its configuration names none.
pub const SYSTEM_JOURNAL: &str = "/var/lib/palisade/journal";

/// What the CLI reads of the system configuration.
#[derive(Debug, Clone)]
pub struct SystemConfig {
    pub path: PathBuf,
    /// The file exists: palisade is installed as a system service here.
    pub installed: bool,
    pub clients: ClientsConfig,
    /// `[journal] path`: where the system broker keeps its journal.
    pub journal: Option<PathBuf>,
}

impl SystemConfig {
    /// The system configuration: `$PALISADE_SYSTEM_CONFIG`, else
    /// [`SYSTEM_CONFIG`]; the defaults when there is no such file. One that
    /// cannot be read or parsed is an error: it may say that the system
    /// broker is required.
    pub fn load() -> Result<SystemConfig, DiscoveryError> {
        let path = std::env::var_os(SYSTEM_CONFIG_ENV)
            .filter(|p| !p.is_empty())
            .map_or_else(|| PathBuf::from(SYSTEM_CONFIG), PathBuf::from);
        SystemConfig::load_from(path)
    }

    /// [`SystemConfig::load`] from `path`.
    pub fn load_from(path: PathBuf) -> Result<SystemConfig, DiscoveryError> {
        let bad = |why: String| DiscoveryError::SystemConfig { path: path.clone(), why };
        let mut config = SystemConfig {
            path: path.clone(),
            installed: false,
            clients: ClientsConfig::default(),
            journal: None,
        };
        let text = match std::fs::read_to_string(&config.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(config),
            Err(e) => return Err(bad(format!("cannot read it ({e}); it must be readable by every user"))),
        };
        config.installed = true;
        let table: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if let Some(clients) = table.get("clients") {
            config.clients = clients.clone().try_into().map_err(|e| bad(format!("[clients]: {e}")))?;
        }
        let journal = table.get("journal").and_then(|j| j.get("path"));
        if let Some(path) = journal {
            let path = path.as_str().map(PathBuf::from).filter(|p| p.is_absolute());
            config.journal = Some(path.ok_or_else(|| bad("[journal] path: not an absolute path".into()))?);
        }
        Ok(config)
    }

    /// The system broker's journal.
    pub fn journal_dir(&self) -> PathBuf {
        self.journal.clone().unwrap_or_else(|| PathBuf::from(SYSTEM_JOURNAL))
    }
}

/// Which broker answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// Named with `--socket` or `$PALISADE_SOCKET`.
    Named,
    /// The user's own, at the default socket.
    Own,
    /// The system broker (`[clients] system_socket`).
    System,
}

/// A broker that answers, connected.
pub struct Found {
    pub socket: PathBuf,
    pub which: Which,
    pub client: Client,
}

impl Found {
    /// Which broker it is, for people: `the broker on PATH`, `the system broker on PATH`.
    pub fn name(&self) -> String {
        name(self.which, &self.socket)
    }
}

fn name(which: Which, socket: &Path) -> String {
    match which {
        Which::System => format!("the system broker on {}", socket.display()),
        Which::Named | Which::Own => format!("the broker on {}", socket.display()),
    }
}

/// The socket of the user's own broker: the one `palisaded` serves by
/// default when this user starts it. A process that serves other users
/// (root, or holding `CAP_SETUID`) owns the system broker's socket
/// ([`palisade_protocol::clients::SYSTEM_SOCKET`], this system's).
pub fn own_socket() -> PathBuf {
    let euid = nix::unistd::geteuid();
    if cfg!(target_os = "macos") && !euid.is_root() {
        // macOS: the user's private temporary directory.
        return std::env::temp_dir().join("palisade/palisade.sock");
    }
    if euid.is_root() || holds_setuid() {
        return PathBuf::from(palisade_protocol::clients::SYSTEM_SOCKET);
    }
    palisade_protocol::clients::user_socket(euid.as_raw())
}

/// Whether the user's own socket is where only the user could have put
/// it: anywhere but the private directory of the temporary directory,
/// which must be the user's and closed to others (one another user made
/// first in a shared `/tmp` is not the user's broker, and is passed over).
fn trusted_own(socket: &Path) -> bool {
    let uid = nix::unistd::geteuid().as_raw();
    let fallback = palisade_protocol::clients::user_temp_dir(uid);
    socket.parent() != Some(fallback.as_path()) || palisade_protocol::clients::private_to(&fallback, uid)
}

/// Whether `CAP_SETUID` (7) is in this process's effective set, as
/// `/proc/self/status` says (Linux); false where it cannot be read.
fn holds_setuid() -> bool {
    const CAP_SETUID: u32 = 7;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    let effective = status.lines().find_map(|l| l.strip_prefix("CapEff:"));
    effective
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|set| set >> CAP_SETUID & 1 == 1)
}

/// Where a command goes.
pub enum Route {
    Broker(Box<Found>),
    /// No broker answers, and an embedded one may run; `tried` says where
    /// none answered.
    Embedded {
        tried: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// A broker is there and refuses this user.
    #[error(
        "{} refuses uid {uid}: {why}. {}; no embedded broker runs in its place",
        name(*.which, .socket),
        advice(*.which)
    )]
    Refused { socket: PathBuf, which: Which, uid: u32, why: String, kind: ErrorKind },
    /// The system broker answered the hello with another error (`Busy`, say).
    #[error("{}: {message}", name(Which::System, .socket))]
    Answered { socket: PathBuf, kind: ErrorKind, message: String },
    /// The socket named with `--socket` does not answer.
    #[error("{}: {source}", .socket.display())]
    Named { socket: PathBuf, source: std::io::Error },
    /// The system configuration requires the system broker, which does not answer.
    #[error(
        "this machine requires the system broker ([clients] require_system_broker in {}): {}",
        .config.display(), .why
    )]
    Required { config: PathBuf, why: String },
    /// The system configuration cannot be read.
    #[error("the system configuration {}: {why}", .path.display())]
    SystemConfig { path: PathBuf, why: String },
    /// Connecting, or the broker's first answer, failed otherwise.
    #[error("{}: {why}", .socket.display())]
    Broken { socket: PathBuf, why: String },
}

/// What a user refused by a broker can do about it.
fn advice(which: Which) -> &'static str {
    match which {
        Which::System => {
            "Ask its administrator to let you use it (the palisade group, named in [broker] allowed_gids)"
        }
        Which::Named | Which::Own => {
            "Whoever runs it lets other users in with its socket's mode and [broker] allowed_uids or allowed_gids"
        }
    }
}

impl DiscoveryError {
    /// The kind a client sees.
    pub fn kind(&self) -> ErrorKind {
        match self {
            DiscoveryError::Refused { kind, .. } | DiscoveryError::Answered { kind, .. } => *kind,
            DiscoveryError::Named { .. } | DiscoveryError::Broken { .. } => ErrorKind::RuntimeFailure,
            DiscoveryError::Required { .. } => ErrorKind::Unavailable,
            DiscoveryError::SystemConfig { .. } => ErrorKind::InvalidRequest,
        }
    }
}

/// The broker for a command: `flag` (`--socket`) if given, else
/// `$PALISADE_SOCKET`, else the user's own, else the system broker; else
/// [`Route::Embedded`], unless the command `runs` something (an embedded
/// broker would run it) and the system broker is required.
pub fn find(flag: Option<&Path>, runs: bool) -> Result<Route, DiscoveryError> {
    if let Some(socket) = flag {
        return match UnixStream::connect(socket) {
            Ok(stream) => found(socket, Which::Named, stream).map(|f| Route::Broker(Box::new(f))),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                Err(refused(socket, Which::Named, e))
            }
            Err(source) => Err(DiscoveryError::Named { socket: socket.to_path_buf(), source }),
        };
    }
    if let Some(socket) = std::env::var_os("PALISADE_SOCKET").filter(|s| !s.is_empty()) {
        let socket = PathBuf::from(socket);
        if let Some(f) = answering(&socket, Which::Named)? {
            return Ok(Route::Broker(Box::new(f)));
        }
        if runs {
            may_embed(&format!(
                "no broker answers on {} ($PALISADE_SOCKET), and no embedded broker runs in its place",
                socket.display()
            ))?;
        }
        return Ok(Route::Embedded { tried: socket.display().to_string() });
    }
    let own = own_socket();
    let mine = if trusted_own(&own) { answering(&own, Which::Own)? } else { None };
    if let Some(f) = mine {
        return Ok(Route::Broker(Box::new(f)));
    }
    let system = SystemConfig::load()?;
    let socket = system.clients.system_socket.clone();
    if socket != own {
        if let Some(f) = answering(&socket, Which::System)? {
            return Ok(Route::Broker(Box::new(f)));
        }
    }
    if runs && system.clients.require_system_broker {
        let why = format!(
            "it does not answer on {}, and no embedded broker runs in its place; ask the administrator \
             to start it (systemctl start palisade.socket)",
            socket.display()
        );
        return Err(DiscoveryError::Required { config: system.path, why });
    }
    let tried = match socket == own {
        true => own.display().to_string(),
        false => format!("{} (yours) or {} (the system's)", own.display(), socket.display()),
    };
    Ok(Route::Embedded { tried })
}

/// Where a run of this user goes, for people (`palisade doctor`): the
/// broker that answers, or an embedded one and why, or why none may run.
pub fn where_runs_go() -> String {
    let own = palisade_protocol::clients::user_config().filter(|p| p.exists());
    let policy = own.map_or_else(|| "the built-in policy".to_string(), |p| p.display().to_string());
    match find(None, true) {
        Ok(Route::Broker(found)) => found.name(),
        Ok(Route::Embedded { tried }) => {
            let mut said = format!("an embedded broker under {policy} (no broker answers on {tried})");
            if SystemConfig::load().is_ok_and(|s| s.installed) {
                said.push_str(FALLBACK);
            }
            said
        }
        Err(e) => format!("none: {e}"),
    }
}

/// What a run that falls back to an embedded broker where a system broker
/// is installed is told, every time.
pub const FALLBACK: &str = ": the system broker's policy, approvals and journal do not apply to it \
     ([clients] require_system_broker = true in the system configuration refuses such a run instead)";

/// Why `--policy` is refused where the system broker is required.
pub const POLICY_EMBEDS: &str = "--policy runs an embedded broker, which it does not allow: run without --policy \
     (the system broker's policy decides)";

/// Refuses with the reason when the system configuration requires the
/// system broker: `what` is about to run an embedded broker.
pub fn may_embed(what: &str) -> Result<(), DiscoveryError> {
    let system = SystemConfig::load()?;
    match system.clients.require_system_broker {
        true => Err(DiscoveryError::Required { config: system.path, why: what.to_string() }),
        false => Ok(()),
    }
}

/// The broker at `socket`, connected; `None` when nothing is there.
fn answering(socket: &Path, which: Which) -> Result<Option<Found>, DiscoveryError> {
    match UnixStream::connect(socket) {
        Ok(stream) => found(socket, which, stream).map(Some),
        Err(e) if nothing_there(&e) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(refused(socket, which, e)),
        Err(e) => Err(DiscoveryError::Broken { socket: socket.to_path_buf(), why: e.to_string() }),
    }
}

/// "Nothing there": no socket (or no directory on the way), or a socket
/// nobody listens on (a broker that stopped without removing it).
fn nothing_there(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR | libc::ECONNREFUSED))
}

/// A connected broker. The system broker's hello is awaited here (a round
/// trip more), so that its `Unauthorized` is told with what to do; the
/// others' goes with the first request.
fn found(socket: &Path, which: Which, stream: UnixStream) -> Result<Found, DiscoveryError> {
    let broken = |why: String| DiscoveryError::Broken { socket: socket.to_path_buf(), why };
    if which == Which::Own && socket != Path::new(palisade_protocol::clients::SYSTEM_SOCKET) {
        // The user's own broker is the user's: a socket someone else listens on is not.
        // (Root's own is the system broker's, which may run as the unit's user.)
        use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
        let me = nix::unistd::geteuid().as_raw();
        let peer =
            getsockopt(&stream, PeerCredentials).map_err(|e| broken(format!("its credentials: {e}")))?;
        if peer.uid() != me {
            return Err(broken(format!(
                "the broker listening there runs as uid {}, not as this user ({me}): it is not yours; \
                 stop it, or name a broker with --socket",
                peer.uid()
            )));
        }
    }
    let mut client = Client::over(stream).map_err(|e| broken(e.to_string()))?;
    if which == Which::System {
        let socket = socket.to_path_buf();
        match client.greet() {
            Ok(()) => {}
            Err(ClientError::Reply(e)) if e.kind == ErrorKind::Unauthorized => {
                let uid = nix::unistd::getuid().as_raw();
                return Err(DiscoveryError::Refused { socket, which, uid, why: e.message, kind: e.kind });
            }
            Err(ClientError::Reply(e)) => {
                return Err(DiscoveryError::Answered { socket, kind: e.kind, message: e.message });
            }
            Err(e) => return Err(broken(e.to_string())),
        }
    }
    Ok(Found { socket: socket.to_path_buf(), which, client })
}

/// The refusal of a socket this user may not connect to.
fn refused(socket: &Path, which: Which, e: std::io::Error) -> DiscoveryError {
    let uid = nix::unistd::getuid().as_raw();
    let why = format!("its socket does not let this user connect ({e})");
    DiscoveryError::Refused { socket: socket.to_path_buf(), which, uid, why, kind: ErrorKind::Unauthorized }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str, text: Option<&str>) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("palisade-system-config-{tag}-{}.toml", std::process::id()));
        let _ = std::fs::remove_file(&path);
        if let Some(text) = text {
            std::fs::write(&path, text).unwrap();
        }
        path
    }

    /// The CLI reads `[clients]` and `[journal] path`, ignores the broker's
    /// other tables, and refuses what it cannot take; no file is the defaults.
    #[test]
    fn the_cli_reads_clients_and_the_journal_path_of_the_system_configuration() {
        let none = SystemConfig::load_from(scratch("none", None)).unwrap();
        assert_eq!(none.clients, ClientsConfig::default());
        assert_eq!(
            (none.clients.require_system_broker, none.journal_dir()),
            (false, PathBuf::from(SYSTEM_JOURNAL))
        );
        let text = "[broker]\nallowed_uids = [0]\n[clients]\nsystem_socket = \"/s.sock\"\n\
                    require_system_broker = true\n[journal]\npath = \"/srv/j\"\nreader_gid = 5\n";
        let path = scratch("full", Some(text));
        let read = SystemConfig::load_from(path.clone()).unwrap();
        assert_eq!(
            read.clients,
            ClientsConfig {
                system_socket: "/s.sock".into(),
                require_system_broker: true,
                announce_fallback: true
            }
        );
        assert_eq!(read.journal_dir(), PathBuf::from("/srv/j"));
        for (tag, bad, why) in [
            ("typo", "[clients]\nrequire_system_brokers = true\n", "[clients]: unknown field"),
            ("type", "[clients]\nrequire_system_broker = \"yes\"\n", "[clients]: invalid type"),
            ("relative", "[journal]\npath = \"journal\"\n", "[journal] path: not an absolute path"),
            ("syntax", "[clients\n", "unclosed table"),
        ] {
            let path = scratch(tag, Some(bad));
            let e = SystemConfig::load_from(path.clone()).unwrap_err().to_string();
            assert!(e.starts_with(&format!("the system configuration {}: ", path.display())), "{e}");
            assert!(e.contains(why), "{tag}: {e}");
            let _ = std::fs::remove_file(path);
        }
        let _ = std::fs::remove_file(path);
    }
}
