//! The host as the broker sees it: what it can enforce, its files, users
//! and groups as the policy reads them, who asks and acting for them, this
//! broker among others, and the places it keeps.

#[cfg(unix)]
pub(crate) mod accounts;
#[cfg(unix)]
pub(crate) mod files;
#[cfg(unix)]
pub(crate) mod instance;
#[cfg(target_os = "linux")]
pub(crate) mod linux;
#[cfg(unix)]
pub(crate) mod paths;
#[cfg(unix)]
pub mod peer;
#[cfg(unix)]
pub(crate) mod privilege;
#[cfg(target_os = "linux")]
pub mod requester;

#[cfg(target_os = "linux")]
pub use linux::*;
