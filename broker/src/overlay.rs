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
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstatat, futimens, mkdirat};
use nix::sys::time::TimeSpec;
use nix::unistd::{UnlinkatFlags, symlinkat, unlinkat};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// What a commit changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    pub files: u64,
    pub bytes: u64,
    pub removed: u64,
}

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
            match kind(&st) {
                // A whiteout: the sandbox deleted this name.
                SFlag::S_IFCHR if st.st_rdev == 0 => remove(dst, &name, self.done)?,
                SFlag::S_IFDIR => {
                    let sub_up = self.up(|| open_dir_at(up, &name))?;
                    let existing = stat_at(dst, &name).ok();
                    if self.up(|| Ok(opaque(&sub_up)))?
                        || existing.is_some_and(|e| kind(&e) != SFlag::S_IFDIR)
                    {
                        remove(dst, &name, self.done)?;
                    }
                    match mkdirat(dst, name.as_c_str(), Mode::from_bits_truncate(0o700)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    let sub_dst = open_dir_at(dst, &name)?;
                    self.dir(&sub_up, &sub_dst)?;
                    fchmod(&sub_dst, permissions(&st))?;
                    times(&sub_dst, &st)?;
                }
                SFlag::S_IFREG => self.file(up, dst, &name, &st)?,
                SFlag::S_IFLNK => {
                    let link = self.up(|| readlinkat(up, name.as_c_str()))?;
                    remove(dst, &name, self.done)?;
                    symlinkat(link.as_os_str(), dst, name.as_c_str())?;
                    self.done.files += 1;
                }
                // FIFOs, sockets and device nodes are not carried over.
                _ => {}
            }
        }
        Ok(())
    }
}

/// Applies the changes in `upper` to the directory `dest` (a descriptor the
/// broker opened when it decided the run), with the credentials `act` acts
/// with: the requester's. What is made belongs to the requester as if it had
/// made it, and nothing it could not write itself is written.
pub fn commit(upper: &OwnedFd, dest: &OwnedFd, act: &Acting) -> io::Result<Committed> {
    let dst = openat(dest, c".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?;
    let mut done = Committed::default();
    let up = upper.try_clone()?;
    Target { act, done: &mut done, serial: 0 }.dir(&up, &dst)?;
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
