//! Copying a run's writes back from the upper layer of its overlay.
//!
//! The helper hands over the upper layer (a tmpfs) as a directory fd; once
//! the sandbox is gone, the changes it holds are applied to the host
//! directory: new and changed files (through a temporary name and a rename,
//! with their permission bits and times, never setuid, setgid or sticky),
//! new directories, symlinks (recreated, never followed), and deletions
//! (overlay whiteouts, opaque directories). Every operation is relative to
//! the descriptor of the host directory the broker opened when it decided
//! the run, refuses to follow symlinks, and is done as the requester (see
//! `crate::requester`): nothing the sandbox left behind can redirect a
//! write, and a name the requester changes meanwhile gives it nothing it
//! could not do itself.

use crate::requester::Acting;
use palisade_policy::host_executed::{Check, HostExecuted};
use palisade_protocol::wire::{Withheld, WithheldReason};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstatat, futimens, mkdirat};
use nix::sys::time::TimeSpec;
use nix::unistd::{UnlinkatFlags, symlinkat, unlinkat};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What a commit changed, and what it withheld.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Committed {
    pub files: u64,
    pub bytes: u64,
    pub removed: u64,
    pub withheld: Vec<Withheld>,
}

/// What a commit must not apply: what the broker keeps (relative to the
/// granted directory, whether or not it exists there yet), and the files
/// the host executes.
pub struct Guard<'a> {
    /// The granted directory on the host, for the paths reported.
    pub root: &'a Path,
    pub owned: Vec<(PathBuf, String)>,
    pub host_executed: &'a HostExecuted,
}

/// The largest git configuration file compared (a repository's is a few
/// hundred bytes); a larger one is withheld.
const GIT_CONFIG_MAX_BYTES: u64 = 1 << 20;

fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

