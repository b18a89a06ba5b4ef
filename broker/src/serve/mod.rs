//! Where a request is accepted: the daemon, its socket server and each
//! client's connection, the bounds on what clients may hold (frames in
//! memory, refused connections, a panic in one request), and systemd's
//! socket activation and readiness.

#[cfg(unix)]
pub mod budget;
#[cfg(target_os = "linux")]
pub mod daemon;
#[cfg(unix)]
pub mod live;
#[cfg(unix)]
pub mod memory;
#[cfg(unix)]
pub mod publish;
#[cfg(unix)]
pub mod server;
#[cfg(unix)]
pub mod sessions;
#[cfg(unix)]
pub mod slots;
#[cfg(unix)]
pub mod socket;
#[cfg(target_os = "linux")]
pub(crate) mod systemd;
