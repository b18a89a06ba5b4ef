//! The sandbox's `/etc` as one read-only bind of a snapshot.
//!
//! Binding the curated `/etc` entries one by one costs a mount each, at every
//! launch. The broker instead keeps a copy of them in a directory of its own,
//! which the plan binds at `/etc` in one mount, and takes a new copy when the
//! host's entries change: an inotify watch on every directory the copy was
//! taken from is set up *before* copying, so a change made while copying is
//! seen too, and the next run gets a fresh snapshot. A snapshot is removed
//! when the last run using it is over.
//!
//! What is copied: only what anyone on the host may read (files readable by
//! others, directories readable and searchable by others); anything else
//! (`/etc/ssl/private`, say) is left out, so the copy never holds more than
//! the sandbox's own uid could read. Top-level entries are followed like the
//! bind followed them (`/etc/resolv.conf` may be a symlink into `/run`);
//! below them, symlinks stay symlinks. Set-id bits are dropped. Anything else
//! (devices, fifos, sockets) is skipped. A copy larger than
//! [`MAX_ENTRIES`] entries or [`MAX_BYTES`] bytes is not made, and the plan
//! binds the entries one by one instead.

use crate::host::instance;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

static GENERATION: AtomicU64 = AtomicU64::new(1);

pub const MAX_ENTRIES: usize = 20_000;
pub const MAX_BYTES: u64 = 64 << 20;

/// One copy of the entries, removed from disk when dropped.
#[derive(Debug)]
pub struct Snapshot {
    dir: PathBuf,
}

impl Snapshot {
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        remove_tree(&self.dir);
    }
}

pub struct EtcView {
    base: PathBuf,
    entries: Vec<PathBuf>,
    state: Mutex<State>,
}

/// After a failure to set up the watches, how long runs go without a snapshot
/// before the next attempt.
const RETRY: Duration = Duration::from_secs(10);

#[derive(Default)]
struct State {
    current: Option<Arc<Snapshot>>,
    /// Watches of what the current snapshot came from, and of the copy itself;
    /// `None` before the first snapshot.
    watch: Option<Watch>,
    /// The top-level entries as they were (followed) when the copy was
    /// taken: a change in any of them also retakes it (a symlink's target
    /// that appears, a chain of links that changes, a file rewritten through
    /// another mount).
    signature: Vec<Option<Signature>>,
    /// Something changed: the next run retakes the snapshot.
    stale: bool,
    /// The watches could not be set up: no snapshot before then.
    retry_at: Option<Instant>,
}

/// Whether the snapshot can be used as it is.
pub enum Lookup {
    /// Use this (`None`: bind the entries one by one).
    Fresh(Option<Arc<Snapshot>>),
    /// Call [`EtcView::retake`] (it blocks: copies files).
    Stale,
}

