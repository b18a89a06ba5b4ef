//! What the broker keeps for plugins: the secret store (a file per key,
//! mode 0600, under `<state dir>/secrets/`) and each requester's storage of
//! each skill (a file per key under `skills_dir/.storage/<uid>/<skill>/`,
//! named by the key's hex, with a quota per requester and skill).

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat2, renameat};
use nix::sys::stat::{Mode, fstatat, mkdirat};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Largest secret value: a token or a key, not a file.
pub const MAX_SECRET_BYTES: u64 = 64 << 10;
const PRIVATE_DIR: u32 = 0o700;
const PRIVATE_FILE: u32 = 0o600;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0:?} is not a key (letters, digits, '-', '_', '.', not starting with '.')")]
    BadKey(String),
    #[error("secret {key}: {path} is mode {mode:o}; a secret's file must be 0600 and owned by the broker")]
    NotPrivate { key: String, path: PathBuf, mode: u32 },
    #[error("storage quota of {quota} bytes exceeded ({used} used, {adding} more asked)")]
    Quota { quota: u64, used: u64, adding: u64 },
    #[error("{what} of {len} bytes exceeds {max}")]
    TooLarge { what: &'static str, len: u64, max: u64 },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { path: path.to_path_buf(), source }
}

/// Secrets: `dir/<key>`, each 0600.
pub struct Secrets {
    pub dir: PathBuf,
}

impl Secrets {
    /// Writes `value` as `key` (replacing it atomically), 0600.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        if !palisade_policy::plugins::key_name(key) {
            return Err(StoreError::BadKey(key.into()));
        }
        if value.len() as u64 > MAX_SECRET_BYTES {
            return Err(StoreError::TooLarge {
                what: "a secret",
                len: value.len() as u64,
                max: MAX_SECRET_BYTES,
            });
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(PRIVATE_DIR)
            .create(&self.dir)
            .map_err(io_at(&self.dir))?;
        let tmp = self.dir.join(format!(".{key}.tmp"));
        let path = self.dir.join(key);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(PRIVATE_FILE)
            .open(&tmp)
            .map_err(io_at(&tmp))?;
        f.set_permissions(std::fs::Permissions::from_mode(PRIVATE_FILE)).map_err(io_at(&tmp))?;
        f.write_all(value).and_then(|()| f.sync_all()).map_err(io_at(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io_at(&path))
    }

    /// The value of `key`; `None` if there is none. A file others may read is refused.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        if !palisade_policy::plugins::key_name(key) {
            return Err(StoreError::BadKey(key.into()));
        }
        let path = self.dir.join(key);
        let f = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_at(&path)(e)),
        };
        let meta = f.metadata().map_err(io_at(&path))?;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 || !meta.is_file() {
            return Err(StoreError::NotPrivate { key: key.into(), path, mode });
        }
        let mut value = Vec::new();
        f.take(MAX_SECRET_BYTES + 1).read_to_end(&mut value).map_err(io_at(&path))?;
        Ok(Some(value))
    }
}

/// The directory of every requester's storage under the skills index:
/// `<uid>/<skill>/` below it.
pub const STORAGE_DIR: &str = ".storage";

/// One requester's storage of one skill: `root/<uid>/<skill>/<hex of key>`,
/// at most `quota` bytes of keys and values. Every name below `root` is
/// built from a number, a skill's name (a plain key) and a key's hex, and
/// opened beneath `root` with no symlink followed: one requester's store is
/// never another's, whatever the names.
pub struct Storage {
    root: PathBuf,
    uid: u32,
    skill: String,
    quota: u64,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Beneath the directory opened, no symlink and no magic link on the way.
fn beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

fn open_beneath(dir: &OwnedFd, name: &str, flags: OFlag, mode: u32) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .mode(Mode::from_bits_truncate(mode))
        .resolve(beneath());
    openat2(dir, name, how)
}

