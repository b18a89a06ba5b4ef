//! A sandbox built ahead of its request (the broker's warm pool).
//!
//! A pooled helper gets a [`WarmSpec`] on fd 3 before any plan: what it may
//! build with no request in hand (the user namespace and its maps, the other
//! namespaces, the monitor and pid 1, and the part of the root no plan
//! changes: the staging tmpfs, `/proc`, and `/dev` but for its `/dev/shm`).
//! It then waits on fd 3 for the plan,
//! which follows on the same socket as for any helper, and refuses it at
//! stage `plan` unless [`WarmSpec::admits`] it: a plan that differs in
//! anything already built gets a cold helper from the broker instead. With
//! `cgroup`, the helper first joins the cgroup on fd 5 (the pool slot's,
//! which becomes the run's when a plan claims it). With `host_ids` (a
//! system broker's pool, one per requester), it first becomes those ids:
//! the plan's bind and overlay sources come with it already cloned by the
//! broker ([`JailPlan::captured`]).

use crate::plan::{HostIds, JailPlan, Mount, Namespaces, PLAN_VERSION};

/// First bytes on fd 3 of a helper that builds its sandbox ahead of the
/// plan. A plan starts with `PJP\x01`, so the two never look alike.
pub const WARM_MAGIC: [u8; 4] = *b"PJW\x01";
/// Encoded size of a [`WarmSpec`].
pub const WARM_SPEC_BYTES: usize = 38;

/// What a pooled sandbox is built with before its plan arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmSpec {
    /// Ids of the command inside the sandbox (the user namespace's maps).
    pub uid: u32,
    pub gid: u32,
    /// Namespaces created ahead; `user` must be among them (Tier C).
    pub namespaces: Namespaces,
    /// The broker: the sandbox's lifeline.
    pub parent_pid: u32,
    /// Joined the cgroup on fd 5 before its namespaces (cgroup v2): the
    /// plan must name a cgroup, and the broker gives the run that one.
    /// False for a cgroup v1 slot, which the broker placed in its cgroup
    /// before sending the spec: its plan names none.
    pub cgroup: bool,
    /// A system broker's sandbox: the unprivileged host ids it runs as,
    /// taken before its namespaces, and the requester they act for (the
    /// plan's `host_ids` and `acting_for`; both or neither).
    pub host_ids: Option<HostIds>,
    pub acting_for: Option<HostIds>,
}

impl WarmSpec {
    /// The spec of a plan's sandbox, or why it cannot be built ahead: Tier
    /// B, or a session's.
    pub fn of(plan: &JailPlan) -> Result<WarmSpec, &'static str> {
        if !plan.namespaces.user {
            return Err("Tier B builds no namespaces");
        }
        if plan.host_ids.is_some() != plan.acting_for.is_some() {
            return Err("host ids come with the requester they act for");
        }
        if plan.session.is_some() {
            return Err("a session's sandbox is built for it, and its commands run in it");
        }
        if plan.mounts.iter().any(|m| {
            matches!(m, Mount::Bind { source, .. } | Mount::Overlay { source, .. } if source == "/" || source == "/tmp")
        }) {
            return Err("it binds / or /tmp, which would carry the staging tmpfs built ahead over /tmp");
        }
        if !builds_standard_dev_and_proc(&plan.mounts) {
            return Err("its /dev or /proc is not the one built ahead (one of each, there, nothing in them)");
        }
        Ok(WarmSpec {
            uid: plan.uid,
            gid: plan.gid,
            namespaces: plan.namespaces,
            parent_pid: plan.parent_pid,
            cgroup: plan.cgroup.is_some(),
            host_ids: plan.host_ids,
            acting_for: plan.acting_for,
        })
    }

    /// Whether a sandbox built to this spec can run `plan`: exactly what
    /// the plan would have built is already there, and nothing else.
    pub fn admits(&self, plan: &JailPlan) -> Result<(), String> {
        match WarmSpec::of(plan) {
            Ok(wanted) if wanted == *self => Ok(()),
            Ok(wanted) => Err(format!("a sandbox built for {self:?} cannot run a plan of {wanted:?}")),
            Err(why) => Err(format!("a sandbox built ahead cannot run this plan: {why}")),
        }
    }

    pub fn encode(&self) -> [u8; WARM_SPEC_BYTES] {
        let mut out = [0u8; WARM_SPEC_BYTES];
        out[..4].copy_from_slice(&WARM_MAGIC);
        out[4..8].copy_from_slice(&PLAN_VERSION.to_be_bytes());
        out[8..12].copy_from_slice(&self.uid.to_be_bytes());
        out[12..16].copy_from_slice(&self.gid.to_be_bytes());
        out[16..20].copy_from_slice(&self.parent_pid.to_be_bytes());
        out[20] = namespace_bits(&self.namespaces);
        out[21] = u8::from(self.cgroup) | (u8::from(self.host_ids.is_some()) << 1);
        if let (Some(ids), Some(requester)) = (self.host_ids, self.acting_for) {
            for (at, word) in [(22, ids.uid), (26, ids.gid), (30, requester.uid), (34, requester.gid)] {
                out[at..at + 4].copy_from_slice(&word.to_be_bytes());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8; WARM_SPEC_BYTES]) -> Result<WarmSpec, String> {
        let word = |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        if bytes[..4] != WARM_MAGIC {
            return Err("not a warm spec (bad magic)".into());
        }
        if word(4) != PLAN_VERSION {
            return Err(format!("warm spec version {}, this helper speaks version {PLAN_VERSION}", word(4)));
        }
        let namespaces = namespaces_of(bytes[20]).ok_or("warm spec names unknown namespaces")?;
        if bytes[21] > 3 {
            return Err("warm spec has unknown flags".into());
        }
        let system = bytes[21] & 2 != 0;
        let spec = WarmSpec {
            uid: word(8),
            gid: word(12),
            namespaces,
            parent_pid: word(16),
            cgroup: bytes[21] & 1 != 0,
            host_ids: system.then(|| HostIds { uid: word(22), gid: word(26) }),
            acting_for: system.then(|| HostIds { uid: word(30), gid: word(34) }),
        };
        if !spec.namespaces.user {
            return Err("a warm spec builds a user namespace (Tier C)".into());
        }
        Ok(spec)
    }
}