/// What identifies a file's content, cheaply: a change of any of these.
#[derive(PartialEq, Eq)]
struct Signature {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn signature(entries: &[PathBuf]) -> Vec<Option<Signature>> {
    entries
        .iter()
        .map(|e| {
            fs::metadata(e).ok().map(|m| Signature {
                dev: m.dev(),
                ino: m.ino(),
                size: m.size(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
            })
        })
        .collect()
}

impl EtcView {
    /// Snapshots of `entries` (absolute paths, each a direct child of its
    /// directory) kept under `base`, which must be private to the broker.
    /// Snapshots left by brokers no longer running are removed.
    pub fn new(base: PathBuf, entries: Vec<PathBuf>) -> EtcView {
        remove_orphans(&base);
        EtcView { base, entries, state: Mutex::new(State { stale: true, ..State::default() }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The snapshot for a run starting now, retaken first when anything it
    /// came from, or the copy itself, changed; `None` when there is none (the
    /// plan then binds the entries one by one). The run holds it until it is
    /// over. Blocks while a copy is taken: see [`EtcView::lookup`].
    pub fn current(&self) -> Option<Arc<Snapshot>> {
        match self.lookup() {
            Lookup::Fresh(s) => s,
            Lookup::Stale => self.retake(),
        }
    }

    /// Whether the snapshot is still good, without blocking: only the
    /// pending change events are read, and the top-level entries stat'ed.
    pub fn lookup(&self) -> Lookup {
        let mut st = self.lock();
        if let Some(at) = st.retry_at {
            return if Instant::now() < at { Lookup::Fresh(None) } else { Lookup::Stale };
        }
        if !st.stale {
            let changed = st.watch.as_ref().is_none_or(Watch::changed);
            st.stale = changed || signature(&self.entries) != st.signature;
        }
        if st.stale { Lookup::Stale } else { Lookup::Fresh(st.current.clone()) }
    }

    /// Takes a new snapshot (unless another run just did).
    pub fn retake(&self) -> Option<Arc<Snapshot>> {
        let mut st = self.lock();
        let due = st.retry_at.is_some_and(|at| Instant::now() >= at);
        if !st.stale && !due {
            return st.current.clone();
        }
        // The old snapshot stays on disk while runs still hold it.
        st.current = None;
        st.watch = None;
        st.stale = false;
        st.retry_at = None;
        // The watches first: a change made while copying is seen.
        let mut watch = match Watch::new(&self.entries) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(
                    "cannot watch the /etc entries for changes: {e}; sandboxes get the entries bound one by one, another try in {} s",
                    RETRY.as_secs()
                );
                st.retry_at = Some(Instant::now() + RETRY);
                return None;
            }
        };
        st.signature = signature(&self.entries);
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        let dir = self.base.join(format!("etc-{}-{generation}", instance::tag()));
        let taking = Instant::now();
        match take(&self.entries, &dir) {
            // Then the copy: whoever changes or removes it makes the next run retake it.
            Ok(snapshot) => match watch.add_tree(snapshot.dir()) {
                Ok(()) => {
                    let ms = taking.elapsed().as_secs_f64() * 1e3;
                    tracing::debug!(dir = %dir.display(), ms, "took a snapshot of the /etc entries");
                    st.current = Some(Arc::new(snapshot));
                }
                Err(e) => {
                    tracing::warn!(
                        "cannot watch the /etc snapshot {}: {e}; binding the entries one by one",
                        dir.display()
                    );
                    st.retry_at = Some(Instant::now() + RETRY);
                    return None;
                }
            },
            // What was copied went with the failed snapshot; tried again when an entry changes.
            Err(e) => tracing::warn!(
                "cannot copy the /etc entries to {}: {e}; binding them one by one",
                dir.display()
            ),
        }
        st.watch = Some(watch);
        st.current.clone()
    }
}

struct Watch {
    inotify: Inotify,
    /// Per watched directory: the names in it that matter (`None`: all).
    names: HashMap<WatchDescriptor, Option<HashSet<OsString>>>,
}

impl Watch {
    fn new(entries: &[PathBuf]) -> io::Result<Watch> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        let mut watch = Watch { inotify, names: HashMap::new() };
        for entry in entries {
            watch.add_named(entry)?;
            // The entry itself (through symlinks): a change made through
            // another path (a bind mount over it, say) shows here too.
            match watch.inotify.add_watch(entry, Self::mask()) {
                Ok(wd) => {
                    watch.names.insert(wd, None);
                }
                Err(nix::errno::Errno::ENOENT) => {}
                Err(e) => return Err(e.into()),
            }
            let Ok(meta) = fs::symlink_metadata(entry) else { continue };
            let resolved = if meta.file_type().is_symlink() {
                match fs::canonicalize(entry) {
                    Ok(target) => {
                        watch.add_named(&target)?;
                        target
                    }
                    // A dangling link: its own directory's watch sees it change.
                    Err(_) => continue,
                }
            } else {
                entry.clone()
            };
            if resolved.is_dir() {
                match watch.add_tree(&resolved) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    other => other?,
                }
            }
        }
        Ok(watch)
    }

    fn mask() -> AddWatchFlags {
        AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF
    }

    /// Watches `path`'s directory for changes to `path` alone.
    fn add_named(&mut self, path: &Path) -> io::Result<()> {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return Ok(()) };
        let wd = self.inotify.add_watch(dir, Self::mask() | AddWatchFlags::IN_ONLYDIR)?;
        if let Some(names) = self.names.entry(wd).or_insert_with(|| Some(HashSet::new())) {
            names.insert(name.to_owned());
        }
        Ok(())
    }

