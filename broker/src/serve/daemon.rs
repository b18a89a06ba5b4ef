//! palisaded on Linux: its command line, `--check-config`, and what Linux
//! adds to the life every daemon shares ([`crate::serve::start`]).

use crate::decide::service::Broker;
use crate::engine::linux::Linux;
pub use crate::logs::init_tracing;
use crate::serve::start::{self, Daemon, EXIT_CONFIG};
use crate::serve::systemd;
use clap::Parser;
use palisade_policy::{Config, ConfigError};
use std::future::Future;
use std::path::PathBuf;

/// palisade's broker: serves sandboxed runs on a Unix socket.
#[derive(Parser, Debug)]
#[command(name = "palisaded", version, long_about = None)]
pub struct Args {
    /// Configuration file (TOML); see palisade.example.toml.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Socket path [default: $XDG_RUNTIME_DIR/palisade/palisade.sock, else
    /// /run/user/UID/palisade/palisade.sock, else (no such directory)
    /// $TMPDIR/palisade-UID/palisade.sock, private to the user; or
    /// /run/palisade/palisade.sock for root]. Ignored under socket activation.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// palisade-helper to spawn [default: next to this binary].
    #[arg(long, value_name = "PATH")]
    pub helper: Option<PathBuf>,
    /// Check FILE as a start would (its syntax and values, the users and
    /// groups it names, its Cedar policies, the sandbox ids and the helper),
    /// print `FILE: ok` or the error, and exit 0, or 2 when it would be
    /// refused. Nothing is started, written or changed.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["config", "socket"])]
    pub check_config: Option<PathBuf>,
}

pub fn main(args: Args) -> i32 {
    if let Some(file) = &args.check_config {
        return check_config(file, args.helper.clone());
    }
    init_tracing("info");
    let helper = args.helper.clone();
    start::main::<Linux>(args.config.as_deref(), args.socket.clone(), |config| {
        Broker::assemble(config, helper)
    })
}

/// `palisaded --check-config FILE`: the file checked as a start checks it
/// (see [`crate::engine::linux::check_config`]), nothing made; `FILE: ok` and 0,
/// or the error and [`EXIT_CONFIG`].
fn check_config(file: &std::path::Path, helper: Option<PathBuf>) -> i32 {
    let checked = Config::load(file)
        .map_err(|e| e.to_string())
        .and_then(|config| crate::engine::linux::check_config(&config, helper));
    match checked {
        Ok(_) => {
            println!("{}: ok", file.display());
            0
        }
        Err(e) => {
            eprintln!("palisaded: {e}");
            EXIT_CONFIG
        }
    }
}

/// Linux's part of a daemon's life: systemd's socket and readiness, and
/// the engine's `/etc` snapshot, warm pool and cgroups.
impl Daemon for Linux {
    const MANAGER: &'static str = "systemd";

    /// A user's daemon runs under the user's own configuration where there
    /// is one; a system broker under the built-in one.
    fn unnamed_configuration() -> Result<Config, ConfigError> {
        match crate::host::privilege::serves_others() {
            true => Ok(Config::default()),
            false => Config::own_or_default(),
        }
    }

    fn activated() -> std::io::Result<Option<std::os::unix::net::UnixListener>> {
        Ok(systemd::activated_listener())
    }

    /// The first /etc snapshot (and its inotify watch), before the socket
    /// accepts a request rather than during the first one.
    fn before_listening(&self) {
        drop(self.etc.as_ref().and_then(|e| e.current()));
    }

    fn listening(&self) {
        self.engine.warm_up();
        systemd::notify("READY=1");
    }

    /// Sandboxes answered but still exiting, then the pools' sandboxes and
    /// helpers, go before the cgroups are swept.
    fn wind_down(&self) -> impl Future<Output = ()> + Send + 'static {
        let (teardowns, close_pools) = (self.engine.teardowns(), self.engine.closer());
        async move {
            if !teardowns.settle(std::time::Duration::from_secs(5)).await {
                tracing::warn!("a sandbox is still being torn down after 5 s; stopping without it");
            }
            let _ = tokio::task::spawn_blocking(close_pools).await;
            systemd::notify("STOPPING=1");
        }
    }

    /// Runs cut short at shutdown leave no cgroup behind.
    fn after_stop(&self) -> impl Future<Output = ()> + Send + 'static {
        let cgroups = self.cgroups.clone();
        async move {
            let _ = tokio::task::spawn_blocking(move || cgroups.remove_own()).await;
        }
    }
}

pub use crate::serve::socket::keep_socket_out_of_reach;
