//! The attestation of a run: a hash that pins what was asked and what was
//! built, and what the kernel actually enforced.

use palisade_policy::Resolved;
use palisade_protocol::wire::{Attestation, Enforcement, LandlockEnforcement, RunRequest, canonical_bytes};
use palisade_protocol::{LandlockReport, Rlimit, RulesetState};
use sha2::{Digest, Sha256};

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn rlimit(name: &str, l: Rlimit) -> String {
    let show = |v: u64| if v == u64::MAX { "unlimited".to_string() } else { v.to_string() };
    format!("{name}={}/{}", show(l.soft), show(l.hard))
}

pub fn attestation(
    request: &RunRequest,
    resolved: &Resolved,
    landlock: Option<LandlockReport>,
) -> Attestation {
    let plan = &resolved.plan;
    let seccomp: Vec<u8> = plan
        .seccomp
        .iter()
        .flat_map(|i| [&i.code.to_ne_bytes()[..], &[i.jt, i.jf], &i.k.to_ne_bytes()[..]].concat())
        .collect();
    let r = &plan.rlimits;
    let landlock = landlock.map(|l| LandlockEnforcement {
        abi: l.abi,
        ruleset: match l.ruleset {
            RulesetState::Full => "full",
            RulesetState::Partial => "partial",
            RulesetState::NotEnforced => "not_enforced",
        }
        .into(),
        enforced: l.enforced.names().iter().map(|s| s.to_string()).collect(),
        not_enforced: plan
            .landlock
            .wanted
            .difference(l.enforced)
            .names()
            .iter()
            .map(|s| s.to_string())
            .collect(),
        required: plan.landlock.required.names().iter().map(|s| s.to_string()).collect(),
    });
    Attestation {
        execution_sha256: sha256_hex(&canonical_bytes(&(request, plan))),
        executor: plan.tier().to_string(),
        enforcement: Enforcement {
            namespaces: plan.namespaces.names().iter().map(|s| s.to_string()).collect(),
            host_uid: plan.host_ids.map_or_else(|| nix::unistd::getuid().as_raw(), |h| h.uid),
            landlock,
            seccomp_sha256: sha256_hex(&seccomp),
            seccomp_instructions: plan.seccomp.len() as u32,
            rlimits: vec![
                rlimit("AS", r.address_space),
                rlimit("CPU", r.cpu_seconds),
                rlimit("NPROC", r.processes),
                rlimit("NOFILE", r.open_files),
                rlimit("FSIZE", r.file_size),
                rlimit("CORE", r.core),
            ],
            cgroup: resolved.cgroup.as_ref().map(|c| c.path.to_string_lossy().into_owned()),
            limits_by: match &resolved.cgroup {
                Some(c) if c.v1 => "cgroup v1 + rlimits",
                Some(_) => "cgroup v2 + rlimits",
                None => "rlimits",
            }
            .into(),
            network: resolved.network.clone(),
            egress: resolved.egress.clone(),
            disk: resolved.disk.clone(),
        },
    }
}
