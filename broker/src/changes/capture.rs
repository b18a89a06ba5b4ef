//! Taking a run's writes from the upper layer of its overlays into a change
//! set: each entry with the host's state under it (its base), whether the
//! host changed it since the run started (a conflict), and whether it is a
//! file the host executes. The contents of its files are copied to the
//! change set's blobs, so that what is applied, held or reviewed no longer
//! needs the sandbox's tmpfs. What the broker keeps is not taken at all:
//! it is withheld, and said.

use super::fs::{changed_since, kind, names, ns, opaque, open_dir_at, open_file_at, stat_at};
use super::manifest::{Base, Entry, Kind};
use crate::host::requester::Acting;
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, readlinkat};
use nix::sys::stat::{FileStat, Mode, SFlag};
use palisade_policy::host_executed::{Check, HostExecuted};
use palisade_protocol::wire::{Withheld, WithheldReason};
use sha2::Digest;
use std::ffi::{CStr, OsStr};
use std::io::{self, Read, Write};
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
    /// Bytes of the files taken.
    pub bytes: u64,
}

/// Where blobs go: a directory of the change set's, and the next number.
pub struct Blobs<'a> {
    pub dir: &'a OwnedFd,
    pub next: &'a mut u32,
}

/// What the overlay's upper layer holds for real (its tmpfs's used bytes):
/// more than that taken means sparse files or hard links counted again.
pub fn used_bytes(upper: &OwnedFd) -> u64 {
    use std::os::fd::AsFd;
    nix::sys::statvfs::fstatvfs(upper.as_fd())
        .map_or(u64::MAX, |s| (s.blocks() - s.blocks_free()).saturating_mul(s.fragment_size()))
}

struct Walk<'a, 'b> {
    act: &'a Acting,
    guard: &'a Guard<'a>,
    root: usize,
    /// When the run took its view of the host (ns, [`super::clock::Since::threshold`]):
    /// a host entry whose status changed after it was changed by someone else meanwhile.
    since: i128,
    blobs: Option<Blobs<'b>>,
    out: Captured,
    /// The host directory's filesystem: an entry on another (a mount inside
    /// the granted directory, which the overlay does not show) is not touched.
    dev: u64,
    /// The most bytes the contents may take: what the upper layer really holds.
    max_bytes: u64,
    path_bytes: usize,
}

