//! The broker's side of `palisade`, served by `palisaded cli` (the CLI
//! hands its process over, `palisade_cli::hand_over`): a run and an
//! explanation with an embedded broker, and the commands on the broker's
//! own state (doctor, tools, changes, audit, plugin, mcp).

#[cfg(target_os = "linux")]
pub(crate) mod approve;
#[cfg(target_os = "linux")]
pub(crate) mod audit;
#[cfg(target_os = "linux")]
pub(crate) mod changes;
#[cfg(target_os = "linux")]
pub(crate) mod commands;
#[cfg(target_os = "linux")]
pub(crate) mod doctor;
#[cfg(target_os = "linux")]
pub(crate) mod mcp;
#[cfg(target_os = "linux")]
pub(crate) mod plugin;
#[cfg(unix)]
pub mod run;

#[cfg(target_os = "linux")]
pub use commands::*;
#[cfg(target_os = "linux")]
pub use palisade_cli::{client, discovery};
