//! Held change sets, as their requester reviews them: listed, shown with a
//! diff, applied, or discarded. A change set is its requester's alone: it
//! is looked up under the requester's uid only, and applied as the
//! requester, relative to its granted directories opened again with no
//! symlink on the way (the rules every run's paths follow).

use super::manifest::{Kind, Manifest, Status};
use super::{Settled, Store, apply, fs};
use crate::host::requester::{self, Requester};
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use palisade_protocol::wire::{ChangeEntry, ChangeSetDetail, ChangeSetInfo, Changes, ErrorKind, ErrorReply};
use std::ffi::CString;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The largest file a diff is shown for, on either side.
pub const DIFF_FILE_MAX_BYTES: u64 = 256 * 1024;
/// The largest diff `changes show` returns; the rest is cut, and said.
pub const DIFF_MAX_BYTES: usize = 1 << 20;

fn unknown(id: &str, uid: u32) -> ErrorReply {
    ErrorReply::with_rule(
        ErrorKind::InvalidRequest,
        format!("uid {uid} holds no change set {id:?} (palisade changes list)"),
        "changes.unknown",
    )
}

fn failed(what: &str, e: impl std::fmt::Display) -> ErrorReply {
    ErrorReply::new(ErrorKind::RuntimeFailure, format!("{what}: {e}"))
}

/// What `list` says of a change set.
pub fn info(m: &Manifest, bytes: u64) -> ChangeSetInfo {
    ChangeSetInfo {
        id: m.id.clone(),
        run_id: m.run_id,
        created: m.created,
        status: match m.status {
            Status::Held => "held".into(),
            Status::Applying => "partly_applied".into(),
        },
        reason: m.reason.clone(),
        roots: m.roots.clone(),
        entries: m.entries.len() as u64,
        bytes,
        conflicts: m.entries.iter().filter(|e| e.conflict).count() as u64,
        host_executed: m.entries.iter().filter(|e| e.host_executed.is_some()).count() as u64,
        broker: m.broker.clone(),
    }
}

/// `uid`'s held change sets, oldest first.
pub fn list(store: &Store, uid: u32) -> Vec<ChangeSetInfo> {
    store.list(uid).iter().map(|(m, bytes, _)| info(m, *bytes)).collect()
}

/// One of `requester`'s change sets: its paths and a diff of its text
/// files against the host's (read as the requester).
pub fn show(store: &Store, requester: &Requester, id: &str) -> Result<ChangeSetDetail, ErrorReply> {
    let dir = store.dir(requester.uid, id).ok_or_else(|| unknown(id, requester.uid))?;
    let m = store.load(&dir).map_err(|e| failed("the change set's manifest", e))?;
    let bytes = store.list(requester.uid).iter().find(|(x, _, _)| x.id == m.id).map_or(0, |(_, b, _)| *b);
    let entries = m
        .entries
        .iter()
        .map(|e| ChangeEntry {
            path: e.host_path(&m.roots),
            kind: match e.kind {
                Kind::File { .. } => "file",
                Kind::Symlink { .. } => "symlink",
                Kind::Dir { .. } => "dir",
                Kind::Delete => "delete",
                Kind::Fifo { .. } => "fifo",
                Kind::Socket { .. } => "socket",
            }
            .into(),
            size: match e.kind {
                Kind::File { size, .. } => size,
                _ => 0,
            },
            conflict: e.conflict,
            host_executed: e.host_executed.clone(),
        })
        .collect();
    let diff = requester.act(|act| diff(&m, &dir, act)).map_err(|e| failed("acting for the requester", e))?;
    Ok(ChangeSetDetail { info: info(&m, bytes), entries, diff })
}

