//! Where change sets are kept: `<state>/changes/<uid>/<id>/`, a manifest
//! and the blobs of its files, in directories of the broker's own (0700).
//! A requester's change sets are its own: nothing of the store is keyed
//! by anything but the requester's uid and an id the broker chose.

use super::manifest::{MANIFEST_MAX_BYTES, Manifest, Status};
use nix::fcntl::{Flock, FlockArg};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The bounds of what is held for one requester.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of files held, all change sets together.
    pub max_bytes: u64,
    /// Change sets held.
    pub max_sets: usize,
    /// Age past which a held change set is removed (seconds).
    pub max_age_secs: u64,
    /// Free space the store's filesystem keeps while runs write their layers there.
    pub min_free_bytes: u64,
}

pub struct Store {
    root: PathBuf,
    pub limits: Limits,
}

/// A change set being made: its directory, not yet under its id.
pub struct Draft {
    pub id: String,
    pub dir: PathBuf,
    /// The broker that made it (`<pid>-<start time>`, its instance; see
    /// `crate::host::instance`): the one whose run's writes it holds.
    pub broker: String,
}

const MANIFEST: &str = "manifest.json";
const BLOBS: &str = "blobs";
/// A change set being taken (a broker that stopped meanwhile left it
/// incomplete: it is removed at the next start).
const DRAFT_PREFIX: &str = ".new-";

impl Store {
    pub fn new(root: PathBuf, limits: Limits) -> Store {
        Store { root, limits }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Makes the store's directory (and those above it), private, if it is missing.
    pub fn make_root(&self) -> io::Result<()> {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.root)
    }

    fn uid_dir(&self, uid: u32) -> io::Result<PathBuf> {
        let dir = self.root.join(uid.to_string());
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
        Ok(dir)
    }

    /// The requester's lock: one change of its change sets at a time.
    pub fn lock(&self, uid: u32) -> io::Result<Flock<std::fs::File>> {
        let path = self.uid_dir(uid)?.join(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)?;
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| e.into())
    }

    /// The requester's lock, if nobody holds it now.
    pub fn try_lock(&self, uid: u32) -> io::Result<Option<Flock<std::fs::File>>> {
        let path = self.uid_dir(uid)?.join(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Some(lock)),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, e)) => Err(e.into()),
        }
    }

    /// A new change set's directory, as this broker's draft.
    pub fn draft(&self, uid: u32) -> io::Result<Draft> {
        let id = new_id()?;
        let broker = crate::host::instance::tag().to_string();
        let dir = self.uid_dir(uid)?.join(format!("{DRAFT_PREFIX}{broker}-{id}"));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(Draft { id, dir, broker })
    }

    /// The draft under its id, with `manifest`.
    pub fn commit(&self, draft: &Draft, manifest: &Manifest) -> io::Result<PathBuf> {
        write_manifest(&draft.dir, manifest)?;
        let dir = self.uid_dir(manifest.uid)?.join(&draft.id);
        std::fs::rename(&draft.dir, &dir)?;
        Ok(dir)
    }

    /// Drafts that a broker no longer running left: `(uid, directory)`.
    pub fn orphans(&self, only: Option<u32>) -> Vec<(u32, PathBuf)> {
        let mut out = Vec::new();
        let Ok(uids) = std::fs::read_dir(&self.root) else { return out };
        for u in uids.flatten() {
            let Some(uid) = u.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if only.is_some_and(|o| o != uid) {
                continue;
            }
            let Ok(sets) = std::fs::read_dir(u.path()) else { continue };
            for s in sets.flatten() {
                let name = s.file_name().to_string_lossy().into_owned();
                if name.strip_prefix(DRAFT_PREFIX).is_some_and(|i| !crate::host::instance::alive(i)) {
                    out.push((uid, s.path()));
                }
            }
        }
        out
    }

    /// The id a draft's directory holds, and what it becomes under it
    /// (`.new-<broker>-<id>`: the broker that made it, and its id).
    pub fn draft_of(&self, uid: u32, dir: &Path) -> Option<Draft> {
        let name = dir.file_name()?.to_str()?;
        let (broker, id) = name.strip_prefix(DRAFT_PREFIX)?.rsplit_once('-')?;
        let valid = id.len() == 12 && id.bytes().all(|b| b.is_ascii_hexdigit());
        (valid && dir.parent() == Some(self.root.join(uid.to_string()).as_path())).then(|| Draft {
            id: id.to_string(),
            dir: dir.to_path_buf(),
            broker: broker.to_string(),
        })
    }

    /// A change set's directory; `None` when `uid` has none of that id
    /// (an id is only ever letters and digits: nothing else is looked up).
    pub fn dir(&self, uid: u32, id: &str) -> Option<PathBuf> {
        let valid = !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric());
        let dir = self.root.join(uid.to_string()).join(id);
        (valid && dir.join(MANIFEST).is_file()).then_some(dir)
    }

    pub fn load(&self, dir: &Path) -> io::Result<Manifest> {
        read_manifest(dir)
    }

    pub fn save(&self, dir: &Path, manifest: &Manifest) -> io::Result<()> {
        write_manifest(dir, manifest)
    }

    pub fn blobs(&self, dir: &Path) -> io::Result<std::os::fd::OwnedFd> {
        open_dir(&dir.join(BLOBS))
    }

    pub fn remove(&self, dir: &Path) -> io::Result<()> {
        super::fs::remove_all(dir)
    }

    /// `uid`'s change sets, oldest first, with the bytes of each.
    pub fn list(&self, uid: u32) -> Vec<(Manifest, u64, PathBuf)> {
        let Ok(entries) = std::fs::read_dir(self.root.join(uid.to_string())) else { return vec![] };
        let mut out: Vec<(Manifest, u64, PathBuf)> = entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| {
                let m = read_manifest(&e.path()).ok()?;
                let bytes = held_bytes(&m, &e.path());
                Some((m, bytes, e.path()))
            })
            .collect();
        out.sort_by_key(|(m, _, _)| (m.created, m.id.clone()));
        out
    }

    /// Whether `uid` may hold `bytes` more in one more change set.
    pub fn room_for(&self, uid: u32, bytes: u64) -> Result<(), String> {
        self.room_for_more(uid, "", bytes)
    }

    /// Whether `uid` may hold change set `id` (already in the store, not
    /// counted) with `bytes` of files. Every change set counts, one whose
    /// manifest cannot be read too (by its blobs' bytes).
    pub fn room_for_more(&self, uid: u32, id: &str, bytes: u64) -> Result<(), String> {
        let Ok(entries) = std::fs::read_dir(self.root.join(uid.to_string())) else { return Ok(()) };
        let held: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.') && e.file_name() != id)
            .map(|e| e.path())
            .collect();
        let total: u64 = held
            .iter()
            .map(|d| read_manifest(d).map_or_else(|_| bytes_in(&d.join(BLOBS)), |m| held_bytes(&m, d)))
            .sum();
        if held.len() >= self.limits.max_sets {
            return Err(format!("uid {uid} holds {} change sets already ([changes] max_sets)", held.len()));
        }
        if total.saturating_add(bytes) > self.limits.max_bytes {
            return Err(format!(
                "uid {uid}'s held change sets would take {} bytes, over [changes] max_bytes ({})",
                total.saturating_add(bytes),
                self.limits.max_bytes
            ));
        }
        Ok(())
    }

    /// [`Store::sweep`] of one requester's change sets: the ids removed for their age.
    pub fn sweep_uid(&self, uid: u32, now: u64) -> Vec<String> {
        let Ok(sets) = std::fs::read_dir(self.root.join(uid.to_string())) else { return vec![] };
        let mut expired = Vec::new();
        for s in sets.flatten() {
            let Ok(m) = read_manifest(&s.path()) else { continue };
            let old = m.status == Status::Held && now.saturating_sub(m.created) > self.limits.max_age_secs;
            if old && super::fs::remove_all(&s.path()).is_ok() {
                expired.push(m.id);
            }
        }
        expired
    }

    /// Removes the change sets older than `max_age_secs` (a broker's drafts
    /// are [`Store::orphans`]'); the ones removed, as `(uid, id)`.
    pub fn sweep(&self, now: u64) -> Vec<(u32, String)> {
        let mut expired = Vec::new();
        let Ok(uids) = std::fs::read_dir(&self.root) else { return expired };
        for u in uids.flatten() {
            let Some(uid) = u.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Ok(sets) = std::fs::read_dir(u.path()) else { continue };
            for s in sets.flatten() {
                let name = s.file_name().to_string_lossy().into_owned();
                if name.starts_with(DRAFT_PREFIX) {
                    // A live broker's draft is its own; a dead one's, its run's writes, is recovered.
                    continue;
                }
                let Ok(m) = read_manifest(&s.path()) else { continue };
                let old =
                    m.status == Status::Held && now.saturating_sub(m.created) > self.limits.max_age_secs;
                if old && super::fs::remove_all(&s.path()).is_ok() {
                    expired.push((uid, m.id));
                }
            }
        }
        expired
    }
}

