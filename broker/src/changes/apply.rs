//! Applying a change set to the host: each entry relative to the
//! descriptor of its granted directory, as the requester, never following
//! a symlink.
//!
//! The check and the replacement are one step. An entry is put in place by
//! `renameat2`: where the host had nothing, with `RENAME_NOREPLACE` (an
//! entry someone made meanwhile stays, and the run's is kept as a
//! conflict); where it had one, with `RENAME_EXCHANGE`, after which what
//! came out is compared with the entry's base and, if someone changed it
//! meanwhile, swapped back (a conflict). A removal moves the host's entry
//! aside first, and removes it only if it is still the base. So a host
//! write made while an apply runs is never lost: it is either before the
//! swap (and seen), or after it (and lands on the new file). A filesystem
//! without those flags (`EINVAL`) gets their nearest: `NOREPLACE` by a hard
//! link ([`super::fs::rename2`]), `EXCHANGE` by a check right before a
//! plain rename and another after it (`Apply::replace_checked`), which
//! narrow the window without closing it.
//!
//! What is put in place comes from the change set: moved there, where the
//! change set's layers (the requester's own: see [`super::layer`]) share
//! the granted directory's filesystem (a directory the host does not have
//! moves whole, whatever it holds), else copied as the requester to a
//! temporary name beside the path first (holes, hard links, user extended
//! attributes, permissions and times kept). Applying again after a stop part-way
//! finishes it: what is already as the change set has it counts as applied.

use super::fs::{changed_since, kind, open_dir_at, open_file_at, remove, rename2, stat_at, unsupported};
use super::manifest::{Entry, Kind};
use crate::host::requester::Acting;
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, readlinkat};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, futimens, mkdirat};
use nix::sys::time::TimeSpec;
use rustix::fs::RenameFlags;
use std::collections::HashMap;
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
    /// The entries not applied (conflicts, files the host executes, what
    /// could not be, and what lies under them), by index.
    pub kept: Vec<usize>,
    /// Of those, the conflicts.
    pub conflicts: Vec<usize>,
    /// Of those, the ones that failed: each with its error, in words.
    pub failed: Vec<(usize, String)>,
}

/// Where the contents of a change set's entries are.
pub enum Contents {
    /// `blobs/N` (a change set of an earlier broker).
    Blobs(OwnedFd),
    /// Each root's layer: its entries at their own paths.
    Tree(Vec<OwnedFd>),
}

/// The largest run of failed entries an apply goes on after: past it the
/// filesystem is taken as refusing every write (full, read-only), and the
/// rest is kept as it is.
const FAILURES_IN_A_ROW: usize = 16;

/// The directories open on the way to an entry (entries come a directory
/// before what it holds), so that each component is opened once, with no
/// symlink followed.
struct OpenPath {
    root: usize,
    /// `(relative path, descriptor)`, from the root down.
    open: Vec<(PathBuf, OwnedFd)>,
}

impl OpenPath {
    /// The directory `parent` under `base` (the root's descriptor), opened
    /// one component at a time from the nearest one already open, by `open`.
    fn reach<'p>(
        at: &'p mut Option<OpenPath>,
        (root, base): (usize, &OwnedFd),
        parent: &Path,
        open: impl Fn(&OwnedFd, &CStr) -> io::Result<OwnedFd>,
    ) -> io::Result<&'p OwnedFd> {
        if at.as_ref().is_none_or(|p| p.root != root) {
            let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
            *at = Some(OpenPath {
                root,
                open: vec![(PathBuf::new(), openat(base, c".", flags, Mode::empty())?)],
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
            let sub = open(fd, &name)?;
            let rel = here.join(next);
            path.open.push((rel, sub));
        }
        Ok(&path.open.last().expect("the root stays").1)
    }
}

/// What became of one entry.
enum Done {
    /// In place (or already there): counts.
    Applied,
    /// As the host had it already, or nothing to do: does not count.
    Nothing,
    /// Kept in the change set; `true`: someone else changed it meanwhile.
    Kept(bool),
}

