use clap::Parser;

fn main() {
    std::process::exit(palisade_broker::cli::main(palisade_broker::cli::Cli::parse()));
}
