//! The attestation of a run: a hash that pins what was asked and what was
//! built, and what the kernel actually enforced.

use palisade_policy::Resolved;
use palisade_protocol::attest::{Built, LimitsBy, RlimitEntry};
use palisade_protocol::wire::{Attestation, Enforcement, LandlockEnforcement, RunRequest, canonical_bytes};
use palisade_protocol::{LandlockFeatures, LandlockReport};
use sha2::{Digest, Sha256};

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn names(features: LandlockFeatures) -> Vec<String> {
    features.names().iter().map(|s| s.to_string()).collect()
}

/// sha256 of a plan's seccomp program, as BPF bytes.
pub fn seccomp_sha256(plan: &palisade_protocol::JailPlan) -> String {
    let seccomp: Vec<u8> = plan
        .seccomp
        .iter()
        .flat_map(|i| [&i.code.to_ne_bytes()[..], &[i.jt, i.jf], &i.k.to_ne_bytes()[..]].concat())
        .collect();
    sha256_hex(&seccomp)
}

/// What Landlock reached, against what the plan wanted and required.
pub fn landlock_enforcement(l: LandlockReport, plan: &palisade_protocol::JailPlan) -> LandlockEnforcement {
    LandlockEnforcement {
        abi: l.abi,
        ruleset: l.ruleset,
        enforced: names(l.enforced),
        not_enforced: names(plan.landlock.wanted.difference(l.enforced)),
        required: names(plan.landlock.required),
    }
}

pub fn attestation(
    request: &RunRequest,
    resolved: &Resolved,
    landlock: Option<LandlockReport>,
    egress_traffic: Option<palisade_protocol::attest::EgressTraffic>,
    built: Option<Built>,
) -> Attestation {
    let plan = &resolved.plan;
    let landlock = landlock.map(|l| landlock_enforcement(l, plan));
    Attestation {
        execution_sha256: sha256_hex(&canonical_bytes(&(request, plan))),
        executor: plan.tier().into(),
        enforcement: Enforcement {
            namespaces: plan.namespaces.names().iter().map(|s| s.to_string()).collect(),
            built,
            host_uid: plan.host_ids.map_or_else(|| nix::unistd::getuid().as_raw(), |h| h.uid),
            landlock,
            seccomp_sha256: seccomp_sha256(plan),
            seccomp_instructions: plan.seccomp.len() as u32,
            rlimits: plan.rlimits.table().into_iter().map(|(name, l)| RlimitEntry::new(name, l)).collect(),
            cgroup: resolved.cgroup.as_ref().map(|c| c.path.to_string_lossy().into_owned()),
            limits_by: match &resolved.cgroup {
                Some(c) if c.v1 => LimitsBy::CgroupV1,
                Some(_) => LimitsBy::CgroupV2,
                None => LimitsBy::Rlimits,
            },
            network: resolved.network.clone(),
            egress: resolved.egress,
            disk: resolved.disk.clone(),
            memory: resolved.memory.clone(),
            egress_traffic,
            seatbelt_sha256: None,
            deadline_secs: resolved.timeout.as_secs(),
            max_output_bytes: resolved.max_output_bytes,
        },
        warnings: resolved.warnings.iter().chain(&resolved.notes).cloned().collect(),
        journal: None,
    }
}

#[cfg(all(test, target_os = "linux"))]
pub(crate) mod tests {
    use super::*;
    use palisade_policy::{Config, Context, Decision, HostCapabilities, Policy};
    use palisade_protocol::RlimitName;
    use palisade_protocol::attest::{Executor, Network};
    use palisade_protocol::{Rlimit, RulesetState};
    use std::path::PathBuf;

    /// `request` as the default policy decides it on a Tier C host without cgroups.
    pub(crate) fn resolve(request: &RunRequest) -> Resolved {
        let host = crate::host::gather(
            &HostCapabilities {
                user_namespaces: true,
                landlock_abi: 7,
                seatbelt: false,
                cgroup: Err("none (test)".into()),
            },
            true,
            Vec::new().into(),
        );
        let policy = Policy::new(Config::default(), &*host.files);
        let ctx = Context {
            parent_pid: 1,
            uid: 1000,
            gid: 1000,
            serves_others: false,
            requester: palisade_protocol::HostIds { uid: 1000, gid: 1000 },
            groups: vec![],
            temp_root: PathBuf::from("/run/palisade-test"),
            instance: "1-1".into(),
            run: 1,
            etc_view: None,
            trust: None,
            homes: None,
        };
        match policy.decide(&host, &ctx, request) {
            Decision::Allow(r) => *r,
            other => panic!("{other:?}"),
        }
    }

    /// A request for `argv` in the temporary directory.
    pub(crate) fn request(argv: &[&str]) -> RunRequest {
        let cwd = std::env::temp_dir().canonicalize().unwrap();
        RunRequest {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: Some(cwd.to_string_lossy().into_owned()),
            ..Default::default()
        }
    }

    #[test]
    fn the_execution_hash_is_sha256_over_the_request_and_the_plan() {
        let req = request(&["/usr/bin/echo", "one"]);
        let resolved = resolve(&req);
        let a = attestation(&req, &resolved, None, None, None);
        let expected: String = Sha256::digest(canonical_bytes(&(&req, &resolved.plan)))
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(a.execution_sha256, expected);
        // The same request resolves to the same plan and the same hash.
        assert_eq!(attestation(&req, &resolve(&req), None, None, None).execution_sha256, expected);
        // Anything asked or built differently changes it.
        let other = request(&["/usr/bin/echo", "two"]);
        assert_ne!(attestation(&other, &resolve(&other), None, None, None).execution_sha256, expected);
        let mut plan_changed = resolved.clone();
        plan_changed.plan.rlimits.open_files = Rlimit::both(7);
        assert_ne!(attestation(&req, &plan_changed, None, None, None).execution_sha256, expected);
    }

    #[test]
    fn enforcement_says_what_was_in_force() {
        let req = request(&["/usr/bin/true"]);
        let resolved = resolve(&req);
        let report = LandlockReport {
            abi: 2,
            ruleset: RulesetState::Partial,
            enforced: palisade_protocol::LandlockFeatures::FS,
        };
        let a = attestation(&req, &resolved, Some(report), None, None);
        let e = &a.enforcement;
        assert_eq!(a.executor, Executor::LinuxTierC);
        assert_eq!(e.namespaces, ["user", "mount", "pid", "net", "ipc", "uts", "cgroup"]);
        let l = e.landlock.as_ref().unwrap();
        assert_eq!((l.abi, l.ruleset), (2, RulesetState::Partial));
        assert!(l.not_enforced.iter().any(|f| f == "scope.signal"), "{l:?}");
        assert_eq!((e.cgroup.as_deref(), e.limits_by), (None, LimitsBy::Rlimits));
        assert_eq!(e.network, Network::LoopbackOnly);
        assert_eq!(e.seccomp_instructions as usize, resolved.plan.seccomp.len());
        let names: Vec<RlimitName> = e.rlimits.iter().map(|r| r.name).collect();
        use RlimitName::*;
        assert_eq!(names, [As, Data, Cpu, Nproc, Nofile, Fsize, Core]);
        assert!(e.rlimits.contains(&RlimitEntry::new(Core, Rlimit::both(0))), "{:?}", e.rlimits);
    }
}
