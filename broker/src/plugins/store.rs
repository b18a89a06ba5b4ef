//! What the broker keeps for plugins: the secret store (a file per key,
//! mode 0600, under `<state dir>/secrets/`) and each skill's storage (a file
//! per key under `skills_dir/<name>/storage/`, named by the key's hex, with
//! a quota per skill).

use std::io::{self, Read, Write};
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

/// One skill's storage: `dir/<hex of key>`, at most `quota` bytes of keys and values.
pub struct Storage {
    pub dir: PathBuf,
    pub quota: u64,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Storage {
    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(hex(key.as_bytes()))
    }

    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.path(key);
        match std::fs::read(&path) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_at(&path)(e)),
        }
    }

    /// Bytes in use: every key's length and value's.
    pub fn used(&self) -> Result<u64, StoreError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_at(&self.dir)(e)),
        };
        let mut used = 0;
        for entry in entries {
            let entry = entry.map_err(io_at(&self.dir))?;
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            used += name.len() as u64 / 2 + entry.metadata().map_err(io_at(&self.dir))?.len();
        }
        Ok(used)
    }

    /// Writes `value` as `key`, within the quota (the key's old value does not count).
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let path = self.path(key);
        let old = std::fs::metadata(&path).map_or(0, |m| key.len() as u64 + m.len());
        let used = self.used()?.saturating_sub(old);
        let adding = key.len() as u64 + value.len() as u64;
        if used + adding > self.quota {
            return Err(StoreError::Quota { quota: self.quota, used, adding });
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(PRIVATE_DIR)
            .create(&self.dir)
            .map_err(io_at(&self.dir))?;
        let tmp = self.dir.join(".put.tmp");
        std::fs::write(&tmp, value).map_err(io_at(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io_at(&path))
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
        let s = Storage { dir: scratch("storage"), quota: 16 };
        s.put("a/b", b"12345").unwrap();
        assert_eq!(s.get("a/b").unwrap().as_deref(), Some(&b"12345"[..]));
        assert_eq!(s.used().unwrap(), 8);
        // Replacing a value counts only the new one.
        s.put("a/b", b"1234567890").unwrap();
        assert!(matches!(s.put("c", b"12345"), Err(StoreError::Quota { .. })));
        assert_eq!(s.get("c").unwrap(), None);
        std::fs::remove_dir_all(&s.dir).unwrap();
    }
}
