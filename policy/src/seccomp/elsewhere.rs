//! Systems other than Linux have no seccomp: a plan built there carries no
//! program. No Linux helper runs on such a system (the helper refuses to
//! start off Linux), so the empty program is never installed; the system's
//! own sandbox (Seatbelt on macOS, [`crate::seatbelt`]) confines the run.

use palisade_protocol::{BpfInstruction, Tier};

/// What the Linux profile is chosen by, kept so that plans build the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    pub tier: Tier,
    pub ip: bool,
    pub fork: bool,
}

/// No program: see the module's comment.
pub fn default_program(_: Profile) -> Result<&'static [BpfInstruction], super::SeccompError> {
    Ok(&[])
}

/// No program: see the module's comment.
pub fn monitor_program() -> Result<&'static [BpfInstruction], super::SeccompError> {
    Ok(&[])
}

/// What `palisade explain` says in place of the Linux filter's summary.
pub fn summary(_: &[BpfInstruction], _: Profile) -> String {
    "none: seccomp is Linux's; this system's own sandbox confines the run".into()
}
