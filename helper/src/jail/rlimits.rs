//! Resource limits: the floor under every tier. Applied after the namespaces
//! exist, so RLIMIT_NPROC counts only the sandbox's processes in its user
//! namespace, and the helper's own checks run unlimited.

use super::error::{Context, Result};
use nix::sys::resource::{Resource, setrlimit};
use palisade_protocol::{RlimitName, Rlimits, Stage};

/// Sets every limit of the plan's table.
pub fn apply(limits: &Rlimits) -> Result<()> {
    for (name, limit) in limits.table() {
        setrlimit(resource(name), limit.soft, limit.hard).at(Stage::Rlimits, || {
            format!("setrlimit RLIMIT_{name} {}/{}", show(limit.soft), show(limit.hard))
        })?;
    }
    Ok(())
}

fn resource(name: RlimitName) -> Resource {
    match name {
        RlimitName::As => Resource::RLIMIT_AS,
        RlimitName::Data => Resource::RLIMIT_DATA,
        RlimitName::Cpu => Resource::RLIMIT_CPU,
        RlimitName::Nproc => Resource::RLIMIT_NPROC,
        RlimitName::Nofile => Resource::RLIMIT_NOFILE,
        RlimitName::Fsize => Resource::RLIMIT_FSIZE,
        RlimitName::Core => Resource::RLIMIT_CORE,
    }
}

fn show(v: u64) -> String {
    if v == u64::MAX { "unlimited".into() } else { v.to_string() }
}
