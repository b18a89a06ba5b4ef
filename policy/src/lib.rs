//! palisade's decisions: from a request and the configuration to a refusal or
//! a fully resolved `JailPlan`. No I/O beyond reading configuration and
//! canonicalizing paths.

pub mod jail;
pub mod seccomp;

pub use jail::{JailSpec, Limits, build_plan};
