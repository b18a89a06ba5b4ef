//! The module cache, `skills_dir/.cache/`: the artifacts the plugin-host
//! compiled, which every later plugin-host loads as native code. So the
//! broker trusts none of it that it did not write itself:
//!
//! - an entry's name is the broker's: `<module sha256>-<engine digest>.cwasm`,
//!   the digest a sha256 of the engine string the plugin-host said in
//!   `Ready` (validated: `engine_name_ok`), never the string itself;
//! - it is written exclusively: a new file (`O_EXCL`, no symlink followed)
//!   linked under its name, which never replaces one;
//! - beside it, `<name>.mac`: an HMAC-SHA256 of the module's sha256, the
//!   engine string and the artifact, with a key the plugin-host never sees
//!   (`secrets_dir/.module-cache.key`, 0600, made at first use; the secret
//!   store is in no jail). Before a plugin-host is told to load an entry,
//!   its MAC is checked; one that does not verify is removed, never
//!   loaded, logged, and the module compiled again;
//! - only installed skills' modules are kept, within `[plugins]
//!   cache_max_bytes`; an inline module's artifact (or one past the bound)
//!   is written for its call only and removed when the call ends; what no
//!   installed skill names is swept at start, when a plugin-host says its
//!   engine, and after `palisade plugin install` and `remove`.

use hmac::{Hmac, KeyInit, Mac};
use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, fstat};
use nix::unistd::{UnlinkatFlags, linkat, unlinkat};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The key's file in the secret store's directory (no secret's name starts with a dot).
pub const KEY_FILE: &str = ".module-cache.key";
/// HMAC-SHA256's key: as long as its output.
const KEY_BYTES: usize = 32;
const MAC_BYTES: usize = 32;
const ARTIFACT_EXT: &str = ".cwasm";
const MAC_EXT: &str = ".mac";
/// A call's own artifact (an inline module's, or one past the bound): removed when the call ends.
const TRANSIENT_PREFIX: &str = "call-";
/// Hex digits of the engine string's sha256 in an entry's name: 128 bits.
const ENGINE_DIGEST_HEX: usize = 32;
/// What the MAC covers first: a key made for this cache authenticates nothing else.
const MAC_CONTEXT: &[u8] = b"palisade module cache 1\0";
/// Largest artifact the broker reads back: what a `Compiled` frame can carry.
const MAX_ARTIFACT_BYTES: u64 = palisade_protocol::plugin::PLUGIN_FRAME_MAX as u64;
/// Directories and files of the cache: the broker's own (the plugin-host
/// reads them through its jail's bind, idmapped to the broker's ids where
/// the filesystem can idmap).
const PRIVATE_DIR: u32 = 0o700;
const PRIVATE_FILE: u32 = 0o600;
/// With a reader group (a root broker's plugin-host runs as host ids of
/// its own): that group reads, nobody but the broker writes. A bind that
/// cannot be idmapped (tmpfs before Linux 6.3) reads through it.
const SHARED_DIR: u32 = 0o750;
const SHARED_FILE: u32 = 0o640;

type HmacSha256 = Hmac<Sha256>;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("the plugin-host's engine string {0:?} is not of the form wasmtime-<version>-<16 hex>")]
    BadEngine(String),
    #[error("{0:?} is not a module's sha256")]
    BadModule(String),
    #[error("the module cache's key {path}: {why}")]
    Key { path: PathBuf, why: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> CacheError + '_ {
    move |source| CacheError::Io { path: path.to_path_buf(), source }
}

fn errno_at(path: &Path) -> impl FnOnce(Errno) -> CacheError + '_ {
    move |e| CacheError::Io { path: path.to_path_buf(), source: e.into() }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How the cache's files and the key are opened to be read: never through
/// a symlink, and without blocking (a FIFO planted under a name must not
/// hold the broker; a plain file ignores the flag).
fn for_reading() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The engine's part of an entry's name: a digest of the validated engine string.
fn engine_digest(engine: &str) -> Result<String, CacheError> {
    if !palisade_protocol::plugin::engine_name_ok(engine) {
        return Err(CacheError::BadEngine(engine.into()));
    }
    Ok(hex(&Sha256::digest(engine.as_bytes()))[..ENGINE_DIGEST_HEX].to_string())
}

