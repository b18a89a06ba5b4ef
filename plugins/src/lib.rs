//! Tier A: WebAssembly plugins (issue 16). The runtime (`Runtime`: one
//! wasmtime engine with fuel, epoch deadlines and a pooling allocator, a
//! fresh instance per call), the plugin ABI (`abi`, documented in
//! `docs/plugins.md`), the host functions a plugin imports (`host_fns`),
//! and what `palisade-plugin-host` runs: its seccomp filter (`seccomp`) and
//! its loop over the broker's frames (`serve`). wasmtime lives in this crate
//! and in no other. The tier needs a Linux jail: elsewhere the crate is empty.
#![cfg(target_os = "linux")]

pub mod abi;
pub mod host_fns;
pub mod limits;
pub mod runtime;
pub mod seccomp;
pub mod serve;
mod ticker;

pub use host_fns::{HostCallError, HostCalls};
pub use runtime::{PluginError, Runtime, RuntimeConfig};
