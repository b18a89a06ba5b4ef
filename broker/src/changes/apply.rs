//! Applying a change set to the host: each entry relative to the
//! descriptor of its granted directory, as the requester, never following
//! a symlink; a file or a link through a temporary name and a rename, so
//! that each is whole or not there. An entry whose host state is no longer
//! its base was changed by someone else: kept, unless asked to overwrite.
//! Applying again after a stop part-way finishes it: what is already as
//! the change set has it counts as applied.

use super::fs::{kind, names, open_dir_at, open_file_at, remove, stat_at};
use super::manifest::{Base, Entry, Kind};
use crate::host::requester::Acting;
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, futimens, mkdirat};
use nix::sys::time::TimeSpec;
use nix::unistd::symlinkat;
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What may be applied beyond the ordinary.
#[derive(Debug, Clone, Copy, Default)]
pub struct Choice {
    /// Entries someone else changed since (conflicts) are applied too.
    pub overwrite: bool,
    /// Files the host executes are applied too (a person's choice only).
    pub host_executed: bool,
}

/// What an apply did.
#[derive(Debug, Default)]
pub struct Applied {
    pub files: u64,
    pub removed: u64,
    pub bytes: u64,
    /// The entries not applied (conflicts, files the host executes, and
    /// what lies under them), by index.
    pub kept: Vec<usize>,
    /// Of those, the conflicts.
    pub conflicts: Vec<usize>,
}

/// The directories open on the way to the entry being applied (entries
/// come a directory before what it holds), so that each component is
/// opened once, with no symlink followed.
struct OpenPath {
    root: usize,
    /// `(relative path, descriptor)`, from the root down.
    open: Vec<(PathBuf, OwnedFd)>,
}

struct Apply<'a> {
    act: &'a Acting,
    roots: &'a [OwnedFd],
    blobs: &'a OwnedFd,
    /// The broker acts as itself and may move a blob into place when it is
    /// on the same filesystem.
    may_move: bool,
    serial: u64,
    done: Applied,
    /// Directories to give their mode once what they hold is in place.
    dirs: Vec<(usize, PathBuf, u32)>,
}

/// Applies `entries` with blobs in `blobs` onto the directories `roots`
/// (the broker's descriptors of the granted directories), acting as the
/// requester; the blobs are read as the broker.
pub fn apply(
    entries: &[Entry],
    roots: &[OwnedFd],
    blobs: &OwnedFd,
    act: &Acting,
    choice: Choice,
    since: &super::clock::Since,
) -> io::Result<Applied> {
    let may_move = act.is_broker();
    // What changed on each root's filesystem after the run's view is someone else's.
    let thresholds: Vec<i128> = roots.iter().map(|r| since.threshold(super::clock::margin(r))).collect();
    let mut a = Apply { act, roots, blobs, may_move, serial: 0, done: Applied::default(), dirs: Vec::new() };
    let mut kept: Vec<(usize, PathBuf)> = Vec::new();
    let mut at: Option<OpenPath> = None;
    let mut applied = 0;
    for (i, e) in entries.iter().enumerate() {
        let rel = e.rel();
        if kept.iter().any(|(root, p)| *root == e.root && rel.starts_with(p)) {
            a.done.kept.push(i);
            continue;
        }
        if e.host_executed.is_some() && !choice.host_executed {
            a.keep(i, e, &mut kept, false);
            continue;
        }
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else { continue };
        let name = CString::new(name.as_bytes()).map_err(io::Error::other)?;
        let dir = a.parent(&mut at, e.root, parent)?;
        let now = stat_at(dir, &name).ok();
        if a.already(dir, &name, e, now.as_ref())? {
            if let Kind::Dir { mode, .. } = e.kind {
                a.dirs.push((e.root, rel.clone(), mode));
            }
            continue;
        }
        let moved = now.as_ref().map(Base::of) != e.base
            || a.removes_changed(dir, &name, e, now.as_ref(), thresholds[e.root])?;
        if (e.conflict || moved) && !choice.overwrite {
            a.keep(i, e, &mut kept, true);
            continue;
        }
        a.entry(dir, &name, e, now.as_ref(), &rel)?;
        applied += 1;
        crate::fault::die_after_applying(applied);
    }
    drop(at);
    a.finish_dirs()?;
    Ok(a.done)
}

