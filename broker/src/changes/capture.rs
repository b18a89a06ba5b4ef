//! Taking a run's writes from the upper layer of its overlays as a change
//! set: each entry with the host's state under it (its base), whether the
//! host changed it after the run took its view (a conflict), and whether it
//! is a file the host executes. The upper layer is on disk, in the change
//! set being made ([`super::layer`]): its entries stay where the run left
//! them, and are the change set's contents ([`Layout::Tree`]) once
//! overlayfs's own marks are removed, each file readable by the broker and
//! hashed. What the broker keeps is not taken at all: it is removed from
//! the layer (withheld, and said).
//!
//! [`Layout::Tree`]: super::manifest::Layout::Tree

use super::fs::{changed_since, kind, names, open_dir_at, open_file_at, stat_at};
use super::manifest::{Base, Entry, Kind};
use nix::errno::Errno;
use nix::fcntl::readlinkat;
use nix::sys::stat::{FchmodatFlags, FileStat, Mode, SFlag, fchmod, fchmodat};
use palisade_policy::host_executed::{Check, HostExecuted};
use palisade_protocol::wire::{Withheld, WithheldReason};
use sha2::Digest;
use std::collections::HashMap;
use std::ffi::{CStr, OsStr};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The largest git configuration file compared (a repository's is a few
/// hundred bytes); a larger one is taken as naming other commands.
const GIT_CONFIG_MAX_BYTES: u64 = 1 << 20;
/// Entries of a directory the run removed or replaced that are looked at
/// for a change since the run started; past it, one is assumed.
pub(crate) const CONFLICT_SCAN_ENTRIES: u32 = 100_000;

/// What a capture must not take, and what it flags.
pub struct Guard<'a> {
    /// The granted directory on the host, for the paths reported.
    pub root: &'a Path,
    /// What the broker keeps, relative to `root`, whether or not it exists there yet.
    pub owned: Vec<(PathBuf, String)>,
    pub host_executed: &'a HostExecuted,
    /// The host's own hooks directories (`core.hooksPath`), relative to `root`.
    pub hooks: Vec<PathBuf>,
}

/// The most a change set may hold: entries, bytes of their paths, and
/// directories deep. Past them it is not taken (`TooLarge`): its manifest
/// would take the broker's memory, or a recursion its stack.
pub const MAX_ENTRIES: usize = 200_000;
pub const MAX_PATH_BYTES: usize = 16 << 20;
pub const MAX_DEPTH: usize = 256;

/// A change set that may not be taken, and why.
#[derive(Debug)]
pub struct TooLarge(pub String);

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TooLarge {}

/// What one overlay held.
#[derive(Default)]
pub struct Captured {
    pub entries: Vec<Entry>,
    pub withheld: Vec<Withheld>,
    /// Bytes its files take on disk, each once however many names it has.
    pub bytes: u64,
    /// What the run left that no change set carries (a device node, user
    /// extended attributes past their bound).
    pub not_carried: Vec<Withheld>,
}

/// How far a capture goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// The change set's contents: overlayfs's marks removed, files made
    /// readable by the broker and hashed.
    Contents,
    /// The entries only, the layer left as it is (a count of what is not kept).
    Count,
}

struct Walk<'a> {
    guard: &'a Guard<'a>,
    root: usize,
    /// [`super::clock::Since::threshold`] of the run's view: a host entry
    /// whose status changed after it was changed by someone else meanwhile.
    since: i128,
    take: Take,
    out: Captured,
    /// The host directory's filesystem: an entry on another (a mount inside
    /// the granted directory, which the overlay does not show) is not touched.
    dev: u64,
    path_bytes: usize,
    /// The files of several names seen so far: inode to sha256.
    linked: HashMap<u64, String>,
}

/// Takes what the upper layer `upper` holds over the host directory `dest`
/// (the broker's descriptor of it), both read as the requester the calling
/// thread acts for: the layer is the requester's own (a system broker's sandbox writes
/// it through an idmap, as the requester); with [`Take::Contents`] it is
/// made the change set's.
pub fn capture(
    upper: &OwnedFd,
    dest: &OwnedFd,
    guard: &Guard<'_>,
    (root, since): (usize, &super::clock::Since),
    take: Take,
) -> io::Result<Captured> {
    let flags = nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC;
    let host = nix::fcntl::openat(dest, c".", flags, Mode::empty())?;
    let dev = nix::sys::stat::fstat(&host)?.st_dev;
    let since = since.threshold(super::clock::margin(&host));
    let up = upper.try_clone()?;
    let out = Captured::default();
    let mut walk = Walk { guard, root, since, take, out, dev, path_bytes: 0, linked: HashMap::new() };
    walk.dir(&up, Some(&host), PathBuf::new(), None)?;
    Ok(walk.out)
}

