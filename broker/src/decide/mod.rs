//! Where a request is decided: the broker service (policy, approvals,
//! trust stages, what stays out of every run's reach) between the server
//! that accepts a request and the engine that runs it.

#[cfg(target_os = "linux")]
pub mod approvals;
#[cfg(unix)]
pub mod owned;
#[cfg(target_os = "linux")]
pub mod panics;
#[cfg(target_os = "linux")]
pub mod service;
#[cfg(target_os = "linux")]
pub mod settings;
#[cfg(target_os = "linux")]
pub mod trust;
