//! A run's writes as a change set. The overlay holds what the run wrote;
//! when the run is over its upper layer is taken into a change set in the
//! broker's store (`capture`: each entry with the host's state under it,
//! conflicts with what someone else changed meanwhile, files the host
//! executes), which is then applied (`apply`: per file, through a temporary
//! name and a rename, recoverable as a whole), held for review, or
//! discarded, as the run's `keep_changes` and `on_conflict` say. Nothing is
//! dropped without the result and the journal saying so.

pub mod apply;
pub mod capture;
pub mod clock;
pub mod fs;
pub mod manifest;
pub mod review;
pub mod store;

use crate::error::BrokerError;
use crate::host::requester::Requester;
use crate::journal::Event;
use manifest::{Entry, Kind, Manifest, Status};
use palisade_protocol::wire::{Changes, ChangesOutcome, KeepChanges, OnConflict, RunStatus};
use std::os::fd::OwnedFd;
use std::path::Path;
pub use store::{Limits, Store};

/// What settles a run's writes: what they never change on the host by
/// themselves (what the broker keeps, the files the host executes), where
/// the change sets are kept, and the journal that records what became of them.
#[derive(Clone)]
pub struct KeepOut {
    pub owned: std::sync::Arc<[palisade_policy::host::OwnedPath]>,
    pub host_executed: std::sync::Arc<palisade_policy::host_executed::HostExecuted>,
    pub store: std::sync::Arc<Store>,
    pub journal: crate::journal::Journal,
}

/// Paths a journal record names at most (the rest counted): a change set
/// of 10,000 files is recorded by its hash, its count and its first paths.
pub const RECORDED_PATHS: usize = 256;

/// How a run's writes are to be settled.
pub struct Settle<'a> {
    pub run_id: u64,
    pub requester: &'a Requester,
    pub keep_out: &'a KeepOut,
    /// When the run took its view of the host: what the host changed after
    /// it is a conflict.
    pub since: clock::Since,
    pub keep: KeepChanges,
    pub on_conflict: OnConflict,
    /// How palisade ended the run, if it did.
    pub ended: Option<RunStatus>,
}

/// What became of a run's writes, and the journal's records of it.
pub struct Settled {
    pub changes: Changes,
    pub events: Vec<Event>,
}

/// One overlay: the granted directory (host path), its upper layer, and
/// the broker's descriptor of the directory.
pub type Target = (String, OwnedFd, OwnedFd);

/// Settles the writes in `targets` (see the module's comment).
pub fn settle(s: &Settle<'_>, targets: Vec<Target>) -> Result<Settled, BrokerError> {
    let roots: Vec<String> = targets.iter().map(|(source, _, _)| source.clone()).collect();
    let joined = roots.join(", ");
    let copy_back = |e: std::io::Error| BrokerError::CopyBack { path: joined.clone(), source: e };
    // A run that filled its bound: what it wrote is what it was stopped for.
    let filled = s.ended == Some(RunStatus::DiskLimitExceeded);
    if filled || s.ended.is_some() && s.keep == KeepChanges::DiscardWhenEnded {
        return discard_ended(s, &targets).map_err(copy_back);
    }
    let store = &s.keep_out.store;
    let _lock = store.lock(s.requester.uid).map_err(copy_back)?;
    let draft = store.draft(s.requester.uid).map_err(copy_back)?;
    let taken = take(s, &targets, Some(&draft));
    let (entries, withheld, bytes) = match taken {
        Ok(t) => t,
        Err(e) => {
            let _ = store.remove(&draft.dir);
            // Too large to take: not kept, and said (the host is untouched).
            if let Some(why) = e.get_ref().and_then(|e| e.downcast_ref::<capture::TooLarge>()) {
                return Ok(too_large(s, &targets, why));
            }
            return Err(copy_back(e));
        }
    };
    let mut changes = Changes { withheld, ..Changes::default() };
    if entries.is_empty() {
        let _ = store.remove(&draft.dir);
        return Ok(Settled { changes, events: vec![] });
    }
    let mut m = Manifest {
        id: draft.id.clone(),
        run_id: s.run_id,
        uid: s.requester.uid,
        gid: s.requester.gid,
        created: now_secs(),
        status: Status::Held,
        reason: String::new(),
        roots,
        taken_ns: s.since.ns,
        taken_offset_ns: s.since.offset_ns,
        entries,
    };
    changes.conflicts = m.entries.iter().filter(|e| e.conflict).map(|e| e.host_path(&m.roots)).collect();
    if let Some(reason) = hold_reason(s, &m) {
        m.reason = reason;
        return hold_whole(s, &draft, m, bytes, changes).map_err(copy_back);
    }
    m.status = Status::Applying;
    m.reason = "applying at the end of the run".into();
    let dir = store.commit(&draft, &m).map_err(copy_back)?;
    let dests: Vec<OwnedFd> = targets.into_iter().map(|(_, _, dest)| dest).collect();
    let choice = apply::Choice { overwrite: s.on_conflict == OnConflict::Overwrite, host_executed: false };
    apply_and_keep(store, &dir, m, &dests, s.requester, choice, changes).map_err(copy_back)
}

