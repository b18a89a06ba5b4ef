//! A journal directory's segment files (`segment-<first seq>.jsonl`): their
//! names, and reading where their records end, what their last line is, and
//! which torn lines were set aside. The store (`store.rs`) writes them;
//! verify and retention read them with these.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Segment names: the prefix, then the first record's seq in 20 digits (so
/// names sort as seqs do), then the suffix.
pub(super) const SEGMENT_PREFIX: &str = "segment-";
pub(super) const SEGMENT_SUFFIX: &str = ".jsonl";
/// What a set-aside torn line's file name has after its segment's name.
pub const SET_ASIDE_MARK: &str = ".torn-";
/// Bytes read at a time when looking for the last line from the end.
pub(super) const TAIL_CHUNK: u64 = 64 * 1024;

/// The segments of `dir`, oldest first, with the seq their name says they start at.
pub fn segments(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let seq = name.strip_prefix(SEGMENT_PREFIX).and_then(|n| n.strip_suffix(SEGMENT_SUFFIX));
        if let Some(seq) = seq.and_then(|s| s.parse::<u64>().ok()) {
            found.push((seq, dir.join(name)));
        }
    }
    found.sort();
    Ok(found)
}

/// The files that torn lines were set aside into.
pub fn set_aside_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(SET_ASIDE_MARK))
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

/// The last whole line of `file` (`len` bytes, ending with a newline), or
/// `None` when it has none.
pub fn last_line(file: &mut File, len: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut end = len.saturating_sub(1);
    let mut tail: Vec<u8> = Vec::new();
    while end > 0 {
        let start = end.saturating_sub(TAIL_CHUNK);
        let mut chunk = vec![0u8; (end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut chunk)?;
        chunk.extend_from_slice(&tail);
        tail = chunk;
        if let Some(i) = tail[..(end - start) as usize].iter().rposition(|b| *b == b'\n') {
            return Ok(Some(tail[i + 1..].to_vec()));
        }
        end = start;
    }
    Ok((len > 0).then_some(tail))
}

/// Where the last whole line of `file` ends: bytes after it are a torn line.
pub fn whole_len(file: &mut File, len: u64) -> std::io::Result<u64> {
    let mut end = len;
    let mut buf = vec![0u8; TAIL_CHUNK as usize];
    while end > 0 {
        let start = end.saturating_sub(TAIL_CHUNK);
        let piece = &mut buf[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(piece)?;
        if let Some(i) = piece.iter().rposition(|b| *b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// Where the records of a segment of `size` bytes end: after its last
/// byte that is not zero (records hold no zero byte; the reserve is zeros).
pub fn content_len(file: &File, size: u64) -> std::io::Result<u64> {
    let mut end = size;
    let mut buf = vec![0u8; TAIL_CHUNK as usize];
    while end > 0 {
        let start = end.saturating_sub(TAIL_CHUNK);
        let piece = &mut buf[..(end - start) as usize];
        file.read_exact_at(piece, start)?;
        if let Some(i) = piece.iter().rposition(|b| *b != 0) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}
