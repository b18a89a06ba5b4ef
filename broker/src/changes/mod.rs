//! A run's writes as a change set. Each overlay's upper layer is on disk,
//! in the change set being made for the run (`layer`); when the run is over
//! its layers are taken as they lie (`capture`: each entry with the host's
//! state under it, conflicts with what someone else changed after the run's
//! view (`clock`), files the host executes), then applied (`apply`: each
//! entry swapped in and checked, moved where it can be, recoverable as a
//! whole), held for review, or discarded, as the run's `keep_changes` and
//! `on_conflict` say. Nothing is dropped without the result and the
//! journal saying so, and what is not applied is held: a bound reached, a
//! conflict, a write that failed, a broker killed during the run (its
//! layers are held at the next start: [`recover`]).

pub mod apply;
pub mod bound;
pub mod capture;
pub mod clock;
pub mod fs;
pub mod in_place;
pub mod layer;
pub mod manifest;
pub mod review;
pub mod store;

use crate::error::BrokerError;
use crate::host::requester::Requester;
use crate::journal::Event;
pub use layer::Layers;
use manifest::{Entry, Kind, Layout, Manifest, Status};
use palisade_protocol::wire::{Changes, ChangesOutcome, KeepChanges, OnConflict, RunStatus, Withheld};
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
#[derive(Clone)]
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
    /// The bound the run's writes reached, in words with its key, where
    /// that is what ended it (or, with no `ended`, why they are held).
    pub bound: Option<String>,
}

/// What became of a run's writes, and the journal's records of it.
pub struct Settled {
    pub changes: Changes,
    pub events: Vec<Event>,
}

/// Settles the writes in `layers`, whose granted directories the broker
/// holds as `dests` (see the module's comment).
pub fn settle(s: &Settle<'_>, mut layers: Layers, dests: Vec<OwnedFd>) -> Result<Settled, BrokerError> {
    layers.settled = true;
    let roots = layers.record.roots.clone();
    let copy_back = |e: std::io::Error| BrokerError::CopyBack { path: roots.join(", "), source: e };
    let store = &s.keep_out.store;
    if layers.untouched() {
        store.remove(&layers.draft.dir).map_err(copy_back)?;
        return Ok(Settled { changes: Changes::default(), events: vec![] });
    }
    if s.ended.is_some() && s.keep == KeepChanges::DiscardWhenEnded {
        return discard_ended(s, &layers, &dests).map_err(copy_back);
    }
    let _lock = store.lock(s.requester.uid).map_err(copy_back)?;
    let draft = &layers.draft;
    let started = std::time::Instant::now();
    let taken = take(s, &layers, &dests, capture::Take::Contents);
    let capture_us = started.elapsed().as_micros();
    layer::drop_work(&draft.dir, layers.uppers.len());
    let Captured { entries, withheld, bytes } = match taken {
        Ok(t) => t,
        // Too large to list: held as it lies, and said.
        Err(e) if e.get_ref().and_then(|e| e.downcast_ref::<capture::TooLarge>()).is_some() => {
            return hold_unlisted(s, &layers, &e.to_string()).map_err(copy_back);
        }
        Err(e) => return Err(copy_back(e)),
    };
    let mut changes = Changes { withheld, ..Changes::default() };
    if entries.is_empty() {
        store.remove(&draft.dir).map_err(copy_back)?;
        return Ok(Settled { changes, events: vec![] });
    }
    let mut m = manifest_of(s, draft, &roots, Layout::Tree, entries);
    m.bytes = bytes;
    changes.conflicts = m.entries.iter().filter(|e| e.conflict).map(|e| e.host_path(&m.roots)).collect();
    if let Some(reason) = hold_reason(s, &m) {
        m.reason = reason;
        return hold_whole(s, draft, m, changes).map_err(copy_back);
    }
    m.status = Status::Applying;
    m.reason = "applying at the end of the run".into();
    let dir = store.commit(draft, &m).map_err(copy_back)?;
    let choice = apply::Choice { overwrite: s.on_conflict == OnConflict::Overwrite, host_executed: false };
    let entries = m.entries.len();
    let applied = apply_and_keep(store, &dir, m, &dests, s.requester, (choice, false), changes);
    let apply_us = started.elapsed().as_micros() - capture_us;
    // Where a run's time past its command goes (the benchmark reads it).
    tracing::debug!(run_id = s.run_id, entries, capture_us, apply_us, "settle timeline");
    applied.map_err(copy_back)
}