/// The bytes a change set holds: its manifest's count, or (one of an
/// earlier broker) its blobs' sizes.
fn held_bytes(m: &Manifest, dir: &Path) -> u64 {
    match m.layout {
        super::manifest::Layout::Tree => m.bytes,
        super::manifest::Layout::Blobs => bytes_in(&dir.join(BLOBS)),
    }
}

pub(super) fn open_dir(path: &Path) -> io::Result<std::os::fd::OwnedFd> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    Ok(file.into())
}

fn bytes_in(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.size()).sum()
}

fn read_manifest(dir: &Path) -> io::Result<Manifest> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(MANIFEST))?;
    let mut text = Vec::new();
    file.take(MANIFEST_MAX_BYTES).read_to_end(&mut text)?;
    serde_json::from_slice(&text).map_err(io::Error::other)
}

/// Written whole or not at all: a temporary file, then a rename. The
/// temporary file is a new one (not truncated: on ext4 closing a truncated
/// file starts its writeback, milliseconds for every run).
fn write_manifest(dir: &Path, m: &Manifest) -> io::Result<()> {
    let tmp = dir.join(format!("{MANIFEST}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&tmp)?;
    let text = serde_json::to_vec(m).map_err(io::Error::other)?;
    // Never one that could not be read back.
    if text.len() as u64 > MANIFEST_MAX_BYTES {
        let _ = std::fs::remove_file(&tmp);
        return Err(io::Error::other(format!(
            "a manifest of {} bytes, over {MANIFEST_MAX_BYTES}",
            text.len()
        )));
    }
    f.write_all(&text)?;
    drop(f);
    std::fs::rename(tmp, dir.join(MANIFEST))
}

/// Twelve hex digits nobody can predict.
fn new_id() -> io::Result<String> {
    let mut bytes = [0u8; 6];
    getrandom::fill(&mut bytes).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