/// The name of the entry of module `sha256` for `engine` (without its extension).
pub fn entry_name(sha256: &str, engine: &str) -> Result<String, CacheError> {
    if !is_sha256_hex(sha256) {
        return Err(CacheError::BadModule(sha256.into()));
    }
    Ok(format!("{sha256}-{}", engine_digest(engine)?))
}

/// Identifies a file's content as it was verified: any write since changes
/// its change time (which no caller can set), a file put in its place its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl From<&FileStat> for Stamp {
    fn from(s: &FileStat) -> Stamp {
        Stamp {
            dev: s.st_dev,
            ino: s.st_ino,
            size: s.st_size,
            mtime: (s.st_mtime, s.st_mtime_nsec),
            ctime: (s.st_ctime, s.st_ctime_nsec),
        }
    }
}

/// A call's artifact: where the plugin-host finds it, and whether it goes with the call.
pub struct Artifact {
    pub path: PathBuf,
    pub transient: bool,
}

/// What a sweep removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub entries: u64,
    pub bytes: u64,
}

pub struct ModuleCache {
    dir: PathBuf,
    key_path: PathBuf,
    max_bytes: u64,
    key: Mutex<Option<[u8; KEY_BYTES]>>,
    /// Entries whose MAC verified, as they were then: not read again while unchanged.
    verified: Mutex<HashMap<String, Stamp>>,
    /// The plugin-host's gid when it is not the broker's: it reads the cache as that group.
    reader_gid: Option<u32>,
}

impl ModuleCache {
    /// The cache in `dir`, its key in `secrets_dir`. The key must not be
    /// where a plugin-host can read it: under the cache.
    pub fn new(dir: PathBuf, secrets_dir: &Path, max_bytes: u64) -> Result<ModuleCache, String> {
        let key_path = secrets_dir.join(KEY_FILE);
        if key_path.starts_with(&dir) {
            return Err(format!(
                "the module cache's key {} would be inside the cache {}, which the plugin-host reads: \
                 set [plugins] secrets_dir elsewhere",
                key_path.display(),
                dir.display()
            ));
        }
        let (key, verified) = (Mutex::new(None), Mutex::new(HashMap::new()));
        Ok(ModuleCache { dir, key_path, max_bytes, key, verified, reader_gid: None })
    }

    /// The plugin-host reads the cache as group `gid` (a root broker's host ids), or as the broker.
    pub fn read_by(self, gid: Option<u32>) -> ModuleCache {
        ModuleCache { reader_gid: gid, ..self }
    }

