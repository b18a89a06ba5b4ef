//! palisade's broker side: `palisaded` (the daemon), `palisade` (the CLI and
//! its embedded broker), and what they share: policy decisions turned into
//! runs of palisade-helper, streamed, bounded and attested.

/// The broker drives palisade-helper's Linux jail: on other systems only
/// [`elsewhere`] is built, and the binaries refuse with its reason.
macro_rules! linux_only {
    ($($item:item)*) => { $(#[cfg(target_os = "linux")] $item)* };
}

linux_only! {
    pub mod approvals;
    pub mod approve_cli;
    pub mod changes;
    pub mod changes_cli;
    pub mod arena;
    pub mod audit;
    pub mod cgroup;
    pub mod cli;
    pub mod client;
    pub mod daemon;
    pub mod discovery;
    pub mod doctor;
    pub mod egress;
    pub mod error;
    pub mod etc_view;
    pub mod fault;
    pub mod helper;
    pub mod host;
    pub mod mcp;
    pub mod memory;
    pub mod panics;
    pub mod plugin_cli;
    pub mod plugins;
    pub mod pool;
    pub mod requester;
    pub mod run;
    pub mod server;
    pub mod service;
    pub mod settings;
    pub mod status_cli;
    pub mod spawn_thread;
    pub mod systemd;
    pub mod trust;
}

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
