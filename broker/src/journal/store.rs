//! The journal's files: a directory of segments (`segment-<first seq>.jsonl`),
//! the lock that keeps its writers one at a time, and what one writer does
//! under it: catch up with what others appended, set aside a torn last line,
//! rotate, apply retention, write, sync, and cut back what it could not
//! write whole.
//!
//! A segment being written ends in zeros, space reserved ahead of its
//! records: a record written there changes no file size, so its sync
//! commits no metadata. (On ext4, syncing a write that extends a file costs
//! a journal commit, milliseconds; one that overwrites, a tenth of one.) Its
//! records end at its first zero byte; a closed segment is cut to its records.

use super::JournalError;
use super::record::{self, Entry, GENESIS};
use super::segment::{
    SEGMENT_PREFIX, SEGMENT_SUFFIX, SET_ASIDE_MARK, TAIL_CHUNK, content_len, last_line, segments, whole_len,
};
use serde_json::Value;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The lock file every writer holds while it appends (and verify shares).
pub const LOCK_FILE: &str = "lock";
/// Zeros reserved ahead of the records at a time (at most a segment's size):
/// one metadata commit per this many bytes of records.
const RESERVE_BYTES: u64 = 1 << 20;

/// How the journal's files are kept.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A segment that reached this size is closed; the next record starts a new one.
    pub segment_bytes: u64,
    /// Days a segment's records are kept: when one is closed, the oldest
    /// whose records are all older go; `None`: every segment is kept.
    pub keep_days: Option<u32>,
    /// The group that may read the journal (directory 0750, files 0640).
    pub reader_gid: Option<u32>,
}

/// The last record written: where the next one chains on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub seq: u64,
    pub hash: String,
}

/// The segment being written, as this process last saw it.
struct Segment {
    path: PathBuf,
    file: File,
    /// Bytes of whole records.
    len: u64,
    /// The file's size: the records, then zeros.
    size: u64,
}

/// One writer's view of the journal directory.
pub struct Store {
    dir: PathBuf,
    settings: Settings,
    lock: std::sync::Arc<File>,
    head: Head,
    segment: Option<Segment>,
}

fn io_error(path: &Path, what: &str, e: std::io::Error) -> JournalError {
    JournalError::Io(format!("{what} {}: {e}", path.display()))
}

