//! The host as the broker sees it: what it can enforce, its files, users
//! and groups as the policy reads them, who asks and acting for them, this
//! broker among others, and the places it keeps.

#[cfg(unix)]
pub mod accounts;
#[cfg(unix)]
pub mod files;
#[cfg(unix)]
pub mod instance;
#[cfg(target_os = "linux")]
pub mod linux;
#[cfg(unix)]
pub mod paths;
#[cfg(unix)]
pub mod privilege;
#[cfg(target_os = "linux")]
pub mod requester;

#[cfg(target_os = "linux")]
pub use linux::*;
