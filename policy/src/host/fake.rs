//! A host in memory, for tests: the files it is given, and the test's own
//! temporary directory read for real (the paths a request names are
//! canonicalized on the real filesystem, so they must exist there).

use super::{FileKind, FileStat, HostFiles};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{Error, ErrorKind, Result};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
enum Entry {
    File {
        mode: u32,
        ino: u64,
        content: Vec<u8>,
    },
    Dir {
        ino: u64,
    },
    Symlink(PathBuf),
    /// The requester may not reach it (EACCES).
    Denied,
}

/// How many symlinks one resolution may follow here.
const MAX_LINKS: usize = 40;

#[derive(Debug, Clone, Default)]
pub struct FakeFiles {
    entries: BTreeMap<PathBuf, Entry>,
    /// Read from the real filesystem: a test's temporary directory.
    real: Option<PathBuf>,
    next_ino: u64,
}

impl FakeFiles {
    /// A host with nothing but what it is given; paths under `real` (a
    /// test's temporary directory) are read from the real filesystem.
    pub fn new(real: Option<&Path>) -> FakeFiles {
        FakeFiles { real: real.map(Path::to_path_buf), ..FakeFiles::default() }
    }

    fn ino(&mut self) -> u64 {
        self.next_ino += 1;
        self.next_ino
    }

    /// A directory, and its parents.
    pub fn dir(mut self, path: &str) -> FakeFiles {
        for p in Path::new(path).ancestors() {
            if !self.entries.contains_key(p) {
                let ino = self.ino();
                self.entries.insert(p.to_path_buf(), Entry::Dir { ino });
            }
        }
        self
    }

    /// A regular file of `mode` holding `content` (its parents made).
    pub fn file(mut self, path: &str, mode: u32, content: &[u8]) -> FakeFiles {
        if let Some(parent) = Path::new(path).parent() {
            self = self.dir(&parent.to_string_lossy());
        }
        let ino = self.ino();
        self.entries.insert(PathBuf::from(path), Entry::File { mode, ino, content: content.to_vec() });
        self
    }

    /// An executable regular file.
    pub fn executable(self, path: &str, content: &[u8]) -> FakeFiles {
        self.file(path, 0o755, content)
    }

    /// A second name for the file at `existing` (same inode).
    pub fn hard_link(mut self, path: &str, existing: &str) -> FakeFiles {
        let entry = self.entries.get(Path::new(existing)).cloned().expect("hard_link: no such file");
        self.entries.insert(PathBuf::from(path), entry);
        self
    }

    pub fn symlink(mut self, path: &str, target: &str) -> FakeFiles {
        self.entries.insert(PathBuf::from(path), Entry::Symlink(PathBuf::from(target)));
        self
    }

    /// A path the requester may not reach.
    pub fn denied(mut self, path: &str) -> FakeFiles {
        self.entries.insert(PathBuf::from(path), Entry::Denied);
        self
    }

    fn is_real(&self, path: &Path) -> bool {
        !self.entries.contains_key(path) && self.real.as_ref().is_some_and(|r| path.starts_with(r))
    }

    fn entry_stat(&self, entry: &Entry) -> Result<FileStat> {
        let stat = |kind, mode, ino, len| Ok(FileStat { kind, mode, dev: 1, ino, len, nlink: 1 });
        match entry {
            Entry::File { mode, ino, content } => stat(FileKind::File, *mode, *ino, content.len() as u64),
            Entry::Dir { ino } => stat(FileKind::Dir, 0o755, *ino, 0),
            Entry::Symlink(_) => stat(FileKind::Symlink, 0o777, 0, 0),
            Entry::Denied => Err(Error::from(ErrorKind::PermissionDenied)),
        }
    }
}

fn real_stat(m: std::fs::Metadata) -> FileStat {
    let kind = match m.file_type() {
        t if t.is_symlink() => FileKind::Symlink,
        t if t.is_dir() => FileKind::Dir,
        t if t.is_file() => FileKind::File,
        _ => FileKind::Other,
    };
    FileStat {
        kind,
        mode: m.permissions().mode() & 0o7777,
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        nlink: m.nlink(),
    }
}

impl HostFiles for FakeFiles {
    fn stat(&self, path: &Path) -> Result<FileStat> {
        if self.is_real(path) {
            return std::fs::metadata(path).map(real_stat);
        }
        let resolved = self.canonicalize(path)?;
        match self.entries.get(&resolved) {
            Some(e) => self.entry_stat(e),
            None => Err(Error::from(ErrorKind::NotFound)),
        }
    }

    fn lstat(&self, path: &Path) -> Result<FileStat> {
        if self.is_real(path) {
            return std::fs::symlink_metadata(path).map(real_stat);
        }
        match self.entries.get(path) {
            Some(e) => self.entry_stat(e),
            None => Err(Error::from(ErrorKind::NotFound)),
        }
    }

    fn canonicalize(&self, path: &Path) -> Result<PathBuf> {
        if self.is_real(path) {
            return path.canonicalize();
        }
        let mut path = path.to_path_buf();
        for _ in 0..MAX_LINKS {
            match self.entries.get(&path) {
                Some(Entry::Symlink(target)) => {
                    path = path.parent().unwrap_or(Path::new("/")).join(target);
                }
                Some(Entry::Denied) => return Err(Error::from(ErrorKind::PermissionDenied)),
                Some(_) => return Ok(path),
                None => return Err(Error::from(ErrorKind::NotFound)),
            }
        }
        Err(Error::other("too many levels of symbolic links"))
    }

    fn read_head(&self, path: &Path, max: u64) -> Option<Vec<u8>> {
        if self.is_real(path) {
            use std::io::Read;
            let file = std::fs::File::open(path).ok()?;
            let mut out = Vec::new();
            file.take(max).read_to_end(&mut out).ok()?;
            return Some(out);
        }
        match self.entries.get(&self.canonicalize(path).ok()?)? {
            Entry::File { content, .. } => Some(content.iter().copied().take(max as usize).collect()),
            _ => None,
        }
    }

    fn list_dir(&self, dir: &Path) -> Vec<OsString> {
        if self.is_real(dir) {
            let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
            return entries.map(|e| e.file_name()).collect();
        }
        let children = self.entries.keys().filter(|p| p.parent() == Some(dir));
        children.filter_map(|p| p.file_name().map(|n| n.to_os_string())).collect()
    }
}

/// The first bytes of a 64-bit little-endian ELF executable whose loader
/// (`PT_INTERP`) is `interpreter`.
pub fn elf_with_interpreter(interpreter: &str) -> Vec<u8> {
    const HEADER: usize = 64;
    const PROGRAM_HEADER: usize = 56;
    const PT_INTERP: u32 = 3;
    let at = HEADER + PROGRAM_HEADER;
    let mut head = vec![0u8; at];
    head[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
    head[0x20..0x28].copy_from_slice(&(HEADER as u64).to_le_bytes());
    head[0x36..0x38].copy_from_slice(&(PROGRAM_HEADER as u16).to_le_bytes());
    head[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
    head[HEADER..HEADER + 4].copy_from_slice(&PT_INTERP.to_le_bytes());
    head[HEADER + 8..HEADER + 16].copy_from_slice(&(at as u64).to_le_bytes());
    head[HEADER + 32..HEADER + 40].copy_from_slice(&(interpreter.len() as u64 + 1).to_le_bytes());
    head.extend_from_slice(interpreter.as_bytes());
    head.push(0);
    head
}
