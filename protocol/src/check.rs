//! What every plan must satisfy, whoever built it: the policy checks a plan
//! before it sends it, and the helper again once it has received it.

use crate::plan::{
    JailPlan, LandlockFeatures, ListenerKind, Mount, PLAN_MAX_DESCRIPTORS, PLAN_MAX_FILE_BYTES,
    PLAN_MAX_LISTENERS,
};
use std::net::Ipv4Addr;

/// The rule of [`JailPlan::check`] a plan breaks. Each message reads after
/// "the plan asks for".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanInvariant {
    #[error("namespaces or mounts without a user namespace")]
    NamespacesWithoutUser,
    #[error("a user namespace without mount and pid namespaces")]
    UserWithoutMountAndPid,
    #[error("host ids without a user namespace")]
    HostIdsWithoutUser,
    /// The kernel exempts host root from RLIMIT_NPROC, and root owns most files.
    #[error("the command to run as host root without a user namespace")]
    HostRoot,
    /// Without namespaces, Landlock is the filesystem boundary.
    #[error("Tier B without Landlock's filesystem rules as a requirement")]
    TierBWithoutLandlock,
    #[error("a requester to act for without host ids")]
    RequesterWithoutHostIds,
    /// Host ids idmap the granted paths from the requester's ids.
    #[error("host ids without the requester they act for")]
    HostIdsWithoutRequester,
    #[error("a hostname without a UTS namespace")]
    HostnameWithoutUts,
    #[error("loopback without a network namespace")]
    LoopbackWithoutNet,
    #[error("a program path that is not absolute")]
    RelativeProgram,
    #[error("an empty argv")]
    EmptyArgv,
    #[error("a working directory that is not absolute")]
    RelativeCwd,
    #[error("Landlock features it requires but does not handle ({0})")]
    RequiredNotHandled(LandlockFeatures),
    #[error("{0} descriptors (at most {PLAN_MAX_DESCRIPTORS} come with a plan)")]
    TooManyDescriptors(usize),
    /// Every path must resolve inside the new root, as written.
    #[error(
        "a bad mount target {0:?} (not absolute and normal, the root itself, or beneath a symlink of the plan)"
    )]
    MountTarget(String),
    /// The helper builds the sandbox from what the broker opened, never from a path alone.
    #[error("a mount of {0} without its descriptor")]
    MountWithoutDescriptor(String),
    /// The listeners live in the sandbox's own network namespace, on its loopback.
    #[error("egress listeners without a network namespace with loopback up")]
    ListenersWithoutLoopback,
    /// Anything else would listen on an address the sandbox does not own alone.
    #[error("an egress listener on {0}, outside 127.0.0.0/8")]
    ListenerAddress(Ipv4Addr),
    #[error("{0} egress listeners (at most {PLAN_MAX_LISTENERS} travel in one message)")]
    TooManyListeners(usize),
    /// Two sockets of one protocol cannot bind the same address and port.
    #[error("two egress listeners on {0}:{1}")]
    DuplicateListener(Ipv4Addr, u16),
    #[error("a file of {1} bytes at {0} (at most {PLAN_MAX_FILE_BYTES})")]
    FileTooLarge(String, usize),
    #[error("a umask of {0:#o} (at most 0o777)")]
    Umask(u32),
    /// The terminal is a pseudo-terminal of the sandbox's own devpts.
    #[error("a terminal without Tier C's private /dev")]
    TerminalWithoutDev,
    #[error("a terminal's window: {0}")]
    TerminalSize(String),
    /// A session is a Tier C sandbox: its namespaces are what it keeps.
    #[error("a session without namespaces")]
    SessionWithoutNamespaces,
    /// A run in a held session builds nothing: the session's root and
    /// listeners are in place, and no host path is opened for it.
    #[error("a run in a session with mounts, host paths or listeners of its own")]
    JoinBuilds,
}