fn stat_at(dir: &OwnedFd, name: &CStr) -> nix::Result<FileStat> {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

fn open_dir_at(dir: &OwnedFd, name: &CStr) -> nix::Result<OwnedFd> {
    openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

fn names(dir: &OwnedFd) -> io::Result<Vec<CString>> {
    let dup = dir.try_clone()?;
    let mut d = nix::dir::Dir::from_fd(dup)?;
    let mut out = Vec::new();
    for e in d.iter() {
        let name = e?.file_name().to_owned();
        if name.as_bytes() != b"." && name.as_bytes() != b".." {
            out.push(name);
        }
    }
    Ok(out)
}

/// Whether overlayfs marked a directory opaque (it replaced the one below).
fn opaque(dir: &OwnedFd) -> bool {
    let mut buf = [0u8; 4];
    // SAFETY: the name is NUL-terminated and `buf` is valid for its length.
    let n = unsafe {
        libc::fgetxattr(dir.as_raw_fd(), c"user.overlay.opaque".as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    };
    n > 0 && buf[0] == b'y'
}

/// Removes `name` (recursively for a directory) if it exists.
fn remove(dir: &OwnedFd, name: &CStr, done: &mut Committed) -> io::Result<()> {
    let st = match stat_at(dir, name) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if kind(&st) == SFlag::S_IFDIR {
        let sub = open_dir_at(dir, name)?;
        for n in names(&sub)? {
            remove(&sub, &n, done)?;
        }
        unlinkat(dir, name, UnlinkatFlags::RemoveDir)?;
    } else {
        unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)?;
    }
    done.removed += 1;
    Ok(())
}

struct Target<'a> {
    /// Acting for the requester; the upper layer is read as the broker.
    act: &'a Acting,
    done: &'a mut Committed,
    serial: u64,
    guard: &'a Guard<'a>,
    /// The directory being applied, relative to the granted one.
    rel: PathBuf,
}

/// What may carry over of a file's mode: never setuid, setgid or sticky.
fn permissions(st: &FileStat) -> Mode {
    Mode::from_bits_truncate(st.st_mode & 0o777)
}

fn times(fd: &OwnedFd, st: &FileStat) -> io::Result<()> {
    let at = TimeSpec::new(st.st_atime, st.st_atime_nsec);
    let mt = TimeSpec::new(st.st_mtime, st.st_mtime_nsec);
    futimens(fd, &at, &mt)?;
    Ok(())
}

impl Target<'_> {
    /// Something of the upper layer, which the sandbox's uid wrote: read as the broker.
    fn up<T>(&self, f: impl FnOnce() -> nix::Result<T>) -> io::Result<T> {
        self.act.as_broker(|| f().map_err(io::Error::from))
    }

    fn file(&mut self, up: &OwnedFd, dst: &OwnedFd, name: &CStr, st: &FileStat) -> io::Result<()> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let src = self.up(|| openat(up, name, flags, Mode::empty()))?;
        self.serial += 1;
        let tmp = CString::new(format!(".palisade-commit-{}-{}", std::process::id(), self.serial))
            .map_err(io::Error::other)?;
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let out = openat(dst, tmp.as_c_str(), flags, Mode::from_bits_truncate(0o600))?;
        let copied = io::copy(&mut std::fs::File::from(src), &mut std::fs::File::from(out.try_clone()?))?;
        // On the descriptor, never by name: the name is the requester's to change.
        fchmod(&out, permissions(st))?;
        times(&out, st)?;
        drop(out);
        if stat_at(dst, name).is_ok_and(|e| kind(&e) == SFlag::S_IFDIR) {
            remove(dst, name, self.done)?;
        }
        renameat(dst, tmp.as_c_str(), dst, name)?;
        self.done.files += 1;
        self.done.bytes += copied;
        Ok(())
    }

    fn dir(&mut self, up: &OwnedFd, dst: &OwnedFd) -> io::Result<()> {
        for name in
            self.up(|| names(up).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))))?
        {
            let st = self.up(|| stat_at(up, &name))?;
            let rel = self.rel.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
            if let Some((reason, what)) = self.withheld(up, dst, &name, &st, &rel)? {
                let path = self.guard.root.join(&rel).to_string_lossy().into_owned();
                tracing::warn!(%path, what, "a change withheld from the copy-back");
                self.done.withheld.push(Withheld { path, reason, what });
                continue;
            }
            self.entry(up, dst, &name, &st, rel)?;
        }
        Ok(())
    }

    /// Applies one entry of the upper layer.
    fn entry(&mut self, up: &OwnedFd, dst: &OwnedFd, name: &CStr, st: &FileStat, rel: PathBuf) -> io::Result<()> {
        match kind(st) {
            // A whiteout: the sandbox deleted this name.
            SFlag::S_IFCHR if st.st_rdev == 0 => remove(dst, name, self.done)?,
            SFlag::S_IFDIR => {
                let sub_up = self.up(|| open_dir_at(up, name))?;
                if self.up(|| Ok(opaque(&sub_up)))? || stat_at(dst, name).is_ok_and(|e| kind(&e) != SFlag::S_IFDIR) {
                    remove(dst, name, self.done)?;
                }
                match mkdirat(dst, name, Mode::from_bits_truncate(0o700)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                let sub_dst = open_dir_at(dst, name)?;
                let parent = std::mem::replace(&mut self.rel, rel);
                let applied = self.dir(&sub_up, &sub_dst);
                self.rel = parent;
                applied?;
                fchmod(&sub_dst, permissions(st))?;
                times(&sub_dst, st)?;
            }
            SFlag::S_IFREG => self.file(up, dst, name, st)?,
            SFlag::S_IFLNK => {
                let link = self.up(|| readlinkat(up, name))?;
                remove(dst, name, self.done)?;
                symlinkat(link.as_os_str(), dst, name)?;
                self.done.files += 1;
            }
            // FIFOs, sockets and device nodes are not carried over.
            _ => {}
        }
        Ok(())
    }

    /// Why the entry `name` (at `rel`) must not be applied, if it must not:
    /// it is, or lies inside, what the broker keeps; it would remove or
    /// replace a directory on the way to that; it is a file the host
    /// executes (a deletion of one is applied: it runs nothing).
    fn withheld(
        &self,
        up: &OwnedFd,
        dst: &OwnedFd,
        name: &CStr,
        st: &FileStat,
        rel: &Path,
    ) -> io::Result<Option<(WithheldReason, String)>> {
        let whiteout = kind(st) == SFlag::S_IFCHR && st.st_rdev == 0;
        let is_dir = kind(st) == SFlag::S_IFDIR;
        for (owned, what) in &self.guard.owned {
            if rel.starts_with(owned) {
                return Ok(Some((WithheldReason::BrokerState, what.clone())));
            }
            if owned.starts_with(rel) {
                // Only a directory merged into the host's (or made where
                // there is none) is gone into; anything else would remove it.
                let merged = is_dir
                    && !self.up(|| Ok(opaque(&open_dir_at(up, name)?)))?
                    && stat_at(dst, name).map_or_else(|e| e == Errno::ENOENT, |e| kind(&e) == SFlag::S_IFDIR);
                if !merged {
                    return Ok(Some((WithheldReason::BrokerState, format!("a directory holding {what}"))));
                }
            }
        }
        if whiteout {
            return Ok(None);
        }
        let head = |dir: &OwnedFd| stat_at(dir, c"HEAD").is_ok();
        let beside_head = matches!(name.to_bytes(), b"hooks" | b"config" | b"config.worktree")
            && (self.up(|| Ok(head(up)))? || head(dst));
        Ok(match self.guard.host_executed.check(rel, is_dir, beside_head) {
            Check::Apply => None,
            Check::Withhold(what) => Some((WithheldReason::HostExecuted, what.to_string())),
            Check::GitConfig if self.git_config_changes_commands(up, dst, name)? => {
                Some((WithheldReason::HostExecuted, "a git configuration that names other commands".into()))
            }
            Check::GitConfig => None,
        })
    }

    /// Whether the git configuration the run left at `name` makes git run
    /// other commands than the host's does (or either cannot be read as one).
    fn git_config_changes_commands(&self, up: &OwnedFd, dst: &OwnedFd, name: &CStr) -> io::Result<bool> {
        let read = |dir: &OwnedFd| -> nix::Result<Option<String>> {
            let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
            let fd = match openat(dir, name, flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => return Ok(Some(String::new())),
                Err(e) => return Err(e),
            };
            let mut text = String::new();
            let file = std::fs::File::from(fd);
            if !file.metadata().is_ok_and(|m| m.is_file() && m.len() <= GIT_CONFIG_MAX_BYTES) {
                return Ok(None);
            }
            match io::Read::read_to_string(&mut io::Read::take(file, GIT_CONFIG_MAX_BYTES), &mut text) {
                Ok(_) => Ok(Some(text)),
                Err(_) => Ok(None),
            }
        };
        let theirs = self.up(|| read(up))?;
        let ours = read(dst).map_err(io::Error::from)?;
        let commands = |t: Option<String>| t.and_then(|t| palisade_policy::host_executed::git_commands(&t));
        Ok(match (commands(theirs), commands(ours)) {
            (Some(run), Some(host)) => run != host,
            _ => true,
        })
    }
}

