//! palisaded: the long-running broker.

use crate::decide::service::Broker;
use crate::host::paths;
use crate::journal::Event;
pub use crate::logs::init_tracing;
use crate::serve::server::Server;
use crate::serve::socket::{bind, raise_open_file_limit};
use crate::serve::systemd;
use clap::Parser;
use palisade_policy::Config;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// Exit status when the configuration or the broker's set-up is refused.
const EXIT_CONFIG: i32 = 2;
/// Exit status when the broker cannot run (no runtime, no socket).
const EXIT_FAILED: i32 = 1;

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
    let config = match &args.config {
        Some(path) => match Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("palisaded: {e}");
                return EXIT_CONFIG;
            }
        },
        // A user's daemon: the user's own configuration where there is one.
        None if crate::host::privilege::serves_others() => Config::default(),
        None => match Config::own_or_default() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("palisaded: {e}");
                return EXIT_CONFIG;
            }
        },
    };
    // What SIGHUP reads again: --config's file, or the user's own.
    let source = config.source.clone();
    let socket =
        args.socket.clone().or_else(|| config.broker.socket.clone()).unwrap_or_else(paths::default_socket);
    let mode = config.broker.socket_mode;
    if let Err(e) = paths::fallback_socket_dir(&socket) {
        eprintln!("palisaded: {e}");
        return EXIT_CONFIG;
    }
    raise_open_file_limit();
    // Before any thread exists: the probe of user namespaces forks.
    let broker = match Broker::assemble(config, args.helper.clone()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("palisaded: {e}");
            return EXIT_CONFIG;
        }
    };
    if let Err(e) = broker.journal.check_newest() {
        eprintln!("palisaded: {e}");
        return EXIT_CONFIG;
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().thread_keep_alive(crate::serve::server::BLOCKING_KEEP_ALIVE);
    let runtime = match builder.build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("palisaded: cannot start the runtime: {e}");
            return EXIT_FAILED;
        }
    };
    // Served from a worker rather than this thread: each connection's task
    // then starts on the worker that accepted it, with no thread to wake.
    let config = source;
    runtime.block_on(
        async move { tokio::spawn(serve(broker, socket, mode, config)).await.unwrap_or(EXIT_FAILED) },
    )
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

/// Until shutdown: each `SIGHUP` reloads the configuration file (`None`:
/// the built-in one, which has nothing to read again).
async fn reload_on_hangup(server: Arc<Server>, mut hangup: Signal, config: Option<PathBuf>) {
    while hangup.recv().await.is_some() {
        match &config {
            Some(path) => {
                tracing::info!(config = %path.display(), "SIGHUP: reloading the configuration");
                server.reload(path).await;
            }
            None => {
                tracing::warn!(
                    "SIGHUP: no configuration file (--config, or the user's own) to reload; the built-in one stays"
                )
            }
        }
    }
}

async fn serve(broker: Broker, socket: PathBuf, mode: u32, config: Option<PathBuf>) -> i32 {
    // Taken from the start: SIGHUP's default would end the broker.
    let hangup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("palisaded: cannot handle SIGHUP: {e}");
            return EXIT_FAILED;
        }
    };
    keep_socket_out_of_reach(&broker, &socket);
    let journal = broker.journal.clone();
    let pid = std::process::id();
    // What a broker that died left unsaid: its unfinished runs, its missing stop.
    let mut events = Vec::new();
    for lost in journal.dir().map(crate::journal::crash::lost).unwrap_or_default() {
        tracing::warn!(broker = %lost.broker, runs = ?lost.runs, "a broker ended without recording it");
        let tag = lost.broker;
        events.extend(lost.runs.into_iter().map(|run_id| Event::RunLost { lost: tag.clone(), run_id }));
        if lost.unclean {
            events.push(Event::BrokerLost { lost: tag });
        }
    }
    events.push(Event::BrokerStarted {
        pid,
        uid: broker.context.uid,
        version: env!("CARGO_PKG_VERSION").into(),
    });
    if let Err(e) = journal.append_many(events).await {
        eprintln!("palisaded: {e}");
        return EXIT_FAILED;
    }
    // The first /etc snapshot (and its inotify watch), before the socket
    // accepts a request rather than during the first one.
    drop(broker.executor.etc.as_ref().and_then(|e| e.current()));
    let (listener, owned_path) = match systemd::activated_listener() {
        Some(l) => {
            let _ = l.set_nonblocking(true);
            (tokio::net::UnixListener::from_std(l), None)
        }
        None => (bind(&socket, mode), Some(socket.clone())),
    };
    let listener = match listener {
        Ok(l) => l,
        Err(e) => {
            eprintln!("palisaded: cannot listen on {}: {e}", socket.display());
            return EXIT_FAILED;
        }
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
        else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM"),
            _ = int.recv() => tracing::info!("SIGINT"),
        }
        let _ = stop.send(true);
    });
    match &owned_path {
        Some(p) => tracing::info!(socket = %p.display(), "listening"),
        None => tracing::info!("listening on the socket passed by systemd"),
    }
    broker.executor.engine.warm_up();
    systemd::notify("READY=1");
    let cgroups = broker.executor.cgroups.clone();
    let close_pools = broker.executor.engine.closer();
    let teardowns = broker.executor.engine.teardowns();
    let server = Arc::new(Server::new(broker));
    let reloads = tokio::spawn(reload_on_hangup(server.clone(), hangup, config));
    server.serve(listener, stopped).await;
    reloads.abort();
    // Sandboxes answered but still exiting, then the pools' sandboxes and
    // helpers, go before the cgroups are swept.
    if !teardowns.settle(std::time::Duration::from_secs(5)).await {
        tracing::warn!("a sandbox is still being torn down after 5 s; stopping without it");
    }
    let _ = tokio::task::spawn_blocking(close_pools).await;
    systemd::notify("STOPPING=1");
    if let Err(e) = journal.append_last(Event::BrokerStopped { pid }).await {
        tracing::error!("{e}");
    }
    // Runs cut short at shutdown leave no cgroup behind.
    let _ = tokio::task::spawn_blocking(move || cgroups.remove_own()).await;
    if let Some(p) = owned_path {
        let _ = std::fs::remove_file(&p);
    }
    tracing::info!("stopped");
    0
}

pub use crate::serve::socket::keep_socket_out_of_reach;
