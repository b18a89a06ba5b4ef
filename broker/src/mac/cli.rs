//! The binaries on macOS. `palisaded`: the broker with the [`Macos`]
//! executor, living the life every daemon shares ([`crate::serve::start`]:
//! the one server, `SIGHUP` reloads, `SIGTERM` stops) on the socket launchd
//! hands it (its plist's `Sockets` entry `Listeners`, see `launchd/`), or on
//! one it binds. `palisade run`: a command run by that broker embedded in
//! the CLI, under the policy `--policy` names (the built-in default without).

use crate::cli::run::{Render, RenderSink, RunArgs, fail, request};
use crate::decide::service::Broker;
use crate::host::peer::Peer;
use crate::logs::init_tracing;
use crate::seatbelt::SANDBOX_EXEC;
use crate::seatbelt::executor::Macos;
use crate::serve::start::Daemon;
use clap::{Parser, Subcommand};
use palisade_policy::Config;
use palisade_protocol::wire::ErrorKind;
use std::path::{Path, PathBuf};

/// The name of the `Sockets` entry of the launchd plists.
pub const LAUNCHD_SOCKETS: &str = "Listeners";

/// palisade's broker: serves sandboxed runs on a Unix socket (macOS: Seatbelt).
#[derive(Parser, Debug)]
#[command(name = "palisaded", version, long_about = None)]
pub struct DaemonArgs {
    /// Configuration file (TOML); see palisade.example.toml.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Socket path [default: $TMPDIR/palisade/palisade.sock, or
    /// /var/run/palisade.sock for root]. Ignored when launchd
    /// passes the socket.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

/// Run commands in a kernel-enforced sandbox (macOS: Seatbelt).
#[derive(Parser, Debug)]
#[command(name = "palisade", version, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a command in a sandbox, with a broker embedded in this process.
    ///
    /// Exits with the command's status, 128+N if it died of signal N, and 125
    /// when palisade refused or failed (with a one-line message naming the error kind).
    /// When the command ended by itself but its writes did not all land in the
    /// workspace (held for review, partly applied, or discarded), 123: the
    /// command's own status is in the line on stderr and in --json's result.
    Run(RunArgs),
}

/// This Mac, as the policy sees it.
fn broker(config: Config) -> Result<Broker<Macos>, String> {
    crate::mac::broker(config, PathBuf::from(SANDBOX_EXEC), || super::host::gather(Path::new(SANDBOX_EXEC)))
}

fn load(path: Option<&Path>) -> Result<Config, String> {
    path.map(Config::load).transpose().map(Option::unwrap_or_default).map_err(|e| e.to_string())
}

/// `palisade`'s main.
pub fn palisade(cli: Cli) -> i32 {
    let Command::Run(args) = cli.command;
    // Its broker is its user's, root's included: never the system daemon's directories.
    crate::host::privilege::mark_embedded();
    init_tracing("warn");
    let mut render = Render::new(args.json);
    if args.socket.is_some() {
        let why = "--socket: palisade run on macOS runs its own broker; a running palisaded is not used yet";
        return fail(ErrorKind::InvalidRequest, why);
    }
    let edited = |mut c: Config| -> Result<Config, String> {
        let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
        crate::cli::run::edit(&args.sandbox, &mut c, &cwd)?;
        crate::cli::run::raise_limits(&args, &mut c)?;
        Ok(c)
    };
    let (config, request) =
        match load(args.policy.as_deref()).and_then(edited).and_then(|c| Ok((c, request(&args)?))) {
            Ok(both) => both,
            Err(e) => return fail(ErrorKind::InvalidRequest, e),
        };
    render.by(format!("embedded (policy: {})", config.source_name()));
    let broker = match broker(config) {
        Ok(b) => b,
        Err(e) => return fail(ErrorKind::Unavailable, e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => return fail(ErrorKind::RuntimeFailure, format!("cannot start the runtime: {e}")),
    };
    let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
    let me = Peer { uid, gid, pid: Some(std::process::id() as i32), groups: Vec::new() };
    let outcome = runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        // Interrupted (^C), terminated or hung up: the run is killed, and so
        // reported. The command has a process group of its own, so without
        // these it would outlive palisade: no handlers, no run.
        let kinds = (SignalKind::interrupt(), SignalKind::terminate(), SignalKind::hangup());
        let (Ok(mut a), Ok(mut b), Ok(mut c)) = (signal(kinds.0), signal(kinds.1), signal(kinds.2)) else {
            let why = "cannot install the signal handlers that kill a run when palisade is stopped";
            return Err(palisade_protocol::wire::ErrorReply::new(ErrorKind::RuntimeFailure, why));
        };
        let cancel = async move {
            tokio::select! { _ = a.recv() => {}, _ = b.recv() => {}, _ = c.recv() => {} }
        };
        let stdin = crate::cli::run::own_input(&request, false).map(crate::cli::run::OwnInput::start);
        let ran = broker.run(&me, &request, &mut RenderSink::new(&mut render, stdin, false), cancel).await;
        ran.map_err(palisade_protocol::wire::ErrorReply::from)
    });
    render.finish(outcome)
}

/// `palisaded`'s main: the life every daemon shares
/// ([`crate::serve::start`]), SIGHUP's reload included.
pub fn palisaded(args: DaemonArgs) -> i32 {
    init_tracing("info");
    crate::serve::start::main(args.config.as_deref(), args.socket, broker)
}

/// macOS's part of a daemon's life: launchd's socket. Seatbelt keeps
/// nothing between runs, so it has nothing to start or stop.
impl Daemon for Macos {
    const MANAGER: &'static str = "launchd";

    /// launchd's socket when it started this broker for one (the plists'
    /// `Sockets` entry [`LAUNCHD_SOCKETS`]).
    fn activated() -> std::io::Result<Option<std::os::unix::net::UnixListener>> {
        #[cfg(target_os = "macos")]
        if let Some(fd) = super::launchd::activated(LAUNCHD_SOCKETS)?.and_then(|fds| fds.into_iter().next()) {
            return Ok(Some(std::os::unix::net::UnixListener::from(fd)));
        }
        Ok(None)
    }
}
