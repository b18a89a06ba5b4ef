use clap::Parser;

#[global_allocator]
static ALLOCATOR: palisade_broker::arena::Arena = palisade_broker::arena::Arena::new();

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