impl Walk<'_> {
    /// Something of the upper layer: the requester's own (the sandbox's
    /// ids are mapped to the requester's on it), read and changed as the
    /// requester.
    fn up<T>(&self, f: impl FnOnce() -> nix::Result<T>) -> io::Result<T> {
        f().map_err(io::Error::from)
    }

    fn dir(
        &mut self,
        up: &OwnedFd,
        host: Option<&OwnedFd>,
        rel: PathBuf,
        inherited: Option<String>,
    ) -> io::Result<()> {
        if rel.components().count() > MAX_DEPTH {
            return Err(too_large(format!("directories deeper than {MAX_DEPTH}")));
        }
        let listed = names(up)?;
        for name in listed {
            let st = self.up(|| stat_at(up, &name))?;
            let rel = rel.join(OsStr::from_bytes(name.as_bytes()));
            self.path_bytes += rel.as_os_str().len();
            if self.out.entries.len() >= MAX_ENTRIES || self.path_bytes > MAX_PATH_BYTES {
                return Err(too_large(format!(
                    "more than {MAX_ENTRIES} entries or {MAX_PATH_BYTES} bytes of their paths"
                )));
            }
            let host_st = host.and_then(|h| stat_at(h, &name).ok());
            let elsewhere = host_st.as_ref().is_some_and(|h| h.st_dev != self.dev);
            if let Some((reason, what)) = self.not_taken(up, &name, &st, host_st.as_ref(), &rel, elsewhere)? {
                let path = self.guard.root.join(&rel).to_string_lossy().into_owned();
                tracing::warn!(%path, what, "a change withheld");
                self.out.withheld.push(Withheld { path, reason, what });
                if self.take == Take::Contents {
                    // Never applied: not in the change set either.
                    super::fs::remove(up, &name)?;
                }
                continue;
            }
            let host_executed = match &inherited {
                Some(what) => Some(what.clone()),
                None => self.host_executed(up, host, &name, &st, &rel)?,
            };
            self.entry(up, host, &name, &st, host_st, rel, host_executed)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn entry(
        &mut self,
        up: &OwnedFd,
        host: Option<&OwnedFd>,
        name: &CStr,
        st: &FileStat,
        host_st: Option<FileStat>,
        rel: PathBuf,
        host_executed: Option<String>,
    ) -> io::Result<()> {
        let base = host_st.as_ref().map(Base::of);
        let mut budget = CONFLICT_SCAN_ENTRIES;
        let mode = st.st_mode & 0o777;
        let (kind_, conflict, xattrs, link) = match kind(st) {
            // A whiteout: the sandbox removed this name. Nothing there: nothing to do.
            SFlag::S_IFCHR if st.st_rdev == 0 => {
                let (Some(h), Some(_)) = (host, &host_st) else { return Ok(()) };
                (Kind::Delete, changed_since(h, name, self.since, &mut budget)?, vec![], None)
            }
            SFlag::S_IFDIR => return self.directory(up, host, name, st, host_st, rel, host_executed),
            SFlag::S_IFREG => {
                let (kind, xattrs) = self.file(up, name, st, &rel)?;
                let link = (st.st_nlink > 1).then_some(st.st_ino);
                (kind, self.replaces(host, name, &host_st, up, &rel)?, xattrs, link)
            }
            SFlag::S_IFLNK => {
                let target = self.up(|| readlinkat(up, name))?.as_bytes().to_vec();
                (Kind::Symlink { target }, self.replaces(host, name, &host_st, up, &rel)?, vec![], None)
            }
            SFlag::S_IFIFO => {
                (Kind::Fifo { mode }, self.replaces(host, name, &host_st, up, &rel)?, vec![], None)
            }
            SFlag::S_IFSOCK => {
                (Kind::Socket { mode }, self.replaces(host, name, &host_st, up, &rel)?, vec![], None)
            }
            // Device nodes: no sandbox can make one (it has no CAP_MKNOD on the host).
            _ => {
                self.not_carried(&rel, "a device node, which no change set carries".into());
                return Ok(());
            }
        };
        let path = rel.as_os_str().as_bytes().to_vec();
        let root = self.root;
        self.out.entries.push(Entry { root, path, kind: kind_, base, conflict, host_executed, xattrs, link });
        Ok(())
    }

    /// A directory of the upper layer: its entry (made where the host has
    /// none, or replacing the host's when `opaque`), then what it holds.
    #[allow(clippy::too_many_arguments)]
    fn directory(
        &mut self,
        up: &OwnedFd,
        host: Option<&OwnedFd>,
        name: &CStr,
        st: &FileStat,
        host_st: Option<FileStat>,
        rel: PathBuf,
        host_executed: Option<String>,
    ) -> io::Result<()> {
        let sub_up = self.open_dir(up, name, st)?;
        let opaque = self.up(|| Ok(super::fs::opaque(&sub_up)))?;
        let xattrs = self.xattrs(&sub_up, &rel)?;
        let host_dir = host_st.as_ref().is_some_and(|h| kind(h) == SFlag::S_IFDIR);
        let mut budget = CONFLICT_SCAN_ENTRIES;
        let conflict = match (host, &host_st) {
            (Some(h), Some(_)) if opaque && host_dir => changed_since(h, name, self.since, &mut budget)?,
            (Some(_), Some(hs)) if !host_dir => super::clock::changed_after(hs, self.since),
            _ => false,
        };
        let children = host_executed.clone();
        let kind = Kind::Dir { mode: st.st_mode & 0o777, opaque };
        let path = rel.as_os_str().as_bytes().to_vec();
        let (root, base) = (self.root, host_st.as_ref().map(Base::of));
        self.out.entries.push(Entry { root, path, kind, base, conflict, host_executed, xattrs, link: None });
        // The host's directory, where the run's merges into it.
        let sub_host = match host {
            Some(h) if host_dir && !opaque => open_dir_at(h, name).ok(),
            _ => None,
        };
        self.dir(&sub_up, sub_host.as_ref(), rel, children)
    }

    /// A directory of the upper layer, opened: one the run left closed to
    /// its owner (mode 0, 0300, ...) is opened to it first (an apply moves
    /// what it holds); its entry keeps the run's mode, which an apply gives it.
    fn open_dir(&self, up: &OwnedFd, name: &CStr, st: &FileStat) -> io::Result<OwnedFd> {
        if self.opens_to_owner(st.st_mode, 0o700) {
            let mode = Mode::from_bits_truncate((st.st_mode & 0o777) | 0o700);
            self.up(|| fchmodat(up, name, mode, FchmodatFlags::NoFollowSymlink))?;
        }
        self.up(|| open_dir_at(up, name))
    }

    /// Whether an entry of `mode` is opened to its owner (`bits`) before
    /// it is read: where the change set keeps it.
    fn opens_to_owner(&self, mode: u32, bits: u32) -> bool {
        self.take == Take::Contents && mode & bits != bits
    }

    /// The user extended attributes of `fd` (a file or a directory of the
    /// upper layer), overlayfs's own marks removed from it when the change
    /// set keeps it.
    fn xattrs(&mut self, fd: &OwnedFd, rel: &Path) -> io::Result<Vec<super::manifest::Xattr>> {
        let (xattrs, marked) = super::fs::user_xattrs(fd)?;
        if marked && self.take == Take::Contents {
            super::fs::strip_overlay_xattrs(fd)?;
        }
        Ok(xattrs.unwrap_or_else(|| {
            let limit = super::fs::XATTRS_MAX_BYTES;
            self.not_carried(rel, format!("its extended attributes, past {limit} bytes: not carried"));
            vec![]
        }))
    }

    fn not_carried(&mut self, rel: &Path, what: String) {
        let path = self.guard.root.join(rel).to_string_lossy().into_owned();
        tracing::warn!(%path, what, "not carried");
        self.out.not_carried.push(Withheld { path, reason: WithheldReason::NotCarried, what });
    }

    /// A regular file of the upper layer: its size and mode and, when the
    /// change set keeps it, its sha256 (a file the run left unreadable to
    /// its owner is read all the same, and keeps its mode); counted once
    /// however many names it has.
    fn file(
        &mut self,
        up: &OwnedFd,
        name: &CStr,
        st: &FileStat,
        rel: &Path,
    ) -> io::Result<(Kind, Vec<super::manifest::Xattr>)> {
        let (mode, size) = (st.st_mode & 0o777, st.st_size as u64);
        let mtime_ns = super::fs::ns(st.st_mtime, st.st_mtime_nsec);
        let first = !self.linked.contains_key(&st.st_ino);
        if first {
            self.out.bytes += super::fs::allocated(st);
        }
        if self.take == Take::Count {
            return Ok((Kind::File { blob: 0, size, sha256: String::new(), mode, mtime_ns }, vec![]));
        }
        // Read and marked as its owner: a file closed to it is opened meanwhile
        // (and one setuid, setgid or sticky never stays so).
        let closed = self.opens_to_owner(st.st_mode, 0o600) || st.st_mode & 0o7000 != 0;
        if closed {
            let open = Mode::from_bits_truncate((st.st_mode & 0o777) | 0o600);
            self.up(|| fchmodat(up, name, open, FchmodatFlags::NoFollowSymlink))?;
        }
        let fd = self.up(|| open_file_at(up, name))?;
        let xattrs = self.xattrs(&fd, rel)?;
        let sha256 = match self.linked.get(&st.st_ino) {
            Some(sha) if !first => sha.clone(),
            _ => sha256_of(&fd)?,
        };
        if st.st_nlink > 1 {
            self.linked.insert(st.st_ino, sha256.clone());
        }
        // Its permission bits as the run left them, but never setuid, setgid or sticky.
        if closed {
            self.up(|| fchmod(&fd, Mode::from_bits_truncate(st.st_mode & 0o777)))?;
        }
        Ok((Kind::File { blob: 0, size, sha256, mode, mtime_ns }, xattrs))
    }

    /// Whether the run's file or link at `name` would replace someone
    /// else's change: the host's entry changed after the run's view, or
    /// there is none and its directory on the host changed since (the host
    /// may have removed what the run changed; a rename in the sandbox leaves
    /// the host's directory as it was).
    fn replaces(
        &self,
        host: Option<&OwnedFd>,
        name: &CStr,
        host_st: &Option<FileStat>,
        up: &OwnedFd,
        rel: &Path,
    ) -> io::Result<bool> {
        let mut budget = CONFLICT_SCAN_ENTRIES;
        // A directory on the way to what the broker keeps changes when the
        // broker writes there (its change sets): only a copied-up entry says
        // the host had it.
        let broker_writes_here =
            rel.parent().is_some_and(|p| self.guard.owned.iter().any(|(o, _)| o.starts_with(p)));
        match (host, host_st) {
            (Some(h), Some(st)) if kind(st) == SFlag::S_IFDIR => {
                changed_since(h, name, self.since, &mut budget)
            }
            (Some(_), Some(st)) => Ok(super::clock::changed_after(st, self.since)),
            // None there: someone removed it meanwhile if its directory
            // changed since (a spurious conflict only holds the run's version).
            (Some(h), None) if !broker_writes_here => {
                Ok(super::clock::changed_after(&nix::sys::stat::fstat(h)?, self.since))
            }
            _ => self.up(|| Ok(origin_at(up, name))),
        }
    }

    /// Why the entry at `rel` is not taken at all: it is, or leads to, what
    /// the broker keeps; or the host has another filesystem mounted there.
    fn not_taken(
        &self,
        up: &OwnedFd,
        name: &CStr,
        st: &FileStat,
        host_st: Option<&FileStat>,
        rel: &Path,
        elsewhere: bool,
    ) -> io::Result<Option<(WithheldReason, String)>> {
        if elsewhere {
            let what = "another filesystem mounted in the granted directory (the run saw none of it)";
            return Ok(Some((WithheldReason::OtherFilesystem, what.into())));
        }
        Ok(self.owned(up, name, st, host_st, rel)?.map(|what| (WithheldReason::BrokerState, what)))
    }

    /// What the broker keeps that `rel` is, lies inside, or would remove or
    /// replace a directory on the way to: what it is, in words.
    fn owned(
        &self,
        up: &OwnedFd,
        name: &CStr,
        st: &FileStat,
        host_st: Option<&FileStat>,
        rel: &Path,
    ) -> io::Result<Option<String>> {
        for (owned, what) in &self.guard.owned {
            if rel.starts_with(owned) {
                return Ok(Some(what.clone()));
            }
            if owned.starts_with(rel) {
                // Only a directory merged into the host's (or made where
                // there is none) is gone into; anything else would remove it.
                let merged = kind(st) == SFlag::S_IFDIR
                    && !self.up(|| Ok(super::fs::opaque(&open_dir_at(up, name)?)))?
                    && host_st.is_none_or(|h| kind(h) == SFlag::S_IFDIR);
                if !merged {
                    return Ok(Some(format!("a directory holding {what}")));
                }
            }
        }
        Ok(None)
    }

    /// What the host executes that `rel` is, if it is one (see
    /// [`HostExecuted::check`]); a deletion of one is ordinary.
    fn host_executed(
        &self,
        up: &OwnedFd,
        host: Option<&OwnedFd>,
        name: &CStr,
        st: &FileStat,
        rel: &Path,
    ) -> io::Result<Option<String>> {
        if kind(st) == SFlag::S_IFCHR && st.st_rdev == 0 {
            return Ok(None);
        }
        let head = |dir: &OwnedFd| stat_at(dir, c"HEAD").is_ok();
        let beside_head = matches!(name.to_bytes(), b"hooks" | b"config" | b"config.worktree")
            && (self.up(|| Ok(head(up)))? || host.is_some_and(head));
        let (root, hooks) = (self.guard.root, &self.guard.hooks);
        Ok(match self.guard.host_executed.check(root, rel, kind(st) == SFlag::S_IFDIR, beside_head, hooks) {
            Check::Apply => None,
            Check::Withhold(what) => Some(what.to_string()),
            Check::GitConfig if self.git_config_changes_commands(up, host, name)? => {
                Some("a git configuration that changes keys that run commands".into())
            }
            Check::GitConfig => None,
        })
    }

    /// Whether the git configuration the run left at `name` makes git run
    /// other commands than the host's does (or either cannot be read as one).
    fn git_config_changes_commands(
        &self,
        up: &OwnedFd,
        host: Option<&OwnedFd>,
        name: &CStr,
    ) -> io::Result<bool> {
        let read = |dir: &OwnedFd| -> Option<String> {
            let fd = match open_file_at(dir, name) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => return Some(String::new()),
                Err(_) => return None,
            };
            let mut text = String::new();
            let file = std::fs::File::from(fd);
            if !file.metadata().is_ok_and(|m| m.len() <= GIT_CONFIG_MAX_BYTES) {
                return None;
            }
            file.take(GIT_CONFIG_MAX_BYTES).read_to_string(&mut text).ok().map(|_| text)
        };
        let theirs = self.up(|| Ok(read(up)))?;
        let ours = match host {
            Some(h) => read(h),
            None => Some(String::new()),
        };
        Ok(match (theirs, ours) {
            (Some(run), Some(host)) => palisade_policy::host_executed::config_changes_commands(&run, &host),
            _ => true,
        })
    }
}