/// A held change set's manifest, of the run `s` settles.
fn manifest_of(
    s: &Settle<'_>,
    draft: &store::Draft,
    roots: &[String],
    layout: Layout,
    entries: Vec<Entry>,
) -> Manifest {
    Manifest {
        id: draft.id.clone(),
        run_id: s.run_id,
        broker: Some(draft.broker.clone()),
        uid: s.requester.uid,
        gid: s.requester.gid,
        created: now_secs(),
        status: Status::Held,
        reason: String::new(),
        roots: roots.to_vec(),
        taken_ns: s.since.ns,
        taken_offset_ns: s.since.offset_ns,
        layout,
        bytes: 0,
        entries,
    }
}

/// What the layers of a run held, together.
struct Captured {
    entries: Vec<Entry>,
    withheld: Vec<Withheld>,
    bytes: u64,
}

/// A change set past what a manifest lists ([`capture::MAX_ENTRIES`]):
/// held as it lies, with no entries (nothing of it can be applied by
/// palisade; its files are in the change set's directory), and said.
fn hold_unlisted(s: &Settle<'_>, layers: &Layers, why: &str) -> std::io::Result<Settled> {
    let store = &s.keep_out.store;
    let draft = &layers.draft;
    let kept = draft.dir.with_file_name(&draft.id);
    let mut m = manifest_of(s, draft, &layers.record.roots, Layout::Tree, vec![]);
    m.reason = format!(
        "the run's writes are too many to list as a change set ({why}): they are held as the run \
         left them in {}, and nothing of them is applied; `palisade changes discard {}` removes them",
        kept.display(),
        draft.id
    );
    store.commit(draft, &m)?;
    tracing::warn!(run_id = s.run_id, "{}", m.reason);
    let changes = Changes {
        outcome: ChangesOutcome::Held,
        id: Some(m.id.clone()),
        reason: Some(m.reason.clone()),
        ..Changes::default()
    };
    Ok(Settled { changes, events: vec![record(s.run_id, Some(&m.id), "held", &m.reason, &[], &m.roots)] })
}

/// Whether the whole change set is held rather than applied, and why.
fn hold_reason(s: &Settle<'_>, m: &Manifest) -> Option<String> {
    if let Some(ended) = s.ended {
        let how = match (ended, &s.bound) {
            (RunStatus::DiskLimitExceeded, Some(bound)) => bound.clone(),
            (other, _) => ended_how(other),
        };
        return Some(format!("the run's writes are held, not applied: {how}"));
    }
    // A run whose broker stopped: its bound says why (see [`recover`]).
    if let Some(why) = &s.bound {
        return Some(why.clone());
    }
    if s.keep == KeepChanges::AlwaysHold {
        return Some("held for review (keep_changes = always_hold)".into());
    }
    if s.on_conflict == OnConflict::Hold && m.entries.iter().any(|e| e.conflict) {
        return Some("someone else changed paths it changes (on_conflict = hold)".into());
    }
    None
}

/// Why palisade ended a run, in words naming what bounds it.
fn ended_how(status: RunStatus) -> String {
    match status {
        RunStatus::Cancelled => "it was cancelled before its end (by its client, or a signal to it)".into(),
        RunStatus::TimedOut => "it was killed at its deadline (max_execution_time)".into(),
        RunStatus::QuotaExceeded => {
            "it was killed when its output passed its quota (max_output_bytes)".into()
        }
        RunStatus::MemoryLimitExceeded => "it was killed by its memory limit (max_memory_mb)".into(),
        RunStatus::DiskLimitExceeded => "its writes reached their bound (max_disk_mb)".into(),
        other => format!("it was ended ({})", other.error_kind().map_or("ended", |k| k.name())),
    }
}

/// The entries of every layer, what was withheld, and the bytes they take.
fn take(s: &Settle<'_>, layers: &Layers, dests: &[OwnedFd], how: capture::Take) -> std::io::Result<Captured> {
    let mut all = Captured { entries: Vec::new(), withheld: Vec::new(), bytes: 0 };
    for (root, (upper, dest)) in layers.uppers.iter().zip(dests).enumerate() {
        let source = &layers.record.roots[root];
        let path = Path::new(source);
        let owned = (s.keep_out.owned.iter())
            .filter_map(|o| o.path.strip_prefix(path).ok().map(|rel| (rel.to_path_buf(), o.what.clone())))
            .collect();
        let hooks = s.requester.act(|_| hooks_path(dest, path)).unwrap_or_default();
        let guard = capture::Guard { root: path, owned, host_executed: &s.keep_out.host_executed, hooks };
        let taken = s
            .requester
            .act(|_| capture::capture(upper, dest, &guard, (root, &s.since), how))
            .and_then(|r| r)?;
        all.entries.extend(taken.entries);
        all.withheld.extend(taken.withheld);
        all.withheld.extend(taken.not_carried);
        all.bytes += taken.bytes;
    }
    Ok(all)
}

