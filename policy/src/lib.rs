//! palisade's decisions: from a request and the configuration to a refusal or
//! a fully resolved `JailPlan`. No I/O beyond reading configuration and
//! canonicalizing paths.

pub mod config;
pub mod decision;
pub mod jail;
pub mod seccomp;

pub use config::{Config, ConfigError};
pub use decision::{Context, Decision, Denial, HostCapabilities, Resolved, decide};
pub use jail::{JailSpec, Limits, build_plan};