    /// `fd` (the cache's directory or an artifact) readable by the reader group, when there is one.
    /// Whether it changed anything.
    fn share(&self, fd: &OwnedFd, path: &Path, dir: bool) -> Result<bool, CacheError> {
        let Some(gid) = self.reader_gid else { return Ok(false) };
        let stat = fstat(fd).map_err(errno_at(path))?;
        let mode = if dir { SHARED_DIR } else { SHARED_FILE };
        let (regroup, remode) = (stat.st_gid != gid, stat.st_mode & 0o7777 != mode);
        if regroup {
            nix::unistd::fchown(fd, None, Some(nix::unistd::Gid::from_raw(gid))).map_err(errno_at(path))?;
        }
        if remode {
            nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode)).map_err(errno_at(path))?;
        }
        Ok(regroup || remode)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache's directory, made (0700) if it is not there.
    pub fn ensure_dir(&self) -> Result<PathBuf, CacheError> {
        self.open_dir().map(|_| self.dir.clone())
    }

    /// An entry's path as the plugin-host's jail has it: under the
    /// directory's canonical path, which the jail binds.
    fn host_path(&self, file: &str) -> PathBuf {
        self.dir.canonicalize().unwrap_or_else(|_| self.dir.clone()).join(file)
    }

    /// The cache's directory, made (0700) if it is not there, opened with no symlink as its last step.
    fn open_dir(&self) -> Result<OwnedFd, CacheError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(PRIVATE_DIR)
            .create(&self.dir)
            .map_err(io_at(&self.dir))?;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let dir = nix::fcntl::open(&self.dir, flags, Mode::empty()).map_err(errno_at(&self.dir))?;
        self.share(&dir, &self.dir, true)?;
        Ok(dir)
    }

    /// The MAC key: read from its file, or made there (32 random bytes, 0600) at first use.
    fn key(&self) -> Result<[u8; KEY_BYTES], CacheError> {
        let mut kept = self.key.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(key) = *kept {
            return Ok(key);
        }
        let key = read_or_make_key(&self.key_path)?;
        *kept = Some(key);
        Ok(key)
    }

    fn mac(&self, sha256: &str, engine: &str, artifact: &[u8]) -> Result<HmacSha256, CacheError> {
        let key = self.key()?;
        let mut mac = HmacSha256::new_from_slice(&key).expect("HMAC takes a key of any length");
        mac.update(MAC_CONTEXT);
        mac.update(sha256.as_bytes());
        mac.update(&(engine.len() as u32).to_be_bytes());
        mac.update(engine.as_bytes());
        mac.update(artifact);
        Ok(mac)
    }

    /// The cached artifact of module `sha256` for `engine`, when there is one
    /// and its MAC verifies. One that does not verify (or is not a plain
    /// file of the broker's) is removed, and the caller compiles again.
    pub fn lookup(&self, sha256: &str, engine: &str) -> Result<Option<PathBuf>, CacheError> {
        let name = entry_name(sha256, engine)?;
        let file = format!("{name}{ARTIFACT_EXT}");
        let dir = self.open_dir()?;
        let opened = openat(&dir, file.as_str(), for_reading(), Mode::empty());
        let fd = match opened {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                // A MAC left without its artifact would refuse the next one's.
                let _ = unlinkat(&dir, format!("{name}{MAC_EXT}").as_str(), UnlinkatFlags::NoRemoveDir);
                return Ok(None);
            }
            Err(e) => return self.refuse(&dir, &name, &format!("cannot be opened as a file ({e})")),
        };
        let path = self.host_path(&file);
        let stat = fstat(&fd).map_err(errno_at(&path))?;
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG || stat.st_uid != nix::unistd::geteuid().as_raw() {
            return self.refuse(&dir, &name, "is not a plain file of the broker's");
        }
        // An entry written before there was a reader group becomes readable by it too.
        let stat = match self.share(&fd, &path, false)? {
            true => fstat(&fd).map_err(errno_at(&path))?,
            false => stat,
        };
        let stamp = Stamp::from(&stat);
        if self.verified.lock().unwrap_or_else(|e| e.into_inner()).get(&name) == Some(&stamp) {
            return Ok(Some(path));
        }
        let mut artifact = Vec::new();
        std::fs::File::from(fd)
            .take(MAX_ARTIFACT_BYTES + 1)
            .read_to_end(&mut artifact)
            .map_err(io_at(&path))?;
        let tag = read_small(&dir, &format!("{name}{MAC_EXT}"));
        let verified = match tag {
            Some(tag) if artifact.len() as u64 <= MAX_ARTIFACT_BYTES => {
                self.mac(sha256, engine, &artifact)?.verify_slice(&tag).is_ok()
            }
            _ => false,
        };
        if !verified {
            return self.refuse(&dir, &name, "does not verify against the broker's MAC");
        }
        self.verified.lock().unwrap_or_else(|e| e.into_inner()).insert(name, stamp);
        Ok(Some(path))
    }

    /// An entry the broker will not have a plugin-host load: removed, and said.
    fn refuse(&self, dir: &OwnedFd, name: &str, why: &str) -> Result<Option<PathBuf>, CacheError> {
        tracing::warn!(
            entry = %self.dir.join(name).display(),
            "module cache: the artifact {why}: removed, not loaded; the module is compiled again"
        );
        self.verified.lock().unwrap_or_else(|e| e.into_inner()).remove(name);
        for ext in [ARTIFACT_EXT, MAC_EXT] {
            let file = format!("{name}{ext}");
            match unlinkat(dir, file.as_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                // A directory planted under the name.
                Err(Errno::EISDIR) => {
                    std::fs::remove_dir_all(self.dir.join(&file)).map_err(io_at(&self.dir.join(&file)))?
                }
                Err(e) => return Err(errno_at(&self.dir.join(&file))(e)),
            }
        }
        Ok(None)
    }

    /// Writes the artifact the plugin-host compiled for module `sha256` and
    /// its MAC: under the entry's name when `keep` (an installed skill's
    /// module, within the bound), else for call `id` only.
    pub fn store(
        &self,
        id: u64,
        sha256: &str,
        engine: &str,
        artifact: &[u8],
        keep: bool,
    ) -> Result<Artifact, CacheError> {
        let name = entry_name(sha256, engine)?;
        let name = if keep { name } else { format!("{TRANSIENT_PREFIX}{id}-{name}") };
        let tag = self.mac(sha256, engine, artifact)?.finalize().into_bytes();
        let dir = self.open_dir()?;
        let file = format!("{name}{ARTIFACT_EXT}");
        write_exclusive(&dir, &self.dir, &format!("{name}{MAC_EXT}"), &tag, |_| Ok(()))?;
        let shared = |fd: &OwnedFd| self.share(fd, &self.dir.join(&file), false).map(drop);
        if let Err(e) = write_exclusive(&dir, &self.dir, &file, artifact, shared) {
            let _ = unlinkat(&dir, format!("{name}{MAC_EXT}").as_str(), UnlinkatFlags::NoRemoveDir);
            return Err(e);
        }
        let path = self.host_path(&file);
        if keep {
            // Written by the broker just now: its stamp is what it wrote.
            let stamp = nix::sys::stat::fstatat(&dir, file.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(errno_at(&path))?;
            self.verified.lock().unwrap_or_else(|e| e.into_inner()).insert(name, Stamp::from(&stamp));
        }
        Ok(Artifact { path, transient: !keep })
    }

    /// Removes a call's own artifact and its MAC.
    pub fn remove_transient(&self, artifact: &Artifact) {
        if !artifact.transient {
            return;
        }
        let mac = artifact.path.with_extension(&MAC_EXT[1..]);
        for path in [&artifact.path, &mac] {
            if let Err(e) = std::fs::remove_file(path) {
                tracing::warn!(path = %path.display(), "module cache: a call's artifact: {e}");
            }
        }
    }

    /// Whether an artifact of `len` bytes and its MAC fit the bound, with what is cached now.
    pub fn fits(&self, len: u64) -> Result<bool, CacheError> {
        let adding = len.saturating_add(MAC_BYTES as u64);
        Ok(size_of_entries(&self.dir)?.saturating_add(adding) <= self.max_bytes)
    }
}