/// Whether overlayfs copied `name` (a file or link of the upper layer in
/// `dir`) up from the host: it existed there when the run touched it.
fn origin_at(dir: &OwnedFd, name: &CStr) -> bool {
    let path = format!("/proc/self/fd/{}/{}", dir.as_raw_fd(), String::from_utf8_lossy(name.to_bytes()));
    let Ok(path) = std::ffi::CString::new(path) else { return false };
    let mut buf = [0u8; 1];
    // SAFETY: both strings are NUL-terminated and `buf` is valid for its
    // length; a longer value fails with ERANGE, which says it exists.
    let n = unsafe {
        libc::lgetxattr(path.as_ptr(), c"user.overlay.origin".as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    };
    n >= 0 || Errno::last() == Errno::ERANGE
}

fn too_large(why: String) -> io::Error {
    io::Error::other(TooLarge(why))
}

/// The sha256 (hex) of the file `fd`, read from its start.
pub fn sha256_of(fd: &OwnedFd) -> io::Result<String> {
    // One buffer a thread: a capture hashes thousands of small files.
    thread_local!(static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; 256 * 1024]));
    let mut file = std::fs::File::from(fd.try_clone()?);
    let mut hash = sha2::Sha256::new();
    BUF.with_borrow_mut(|buf| {
        loop {
            match file.read(buf) {
                Ok(0) => return Ok(()),
                Ok(n) => hash.update(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    })?;
    let mut hex = String::with_capacity(64);
    for b in hash.finalize() {
        let _ = std::fmt::Write::write_fmt(&mut hex, format_args!("{b:02x}"));
    }
    Ok(hex)
}