struct Apply<'a> {
    act: &'a Acting,
    roots: &'a [OwnedFd],
    contents: &'a Contents,
    entries: &'a [Entry],
    choice: Choice,
    /// Whether an apply stopped part-way before this one.
    resuming: bool,
    /// The change set's id: its temporary names on the host are its own.
    id: &'a str,
    /// Each root's threshold of the run's view ([`super::clock::Since::threshold`]).
    thresholds: Vec<i128>,
    /// The broker acts as itself and moves the change set's entries into
    /// place while they share a filesystem (cleared at the first that does not).
    may_move: bool,
    done: Applied,
    /// Directories to give their mode once what they hold is in place.
    dirs: Vec<(usize, PathBuf, u32)>,
    /// Directories moved whole, and directories kept: what they hold is theirs.
    moved: Vec<(usize, PathBuf)>,
    kept_dirs: Vec<(usize, PathBuf)>,
    /// The files of several names put in place: where the first one went.
    placed: HashMap<u64, (usize, PathBuf)>,
    /// Where each entry's descendants end (the index past the last).
    ends: Vec<usize>,
    /// The files of several names one of which is known to be kept.
    split_links: std::collections::HashSet<u64>,
    contents_at: Option<OpenPath>,
}

/// Applies `entries` (of change set `id`, whose run's view was `since`)
/// from `contents` onto the directories `roots` (the broker's descriptors of
/// the granted directories), acting as the requester; the contents are
/// read as the broker. `resuming`: an apply of it stopped part-way before.
#[allow(clippy::too_many_arguments)]
pub fn apply(
    entries: &[Entry],
    contents: &Contents,
    roots: &[OwnedFd],
    act: &Acting,
    choice: Choice,
    since: &super::clock::Since,
    id: &str,
    resuming: bool,
) -> io::Result<Applied> {
    // What changed on each root's filesystem after the run's view is someone else's.
    let thresholds: Vec<i128> = roots.iter().map(|r| since.threshold(super::clock::margin(r))).collect();
    let mut a = Apply {
        act,
        roots,
        contents,
        entries,
        choice,
        resuming,
        id,
        thresholds,
        // A layer is the requester's own; blobs are the broker's.
        may_move: matches!(contents, Contents::Tree(_)) || act.is_broker(),
        done: Applied::default(),
        dirs: Vec::new(),
        moved: Vec::new(),
        kept_dirs: Vec::new(),
        placed: HashMap::new(),
        ends: subtree_ends(entries),
        split_links: entries
            .iter()
            .filter(|e| e.conflict || e.host_executed.is_some() && !choice.host_executed)
            .filter_map(|e| e.link)
            .collect(),
        contents_at: None,
    };
    a.all()?;
    a.unshare_kept()?;
    Ok(a.done)
}

/// For each entry, the index past its last descendant (entries are in the
/// order of a walk: a directory's come right after it).
fn subtree_ends(entries: &[Entry]) -> Vec<usize> {
    let mut ends = vec![0; entries.len()];
    for i in (0..entries.len()).rev() {
        let (root, rel) = (entries[i].root, entries[i].rel());
        let mut end = i + 1;
        while end < entries.len() && entries[end].root == root && entries[end].rel().starts_with(&rel) {
            end = ends[end].max(end + 1);
        }
        ends[i] = end;
    }
    ends
}