/// Writes `bytes` as `dir/name`, which must not exist: a new file
/// (`O_EXCL`, never through a symlink), synced, then linked under its name
/// (a link never replaces a file).
fn write_exclusive(
    dir: &OwnedFd,
    at: &Path,
    name: &str,
    bytes: &[u8],
    share: impl FnOnce(&OwnedFd) -> Result<(), CacheError>,
) -> Result<(), CacheError> {
    let tmp = format!(".tmp-{}-{name}", std::process::id());
    let path = at.join(name);
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir, tmp.as_str(), flags, Mode::from_bits_truncate(PRIVATE_FILE))
        .map_err(errno_at(&at.join(&tmp)))?;
    if let Err(e) = share(&fd) {
        let _ = unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
        return Err(e);
    }
    let mut f = std::fs::File::from(fd);
    let linked = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(io_at(&path))
        .and_then(|()| linkat(dir, tmp.as_str(), dir, name, AtFlags::empty()).map_err(errno_at(&path)));
    let _ = unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
    linked
}

/// A MAC's file: its bytes when it is a plain file of exactly that length.
fn read_small(dir: &OwnedFd, name: &str) -> Option<Vec<u8>> {
    let fd = openat(dir, name, for_reading(), Mode::empty()).ok()?;
    let mut out = Vec::new();
    std::fs::File::from(fd).take(MAC_BYTES as u64 + 1).read_to_end(&mut out).ok()?;
    (out.len() == MAC_BYTES).then_some(out)
}

