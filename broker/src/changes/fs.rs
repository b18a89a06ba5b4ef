//! The calls a change set makes on directories: every one relative to a
//! descriptor, never following a symlink.

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

pub fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

pub fn stat_at(dir: &OwnedFd, name: &CStr) -> nix::Result<FileStat> {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

pub fn open_dir_at(dir: &OwnedFd, name: &CStr) -> nix::Result<OwnedFd> {
    openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// A regular file at `name`, for reading: never a FIFO swapped in (no
/// blocking open), never through a symlink.
pub fn open_file_at(dir: &OwnedFd, name: &CStr) -> nix::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
    let fd = openat(dir, name, flags, Mode::empty())?;
    match nix::sys::stat::fstat(&fd) {
        Ok(st) if kind(&st) == SFlag::S_IFREG => Ok(fd),
        Ok(_) => Err(Errno::EINVAL),
        Err(e) => Err(e),
    }
}

/// The names in `dir`, sorted (a change set is the same whatever order the
/// filesystem lists them in).
pub fn names(dir: &OwnedFd) -> io::Result<Vec<CString>> {
    let mut d = nix::dir::Dir::from_fd(dir.try_clone()?)?;
    let mut out = Vec::new();
    for e in d.iter() {
        let name = e?.file_name().to_owned();
        if name.as_bytes() != b"." && name.as_bytes() != b".." {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

fn xattr(fd: &OwnedFd, name: &CStr) -> Option<u8> {
    let mut buf = [0u8; 1];
    // SAFETY: the name is NUL-terminated and `buf` is valid for its length;
    // a longer value fails with ERANGE, which says it exists.
    let n = unsafe { libc::fgetxattr(fd.as_raw_fd(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    match n {
        n if n > 0 => Some(buf[0]),
        _ if Errno::last() == Errno::ERANGE => Some(0),
        _ => None,
    }
}

/// Whether overlayfs marked a directory of its upper layer opaque (it
/// replaced the one below).
pub fn opaque(dir: &OwnedFd) -> bool {
    xattr(dir, c"user.overlay.opaque") == Some(b'y')
}

/// Whether overlayfs copied an entry of its upper layer up from the layer
/// below (`user.overlay.origin`): it existed on the host when the run
/// touched it. `fd` may be an `O_PATH` descriptor only for a directory.
pub fn copied_up(fd: &OwnedFd) -> bool {
    xattr(fd, c"user.overlay.origin").is_some()
}

/// Removes `name` (recursively for a directory) if it exists; the entries
/// removed. Never into another filesystem mounted below it (`EXDEV`).
pub fn remove(dir: &OwnedFd, name: &CStr) -> io::Result<u64> {
    let st = match stat_at(dir, name) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    if st.st_dev != nix::sys::stat::fstat(dir)?.st_dev {
        return Err(Errno::EXDEV.into());
    }
    let mut removed = 1;
    if kind(&st) == SFlag::S_IFDIR {
        let sub = open_dir_at(dir, name)?;
        for n in names(&sub)? {
            removed += remove(&sub, &n)?;
        }
        unlinkat(dir, name, UnlinkatFlags::RemoveDir)?;
    } else {
        unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)?;
    }
    Ok(removed)
}

/// A timestamp in nanoseconds.
pub fn ns(sec: i64, nsec: i64) -> i128 {
    i128::from(sec) * 1_000_000_000 + i128::from(nsec)
}

/// Whether `name` in `dir`, or anything under it, changed (its status:
/// contents, name, mode, links) after `since` (ns, a
/// [`super::clock::Since::threshold`]). At most `budget` entries are looked at; past it, the
/// answer is yes (a change is assumed rather than missed).
pub fn changed_since(dir: &OwnedFd, name: &CStr, since: i128, budget: &mut u32) -> io::Result<bool> {
    let st = match stat_at(dir, name) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if super::clock::changed_after(&st, since) || *budget == 0 {
        return Ok(true);
    }
    *budget -= 1;
    if kind(&st) != SFlag::S_IFDIR {
        return Ok(false);
    }
    let sub = open_dir_at(dir, name)?;
    for n in names(&sub)? {
        if changed_since(&sub, &n, since, budget)? {
            return Ok(true);
        }
    }
    Ok(false)
}