/// A change set too large to take (see [`capture::MAX_ENTRIES`]): discarded, saying why.
fn too_large(s: &Settle<'_>, targets: &[Target], why: &capture::TooLarge) -> Settled {
    let roots: Vec<String> = targets.iter().map(|(r, _, _)| r.clone()).collect();
    let reason = format!("the run's writes are too large to take as a change set: {why}");
    let changes =
        Changes { outcome: ChangesOutcome::Discarded, reason: Some(reason.clone()), ..Changes::default() };
    tracing::warn!(run_id = s.run_id, "{reason}");
    Settled { changes, events: vec![record(s.run_id, None, "discarded", &reason, &[], &roots)] }
}

/// Whether the whole change set is held rather than applied, and why.
fn hold_reason(s: &Settle<'_>, m: &Manifest) -> Option<String> {
    if let Some(ended) = s.ended {
        let how = ended.error_kind().map_or("ended".to_string(), |k| k.name().to_string());
        return Some(format!("the run was ended ({how}): its writes are held, not applied"));
    }
    if s.keep == KeepChanges::AlwaysHold {
        return Some("held for review (keep_changes = always_hold)".into());
    }
    if s.on_conflict == OnConflict::Hold && m.entries.iter().any(|e| e.conflict) {
        return Some("someone else changed paths it changes (on_conflict = hold)".into());
    }
    None
}

/// The entries of every overlay, what was withheld, and the bytes taken.
fn take(
    s: &Settle<'_>,
    targets: &[Target],
    draft: Option<&store::Draft>,
) -> std::io::Result<(Vec<Entry>, Vec<palisade_protocol::wire::Withheld>, u64)> {
    let mut next = 0u32;
    let (mut entries, mut withheld, mut bytes) = (Vec::new(), Vec::new(), 0);
    for (root, (source, upper, dest)) in targets.iter().enumerate() {
        let path = Path::new(source);
        let owned = (s.keep_out.owned.iter())
            .filter_map(|o| o.path.strip_prefix(path).ok().map(|rel| (rel.to_path_buf(), o.what.clone())))
            .collect();
        let hooks = s.requester.act(|_| hooks_path(dest)).unwrap_or_default();
        let guard = capture::Guard { root: path, owned, host_executed: &s.keep_out.host_executed, hooks };
        let blobs = draft.map(|d| capture::Blobs { dir: &d.blobs, next: &mut next });
        let taken = s
            .requester
            .act(|act| capture::capture(upper, dest, act, &guard, (root, &s.since), blobs))
            .and_then(|r| r)?;
        entries.extend(taken.entries);
        withheld.extend(taken.withheld);
        bytes += taken.bytes;
    }
    Ok((entries, withheld, bytes))
}

/// The host's own hooks directory, where the granted directory is a
/// repository whose configuration names one (`core.hooksPath`, relative
/// to the repository, as husky and others set it): what the host runs
/// from there is held like `.git/hooks`.
fn hooks_path(dest: &OwnedFd) -> Vec<std::path::PathBuf> {
    let Ok(git) = fs::open_dir_at(dest, c".git") else { return vec![] };
    let Ok(fd) = fs::open_file_at(&git, c"config") else { return vec![] };
    let mut text = String::new();
    let read =
        std::io::Read::read_to_string(&mut std::io::Read::take(std::fs::File::from(fd), 1 << 20), &mut text);
    if read.is_err() {
        return vec![];
    }
    let settings = palisade_policy::host_executed::parse_git_config(&text).unwrap_or_default();
    settings
        .into_iter()
        .filter(|(k, _)| k == "core.hookspath")
        .map(|(_, v)| std::path::PathBuf::from(v))
        .filter(|p| p.is_relative())
        .collect()
}

