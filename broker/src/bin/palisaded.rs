/// `palisaded cli ARGS...` serves the command line `palisade ARGS...` that
/// the CLI handed over (`palisade_cli::hand_over`); anything else is the
/// daemon's own.
fn handed_over() -> Option<impl Iterator<Item = std::ffi::OsString>> {
    let mut args = std::env::args_os().skip(1).peekable();
    (args.peek().is_some_and(|a| a == palisade_cli::HANDED_OVER)).then(|| args.skip(1))
}

#[cfg(target_os = "linux")]
fn main() {
    use clap::Parser;
    if let Some(args) = handed_over() {
        std::process::exit(palisade_broker::cli::handed_over(args));
    }
    palisade_broker::serve::memory::tune_allocator();
    std::process::exit(palisade_broker::serve::daemon::main(palisade_broker::serve::daemon::Args::parse()));
}

/// macOS: the broker runs commands under Seatbelt; `palisade` is its CLI.
#[cfg(target_os = "macos")]
fn main() {
    use clap::Parser;
    if let Some(args) = handed_over() {
        let argv = std::iter::once("palisade".into()).chain(args);
        let cli = match palisade_broker::mac::cli::Cli::try_parse_from(argv) {
            Ok(cli) => cli,
            // --help and --version exit 0; a usage error is palisade failing, not the command.
            Err(e) if !e.use_stderr() => e.exit(),
            Err(e) => {
                let _ = e.print();
                std::process::exit(palisade_cli::EXIT_PALISADE);
            }
        };
        std::process::exit(palisade_broker::mac::cli::palisade(cli));
    }
    std::process::exit(palisade_broker::mac::cli::palisaded(palisade_broker::mac::cli::DaemonArgs::parse()));
}

/// No jail on this system: refused before anything is served (and so is
/// every command of `palisade`, handed over here).
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn main() {
    let program = if handed_over().is_some() { "palisade" } else { "palisaded" };
    std::process::exit(palisade_broker::elsewhere::refuse(program));
}
