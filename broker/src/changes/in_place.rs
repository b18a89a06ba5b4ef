//! A run that writes its workspace in place (`disk = "direct"`) finds what
//! the host executes there read-only: the policy mounts each such path that
//! exists read-only over itself, and pins the directories on the way to it
//! (`HostExecuted::in_tree`). No mount refuses a name that does not exist
//! yet, though: when the run is over, what it made there that the host
//! executes (a new `.envrc` or `.vscode/`, a new repository's hooks or a
//! configuration naming commands, a file in a hooks directory git's
//! configuration names, ...) is taken out of the workspace into a change
//! set and held for a person, as a change set's own would be (`palisade
//! changes apply ID --host-executed`). A directory the run closed to its
//! owner is opened to look in (and closed again); what is taken out is
//! copied, never renamed, so no other name of it reaches the copy held.

use super::fs::{kind, names, open_dir_at, open_file_at, stat_at};
use super::{Settle, Settled, clock::Since};
use crate::error::BrokerError;
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{FchmodatFlags, FileStat, Mode, SFlag, fchmodat, mkdirat};
use palisade_policy::host_executed::{Check, HostExecuted, config_changes_commands};
use palisade_protocol::wire::{Changes, ChangesOutcome, Withheld, WithheldReason};
use std::ffi::{CStr, CString, OsStr};
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Why such a change set is held (its manifest's reason).
const HELD_WHY: &str = "the run wrote its workspace in place (disk = \"direct\") and made files there that \
     the host executes: they were taken out of the workspace and are held for a person";

/// A git configuration larger than this is not read as one: held.
const GIT_CONFIG_MAX_BYTES: u64 = 1 << 20;

/// The record beside a direct run's draft: what the policy mounted in its
/// trees (`before`: held read-only or hidden, there before the run; not
/// looked in) and what git's configurations name as code there (`code`,
/// absolute). A broker killed during the run leaves it for the next one,
/// which takes out what the run made all the same ([`super::recover`]).
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub before: Vec<PathBuf>,
    pub code: Vec<PathBuf>,
}

/// [`Record`]'s file in the draft.
pub const RECORD: &str = "in_place.json";

/// The trees a plan writes in place (Tier C): its writable grants, but a
/// directory pinned inside one; and what it mounts in them.
pub fn of_plan(plan: &palisade_protocol::JailPlan, code: &[PathBuf]) -> (Vec<String>, Record) {
    use palisade_protocol::Mount;
    let writable: Vec<&String> = (plan.mounts.iter())
        .filter_map(|m| match m {
            Mount::Bind { source, writable: true, owned: true, .. } => Some(source),
            _ => None,
        })
        .collect();
    let inside = |p: &str, root: &str| p.starts_with(&format!("{root}/"));
    let trees: Vec<String> =
        writable.iter().filter(|s| !writable.iter().any(|o| inside(s, o))).map(|s| s.to_string()).collect();
    let before = (plan.mounts.iter())
        .filter_map(|m| match m {
            Mount::Bind { target, writable: false, .. }
            | Mount::Tmpfs { target, .. }
            | Mount::File { target, .. } => Some(target),
            _ => None,
        })
        .filter(|t| trees.iter().any(|root| inside(t, root)))
        .map(PathBuf::from)
        .collect();
    (trees, Record { before, code: code.to_vec() })
}

/// Writes `record` beside the draft of `layers` (made for the run's trees
/// before it starts).
pub fn begin(layers: &super::Layers, record: &Record) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let text = serde_json::to_vec(record).map_err(io::Error::other)?;
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(layers.draft.dir.join(RECORD))?;
    std::io::Write::write_all(&mut f, &text)
}

/// The record of the draft `dir`, if it is a direct run's.
pub fn record_of(dir: &Path) -> Option<Record> {
    serde_json::from_slice(&std::fs::read(dir.join(RECORD)).ok()?).ok()
}