/// The writes of a run palisade ended, with `keep_changes =
/// "discard_when_ended"`, or of one that filled its bound: counted, said,
/// and not kept.
fn discard_ended(s: &Settle<'_>, targets: &[Target]) -> std::io::Result<Settled> {
    let (entries, withheld, _) = take(s, targets, None)?;
    let mut changes = Changes { withheld, ..Changes::default() };
    if entries.is_empty() {
        return Ok(Settled { changes, events: vec![] });
    }
    let roots: Vec<String> = targets.iter().map(|(r, _, _)| r.clone()).collect();
    let reason = match s.ended {
        Some(RunStatus::DiskLimitExceeded) => "the run's writes filled their bound (max_disk_mb)".to_string(),
        _ => "the run was ended and keep_changes = discard_when_ended".to_string(),
    };
    changes.outcome = ChangesOutcome::Discarded;
    changes.reason = Some(reason.clone());
    let event = record(s.run_id, None, "discarded", &reason, &entries, &roots);
    Ok(Settled { changes, events: vec![event] })
}

/// The whole change set held, where the requester's bound leaves room;
/// else discarded, saying why.
fn hold_whole(
    s: &Settle<'_>,
    draft: &store::Draft,
    m: Manifest,
    bytes: u64,
    mut changes: Changes,
) -> std::io::Result<Settled> {
    let store = &s.keep_out.store;
    if let Err(why) = store.room_for(s.requester.uid, bytes) {
        let _ = store.remove(&draft.dir);
        let reason = format!("{}; it could not be held: {why}", m.reason);
        changes.outcome = ChangesOutcome::Discarded;
        changes.reason = Some(reason.clone());
        let event = record(s.run_id, None, "discarded", &reason, &m.entries, &m.roots);
        return Ok(Settled { changes, events: vec![event] });
    }
    store.commit(draft, &m)?;
    changes.outcome = ChangesOutcome::Held;
    changes.id = Some(m.id.clone());
    changes.reason = Some(m.reason.clone());
    let event = record(s.run_id, Some(&m.id), "held", &m.reason, &m.entries, &m.roots);
    Ok(Settled { changes, events: vec![event] })
}

/// Applies the change set in `dir`, then holds what was kept (conflicts,
/// files the host executes) or removes it when nothing was.
pub(crate) fn apply_and_keep(
    store: &Store,
    dir: &Path,
    mut m: Manifest,
    dests: &[OwnedFd],
    requester: &Requester,
    choice: apply::Choice,
    mut changes: Changes,
) -> std::io::Result<Settled> {
    let blobs = store.blobs(dir)?;
    let since = m.since();
    let done =
        requester.act(|act| apply::apply(&m.entries, dests, &blobs, act, choice, &since)).and_then(|r| r)?;
    let applied: Vec<Entry> = (m.entries.iter().enumerate())
        .filter(|(i, _)| !done.kept.contains(i))
        .map(|(_, e)| e.clone())
        .collect();
    changes.outcome = ChangesOutcome::Applied;
    (changes.files, changes.removed, changes.bytes) = (done.files, done.removed, done.bytes);
    changes.conflicts = done.conflicts.iter().map(|i| m.entries[*i].host_path(&m.roots)).collect();
    let mut events = vec![record(m.run_id, Some(&m.id), "applied", "", &applied, &m.roots)];
    if done.kept.is_empty() {
        store.remove(dir)?;
        return Ok(Settled { changes, events });
    }
    // The files the host executes the run changed: said by name (the
    // directories whole, not each file in them), and held.
    let held_dirs: Vec<std::path::PathBuf> = (done.kept.iter().map(|i| &m.entries[*i]))
        .filter(|e| e.is_dir() && e.host_executed.is_some())
        .map(Entry::rel)
        .collect();
    for e in done.kept.iter().map(|i| &m.entries[*i]) {
        let (Some(what), Some(parent)) = (&e.host_executed, e.rel().parent().map(Path::to_path_buf)) else {
            continue;
        };
        if !held_dirs.iter().any(|d| parent.starts_with(d)) {
            let path = e.host_path(&m.roots);
            let reason = palisade_protocol::wire::WithheldReason::HostExecuted;
            changes.withheld.push(palisade_protocol::wire::Withheld { path, reason, what: what.clone() });
        }
    }
    let kept = with_ancestors(&m.entries, &done.kept);
    let kept_bytes: u64 =
        kept.iter().map(|e| if let Kind::File { size, .. } = e.kind { size } else { 0 }).sum();
    m.entries = kept;
    m.status = Status::Held;
    m.reason = if done.conflicts.is_empty() {
        "files the host executes: a person applies them (palisade changes apply --host-executed)".into()
    } else {
        "someone else changed these paths meanwhile: the host's versions were kept".into()
    };
    // What is kept counts against the requester's bound like any hold (the
    // ones past their age go first).
    for id in store.sweep_uid(m.uid, now_secs()) {
        events.push(record(0, Some(&id), "discarded", "held past [changes] max_age_days", &[], &[]));
    }
    if let Err(why) = store.room_for_more(m.uid, &m.id, kept_bytes) {
        store.remove(dir)?;
        let reason = format!("{}; it could not be held: {why}", m.reason);
        changes.reason = Some(reason.clone());
        events.push(record(m.run_id, None, "discarded", &reason, &m.entries, &m.roots));
        return Ok(Settled { changes, events });
    }
    store.save(dir, &m)?;
    drop_unused_blobs(&blobs, &m.entries);
    changes.id = Some(m.id.clone());
    changes.reason = Some(m.reason.clone());
    events.push(record(m.run_id, Some(&m.id), "held", &m.reason, &m.entries, &m.roots));
    Ok(Settled { changes, events })
}

