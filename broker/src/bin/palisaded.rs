use clap::Parser;

fn main() {
    std::process::exit(palisade_broker::daemon::main(palisade_broker::daemon::Args::parse()));
}