impl JailPlan {
    /// The plan's own consistency: what the helper can build, and nothing
    /// that would leave a sandboxed process with more than the plan says.
    pub fn check(&self) -> Result<(), PlanInvariant> {
        use PlanInvariant::*;
        let ns = &self.namespaces;
        let not_handled = self.landlock.required.difference(self.landlock.wanted);
        let joins = self.session == Some(crate::plan::SessionRole::Join);
        let rules = [
            (!ns.user && (!ns.names().is_empty() || !self.mounts.is_empty()), NamespacesWithoutUser),
            (ns.user && !(ns.mount && ns.pid), UserWithoutMountAndPid),
            (self.host_ids.is_some() && !ns.user, HostIdsWithoutUser),
            (!ns.user && self.uid == 0, HostRoot),
            (!ns.user && !self.landlock.required.contains(LandlockFeatures::FS), TierBWithoutLandlock),
            (self.acting_for.is_some() && self.host_ids.is_none(), RequesterWithoutHostIds),
            (self.host_ids.is_some() && self.acting_for.is_none(), HostIdsWithoutRequester),
            (self.hostname.is_some() && !ns.uts, HostnameWithoutUts),
            (self.loopback && !ns.net, LoopbackWithoutNet),
            (!self.program.starts_with('/'), RelativeProgram),
            (self.argv.is_empty(), EmptyArgv),
            (!self.cwd.starts_with('/'), RelativeCwd),
            (!not_handled.is_empty(), RequiredNotHandled(not_handled)),
            (self.descriptors_sent() > PLAN_MAX_DESCRIPTORS, TooManyDescriptors(self.descriptors_sent())),
            (self.umask.is_some_and(|m| m > crate::wire::MAX_UMASK), Umask(self.umask.unwrap_or(0))),
            (
                self.terminal.is_some()
                    && !joins
                    && !self.mounts.iter().any(|m| matches!(m, Mount::Dev { .. })),
                TerminalWithoutDev,
            ),
            (self.session.is_some() && !ns.user, SessionWithoutNamespaces),
            (
                joins
                    && !(self.mounts.is_empty() && self.descriptors.is_empty() && self.listeners.is_empty()),
                JoinBuilds,
            ),
        ];
        if let Some((_, broken)) = rules.into_iter().find(|(broken, _)| *broken) {
            return Err(broken);
        }
        if let Some(Err(e)) = self.terminal.map(crate::plan::WindowSize::check) {
            return Err(TerminalSize(e));
        }
        self.check_listeners()?;
        self.check_mounts()
    }

    /// Listeners: in the sandbox's own network namespace with loopback up,
    /// on 127.0.0.0/8, few enough for one message, no two on one address,
    /// port and protocol.
    fn check_listeners(&self) -> Result<(), PlanInvariant> {
        let listeners = &self.listeners;
        if listeners.is_empty() {
            return Ok(());
        }
        if !(self.namespaces.net && self.loopback) {
            return Err(PlanInvariant::ListenersWithoutLoopback);
        }
        if listeners.len() > PLAN_MAX_LISTENERS {
            return Err(PlanInvariant::TooManyListeners(listeners.len()));
        }
        let udp = |k: ListenerKind| k == ListenerKind::DnsUdp;
        for (i, l) in listeners.iter().enumerate() {
            if !l.address.is_loopback() {
                return Err(PlanInvariant::ListenerAddress(l.address));
            }
            let same = |o: &&crate::plan::Listener| {
                (o.address, o.port, udp(o.kind)) == (l.address, l.port, udp(l.kind))
            };
            if listeners[..i].iter().any(|o| same(&o)) {
                return Err(PlanInvariant::DuplicateListener(l.address, l.port));
            }
        }
        Ok(())
    }