/// A unified diff of the change set's text files against the host's, as
/// far as [`DIFF_MAX_BYTES`].
fn diff(m: &Manifest, dir: &Path, act: &requester::Acting) -> String {
    let mut out = String::new();
    for e in &m.entries {
        let path = e.host_path(&m.roots);
        // The change set's files are the broker's to read; the host's, the requester's.
        let theirs = |blob| act.as_broker(|| Ok(stored_text(m, dir, e, blob))).ok().flatten();
        let (new, old) = match &e.kind {
            Kind::File { blob, .. } => (theirs(*blob), host_text(&path)),
            Kind::Delete => (Some(String::new()), host_text(&path)),
            _ => continue,
        };
        // The header names the path escaped: a newline in it would forge a line of the diff.
        let name = palisade_cli::escape::name(&path);
        match (old, new) {
            (Some(old), Some(new)) => {
                let d = similar::TextDiff::from_lines(&old, &new);
                out.push_str(&d.unified_diff().context_radius(3).header(&name, &name).to_string());
            }
            _ => out.push_str(&format!(
                "Binary files (or larger than {DIFF_FILE_MAX_BYTES} bytes) {name} differ\n"
            )),
        }
        if out.len() > DIFF_MAX_BYTES {
            let mut cut = DIFF_MAX_BYTES;
            while !out.is_char_boundary(cut) {
                cut -= 1;
            }
            out.truncate(cut);
            out.push_str(&format!("\n[palisade: the diff is cut at {DIFF_MAX_BYTES} bytes]\n"));
            break;
        }
    }
    out
}

/// The change set's contents of file entry `e` (blob `blob` in a change
/// set of an earlier broker), as text.
fn stored_text(m: &Manifest, dir: &Path, e: &super::manifest::Entry, blob: u32) -> Option<String> {
    let (parent, name) = match m.layout {
        super::manifest::Layout::Blobs => (dir.join("blobs"), apply::blob_name(blob)),
        super::manifest::Layout::Tree => {
            let path = super::layer::upper(dir, e.root).join(e.rel());
            (path.parent()?.to_path_buf(), CString::new(path.file_name()?.as_bytes()).ok()?)
        }
    };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let parent = nix::fcntl::open(&parent, flags, nix::sys::stat::Mode::empty()).ok()?;
    read_text(&parent, &name)
}

