//! palisade on macOS: the policy's decisions run under Seatbelt.
//!
//! [`Macos`] (in [`crate::seatbelt`]) is the executor there: each request is decided by the same
//! broker and policy as on Linux ([`crate::decide::service::Broker`]), on the
//! host as [`host`] describes it (Tier B's plan, with Seatbelt in place of
//! Landlock and seccomp), recorded in the audit journal, and run by
//! [`crate::seatbelt`]. `palisaded` serves it with the one server
//! ([`crate::serve::server`]) on the socket launchd hands over; `palisade
//! run` embeds it ([`cli`]).
//!
//! What the Linux broker does and this one does not yet is refused, with
//! that reason, never done differently: peers of another uid (and so a
//! root broker serving other users), trust stages, plugins, change sets,
//! strict egress (the policy refuses it in Tier B) and cgroups.
//!
//! Built on every Unix: on Linux its tests drive it through a stand-in for
//! `sandbox-exec`, so what is tested there is the broker's side.

pub mod cli;
#[cfg(all(test, unix))]
mod hangup;
pub mod host;
#[cfg(target_os = "macos")]
pub mod launchd;
#[cfg(all(test, target_os = "macos"))]
mod macos_tests;
#[cfg(all(test, target_os = "linux"))]
mod tests;

use crate::decide::service::Broker;
use crate::seatbelt::executor::Macos;
use palisade_policy::{Config, Host};
use std::path::PathBuf;

/// The broker on macOS, for `config`, running commands through `launcher`
/// (see [`crate::seatbelt::SANDBOX_EXEC`]) on the host `host` describes.
pub fn broker(
    config: Config,
    launcher: PathBuf,
    host: impl Fn() -> Host + Send + Sync + 'static,
) -> Result<Broker<Macos>, String> {
    let (macos, parts) = Macos::assemble(&config, launcher, host)?;
    Broker::new(macos, config, parts)
}