/// What the granted directory `root`'s own repository names as code
/// inside it (relative to it): its hooks directory (`core.hooksPath`, as
/// husky and others set it) and the configuration files it includes. What
/// a run changes there is held like `.git/hooks`.
pub(super) fn hooks_path(dest: &OwnedFd, root: &Path) -> Vec<std::path::PathBuf> {
    let Ok(git) = fs::open_dir_at(dest, c".git") else { return vec![] };
    let Ok(fd) = fs::open_file_at(&git, c"config") else { return vec![] };
    let mut text = String::new();
    let read =
        std::io::Read::read_to_string(&mut std::io::Read::take(std::fs::File::from(fd), 1 << 20), &mut text);
    if read.is_err() {
        return vec![];
    }
    let code = palisade_policy::host_executed::git_code_paths(&text, &root.join(".git"), root, None);
    let inside = code.iter().filter_map(|(p, _)| p.strip_prefix(root).ok());
    inside.filter(|rel| !rel.as_os_str().is_empty()).map(Path::to_path_buf).collect()
}

/// The writes of a run palisade ended, with `keep_changes =
/// "discard_when_ended"`: counted, said, and not kept.
fn discard_ended(s: &Settle<'_>, layers: &Layers, dests: &[OwnedFd]) -> std::io::Result<Settled> {
    let taken = take(s, layers, dests, capture::Take::Count);
    let _ = s.keep_out.store.remove(&layers.draft.dir);
    let Captured { entries, withheld, .. } = taken?;
    let mut changes = Changes { withheld, ..Changes::default() };
    if entries.is_empty() {
        return Ok(Settled { changes, events: vec![] });
    }
    let how = s.ended.map_or_else(|| "it was ended".into(), ended_how);
    let reason = format!("{how}, and keep_changes = discard_when_ended: the run's writes are not kept");
    changes.outcome = ChangesOutcome::Discarded;
    changes.discarded = entries.len() as u64;
    changes.reason = Some(reason.clone());
    let event = record(s.run_id, None, "discarded", &reason, &entries, &layers.record.roots);
    Ok(Settled { changes, events: vec![event] })
}

/// The whole change set held; where the requester's held change sets are
/// past their bounds, held all the same (nothing of a run's is dropped to
/// keep a bound), and said.
fn hold_whole(
    s: &Settle<'_>,
    draft: &store::Draft,
    mut m: Manifest,
    mut changes: Changes,
) -> std::io::Result<Settled> {
    let store = &s.keep_out.store;
    if let Err(why) = store.room_for(s.requester.uid, m.bytes) {
        m.reason = format!("{}; {why}: it is held beyond that bound", m.reason);
    }
    store.commit(draft, &m)?;
    changes.outcome = ChangesOutcome::Held;
    changes.id = Some(m.id.clone());
    changes.held = m.entries.len() as u64;
    changes.reason = Some(m.reason.clone());
    let event = record(s.run_id, Some(&m.id), "held", &m.reason, &m.entries, &m.roots);
    Ok(Settled { changes, events: vec![event] })
}