/// What the run made in the trees it wrote in place (`dests`, in the
/// order of its layers' roots) that the host executes, taken out into
/// its layers and held; `None` when it made none (the draft is removed).
/// A tree that cannot be looked through is said in the result (never a
/// silent pass).
pub fn hold_made(
    s: &Settle<'_>,
    layers: super::Layers,
    dests: Vec<OwnedFd>,
    record: &Record,
) -> Result<Option<Settled>, BrokerError> {
    let taken = take_made(s.requester, &s.keep_out.host_executed, &layers, &dests, record);
    if taken.withheld.is_empty() && taken.left.is_empty() && layers.untouched() {
        drop(layers);
        return Ok((!taken.unchecked.is_empty()).then(|| unlooked(&taken.unchecked)));
    }
    let settle = Settle { since: Since::now(), bound: Some(HELD_WHY.into()), ended: None, ..s.clone() };
    let mut settled = super::settle(&settle, layers, dests)?;
    let held = &mut settled.changes;
    let mut why = String::new();
    if !taken.left.is_empty() {
        why.push_str(&format!(
            "NOT taken out, still in the workspace, though the host executes them: {}; ",
            taken.left.join(", ")
        ));
    }
    if !taken.unchecked.is_empty() {
        why.push_str(&format!(
            "NOT looked through for files the host executes: {}; ",
            taken.unchecked.join(", ")
        ));
    }
    if !taken.withheld.is_empty() {
        why.push_str(&format!("{HELD_WHY} (change set {})", held.id.as_deref().unwrap_or("-")));
    }
    *held = Changes {
        outcome: ChangesOutcome::Partial,
        reason: Some(why.trim_end_matches("; ").to_string()),
        withheld: std::mem::take(&mut held.withheld).into_iter().chain(taken.withheld).collect(),
        ..std::mem::take(held)
    };
    Ok(Some(settled))
}

/// What [`take_made`] did.
pub struct Taken {
    /// Taken out into the layers.
    pub withheld: Vec<Withheld>,
    /// Found, but could not be taken out: each, with why.
    pub left: Vec<String>,
    /// Trees that could not be looked through: each, with why.
    pub unchecked: Vec<String>,
}

/// Finds what the run made in `dests` (the trees of `layers`, in order)
/// that the host executes, and moves each into the layer of its tree, as
/// `requester`.
pub fn take_made(
    requester: &crate::host::requester::Requester,
    he: &HostExecuted,
    layers: &super::Layers,
    dests: &[OwnedFd],
    record: &Record,
) -> Taken {
    let mut taken = Taken { withheld: Vec::new(), left: Vec::new(), unchecked: Vec::new() };
    for (i, (root, dest)) in layers.record.roots.iter().zip(dests).enumerate() {
        let found = requester.act(|_| made(he, Path::new(root), dest, record)).and_then(|r| r);
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                taken.unchecked.push(format!("{root} ({e})"));
                continue;
            }
        };
        for (rel, what) in found {
            let path = Path::new(root).join(&rel).to_string_lossy().into_owned();
            match requester.act(|_| take_out(dest, &layers.uppers[i], &rel)).and_then(|r| r) {
                Ok(()) => taken.withheld.push(Withheld { path, reason: WithheldReason::HostExecuted, what }),
                Err(e) => taken.left.push(format!("{path} ({what}: {e})")),
            }
        }
    }
    taken
}

/// A tree that could not be looked through, and nothing found elsewhere.
fn unlooked(unchecked: &[String]) -> Settled {
    let reason = format!("NOT looked through for files the host executes: {}", unchecked.join(", "));
    let changes = Changes { outcome: ChangesOutcome::Partial, reason: Some(reason), ..Changes::default() };
    Settled { changes, events: vec![] }
}

/// A directory whose mode the walk opened to its owner, to close again.
struct Opened {
    parent: OwnedFd,
    name: CString,
    mode: u32,
}

/// The paths (relative to `root`, with what each is) the host executes in
/// the tree `dest` that the policy did not mount: a directory whose
/// contents would all be held, whole; in a git directory, each file as a
/// change set's capture sees it; anything in a hooks directory or an
/// included configuration git names; a git configuration with another
/// name. Read as the requester the calling thread acts for.
fn made(
    he: &HostExecuted,
    root: &Path,
    dest: &OwnedFd,
    mounted: &Record,
) -> io::Result<Vec<(PathBuf, String)>> {
    let mut opened = Vec::new();
    let found = walk(he, root, dest, mounted, &mut opened);
    for o in opened.into_iter().rev() {
        let _ = fchmodat(
            &o.parent,
            o.name.as_c_str(),
            Mode::from_bits_truncate(o.mode),
            FchmodatFlags::FollowSymlink,
        );
    }
    found
}

