//! A run that writes its workspace in place (`disk = "direct"`) finds what
//! the host executes there read-only: the policy mounts each such path that
//! exists read-only over itself (`HostExecuted::in_tree`). No mount refuses
//! a name that does not exist yet, though: when the run is over, what it
//! made there that the host executes (a new `.envrc` or `.vscode/`, a new
//! repository's hooks or a configuration naming commands, ...) is taken out
//! of the workspace into a change set and held for a person, as a change
//! set's own would be (`palisade changes apply ID --host-executed`).

use super::fs::{kind, names, open_dir_at, open_file_at, stat_at};
use super::{Settle, Settled, clock::Since};
use crate::error::BrokerError;
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, mkdirat};
use palisade_policy::host_executed::{Check, HostExecuted, config_changes_commands};
use palisade_protocol::HostIds;
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

/// What the run made in the trees it wrote in place (`trees`: each one's
/// host path and the broker's descriptor of it; `before`: what the policy
/// held read-only there) that the host executes, taken out into a change
/// set and held; `None` when it made none. `owner`: the requester's ids,
/// where the broker is not the requester (a system broker).
pub fn hold_made(
    s: &Settle<'_>,
    trees: Vec<(String, OwnedFd)>,
    before: &[PathBuf],
    owner: Option<HostIds>,
) -> Result<Option<Settled>, BrokerError> {
    let failed = |root: &str, e: io::Error| BrokerError::CopyBack { path: root.to_string(), source: e };
    let mut found = Vec::new();
    for (root, dest) in &trees {
        let he = &s.keep_out.host_executed;
        let made = s.requester.act(|_| made(he, Path::new(root), dest, before)).and_then(|r| r);
        found.push(made.map_err(|e| failed(root, e))?);
    }
    if found.iter().all(Vec::is_empty) {
        return Ok(None);
    }
    let roots: Vec<String> = trees.iter().map(|(r, _)| r.clone()).collect();
    let store = &s.keep_out.store;
    let layers =
        store.layers(s.requester, s.run_id, &roots, owner, s.since).map_err(|e| failed(&roots[0], e))?;
    let (mut withheld, mut left) = (Vec::new(), Vec::new());
    for (i, ((root, dest), made)) in trees.iter().zip(&found).enumerate() {
        for (rel, what) in made {
            let path = Path::new(root).join(rel).to_string_lossy().into_owned();
            match s.requester.act(|_| move_out(dest, &layers.uppers[i], rel)).and_then(|r| r) {
                Ok(()) => {
                    withheld.push(Withheld { path, reason: WithheldReason::HostExecuted, what: what.clone() })
                }
                Err(e) => left.push(format!("{path} ({e})")),
            }
        }
    }
    let settle = Settle { since: Since::now(), bound: Some(HELD_WHY.into()), ended: None, ..s.clone() };
    let dests = trees.into_iter().map(|(_, d)| d).collect();
    let mut settled = super::settle(&settle, layers, dests)?;
    let held = &mut settled.changes;
    let mut why = format!("{HELD_WHY} (change set {})", held.id.as_deref().unwrap_or("-"));
    if !left.is_empty() {
        why.push_str(&format!(
            "; these could not be taken out and are still in the workspace: {}",
            left.join(", ")
        ));
    }
    *held = Changes {
        outcome: ChangesOutcome::Partial,
        reason: Some(why),
        withheld: std::mem::take(&mut held.withheld).into_iter().chain(withheld).collect(),
        ..std::mem::take(held)
    };
    Ok(Some(settled))
}

