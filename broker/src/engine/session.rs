//! Sessions on Linux: a Tier C sandbox held for the session (its helper's
//! command process execs nothing and waits, see
//! `palisade_protocol::SessionRole`), and each command of the session run
//! by a helper that joins its namespaces instead of building its own.

use crate::engine::cgroup::Membership;
use crate::engine::executor::Sandbox;
use palisade_policy::{CgroupPlan, Resolved};
use palisade_protocol::wire::{ErrorKind, ErrorReply};
use palisade_protocol::{JailPlan, Mount, SessionRole, Tier};
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// Makes `resolved` a session's held sandbox; refused where its plan is
/// not one a session can be.
pub fn hold(resolved: &mut Resolved) -> Result<(), ErrorReply> {
    if resolved.plan.tier() != Tier::C {
        let why = "a session is a Tier C sandbox (namespaces), and this broker's runs are Tier B: \
                   user namespaces are unavailable or `[broker] user_namespaces = false`";
        return Err(ErrorReply::with_rule(ErrorKind::Unavailable, why, "session.unavailable"));
    }
    resolved.plan.session = Some(SessionRole::Hold);
    Ok(())
}

/// Makes `resolved`, decided for a command of the session `session`, a run
/// in its sandbox: the policy must have decided the same sandbox the
/// session has (a command cannot widen it), and the helper gets the
/// session's namespaces in place of the host paths the plan named
/// (`descriptors`, what goes to the helper with the plan). In a cgroup, the
/// command joins the session's: returned, for the broker to place its helper in.
pub fn join(
    resolved: &mut Resolved,
    descriptors: &mut Vec<OwnedFd>,
    session: &Sandbox,
) -> Result<Option<Arc<Membership>>, ErrorReply> {
    let limits = |c: &CgroupPlan| (c.v1, c.memory_bytes, c.processes, c.cpu_percent);
    let cgroup_differs =
        resolved.cgroup.as_ref().map(limits) != session.cgroup.as_ref().map(|(c, _)| limits(c));
    let differ = differs(&resolved.plan, &session.plan).or(cgroup_differs.then_some("cgroup limits"));
    if let Some(what) = differ {
        let why = format!(
            "the policy decided this command a sandbox other than the session's ({what} differ): a \
             command runs in its session's sandbox, never a wider one; run it on its own, or in a \
             session started for it"
        );
        return Err(ErrorReply::with_rule(ErrorKind::PolicyDenied, why, "session.differs"));
    }
    let namespaces = session.namespaces.iter().map(|fd| fd.try_clone()).collect::<Result<Vec<_>, _>>();
    let namespaces = namespaces.map_err(|e| {
        ErrorReply::new(ErrorKind::RuntimeFailure, format!("holding the session's namespaces: {e}"))
    })?;
    let joined = match (&mut resolved.cgroup, &session.cgroup) {
        (Some(planned), Some((theirs, Some(membership)))) => {
            (planned.name, planned.path) = (theirs.name.clone(), theirs.path.clone());
            // The broker places its helper there (`Membership::place`): it joins nothing itself.
            resolved.plan.cgroup = None;
            Some(membership.clone())
        }
        (Some(_), _) => {
            let why = "the session's cgroup cannot be joined (its run could not hold it): stop the \
                       session and start another";
            return Err(ErrorReply::with_rule(ErrorKind::RuntimeFailure, why, "session.cgroup"));
        }
        (None, _) => None,
    };
    let plan = &mut resolved.plan;
    plan.session = Some(SessionRole::Join);
    plan.mounts.clear();
    plan.descriptors.clear();
    // The session's own run serves its egress listeners.
    plan.listeners.clear();
    resolved.egress_plan = None;
    *descriptors = namespaces;
    Ok(joined)
}

