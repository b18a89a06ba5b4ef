//! Formats that cross palisade's process boundaries.
//!
//! - [`plan`]: the broker → helper `JailPlan` (fd 3).
//! - [`status`]: the helper → broker status records (fd 4).
//! - [`wire`]: client ⇄ broker messages (the Unix socket).

pub mod plan;
pub mod status;
pub mod wire;

pub use plan::{
    BpfInstruction, HostIds, HostPath, JailPlan, LandlockFeatures, LandlockPlan, Mount, Namespaces,
    PLAN_ARCH, PLAN_MAX_BYTES, PLAN_MAX_DESCRIPTORS, PLAN_VERSION, PlanError, RLIM_INFINITY, Rlimit, Rlimits,
    Tier, decode_plan, encode_plan, tmpfs_inodes,
};
pub use status::{ExitReport, HelperFailure, HelperRecord, LandlockReport, RulesetState, Stage};