fn walk(
    he: &HostExecuted,
    root: &Path,
    dest: &OwnedFd,
    mounted: &Record,
    opened: &mut Vec<Opened>,
) -> io::Result<Vec<(PathBuf, String)>> {
    let mut hooks = super::hooks_path(dest, root);
    hooks.extend(mounted.code.iter().filter_map(|c| c.strip_prefix(root).ok()).map(Path::to_path_buf));
    hooks.retain(|h| !h.as_os_str().is_empty());
    let top = open_to_owner(dest, c".", opened)?;
    let mut found = Vec::new();
    let mut dirs = vec![(top, PathBuf::new())];
    while let Some((dir, rel_dir)) = dirs.pop() {
        let listed = names(&dir)?;
        let beside_head = listed.iter().any(|n| n.as_bytes() == b"HEAD");
        for name in listed {
            let rel = rel_dir.join(OsStr::from_bytes(name.as_bytes()));
            if mounted.before.iter().any(|b| *b == root.join(&rel)) {
                continue;
            }
            let st = stat_at(&dir, &name)?;
            let is_dir = kind(&st) == SFlag::S_IFDIR;
            match what(he, (root, &rel), (&dir, &name, &st), beside_head, &hooks) {
                Some(what) => found.push((rel, what)),
                None if is_dir => dirs.push((open_to_owner(&dir, &name, opened)?, rel)),
                None => {}
            }
        }
    }
    Ok(found)
}

/// What the entry `name` of `dir` (at `rel` in `root`) is that the host
/// executes, if it is one.
fn what(
    he: &HostExecuted,
    (root, rel): (&Path, &Path),
    (dir, name, st): (&OwnedFd, &CStr, &FileStat),
    beside_head: bool,
    hooks: &[PathBuf],
) -> Option<String> {
    let is_dir = kind(st) == SFlag::S_IFDIR;
    let linked = kind(st) == SFlag::S_IFREG && st.st_nlink > 1;
    match he.check(root, rel, is_dir, beside_head, hooks) {
        Check::Apply if is_dir && name.to_bytes() != b".git" && he.holds_whole(root, rel) => {
            Some("a file the host runs (direnv, an editor, a shell, an agent)".to_string())
        }
        Check::Apply => None,
        Check::Withhold(what) => Some(what.to_string()),
        Check::GitConfig if linked => Some("a git configuration with another name (a hard link)".into()),
        Check::GitConfig if names_commands(dir, name) => {
            Some("a git configuration that changes keys that run commands".into())
        }
        Check::GitConfig => None,
    }
}

/// The directory `name` in `dir`, opened; one its owner may not list or
/// search is opened to the owner first (and closed again when the walk
/// is over: see [`made`]).
fn open_to_owner(dir: &OwnedFd, name: &CStr, opened: &mut Vec<Opened>) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let st = nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)?;
    let mode = st.st_mode & 0o7777;
    if mode & 0o500 != 0o500 {
        let open = Mode::from_bits_truncate(mode | 0o700);
        fchmodat(dir, name, open, FchmodatFlags::FollowSymlink)?;
        opened.push(Opened { parent: dir.try_clone()?, name: name.to_owned(), mode });
    }
    Ok(openat(dir, name, flags, Mode::empty())?)
}

/// Whether the git configuration at `name` names commands (any key past
/// the safe ones, as a new one: the host had none before the run).
fn names_commands(dir: &OwnedFd, name: &CStr) -> bool {
    let Ok(fd) = open_file_at(dir, name) else { return true };
    let mut text = String::new();
    let read = std::fs::File::from(fd).take(GIT_CONFIG_MAX_BYTES + 1).read_to_string(&mut text);
    read.is_err() || text.len() as u64 > GIT_CONFIG_MAX_BYTES || config_changes_commands(&text, "")
}