/// Reads the key, or makes it: 32 bytes from the kernel's random source,
/// in a new file (0600) in a private directory. A key file that is not the
/// broker's, not private or not 32 bytes is refused, never replaced.
fn read_or_make_key(path: &Path) -> Result<[u8; KEY_BYTES], CacheError> {
    use std::os::unix::fs::DirBuilderExt;
    let refuse = |why: String| CacheError::Key { path: path.to_path_buf(), why };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new().recursive(true).mode(PRIVATE_DIR).create(dir).map_err(io_at(dir))?;
    }
    let fd = match openat(AT_FDCWD, path, for_reading(), Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => {
            let mut key = [0u8; KEY_BYTES];
            getrandom::fill(&mut key).map_err(|e| refuse(format!("no random bytes: {e}")))?;
            let create =
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            match openat(AT_FDCWD, path, create, Mode::from_bits_truncate(PRIVATE_FILE)) {
                Ok(fd) => {
                    let mut f = std::fs::File::from(fd);
                    f.write_all(&key).and_then(|()| f.sync_all()).map_err(io_at(path))?;
                    tracing::info!(key = %path.display(), "module cache: a new MAC key");
                    return Ok(key);
                }
                // Made by another process meanwhile: read it.
                Err(Errno::EEXIST) => {
                    openat(AT_FDCWD, path, for_reading(), Mode::empty()).map_err(errno_at(path))?
                }
                Err(e) => return Err(errno_at(path)(e)),
            }
        }
        Err(e) => return Err(errno_at(path)(e)),
    };
    let stat = fstat(&fd).map_err(errno_at(path))?;
    let mode = stat.st_mode & 0o7777;
    if stat.st_mode & libc::S_IFMT != libc::S_IFREG
        || stat.st_uid != nix::unistd::geteuid().as_raw()
        || mode & 0o077 != 0
    {
        return Err(refuse(format!(
            "mode {mode:o}, owner {}: it must be a 0600 file of the broker's",
            stat.st_uid
        )));
    }
    let mut key = Vec::new();
    std::fs::File::from(fd).take(KEY_BYTES as u64 + 1).read_to_end(&mut key).map_err(io_at(path))?;
    key.try_into().map_err(|k: Vec<u8>| refuse(format!("{} bytes, not {KEY_BYTES}", k.len())))
}

/// Bytes of the entries kept (a call's own artifacts are not counted: they go with their call).
fn size_of_entries(dir: &Path) -> Result<u64, CacheError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_at(dir)(e)),
    };
    let mut total = 0u64;
    for entry in entries {
        let entry = entry.map_err(io_at(dir))?;
        if entry.file_name().to_string_lossy().starts_with(TRANSIENT_PREFIX) {
            continue;
        }
        total = total.saturating_add(entry.metadata().map_err(io_at(dir))?.len());
    }
    Ok(total)
}

/// Whether `name` is an entry to keep: an artifact or its MAC, of a module
/// in `modules`, for `engine` when it is known.
fn kept(name: &str, modules: &HashSet<String>, engine: Option<&str>) -> bool {
    let Some(stem) = name.strip_suffix(ARTIFACT_EXT).or_else(|| name.strip_suffix(MAC_EXT)) else {
        return false;
    };
    let Some((sha256, digest)) = stem.split_once('-') else { return false };
    is_sha256_hex(sha256)
        && modules.contains(sha256)
        && digest.len() == ENGINE_DIGEST_HEX
        && digest.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && engine.is_none_or(|e| engine_digest(e).is_ok_and(|d| d == digest))
}