impl Apply<'_> {
    fn all(&mut self) -> io::Result<()> {
        let mut at: Option<OpenPath> = None;
        let (mut applied, mut failing) = (0usize, 0usize);
        for (i, e) in self.entries.iter().enumerate() {
            let rel = e.rel();
            let under =
                |list: &[(usize, PathBuf)]| list.iter().any(|(r, p)| *r == e.root && rel.starts_with(p));
            if under(&self.moved) {
                continue;
            }
            if under(&self.kept_dirs) || failing >= FAILURES_IN_A_ROW {
                self.keep(i, false);
                continue;
            }
            if e.host_executed.is_some() && !self.choice.host_executed {
                self.keep(i, false);
                continue;
            }
            match self.one(&mut at, i, e, &rel) {
                Ok(Done::Applied) => {
                    (applied, failing) = (applied + 1, 0);
                    crate::fault::die_after_applying(applied);
                }
                Ok(Done::Nothing) => failing = 0,
                Ok(Done::Kept(conflict)) => self.keep(i, conflict),
                Err(err) => {
                    failing += 1;
                    tracing::warn!(path = %rel.display(), "an entry of a change set not applied: {err}");
                    self.done.failed.push((i, err.to_string()));
                    self.keep(i, false);
                }
            }
        }
        drop(at);
        if let Err(err) = self.finish_dirs() {
            tracing::warn!("the permissions of a change set's directories not set: {err}");
        }
        Ok(())
    }

    fn keep(&mut self, i: usize, conflict: bool) {
        self.done.kept.push(i);
        if conflict {
            self.done.conflicts.push(i);
        }
        let e = &self.entries[i];
        if e.is_dir() {
            self.kept_dirs.push((e.root, e.rel()));
        }
    }

    /// Applies entry `i`, unless someone changed its path since the run's
    /// view (then it is kept), or the host has it already.
    fn one(&mut self, at: &mut Option<OpenPath>, i: usize, e: &Entry, rel: &Path) -> io::Result<Done> {
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else { return Ok(Done::Nothing) };
        let name = CString::new(name.as_bytes()).map_err(io::Error::other)?;
        let root =
            self.roots.get(e.root).ok_or_else(|| io::Error::other("an entry of no granted directory"))?;
        let dir = OpenPath::reach(at, (e.root, root), parent, |d, n| Ok(open_dir_at(d, n)?))?;
        if self.resuming {
            self.tidy(dir, i, e)?;
        }
        let now = stat_at(dir, &name).ok();
        if self.resuming && self.already(dir, &name, e, now.as_ref())? {
            return Ok(self.as_is(e, rel));
        }
        let moved = match (&e.base, &now) {
            (None, None) => false,
            (Some(base), Some(st)) => !base.matches(st),
            _ => true,
        };
        let changed = moved || self.removes_changed(dir, &name, e, now.as_ref())?;
        if (e.conflict || changed) && !self.choice.overwrite {
            // Someone made the run's very change meanwhile: nothing is lost.
            if self.already(dir, &name, e, now.as_ref())? {
                return Ok(self.as_is(e, rel));
            }
            return Ok(Done::Kept(true));
        }
        match &e.kind {
            Kind::Delete => self.delete(dir, &name, i, e),
            Kind::Dir { .. } => self.directory(dir, &name, i, e, now.as_ref()),
            _ => self.place(dir, &name, i, e, now.as_ref()),
        }
    }

    /// What the host already has as the change set does: a directory's
    /// permissions are still set; nothing counts.
    fn as_is(&mut self, e: &Entry, rel: &Path) -> Done {
        if let Kind::Dir { mode, .. } = e.kind {
            self.dirs.push((e.root, rel.to_path_buf(), mode));
        }
        Done::Nothing
    }

    /// The temporary name of entry `i` beside its path on the host.
    fn temp_name(&self, i: usize) -> CString {
        CString::new(format!("{}{}-{i}", super::fs::TEMP_PREFIX, self.id)).expect("no NUL")
    }

    /// An apply that stopped part-way may have left entry `i`'s temporary
    /// name: a copy not yet in place, or a host entry it swapped out, is
    /// removed; a host entry moved aside for a removal is removed if it is
    /// still the base, else put back where it was (if nothing is there now).
    fn tidy(&mut self, dir: &OwnedFd, i: usize, e: &Entry) -> io::Result<()> {
        let tmp = self.temp_name(i);
        let Ok(st) = stat_at(dir, &tmp) else { return Ok(()) };
        let aside = matches!(e.kind, Kind::Delete | Kind::Dir { .. });
        if aside && !self.still_base(e, dir, &tmp, &st)? {
            let rel = e.rel();
            let name =
                CString::new(rel.file_name().map_or(&[][..], |n| n.as_bytes())).map_err(io::Error::other)?;
            match rename2(dir, &tmp, dir, &name, RenameFlags::NOREPLACE) {
                Ok(()) => return Ok(()),
                Err(err) => {
                    tracing::warn!(path = %rel.display(), "a host entry moved aside is left at its temporary name: {err}");
                    return Ok(());
                }
            }
        }
        remove(dir, &tmp)?;
        Ok(())
    }

    /// Whether the host already has at `name` what `e` makes (an apply
    /// that stopped part-way, or the very change made on the host).
    fn already(&self, dir: &OwnedFd, name: &CStr, e: &Entry, now: Option<&FileStat>) -> io::Result<bool> {
        let same_mode = |st: &FileStat, mode: u32| st.st_mode & 0o777 == mode & 0o777;
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
            (Kind::Fifo { mode }, Some(st)) => kind(st) == SFlag::S_IFIFO && same_mode(st, *mode),
            (Kind::Socket { mode }, Some(st)) => kind(st) == SFlag::S_IFSOCK && same_mode(st, *mode),
            (Kind::File { size, sha256, mode, .. }, Some(st)) if kind(st) == SFlag::S_IFREG => {
                st.st_size as u64 == *size
                    && same_mode(st, *mode)
                    && open_file_at(dir, name).ok().and_then(|fd| super::capture::sha256_of(&fd).ok())
                        == Some(sha256.clone())
            }
            _ => false,
        })
    }

    /// Whether applying `e` removes a directory in which something changed
    /// after the run's view: its own status says nothing of its files' contents.
    fn removes_changed(
        &self,
        dir: &OwnedFd,
        name: &CStr,
        e: &Entry,
        now: Option<&FileStat>,
    ) -> io::Result<bool> {
        let removes = match e.kind {
            Kind::Delete | Kind::Dir { opaque: true, .. } => true,
            _ => now.is_some_and(|st| kind(st) == SFlag::S_IFDIR) && !e.is_dir(),
        };
        if !removes {
            return Ok(false);
        }
        let mut budget = super::capture::CONFLICT_SCAN_ENTRIES;
        changed_since(dir, name, self.thresholds[e.root], &mut budget)
    }

    /// Whether `st`, what a swap or a move aside took out of `name`'s place
    /// (now at `at` in `in_dir`), is still the host's entry the change was
    /// taken over: the same file, unchanged since the run's view.
    fn still_base(&self, e: &Entry, in_dir: &OwnedFd, at: &CStr, st: &FileStat) -> io::Result<bool> {
        if self.choice.overwrite {
            return Ok(true);
        }
        if !e.base.is_some_and(|b| b.same_file(st)) {
            return Ok(false);
        }
        if kind(st) != SFlag::S_IFDIR {
            return Ok(true);
        }
        let mut budget = super::capture::CONFLICT_SCAN_ENTRIES;
        let dir = open_dir_at(in_dir, at)?;
        for n in super::fs::names(&dir)? {
            if changed_since(&dir, &n, self.thresholds[e.root], &mut budget)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Removes the host's entry at `name`: moved aside to a temporary name,
    /// then removed if it is still the base, else put back (a conflict).
    fn delete(&mut self, dir: &OwnedFd, name: &CStr, i: usize, e: &Entry) -> io::Result<Done> {
        let tmp = self.temp_name(i);
        crate::fault::apply_window(&e.rel());
        match rename2(dir, name, dir, &tmp, RenameFlags::NOREPLACE) {
            Ok(()) => {}
            // Gone meanwhile: as the run left it.
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(Done::Nothing),
            Err(err) => return Err(err),
        }
        let st = stat_at(dir, &tmp)?;
        if !self.still_base(e, dir, &tmp, &st)? {
            rename2(dir, &tmp, dir, name, RenameFlags::NOREPLACE)?;
            return Ok(Done::Kept(true));
        }
        self.done.removed += remove(dir, &tmp)?;
        Ok(Done::Applied)
    }
}

/// The contents of entries, and putting them in place.
impl Apply<'_> {
    /// The directory of the change set holding entry `e`'s contents, and
    /// its name there.
    fn source(&mut self, e: &Entry) -> io::Result<(OwnedFd, CString)> {
        match self.contents {
            Contents::Blobs(blobs) => match e.kind {
                Kind::File { blob, .. } => Ok((self.act.as_broker(|| blobs.try_clone())?, blob_name(blob))),
                _ => Err(io::Error::other("only a file's contents are a blob")),
            },
            // The layers are the requester's own: read and moved as the requester.
            Contents::Tree(uppers) => {
                let rel = e.rel();
                let base = uppers.get(e.root).ok_or_else(|| io::Error::other("a layer of no root"))?;
                let name = rel.file_name().ok_or_else(|| io::Error::other("an entry without a name"))?;
                let name = CString::new(name.as_bytes()).map_err(io::Error::other)?;
                let parent = rel.parent().unwrap_or(Path::new(""));
                let open = |d: &OwnedFd, n: &CStr| Ok(open_dir_at(d, n)?);
                let dir =
                    OpenPath::reach(&mut self.contents_at, (e.root, base), parent, open)?.try_clone()?;
                Ok((dir, name))
            }
        }
    }

    /// Puts entry `i` (a file, link, FIFO or socket) at `name`, where the
    /// host has `now`.
    fn place(
        &mut self,
        dir: &OwnedFd,
        name: &CStr,
        i: usize,
        e: &Entry,
        now: Option<&FileStat>,
    ) -> io::Result<Done> {
        let moving = self.may_move && !matches!(e.kind, Kind::File { .. } if self.split(i));
        let (src_dir, src) = match moving {
            true => self.source(e)?,
            false => (dir.try_clone()?, self.make_temp(dir, i, e)?),
        };
        match self.swap_in(dir, name, (&src_dir, &src), e, now.is_some()) {
            Err(err) if moving && err.raw_os_error() == Some(libc::EXDEV) => {
                // Another filesystem: copied from here on.
                self.may_move = false;
                self.place(dir, name, i, e, now)
            }
            Ok(Done::Applied) => {
                if let (Some(link), Kind::File { .. }) = (e.link, &e.kind) {
                    self.placed.entry(link).or_insert_with(|| (e.root, e.rel()));
                }
                if let Kind::File { size, .. } = e.kind {
                    self.done.bytes += size;
                }
                self.done.files += 1;
                Ok(Done::Applied)
            }
            other => {
                if !moving {
                    let _ =
                        nix::unistd::unlinkat(dir, src.as_c_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
                }
                other
            }
        }
    }

    /// Whether file `i` is one name of a file whose other names are kept
    /// on the host's behalf: moved, it would stay one file with what the
    /// change set holds. A copy is put in place instead.
    fn split(&self, i: usize) -> bool {
        self.entries[i].link.is_some_and(|l| self.split_links.contains(&l))
    }

    /// Renames `src` (in `src_dir`) to `name` in `dir`: with no entry
    /// there, never over one made meanwhile; over the host's entry, swapped
    /// with it, and swapped back unless what came out is still the base.
    fn swap_in(
        &mut self,
        dir: &OwnedFd,
        name: &CStr,
        (src_dir, src): (&OwnedFd, &CStr),
        e: &Entry,
        exists: bool,
    ) -> io::Result<Done> {
        crate::fault::apply_window(&e.rel());
        if !exists {
            return match rename2(src_dir, src, dir, name, RenameFlags::NOREPLACE) {
                Ok(()) => Ok(Done::Applied),
                Err(err) if err.raw_os_error() == Some(libc::EEXIST) => Ok(Done::Kept(true)),
                Err(err) => Err(err),
            };
        }
        match rename2(src_dir, src, dir, name, RenameFlags::EXCHANGE) {
            Ok(()) => {}
            // Removed meanwhile: the host's removal stands, the run's version is kept.
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(Done::Kept(true)),
            Err(err) if unsupported(&err) => return self.replace_checked(dir, name, (src_dir, src), e),
            Err(err) => return Err(err),
        }
        let out = stat_at(src_dir, src)?;
        if !self.still_base(e, src_dir, src, &out)? {
            rename2(src_dir, src, dir, name, RenameFlags::EXCHANGE)?;
            return Ok(Done::Kept(true));
        }
        // What it replaced: a directory's entries count as removed, a file is only replaced.
        let removed = remove(src_dir, src)?;
        if kind(&out) == SFlag::S_IFDIR {
            self.done.removed += removed;
        }
        Ok(Done::Applied)
    }

    /// [`Self::swap_in`] where the filesystem has no `RENAME_EXCHANGE`: the
    /// host's entry is checked once more right before a plain rename over
    /// it. That narrows the window between the check and the replacement to
    /// a few calls; it does not close it, so what the host does in it is
    /// looked for after. The host's entry is hard-linked aside first:
    /// checked there, and looked at again once the run's is in place; if the
    /// host wrote it in between, the run's goes back where it came from and
    /// the host's is put back (a conflict). What this cannot see: a host
    /// entry replaced by another name between the check and the rename, and
    /// on a filesystem that links nothing (then checked at its name) a
    /// write in that window. A directory on either side: [`Self::replace_aside`].
    fn replace_checked(
        &mut self,
        dir: &OwnedFd,
        name: &CStr,
        (src_dir, src): (&OwnedFd, &CStr),
        e: &Entry,
    ) -> io::Result<Done> {
        let aside = CString::new(format!("{}{}-host", super::fs::TEMP_PREFIX, self.id)).expect("no NUL");
        let _ = nix::unistd::unlinkat(dir, aside.as_c_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        let host_dir = match stat_at(dir, name) {
            Err(Errno::ENOENT) => return Ok(Done::Kept(true)),
            Err(err) => return Err(err.into()),
            Ok(st) => kind(&st) == SFlag::S_IFDIR,
        };
        if host_dir || kind(&stat_at(src_dir, src)?) == SFlag::S_IFDIR {
            return self.replace_aside(dir, name, (src_dir, src), e, &aside);
        }
        let linked =
            nix::unistd::linkat(dir, name, dir, aside.as_c_str(), nix::fcntl::AtFlags::empty()).is_ok();
        let at = if linked { aside.as_c_str() } else { name };
        let checked = stat_at(dir, at)?;
        if !self.still_base(e, dir, at, &checked)? {
            if linked {
                nix::unistd::unlinkat(dir, aside.as_c_str(), nix::unistd::UnlinkatFlags::NoRemoveDir)?;
            }
            return Ok(Done::Kept(true));
        }
        if let Err(err) = rustix::fs::renameat(src_dir, src, dir, name) {
            if linked {
                let _ = nix::unistd::unlinkat(dir, aside.as_c_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
            }
            return Err(err.into());
        }
        if !linked {
            return Ok(Done::Applied);
        }
        let after = stat_at(dir, &aside)?;
        if (after.st_size, after.st_mtime, after.st_mtime_nsec)
            != (checked.st_size, checked.st_mtime, checked.st_mtime_nsec)
            && !self.choice.overwrite
        {
            // Written between the check and the rename: the host's goes back.
            rustix::fs::renameat(dir, name, src_dir, src)?;
            rustix::fs::renameat(dir, &aside, dir, name)?;
            return Ok(Done::Kept(true));
        }
        nix::unistd::unlinkat(dir, aside.as_c_str(), nix::unistd::UnlinkatFlags::NoRemoveDir)?;
        Ok(Done::Applied)
    }

    /// [`Self::replace_checked`] where a directory is on either side (no
    /// plain rename puts one over the other): the host's entry is moved
    /// aside, checked there and put back if someone changed it (a
    /// conflict); then the run's is renamed in, never over an entry made
    /// meanwhile (that one stays, the run's is kept), and only once it is
    /// in is the host's removed (put back if the rename fails: another
    /// filesystem, where the caller copies instead).
    fn replace_aside(
        &mut self,
        dir: &OwnedFd,
        name: &CStr,
        (src_dir, src): (&OwnedFd, &CStr),
        e: &Entry,
        aside: &CStr,
    ) -> io::Result<Done> {
        rename2(dir, name, dir, aside, RenameFlags::NOREPLACE)?;
        let out = stat_at(dir, aside)?;
        if !self.still_base(e, dir, aside, &out)? {
            rename2(dir, aside, dir, name, RenameFlags::NOREPLACE)?;
            return Ok(Done::Kept(true));
        }
        match rename2(src_dir, src, dir, name, RenameFlags::NOREPLACE) {
            Ok(()) => {}
            Err(err) => {
                let made = err.raw_os_error() == Some(libc::EEXIST);
                if let Err(back) = rename2(dir, aside, dir, name, RenameFlags::NOREPLACE) {
                    let at = String::from_utf8_lossy(aside.to_bytes()).into_owned();
                    tracing::warn!(path = %e.rel().display(), "the host's entry is left at {at}: {back}");
                }
                return if made { Ok(Done::Kept(true)) } else { Err(err) };
            }
        }
        let removed = remove(dir, aside)?;
        if kind(&out) == SFlag::S_IFDIR {
            self.done.removed += removed;
        }
        Ok(Done::Applied)
    }

    /// Entry `i` made at its temporary name in `dir`, as the requester:
    /// a hard link to a name of its file already in place, else a copy of
    /// the change set's (holes, extended attributes, permissions and
    /// modification time kept), a link, a FIFO or a socket.
    fn make_temp(&mut self, dir: &OwnedFd, i: usize, e: &Entry) -> io::Result<CString> {
        let tmp = self.temp_name(i);
        let _ = nix::unistd::unlinkat(dir, tmp.as_c_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        let mode = |m: u32| Mode::from_bits_truncate(m & 0o777);
        match &e.kind {
            Kind::Symlink { target } => {
                nix::unistd::symlinkat(OsStr::from_bytes(target), dir, tmp.as_c_str())?
            }
            Kind::Fifo { mode: m } => {
                nix::unistd::mkfifoat(dir, tmp.as_c_str(), mode(*m))?;
                set_mode_at(dir, &tmp, *m)?;
            }
            Kind::Socket { mode: m } => {
                nix::sys::stat::mknodat(dir, tmp.as_c_str(), SFlag::S_IFSOCK, mode(*m), 0)?;
                set_mode_at(dir, &tmp, *m)?;
            }
            Kind::File { mode: m, mtime_ns, .. } => {
                if !self.link_to_placed(dir, &tmp, e)? {
                    self.copy_file(dir, &tmp, e, (*m, *mtime_ns)).inspect_err(|_| {
                        let _ = nix::unistd::unlinkat(
                            dir,
                            tmp.as_c_str(),
                            nix::unistd::UnlinkatFlags::NoRemoveDir,
                        );
                    })?;
                }
            }
            Kind::Dir { .. } | Kind::Delete => return Err(io::Error::other("not a file")),
        }
        Ok(tmp)
    }

    /// A hard link at `tmp` to where another name of `e`'s file was put
    /// in place, if one was (and the filesystem links it).
    fn link_to_placed(&self, dir: &OwnedFd, tmp: &CStr, e: &Entry) -> io::Result<bool> {
        let Some((root, rel)) = e.link.and_then(|l| self.placed.get(&l)) else { return Ok(false) };
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else { return Ok(false) };
        let mut at = None;
        let base = &self.roots[*root];
        let Ok(from) = OpenPath::reach(&mut at, (*root, base), parent, |d, n| Ok(open_dir_at(d, n)?)) else {
            return Ok(false);
        };
        let name = CString::new(name.as_bytes()).map_err(io::Error::other)?;
        Ok(nix::unistd::linkat(from, name.as_c_str(), dir, tmp, nix::fcntl::AtFlags::empty()).is_ok())
    }

    /// A copy of `e`'s contents at `tmp` in `dir`, made as the requester.
    fn copy_file(
        &mut self,
        dir: &OwnedFd,
        tmp: &CStr,
        e: &Entry,
        (m, mtime_ns): (u32, i128),
    ) -> io::Result<()> {
        let (src_dir, src) = self.source(e)?;
        let from = match self.contents {
            Contents::Blobs(_) => self.act.as_broker(|| Ok(open_file_at(&src_dir, &src)?))?,
            Contents::Tree(_) => open_file_at(&src_dir, &src)?,
        };
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let to = openat(dir, tmp, flags, Mode::from_bits_truncate(0o600))?;
        super::fs::copy_sparse(&from, &to)?;
        super::fs::set_xattrs(&to, &e.xattrs)?;
        fchmod(&to, Mode::from_bits_truncate(m & 0o777))?;
        let at = TimeSpec::new(
            mtime_ns.div_euclid(1_000_000_000) as i64,
            mtime_ns.rem_euclid(1_000_000_000) as i64,
        );
        futimens(&to, &at, &at)?;
        Ok(())
    }

    /// Entry `i`, a directory: where the host has none (or the run's
    /// replaces the host's) and nothing under it is kept back, moved whole
    /// from the change set; otherwise made, and what it holds applied after.
    fn directory(
        &mut self,
        dir: &OwnedFd,
        name: &CStr,
        i: usize,
        e: &Entry,
        now: Option<&FileStat>,
    ) -> io::Result<Done> {
        let Kind::Dir { mode, opaque } = e.kind else { return Ok(Done::Nothing) };
        let host_dir = now.is_some_and(|st| kind(st) == SFlag::S_IFDIR);
        let rel = e.rel();
        if host_dir && !opaque {
            if !e.xattrs.is_empty() {
                super::fs::set_xattrs(&open_dir_at(dir, name)?, &e.xattrs)?;
            }
            self.dirs.push((e.root, rel, mode));
            return Ok(Done::Nothing);
        }
        if self.may_move && self.movable(i) {
            let (src_dir, src) = self.source(e)?;
            match self.swap_in(dir, name, (&src_dir, &src), e, now.is_some()) {
                Err(err) if err.raw_os_error() == Some(libc::EXDEV) => self.may_move = false,
                Ok(Done::Applied) => {
                    self.moved_whole(i);
                    return Ok(Done::Applied);
                }
                other => return other,
            }
        }
        if let Some(st) = now {
            let tmp = self.temp_name(i);
            rename2(dir, name, dir, &tmp, RenameFlags::NOREPLACE)?;
            if !self.still_base(e, dir, &tmp, st)? {
                rename2(dir, &tmp, dir, name, RenameFlags::NOREPLACE)?;
                return Ok(Done::Kept(true));
            }
            self.done.removed += remove(dir, &tmp)?;
        }
        match mkdirat(dir, name, Mode::from_bits_truncate(0o700)) {
            Ok(()) => {}
            // Made meanwhile by someone else: the run's is kept whole.
            Err(Errno::EEXIST) => return Ok(Done::Kept(true)),
            Err(err) => return Err(err.into()),
        }
        if !e.xattrs.is_empty() {
            super::fs::set_xattrs(&open_dir_at(dir, name)?, &e.xattrs)?;
        }
        self.dirs.push((e.root, rel, mode));
        Ok(Done::Nothing)
    }

    /// Whether directory `i` moves whole: it is in the change set's tree,
    /// and nothing under it is held back.
    fn movable(&self, i: usize) -> bool {
        matches!(self.contents, Contents::Tree(_))
            && self.entries[i + 1..self.ends[i]]
                .iter()
                .all(|e| e.host_executed.is_none() || self.choice.host_executed)
    }

    /// What moved whole with directory `i`: counted, and its directories'
    /// permissions set once everything is in place.
    fn moved_whole(&mut self, i: usize) {
        let e = &self.entries[i];
        self.moved.push((e.root, e.rel()));
        for d in &self.entries[i..self.ends[i]] {
            match d.kind {
                Kind::Dir { mode, .. } => self.dirs.push((d.root, d.rel(), mode)),
                Kind::File { size, .. } => {
                    (self.done.files, self.done.bytes) = (self.done.files + 1, self.done.bytes + size)
                }
                Kind::Delete => {}
                _ => self.done.files += 1,
            }
        }
    }

    /// A kept file one of whose other names was moved onto the host would
    /// stay one file with it: its contents in the change set are made a
    /// file of their own.
    fn unshare_kept(&mut self) -> io::Result<()> {
        let kept: Vec<usize> = self.done.kept.clone();
        for i in kept {
            let e = &self.entries[i];
            let (Some(link), Kind::File { .. }) = (e.link, &e.kind) else { continue };
            if !self.placed.contains_key(&link) || !matches!(self.contents, Contents::Tree(_)) {
                continue;
            }
            let (dir, name) = self.source(e)?;
            {
                let tmp = c".palisade-unshare";
                let from = open_file_at(&dir, &name)?;
                let flags =
                    OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
                let _ = nix::unistd::unlinkat(&dir, tmp, nix::unistd::UnlinkatFlags::NoRemoveDir);
                let to = openat(&dir, tmp, flags, Mode::from_bits_truncate(0o600))?;
                super::fs::copy_sparse(&from, &to)?;
                nix::sys::stat::fchmod(
                    &to,
                    Mode::from_bits_truncate(nix::sys::stat::fstat(&from)?.st_mode & 0o777),
                )?;
                rename2(&dir, tmp, &dir, &name, RenameFlags::empty())?;
            }
        }
        Ok(())
    }

    /// The directories' permission bits, deepest first, once what they hold is in place.
    fn finish_dirs(&mut self) -> io::Result<()> {
        for (root, rel, mode) in self.dirs.drain(..).rev() {
            let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else { continue };
            let name = CString::new(name.as_bytes()).map_err(io::Error::other)?;
            let mut at = None;
            let dir =
                OpenPath::reach(&mut at, (root, &self.roots[root]), parent, |d, n| Ok(open_dir_at(d, n)?))?;
            fchmod(&open_dir_at(dir, &name)?, Mode::from_bits_truncate(mode & 0o777))?;
        }
        Ok(())
    }
}

/// Gives `name` in `dir` (a FIFO or socket just made) its permission bits,
/// which the thread's umask cut when it was made.
fn set_mode_at(dir: &OwnedFd, name: &CStr, mode: u32) -> io::Result<()> {
    nix::sys::stat::fchmodat(
        dir,
        name,
        Mode::from_bits_truncate(mode & 0o777),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )?;
    Ok(())
}

/// A blob's name in the change set's directory.
pub fn blob_name(blob: u32) -> CString {
    CString::new(blob.to_string()).expect("digits")
}