impl Apply<'_> {
    fn keep(&mut self, i: usize, e: &Entry, kept: &mut Vec<(usize, PathBuf)>, conflict: bool) {
        self.done.kept.push(i);
        if conflict {
            self.done.conflicts.push(i);
        }
        if e.is_dir() {
            kept.push((e.root, e.rel()));
        }
    }

    /// The directory `parent` (relative to root `root`), opened one
    /// component at a time from the nearest one already open.
    fn parent<'p>(
        &self,
        at: &'p mut Option<OpenPath>,
        root: usize,
        parent: &Path,
    ) -> io::Result<&'p OwnedFd> {
        if at.as_ref().is_none_or(|p| p.root != root) {
            let fd =
                self.roots.get(root).ok_or_else(|| io::Error::other("an entry of no granted directory"))?;
            let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
            *at = Some(OpenPath {
                root,
                open: vec![(PathBuf::new(), openat(fd, c".", flags, Mode::empty())?)],
            });
        }
        let path = at.as_mut().expect("set above");
        while !parent.starts_with(&path.open.last().expect("the root stays").0) {
            path.open.pop();
        }
        loop {
            let (here, fd) = path.open.last().expect("the root stays");
            if here == parent {
                break;
            }
            let next = parent.strip_prefix(here).map_err(io::Error::other)?.components().next();
            let Some(next) = next else { break };
            let name = CString::new(next.as_os_str().as_bytes()).map_err(io::Error::other)?;
            let sub = open_dir_at(fd, &name)?;
            let rel = here.join(next);
            path.open.push((rel, sub));
        }
        Ok(&path.open.last().expect("the root stays").1)
    }

    /// Whether applying `e` removes a directory in which something changed
    /// after the run's view (`since`, a threshold): its own status says
    /// nothing of its files' contents.
    fn removes_changed(
        &self,
        dir: &OwnedFd,
        name: &CStr,
        e: &Entry,
        now: Option<&FileStat>,
        since: i128,
    ) -> io::Result<bool> {
        let removes = match e.kind {
            Kind::Delete | Kind::Dir { opaque: true, .. } => true,
            _ => now.is_some_and(|st| kind(st) == SFlag::S_IFDIR) && !e.is_dir(),
        };
        if !removes {
            return Ok(false);
        }
        let mut budget = super::capture::CONFLICT_SCAN_ENTRIES;
        super::fs::changed_since(dir, name, since, &mut budget)
    }

    /// Whether the host already has what `e` makes (an apply that stopped
    /// part-way, taken up again).
    fn already(&self, dir: &OwnedFd, name: &CStr, e: &Entry, now: Option<&FileStat>) -> io::Result<bool> {
        Ok(match (&e.kind, now) {
            (Kind::Delete, None) => true,
            (Kind::Dir { opaque: false, .. }, Some(st)) => kind(st) == SFlag::S_IFDIR,
            // Made anew: a directory other than the one it replaces.
            (Kind::Dir { opaque: true, .. }, Some(st)) => {
                kind(st) == SFlag::S_IFDIR && e.base.is_none_or(|b| (b.dev, b.ino) != (st.st_dev, st.st_ino))
            }
            (Kind::Symlink { target }, Some(st)) if kind(st) == SFlag::S_IFLNK => {
                readlinkat(dir, name).is_ok_and(|t| t.as_bytes() == target.as_slice())
            }
            (Kind::File { blob, size, sha256, mode, .. }, Some(st)) if kind(st) == SFlag::S_IFREG => {
                // A blob moved into place is gone from the change set.
                let moved = self.act.as_broker(|| Ok(stat_at(self.blobs, &blob_name(*blob)).is_err()))?;
                let same = st.st_size as u64 == *size && st.st_mode & 0o777 == mode & 0o777;
                same && (moved || same_contents(dir, name, sha256))
            }
            _ => false,
        })
    }

    fn entry(
        &mut self,
        dir: &OwnedFd,
        name: &CStr,
        e: &Entry,
        now: Option<&FileStat>,
        rel: &Path,
    ) -> io::Result<()> {
        let is_dir = now.is_some_and(|st| kind(st) == SFlag::S_IFDIR);
        match &e.kind {
            Kind::Delete => self.done.removed += remove(dir, name)?,
            Kind::Dir { mode, opaque } => {
                if *opaque || now.is_some() && !is_dir {
                    self.done.removed += remove(dir, name)?;
                }
                match mkdirat(dir, name, Mode::from_bits_truncate(0o700)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                self.dirs.push((e.root, rel.to_path_buf(), *mode));
            }
            Kind::Symlink { target } => {
                let tmp = self.temp_name()?;
                symlinkat(OsStr::from_bytes(target), dir, tmp.as_c_str())?;
                self.replace(dir, &tmp, name, is_dir)?;
                self.done.files += 1;
            }
            Kind::File { blob, size, mode, mtime_ns, .. } => {
                self.file(dir, name, *blob, (*mode, *mtime_ns), is_dir)?;
                self.done.files += 1;
                self.done.bytes += size;
            }
        }
        Ok(())
    }

    /// Puts blob `blob` in place at `name`: moved there where the broker
    /// acts as itself on one filesystem, else copied to a temporary name
    /// as the requester; its permission bits (never setuid, setgid or
    /// sticky) and times set on the descriptor, then renamed over `name`.
    fn file(
        &mut self,
        dir: &OwnedFd,
        name: &CStr,
        blob: u32,
        (mode, mtime_ns): (u32, i128),
        is_dir: bool,
    ) -> io::Result<()> {
        let mode = Mode::from_bits_truncate(mode & 0o777);
        let at = TimeSpec::new(
            mtime_ns.div_euclid(1_000_000_000) as i64,
            mtime_ns.rem_euclid(1_000_000_000) as i64,
        );
        let blob_name = blob_name(blob);
        if self.may_move {
            let src = open_file_at(self.blobs, &blob_name)?;
            fchmod(&src, mode)?;
            futimens(&src, &at, &at)?;
            if is_dir {
                self.done.removed += remove(dir, name)?;
            }
            match renameat(self.blobs, blob_name.as_c_str(), dir, name) {
                Ok(()) => return Ok(()),
                Err(Errno::EXDEV) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let src = self.act.as_broker(|| open_file_at(self.blobs, &blob_name).map_err(io::Error::from))?;
        let tmp = self.temp_name()?;
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let out = openat(dir, tmp.as_c_str(), flags, Mode::from_bits_truncate(0o600))?;
        let copied = io::copy(&mut std::fs::File::from(src), &mut std::fs::File::from(out.try_clone()?));
        let set = copied
            .and_then(|_| fchmod(&out, mode).map_err(io::Error::from))
            .and_then(|()| futimens(&out, &at, &at).map_err(io::Error::from));
        if let Err(e) = set {
            let _ = nix::unistd::unlinkat(dir, tmp.as_c_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
            return Err(e);
        }
        self.replace(dir, &tmp, name, is_dir)
    }

    /// Renames `tmp` over `name` (a directory there is removed first).
    fn replace(&mut self, dir: &OwnedFd, tmp: &CStr, name: &CStr, is_dir: bool) -> io::Result<()> {
        if is_dir {
            self.done.removed += remove(dir, name)?;
        }
        renameat(dir, tmp, dir, name)?;
        Ok(())
    }

    fn temp_name(&mut self) -> io::Result<CString> {
        self.serial += 1;
        CString::new(format!(".palisade-apply-{}-{}", std::process::id(), self.serial))
            .map_err(io::Error::other)
    }

    /// The directories' permission bits, deepest first, once what they hold is in place.
    fn finish_dirs(&mut self) -> io::Result<()> {
        for (root, rel, mode) in self.dirs.drain(..).rev() {
            let mut at = None;
            let fd = match rel.parent() {
                Some(parent) => {
                    let name = rel.file_name().map(|n| CString::new(n.as_bytes())).transpose();
                    let Some(name) = name.map_err(io::Error::other)? else { continue };
                    let dir = Apply::parent_of(&mut at, self.roots, root, parent)?;
                    open_dir_at(dir, &name)?
                }
                None => continue,
            };
            fchmod(&fd, Mode::from_bits_truncate(mode & 0o777))?;
        }
        Ok(())
    }

    fn parent_of<'p>(
        at: &'p mut Option<OpenPath>,
        roots: &[OwnedFd],
        root: usize,
        parent: &Path,
    ) -> io::Result<&'p OwnedFd> {
        let fd = roots.get(root).ok_or_else(|| io::Error::other("an entry of no granted directory"))?;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let mut here = openat(fd, c".", flags, Mode::empty())?;
        for c in parent.components() {
            let name = CString::new(c.as_os_str().as_bytes()).map_err(io::Error::other)?;
            here = open_dir_at(&here, &name)?;
        }
        *at = Some(OpenPath { root, open: vec![(parent.to_path_buf(), here)] });
        Ok(&at.as_ref().expect("set above").open[0].1)
    }
}

/// A blob's name in the change set's directory.
pub fn blob_name(blob: u32) -> CString {
    CString::new(blob.to_string()).expect("digits")
}

/// Whether the file `name` in `dir` has contents of this sha256 (hex).
fn same_contents(dir: &OwnedFd, name: &CStr, sha256: &str) -> bool {
    use sha2::Digest;
    use std::io::Read;
    let Ok(fd) = open_file_at(dir, name) else { return false };
    let mut file = std::fs::File::from(fd);
    let mut hash = sha2::Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hash.update(&buf[..n]),
            Err(_) => return false,
        }
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect::<String>() == sha256
}

/// Whether anything in `names` of a directory is left (a check of an
/// emptied change set's blobs).
pub fn empty(dir: &OwnedFd) -> bool {
    names(dir).is_ok_and(|n| n.is_empty())
}
