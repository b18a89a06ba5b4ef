//! Checking a journal: every segment, every record's seq, prev and hash in
//! turn, the first broken one named by seq, file and line. Shared by
//! `palisade audit verify` and the broker's check at start-up.

use super::record::{self, GENESIS, Record};
use super::segment;
use super::store::{self, Locked};
use std::path::{Path, PathBuf};

/// A journal that verified.
#[derive(Debug, Default, serde::Serialize)]
pub struct Verified {
    pub records: u64,
    pub segments: usize,
    /// The last record's seq and hash (none in an empty journal).
    pub head: Option<(u64, String)>,
    /// Records before this seq were removed by retention (a record says so).
    pub removed_before: Option<u64>,
    /// Records before this seq are missing and no record says retention
    /// removed them: accepted only when told that removal is expected.
    pub pruned_before: Option<u64>,
    /// Torn lines set aside by a writer that found them.
    pub set_aside: Vec<PathBuf>,
    /// A last line not yet whole (a writer killed mid-write; the next one sets it aside).
    pub torn_tail: Option<(PathBuf, u64)>,
}

/// The first record where the chain breaks.
#[derive(Debug, serde::Serialize)]
pub struct Broken {
    pub seq: Option<u64>,
    pub file: PathBuf,
    /// 1-based line in `file`.
    pub line: u64,
    pub why: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let seq = self.seq.map_or("?".to_string(), |s| s.to_string());
        write!(f, "record seq {seq} ({}, line {}): {}", self.file.display(), self.line, self.why)
    }
}

/// Why a journal does not verify (each with its exit status in `palisade audit verify`).
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// A record does not chain on the one before it.
    Broken(Broken),
    /// The chain starts after seq 1, and no record in it says that
    /// retention removed what came before: records were removed otherwise.
    Pruned { first_seq: u64, file: PathBuf },
    /// The head kept elsewhere is not in the chain: the journal was cut back
    /// (or rewritten) since it was kept.
    HeadMissing { head: String, last: Option<(u64, String)> },
    /// The journal, or a segment, is there but cannot be read (by this user:
    /// `why` names the permission that refuses it): nothing is known of
    /// its chain.
    Unreadable { path: PathBuf, why: String },
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Broken(b) => write!(f, "broken: {b}"),
            Failure::Pruned { first_seq, file } => write!(
                f,
                "pruned: the chain starts at seq {first_seq} ({}), and no record in it says that \
                 retention removed the records before (--allow-pruned accepts that)",
                file.display()
            ),
            Failure::HeadMissing { head, last } => {
                let last = last.as_ref().map_or("none".to_string(), |(seq, hash)| format!("{seq} {hash}"));
                write!(
                    f,
                    "head missing: the kept head {head} is not in the journal (its head is {last}): \
                     it was cut back or rewritten"
                )
            }
            Failure::Unreadable { path, why } => write!(f, "cannot read: {}: {why}", path.display()),
        }
    }
}

impl From<Broken> for Failure {
    fn from(b: Broken) -> Failure {
        Failure::Broken(b)
    }
}

/// Where the walk through the chain is.
#[derive(Default)]
struct Walk {
    last: Option<(u64, String)>,
    /// The first record seen, when it is not seq 1: what retention must account for.
    start: Option<(u64, String, PathBuf, u64)>,
    /// (last_seq, last_hash) of every retention record.
    removals: Vec<(u64, String)>,
    /// Whether the kept head was met.
    head_seen: bool,
    verified: Verified,
}

