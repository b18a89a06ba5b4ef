//! The real filesystem as the policy reads it ([`HostFiles`]), on any Unix.

use palisade_policy::{FileKind, FileStat, HostFiles};
use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The real filesystem, as the policy reads it.
pub fn files() -> Arc<dyn HostFiles> {
    static FILES: OnceLock<Arc<RealFiles>> = OnceLock::new();
    FILES.get_or_init(|| Arc::new(RealFiles)).clone()
}

/// The real filesystem, read by the calling thread (whose filesystem
/// credentials are the requester's while the broker decides).
pub struct RealFiles;

/// The permission bits of `st_mode`.
const PERMISSION_BITS: u32 = 0o7777;

fn file_stat(m: std::fs::Metadata) -> FileStat {
    let t = m.file_type();
    let kind = if t.is_symlink() {
        FileKind::Symlink
    } else if t.is_dir() {
        FileKind::Dir
    } else if t.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    };
    FileStat {
        kind,
        mode: m.permissions().mode() & PERMISSION_BITS,
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        nlink: m.nlink(),
    }
}

impl HostFiles for RealFiles {
    fn stat(&self, path: &Path) -> std::io::Result<FileStat> {
        std::fs::metadata(path).map(file_stat)
    }

    fn lstat(&self, path: &Path) -> std::io::Result<FileStat> {
        std::fs::symlink_metadata(path).map(file_stat)
    }

    fn canonicalize(&self, path: &Path) -> std::io::Result<PathBuf> {
        path.canonicalize()
    }

    /// Opened without blocking (a FIFO swapped in for a program would
    /// otherwise hold the decision, and the thread deciding, until someone
    /// writes to it) and read only once `fstat` says it is a regular file.
    fn read_head(&self, path: &Path, max: u64) -> Option<Vec<u8>> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .ok()?;
        if !file.metadata().ok()?.is_file() {
            return None;
        }
        let mut out = Vec::new();
        file.take(max).read_to_end(&mut out).ok()?;
        Some(out)
    }

    fn list_dir(&self, dir: &Path) -> Vec<OsString> {
        let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
        entries.map(|e| e.file_name()).collect()
    }
}