/// The paths (relative to `root`, with what each is) the host executes in
/// the tree `dest`, outside `before`: a directory whose contents would all
/// be held, whole; in a git directory, each file as a change set's capture
/// sees it. Read as the requester the calling thread acts for.
fn made(
    he: &HostExecuted,
    root: &Path,
    dest: &OwnedFd,
    before: &[PathBuf],
) -> io::Result<Vec<(PathBuf, String)>> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let top = openat(dest, c".", flags, Mode::empty())?;
    let hooks = super::hooks_path(dest);
    let mut found = Vec::new();
    let mut dirs = vec![(top, PathBuf::new())];
    while let Some((dir, rel_dir)) = dirs.pop() {
        let listed = names(&dir)?;
        let beside_head = listed.iter().any(|n| n.as_bytes() == b"HEAD");
        for name in listed {
            let rel = rel_dir.join(OsStr::from_bytes(name.as_bytes()));
            let Ok(st) = stat_at(&dir, &name) else { continue };
            if before.iter().any(|b| *b == root.join(&rel)) {
                continue;
            }
            let is_dir = kind(&st) == SFlag::S_IFDIR;
            let what = match he.check(root, &rel, is_dir, beside_head, &hooks) {
                Check::Apply if is_dir && name.as_bytes() != b".git" && he.holds_whole(root, &rel) => {
                    Some("a file the host runs (direnv, an editor, a shell, an agent)".to_string())
                }
                Check::Apply => None,
                Check::Withhold(what) => Some(what.to_string()),
                Check::GitConfig if names_commands(&dir, &name) => {
                    Some("a git configuration that changes keys that run commands".into())
                }
                Check::GitConfig => None,
            };
            match what {
                Some(what) => found.push((rel, what)),
                // A directory the requester cannot open holds nothing it can take out.
                None if is_dir => {
                    if let Ok(sub) = open_dir_at(&dir, &name) {
                        dirs.push((sub, rel));
                    }
                }
                None => {}
            }
        }
    }
    Ok(found)
}

/// Whether the git configuration at `name` names commands (any key past
/// the safe ones, as a new one: the host had none before the run).
fn names_commands(dir: &OwnedFd, name: &CStr) -> bool {
    let Ok(fd) = open_file_at(dir, name) else { return true };
    let mut text = String::new();
    let read = std::fs::File::from(fd).take(GIT_CONFIG_MAX_BYTES + 1).read_to_string(&mut text);
    read.is_err() || text.len() as u64 > GIT_CONFIG_MAX_BYTES || config_changes_commands(&text, "")
}

/// Moves `rel` out of the tree `dest` into the same place in `upper` (its
/// directories on the way made there with the host's modes): renamed,
/// or copied and removed where the two are on different filesystems.
fn move_out(dest: &OwnedFd, upper: &OwnedFd, rel: &Path) -> io::Result<()> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let (mut from, mut to) = (openat(dest, c".", flags, Mode::empty())?, upper.try_clone()?);
    let mut parts: Vec<CString> = rel.iter().map(|n| CString::new(n.as_bytes())).collect::<Result<_, _>>()?;
    let name = parts.pop().ok_or_else(|| io::Error::other("an empty path"))?;
    for part in &parts {
        let st = stat_at(&from, part)?;
        match mkdirat(&to, part.as_c_str(), Mode::from_bits_truncate(st.st_mode & 0o777)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        from = open_dir_at(&from, part)?;
        to = open_dir_at(&to, part)?;
    }
    let noreplace = rustix::fs::RenameFlags::NOREPLACE;
    match super::fs::rename2(&from, &name, &to, &name, noreplace) {
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            copy_tree(&from, &name, &to)?;
            super::fs::remove(&from, &name).map(|_| ())
        }
        other => other,
    }
}

/// Copies `name` in `from` (a file, a symbolic link, a FIFO or a directory
/// and what it holds) to the same name in `to`, with its mode.
fn copy_tree(from: &OwnedFd, name: &CStr, to: &OwnedFd) -> io::Result<()> {
    let st: FileStat = stat_at(from, name)?;
    let mode = Mode::from_bits_truncate(st.st_mode & 0o777);
    match kind(&st) {
        SFlag::S_IFDIR => {
            mkdirat(to, name, Mode::from_bits_truncate(0o700))?;
            let (src, dst) = (open_dir_at(from, name)?, open_dir_at(to, name)?);
            for n in names(&src)? {
                copy_tree(&src, &n, &dst)?;
            }
            nix::sys::stat::fchmod(&dst, mode)?;
        }
        SFlag::S_IFREG => {
            let src = open_file_at(from, name)?;
            let dst_flags =
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let dst = openat(to, name, dst_flags, mode)?;
            super::fs::copy_sparse(&src, &dst)?;
        }
        SFlag::S_IFLNK => {
            let target = nix::fcntl::readlinkat(from, name)?;
            nix::unistd::symlinkat(target.as_os_str(), to, name)?;
        }
        SFlag::S_IFIFO => nix::sys::stat::mknodat(to, name, SFlag::S_IFIFO, mode, 0)?,
        _ => return Err(io::Error::other("neither a file, a link, a FIFO nor a directory")),
    }
    Ok(())
}