/// Writes zeros over `from..to` of `file` (extending it when `to` is past its end).
fn zero(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    let zeros = vec![0u8; TAIL_CHUNK as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(TAIL_CHUNK) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

impl Store {
    /// Opens (creating) the journal in `dir`; its directory must be the
    /// broker's own (see `crate::host::paths::check_private`).
    pub fn open(dir: &Path, settings: Settings) -> Result<Store, JournalError> {
        make_dir(dir, settings.reader_gid)?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(file_mode(settings.reader_gid))
            .open(&lock_path)
            .map_err(|e| io_error(&lock_path, "cannot open", e))?;
        if let Some(gid) = settings.reader_gid {
            // The readers take the lock too (shared), and read every segment,
            // those made before reader_gid was set or under another umask included.
            give_readers(&lock, gid).map_err(|e| io_error(&lock_path, "cannot give the readers", e))?;
            for (_, path) in segments(dir).map_err(|e| io_error(dir, "cannot list", e))? {
                let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC;
                let file = File::options().read(true).custom_flags(flags).open(&path);
                file.and_then(|f| give_readers(&f, gid))
                    .map_err(|e| io_error(&path, "cannot give the readers", e))?;
            }
        }
        let head = Head { seq: 0, hash: GENESIS.into() };
        Ok(Store { dir: dir.to_path_buf(), settings, lock: std::sync::Arc::new(lock), head, segment: None })
    }

    /// The journal's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bytes free on the journal's filesystem for an unprivileged writer
    /// (what root keeps for itself not counted).
    pub fn free_bytes(&self) -> std::io::Result<u64> {
        let fs = nix::sys::statvfs::statvfs(&self.dir).map_err(std::io::Error::from)?;
        Ok((fs.blocks_available() as u64).saturating_mul(fs.fragment_size() as u64))
    }

    /// Writes `entries` as one batch, synced to disk when `durable`, with
    /// whatever the journal's upkeep adds in front of them; the receipts of
    /// the answered ones, in order.
    pub fn append(&mut self, entries: Vec<Entry>, durable: bool) -> Result<Vec<Head>, JournalError> {
        let lock = self.lock.clone();
        let _lock = Locked::exclusive(&lock).map_err(|e| io_error(&self.dir, "cannot lock", e))?;
        let mut batch = self.catch_up()?;
        let removed = self.rotate_if_full(&mut batch)?;
        batch.extend(entries);
        let receipts = self.write(batch, durable || !removed.is_empty())?;
        if !removed.is_empty() {
            for path in &removed {
                if let Err(e) = std::fs::remove_file(path) {
                    tracing::warn!("journal retention: cannot remove {}: {e}", path.display());
                }
            }
            if let Err(e) = sync_dir(&self.dir) {
                tracing::warn!("journal: cannot sync {}: {e}", self.dir.display());
            }
        }
        Ok(receipts)
    }

    /// Brings this process's view up to what is on disk (another broker may
    /// have appended since): the newest segment, its last whole record, and
    /// a torn last line set aside (the returned entries record that).
    fn catch_up(&mut self) -> Result<Vec<Entry>, JournalError> {
        let all = segments(&self.dir).map_err(|e| io_error(&self.dir, "cannot list", e))?;
        let Some((_, newest)) = all.last() else {
            self.segment = None;
            self.head = Head { seq: 0, hash: GENESIS.into() };
            return Ok(vec![]);
        };
        let size = std::fs::metadata(newest).map_err(|e| io_error(newest, "cannot stat", e))?.len();
        if self.segment.as_ref().is_some_and(|s| &s.path == newest && s.size == size && !appended_since(s)) {
            return Ok(vec![]);
        }
        let mut file = open_segment(newest, false, self.settings.reader_gid)?;
        let content = content_len(&file, size).map_err(|e| io_error(newest, "cannot read", e))?;
        let whole = whole_len(&mut file, content).map_err(|e| io_error(newest, "cannot read", e))?;
        let mut upkeep = vec![];
        if whole < content {
            upkeep.push(set_aside(&mut file, newest, whole, content)?);
        }
        self.head = Self::head_of(&all, newest, &mut file, whole)?;
        self.segment = Some(Segment { path: newest.clone(), file, len: whole, size });
        Ok(upkeep)
    }

    /// The last record of the journal: in the newest segment, or (when that
    /// is still empty) in the one before.
    fn head_of(
        all: &[(u64, PathBuf)],
        newest: &Path,
        file: &mut File,
        len: u64,
    ) -> Result<Head, JournalError> {
        let line = match last_line(file, len).map_err(|e| io_error(newest, "cannot read", e))? {
            Some(line) => Some((line, newest.to_path_buf())),
            None if all.len() > 1 => {
                let before = &all[all.len() - 2].1;
                let mut f = File::open(before).map_err(|e| io_error(before, "cannot open", e))?;
                let size = f.metadata().map_err(|e| io_error(before, "cannot stat", e))?.len();
                // Zeros a crash left before the segment was closed are not records.
                let l = content_len(&f, size)
                    .and_then(|c| whole_len(&mut f, c))
                    .map_err(|e| io_error(before, "cannot read", e))?;
                last_line(&mut f, l)
                    .map_err(|e| io_error(before, "cannot read", e))?
                    .map(|x| (x, before.clone()))
            }
            None => None,
        };
        let Some((line, path)) = line else { return Ok(Head { seq: 0, hash: GENESIS.into() }) };
        let last = record::parse(&line).map_err(|e| {
            JournalError::Damaged(format!(
                "the last record of {} is not one ({e}); see `palisade audit verify`",
                path.display()
            ))
        })?;
        Ok(Head { seq: last.seq, hash: last.hash })
    }

    /// Starts a new segment when the current one is full, and applies
    /// retention; the segments to remove once the batch (which records
    /// their removal) is on disk.
    fn rotate_if_full(&mut self, batch: &mut Vec<Entry>) -> Result<Vec<PathBuf>, JournalError> {
        let full = self.segment.as_ref().is_none_or(|s| s.len >= self.settings.segment_bytes && s.len > 0);
        if !full {
            return Ok(vec![]);
        }
        if let Some(closed) = &self.segment {
            // A closed segment keeps its records only; zeros left (a crash) are read as its end.
            if let Err(e) = closed.file.set_len(closed.len) {
                tracing::warn!("journal: cannot cut {} to its records: {e}", closed.path.display());
            }
            // The head, where the journal is not: a journal cut back later is caught against it.
            let name = closed.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            tracing::info!("journal head {} {} ({name} closed)", self.head.seq, self.head.hash);
        }
        let path = self.dir.join(format!("{SEGMENT_PREFIX}{:020}{SEGMENT_SUFFIX}", self.head.seq + 1));
        let file = open_segment(&path, true, self.settings.reader_gid)?;
        sync_dir(&self.dir).map_err(|e| io_error(&self.dir, "cannot sync", e))?;
        self.segment = Some(Segment { path, file, len: 0, size: 0 });
        let Some(days) = self.settings.keep_days else { return Ok(vec![]) };
        super::retention::plan(&self.dir, days, std::time::SystemTime::now(), batch)
    }

    /// Seals and writes `batch` at the end of the segment; on any failure
    /// the segment is cut back to where it was, so the chain stays whole.
    fn write(&mut self, batch: Vec<Entry>, durable: bool) -> Result<Vec<Head>, JournalError> {
        let Some(segment) = self.segment.as_mut() else {
            return Err(JournalError::Io("no segment to write to".into()));
        };
        let mut bytes = Vec::with_capacity(batch.len() * 512);
        let mut head = self.head.clone();
        let mut receipts = Vec::new();
        let since_epoch =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let time = record::rfc3339(since_epoch);
        for entry in batch {
            let mut fields = entry.fields;
            fields.insert("seq".into(), Value::from(head.seq + 1));
            fields.insert("time".into(), Value::from(time.clone()));
            fields.insert("prev".into(), Value::from(head.hash.clone()));
            fields.insert("broker".into(), Value::from(crate::host::instance::tag()));
            let (line, hash) =
                record::seal(fields).ok_or_else(|| JournalError::Damaged("bad head".into()))?;
            bytes.extend_from_slice(&line);
            head = Head { seq: head.seq + 1, hash };
            if entry.answered {
                receipts.push(head.clone());
            }
        }
        let end = segment.len + bytes.len() as u64;
        let room = reserve(segment, end, self.settings.segment_bytes);
        let written =
            room.and_then(|()| segment.file.write_all_at(&bytes, segment.len)).and_then(|()| match durable {
                true => nix::unistd::fdatasync(&segment.file).map_err(std::io::Error::from),
                false => Ok(()),
            });
        if let Err(e) = written {
            // Nothing of the batch stays: a later batch chains on the last whole record.
            cut_back(segment, end);
            return Err(io_error(&segment.path, "cannot write to", e));
        }
        segment.len += bytes.len() as u64;
        self.head = head;
        Ok(receipts)
    }
}

/// Whether another writer wrote a record where this one's view of `segment` ends.
fn appended_since(segment: &Segment) -> bool {
    let mut byte = [0u8; 1];
    segment.len < segment.size
        && segment.file.read_exact_at(&mut byte, segment.len).map_or(true, |()| byte[0] != 0)
}

/// Makes `segment` at least `end` bytes long, with zeros reserved beyond
/// (fewer when the filesystem has no room for them).
fn reserve(segment: &mut Segment, end: u64, segment_bytes: u64) -> std::io::Result<()> {
    if end <= segment.size {
        return Ok(());
    }
    let ahead = end + RESERVE_BYTES.min(segment_bytes);
    for target in [ahead, end] {
        match zero(&segment.file, segment.size, target) {
            Ok(()) => {
                segment.size = target;
                return Ok(());
            }
            Err(e) => {
                let _ = segment.file.set_len(segment.size);
                if target == end {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Undoes a batch that could not be written whole: zeros again up to `end`,
/// or (when even that fails) the file cut to its last whole record.
fn cut_back(segment: &mut Segment, end: u64) {
    let zeroed = zero(&segment.file, segment.len, end.min(segment.size));
    if zeroed.is_err() || segment.size < end {
        if let Err(cut) = segment.file.set_len(segment.len) {
            tracing::error!("journal: cannot cut {} back: {cut}", segment.path.display());
        }
        segment.size = segment.len;
    }
}

/// Moves the bytes of `file` after `whole` (a torn last line) into a file of
/// their own next to it and cuts the segment back; the entry recording it.
fn set_aside(file: &mut File, path: &Path, whole: u64, len: u64) -> Result<Entry, JournalError> {
    let mut torn = vec![0u8; (len - whole) as usize];
    file.seek(SeekFrom::Start(whole))
        .and_then(|_| file.read_exact(&mut torn))
        .map_err(|e| io_error(path, "cannot read", e))?;
    let stamp =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let aside = PathBuf::from(format!("{}{SET_ASIDE_MARK}{stamp}", path.display()));
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&aside)
        .map_err(|e| io_error(&aside, "cannot create", e))?;
    out.write_all(&torn).and_then(|()| out.sync_all()).map_err(|e| io_error(&aside, "cannot write", e))?;
    zero(file, whole, len)
        .and_then(|()| file.sync_data())
        .map_err(|e| io_error(path, "cannot cut back", e))?;
    let sha256 = crate::journal::attest::sha256_hex(&torn);
    let file_name = aside.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    tracing::warn!(
        "journal: a torn last line of {} ({} bytes) was set aside in {file_name}",
        path.display(),
        torn.len()
    );
    let event = super::Event::TailSetAside { file: file_name, bytes: torn.len() as u64, sha256 };
    Ok(Entry { fields: super::fields(&event), answered: false })
}

/// Opens a segment for appending (and reading its tail); `create` makes a new one.
fn open_segment(path: &Path, create: bool, reader_gid: Option<u32>) -> Result<File, JournalError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(create)
        .mode(file_mode(reader_gid))
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| io_error(path, "cannot open", e))?;
    if let (true, Some(gid)) = (create, reader_gid) {
        give_readers(&file, gid).map_err(|e| io_error(path, "cannot give the readers", e))?;
    }
    Ok(file)
}

fn file_mode(reader_gid: Option<u32>) -> u32 {
    if reader_gid.is_some() { 0o640 } else { 0o600 }
}

/// Makes `file` readable by the readers' group `gid` (0640, its group
/// `gid`), set explicitly: a umask (the unit's `UMask=0077`) takes the
/// group's read from the mode it was created with.
fn give_readers(file: &File, gid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = file.metadata()?;
    if meta.gid() != gid {
        std::os::unix::fs::fchown(file, None, Some(gid))?;
    }
    if meta.mode() & 0o7777 != 0o640 {
        file.set_permissions(std::fs::Permissions::from_mode(0o640))?;
    }
    Ok(())
}

/// Creates the journal's directory (0700, or 0750 for its readers' group)
/// and checks it is the broker's alone.
fn make_dir(dir: &Path, reader_gid: Option<u32>) -> Result<(), JournalError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let mode = if reader_gid.is_some() { 0o750 } else { 0o700 };
    // Directories made on the way: searchable by the readers when there are
    // some (not listable), else the broker's alone.
    let ancestors = if reader_gid.is_some() { 0o711 } else { 0o700 };
    if let Some(parent) = dir.parent() {
        crate::host::paths::create_dirs(parent, ancestors)
            .map_err(|e| io_error(parent, "cannot create", e))?;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io_error(dir, "cannot create", e))?;
    crate::host::paths::check_private(dir).map_err(JournalError::Setup)?;
    let meta = std::fs::metadata(dir).map_err(|e| io_error(dir, "cannot stat", e))?;
    if let Some(gid) = reader_gid.filter(|g| *g != meta.gid()) {
        std::os::unix::fs::chown(dir, None, Some(gid))
            .map_err(|e| io_error(dir, "cannot give the group", e))?;
    }
    if meta.mode() & 0o777 != mode {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io_error(dir, "cannot chmod", e))?;
    }
    match reader_gid {
        Some(gid) => let_readers_through(dir, gid),
        None => Ok(()),
    }
}

/// The broker's state directory the journal lies in (the system unit's
/// `StateDirectory=`, made 0700), and those between it and the journal:
/// searchable by the readers' group `gid`. One others may search is left
/// as it is; another becomes the group's, with search only (no listing:
/// the trust stages, change sets and secrets beside the journal keep their
/// own modes, 0600 and 0700). Only the broker's own directories change.
fn let_readers_through(dir: &Path, gid: u32) -> Result<(), JournalError> {
    use std::os::unix::fs::PermissionsExt;
    let Ok(state) = crate::host::paths::default_state_dir() else { return Ok(()) };
    let (state, dir) =
        (crate::host::paths::canonical_prefix(&state), crate::host::paths::canonical_prefix(dir));
    let me = nix::unistd::geteuid().as_raw();
    for on_the_way in dir.ancestors().skip(1).take_while(|a| a.starts_with(&state)) {
        let meta = std::fs::metadata(on_the_way).map_err(|e| io_error(on_the_way, "cannot stat", e))?;
        let searchable = meta.mode() & 0o001 != 0 || (meta.gid() == gid && meta.mode() & 0o010 != 0);
        if searchable || meta.uid() != me {
            continue;
        }
        // Another group's bits are not carried over to the readers'.
        let mut mode = meta.mode() & 0o7777 | 0o010;
        if meta.gid() != gid {
            std::os::unix::fs::chown(on_the_way, None, Some(gid))
                .map_err(|e| io_error(on_the_way, "cannot give the readers", e))?;
            mode = mode & !0o070 | 0o010;
        }
        std::fs::set_permissions(on_the_way, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io_error(on_the_way, "cannot chmod", e))?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// An flock held until dropped.
pub struct Locked<'a>(&'a File);

impl<'a> Locked<'a> {
    pub fn exclusive(file: &'a File) -> std::io::Result<Locked<'a>> {
        Self::take(file, libc::LOCK_EX)
    }

    pub fn shared(file: &'a File) -> std::io::Result<Locked<'a>> {
        Self::take(file, libc::LOCK_SH)
    }

    fn take(file: &'a File, how: libc::c_int) -> std::io::Result<Locked<'a>> {
        loop {
            // SAFETY: the descriptor is open for as long as `file` is borrowed.
            if unsafe { libc::flock(file.as_raw_fd(), how) } == 0 {
                return Ok(Locked(file));
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // SAFETY: as in `take`; unlocking cannot fail on an open descriptor we locked.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use super::super::segment::set_aside_files;
    use super::*;

    fn entry(n: u64) -> Entry {
        let event = super::super::Event::BrokerStopped { pid: n as u32 };
        Entry { fields: super::super::fields(&event), answered: true }
    }

    fn settings(segment_bytes: u64) -> Settings {
        Settings { segment_bytes, keep_days: None, reader_gid: None }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("palisade-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn two_writers_on_one_directory_keep_one_chain_across_segments() {
        let dir = scratch("two");
        let mut a = Store::open(&dir, settings(4096)).unwrap();
        let mut b = Store::open(&dir, settings(4096)).unwrap();
        let mut seqs = Vec::new();
        for n in 0..40 {
            let writer = if n % 3 == 0 { &mut a } else { &mut b };
            let got = writer.append(vec![entry(n), entry(n)], n % 2 == 0).unwrap();
            seqs.extend(got.iter().map(|h| h.seq));
        }
        assert_eq!(seqs, (1..=80).collect::<Vec<u64>>());
        let verified = super::super::verify::verify(&dir, None, false).unwrap();
        assert_eq!(verified.records, 80);
        assert!(verified.segments > 2, "{} segments", verified.segments);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_new_segment_left_empty_chains_on_the_records_before_the_zeros_of_the_last() {
        let dir = scratch("empty");
        let mut a = Store::open(&dir, settings(1 << 20)).unwrap();
        a.append(vec![entry(1)], true).unwrap();
        let (_, first) = segments(&dir).unwrap().pop().unwrap();
        assert!(std::fs::metadata(&first).unwrap().len() > content(&first), "no zeros reserved");
        // A writer that died right after starting the next segment.
        std::fs::write(dir.join(format!("{SEGMENT_PREFIX}{:020}{SEGMENT_SUFFIX}", 2)), b"").unwrap();
        let mut b = Store::open(&dir, settings(1 << 20)).unwrap();
        assert_eq!(b.append(vec![entry(2)], true).unwrap()[0].seq, 2);
        assert_eq!(super::super::verify::verify(&dir, None, false).unwrap().records, 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn content(path: &Path) -> u64 {
        let file = File::open(path).unwrap();
        content_len(&file, file.metadata().unwrap().len()).unwrap()
    }

    #[test]
    fn a_torn_line_left_by_another_writer_is_set_aside_before_the_next_batch() {
        let dir = scratch("torn");
        let mut a = Store::open(&dir, settings(1 << 20)).unwrap();
        a.append(vec![entry(1)], true).unwrap();
        let (_, segment) = segments(&dir).unwrap().pop().unwrap();
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&segment).unwrap();
        let end = content_len(&file, file.metadata().unwrap().len()).unwrap();
        file.write_all_at(b"{\"half", end).unwrap();
        let mut b = Store::open(&dir, settings(1 << 20)).unwrap();
        let got = b.append(vec![entry(2)], true).unwrap();
        // The set-aside record is seq 2, the entry seq 3.
        assert_eq!(got.iter().map(|h| h.seq).collect::<Vec<_>>(), [3]);
        assert_eq!(set_aside_files(&dir).len(), 1);
        assert_eq!(std::fs::read(&set_aside_files(&dir)[0]).unwrap(), b"{\"half");
        // The first writer catches up with both.
        assert_eq!(a.append(vec![entry(3)], true).unwrap()[0].seq, 4);
        assert_eq!(super::super::verify::verify(&dir, None, false).unwrap().records, 4);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
