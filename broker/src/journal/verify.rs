//! Checking a journal: every segment, every record's seq, prev and hash in
//! turn, the first broken one named by seq, file and line. Shared by
//! `palisade audit verify` and the broker's check at start-up.

use super::record::{self, GENESIS, Record};
use super::store::{self, Locked};
use std::io::BufRead;
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
/// the chain (so the journal was not cut back or rewritten before it).
pub fn verify(dir: &Path, head: Option<&str>) -> Result<Verified, Broken> {
    let broken = |file: &Path, why: String| Broken { seq: None, file: file.to_path_buf(), line: 0, why };
    // Shared with readers, exclusive of writers: no batch is seen half written.
    let lock = std::fs::File::open(dir.join(store::LOCK_FILE));
    let _locked = lock.as_ref().ok().and_then(|f| Locked::shared(f).ok());
    let segments = store::segments(dir).map_err(|e| broken(dir, format!("cannot list: {e}")))?;
    let mut walk = Walk::default();
    let count = segments.len();
    for (i, (_, path)) in segments.iter().enumerate() {
        walk.segment(path, i + 1 == count, head)?;
    }
    if let Some((seq, prev, file, line)) = walk.start.take() {
        if !walk.removals.iter().any(|(s, h)| *s + 1 == seq && *h == prev) {
            let why = format!(
                "records before seq {seq} are missing, and no retention record says they were removed"
            );
            return Err(Broken { seq: Some(seq), file, line, why });
        }
        walk.verified.removed_before = Some(seq);
    }
    if let (Some(h), false) = (head, walk.head_seen) {
        let why = format!("the kept head {h} is not in the journal: it was cut back or rewritten");
        return Err(broken(dir, why));
    }
    walk.verified.segments = count;
    walk.verified.head = walk.last;
    walk.verified.set_aside = store::set_aside_files(dir);
    Ok(walk.verified)
}

/// Verifies the newest segment alone (its records chain on one another):
/// the broker's check at start-up, bounded by the segment size.
pub fn verify_newest(dir: &Path) -> Result<(), Broken> {
    let lock = std::fs::File::open(dir.join(store::LOCK_FILE));
    let _locked = lock.as_ref().ok().and_then(|f| Locked::shared(f).ok());
    let segments = store::segments(dir).map_err(|e| Broken {
        seq: None,
        file: dir.to_path_buf(),
        line: 0,
        why: format!("cannot list: {e}"),
    })?;
    match segments.last() {
        Some((_, newest)) => Walk::default().segment(newest, true, None),
        None => Ok(()),
    }
}

impl Walk {
    /// Checks one segment's records in turn.
    fn segment(&mut self, path: &Path, newest: bool, head: Option<&str>) -> Result<(), Broken> {
        let file = std::fs::File::open(path).map_err(|e| Broken {
            seq: None,
            file: path.to_path_buf(),
            line: 0,
            why: format!("cannot open: {e}"),
        })?;
        let mut reader = std::io::BufReader::new(file);
        let mut line = Vec::new();
        for n in 1u64.. {
            line.clear();
            let read = reader.read_until(b'\n', &mut line).map_err(|e| Broken {
                seq: None,
                file: path.to_path_buf(),
                line: n,
                why: format!("cannot read: {e}"),
            })?;
            if read == 0 {
                break;
            }
            let at = |seq: Option<u64>, why: String| Broken { seq, file: path.to_path_buf(), line: n, why };
            if line.last() != Some(&b'\n') {
                if newest {
                    self.verified.torn_tail = Some((path.to_path_buf(), line.len() as u64));
                    break;
                }
                return Err(at(None, "an incomplete line in a segment that is not the last".into()));
            }
            let record = record::parse(&line[..line.len() - 1]).map_err(|why| at(None, why))?;
            self.record(&record).map_err(|why| at(Some(record.seq), why))?;
            if head == Some(record.hash.as_str()) {
                self.head_seen = true;
            }
            if self.start.is_none() && self.verified.records == 1 && record.seq != 1 {
                self.start = Some((record.seq, record.prev.clone(), path.to_path_buf(), n));
            }
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
    let segments = store::segments(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    for (_, path) in segments.iter().rev() {
        let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let len = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?.len();
        let whole = store::whole_len(&mut file, len).map_err(|e| format!("{}: {e}", path.display()))?;
        if let Some(line) =
            store::last_line(&mut file, whole).map_err(|e| format!("{}: {e}", path.display()))?
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
    let segments = store::segments(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut all = Vec::new();
    for (_, path) in segments {
        let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for line in text.split_inclusive(|b| *b == b'\n').filter(|l| l.ends_with(b"\n")) {
            if let Ok(r) = record::parse(&line[..line.len() - 1]) {
                all.push((path.clone(), r));
            }
        }
    }
    Ok(all)
}
