//! palisade's decisions: from a request, the configuration and the host to a
//! refusal or a fully resolved `JailPlan`. No I/O beyond reading the
//! configuration and canonicalizing the paths a request names: what it knows
//! of the host, the broker gathers and passes in ([`Host`]).

// Data and decisions only: nothing here needs `unsafe`, and nothing may.
#![forbid(unsafe_code)]

pub mod capabilities;
pub mod cedar;
pub mod config;
pub(crate) mod decision;
pub mod denial;
pub mod egress;
pub(crate) mod egress_plan;
pub mod host;
pub mod host_executed;
pub mod inspect;
pub mod jail;
pub mod paths;
pub mod plugins;
pub mod seatbelt;
pub mod seccomp;
pub(crate) mod sensitive;
pub(crate) mod spans;
pub mod trust;
pub(crate) mod validate;
pub mod windows;

pub use capabilities::{Capabilities, Preset};
pub use cedar::{CedarPolicies, CedarVerdict, Principal};
pub use config::ids;
pub use config::{Config, ConfigError, FallbackPolicy};
pub use decision::explain;
pub use decision::{CgroupPlan, Context, Decision, Denial, MAX_HELD_IN_PLACE, Policy, Resolved};
pub use egress_plan::{Credential, EgressPlan, PoolEntry};
pub use host::{CgroupRoot, FileKind, FileStat, Host, HostCapabilities, HostFiles};
pub use jail::{JailSpec, Layout, Limits, build_plan};
pub use plugins::{Grants as PluginGrants, Manifest, PluginHostJail, plugin_host_plan};
pub use trust::{Approval, ToolTrust, TrustStage};