/// Takes `rel` out of the tree `dest` into the same place in `upper` (the
/// directories on the way made there with the host's modes): copied, then
/// removed. A directory on the way closed to its owner is opened to it
/// meanwhile.
fn take_out(dest: &OwnedFd, upper: &OwnedFd, rel: &Path) -> io::Result<()> {
    let mut opened = Vec::new();
    let done = take_out_opened(dest, upper, rel, &mut opened);
    for o in opened.into_iter().rev() {
        let _ = fchmodat(
            &o.parent,
            o.name.as_c_str(),
            Mode::from_bits_truncate(o.mode),
            FchmodatFlags::FollowSymlink,
        );
    }
    done
}

fn take_out_opened(dest: &OwnedFd, upper: &OwnedFd, rel: &Path, opened: &mut Vec<Opened>) -> io::Result<()> {
    let (mut from, mut to) = (open_to_owner(dest, c".", opened)?, upper.try_clone()?);
    let mut parts: Vec<CString> = rel.iter().map(|n| CString::new(n.as_bytes())).collect::<Result<_, _>>()?;
    let name = parts.pop().ok_or_else(|| io::Error::other("an empty path"))?;
    // The directories on the way, made in the layer open to their owner,
    // then given the host's modes (the capture opens them again to read).
    let mut made: Vec<(OwnedFd, u32)> = Vec::new();
    for part in &parts {
        let st = stat_at(&from, part)?;
        match mkdirat(&to, part.as_c_str(), Mode::from_bits_truncate(0o700)) {
            Ok(()) => made.push((open_dir_at(&to, part)?, st.st_mode & 0o7777)),
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        from = open_to_owner(&from, part, opened)?;
        to = open_dir_at(&to, part)?;
    }
    // The directory it leaves must take the removal: writable by its owner meanwhile.
    let st = nix::sys::stat::fstat(&from)?;
    if st.st_mode & 0o300 != 0o300 {
        let mode = st.st_mode & 0o7777;
        nix::sys::stat::fchmod(&from, Mode::from_bits_truncate(mode | 0o700))?;
        opened.push(Opened { parent: from.try_clone()?, name: c".".to_owned(), mode });
    }
    copy_tree(&from, &name, &to)?;
    super::fs::remove(&from, &name)?;
    for (dir, mode) in made.into_iter().rev() {
        nix::sys::stat::fchmod(&dir, Mode::from_bits_truncate(mode))?;
    }
    Ok(())
}

/// Copies `name` in `from` (a file, a symbolic link, a FIFO or a directory
/// and what it holds) to the same name in `to`, with its mode; what its
/// owner may not read or list is opened to it (it is removed next).
fn copy_tree(from: &OwnedFd, name: &CStr, to: &OwnedFd) -> io::Result<()> {
    let st: FileStat = stat_at(from, name)?;
    let mode = Mode::from_bits_truncate(st.st_mode & 0o777);
    let opened = |bits: u32| -> io::Result<()> {
        if st.st_mode & bits != bits {
            fchmodat(
                from,
                name,
                Mode::from_bits_truncate((st.st_mode & 0o777) | bits),
                FchmodatFlags::FollowSymlink,
            )?;
        }
        Ok(())
    };
    match kind(&st) {
        SFlag::S_IFDIR => {
            opened(0o700)?;
            mkdirat(to, name, Mode::from_bits_truncate(0o700))?;
            let (src, dst) = (open_dir_at(from, name)?, open_dir_at(to, name)?);
            for n in names(&src)? {
                copy_tree(&src, &n, &dst)?;
            }
            nix::sys::stat::fchmod(&dst, mode)?;
        }
        SFlag::S_IFREG => {
            opened(0o400)?;
            let src = open_file_at(from, name)?;
            let flags =
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let dst = openat(to, name, flags, Mode::from_bits_truncate(0o600))?;
            super::fs::copy_sparse(&src, &dst)?;
            nix::sys::stat::fchmod(&dst, mode)?;
        }
        SFlag::S_IFLNK => {
            let target = nix::fcntl::readlinkat(from, name)?;
            nix::unistd::symlinkat(target.as_os_str(), to, name)?;
        }
        SFlag::S_IFIFO => nix::sys::stat::mknodat(to, name, SFlag::S_IFIFO, mode, 0)?,
        // A socket is nothing once its processes are gone (the run's are).
        SFlag::S_IFSOCK => {}
        _ => return Err(io::Error::other("neither a file, a link, a FIFO, a socket nor a directory")),
    }
    Ok(())
}
