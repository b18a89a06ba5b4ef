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

pub use super::clock::ns;

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

/// `renameat2`: `from` in `from_dir` to `to` in `to_dir`, with `flags`
/// (`NOREPLACE`: never over an entry there; `EXCHANGE`: the two swapped).
/// A filesystem without the flag answers `EINVAL` ([`unsupported`]); for
/// `NOREPLACE` that is taken care of here ([`rename_noreplace_fallback`]),
/// for `EXCHANGE` by the caller, who alone knows what may be replaced.
pub fn rename2(
    from_dir: &OwnedFd,
    from: &CStr,
    to_dir: &OwnedFd,
    to: &CStr,
    flags: rustix::fs::RenameFlags,
) -> io::Result<()> {
    let done = match crate::fault::no_rename_flags() && !flags.is_empty() {
        true => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        false => rustix::fs::renameat_with(from_dir, from, to_dir, to, flags).map_err(io::Error::from),
    };
    match done {
        Err(err) if unsupported(&err) && flags == rustix::fs::RenameFlags::NOREPLACE => {
            rename_noreplace_fallback(from_dir, from, to_dir, to)
        }
        other => other,
    }
}

/// Whether `err`, from [`rename2`], says the filesystem has no such flag.
pub fn unsupported(err: &io::Error) -> bool {
    err.raw_os_error() == Some(libc::EINVAL)
}

/// `RENAME_NOREPLACE` where the filesystem has no such flag. Into one of
/// an apply's own temporary names ([`TEMP_PREFIX`], which nobody else
/// makes), a plain rename once the name is seen free. Into any other name
/// (a host's), a file, link, FIFO or socket is hard-linked there, which
/// fails if anything is there exactly as the flag would, and its old name
/// (the apply's own) removed; a filesystem that links nothing leaves it an
/// error (the entry is kept, nothing replaced). A directory cannot be
/// linked: the name is checked to be free right before a plain rename.
/// That narrows the window to the two calls, it does not close it; but a
/// directory renamed over an entry made in it replaces only an empty
/// directory (rename refuses any other), so no data is lost.
fn rename_noreplace_fallback(from_dir: &OwnedFd, from: &CStr, to_dir: &OwnedFd, to: &CStr) -> io::Result<()> {
    let ours = to.to_bytes().starts_with(TEMP_PREFIX.as_bytes());
    if !ours && kind(&stat_at(from_dir, from)?) != SFlag::S_IFDIR {
        nix::unistd::linkat(from_dir, from, to_dir, to, AtFlags::empty())?;
        unlinkat(from_dir, from, UnlinkatFlags::NoRemoveDir)?;
        return Ok(());
    }
    match stat_at(to_dir, to) {
        Ok(_) => return Err(io::Error::from_raw_os_error(libc::EEXIST)),
        Err(Errno::ENOENT) => {}
        Err(err) => return Err(err.into()),
    }
    rustix::fs::renameat(from_dir, from, to_dir, to)?;
    Ok(())
}

/// How the temporary names an apply makes beside a host's entry begin.
pub const TEMP_PREFIX: &str = ".palisade-apply-";

/// The prefix of overlayfs's own extended attributes on an upper layer
/// mounted with `userxattr` (origin, opaque, impure, redirect, ...): never
/// a file's own, never carried to the host.
pub const OVERLAY_XATTRS: &[u8] = b"user.overlay.";
/// The most bytes of user extended attributes one entry carries (names
/// and values); past it, the rest is not carried, and said.
pub const XATTRS_MAX_BYTES: usize = 64 * 1024;

/// The names of the extended attributes of `fd`.
fn xattr_names(fd: &OwnedFd) -> io::Result<Vec<Vec<u8>>> {
    let len = match rustix::fs::flistxattr_query(fd) {
        Ok(0) | Err(rustix::io::Errno::NOTSUP) => return Ok(vec![]),
        Ok(n) => n,
        Err(e) => return Err(e.into()),
    };
    let mut buf = vec![0u8; len];
    let n = rustix::fs::flistxattr(fd, &mut buf[..])?;
    Ok(buf[..n].split(|b| *b == 0).filter(|n| !n.is_empty()).map(<[u8]>::to_vec).collect())
}