    /// Watches `dir` and every directory below it that a copy would enter,
    /// for any change. (A change to one it would not enter, its mode made
    /// readable say, shows in its parent's watch.)
    fn add_tree(&mut self, dir: &Path) -> io::Result<()> {
        let flags = Self::mask() | AddWatchFlags::IN_ONLYDIR | AddWatchFlags::IN_DONT_FOLLOW;
        let wd = self.inotify.add_watch(dir, flags)?;
        self.names.insert(wd, None);
        for child in fs::read_dir(dir)? {
            let sub = match child.and_then(|c| c.metadata().map(|m| (c.path(), m))) {
                Ok((path, m)) if m.is_dir() && readable_dir(&m) => path,
                Ok(_) => continue,
                // Gone meanwhile: the parent's watch, already set, saw it go.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            match self.add_tree(&sub) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// Whether anything that matters changed since the last call.
    fn changed(&self) -> bool {
        let mut changed = false;
        loop {
            match self.inotify.read_events() {
                Ok(events) => {
                    for e in events {
                        let relevant = match (self.names.get(&e.wd), &e.name) {
                            (Some(Some(names)), Some(name)) => names.contains(name),
                            // The overflow event, a watch removed, a watched
                            // directory itself moved or deleted, any change in
                            // a copied directory.
                            _ => true,
                        };
                        changed |= relevant;
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => return changed,
                Err(e) => {
                    tracing::warn!("reading /etc change events: {e}");
                    return true;
                }
            }
        }
    }
}

/// What a copy may still take.
struct Budget {
    entries: usize,
    bytes: u64,
}

impl Budget {
    fn spend(&mut self, bytes: u64) -> io::Result<()> {
        self.entries = self.entries.checked_sub(1).ok_or_else(|| too_large("entries"))?;
        self.bytes = self.bytes.checked_sub(bytes).ok_or_else(|| too_large("bytes"))?;
        Ok(())
    }
}

fn too_large(what: &str) -> io::Error {
    io::Error::other(format!(
        "more than the {MAX_ENTRIES} entries or {MAX_BYTES} bytes a snapshot may hold ({what})"
    ))
}

/// Copies the entries into `dir`, created 0755 (it must not exist yet). On
/// failure, what was copied is removed.
fn take(entries: &[PathBuf], dir: &Path) -> io::Result<Snapshot> {
    fs::DirBuilder::new().mode(0o755).create(dir)?;
    // From here on the directory is this snapshot's, removed when it drops.
    let snapshot = Snapshot { dir: dir.to_path_buf() };
    // Whatever the umask (a unit's UMask=0077): the sandbox's uid reads it.
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    let mut budget = Budget { entries: MAX_ENTRIES, bytes: MAX_BYTES };
    for entry in entries {
        let Some(name) = entry.file_name() else { continue };
        copy(entry, &dir.join(name), true, &mut budget)?;
    }
    Ok(snapshot)
}

const OTHERS_READ: u32 = 0o004;
const OTHERS_SEARCH: u32 = 0o001;

fn readable_dir(meta: &fs::Metadata) -> bool {
    meta.mode() & (OTHERS_READ | OTHERS_SEARCH) == OTHERS_READ | OTHERS_SEARCH
}

fn copy(src: &Path, dst: &Path, top: bool, budget: &mut Budget) -> io::Result<()> {
    let meta = match if top { fs::metadata(src) } else { fs::symlink_metadata(src) } {
        Ok(m) => m,
        // An entry this host does not have, or one that vanished meanwhile
        // (its directory's watch has seen that).
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    // A top-level entry followed to a place the sandbox's uid could not
    // reach (a broker running as root reads everywhere) is left out.
    if top && crate::host::privilege::serves_others() {
        let reachable = fs::canonicalize(src).ok().and_then(|t| t.parent().map(reachable_by_others));
        if reachable != Some(true) {
            return Ok(());
        }
    }
    let kind = meta.file_type();
    if kind.is_symlink() {
        budget.spend(0)?;
        return std::os::unix::fs::symlink(fs::read_link(src)?, dst);
    }
    if kind.is_dir() {
        if !readable_dir(&meta) {
            return Ok(());
        }
        budget.spend(0)?;
        fs::DirBuilder::new().mode(0o755).create(dst)?;
        for child in fs::read_dir(src)? {
            let child = child?;
            copy(&child.path(), &dst.join(child.file_name()), false, budget)?;
        }
        // The owner (the broker) keeps rwx, so that the copy can be removed.
        fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o777 | 0o700))?;
        return set_mtime(dst, &meta);
    }
    if kind.is_file() {
        return copy_file(src, dst, top, budget);
    }
    Ok(())
}

/// Copies a regular file through one descriptor, checking what was opened
/// (not what the path named a moment before).
fn copy_file(src: &Path, dst: &Path, top: bool, budget: &mut Budget) -> io::Result<()> {
    let flags = if top { libc::O_NONBLOCK } else { libc::O_NONBLOCK | libc::O_NOFOLLOW };
    let mut from = match OpenOptions::new().read(true).custom_flags(flags).open(src) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let meta = from.metadata()?;
    if !meta.is_file() || meta.mode() & OTHERS_READ == 0 {
        return Ok(());
    }
    budget.spend(meta.len())?;
    let mut to = OpenOptions::new().write(true).create_new(true).mode(0o600).open(dst)?;
    // At most what the budget allows, even if the file grows while copied.
    let copied = io::copy(&mut io::Read::take(&mut from, meta.len()), &mut to)?;
    if copied < meta.len() {
        tracing::debug!("{} shrank while copied", src.display());
    }
    to.set_permissions(fs::Permissions::from_mode(meta.mode() & 0o777))?;
    to.set_modified(meta.modified()?)
}

fn set_mtime(path: &Path, meta: &fs::Metadata) -> io::Result<()> {
    File::open(path)?.set_modified(meta.modified()?)
}

/// Removes snapshots left under `base` by brokers no longer running (a
/// snapshot's name holds its broker's pid and start time).
fn remove_orphans(base: &Path) {
    let Ok(dir) = fs::read_dir(base) else { return };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("etc-")) else { continue };
        if !instance::alive(rest) {
            remove_tree(&entry.path());
        }
    }
}

/// Removes a snapshot, making its directories writable first if need be
/// (a copied directory may have had no write bit for its owner).
fn remove_tree(dir: &Path) {
    if fs::remove_dir_all(dir).is_ok() {
        return;
    }
    fn writable(p: &Path) {
        if let Ok(m) = fs::symlink_metadata(p) {
            if m.is_dir() {
                let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o700));
                for c in fs::read_dir(p).into_iter().flatten().flatten() {
                    writable(&c.path());
                }
            }
        }
    }
    writable(dir);
    if let Err(e) = fs::remove_dir_all(dir) {
        tracing::warn!("cannot remove the /etc snapshot {}: {e}", dir.display());
    }
}

