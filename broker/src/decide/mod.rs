//! Where a request is decided: the broker service (policy, approvals,
//! trust stages, what stays out of every run's reach) between the server
//! that accepts a request and the engine that runs it.

#[cfg(unix)]
pub mod approvals;
#[cfg(unix)]
pub mod owned;
#[cfg(unix)]
pub mod panics;
#[cfg(unix)]
pub mod service;
#[cfg(unix)]
pub mod sessions;
#[cfg(unix)]
pub mod settings;
#[cfg(unix)]
pub mod trust;
