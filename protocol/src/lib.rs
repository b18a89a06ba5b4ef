//! Formats that cross palisade's process boundaries.
//!
//! - [`plan`]: the broker → helper `JailPlan` (fd 3), the tables it relies
//!   on (the /dev layout, the rlimits) and, in [`check`], its invariants.
//! - [`status`]: the helper → broker status records (fd 4).
//! - [`warm`]: what a helper of the broker's warm pool builds before its plan.
//! - [`wire`]: client ⇄ broker messages (the Unix socket); the attestation
//!   they carry is typed in [`attest`].

// Data and decisions only: nothing here needs `unsafe`, and nothing may.
#![forbid(unsafe_code)]

pub mod attest;
pub mod bytes;
pub mod changes;
pub mod check;
pub mod clients;
pub mod form;
pub mod kind;
pub mod plan;
pub mod plugin;
pub mod shell;
pub mod status;
pub mod warm;
pub mod wire;

pub use check::PlanInvariant;
pub use plan::{
    BpfInstruction, DEV_LINKS, DEV_NODES, DEV_PTS, DEV_SHM, HostIds, HostPath, JailPlan, LandlockFeatures,
    LandlockPlan, Listener, ListenerKind, Mount, Namespaces, PLAN_ARCH, PLAN_MAX_BYTES, PLAN_MAX_DESCRIPTORS,
    PLAN_MAX_FILE_BYTES, PLAN_MAX_LISTENERS, PLAN_VERSION, PlanError, RLIM_INFINITY, Rlimit, RlimitName,
    Rlimits, SessionRole, Tier, decode_plan, dev_entries, encode_plan, tmpfs_inodes,
};
pub use status::{ExitReport, HelperFailure, HelperRecord, LandlockReport, RulesetState, Stage};
pub use warm::{WARM_MAGIC, WARM_SPEC_BYTES, WarmSpec};