/// Whether the plan's root has `/proc` and `/dev` where a sandbox built
/// ahead has them, once each, and nothing else of the plan at or under
/// either: then building them first changes nothing the sandbox sees.
fn builds_standard_dev_and_proc(mounts: &[Mount]) -> bool {
    let (mut dev, mut proc) = (0, 0);
    for m in mounts {
        match m {
            Mount::Dev { target, .. } if target == "/dev" => dev += 1,
            Mount::Proc { target } if target == "/proc" => proc += 1,
            Mount::Dev { .. } | Mount::Proc { .. } => return false,
            m => {
                let t = m.target();
                let within = |dir: &str| {
                    t.strip_prefix(dir).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
                };
                if within("/dev") || within("/proc") {
                    return false;
                }
            }
        }
    }
    (dev, proc) == (1, 1)
}

const ORDER: [fn(&mut Namespaces) -> &mut bool; 7] = [
    |n| &mut n.user,
    |n| &mut n.mount,
    |n| &mut n.pid,
    |n| &mut n.net,
    |n| &mut n.ipc,
    |n| &mut n.uts,
    |n| &mut n.cgroup,
];

fn namespace_bits(ns: &Namespaces) -> u8 {
    let mut copy = *ns;
    ORDER.iter().enumerate().fold(0, |bits, (i, field)| bits | (u8::from(*field(&mut copy)) << i))
}