/// The user extended attributes of `fd` (a regular file or a directory:
/// no other kind has them) that are the file's own, and whether overlayfs
/// left marks of its own on it (which [`strip_overlay_xattrs`] removes).
/// `None` past [`XATTRS_MAX_BYTES`].
pub fn user_xattrs(fd: &OwnedFd) -> io::Result<(Option<Vec<super::manifest::Xattr>>, bool)> {
    let (mut out, mut overlay, mut bytes) = (Vec::new(), false, 0usize);
    for name in xattr_names(fd)? {
        if name.starts_with(OVERLAY_XATTRS) {
            overlay = true;
            continue;
        }
        if !name.starts_with(b"user.") {
            continue;
        }
        let cname = CString::new(name.clone()).map_err(io::Error::other)?;
        let len = match rustix::fs::fgetxattr_query(fd, cname.as_c_str()) {
            Ok(n) => n,
            Err(rustix::io::Errno::NODATA) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut value = vec![0u8; len];
        let n = if len == 0 { 0 } else { rustix::fs::fgetxattr(fd, cname.as_c_str(), &mut value[..])? };
        value.truncate(n);
        bytes += name.len() + value.len();
        if bytes > XATTRS_MAX_BYTES {
            return Ok((None, overlay));
        }
        out.push(super::manifest::Xattr { name, value });
    }
    Ok((Some(out), overlay))
}

/// Removes overlayfs's own extended attributes from `fd`.
pub fn strip_overlay_xattrs(fd: &OwnedFd) -> io::Result<()> {
    for name in xattr_names(fd)?.into_iter().filter(|n| n.starts_with(OVERLAY_XATTRS)) {
        let name = CString::new(name).map_err(io::Error::other)?;
        match rustix::fs::fremovexattr(fd, name.as_c_str()) {
            Ok(()) | Err(rustix::io::Errno::NODATA) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Sets `xattrs` on `fd`.
pub fn set_xattrs(fd: &OwnedFd, xattrs: &[super::manifest::Xattr]) -> io::Result<()> {
    for x in xattrs {
        let name = CString::new(x.name.clone()).map_err(io::Error::other)?;
        rustix::fs::fsetxattr(fd, name.as_c_str(), &x.value, rustix::fs::XattrFlags::empty())?;
    }
    Ok(())
}

/// Copies the file `from` into the empty file `to`, keeping its holes:
/// only the ranges that hold data are copied (`SEEK_DATA`, `SEEK_HOLE`),
/// and the size is set at the end. The bytes copied.
pub fn copy_sparse(from: &OwnedFd, to: &OwnedFd) -> io::Result<u64> {
    use rustix::fs::{SeekFrom, seek};
    let size = nix::sys::stat::fstat(from)?.st_size as u64;
    let (mut at, mut copied) = (0u64, 0u64);
    while at < size {
        let data = match seek(from, SeekFrom::Data(at)) {
            Ok(d) => d,
            // No data past `at`: the rest is a hole.
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = seek(from, SeekFrom::Hole(data))?.min(size);
        let mut pos = data;
        while pos < hole {
            let (mut src, mut dst) = (pos, pos);
            let want = usize::try_from(hole - pos).unwrap_or(usize::MAX).min(1 << 30);
            let n = match rustix::fs::copy_file_range(from, Some(&mut src), to, Some(&mut dst), want) {
                Ok(0) => return Err(io::Error::other("the file shrank while it was copied")),
                Ok(n) => n,
                Err(rustix::io::Errno::XDEV | rustix::io::Errno::NOSYS | rustix::io::Errno::INVAL) => {
                    copy_range(from, to, pos, hole - pos)?
                }
                Err(e) => return Err(e.into()),
            };
            pos += n as u64;
            copied += n as u64;
        }
        at = hole;
    }
    rustix::fs::ftruncate(to, size)?;
    Ok(copied)
}

/// Copies `len` bytes at `at` of `from` to the same place in `to`, by reads and writes.
fn copy_range(from: &OwnedFd, to: &OwnedFd, at: u64, len: u64) -> io::Result<usize> {
    let mut buf = vec![0u8; (len.min(1 << 20)) as usize];
    let n = rustix::io::pread(from, &mut buf[..], at)?;
    if n == 0 {
        return Err(io::Error::other("the file shrank while it was copied"));
    }
    let mut done = 0;
    while done < n {
        done += rustix::io::pwrite(to, &buf[done..n], at + done as u64)?;
    }
    Ok(n)
}

/// Bytes a file of status `st` takes on its filesystem.
pub fn allocated(st: &FileStat) -> u64 {
    (st.st_blocks as u64).saturating_mul(512)
}

/// Removes the directory `path` and all it holds: a run's layers, whose
/// directories the run (or overlayfs, its work directory) may have left
/// closed to their owner, are opened to it on the way.
pub fn remove_all(path: &std::path::Path) -> io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {}
        other => return other,
    }
    open_to_owner(path)?;
    std::fs::remove_dir_all(path)
}

/// Gives every directory under `path` (itself included) its owner's
/// read, write and search permission, where it lacks them.
fn open_to_owner(path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.is_dir() {
        return Ok(());
    }
    if meta.permissions().mode() & 0o700 != 0o700 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(meta.permissions().mode() | 0o700))?;
    }
    for e in std::fs::read_dir(path)? {
        open_to_owner(&e?.path())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{TEMP_PREFIX, rename_noreplace_fallback};
    use std::ffi::CString;
    use std::os::fd::OwnedFd;

    /// `RENAME_NOREPLACE`'s fallback never replaces an entry at a host's
    /// name (a file, or a directory), and moves where nothing is; into the
    /// apply's own names it moves a directory too.
    #[test]
    fn the_noreplace_fallback_never_replaces_an_entry() {
        let dir = std::env::temp_dir().join(format!("palisade-noreplace-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fd: OwnedFd = std::fs::File::open(&dir).unwrap().into();
        let c = |s: &str| CString::new(s).unwrap();
        std::fs::write(dir.join("run"), "the run's").unwrap();
        std::fs::write(dir.join("host"), "the host's").unwrap();
        let err = rename_noreplace_fallback(&fd, &c("run"), &fd, &c("host")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
        assert_eq!(std::fs::read_to_string(dir.join("host")).unwrap(), "the host's");
        assert_eq!(std::fs::read_to_string(dir.join("run")).unwrap(), "the run's");
        rename_noreplace_fallback(&fd, &c("run"), &fd, &c("new")).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("new")).unwrap(), "the run's");
        assert!(!dir.join("run").exists());
        // A directory: not over a file there, moved where nothing is.
        std::fs::create_dir(dir.join("d")).unwrap();
        std::fs::write(dir.join("d/inside"), "kept").unwrap();
        let err = rename_noreplace_fallback(&fd, &c("d"), &fd, &c("host")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
        let aside = format!("{TEMP_PREFIX}test-0");
        rename_noreplace_fallback(&fd, &c("d"), &fd, &c(&aside)).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join(&aside).join("inside")).unwrap(), "kept");
        // Into one of the apply's own names, a file moves too, never over one there.
        let err = rename_noreplace_fallback(&fd, &c("new"), &fd, &c(&aside)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