impl Storage {
    /// The store of requester `uid` for `skill` (a plain key: an installed skill's name).
    pub fn new(root: PathBuf, uid: u32, skill: &str, quota: u64) -> Result<Storage, StoreError> {
        if !palisade_policy::plugins::key_name(skill) {
            return Err(StoreError::BadKey(skill.into()));
        }
        Ok(Storage { root, uid, skill: skill.into(), quota })
    }

    pub fn uid(&self) -> u32 {
        self.uid
    }

    pub fn skill(&self) -> &str {
        &self.skill
    }

    pub fn quota(&self) -> u64 {
        self.quota
    }

    fn at(&self, what: &str) -> PathBuf {
        self.root.join(self.uid.to_string()).join(&self.skill).join(what)
    }

    /// The store's directory; `None` when it does not exist and `create` is
    /// false. Made private (0700), each level beneath the root.
    fn open_dir(&self, create: bool) -> Result<Option<OwnedFd>, StoreError> {
        if create {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(PRIVATE_DIR)
                .create(&self.root)
                .map_err(io_at(&self.root))?;
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        let root = match nix::fcntl::open(&self.root, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) if !create => return Ok(None),
            Err(e) => return Err(io_at(&self.root)(e.into())),
        };
        let uid = self.uid.to_string();
        let mut dir = root;
        for name in [uid.as_str(), self.skill.as_str()] {
            if create {
                match mkdirat(&dir, name, Mode::from_bits_truncate(PRIVATE_DIR)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(io_at(&self.at(""))(e.into())),
                }
            }
            dir = match open_beneath(&dir, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY, 0) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) if !create => return Ok(None),
                Err(e) => return Err(io_at(&self.at(""))(e.into())),
            };
        }
        Ok(Some(dir))
    }

    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let name = hex(key.as_bytes());
        let Some(dir) = self.open_dir(false)? else { return Ok(None) };
        let f = match open_beneath(&dir, &name, OFlag::O_RDONLY, 0) {
            Ok(fd) => std::fs::File::from(fd),
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(io_at(&self.at(&name))(e.into())),
        };
        let mut value = Vec::new();
        f.take(self.quota.saturating_add(1)).read_to_end(&mut value).map_err(io_at(&self.at(&name)))?;
        Ok(Some(value))
    }

    /// Bytes in use: every key's length and value's.
    pub fn used(&self) -> Result<u64, StoreError> {
        match self.open_dir(false)? {
            Some(dir) => self.used_in(dir),
            None => Ok(0),
        }
    }

    fn used_in(&self, dir: OwnedFd) -> Result<u64, StoreError> {
        let here = self.at("");
        let mut entries = nix::dir::Dir::from_fd(dir).map_err(|e| io_at(&here)(e.into()))?;
        let dirfd = entries.as_fd().try_clone_to_owned().map_err(io_at(&here))?;
        let mut used = 0;
        for entry in entries.iter() {
            let entry = entry.map_err(|e| io_at(&here)(e.into()))?;
            let name = entry.file_name().to_bytes();
            if name.starts_with(b".") {
                continue;
            }
            let stat = fstatat(&dirfd, entry.file_name(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(|e| io_at(&here)(e.into()))?;
            used += name.len() as u64 / 2 + stat.st_size as u64;
        }
        Ok(used)
    }

    /// Writes `value` as `key`, within the quota (the key's old value does not count).
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let name = hex(key.as_bytes());
        let dir = self.open_dir(true)?.expect("made above");
        let old = match fstatat(&dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => key.len() as u64 + stat.st_size as u64,
            Err(_) => 0,
        };
        let used = self.used_in(dir.try_clone().map_err(io_at(&self.at("")))?)?.saturating_sub(old);
        let adding = key.len() as u64 + value.len() as u64;
        if used + adding > self.quota {
            return Err(StoreError::Quota { quota: self.quota, used, adding });
        }
        let tmp = ".put.tmp";
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC;
        let mut f = open_beneath(&dir, tmp, flags, PRIVATE_FILE)
            .map(std::fs::File::from)
            .map_err(|e| io_at(&self.at(tmp))(e.into()))?;
        f.write_all(value).map_err(io_at(&self.at(tmp)))?;
        renameat(&dir, tmp, &dir, name.as_str()).map_err(|e| io_at(&self.at(&name))(e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("palisade-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn secrets_are_private_files_and_keys_are_plain() {
        let s = Secrets { dir: scratch("secrets") };
        s.set("token", b"hunter2").unwrap();
        let mode = std::fs::metadata(s.dir.join("token")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(s.get("token").unwrap().as_deref(), Some(&b"hunter2"[..]));
        assert_eq!(s.get("absent").unwrap(), None);
        assert!(matches!(s.get("../x"), Err(StoreError::BadKey(_))));
        std::fs::set_permissions(s.dir.join("token"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(s.get("token"), Err(StoreError::NotPrivate { .. })));
        std::fs::remove_dir_all(&s.dir).unwrap();
    }

    #[test]
    fn storage_keeps_to_its_quota() {
        let root = scratch("storage");
        let s = Storage::new(root.clone(), 1000, "notes", 16).unwrap();
        s.put("a/b", b"12345").unwrap();
        assert_eq!(s.get("a/b").unwrap().as_deref(), Some(&b"12345"[..]));
        assert_eq!(s.used().unwrap(), 8);
        // Replacing a value counts only the new one.
        s.put("a/b", b"1234567890").unwrap();
        assert!(matches!(s.put("c", b"12345"), Err(StoreError::Quota { .. })));
        assert_eq!(s.get("c").unwrap(), None);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&root.join("1000/notes")), 0o700);
        assert_eq!(mode(&root.join("1000/notes").join(hex(b"a/b"))), 0o600);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn each_requester_has_a_store_of_its_own() {
        let root = scratch("requesters");
        let a = Storage::new(root.clone(), 1001, "notes", 16).unwrap();
        let b = Storage::new(root.clone(), 1002, "notes", 16).unwrap();
        let other_skill = Storage::new(root.clone(), 1001, "other", 16).unwrap();
        a.put("k", b"from a").unwrap();
        assert_eq!(b.get("k").unwrap(), None);
        assert_eq!(other_skill.get("k").unwrap(), None);
        // B fills its own quota: A's is untouched, and A's value stays.
        b.put("k", b"0123456789abcde").unwrap();
        assert!(matches!(b.put("x", b"1"), Err(StoreError::Quota { .. })));
        a.put("x", b"1").unwrap();
        assert_eq!(a.get("k").unwrap().as_deref(), Some(&b"from a"[..]));
        // A skill's name is a plain key: no way out of the root.
        assert!(matches!(Storage::new(root.clone(), 1, "../1001", 16), Err(StoreError::BadKey(_))));
        assert!(matches!(Storage::new(root.clone(), 1, ".", 16), Err(StoreError::BadKey(_))));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_symlink_in_a_store_is_never_followed() {
        let root = scratch("symlinks");
        let a = Storage::new(root.clone(), 1001, "notes", 64).unwrap();
        let b = Storage::new(root.clone(), 1002, "notes", 64).unwrap();
        a.put("k", b"a's value").unwrap();
        b.put("j", b"b's").unwrap();
        // B's key, then B's whole store, made a link to A's.
        let b_dir = root.join("1002/notes");
        std::fs::remove_file(b_dir.join(hex(b"j"))).unwrap();
        std::os::unix::fs::symlink(root.join("1001/notes").join(hex(b"k")), b_dir.join(hex(b"k"))).unwrap();
        assert!(matches!(b.get("k"), Err(StoreError::Io { .. })));
        std::fs::remove_dir_all(&b_dir).unwrap();
        std::os::unix::fs::symlink(root.join("1001/notes"), &b_dir).unwrap();
        assert!(matches!(b.get("k"), Err(StoreError::Io { .. })));
        assert!(matches!(b.put("k", b"b's"), Err(StoreError::Io { .. })));
        assert_eq!(a.get("k").unwrap().as_deref(), Some(&b"a's value"[..]));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
