//! Sessions on Linux: a Tier C sandbox held for the session (its helper's
//! command process execs nothing and waits, see
//! `palisade_protocol::SessionRole`), and each command of the session run
//! by a helper that joins its namespaces instead of building its own.

use crate::engine::executor::Sandbox;
use crate::engine::run::Grants;
use palisade_policy::Resolved;
use palisade_protocol::wire::{ErrorKind, ErrorReply};
use palisade_protocol::{JailPlan, Mount, SessionRole, Tier};

/// Makes `resolved` a session's held sandbox; refused where its plan is
/// not one a session can be.
pub fn hold(resolved: &mut Resolved) -> Result<(), ErrorReply> {
    if resolved.plan.tier() != Tier::C {
        let why = "a session is a Tier C sandbox (namespaces), and this broker's runs are Tier B: \
                   user namespaces are unavailable or `[broker] user_namespaces = false`";
        return Err(ErrorReply::with_rule(ErrorKind::Unavailable, why, "session.unavailable"));
    }
    if resolved.cgroup.is_some() {
        // Its commands would have to join the session's cgroup, which is not built yet.
        let why = "a session in a cgroup (this host's runs get cgroup limits) is not available yet";
        return Err(ErrorReply::with_rule(ErrorKind::Unavailable, why, "session.cgroup"));
    }
    resolved.plan.session = Some(SessionRole::Hold);
    Ok(())
}

/// Makes `resolved`, decided for a command of the session `session`, a run
/// in its sandbox: the policy must have decided the same sandbox the
/// session has (a command cannot widen it), and the helper gets the
/// session's namespaces in place of the host paths the plan named.
pub fn join(resolved: &mut Resolved, grants: &mut Grants, session: &Sandbox) -> Result<(), ErrorReply> {
    if let Some(what) = differs(&resolved.plan, &session.plan) {
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
    let plan = &mut resolved.plan;
    plan.session = Some(SessionRole::Join);
    plan.mounts.clear();
    plan.descriptors.clear();
    // The session's own run serves its egress listeners.
    plan.listeners.clear();
    resolved.egress_plan = None;
    grants.descriptors = namespaces;
    Ok(())
}

/// What of `mine` is not the session's `theirs`, in words; `None`: the same
/// sandbox (a bind's source aside: the `/etc` view is a snapshot per decision).
fn differs(mine: &JailPlan, theirs: &JailPlan) -> Option<&'static str> {
    let shape = |m: &Mount| match m {
        Mount::Bind { target, writable, owned, .. } => {
            Mount::Bind { source: String::new(), target: target.clone(), writable: *writable, owned: *owned }
        }
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
