//! A daemon's life, the same on every system: its configuration loaded,
//! its broker assembled, the socket the service manager hands over (or one
//! of its own) served by the one server, `SIGHUP` reading the configuration
//! again ([`Server::reload`]), `SIGTERM` or `SIGINT` a graceful stop, each
//! step logged and the start and stop journaled. What differs per system is
//! a [`Daemon`]: who hands the socket over (systemd on Linux, launchd on
//! macOS) and what the executor does around the serving (Linux's `/etc`
//! snapshot, warm pool, readiness and cgroups).

use crate::decide::service::Broker;
use crate::engine::executor::Executor;
use crate::journal::Event;
use crate::serve::server::Server;
use palisade_policy::{Config, ConfigError};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// Exit status when the configuration or the broker's set-up is refused.
pub const EXIT_CONFIG: i32 = 2;
/// Exit status when the broker cannot run (no runtime, no socket).
pub const EXIT_FAILED: i32 = 1;

/// What a system adds to a daemon's life: the executor's part at its edges
/// and the service manager's socket. Each hook has nothing to do by default.
pub trait Daemon: Executor {
    /// The service manager that may start the daemon with its socket, as
    /// the log names it.
    const MANAGER: &'static str;

    /// The configuration when no file is named: the built-in one.
    fn unnamed_configuration() -> Result<Config, ConfigError> {
        Ok(Config::default())
    }

    /// The listening socket the service manager made, when it started this
    /// process for one; an error when it did and the socket cannot be had
    /// (a daemon it started must not bind one of its own instead).
    fn activated() -> std::io::Result<Option<std::os::unix::net::UnixListener>>;

    /// Before the socket accepts: what the first request should not pay for.
    fn before_listening(&self) {}

    /// Listening: what starts now, and the service manager told.
    fn listening(&self) {}

    /// What the serving leaves to finish before the stop is recorded: made
    /// at the start (it holds what it needs), run once the server is done.
    fn wind_down(&self) -> impl Future<Output = ()> + Send + 'static {
        async {}
    }

    /// What goes once the stop is recorded: made at the start, like
    /// [`Daemon::wind_down`].
    fn after_stop(&self) -> impl Future<Output = ()> + Send + 'static {
        async {}
    }
}

/// The configuration `path` names, or the system's without one
/// ([`Daemon::unnamed_configuration`]).
pub fn configuration<E: Daemon>(path: Option<&Path>) -> Result<Config, String> {
    match path {
        Some(path) => Config::load(path),
        None => E::unnamed_configuration(),
    }
    .map_err(|e| e.to_string())
}

/// `palisaded`'s life from its configuration to its exit status: the
/// broker `assemble` makes of it served on `socket` (else the
/// configuration's, else the default one), until `SIGTERM` or `SIGINT`.
pub fn main<E: Daemon>(
    config: Option<&Path>,
    socket: Option<PathBuf>,
    assemble: impl FnOnce(Config) -> Result<Broker<E>, String>,
) -> i32 {
    let config = match configuration::<E>(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("palisaded: {e}");
            return EXIT_CONFIG;
        }
    };
    // What SIGHUP reads again: --config's file, or the user's own.
    let source = config.source.clone();
    let socket =
        socket.or_else(|| config.broker.socket.clone()).unwrap_or_else(crate::host::paths::default_socket);
    let mode = config.broker.socket_mode;
    if let Err(e) = crate::host::paths::fallback_socket_dir(&socket) {
        eprintln!("palisaded: {e}");
        return EXIT_CONFIG;
    }
    crate::serve::socket::raise_open_file_limit();
    // Before any thread exists: Linux's probe of user namespaces forks.
    let broker = match assemble(config) {
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
    let serving = serve(broker, socket, mode, source, terminated());
    runtime.block_on(async move { tokio::spawn(serving).await.unwrap_or(EXIT_FAILED) })
}

