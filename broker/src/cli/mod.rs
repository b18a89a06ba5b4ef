//! `palisade`, the command-line client: its commands, the client of the
//! broker's socket, the choice of broker, and the embedded broker it starts
//! when none runs.

#[cfg(target_os = "linux")]
pub mod approve;
#[cfg(target_os = "linux")]
pub mod arena;
#[cfg(target_os = "linux")]
pub mod audit;
#[cfg(target_os = "linux")]
pub mod changes;
#[cfg(target_os = "linux")]
pub mod client;
#[cfg(target_os = "linux")]
pub mod commands;
#[cfg(target_os = "linux")]
pub mod discovery;
#[cfg(target_os = "linux")]
pub mod doctor;
#[cfg(target_os = "linux")]
pub mod mcp;
#[cfg(target_os = "linux")]
pub mod plugin;
#[cfg(unix)]
pub mod run;
#[cfg(target_os = "linux")]
pub mod status;

#[cfg(target_os = "linux")]
pub use commands::*;
