//! What the policy knows of the host. The broker gathers it and passes it in:
//! the policy itself reads nothing of the host but the paths a request names
//! (canonicalized, as the kernel would resolve them).
//!
//! What can be known ahead of a decision is plain data ([`HostCapabilities`],
//! the home directories, the [`Layout`] of `/`). What depends on the request
//! (the executable's first bytes, a directory's entries, a file's metadata)
//! is read through [`HostFiles`], a seam of a few calls: the broker answers
//! from the real filesystem, on the thread that acts as the requester; tests
//! answer from memory.

use crate::jail::Layout;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What the host can enforce, probed by the broker at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCapabilities {
    pub user_namespaces: bool,
    pub landlock_abi: u32,
    /// macOS: runs are confined by Seatbelt (`sandbox-exec` with the profile
    /// [`crate::seatbelt`] writes from the plan). The plan is Tier B's, on the
    /// host's own root; Seatbelt stands where Landlock and seccomp stand on
    /// Linux, so neither is asked of the host.
    pub seatbelt: bool,
    /// The cgroup subtree runs go in, or why there is none.
    pub cgroup: Result<CgroupRoot, String>,
}

/// Where run cgroups are created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupRoot {
    /// cgroup v2: the directory; v1: the path inside each hierarchy.
    pub path: PathBuf,
    pub v1: bool,
}

/// The host a decision is made on.
#[derive(Clone)]
pub struct Host {
    pub capabilities: HostCapabilities,
    /// The home directories of the users of /etc/passwd that exist,
    /// canonical, sorted, without `/`: the sensitive entries of each are
    /// hidden where a granted directory holds it.
    pub homes: Vec<PathBuf>,
    /// How `/` lays out its system directories, and which of the /etc
    /// entries and devices a sandbox may be given exist.
    pub layout: Layout,
    /// The reads that depend on the request.
    pub files: Arc<dyn HostFiles>,
    /// What the broker itself keeps (its state, journal, secrets, socket,
    /// configuration, ...), by its real location: never granted, hidden
    /// inside a granted tree (see [`OwnedPath`]).
    pub owned: Arc<[OwnedPath]>,
}

/// A path the broker owns, canonical as far as it exists, with what it is
/// (named in refusals): nobody's workspace, whatever the policy says of
/// the tree it lies in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedPath {
    pub path: PathBuf,
    pub what: String,
    /// Hidden from a run that may read it (state, secrets, configuration);
    /// `false`: a program of the broker's, which a run may see but never
    /// write (only a writable grant around it matters).
    pub hidden: bool,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("capabilities", &self.capabilities)
            .field("homes", &self.homes)
            .field("layout", &self.layout)
            .field("owned", &self.owned)
            .finish_non_exhaustive()
    }
}

/// The reads of the host a decision makes that depend on the request: the
/// executable and what it names (its `#!` line, its ELF loader), the paths
/// a parameter or an argument names, the entries of a granted directory.
/// Errors keep their kind: a path the requester may not reach is refused in
/// other words than one that does not exist.
pub trait HostFiles: Send + Sync {
    /// What `path` is, following symlinks (`stat`).
    fn stat(&self, path: &Path) -> std::io::Result<FileStat>;
    /// What `path` is, not following a last symlink (`lstat`).
    fn lstat(&self, path: &Path) -> std::io::Result<FileStat>;
    /// `path` with every symlink resolved (`realpath`).
    fn canonicalize(&self, path: &Path) -> std::io::Result<PathBuf>;
    /// Up to `max` bytes from the start of `path`, if it is a regular file.
    /// Opened without blocking: a FIFO swapped in for a program must not
    /// hold the decision until someone writes to it.
    fn read_head(&self, path: &Path, max: u64) -> Option<Vec<u8>>;
    /// The names in directory `dir` (none if it cannot be listed).
    fn list_dir(&self, dir: &Path) -> Vec<OsString>;
}

/// What a file is, as much of its metadata as decisions use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    pub kind: FileKind,
    /// The permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
    /// Its names (hard links).
    pub nlink: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// Any of the execute bits.
pub(crate) const EXECUTE_BITS: u32 = 0o111;

impl FileStat {
    pub fn is_file(&self) -> bool {
        self.kind == FileKind::File
    }

    pub fn is_dir(&self) -> bool {
        self.kind == FileKind::Dir
    }

    /// A regular file someone may execute.
    pub fn is_executable(&self) -> bool {
        self.is_file() && self.mode & EXECUTE_BITS != 0
    }
}

#[cfg(test)]
pub mod fake;