/// The entries at `kept`, with the directories on their way (which an
/// apply later makes again where they are gone), in their order.
fn with_ancestors(entries: &[Entry], kept: &[usize]) -> Vec<Entry> {
    let wanted: Vec<(usize, std::path::PathBuf)> =
        kept.iter().map(|i| (entries[*i].root, entries[*i].rel())).collect();
    (entries.iter().enumerate())
        .filter(|(i, e)| {
            kept.contains(i)
                || e.is_dir() && wanted.iter().any(|(root, p)| *root == e.root && p.starts_with(e.rel()))
        })
        .map(|(_, e)| e.clone())
        .collect()
}

/// Removes the blobs no entry of `entries` names any more.
fn drop_unused_blobs(blobs: &OwnedFd, entries: &[Entry]) {
    let used: Vec<u32> = entries
        .iter()
        .filter_map(|e| match e.kind {
            Kind::File { blob, .. } => Some(blob),
            _ => None,
        })
        .collect();
    let Ok(names) = fs::names(blobs) else { return };
    for n in names {
        let keep = n.to_str().ok().and_then(|s| s.parse::<u32>().ok()).is_some_and(|b| used.contains(&b));
        if !keep {
            let _ = nix::unistd::unlinkat(blobs, n.as_c_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        }
    }
}

/// The journal's record of what became of a change set: its paths (the
/// first [`RECORDED_PATHS`], and how many in all) and a hash of its
/// entries, contents included (each file's sha256), so that `palisade
/// audit` answers which run wrote a file.
pub fn record(
    run_id: u64,
    id: Option<&str>,
    what: &str,
    reason: &str,
    entries: &[Entry],
    roots: &[String],
) -> Event {
    use sha2::Digest;
    let hash = sha2::Sha256::digest(serde_json::to_vec(entries).unwrap_or_default());
    Event::Changes {
        run_id,
        id: id.map(String::from),
        outcome: what.into(),
        reason: (!reason.is_empty()).then(|| reason.to_string()),
        paths: entries.iter().take(RECORDED_PATHS).map(|e| e.host_path(roots)).collect(),
        paths_total: entries.len() as u64,
        conflicts: entries
            .iter()
            .filter(|e| e.conflict)
            .map(|e| e.host_path(roots))
            .take(RECORDED_PATHS)
            .collect(),
        sha256: hash.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Whether the run wrote nothing in an overlay (its upper layer is empty).
pub fn untouched(upper: &OwnedFd) -> bool {
    use nix::fcntl::OFlag;
    use std::os::fd::AsFd;
    // A descriptor of its own: reading must not move the offset the capture starts from.
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let Ok(mut dir) = nix::dir::Dir::openat(upper.as_fd(), ".", flags, nix::sys::stat::Mode::empty()) else {
        return false;
    };
    dir.iter().all(|e| e.is_ok_and(|e| matches!(e.file_name().to_bytes(), b"." | b"..")))
}

/// Whether an overlay's upper layer (a tmpfs) is (all but) full, in bytes
/// or in files: the run hit its bound.
pub fn fs_full(upper: &OwnedFd) -> bool {
    use std::os::fd::AsFd;
    match nix::sys::statvfs::fstatvfs(upper.as_fd()) {
        Ok(s) => s.blocks_available() * s.fragment_size() < 64 * 1024 || s.files_available() < 16,
        Err(_) => false,
    }
}
