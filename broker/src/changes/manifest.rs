//! A change set as it is kept: the entries of a run's writes, in the order
//! they apply (a directory before what it holds), and where the contents
//! of its files are.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The largest manifest read (an entry is a few hundred bytes).
pub const MANIFEST_MAX_BYTES: u64 = 64 << 20;

/// What a change set is now.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Kept for a person's review (or `palisade changes apply`).
    Held,
    /// Being applied, or left part-way by a broker that stopped: applying
    /// it again finishes it.
    Applying,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub id: String,
    pub run_id: u64,
    /// The broker that ran run `run_id` (`<pid>-<start time>`, as the
    /// journal names it): run ids count from 1 in each broker. `None` in a
    /// change set an earlier broker kept.
    #[serde(default)]
    pub broker: Option<String>,
    pub uid: u32,
    pub gid: u32,
    /// Seconds since the epoch.
    pub created: u64,
    pub status: Status,
    /// Why it is held, in words.
    pub reason: String,
    /// The granted directories (host paths) the entries are relative to.
    pub roots: Vec<String>,
    /// When the run took its view of the host (ns, the real-time clock; see
    /// [`super::clock`]): what changed on the host after it is someone else's.
    pub taken_ns: i128,
    /// The real-time clock's distance from the boot-time clock then (0: not kept).
    #[serde(default)]
    pub taken_offset_ns: i128,
    /// Where the contents of its entries are.
    #[serde(default)]
    pub layout: Layout,
    /// Bytes its contents take on disk (each file's allocated blocks, once
    /// per file however many names it has); with [`Layout::Blobs`], 0: the
    /// blobs' sizes are counted instead.
    #[serde(default)]
    pub bytes: u64,
    pub entries: Vec<Entry>,
}

/// Where a change set keeps the contents of its entries.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// Each file's contents as `blobs/N` (a change set of an earlier broker).
    #[default]
    Blobs,
    /// The run's layers as the overlays left them: root `i`'s entries under
    /// `i/upper/`, at their own paths (the overlays' own marks removed).
    Tree,
}

/// One change: a path (relative to its root) and what becomes of it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub root: usize,
    /// The path's bytes (a name need not be UTF-8), in base64 in the manifest.
    #[serde(with = "b64")]
    pub path: Vec<u8>,
    pub kind: Kind,
    /// The host's entry when the change was taken (`None`: there was none):
    /// what the change applies over. Another one there means someone else
    /// changed it since.
    pub base: Option<Base>,
    /// The host's entry had changed since the run started: applying the
    /// run's would replace someone else's work.
    pub conflict: bool,
    /// A file the host executes (a git hook, ...): applied only by a
    /// person who asks for it.
    pub host_executed: Option<String>,
    /// Its user extended attributes (`user.*`), name and value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xattrs: Vec<Xattr>,
    /// A file of several names in the change set: the inode they share
    /// there (the entries of one value are one file, applied as hard links).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<u64>,
}

/// A user extended attribute.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Xattr {
    #[serde(with = "b64")]
    pub name: Vec<u8>,
    #[serde(with = "b64")]
    pub value: Vec<u8>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A regular file whose contents are blob `blob` of the change set
    /// ([`Layout::Blobs`]), or at its path in the tree ([`Layout::Tree`]).
    File { blob: u32, size: u64, sha256: String, mode: u32, mtime_ns: i128 },
    Symlink {
        #[serde(with = "b64")]
        target: Vec<u8>,
    },
    /// A directory: made where missing; `opaque`: it replaces the host's
    /// (the run removed that one and made its own).
    Dir { mode: u32, opaque: bool },
    /// The run removed the path.
    Delete,
    /// A named pipe (FIFO).
    Fifo { mode: u32 },
    /// A Unix socket's file (what a server leaves where it listened).
    Socket { mode: u32 },
}

/// What identifies a host entry's state.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Base {
    /// `st_mode & S_IFMT`.
    pub kind: u32,
    pub dev: u64,
    pub ino: u64,
    pub size: i64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
    /// Permission bits (`None`: not kept, in a change set of an earlier broker).
    #[serde(default)]
    pub perm: Option<u32>,
}

impl Base {
    pub fn of(st: &nix::sys::stat::FileStat) -> Base {
        Base {
            kind: st.st_mode & libc::S_IFMT,
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            mtime_ns: super::clock::ns(st.st_mtime, st.st_mtime_nsec),
            ctime_ns: super::clock::ns(st.st_ctime, st.st_ctime_nsec),
            perm: Some(st.st_mode & 0o7777),
        }
    }

    /// Whether `st` is this entry still: the same file, unchanged.
    pub fn matches(&self, st: &nix::sys::stat::FileStat) -> bool {
        self.same_file(st) && self.ctime_ns == Base::of(st).ctime_ns
    }

    /// Whether `st` is this entry still, as far as a rename of it shows:
    /// the same file (a rename changes only its status change time), with
    /// the same size, modification time and permissions.
    pub fn same_file(&self, st: &nix::sys::stat::FileStat) -> bool {
        let now = Base::of(st);
        (self.kind, self.dev, self.ino, self.size, self.mtime_ns)
            == (now.kind, now.dev, now.ino, now.size, now.mtime_ns)
            && self.perm.is_none_or(|p| Some(p) == now.perm)
    }
}

impl Manifest {
    /// The run's view of the host, what conflicts are judged against.
    pub fn since(&self) -> super::clock::Since {
        super::clock::Since { ns: self.taken_ns, offset_ns: self.taken_offset_ns }
    }
}

impl Entry {
    pub fn rel(&self) -> PathBuf {
        PathBuf::from(std::ffi::OsStr::from_bytes(&self.path))
    }

    /// The entry's host path.
    pub fn host_path(&self, roots: &[String]) -> String {
        let root = roots.get(self.root).map_or("", String::as_str);
        Path::new(root).join(self.rel()).to_string_lossy().into_owned()
    }

    pub fn is_dir(&self) -> bool {
        matches!(self.kind, Kind::Dir { .. })
    }
}

use std::os::unix::ffi::OsStrExt;

/// Bytes as base64 text: a third more than the bytes (a JSON array of
/// numbers would be three and a half times them).
mod b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}
