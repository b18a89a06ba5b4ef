use clap::Parser;
use palisade_cli::Cli;

#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: palisade_cli::arena::Arena = palisade_cli::arena::Arena::new();

fn main() {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // `palisade help [COMMAND]`: the help of the whole command line, palisaded's.
    if argv.get(1).is_some_and(|a| a == "help") {
        std::process::exit(palisade_cli::hand_over(&argv));
    }
    #[cfg(target_os = "linux")]
    if let Some(cli) = palisade_cli::common::parse_common_run(&argv) {
        std::process::exit(palisade_cli::main(cli, &argv));
    }
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        // --help and --version exit 0; a usage error is palisade failing, not the command.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let _ = e.print();
            std::process::exit(palisade_cli::EXIT_PALISADE);
        }
    };
    std::process::exit(palisade_cli::main(cli, &argv));
}
