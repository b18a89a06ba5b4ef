//! Retention: when a segment is closed and `keep_segments` is set, the
//! oldest segments beyond that count go, and a record says which files,
//! the seqs they held and the hash they ended at, so that `audit verify`
//! still accepts the chain that remains.

use super::store::{Entry, content_len, last_line, segments, whole_len};
use super::{Event, JournalError, record};
use std::path::{Path, PathBuf};

/// The segments of `dir` beyond the newest `keep` (the one just started
/// among them): the record of their removal goes into `batch`, and they are
/// returned to be removed once it is on disk.
pub fn plan(dir: &Path, keep: u32, batch: &mut Vec<Entry>) -> Result<Vec<PathBuf>, JournalError> {
    let all = segments(dir).map_err(|e| JournalError::Io(format!("cannot list {}: {e}", dir.display())))?;
    let keep = keep.max(1) as usize;
    if all.len() <= keep {
        return Ok(vec![]);
    }
    let (gone, kept) = all.split_at(all.len() - keep);
    let (Some((first_seq, _)), Some((_, last_path)), false) = (gone.first(), gone.last(), kept.is_empty())
    else {
        return Ok(vec![]);
    };
    let mut file = std::fs::File::open(last_path)
        .map_err(|e| JournalError::Io(format!("cannot open {}: {e}", last_path.display())))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let whole = content_len(&file, size).and_then(|c| whole_len(&mut file, c)).unwrap_or(0);
    let line = last_line(&mut file, whole).ok().flatten();
    let Some(last) = line.and_then(|l| record::parse(&l).ok()) else {
        // Nothing is removed whose end cannot be recorded.
        tracing::warn!(
            "journal retention: the last record of {} cannot be read; nothing removed",
            last_path.display()
        );
        return Ok(vec![]);
    };
    let files =
        gone.iter().map(|(_, p)| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    let event = Event::SegmentsRemoved {
        files: files.collect(),
        first_seq: *first_seq,
        last_seq: last.seq,
        last_hash: last.hash,
    };
    batch.push(Entry { fields: super::fields(&event), answered: false });
    Ok(gone.iter().map(|(_, p)| p.clone()).collect())
}
