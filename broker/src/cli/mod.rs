//! `palisade`, the command-line client: its commands, the client of the
//! broker's socket, the choice of broker, and the embedded broker it starts
//! when none runs.

#[cfg(target_os = "linux")]
pub(crate) mod approve;
#[cfg(target_os = "linux")]
pub mod arena;
#[cfg(target_os = "linux")]
pub(crate) mod audit;
#[cfg(target_os = "linux")]
pub(crate) mod changes;
#[cfg(target_os = "linux")]
pub mod client;
#[cfg(target_os = "linux")]
pub(crate) mod commands;
#[cfg(target_os = "linux")]
pub(crate) mod discovery;
#[cfg(target_os = "linux")]
pub(crate) mod doctor;
#[cfg(target_os = "linux")]
pub(crate) mod mcp;
#[cfg(target_os = "linux")]
pub(crate) mod plugin;
#[cfg(unix)]
pub mod run;
#[cfg(target_os = "linux")]
pub(crate) mod status;

#[cfg(target_os = "linux")]
pub use commands::*;