/// The host's file at `path`, as text (empty when there is none).
fn host_text(path: &str) -> Option<String> {
    let p = Path::new(path);
    let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else { return None };
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let Ok(dir) = openat2(nix::fcntl::AT_FDCWD, parent, how) else { return Some(String::new()) };
    let dir = nix::fcntl::openat(
        &dir,
        c".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok()?;
    let name = CString::new(name.as_bytes()).ok()?;
    match fs::stat_at(&dir, &name) {
        Err(nix::errno::Errno::ENOENT) => Some(String::new()),
        _ => read_text(&dir, &name),
    }
}

fn read_text(dir: &OwnedFd, name: &std::ffi::CStr) -> Option<String> {
    let fd = fs::open_file_at(dir, name).ok()?;
    let mut bytes = Vec::new();
    std::fs::File::from(fd).take(DIFF_FILE_MAX_BYTES + 1).read_to_end(&mut bytes).ok()?;
    if bytes.len() as u64 > DIFF_FILE_MAX_BYTES {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// Applies one of `requester`'s held change sets, as the requester; what
/// is kept again (a conflict, a file the host executes) stays held.
pub fn apply_held(
    store: &Store,
    requester: &Requester,
    id: &str,
    choice: apply::Choice,
) -> Result<Settled, ErrorReply> {
    let _lock = store.lock(requester.uid).map_err(|e| failed("the change sets' lock", e))?;
    let dir = store.dir(requester.uid, id).ok_or_else(|| unknown(id, requester.uid))?;
    let mut m = store.load(&dir).map_err(|e| failed("the change set's manifest", e))?;
    if m.uid != requester.uid {
        return Err(unknown(id, requester.uid));
    }
    let roots = requester
        .act(|act| open_roots(&m.roots, act, requester.uid))
        .map_err(|e| failed("acting for the requester", e))??;
    // An apply that stopped part-way is finished: what it left is tidied.
    let resuming = m.status == Status::Applying;
    m.status = Status::Applying;
    store.save(&dir, &m).map_err(|e| failed("the change set's manifest", e))?;
    super::apply_and_keep(store, &dir, m, &roots, requester, (choice, resuming), Changes::default())
        .map_err(|e| failed("applying the change set", e))
}

/// The change set's granted directories, opened again as the requester:
/// no symlink on the way, readable, writable and its own.
pub(crate) fn open_roots(
    roots: &[String],
    act: &requester::Acting,
    uid: u32,
) -> Result<Vec<OwnedFd>, ErrorReply> {
    use std::os::unix::fs::MetadataExt;
    let _ = act;
    let mut out = Vec::new();
    for root in roots {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let fd = openat2(nix::fcntl::AT_FDCWD, root.as_str(), how).map_err(|e| match e {
            nix::errno::Errno::EACCES | nix::errno::Errno::EPERM => requester::not_allowed(root, uid),
            e => ErrorReply::with_rule(
                ErrorKind::WorkspaceScopeDenied,
                format!("{root} changed since the change set was taken ({e}): refused, not followed"),
                "scope.changed",
            ),
        })?;
        let owner =
            std::fs::File::from(fd.try_clone().map_err(|e| failed(root, e))?).metadata().map(|m| m.uid());
        let writable = requester::may(&fd, true).unwrap_or(false);
        if !writable || owner.ok() != Some(uid) && uid != 0 {
            return Err(requester::not_allowed(root, uid));
        }
        out.push(fd);
    }
    Ok(out)
}

/// Drops one of `uid`'s held change sets; the journal's record of it.
pub fn discard(store: &Store, uid: u32, id: &str) -> Result<crate::journal::Event, ErrorReply> {
    let _lock = store.lock(uid).map_err(|e| failed("the change sets' lock", e))?;
    let dir = store.dir(uid, id).ok_or_else(|| unknown(id, uid))?;
    // One whose manifest cannot be read goes too, recorded by its id alone.
    let m = store.load(&dir).ok();
    store.remove(&dir).map_err(|e| failed("removing the change set", e))?;
    let why = "discarded by its requester";
    Ok(match m {
        Some(m) => super::record(m.run_id, Some(&m.id), "discarded", why, &m.entries, &m.roots),
        None => super::record(0, Some(id), "discarded", why, &[], &[]),
    })
}

/// Answers a change set message of `requester`'s (`ListChanges`,
/// `ShowChanges`, `ApplyChanges`, `DiscardChanges`), recording what
/// changed in `journal`. Call where blocking is allowed.
/// `approver`: the peer is an approver, who alone may apply the files the
/// host executes (an agent speaking for its requester is not a person).
pub fn serve(
    store: &Store,
    journal: &crate::journal::Journal,
    requester: &Requester,
    approver: bool,
    message: palisade_protocol::wire::ClientMessage,
) -> palisade_protocol::wire::ServerMessage {
    use palisade_protocol::wire::{ClientMessage as C, ServerMessage as S};
    let record = |events: Vec<crate::journal::Event>| {
        if let Err(e) = journal.append_all_blocking(events, true) {
            tracing::error!(uid = requester.uid, "a change set's record is not written: {e}");
        }
    };
    let reply = match message {
        C::ListChanges => Ok(S::ChangeSets(list(store, requester.uid))),
        C::ShowChanges { id } => show(store, requester, &id).map(|d| S::ChangeSet(Box::new(d))),
        C::ApplyChanges { id, host_executed: true, .. } if !approver => Err(ErrorReply::with_rule(
            ErrorKind::Unauthorized,
            format!(
                "uid {} is not an approver: files the host executes are applied by one (an approver runs \
                 `palisade changes apply {id} --host-executed`; an operator names approvers in `[approvers] uids`)",
                requester.uid,
            ),
            "changes.host_executed",
        )),
        C::ApplyChanges { id, overwrite, host_executed } => {
            let choice = apply::Choice { overwrite, host_executed };
            apply_held(store, requester, &id, choice).map(|settled| {
                tracing::info!(
                    uid = requester.uid,
                    id,
                    files = settled.changes.files,
                    "a held change set applied"
                );
                record(settled.events);
                S::ChangesApplied(Box::new(settled.changes))
            })
        }
        C::DiscardChanges { id } => discard(store, requester.uid, &id).map(|event| {
            tracing::info!(uid = requester.uid, id, "a held change set discarded");
            record(vec![event]);
            S::ChangesDiscarded { id }
        }),
        other => {
            Err(ErrorReply::new(ErrorKind::ProtocolError, format!("not a change set message: {other:?}")))
        }
    };
    reply.unwrap_or_else(S::Error)
}