/// Takes what the upper layer `upper` holds over the host directory `dest`
/// (the broker's descriptor of it, read as the requester `act` acts for;
/// the upper layer is read as the broker). `blobs`: where the contents go;
/// `None` takes the entries only (a count of what will not be kept).
pub fn capture(
    upper: &OwnedFd,
    dest: &OwnedFd,
    act: &Acting,
    guard: &Guard<'_>,
    (root, since): (usize, &super::clock::Since),
    blobs: Option<Blobs<'_>>,
) -> io::Result<Captured> {
    let host = openat(dest, c".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?;
    let dev = nix::sys::stat::fstat(&host)?.st_dev;
    let since = since.threshold(super::clock::margin(&host));
    let up = upper.try_clone()?;
    // A page of slack per file would be generous; a mebibyte covers rounding.
    let max_bytes = act.as_broker(|| Ok(used_bytes(upper)))?.saturating_add(1 << 20);
    let out = Captured::default();
    let mut walk = Walk { act, guard, root, since, blobs, out, dev, max_bytes, path_bytes: 0 };
    walk.dir(&up, Some(&host), PathBuf::new(), None)?;
    Ok(walk.out)
}

impl Walk<'_, '_> {
    /// Something of the upper layer, which the sandbox's uid wrote: read as the broker.
    fn up<T>(&self, f: impl FnOnce() -> nix::Result<T>) -> io::Result<T> {
        self.act.as_broker(|| f().map_err(io::Error::from))
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
        let listed =
            self.up(|| names(up).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))))?;
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
        let newer = |h: &FileStat| super::clock::changed_after(h, self.since);
        let mut budget = CONFLICT_SCAN_ENTRIES;
        let (kind_, conflict) = match kind(st) {
            // A whiteout: the sandbox removed this name. Nothing there: nothing to do.
            SFlag::S_IFCHR if st.st_rdev == 0 => {
                let (Some(h), Some(_)) = (host, &host_st) else { return Ok(()) };
                (Kind::Delete, changed_since(h, name, self.since, &mut budget)?)
            }
            SFlag::S_IFDIR => {
                let sub_up = self.up(|| open_dir_at(up, name))?;
                let opaque = self.up(|| Ok(opaque(&sub_up)))?;
                let host_dir = host_st.as_ref().is_some_and(|h| kind(h) == SFlag::S_IFDIR);
                let conflict = match (host, &host_st) {
                    (Some(h), Some(_)) if opaque && host_dir => {
                        changed_since(h, name, self.since, &mut budget)?
                    }
                    (Some(_), Some(hs)) if !host_dir => newer(hs),
                    _ => false,
                };
                let mode = st.st_mode & 0o777;
                let children = host_executed.clone();
                self.push(rel.clone(), Kind::Dir { mode, opaque }, base, conflict, host_executed);
                // The host's directory, where the run's merges into it.
                let sub_host = match host {
                    Some(h) if host_dir && !opaque => open_dir_at(h, name).ok(),
                    _ => None,
                };
                return self.dir(&sub_up, sub_host.as_ref(), rel, children);
            }
            SFlag::S_IFREG => (self.file(up, name, st)?, self.replaces(host, name, &host_st, up, &rel)?),
            SFlag::S_IFLNK => {
                let target = self.up(|| readlinkat(up, name))?.as_bytes().to_vec();
                (Kind::Symlink { target }, self.replaces(host, name, &host_st, up, &rel)?)
            }
            // FIFOs, sockets and device nodes are not carried over.
            _ => return Ok(()),
        };
        self.push(rel, kind_, base, conflict, host_executed);
        Ok(())
    }

    fn push(
        &mut self,
        rel: PathBuf,
        kind: Kind,
        base: Option<Base>,
        conflict: bool,
        host_executed: Option<String>,
    ) {
        let path = rel.as_os_str().as_bytes().to_vec();
        self.out.entries.push(Entry { root: self.root, path, kind, base, conflict, host_executed });
    }

    /// Whether the run's file or link at `name` would replace someone
    /// else's change: the host's entry changed since the run started, or
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

    /// The file's contents into a blob (with their sha256), or only its
    /// size where no blob is kept.
    fn file(&mut self, up: &OwnedFd, name: &CStr, st: &FileStat) -> io::Result<Kind> {
        let mode = st.st_mode & 0o777;
        let mtime_ns = ns(st.st_mtime, st.st_mtime_nsec);
        let Some(blobs) = self.blobs.as_mut() else {
            let size = st.st_size as u64;
            self.out.bytes += size;
            return Ok(Kind::File { blob: 0, size, sha256: String::new(), mode, mtime_ns });
        };
        let blob = *blobs.next;
        *blobs.next += 1;
        let dir = blobs.dir;
        if self.out.bytes.saturating_add(st.st_size as u64) > self.max_bytes {
            return Err(too_large(format!(
                "its files take more than its upper layer holds ({} bytes): sparse files or hard links",
                self.max_bytes
            )));
        }
        let src = self.act.as_broker(|| open_file_at(up, name).map_err(io::Error::from))?;
        let (size, sha256) = self.act.as_broker(|| {
            let flags =
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let out = openat(dir, blob.to_string().as_str(), flags, Mode::from_bits_truncate(0o600))?;
            copy_hashing(std::fs::File::from(src), std::fs::File::from(out)).map_err(io::Error::from)
        })?;
        self.out.bytes += size;
        Ok(Kind::File { blob, size, sha256, mode, mtime_ns })
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
                    && !self.up(|| Ok(opaque(&open_dir_at(up, name)?)))?
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

/// Copies `from` into `to`, hashing what passes: the bytes and their sha256 (hex).
pub fn copy_hashing(mut from: std::fs::File, mut to: std::fs::File) -> nix::Result<(u64, String)> {
    let mut hash = sha2::Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))),
        };
        hash.update(&buf[..n]);
        to.write_all(&buf[..n]).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
        total += n as u64;
    }
    Ok((total, hash.finalize().iter().map(|b| format!("{b:02x}")).collect()))
}
