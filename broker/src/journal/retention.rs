//! Retention, by age: when a segment is closed and `keep_days` is set, the
//! oldest segments whose records are all older than that go, and a record
//! says which files, the seqs they held and the hash they ended at, so that
//! `audit verify` still accepts the chain that remains. By age and never by
//! volume: however much one requester makes the broker write, it cannot
//! push a record out before its time (it meets the free-space floor).

use super::record::Entry;
use super::record::{self, Record};
use super::segment::{content_len, last_line, segments, whole_len};
use super::{Event, JournalError};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Seconds in a day.
const DAY_SECS: u64 = 86_400;

/// The oldest segments of `dir` whose last record is older than `days`
/// before `now` (never the newest, the one just started): the record of
/// their removal goes into `batch`, and they are returned to be removed
/// once it is on disk.
pub fn plan(
    dir: &Path,
    days: u32,
    now: SystemTime,
    batch: &mut Vec<Entry>,
) -> Result<Vec<PathBuf>, JournalError> {
    let all = segments(dir).map_err(|e| JournalError::Io(format!("cannot list {}: {e}", dir.display())))?;
    let since_epoch = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let cutoff = since_epoch.saturating_sub(Duration::from_secs(u64::from(days) * DAY_SECS));
    // Times are RFC 3339 UTC of one width: they sort as strings do.
    let cutoff = record::rfc3339(cutoff);
    let mut gone: Vec<(u64, PathBuf)> = Vec::new();
    let mut last = None;
    for (first_seq, path) in all.iter().take(all.len().saturating_sub(1)) {
        let Some(end) = last_record(path) else {
            // Nothing is removed whose end cannot be recorded.
            tracing::warn!(
                "journal retention: the last record of {} cannot be read; it and what follows are kept",
                path.display()
            );
            break;
        };
        let time = end.fields.get("time").and_then(|t| t.as_str()).unwrap_or("");
        if time.is_empty() || time >= cutoff.as_str() {
            break;
        }
        gone.push((*first_seq, path.clone()));
        last = Some(end);
    }
    let (Some((first_seq, _)), Some(last)) = (gone.first(), last) else { return Ok(vec![]) };
    let files =
        gone.iter().map(|(_, p)| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    let event = Event::SegmentsRemoved {
        files: files.collect(),
        first_seq: *first_seq,
        last_seq: last.seq,
        last_hash: last.hash,
    };
    batch.push(Entry { fields: super::fields(&event), answered: false });
    Ok(gone.into_iter().map(|(_, p)| p).collect())
}

/// The last whole record of a closed segment.
fn last_record(path: &Path) -> Option<Record> {
    let mut file = std::fs::File::open(path).ok()?;
    let size = file.metadata().map(|m| m.len()).ok()?;
    let whole = content_len(&file, size).and_then(|c| whole_len(&mut file, c)).ok()?;
    let line = last_line(&mut file, whole).ok().flatten()?;
    record::parse(&line).ok()
}

#[cfg(test)]
mod tests {
    use super::super::store::{Settings, Store};
    use super::*;

    fn entry(n: u32) -> Entry {
        let event = Event::BrokerStopped { pid: n };
        Entry { fields: super::super::fields(&event), answered: true }
    }

    #[test]
    fn only_segments_older_than_the_days_kept_go_and_a_record_says_which() {
        let dir = std::env::temp_dir().join(format!("palisade-retention-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let settings = Settings { segment_bytes: 4096, keep_days: None, reader_gid: None };
        let mut store = Store::open(&dir, settings).unwrap();
        for n in 0..200 {
            store.append(vec![entry(n)], false).unwrap();
        }
        let all = segments(&dir).unwrap();
        assert!(all.len() >= 4, "{} segments", all.len());
        // Now: every record is younger than a day, nothing goes.
        let mut batch = vec![];
        assert!(plan(&dir, 1, SystemTime::now(), &mut batch).unwrap().is_empty());
        assert!(batch.is_empty());
        // Two days on, every segment but the newest is older than a day.
        let later = SystemTime::now() + Duration::from_secs(2 * DAY_SECS);
        let gone = plan(&dir, 1, later, &mut batch).unwrap();
        let expected: Vec<PathBuf> = all[..all.len() - 1].iter().map(|(_, p)| p.clone()).collect();
        assert_eq!(gone, expected);
        let record = &batch[0].fields;
        assert_eq!(record["event"], "segments_removed");
        assert_eq!(record["first_seq"], 1);
        assert_eq!(record["last_seq"], all[all.len() - 1].0 - 1);
        // Kept for three days, two days on: nothing.
        let mut batch = vec![];
        assert!(plan(&dir, 3, later, &mut batch).unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