/// Applies the change set in `dir`, then holds what was kept (conflicts,
/// files the host executes, what could not be written) or removes it when
/// nothing was. `resuming`: an apply of it stopped part-way before.
pub(crate) fn apply_and_keep(
    store: &Store,
    dir: &Path,
    mut m: Manifest,
    dests: &[OwnedFd],
    requester: &Requester,
    (choice, resuming): (apply::Choice, bool),
    mut changes: Changes,
) -> std::io::Result<Settled> {
    let contents = match m.layout {
        Layout::Blobs => apply::Contents::Blobs(store.blobs(dir)?),
        Layout::Tree => apply::Contents::Tree(
            (0..m.roots.len())
                .map(|i| store::open_dir(&layer::upper(dir, i)))
                .collect::<std::io::Result<_>>()?,
        ),
    };
    let since = m.since();
    // Marked while it applies: a broker that stops meanwhile leaves the mark (see `recover`).
    std::fs::write(dir.join(APPLYING), b"")?;
    let done = requester
        .act(|act| apply::apply(&m.entries, &contents, dests, act, choice, &since, &m.id, resuming))
        .and_then(|r| r)?;
    let _ = std::fs::remove_file(dir.join(APPLYING));
    let applied: Vec<Entry> = (m.entries.iter().enumerate())
        .filter(|(i, _)| !done.kept.contains(i))
        .map(|(_, e)| e.clone())
        .collect();
    changes.outcome = ChangesOutcome::Applied;
    (changes.files, changes.removed, changes.bytes) = (done.files, done.removed, done.bytes);
    changes.dirs = applied.iter().filter(|e| e.is_dir()).count() as u64;
    changes.conflicts = done.conflicts.iter().map(|i| m.entries[*i].host_path(&m.roots)).collect();
    let mut events = vec![record(m.run_id, Some(&m.id), "applied", "", &applied, &m.roots)];
    if done.kept.is_empty() {
        store.remove(dir)?;
        return Ok(Settled { changes, events });
    }
    withhold_host_executed(&m, &done, &mut changes);
    let kept = with_ancestors(&m.entries, &done.kept);
    changes.outcome = if applied.is_empty() { ChangesOutcome::Held } else { ChangesOutcome::Partial };
    changes.held = kept.len() as u64;
    m.reason = kept_reason(&m, &done);
    m.entries = kept;
    m.status = Status::Held;
    if let Layout::Tree = m.layout {
        m.bytes = held_bytes(dir, &m);
    }
    // What is kept counts against the requester's bound like any hold (the
    // ones past their age go first); past the bound it is held all the same.
    for id in store.sweep_uid(m.uid, now_secs()) {
        events.push(record(0, Some(&id), "discarded", "held past [changes] max_age_days", &[], &[]));
    }
    if let Err(why) = store.room_for_more(m.uid, &m.id, m.bytes) {
        m.reason = format!("{}; {why}: it is held beyond that bound", m.reason);
    }
    store.save(dir, &m)?;
    if let apply::Contents::Blobs(blobs) = &contents {
        drop_unused_blobs(blobs, &m.entries);
    }
    changes.id = Some(m.id.clone());
    changes.reason = Some(m.reason.clone());
    events.push(record(m.run_id, Some(&m.id), "held", &m.reason, &m.entries, &m.roots));
    Ok(Settled { changes, events })
}

/// The files the host executes the run changed: said by name (the
/// directories whole, not each file in them).
fn withhold_host_executed(m: &Manifest, done: &apply::Applied, changes: &mut Changes) {
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
            changes.withheld.push(Withheld { path, reason, what: what.clone() });
        }
    }
}

/// Why what an apply kept is held, in words: each cause, the first
/// failure named.
fn kept_reason(m: &Manifest, done: &apply::Applied) -> String {
    let mut why = Vec::new();
    if !done.conflicts.is_empty() {
        why.push(format!(
            "someone else changed {} of its paths meanwhile: the host's versions were kept",
            done.conflicts.len()
        ));
    }
    if done.kept.iter().any(|i| m.entries[*i].host_executed.is_some()) {
        why.push(
            "files the host executes: a person applies them (palisade changes apply --host-executed)".into(),
        );
    }
    if let Some((i, err)) = done.failed.first() {
        why.push(format!(
            "{} could not be written ({}: {err}): `palisade changes apply {}` finishes it",
            done.failed.len(),
            m.entries[*i].host_path(&m.roots),
            m.id
        ));
    }
    why.join("; ")
}

/// The bytes the kept entries' contents take in the change set's layers,
/// each file once.
fn held_bytes(dir: &Path, m: &Manifest) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    for e in m.entries.iter().filter(|e| matches!(e.kind, Kind::File { .. })) {
        if let Ok(st) = nix::sys::stat::lstat(&layer::upper(dir, e.root).join(e.rel())) {
            if seen.insert(st.st_ino) {
                total += fs::allocated(&st);
            }
        }
    }
    total
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

