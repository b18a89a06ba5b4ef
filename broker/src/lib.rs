//! palisade's broker side: `palisaded` (the daemon), `palisade` (the CLI and
//! its embedded broker), and what they share: policy decisions turned into
//! runs of palisade-helper, streamed, bounded and attested.

// The rooms, from where a request is accepted to where it runs; the broker
// drives palisade-helper's Linux jail, so on other systems only `elsewhere`
// is built (the binaries refuse with its reason) beside what macOS shares.
#[cfg(unix)]
pub mod cli;
#[cfg(unix)]
pub(crate) mod decide;
#[cfg(unix)]
pub mod engine;
#[cfg(unix)]
pub mod host;
#[cfg(unix)]
pub mod serve;

#[cfg(target_os = "linux")]
pub mod changes;
#[cfg(target_os = "linux")]
pub mod egress;
#[cfg(unix)]
pub(crate) mod error;
#[cfg(target_os = "linux")]
pub(crate) mod fault;
#[cfg(unix)]
pub mod journal;
#[cfg(unix)]
pub(crate) mod logs;
#[cfg(unix)]
pub mod mac;
#[cfg(target_os = "linux")]
pub mod plugins;
#[cfg(unix)]
pub(crate) mod seatbelt;

pub mod elsewhere;
