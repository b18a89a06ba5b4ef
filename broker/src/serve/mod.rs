//! Where a request is accepted: the daemon, its socket server and each
//! client's connection, the bounds on what clients may hold (frames in
//! memory, refused connections, a panic in one request), and systemd's
//! socket activation and readiness.

#[cfg(target_os = "linux")]
pub mod daemon;
#[cfg(target_os = "linux")]
pub mod server;
#[cfg(unix)]
pub mod socket;
#[cfg(unix)]
pub mod budget;
#[cfg(unix)]
pub mod refusals;
#[cfg(target_os = "linux")]
pub mod panics;
#[cfg(target_os = "linux")]
pub mod memory;
#[cfg(target_os = "linux")]
pub mod systemd;