/// Verifies the journal in `dir`; `head`, a hash kept elsewhere, must be in
/// the chain (so the journal was not cut back or rewritten before it). A
/// chain that starts after seq 1 must follow the end of what a retention
/// record in it names, unless `allow_pruned`.
pub fn verify(dir: &Path, head: Option<&str>, allow_pruned: bool) -> Result<Verified, Failure> {
    let unreadable = |path: &Path, e: std::io::Error| Failure::Unreadable {
        path: path.to_path_buf(),
        why: why_unreadable(path, &e),
    };
    // Shared with readers, exclusive of writers: no batch is seen half written.
    let lock = std::fs::File::open(dir.join(store::LOCK_FILE));
    let _locked = lock.as_ref().ok().and_then(|f| Locked::shared(f).ok());
    let segments = segment::segments(dir).map_err(|e| unreadable(dir, e))?;
    let mut walk = Walk::default();
    let count = segments.len();
    for (i, (_, path)) in segments.iter().enumerate() {
        let data = std::fs::read(path).map_err(|e| unreadable(path, e))?;
        walk.segment(path, &data, i + 1 == count, head)?;
    }
    if let (Some(h), false) = (head, walk.head_seen) {
        return Err(Failure::HeadMissing { head: h.to_string(), last: walk.last });
    }
    if let Some((seq, prev, file, _)) = walk.start.take() {
        if walk.removals.iter().any(|(s, h)| *s + 1 == seq && *h == prev) {
            walk.verified.removed_before = Some(seq);
        } else if allow_pruned {
            walk.verified.pruned_before = Some(seq);
        } else {
            return Err(Failure::Pruned { first_seq: seq, file });
        }
    }
    walk.verified.segments = count;
    walk.verified.head = walk.last;
    walk.verified.set_aside = segment::set_aside_files(dir);
    Ok(walk.verified)
}

/// Verifies the newest segment alone (its records chain on one another):
/// the broker's check at start-up, bounded by the segment size.
pub fn verify_newest(dir: &Path) -> Result<(), Broken> {
    let lock = std::fs::File::open(dir.join(store::LOCK_FILE));
    let _locked = lock.as_ref().ok().and_then(|f| Locked::shared(f).ok());
    let segments = segment::segments(dir).map_err(|e| Broken {
        seq: None,
        file: dir.to_path_buf(),
        line: 0,
        why: format!("cannot list: {e}"),
    })?;
    let Some((_, newest)) = segments.last() else { return Ok(()) };
    let data = std::fs::read(newest).map_err(|e| Broken {
        seq: None,
        file: newest.clone(),
        line: 0,
        why: format!("cannot read: {e}"),
    })?;
    Walk::default().segment(newest, &data, true, None)
}

/// This process's groups: its effective gid, then its supplementary groups
/// (Linux; macOS has no list to ask for).
fn own_groups() -> Vec<u32> {
    let mut groups = vec![nix::unistd::getegid().as_raw()];
    #[cfg(target_os = "linux")]
    groups.extend(nix::unistd::getgroups().unwrap_or_default().iter().map(|g| g.as_raw()));
    let mut seen = std::collections::HashSet::new();
    groups.retain(|g| seen.insert(*g));
    groups
}

/// Why `path` cannot be read, for people. A permission refused names the
/// directory on the way (or the file) that refuses this user, with its
/// mode, owner and group, and who may read the journal.
pub fn why_unreadable(path: &Path, e: &std::io::Error) -> String {
    use nix::unistd::{AccessFlags, access};
    use std::os::unix::fs::MetadataExt;
    if e.kind() != std::io::ErrorKind::PermissionDenied {
        return e.to_string();
    }
    let mut on_the_way: Vec<&Path> = path.ancestors().skip(1).collect();
    on_the_way.reverse();
    let searched = on_the_way.into_iter().find(|d| access(*d, AccessFlags::X_OK).is_err());
    let (refuses, what) = match searched {
        Some(d) => (d, "search"),
        None => (path, if path.is_dir() { "list" } else { "read" }),
    };
    let held = match std::fs::metadata(refuses) {
        Ok(m) => format!(" (mode {:04o}, owner uid {}, group gid {})", m.mode() & 0o7777, m.uid(), m.gid()),
        Err(_) => String::new(),
    };
    let groups: Vec<String> = own_groups().iter().map(u32::to_string).collect();
    format!(
        "{e}: uid {} (groups {}) may not {what} {}{held}; the journal's readers are the members of the \
         group [journal] reader_gid names: ask its administrator to add you to it",
        nix::unistd::geteuid(),
        groups.join(", "),
        refuses.display()
    )
}