/// Holds the writes of runs whose broker stopped before it settled them
/// (killed, crashed, a failure on the way): each draft of a broker no
/// longer running ([`Store::orphans`]; `only`: of this uid alone) whose
/// run record says which run's layers it holds is taken as a held change
/// set, as that run's requester, against its granted directories opened
/// again (no symlink on the way); one without a record (half made, never
/// written by a sandbox) is removed. The journal's records of it.
pub fn recover(keep_out: &KeepOut, only: Option<u32>) -> Vec<Event> {
    let store = &keep_out.store;
    let mut events = Vec::new();
    for (uid, dir) in store.orphans(only) {
        let Some(draft) = store.draft_of(uid, &dir) else { continue };
        let record = std::fs::read(dir.join(layer::RUN_RECORD))
            .ok()
            .and_then(|t| serde_json::from_slice::<layer::RunRecord>(&t).ok());
        let Some(record) = record.filter(|r| r.uid == uid) else {
            let _ = fs::remove_all(&dir);
            continue;
        };
        let run_id = record.run_id;
        match recover_one(keep_out, draft, record) {
            Ok(settled) => {
                tracing::warn!(run_id, uid, "the writes of a run its broker did not end are held");
                events.extend(settled.events);
            }
            Err(e) => tracing::error!(run_id, uid, dir = %dir.display(), "cannot hold a run's writes: {e}"),
        }
    }
    events.extend(stopped_applies(store, only));
    events
}

/// What an apply a broker stopped part-way (killed, crashed) left: each
/// such change set (`Applying`, its requester's lock free: no apply is
/// under way) says so, once, and is recorded; applying it again finishes it.
pub fn stopped_applies(store: &Store, only: Option<u32>) -> Vec<Event> {
    let mut events = Vec::new();
    let Ok(uids) = std::fs::read_dir(store.root()) else { return events };
    for u in uids.flatten() {
        let Some(uid) = u.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if only.is_some_and(|o| o != uid) {
            continue;
        }
        let Ok(sets) = std::fs::read_dir(u.path()) else { continue };
        let marked: Vec<std::path::PathBuf> =
            sets.flatten().map(|s| s.path()).filter(|d| d.join(APPLYING).exists()).collect();
        if marked.is_empty() {
            continue;
        }
        let Ok(Some(_lock)) = store.try_lock(uid) else { continue };
        for dir in marked {
            let Ok(mut m) = store.load(&dir) else { continue };
            let _ = std::fs::remove_file(dir.join(APPLYING));
            if m.status != Status::Applying {
                continue;
            }
            m.reason = format!(
                "{STOPPED_APPLY} (it was killed, or failed): part of it is on the host; \
                 `palisade changes apply {}` finishes it",
                m.id
            );
            if store.save(&dir, &m).is_ok() {
                tracing::warn!(uid, id = m.id, "a change set left part-applied");
                events.push(record(m.run_id, Some(&m.id), "held", &m.reason, &m.entries, &m.roots));
            }
        }
    }
    events
}

/// How the reason of a change set a stopped apply left begins.
const STOPPED_APPLY: &str = "its broker stopped while it applied it";
/// A change set's mark while an apply of it is under way: found with no
/// apply under way, its apply stopped part-way.
const APPLYING: &str = ".applying";

/// One orphaned draft's layers, held (see [`recover`]).
fn recover_one(
    keep_out: &KeepOut,
    draft: store::Draft,
    record: layer::RunRecord,
) -> std::io::Result<Settled> {
    let requester = record.requester();
    let uppers = (0..record.roots.len())
        .map(|i| store::open_dir(&layer::upper(&draft.dir, i)))
        .collect::<std::io::Result<Vec<_>>>()?;
    let dests = requester.act(|act| review::open_roots(&record.roots, act, requester.uid)).and_then(|r| {
        r.map_err(|e| std::io::Error::other(format!("{}: the run's writes stay in its draft", e.message)))
    });
    let (run_id, since) = (record.run_id, record.since);
    let in_place = in_place::record_of(&draft.dir);
    let layers = Layers { draft, record, dirs: vec![], uppers, settled: false };
    let dests = dests?;
    // A run that wrote in place: what it made that the host executes, taken out first.
    if let Some(in_place) = in_place {
        let taken = in_place::take_made(&requester, &keep_out.host_executed, &layers, &dests, &in_place);
        for left in taken.left.iter().chain(&taken.unchecked) {
            tracing::error!(run_id, "a file the host executes that a run made in place stays: {left}");
        }
    }
    let held = format!(
        "the broker stopped during run {run_id} (it was killed, or failed) before its writes were settled: \
         they are held, not applied"
    );
    let s = Settle {
        run_id,
        requester: &requester,
        keep_out,
        since,
        keep: KeepChanges::AlwaysHold,
        on_conflict: OnConflict::Hold,
        ended: None,
        bound: Some(held),
    };
    settle(&s, layers, dests).map_err(std::io::Error::other)
}
