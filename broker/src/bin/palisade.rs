#[cfg(target_os = "linux")]
use clap::Parser;

#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: palisade_broker::arena::Arena = palisade_broker::arena::Arena::new();

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

/// No jail on this system: `palisade run` (and every other command, all of
/// which need a broker) is refused with the reason.
#[cfg(not(target_os = "linux"))]
fn main() {
    std::process::exit(palisade_broker::elsewhere::refuse("palisade"));
}
