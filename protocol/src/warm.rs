//! A sandbox built ahead of its request (the broker's warm pool).
//!
//! A pooled helper gets a [`WarmSpec`] on fd 3 before any plan: what it may
//! build with no request in hand (the user namespace and its maps, the other
//! namespaces, the monitor and pid 1). It then waits on fd 3 for the plan,
//! which follows on the same socket as for any helper, and refuses it at
//! stage `plan` unless [`WarmSpec::admits`] it: a plan that differs in
//! anything already built gets a cold helper from the broker instead. With
//! `cgroup`, the helper first joins the cgroup on fd 5 (the pool slot's,
//! which becomes the run's when a plan claims it).

use crate::plan::{JailPlan, Namespaces, PLAN_VERSION};

/// First bytes on fd 3 of a helper that builds its sandbox ahead of the
/// plan. A plan starts with `PJP\x01`, so the two never look alike.
pub const WARM_MAGIC: [u8; 4] = *b"PJW\x01";
/// Encoded size of a [`WarmSpec`].
pub const WARM_SPEC_BYTES: usize = 22;

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
    pub cgroup: bool,
}

impl WarmSpec {
    /// The spec of a plan's sandbox, or why it cannot be built ahead: Tier
    /// B, or a root broker's per-requester host ids.
    pub fn of(plan: &JailPlan) -> Result<WarmSpec, &'static str> {
        if !plan.namespaces.user {
            return Err("Tier B builds no namespaces");
        }
        if plan.host_ids.is_some() || plan.acting_for.is_some() {
            return Err("a root broker's sandbox runs as the requester's own host ids");
        }
        if plan.session.is_some() {
            return Err("a session's sandbox is built for it, and its commands run in it");
        }
        Ok(WarmSpec {
            uid: plan.uid,
            gid: plan.gid,
            namespaces: plan.namespaces,
            parent_pid: plan.parent_pid,
            cgroup: plan.cgroup.is_some(),
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
        out[21] = u8::from(self.cgroup);
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
        if bytes[21] > 1 {
            return Err("warm spec has unknown flags".into());
        }
        let spec = WarmSpec {
            uid: word(8),
            gid: word(12),
            namespaces,
            parent_pid: word(16),
            cgroup: bytes[21] == 1,
        };
        if !spec.namespaces.user {
            return Err("a warm spec builds a user namespace (Tier C)".into());
        }
        Ok(spec)
    }
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
        WarmSpec { uid: 1000, gid: 1001, namespaces: Namespaces::ALL, parent_pid: 42, cgroup: false }
    }

    #[test]
    fn a_spec_survives_its_encoding() {
        let mut s = spec();
        assert_eq!(WarmSpec::decode(&s.encode()), Ok(s));
        s.namespaces.net = false;
        assert_eq!(WarmSpec::decode(&s.encode()), Ok(s));
        s.cgroup = true;
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
        bad[21] = 2;
        assert!(WarmSpec::decode(&bad).unwrap_err().contains("flags"));
    }

    #[test]
    fn only_a_plan_of_the_same_build_is_admitted() {
        let mut plan = crate::plan::tests::sample();
        plan.host_ids = None;
        plan.acting_for = None;
        let warm = WarmSpec::of(&plan).expect("a non-root Tier C plan");
        assert_eq!(warm.admits(&plan), Ok(()));
        let changes: [fn(&mut JailPlan); 7] = [
            |p| p.uid += 1,
            |p| p.gid += 1,
            |p| p.parent_pid += 1,
            |p| p.namespaces.net = false,
            |p| p.cgroup = Some("/sys/fs/cgroup/run".into()),
            |p| p.host_ids = Some(crate::HostIds { uid: 100_000, gid: 100_000 }),
            |p| p.namespaces = Namespaces::NONE,
        ];
        for change in changes {
            let mut other = plan.clone();
            change(&mut other);
            assert!(warm.admits(&other).is_err(), "{other:?}");
        }
    }
}