/// Completes at the first `SIGTERM` or `SIGINT`, logging which. Where the
/// handlers cannot be installed it never completes: the broker serves on
/// (and the signals keep their default, which ends it).
pub async fn terminated() {
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        tracing::error!("cannot install signal handlers");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
}

/// Until shutdown: each `SIGHUP` reloads the configuration file (`None`:
/// the built-in one, which has nothing to read again).
async fn reload_on_hangup<E: Executor>(server: Arc<Server<E>>, mut hangup: Signal, config: Option<PathBuf>) {
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

/// Serves `broker` on the service manager's socket or on `socket` (made
/// with `mode`), reloading `config` at each `SIGHUP`, until `stop`
/// completes; then stops gracefully. The exit status.
pub async fn serve<E: Daemon>(
    broker: Broker<E>,
    socket: PathBuf,
    mode: u32,
    config: Option<PathBuf>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> i32 {
    // Taken from the start: SIGHUP's default would end the broker.
    let hangup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("palisaded: cannot handle SIGHUP: {e}");
            return EXIT_FAILED;
        }
    };
    crate::serve::socket::keep_socket_out_of_reach(&broker, &socket);
    let journal = broker.journal.clone();
    let pid = std::process::id();
    if let Err(e) = journal.append_many(started(&journal, pid, broker.context.uid)).await {
        eprintln!("palisaded: {e}");
        return EXIT_FAILED;
    }
    broker.executor.before_listening();
    let (listener, owned_path) = match listen::<E>(&socket, mode) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("palisaded: cannot listen on {}: {e}", socket.display());
            return EXIT_FAILED;
        }
    };
    let (stopping, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        stop.await;
        let _ = stopping.send(true);
    });
    match &owned_path {
        Some(p) => tracing::info!(socket = %p.display(), "listening"),
        None => tracing::info!("listening on the socket passed by {}", E::MANAGER),
    }
    broker.executor.listening();
    let (wind_down, after_stop) = (broker.executor.wind_down(), broker.executor.after_stop());
    let server = Arc::new(Server::new(broker));
    let reloads = tokio::spawn(reload_on_hangup(server.clone(), hangup, config));
    server.serve(listener, stopped).await;
    reloads.abort();
    wind_down.await;
    if let Err(e) = journal.append_last(Event::BrokerStopped { pid }).await {
        tracing::error!("{e}");
    }
    after_stop.await;
    if let Some(p) = owned_path {
        let _ = std::fs::remove_file(&p);
    }
    tracing::info!("stopped");
    0
}

/// The start's records: first what a broker that died left unsaid (its
/// unfinished runs, its missing stop), then this one's start.
fn started(journal: &crate::journal::Journal, pid: u32, uid: u32) -> Vec<Event> {
    let mut events = Vec::new();
    for lost in journal.dir().map(crate::journal::crash::lost).unwrap_or_default() {
        tracing::warn!(broker = %lost.broker, runs = ?lost.runs, "a broker ended without recording it");
        let tag = lost.broker;
        events.extend(lost.runs.into_iter().map(|run_id| Event::RunLost { lost: tag.clone(), run_id }));
        if lost.unclean {
            events.push(Event::BrokerLost { lost: tag });
        }
    }
    events.push(Event::BrokerStarted { pid, uid, version: env!("CARGO_PKG_VERSION").into() });
    events
}

/// The service manager's socket when it started this broker with one;
/// otherwise `path`, bound here with `mode` (and returned, to be removed at
/// the end).
fn listen<E: Daemon>(path: &Path, mode: u32) -> std::io::Result<(tokio::net::UnixListener, Option<PathBuf>)> {
    match E::activated()? {
        Some(listener) => {
            let _ = listener.set_nonblocking(true);
            Ok((tokio::net::UnixListener::from_std(listener)?, None))
        }
        None => Ok((crate::serve::socket::bind(path, mode)?, Some(path.to_path_buf()))),
    }
}
