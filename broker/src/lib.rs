//! palisade's broker side: `palisaded` (the daemon), `palisade` (the CLI and
//! its embedded broker), and what they share: policy decisions turned into
//! runs of palisade-helper, streamed, bounded and attested.

// The broker drives palisade-helper's Linux jail: on other systems only
// `elsewhere` is built, and the binaries refuse with its reason.
#[cfg(target_os = "linux")]
pub mod approvals;
#[cfg(target_os = "linux")]
pub mod approve_cli;
#[cfg(target_os = "linux")]
pub mod arena;
#[cfg(target_os = "linux")]
pub mod audit;
#[cfg(target_os = "linux")]
pub mod cgroup;
#[cfg(target_os = "linux")]
pub mod changes;
#[cfg(target_os = "linux")]
pub mod changes_cli;
#[cfg(target_os = "linux")]
pub mod cli;
#[cfg(target_os = "linux")]
pub mod client;
#[cfg(target_os = "linux")]
pub mod daemon;
#[cfg(target_os = "linux")]
pub mod discovery;
#[cfg(target_os = "linux")]
pub mod doctor;
#[cfg(target_os = "linux")]
pub mod egress;
#[cfg(target_os = "linux")]
pub mod error;
#[cfg(target_os = "linux")]
pub mod etc_view;
#[cfg(target_os = "linux")]
pub mod fault;
#[cfg(target_os = "linux")]
pub mod helper;
#[cfg(target_os = "linux")]
pub mod host;
#[cfg(target_os = "linux")]
pub mod mcp;
#[cfg(target_os = "linux")]
pub mod memory;
#[cfg(target_os = "linux")]
pub mod panics;
#[cfg(target_os = "linux")]
pub mod plugin_cli;
#[cfg(target_os = "linux")]
pub mod plugins;
#[cfg(target_os = "linux")]
pub mod pool;
#[cfg(target_os = "linux")]
pub mod requester;
#[cfg(target_os = "linux")]
pub mod run;
#[cfg(target_os = "linux")]
pub mod server;
#[cfg(target_os = "linux")]
pub mod service;
#[cfg(target_os = "linux")]
pub mod settings;
#[cfg(target_os = "linux")]
pub mod spawn_thread;
#[cfg(target_os = "linux")]
pub mod status_cli;
#[cfg(target_os = "linux")]
pub mod systemd;
#[cfg(target_os = "linux")]
pub mod trust;

pub mod elsewhere;

#[cfg(unix)]
pub mod accounts;
#[cfg(unix)]
pub mod attest;
#[cfg(unix)]
pub mod budget;
#[cfg(unix)]
pub mod instance;
#[cfg(unix)]
pub mod journal;
#[cfg(unix)]
pub mod logs;
#[cfg(unix)]
pub mod mac;
#[cfg(unix)]
pub mod owned;
#[cfg(unix)]
pub mod paths;
#[cfg(unix)]
pub mod privilege;
#[cfg(unix)]
pub mod real_files;
#[cfg(unix)]
pub mod refusals;
#[cfg(unix)]
pub mod run_cli;
#[cfg(unix)]
pub mod seatbelt;
#[cfg(unix)]
pub mod socket;
#[cfg(unix)]
pub mod stream;
