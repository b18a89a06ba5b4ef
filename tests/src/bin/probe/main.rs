//! probe: run inside a sandbox (and outside, as the counter-test), it attempts
//! one thing and reports `ok [detail]` (exit 0) or `err ERRNO [detail]` (exit 1).

#[cfg(target_os = "linux")]
mod egress;
#[cfg(target_os = "linux")]
mod linux;

#[cfg(target_os = "linux")]
use linux::{Outcome, connect, io};

#[cfg(target_os = "linux")]
fn main() {
    linux::main();
}

/// What it probes is Linux's sandbox.
#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("probe: runs inside palisade's Linux sandbox only");
    std::process::exit(2);
}
