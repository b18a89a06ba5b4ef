//! Where the broker's and the CLI's logs go: stderr, filtered by
//! `PALISADE_LOG` (or `RUST_LOG`), else at the level the caller names; and
//! how a flood of like warnings is counted instead of logged line by line.

pub mod refusals;

/// Installs the log subscriber; a second call changes nothing.
pub fn init_tracing(default: &str) {
    let filter = std::env::var("PALISADE_LOG")
        .ok()
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .or_else(|| tracing_subscriber::EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(default));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