/// What of `mine` is not the session's `theirs`, in words; `None`: the same
/// sandbox (a bind's source aside: the `/etc` view is a snapshot per
/// decision; and an overlay's layer: the session's run was given its own).
fn differs(mine: &JailPlan, theirs: &JailPlan) -> Option<&'static str> {
    let shape = |m: &Mount| match m {
        Mount::Bind { target, writable, owned, .. } => {
            Mount::Bind { source: String::new(), target: target.clone(), writable: *writable, owned: *owned }
        }
        Mount::Overlay { source, target, size_bytes, owned, .. } => Mount::Overlay {
            source: source.clone(),
            target: target.clone(),
            size_bytes: *size_bytes,
            owned: *owned,
            layer: None,
        },
        other => other.clone(),
    };
    let mounts = |p: &JailPlan| p.mounts.iter().map(shape).collect::<Vec<_>>();
    let checks = [
        (mine.namespaces != theirs.namespaces, "namespaces"),
        ((mine.uid, mine.gid) != (theirs.uid, theirs.gid), "ids"),
        ((mine.host_ids, mine.acting_for) != (theirs.host_ids, theirs.acting_for), "host ids"),
        (mounts(mine) != mounts(theirs), "mounts"),
        (mine.landlock != theirs.landlock, "Landlock rules"),
        (mine.seccomp != theirs.seccomp, "seccomp filters"),
        ((mine.loopback, &mine.listeners) != (theirs.loopback, &theirs.listeners), "networks"),
        (mine.hostname != theirs.hostname, "hostnames"),
    ];
    checks.into_iter().find(|(differ, _)| *differ).map(|(_, what)| what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::attest::tests::{request, resolve};
    use palisade_policy::denial::names_a_fix_or_why_none;
    use palisade_protocol::Namespaces;

    fn cgroup(memory_bytes: u64) -> CgroupPlan {
        let (name, path) = ("run-1".to_string(), "/sys/fs/cgroup/palisade/run-1".into());
        CgroupPlan { name, path, v1: false, memory_bytes, processes: 256, cpu_percent: 100 }
    }

    #[test]
    fn a_session_is_a_tier_c_sandbox_in_a_cgroup_or_not() {
        let mut held = resolve(&request(&["/usr/bin/true"]));
        hold(&mut held).unwrap();
        assert_eq!(held.plan.session, Some(SessionRole::Hold));
        let mut tier_b = resolve(&request(&["/usr/bin/true"]));
        tier_b.plan.namespaces = Namespaces::default();
        let e = hold(&mut tier_b).unwrap_err();
        assert_eq!(e.rule.as_deref(), Some("session.unavailable"));
        names_a_fix_or_why_none("session.unavailable", &e.message).unwrap();
        let mut in_cgroup = resolve(&request(&["/usr/bin/true"]));
        in_cgroup.cgroup = Some(cgroup(1 << 30));
        hold(&mut in_cgroup).unwrap();
        assert_eq!(in_cgroup.plan.session, Some(SessionRole::Hold));
    }

    #[test]
    fn a_command_joins_only_a_session_with_its_own_sandbox() {
        let plan = resolve(&request(&["/usr/bin/true"])).plan;
        let session = Sandbox { plan, namespaces: vec![], cgroup: None };
        let mut command = resolve(&request(&["/usr/bin/echo", "hi"]));
        let mut descriptors = vec![];
        assert!(join(&mut command, &mut descriptors, &session).unwrap().is_none());
        assert_eq!(command.plan.session, Some(SessionRole::Join));
        assert!(command.plan.mounts.is_empty() && command.plan.descriptors.is_empty());
        assert!(command.plan.check().is_ok(), "{:?}", command.plan.check());
        let mut wider = resolve(&request(&["/usr/bin/echo", "hi"]));
        wider.plan.landlock.write.push("/etc".into());
        let e = join(&mut wider, &mut descriptors, &session).unwrap_err();
        assert_eq!(e.rule.as_deref(), Some("session.differs"));
        assert!(e.message.contains("(Landlock rules differ)"), "{}", e.message);
        names_a_fix_or_why_none("session.differs", &e.message).unwrap();
    }

    #[test]
    fn a_command_in_a_cgroup_joins_only_its_sessions_with_the_same_limits() {
        let plan = resolve(&request(&["/usr/bin/true"])).plan;
        let session = Sandbox { plan, namespaces: vec![], cgroup: Some((cgroup(1 << 30), None)) };
        let mut descriptors = vec![];
        // More memory than the session's (or none of a cgroup's at all) is another sandbox.
        for other in [Some(cgroup(2 << 30)), None] {
            let mut command = resolve(&request(&["/usr/bin/echo", "hi"]));
            command.cgroup = other;
            let e = join(&mut command, &mut descriptors, &session).unwrap_err();
            assert_eq!(e.rule.as_deref(), Some("session.differs"));
            assert!(e.message.contains("(cgroup limits differ)"), "{}", e.message);
        }
        // The same limits, but a session whose run could not hold its cgroup: never outside it.
        let mut command = resolve(&request(&["/usr/bin/echo", "hi"]));
        command.cgroup = Some(cgroup(1 << 30));
        let e = join(&mut command, &mut descriptors, &session).unwrap_err();
        assert_eq!((e.kind, e.rule.as_deref()), (ErrorKind::RuntimeFailure, Some("session.cgroup")));
        names_a_fix_or_why_none("session.cgroup", &e.message).unwrap();
    }
}
