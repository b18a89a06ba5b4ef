//! Resource limits: the floor under every tier. Applied after the namespaces
//! exist, so RLIMIT_NPROC counts only the sandbox's processes in its user
//! namespace, and the helper's own checks run unlimited.

use crate::error::{Context, Result};
use nix::sys::resource::{Resource, setrlimit};
use palisade_protocol::{Rlimit, Rlimits, Stage};

pub fn apply(limits: &Rlimits) -> Result<()> {
    let all: [(Resource, &str, Rlimit); 6] = [
        (Resource::RLIMIT_AS, "RLIMIT_AS", limits.address_space),
        (Resource::RLIMIT_CPU, "RLIMIT_CPU", limits.cpu_seconds),
        (Resource::RLIMIT_NPROC, "RLIMIT_NPROC", limits.processes),
        (Resource::RLIMIT_NOFILE, "RLIMIT_NOFILE", limits.open_files),
        (Resource::RLIMIT_FSIZE, "RLIMIT_FSIZE", limits.file_size),
        (Resource::RLIMIT_CORE, "RLIMIT_CORE", limits.core),
    ];
    for (resource, name, limit) in all {
        setrlimit(resource, limit.soft, limit.hard)
            .at(Stage::Rlimits, || format!("setrlimit {name} {}/{}", show(limit.soft), show(limit.hard)))?;
    }
    Ok(())
}

fn show(v: u64) -> String {
    if v == u64::MAX { "unlimited".into() } else { v.to_string() }
}