    /// Targets are absolute and normal, and none lies beneath a symlink the
    /// plan makes; every source came as a descriptor.
    fn check_mounts(&self) -> Result<(), PlanInvariant> {
        for (i, m) in self.mounts.iter().enumerate() {
            let t = m.target();
            let normal = t.starts_with('/') && t[1..].split('/').all(|c| !matches!(c, "" | "." | ".."));
            let under_link = self.mounts[..i].iter().any(|earlier| {
                matches!(earlier, Mount::Symlink { .. })
                    && t.starts_with(earlier.target())
                    && t.as_bytes().get(earlier.target().len()) == Some(&b'/')
            });
            if !normal || t == "/" || under_link {
                return Err(PlanInvariant::MountTarget(t.to_string()));
            }
            if let Mount::Bind { source, .. } | Mount::Overlay { source, .. } = m {
                if self.descriptor(source).is_none() {
                    return Err(PlanInvariant::MountWithoutDescriptor(source.clone()));
                }
            }
            if let Mount::Overlay { layer: Some(layer), .. } = m {
                if self.descriptor(layer).is_none() {
                    return Err(PlanInvariant::MountWithoutDescriptor(layer.clone()));
                }
            }
            if let Mount::File { target, contents } = m {
                if contents.len() > PLAN_MAX_FILE_BYTES {
                    return Err(PlanInvariant::FileTooLarge(target.clone(), contents.len()));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::sample;
    use crate::plan::{HostIds, Namespaces};

    #[test]
    fn a_consistent_plan_passes() {
        assert_eq!(sample().check(), Ok(()));
        let mut tier_b = sample();
        tier_b.namespaces = Namespaces::NONE;
        (tier_b.mounts, tier_b.hostname, tier_b.loopback) = (vec![], None, false);
        (tier_b.host_ids, tier_b.acting_for) = (None, None);
        assert_eq!(tier_b.check(), Ok(()));
    }

    #[test]
    fn each_broken_rule_is_named() {
        type Break = fn(&mut JailPlan);
        let cases: [(Break, PlanInvariant); 15] = [
            (|p| p.namespaces.user = false, PlanInvariant::NamespacesWithoutUser),
            (|p| p.namespaces.pid = false, PlanInvariant::UserWithoutMountAndPid),
            (|p| p.acting_for = None, PlanInvariant::HostIdsWithoutRequester),
            (|p| p.host_ids = None, PlanInvariant::RequesterWithoutHostIds),
            (|p| p.namespaces.uts = false, PlanInvariant::HostnameWithoutUts),
            (|p| p.namespaces.net = false, PlanInvariant::LoopbackWithoutNet),
            (|p| p.program = "true".into(), PlanInvariant::RelativeProgram),
            (|p| p.argv.clear(), PlanInvariant::EmptyArgv),
            (|p| p.cwd = "work".into(), PlanInvariant::RelativeCwd),
            (
                |p| p.landlock.wanted = LandlockFeatures::FS_REFER,
                PlanInvariant::RequiredNotHandled(LandlockFeatures::FS),
            ),
            (|p| p.descriptors.clear(), PlanInvariant::MountWithoutDescriptor("/usr".into())),
            (
                |p| p.mounts.push(Mount::Proc { target: "/bin/proc".into() }),
                PlanInvariant::MountTarget("/bin/proc".into()),
            ),
            (|p| p.umask = Some(0o1022), PlanInvariant::Umask(0o1022)),
            (
                |p| {
                    p.terminal = Some(crate::plan::WindowSize { rows: 24, cols: 80 });
                    p.mounts.retain(|m| !matches!(m, Mount::Dev { .. }));
                },
                PlanInvariant::TerminalWithoutDev,
            ),
            (
                |p| p.terminal = Some(crate::plan::WindowSize { rows: 0, cols: 80 }),
                PlanInvariant::TerminalSize(
                    "a terminal's rows and cols are 1 to 4096 (got 0 rows, 80 cols)".into(),
                ),
            ),
        ];
        for (i, (break_it, broken)) in cases.into_iter().enumerate() {
            let mut plan = sample();
            break_it(&mut plan);
            assert_eq!(plan.check(), Err(broken), "case {i}");
        }
        for target in ["usr", "/usr/../etc", "/", "/a//b", "/a/./b"] {
            let mut plan = sample();
            plan.mounts.push(Mount::Proc { target: target.into() });
            assert_eq!(plan.check(), Err(PlanInvariant::MountTarget(target.into())), "{target}");
        }
    }

    #[test]
    fn listener_rules() {
        use crate::plan::{Listener, ListenerKind as K};
        let at = |kind, a: [u8; 4], port| Listener { kind, address: Ipv4Addr::from(a), port };
        let mut plan = sample();
        plan.listeners = vec![
            at(K::Proxy, [127, 0, 0, 1], 3128),
            at(K::DnsUdp, [127, 0, 0, 1], 53),
            at(K::DnsTcp, [127, 0, 0, 1], 53),
            at(K::Transparent, [127, 77, 0, 1], 443),
        ];
        assert_eq!(plan.check(), Ok(()));
        let mut no_lo = plan.clone();
        no_lo.loopback = false;
        assert_eq!(no_lo.check(), Err(PlanInvariant::ListenersWithoutLoopback));
        let mut no_net = plan.clone();
        (no_net.namespaces.net, no_net.loopback) = (false, false);
        assert_eq!(no_net.check(), Err(PlanInvariant::ListenersWithoutLoopback));
        let mut outside = plan.clone();
        outside.listeners.push(at(K::Transparent, [10, 0, 0, 1], 443));
        assert_eq!(outside.check(), Err(PlanInvariant::ListenerAddress(Ipv4Addr::new(10, 0, 0, 1))));
        let mut twice = plan.clone();
        twice.listeners.push(at(K::Transparent, [127, 77, 0, 1], 443));
        assert_eq!(twice.check(), Err(PlanInvariant::DuplicateListener(Ipv4Addr::new(127, 77, 0, 1), 443)));
        let mut many = plan.clone();
        many.listeners =
            (0..=PLAN_MAX_LISTENERS as u16).map(|p| at(K::Transparent, [127, 77, 0, 1], p)).collect();
        assert_eq!(many.check(), Err(PlanInvariant::TooManyListeners(PLAN_MAX_LISTENERS + 1)));
    }

    #[test]
    fn file_rules() {
        let mut plan = sample();
        let file = |contents: String| Mount::File { target: "/etc/resolv.conf".into(), contents };
        plan.mounts.push(file("nameserver 127.0.0.1\n".into()));
        assert_eq!(plan.check(), Ok(()));
        plan.mounts.push(file("x".repeat(PLAN_MAX_FILE_BYTES + 1)));
        assert_eq!(
            plan.check(),
            Err(PlanInvariant::FileTooLarge("/etc/resolv.conf".into(), PLAN_MAX_FILE_BYTES + 1))
        );
        let mut relative = sample();
        relative.mounts.push(Mount::File { target: "etc/resolv.conf".into(), contents: String::new() });
        assert_eq!(relative.check(), Err(PlanInvariant::MountTarget("etc/resolv.conf".into())));
    }

    #[test]
    fn tier_b_rules() {
        let mut plan = sample();
        plan.namespaces = Namespaces::NONE;
        (plan.mounts, plan.hostname, plan.loopback) = (vec![], None, false);
        (plan.host_ids, plan.acting_for) = (None, None);
        let mut root = plan.clone();
        root.uid = 0;
        assert_eq!(root.check(), Err(PlanInvariant::HostRoot));
        let mut no_landlock = plan.clone();
        no_landlock.landlock.required = LandlockFeatures::EMPTY;
        assert_eq!(no_landlock.check(), Err(PlanInvariant::TierBWithoutLandlock));
        plan.host_ids = Some(HostIds { uid: 1, gid: 1 });
        assert_eq!(plan.check(), Err(PlanInvariant::HostIdsWithoutUser));
        assert_eq!(
            PlanInvariant::TierBWithoutLandlock.to_string(),
            "Tier B without Landlock's filesystem rules as a requirement"
        );
    }
}