fn namespaces_of(bits: u8) -> Option<Namespaces> {
    if bits >> ORDER.len() != 0 {
        return None;
    }
    let mut ns = Namespaces::NONE;
    for (i, field) in ORDER.iter().enumerate() {
        *field(&mut ns) = bits & (1 << i) != 0;
    }
    Some(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> WarmSpec {
        WarmSpec {
            uid: 1000,
            gid: 1001,
            namespaces: Namespaces::ALL,
            parent_pid: 42,
            cgroup: false,
            host_ids: None,
            acting_for: None,
        }
    }

    #[test]
    fn a_spec_survives_its_encoding() {
        let mut s = spec();
        assert_eq!(WarmSpec::decode(&s.encode()), Ok(s));
        s.namespaces.net = false;
        assert_eq!(WarmSpec::decode(&s.encode()), Ok(s));
        s.cgroup = true;
        assert_eq!(WarmSpec::decode(&s.encode()), Ok(s));
        s.host_ids = Some(HostIds { uid: 100_000, gid: 100_001 });
        s.acting_for = Some(HostIds { uid: 1000, gid: 1002 });
        assert_eq!(WarmSpec::decode(&s.encode()), Ok(s));
    }

    #[test]
    fn a_damaged_spec_is_refused() {
        let good = spec().encode();
        let mut bad = good;
        bad[0] = b'X';
        assert!(WarmSpec::decode(&bad).unwrap_err().contains("magic"));
        let mut bad = good;
        bad[7] ^= 1;
        assert!(WarmSpec::decode(&bad).unwrap_err().contains("version"));
        let mut bad = good;
        bad[20] |= 0x80;
        assert!(WarmSpec::decode(&bad).unwrap_err().contains("unknown"));
        let mut bad = good;
        bad[20] &= !1;
        assert!(WarmSpec::decode(&bad).unwrap_err().contains("user namespace"));
        let mut bad = good;
        bad[21] = 4;
        assert!(WarmSpec::decode(&bad).unwrap_err().contains("flags"));
    }

    #[test]
    fn only_a_plan_of_the_same_build_is_admitted() {
        let mut plan = crate::plan::tests::sample();
        plan.host_ids = None;
        plan.acting_for = None;
        let warm = WarmSpec::of(&plan).expect("a non-root Tier C plan");
        assert_eq!(warm.admits(&plan), Ok(()));
        let changes: [fn(&mut JailPlan); 16] = [
            |p| p.uid += 1,
            |p| p.gid += 1,
            |p| p.parent_pid += 1,
            |p| p.namespaces.net = false,
            |p| p.cgroup = Some("/sys/fs/cgroup/run".into()),
            |p| p.host_ids = Some(crate::HostIds { uid: 100_000, gid: 100_000 }),
            |p| {
                p.host_ids = Some(crate::HostIds { uid: 100_000, gid: 100_000 });
                p.acting_for = Some(crate::HostIds { uid: 1000, gid: 1000 });
            },
            |p| p.namespaces = Namespaces::NONE,
            |p| p.session = Some(crate::SessionRole::Hold),
            |p| p.mounts.retain(|m| !matches!(m, Mount::Dev { .. })),
            |p| p.mounts.retain(|m| !matches!(m, Mount::Proc { .. })),
            |p| p.mounts.push(Mount::Proc { target: "/run/proc".into() }),
            |p| {
                p.mounts.push(Mount::Tmpfs {
                    target: "/dev/shm/big".into(),
                    size_bytes: 1 << 20,
                    mode: 0o700,
                })
            },
            |p| p.mounts.push(Mount::Symlink { target: "/proc".into(), link: "dev".into() }),
            |p| {
                p.mounts.push(Mount::Bind {
                    source: "/tmp".into(),
                    target: "/mnt".into(),
                    writable: false,
                    owned: true,
                })
            },
            |p| {
                p.mounts.push(Mount::Overlay {
                    source: "/".into(),
                    target: "/mnt".into(),
                    size_bytes: 1,
                    owned: true,
                    layer: None,
                })
            },
        ];
        for change in changes {
            let mut other = plan.clone();
            change(&mut other);
            assert!(warm.admits(&other).is_err(), "{other:?}");
        }
        // A neighbour's name is not within either, and a source under /tmp is no copy of it.
        let mut other = plan.clone();
        other.mounts.push(Mount::Tmpfs { target: "/devices".into(), size_bytes: 1 << 20, mode: 0o700 });
        other.mounts.push(Mount::Bind {
            source: "/tmp/w".into(),
            target: "/tmp/w".into(),
            writable: true,
            owned: true,
        });
        assert_eq!(warm.admits(&other), Ok(()));
    }

    #[test]
    fn a_system_brokers_sandbox_admits_only_its_requesters_plan() {
        let mut plan = crate::plan::tests::sample();
        plan.host_ids = Some(HostIds { uid: 100_000, gid: 100_000 });
        plan.acting_for = Some(HostIds { uid: 1000, gid: 1000 });
        let warm = WarmSpec::of(&plan).expect("a system broker's Tier C plan");
        assert_eq!(warm.admits(&plan), Ok(()));
        let changes: [fn(&mut JailPlan); 4] = [
            |p| p.host_ids = Some(HostIds { uid: 165_536, gid: 165_536 }),
            |p| p.acting_for = Some(HostIds { uid: 1001, gid: 1000 }),
            |p| p.acting_for = Some(HostIds { uid: 1000, gid: 1001 }),
            |p| (p.host_ids, p.acting_for) = (None, None),
        ];
        for change in changes {
            let mut other = plan.clone();
            change(&mut other);
            assert!(warm.admits(&other).is_err(), "{other:?}");
        }
    }
}