/// Whether a process of another uid can reach `dir`: every directory on the
/// way searchable by others. A broker running as root hands the sandbox an
/// unprivileged uid, which must be able to reach the snapshot.
pub fn reachable_by_others(dir: &Path) -> bool {
    unreachable_on_the_way(dir).is_none()
}

/// The first directory on the way to `dir` (from `/`) that others cannot
/// search, with its mode (`None`: it could not be looked at).
pub fn unreachable_on_the_way(dir: &Path) -> Option<(PathBuf, Option<u32>)> {
    let mut on_the_way: Vec<&Path> = dir.ancestors().collect();
    on_the_way.reverse();
    on_the_way.into_iter().find_map(|a| match fs::metadata(a) {
        Ok(m) if m.mode() & OTHERS_SEARCH != 0 => None,
        Ok(m) => Some((a.to_path_buf(), Some(m.mode() & 0o7777))),
        Err(_) => Some((a.to_path_buf(), None)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Scratch(PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn scratch(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("palisade-etcview-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("etc")).unwrap();
        fs::create_dir_all(dir.join("base")).unwrap();
        Scratch(dir)
    }

    fn mode(p: &Path, m: u32) {
        fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
    }

    #[test]
    fn the_snapshot_holds_what_others_may_read_and_nothing_else() {
        let s = scratch("copy");
        let etc = s.0.join("etc");
        fs::write(etc.join("hosts"), "127.0.0.1 localhost\n").unwrap();
        fs::write(etc.join("secret"), "no").unwrap();
        mode(&etc.join("secret"), 0o600);
        fs::create_dir_all(etc.join("ssl/certs")).unwrap();
        fs::create_dir_all(etc.join("ssl/private")).unwrap();
        fs::write(etc.join("ssl/private/key.pem"), "key").unwrap();
        mode(&etc.join("ssl/private"), 0o710);
        fs::write(etc.join("ssl/certs/ca.pem"), "ca").unwrap();
        fs::write(etc.join("ssl/certs/setuid"), "x").unwrap();
        mode(&etc.join("ssl/certs/setuid"), 0o4755);
        fs::write(etc.join("ssl/shadowed"), "x").unwrap();
        mode(&etc.join("ssl/shadowed"), 0o640);
        std::os::unix::fs::symlink("/usr/share/ca.pem", etc.join("ssl/certs/link.pem")).unwrap();
        // A top-level symlink is followed, as a bind would follow it.
        fs::write(s.0.join("resolv.real"), "nameserver 127.0.0.53\n").unwrap();
        std::os::unix::fs::symlink(s.0.join("resolv.real"), etc.join("resolv.conf")).unwrap();
        let entries = ["hosts", "secret", "ssl", "resolv.conf", "absent"].map(|n| etc.join(n)).to_vec();

        let view = EtcView::new(s.0.join("base"), entries);
        let snap = view.current().expect("a snapshot");
        let d = snap.dir();
        assert_eq!(fs::read_to_string(d.join("hosts")).unwrap(), "127.0.0.1 localhost\n");
        assert_eq!(fs::read_to_string(d.join("resolv.conf")).unwrap(), "nameserver 127.0.0.53\n");
        assert!(!fs::symlink_metadata(d.join("resolv.conf")).unwrap().file_type().is_symlink());
        assert_eq!(fs::read_to_string(d.join("ssl/certs/ca.pem")).unwrap(), "ca");
        assert_eq!(fs::read_link(d.join("ssl/certs/link.pem")).unwrap(), Path::new("/usr/share/ca.pem"));
        assert_eq!(fs::metadata(d.join("ssl/certs/setuid")).unwrap().mode() & 0o7777, 0o755);
        for left_out in ["secret", "ssl/private", "ssl/shadowed", "absent"] {
            assert!(fs::symlink_metadata(d.join(left_out)).is_err(), "{left_out} was copied");
        }
        // The same source, with the private parts readable by others, is copied whole:
        // the test above could fail.
        mode(&etc.join("ssl/private"), 0o755);
        mode(&etc.join("secret"), 0o644);
        let again = view.current().expect("a snapshot");
        assert_eq!(fs::read_to_string(again.dir().join("ssl/private/key.pem")).unwrap(), "key");
        assert_eq!(fs::read_to_string(again.dir().join("secret")).unwrap(), "no");
    }

    #[test]
    fn a_change_gives_the_next_run_a_new_snapshot_and_the_old_one_goes_with_its_last_run() {
        let s = scratch("fresh");
        let etc = s.0.join("etc");
        fs::write(etc.join("hosts"), "one\n").unwrap();
        fs::create_dir_all(etc.join("conf.d/deep")).unwrap();
        fs::write(etc.join("conf.d/deep/a.conf"), "a\n").unwrap();
        fs::write(etc.join("unrelated"), "x\n").unwrap();
        let view = EtcView::new(s.0.join("base"), vec![etc.join("hosts"), etc.join("conf.d")]);

        let first = view.current().unwrap();
        let same = view.current().unwrap();
        assert!(Arc::ptr_eq(&first, &same), "nothing changed, the snapshot is reused");
        fs::write(etc.join("unrelated"), "y\n").unwrap();
        assert!(Arc::ptr_eq(&first, &view.current().unwrap()), "a change elsewhere in /etc does not matter");

        // A file rewritten in place, deep in a copied directory.
        fs::write(etc.join("conf.d/deep/a.conf"), "changed\n").unwrap();
        let second = view.current().unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!(fs::read_to_string(second.dir().join("conf.d/deep/a.conf")).unwrap(), "changed\n");
        // A top-level file replaced by rename, as package managers do.
        fs::write(etc.join("hosts.new"), "two\n").unwrap();
        fs::rename(etc.join("hosts.new"), etc.join("hosts")).unwrap();
        let third = view.current().unwrap();
        assert_eq!(fs::read_to_string(third.dir().join("hosts")).unwrap(), "two\n");

        // Runs still holding the first snapshot keep it; the last one removes it.
        let old = first.dir().to_path_buf();
        assert!(old.exists());
        drop((first, same));
        assert!(!old.exists(), "a snapshot no run holds is removed");
        assert!(second.dir().exists(), "a run still holds the second");
    }

    #[test]
    fn two_views_on_one_base_keep_their_own_snapshots() {
        let s = scratch("two");
        fs::write(s.0.join("etc/hosts"), "h\n").unwrap();
        let entries = vec![s.0.join("etc/hosts")];
        let (a, b) =
            (EtcView::new(s.0.join("base"), entries.clone()), EtcView::new(s.0.join("base"), entries));
        let (sa, sb) = (a.current().unwrap(), b.current().unwrap());
        assert_ne!(sa.dir(), sb.dir());
        assert!(sa.dir().join("hosts").exists() && sb.dir().join("hosts").exists());
    }

    #[test]
    fn a_copy_over_its_bounds_is_not_made() {
        let s = scratch("big");
        let etc = s.0.join("etc");
        fs::create_dir_all(etc.join("many")).unwrap();
        let mut budget = Budget { entries: 10, bytes: MAX_BYTES };
        for i in 0..20 {
            fs::write(etc.join(format!("many/{i}")), "x").unwrap();
        }
        let dst = s.0.join("base/out");
        let err = copy(&etc.join("many"), &dst, true, &mut budget).unwrap_err();
        assert!(err.to_string().contains("a snapshot may hold"), "{err}");
    }

    #[test]
    fn snapshots_of_a_broker_that_is_gone_are_removed() {
        let s = scratch("orphans");
        let base = s.0.join("base");
        let pid = std::process::id();
        // pid_max is at most 2^22: this pid is never running.
        let gone = base.join("etc-4194305-1-3");
        // An earlier process that had this pid.
        let earlier = base.join(format!("etc-{pid}-{}-1", instance::start_time(pid).unwrap() + 1));
        let mine = base.join(format!("etc-{}-999", instance::tag()));
        for d in [&gone, &earlier, &mine] {
            fs::create_dir_all(d.join("sub")).unwrap();
        }
        // One whose owner could not write to it: removable all the same.
        mode(&earlier.join("sub"), 0o555);
        mode(&earlier, 0o555);
        let _view = EtcView::new(base.clone(), vec![]);
        assert!(!gone.exists() && !earlier.exists());
        assert!(mine.exists());
    }

    #[test]
    fn a_changed_or_removed_copy_is_taken_again() {
        let s = scratch("tamper");
        let etc = s.0.join("etc");
        fs::create_dir_all(etc.join("conf.d")).unwrap();
        fs::write(etc.join("conf.d/a.conf"), "host\n").unwrap();
        fs::write(etc.join("gitconfig"), "[core]\n").unwrap();
        let view = EtcView::new(s.0.join("base"), vec![etc.join("gitconfig"), etc.join("conf.d")]);
        let first = view.current().unwrap();
        // Written to, as a run whose writes reach the copy would.
        fs::write(first.dir().join("gitconfig"), "[core]\n\tpager = evil\n").unwrap();
        let second = view.current().unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!(fs::read_to_string(second.dir().join("gitconfig")).unwrap(), "[core]\n");
        fs::write(second.dir().join("conf.d/planted"), "x").unwrap();
        let third = view.current().unwrap();
        assert!(!third.dir().join("conf.d/planted").exists());
        // Removed from outside.
        drop((first, second));
        fs::remove_dir_all(third.dir()).unwrap();
        let fourth = view.current().unwrap();
        assert_eq!(fs::read_to_string(fourth.dir().join("conf.d/a.conf")).unwrap(), "host\n");
        assert!(Arc::ptr_eq(&fourth, &view.current().unwrap()), "left alone, it is kept");
    }

    #[test]
    fn a_symlinks_target_that_appears_later_is_copied() {
        let s = scratch("dangling");
        let etc = s.0.join("etc");
        let target = s.0.join("run/resolve/stub-resolv.conf");
        std::os::unix::fs::symlink(&target, etc.join("resolv.conf")).unwrap();
        let view = EtcView::new(s.0.join("base"), vec![etc.join("resolv.conf")]);
        let before = view.current().unwrap();
        assert!(!before.dir().join("resolv.conf").exists());
        fs::create_dir_all(target.parent().unwrap()).unwrap();
        fs::write(&target, "nameserver 127.0.0.53\n").unwrap();
        let after = view.current().unwrap();
        assert_eq!(fs::read_to_string(after.dir().join("resolv.conf")).unwrap(), "nameserver 127.0.0.53\n");
    }
}