impl Walk {
    /// Checks one segment's records in turn: they end at its first zero
    /// byte, and only zeros (the space reserved ahead) may follow.
    fn segment(&mut self, path: &Path, data: &[u8], newest: bool, head: Option<&str>) -> Result<(), Broken> {
        let at =
            |seq: Option<u64>, line: u64, why: String| Broken { seq, file: path.to_path_buf(), line, why };
        let content = data.iter().position(|b| *b == 0).unwrap_or(data.len());
        let whole = data[..content].iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let lines =
            data[..whole].split(|b| *b == b'\n').take(data[..whole].iter().filter(|b| **b == b'\n').count());
        let mut n = 0u64;
        for line in lines {
            n += 1;
            let record = record::parse(line).map_err(|why| at(None, n, why))?;
            self.record(&record).map_err(|why| at(Some(record.seq), n, why))?;
            if head == Some(record.hash.as_str()) {
                self.head_seen = true;
            }
            if self.start.is_none() && self.verified.records == 1 && record.seq != 1 {
                self.start = Some((record.seq, record.prev.clone(), path.to_path_buf(), n));
            }
        }
        if data[content..].iter().any(|b| *b != 0) {
            return Err(at(
                None,
                n + 1,
                "bytes after the end of the records (a zero byte among them)".into(),
            ));
        }
        if whole < content {
            if !newest {
                return Err(at(None, n + 1, "an incomplete line in a segment that is not the last".into()));
            }
            self.verified.torn_tail = Some((path.to_path_buf(), (content - whole) as u64));
        }
        Ok(())
    }

    /// Checks that `record` follows the last one and that its hash is its own.
    fn record(&mut self, record: &Record) -> Result<(), String> {
        match &self.last {
            Some((seq, hash)) => {
                if record.seq != seq + 1 {
                    return Err(format!("seq {} follows seq {seq}", record.seq));
                }
                if &record.prev != hash {
                    return Err(format!("prev {} is not the hash of seq {seq}", record.prev));
                }
            }
            None if record.seq == 1 && record.prev != GENESIS => {
                return Err("the first record's prev is not 64 zeros".into());
            }
            None => {}
        }
        let computed = record::chain_hash(&record.prev, &record.fields).ok_or("prev is not a sha256")?;
        if computed != record.hash {
            return Err(format!("hash {} is not the record's own ({computed})", record.hash));
        }
        if record.event() == "segments_removed" {
            let last_seq = record.fields.get("last_seq").and_then(|v| v.as_u64());
            let last_hash = record.fields.get("last_hash").and_then(|v| v.as_str());
            if let (Some(s), Some(h)) = (last_seq, last_hash) {
                self.removals.push((s, h.to_string()));
            }
        }
        self.last = Some((record.seq, record.hash.clone()));
        self.verified.records += 1;
        Ok(())
    }
}

/// The journal's last whole record (none when it is empty).
pub fn head(dir: &Path) -> Result<Option<Record>, String> {
    let segments = segment::segments(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    for (_, path) in segments.iter().rev() {
        let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let len = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?.len();
        let content = segment::content_len(&file, len).map_err(|e| format!("{}: {e}", path.display()))?;
        let whole = segment::whole_len(&mut file, content).map_err(|e| format!("{}: {e}", path.display()))?;
        if let Some(line) =
            segment::last_line(&mut file, whole).map_err(|e| format!("{}: {e}", path.display()))?
        {
            return record::parse(&line)
                .map(Some)
                .map_err(|e| format!("{}: the last record: {e}", path.display()));
        }
    }
    Ok(None)
}

/// Every record of the journal in order (whole lines that parse), for
/// `audit show` and `audit tail`.
pub fn records(dir: &Path) -> Result<Vec<(PathBuf, Record)>, String> {
    let segments = segment::segments(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut all = Vec::new();
    for (_, path) in segments {
        let mut text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        text.truncate(text.iter().position(|b| *b == 0).unwrap_or(text.len()));
        for line in text.split_inclusive(|b| *b == b'\n').filter(|l| l.ends_with(b"\n")) {
            if let Ok(r) = record::parse(&line[..line.len() - 1]) {
                all.push((path.clone(), r));
            }
        }
    }
    Ok(all)
}
