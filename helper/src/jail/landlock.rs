//! Landlock, after the mounts (a restricted process can no longer mount) and
//! before seccomp. The plan's required features are hard requirements; the
//! rest is best effort, and what the kernel actually enforced is reported.

use super::error::{self, Context, HelperError, Result, fail};
use super::fds::Descriptors;
use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, LandlockStatus, NetPort,
    PathBeneath, RulesetAttr, RulesetCreatedAttr, RulesetError, RulesetStatus, Scope,
};
use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::{Mode, SFlag, fstat};
use palisade_protocol::{
    HelperRecord, LandlockFeatures as F, LandlockPlan, LandlockReport, RulesetState, Stage,
};
use std::os::fd::OwnedFd;

/// The newest ABI the plan's features need; newer rights are not handled.
const ABI_USED: ABI = ABI::V6;

/// `host`: in Tier B, the descriptors every rule's path stands for (the
/// paths are the host's, opened by the broker); `None` in Tier C, whose
/// paths are inside the sandbox's own root.
pub fn restrict_self(plan: &LandlockPlan, host: Option<&Descriptors>) -> Result<()> {
    if plan.wanted.is_empty() {
        return Ok(());
    }
    let level =
        |f: F| if plan.required.contains(f) { CompatLevel::HardRequirement } else { CompatLevel::BestEffort };
    let want = |f: F| plan.wanted.contains(f);
    let failed = |f: F| move |e: RulesetError| unsupported(f, e);

    let mut ruleset = landlock::Ruleset::default();
    let mut handled = BitFlags::<AccessFs>::empty();
    // Each feature's rights, handled at the plan's level for it.
    let fs = [
        (F::FS, AccessFs::from_all(ABI::V1)),
        (F::FS_REFER, AccessFs::Refer.into()),
        (F::FS_TRUNCATE, AccessFs::Truncate.into()),
    ];
    for (f, access) in fs.into_iter().filter(|(f, _)| want(*f)) {
        handled |= access;
        ruleset = ruleset.set_compatibility(level(f)).handle_access(access).map_err(failed(f))?;
    }
    if want(F::NET_TCP) {
        ruleset = ruleset
            .set_compatibility(level(F::NET_TCP))
            .handle_access(AccessNet::from_all(ABI_USED))
            .map_err(failed(F::NET_TCP))?;
    }
    let scopes = [(F::SCOPE_ABSTRACT_UNIX, Scope::AbstractUnixSocket), (F::SCOPE_SIGNAL, Scope::Signal)];
    for (f, scope) in scopes.into_iter().filter(|(f, _)| want(*f)) {
        ruleset = ruleset.set_compatibility(level(f)).scope(scope).map_err(failed(f))?;
    }
    // Rules grant within what is handled; rights the kernel lacks were dealt with above.
    let mut created = ruleset.create().map_err(general)?.set_compatibility(CompatLevel::BestEffort);
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    // Everything but creating device nodes.
    let write = read | AccessFs::from_write(ABI_USED) & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    let groups: [(&Vec<String>, BitFlags<AccessFs>); 4] = [
        (&plan.read, read),
        (&plan.write, write),
        (&plan.execute, AccessFs::Execute.into()),
        (&plan.list, AccessFs::ReadDir.into()),
    ];
    for (paths, access) in groups {
        for path in paths {
            created = created.add_rule(path_rule(path, host, access & handled)?).map_err(general)?;
        }
    }
    for (ports, access) in [(&plan.tcp_bind, AccessNet::BindTcp), (&plan.tcp_connect, AccessNet::ConnectTcp)]
    {
        for port in ports {
            created = created.add_rule(NetPort::new(*port, access)).map_err(general)?;
        }
    }
    let status = created.restrict_self().map_err(general)?;
    let abi = match status.landlock {
        LandlockStatus::Available { effective_abi, .. } => effective_abi as u32,
        _ => 0,
    };
    let (ruleset, enforced) = match status.ruleset {
        RulesetStatus::FullyEnforced => (RulesetState::Full, plan.wanted),
        RulesetStatus::PartiallyEnforced => {
            (RulesetState::Partial, plan.wanted.intersection(F::supported_by_abi(abi)))
        }
        RulesetStatus::NotEnforced => (RulesetState::NotEnforced, F::EMPTY),
    };
    let missing = plan.required.difference(enforced);
    if !missing.is_empty() {
        let why = format!("required Landlock features not enforced: {missing}");
        return Err(fail(Stage::Landlock, Errno::EOPNOTSUPP, why));
    }
    error::send(&HelperRecord::Landlock(LandlockReport { abi, enforced, ruleset }));
    Ok(())
}

fn path_rule(
    path: &str,
    host: Option<&Descriptors>,
    access: BitFlags<AccessFs>,
) -> Result<PathBeneath<OwnedFd>> {
    let fd = match host {
        Some(d) => d.get(path, Stage::Landlock)?.try_clone().at(Stage::Landlock, || format!("dup {path}"))?,
        // O_PATH: a handle on the path, not an open of what it is (a tty, a
        // fifo). Opened here rather than with the crate's PathFd, whose std
        // OpenOptions loses O_PATH under musl (there O_ACCMODE includes it).
        None => open(path, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())
            .at(Stage::Landlock, || format!("open {path} for a Landlock rule"))?,
    };
    let is_dir = fstat(&fd).at(Stage::Landlock, || format!("stat {path}"))?.st_mode & SFlag::S_IFMT.bits()
        == SFlag::S_IFDIR.bits();
    // A rule on a file may only carry rights that make sense for a file.
    let access = if is_dir { access } else { access & AccessFs::from_file(ABI_USED) };
    Ok(PathBeneath::new(fd, access))
}

fn unsupported(feature: F, e: RulesetError) -> HelperError {
    fail(
        Stage::Landlock,
        Errno::EOPNOTSUPP,
        format!("the policy requires Landlock {feature}, which this kernel lacks: {e}"),
    )
}

fn general(e: RulesetError) -> HelperError {
    let errno = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .and_then(|io| io.raw_os_error())
        .map_or(Errno::UnknownErrno, Errno::from_raw);
    fail(Stage::Landlock, errno, format!("landlock: {e}"))
}
