//! Where a request is accepted: the daemon (its life on every system in
//! `start`, Linux's part in `daemon`), its socket server and each
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
#[cfg(unix)]
pub mod start;
#[cfg(target_os = "linux")]
pub(crate) mod systemd;
