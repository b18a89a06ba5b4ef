#[cfg(target_os = "linux")]
fn main() {
    use clap::Parser;
    palisade_broker::serve::memory::tune_allocator();
    std::process::exit(palisade_broker::serve::daemon::main(palisade_broker::serve::daemon::Args::parse()));
}

/// macOS: the broker runs commands under Seatbelt.
#[cfg(target_os = "macos")]
fn main() {
    use clap::Parser;
    std::process::exit(palisade_broker::mac::cli::palisaded(palisade_broker::mac::cli::DaemonArgs::parse()));
}

/// No jail on this system: refused before anything is served.
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn main() {
    std::process::exit(palisade_broker::elsewhere::refuse("palisaded"));
}
