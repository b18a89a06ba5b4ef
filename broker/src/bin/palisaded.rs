#[cfg(target_os = "linux")]
fn main() {
    use clap::Parser;
    std::process::exit(palisade_broker::daemon::main(palisade_broker::daemon::Args::parse()));
}

/// No jail on this system: refused before anything is served.
#[cfg(not(target_os = "linux"))]
fn main() {
    std::process::exit(palisade_broker::elsewhere::refuse("palisaded"));
}