/// Applies the changes in `upper` to the directory `dest` (a descriptor the
/// broker opened when it decided the run), with the credentials `act` acts
/// with: the requester's. What is made belongs to the requester as if it had
/// made it, and nothing it could not write itself is written.
pub fn commit(upper: &OwnedFd, dest: &OwnedFd, act: &Acting, guard: &Guard<'_>) -> io::Result<Committed> {
    let dst = openat(dest, c".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?;
    let mut done = Committed::default();
    let up = upper.try_clone()?;
    Target { act, done: &mut done, serial: 0, guard, rel: PathBuf::new() }.dir(&up, &dst)?;
    Ok(done)
}

/// Whether the run wrote nothing there (the upper directory is empty).
pub fn untouched(upper: &OwnedFd) -> bool {
    // A descriptor of its own: reading must not move the offset `commit` starts from.
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let Ok(mut dir) = nix::dir::Dir::openat(upper.as_fd(), ".", flags, Mode::empty()) else { return false };
    dir.iter().all(|e| e.is_ok_and(|e| matches!(e.file_name().to_bytes(), b"." | b"..")))
}

/// Whether the upper layer's tmpfs is (all but) full, in bytes or in files:
/// the run hit its bound.
pub fn full(upper: &OwnedFd) -> bool {
    match nix::sys::statvfs::fstatvfs(upper.as_fd()) {
        Ok(s) => s.blocks_available() * s.fragment_size() < 64 * 1024 || s.files_available() < 16,
        Err(_) => false,
    }
}