/// Removes from the cache `dir` every entry that is not an installed
/// skill's artifact (`modules`: their sha256s) or its MAC, for `engine`
/// when it is known: a call's leftover artifact, an older engine's, a
/// module no skill names, anything else put there.
pub fn sweep(dir: &Path, modules: &HashSet<String>, engine: Option<&str>) -> Result<Swept, CacheError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Swept::default()),
        Err(e) => return Err(io_at(dir)(e)),
    };
    let mut swept = Swept::default();
    for entry in entries {
        let entry = entry.map_err(io_at(dir))?;
        let name = entry.file_name();
        if kept(&name.to_string_lossy(), modules, engine) {
            continue;
        }
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).map_err(io_at(&path))?;
        if meta.is_dir() {
            std::fs::remove_dir_all(&path).map_err(io_at(&path))?;
        } else {
            std::fs::remove_file(&path).map_err(io_at(&path))?;
        }
        swept.entries += 1;
        swept.bytes += meta.len();
    }
    if swept.entries > 0 {
        tracing::info!(cache = %dir.display(), entries = swept.entries, bytes = swept.bytes, "module cache: swept what no installed skill names");
    }
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENGINE: &str = "wasmtime-48.0.8-0123456789abcdef";

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("palisade-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn sha(n: u8) -> String {
        hex(&Sha256::digest([n]))
    }

    #[test]
    fn names_are_the_brokers() {
        let name = entry_name(&sha(1), ENGINE).unwrap();
        assert!(name.starts_with(&sha(1)) && name.len() == 64 + 1 + ENGINE_DIGEST_HEX, "{name}");
        assert!(!name.contains("wasmtime"));
        assert!(matches!(entry_name(&sha(1), "wasmtime-1-../../x"), Err(CacheError::BadEngine(_))));
        assert!(matches!(entry_name("../x", ENGINE), Err(CacheError::BadModule(_))));
        assert!(matches!(entry_name(&sha(1).to_uppercase(), ENGINE), Err(CacheError::BadModule(_))));
    }

    #[test]
    fn a_reader_group_reads_the_cache_and_only_the_broker_writes_it() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let root = scratch("reader");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        // Without a reader group (an unprivileged broker): the broker's alone.
        let cache = ModuleCache::new(root.join("cache"), &root.join("secrets"), 1 << 20).unwrap();
        let kept = cache.store(1, &sha(1), ENGINE, b"artifact one", true).unwrap();
        assert_eq!((mode(&root.join("cache")), mode(&kept.path)), (PRIVATE_DIR, PRIVATE_FILE));
        if !nix::unistd::geteuid().is_root() {
            use std::io::Write;
            let why = "SKIPPED the reader group's half: only root may give a file to another group";
            let _ = writeln!(std::io::stderr().lock(), "{why}");
            return;
        }
        let gid = 4242;
        let cache =
            ModuleCache::new(root.join("cache"), &root.join("secrets"), 1 << 20).unwrap().read_by(Some(gid));
        // An entry written before: shared when it is next looked up, and still verified.
        assert_eq!(cache.lookup(&sha(1), ENGINE).unwrap(), Some(kept.path.clone()));
        let transient = cache.store(2, &sha(2), ENGINE, b"artifact two", false).unwrap();
        for (path, want) in [
            (root.join("cache"), SHARED_DIR),
            (kept.path.clone(), SHARED_FILE),
            (transient.path, SHARED_FILE),
        ] {
            let meta = std::fs::metadata(&path).unwrap();
            assert_eq!((mode(&path), meta.gid(), meta.uid()), (want, gid, 0), "{}", path.display());
        }
        // The MAC stays the broker's alone.
        assert_eq!(mode(&kept.path.with_extension("mac")), PRIVATE_FILE);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn an_entry_is_loaded_only_when_its_mac_verifies() {
        let root = scratch("mac");
        let cache = ModuleCache::new(root.join("cache"), &root.join("secrets"), 1 << 20).unwrap();
        assert_eq!(cache.lookup(&sha(1), ENGINE).unwrap(), None);
        let stored = cache.store(1, &sha(1), ENGINE, b"artifact one", true).unwrap();
        assert!(!stored.transient);
        assert_eq!(cache.lookup(&sha(1), ENGINE).unwrap(), Some(stored.path.clone()));
        let key = root.join("secrets").join(KEY_FILE);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
        // Each check below is a broker's first look at the entry (as after
        // a start): one broker looks again only at a file whose stamp changed.
        let fresh = || ModuleCache::new(root.join("cache"), &root.join("secrets"), 1 << 20).unwrap();
        // Verified by a broker that starts afresh (the same key).
        assert!(fresh().lookup(&sha(1), ENGINE).unwrap().is_some());
        // Changed bytes: removed, not returned.
        std::fs::write(&stored.path, b"artifact 0ne").unwrap();
        assert_eq!(fresh().lookup(&sha(1), ENGINE).unwrap(), None);
        assert!(!stored.path.exists() && !stored.path.with_extension("mac").exists());
        // Another module's entry (and its MAC) under this module's name: refused.
        let two = cache.store(2, &sha(2), ENGINE, b"artifact two", true).unwrap();
        std::fs::copy(&two.path, &stored.path).unwrap();
        std::fs::copy(two.path.with_extension("mac"), stored.path.with_extension("mac")).unwrap();
        assert_eq!(fresh().lookup(&sha(1), ENGINE).unwrap(), None);
        // A file put in place of a verified one (a new inode): looked at again.
        cache.store(1, &sha(1), ENGINE, b"artifact one", true).unwrap();
        assert!(cache.lookup(&sha(1), ENGINE).unwrap().is_some());
        std::fs::remove_file(&stored.path).unwrap();
        std::fs::write(&stored.path, b"another artifact").unwrap();
        assert_eq!(cache.lookup(&sha(1), ENGINE).unwrap(), None);
        // A symlink to a good entry: refused.
        std::os::unix::fs::symlink(&two.path, &stored.path).unwrap();
        assert_eq!(fresh().lookup(&sha(1), ENGINE).unwrap(), None);
        assert!(std::fs::symlink_metadata(&stored.path).is_err());
        // The entry of another engine is not this one's.
        assert_eq!(cache.lookup(&sha(2), "wasmtime-48.0.9-0123456789abcdef").unwrap(), None);
        assert!(cache.lookup(&sha(2), ENGINE).unwrap().is_some());
        // A key that is not private is refused, not used.
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let loose = ModuleCache::new(root.join("cache"), &root.join("secrets"), 1 << 20).unwrap();
        assert!(matches!(loose.lookup(&sha(2), ENGINE), Err(CacheError::Key { .. })));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn writes_never_replace_and_call_artifacts_go_with_their_call() {
        let root = scratch("writes");
        let cache = ModuleCache::new(root.join("cache"), &root.join("secrets"), 1 << 20).unwrap();
        cache.store(1, &sha(1), ENGINE, b"one", true).unwrap();
        assert!(matches!(cache.store(2, &sha(1), ENGINE, b"evil", true), Err(CacheError::Io { .. })));
        assert!(cache.lookup(&sha(1), ENGINE).unwrap().is_some());
        let call = cache.store(3, &sha(3), ENGINE, b"inline", false).unwrap();
        assert!(call.transient && call.path.exists());
        cache.remove_transient(&call);
        assert!(!call.path.exists() && !call.path.with_extension("mac").exists());
        let names: Vec<_> =
            std::fs::read_dir(root.join("cache")).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(cache.fits(1 << 19).unwrap() && !cache.fits(1 << 20).unwrap());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_sweep_keeps_only_installed_skills_entries() {
        let root = scratch("sweep");
        let cache = ModuleCache::new(root.join("cache"), &root.join("secrets"), 1 << 20).unwrap();
        let kept = cache.store(1, &sha(1), ENGINE, b"installed", true).unwrap();
        let gone = cache.store(2, &sha(2), ENGINE, b"no skill names it", true).unwrap();
        let old = cache.store(3, &sha(1), "wasmtime-47.0.0-0123456789abcdef", b"older engine", true).unwrap();
        let call = cache.store(4, &sha(1), ENGINE, b"a call's", false).unwrap();
        std::fs::write(root.join("cache/planted.cwasm"), b"x").unwrap();
        std::fs::create_dir(root.join("cache/dir")).unwrap();
        std::os::unix::fs::symlink("/", root.join("cache/link")).unwrap();
        let modules = HashSet::from([sha(1)]);
        // Without the engine known, every engine's entries of an installed module stay.
        let swept = sweep(&root.join("cache"), &modules, None).unwrap();
        assert_eq!(swept.entries, 2 + 2 + 3, "{swept:?}");
        assert!(kept.path.exists() && old.path.exists() && !gone.path.exists() && !call.path.exists());
        assert_eq!(sweep(&root.join("cache"), &modules, Some(ENGINE)).unwrap().entries, 2);
        assert!(kept.path.exists() && !old.path.exists());
        assert!(cache.lookup(&sha(1), ENGINE).unwrap().is_some());
        assert!(Path::new("/").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_key_is_never_inside_the_cache() {
        let root = scratch("inside");
        assert!(ModuleCache::new(root.join("skills/.cache"), &root.join("skills/.cache/s"), 1).is_err());
        assert!(ModuleCache::new(root.join("skills/.cache"), &root.join("secrets"), 1).is_ok());
    }
}
