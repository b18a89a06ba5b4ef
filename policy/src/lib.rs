//! palisade's decisions: from a request and the configuration to a refusal or
//! a fully resolved `JailPlan`. No I/O beyond reading configuration and
//! canonicalizing paths.

pub mod capabilities;
pub mod config;
pub mod decision;
pub mod egress;
pub mod explain;
pub mod jail;
pub mod paths;
pub mod seccomp;
pub mod validate;

pub use capabilities::{Capabilities, Preset};
pub use config::{Config, ConfigError, FallbackPolicy};
pub use decision::{CgroupPlan, CgroupRoot, Context, Decision, Denial, HostCapabilities, Policy, Resolved};
pub use jail::{JailSpec, Limits, build_plan};
