#[cfg(target_os = "linux")]
use clap::Parser;

#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: palisade_broker::cli::arena::Arena = palisade_broker::cli::arena::Arena::new();

#[cfg(target_os = "linux")]
fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(cli) = palisade_broker::cli::parse_common_run(&args) {
        std::process::exit(palisade_broker::cli::main(cli));
    }
    let cli = match palisade_broker::cli::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        // --help and --version exit 0; a usage error is palisade failing, not the command.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let _ = e.print();
            std::process::exit(palisade_broker::cli::EXIT_PALISADE);
        }
    };
    std::process::exit(palisade_broker::cli::main(cli));
}

/// macOS: `palisade run` with a broker embedded, under Seatbelt.
#[cfg(target_os = "macos")]
fn main() {
    use clap::Parser;
    let cli = match palisade_broker::mac::cli::Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version exit 0; a usage error is palisade failing, not the command.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let _ = e.print();
            std::process::exit(palisade_broker::cli::run::EXIT_PALISADE);
        }
    };
    std::process::exit(palisade_broker::mac::cli::palisade(cli));
}

/// No jail on this system: `palisade run` (and every other command, all of
/// which need a broker) is refused with the reason.
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn main() {
    std::process::exit(palisade_broker::elsewhere::refuse("palisade"));
}
