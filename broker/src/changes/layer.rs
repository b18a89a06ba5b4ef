//! A run's layers: where the writes of each of its overlays go, on disk,
//! in the change set being made for it (`<store>/<uid>/.new-<instance>-<id>/`):
//! for overlay `i`, the directory `i/` holding `upper/` (the run's writes,
//! as overlayfs keeps them) and `work/` (overlayfs's own), and beside them
//! `run.json`, what a broker that finds the draft after a crash needs to
//! hold the run's writes ([`super::recover`]).
//!
//! On disk, a run's writes are not bounded by memory (a build's outputs
//! reach gigabytes), they outlive a broker killed during the run, and once
//! the run is over they are the change set's contents where they lie: the
//! capture takes them in place, and an apply moves them onto the host
//! where the store and the granted directory share a filesystem.
//!
//! A layer is the requester's own, as its granted directory is: a broker
//! acting only as itself makes it as the requester, and a system broker
//! makes it the requester's and idmaps it into the sandbox as it idmaps a
//! granted directory (`engine/capture.rs`), so that every file the sandbox
//! writes there is the requester's on disk, read and moved as the
//! requester. The store's directories above it stay the broker's (0700):
//! the requester reaches nothing of it but through the broker.

use super::clock::Since;
use super::store::{Draft, Store};
use crate::host::requester::Requester;
use palisade_protocol::HostIds;
use serde::{Deserialize, Serialize};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The record of the run a draft's layers are for.
pub const RUN_RECORD: &str = "run.json";

/// What a broker needs to hold a run's writes after a crash.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct RunRecord {
    pub run_id: u64,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// The granted directories (host paths), one per layer, in order.
    pub roots: Vec<String>,
    pub since: Since,
    /// Seconds since the epoch.
    pub created: u64,
}

impl RunRecord {
    pub fn requester(&self) -> Requester {
        Requester { uid: self.uid, gid: self.gid, groups: self.groups.clone() }
    }
}

/// A run's layers, in the draft of its change set. Dropped unsettled (a
/// run that failed before its writes were taken), they are removed when
/// the run wrote nothing, and otherwise left for [`super::recover`].
pub struct Layers {
    pub draft: Draft,
    pub record: RunRecord,
    /// Each overlay's layer directory (`i/`): its host path, and the
    /// broker's descriptor of it (sent with the plan).
    pub dirs: Vec<(String, OwnedFd)>,
    /// Each overlay's upper directory, the broker's descriptor.
    pub uppers: Vec<OwnedFd>,
    pub(super) settled: bool,
}

/// `layer/upper`, `layer/work`.
const UPPER: &str = "upper";
const WORK: &str = "work";

impl Store {
    /// Layers for the overlays of `roots` (the granted directories, in the
    /// plan's order), for run `run_id` of `requester`; `owner`: the
    /// requester's ids, where the broker is not the requester (a system broker).
    pub fn layers(
        &self,
        requester: &Requester,
        run_id: u64,
        roots: &[String],
        owner: Option<HostIds>,
        since: Since,
    ) -> io::Result<Layers> {
        let draft = self.draft(requester.uid)?;
        let record = RunRecord {
            run_id,
            uid: requester.uid,
            gid: requester.gid,
            groups: requester.groups.clone(),
            roots: roots.to_vec(),
            since,
            created: super::now_secs(),
        };
        let made = make(&draft.dir, &record, owner);
        match made {
            Ok((dirs, uppers)) => Ok(Layers { draft, record, dirs, uppers, settled: false }),
            Err(e) => {
                let _ = super::fs::remove_all(&draft.dir);
                Err(e)
            }
        }
    }
}

/// Each layer's directory (its path and descriptor), and its upper directory.
type Made = (Vec<(String, OwnedFd)>, Vec<OwnedFd>);

/// The record, then each layer's directories, owned by `owner` where given.
fn make(dir: &Path, record: &RunRecord, owner: Option<HostIds>) -> io::Result<Made> {
    let text = serde_json::to_vec(record).map_err(io::Error::other)?;
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(dir.join(RUN_RECORD))?;
    std::io::Write::write_all(&mut f, &text)?;
    let (mut dirs, mut uppers) = (Vec::new(), Vec::new());
    for i in 0..record.roots.len() {
        let layer = dir.join(i.to_string());
        for d in [layer.clone(), layer.join(UPPER), layer.join(WORK)] {
            std::fs::DirBuilder::new().mode(0o700).create(&d)?;
            if let Some(ids) = owner {
                std::os::unix::fs::chown(&d, Some(ids.uid), Some(ids.gid))?;
            }
        }
        let path = layer.to_str().ok_or_else(|| io::Error::other(format!("{layer:?} is not UTF-8")))?;
        dirs.push((path.to_string(), super::store::open_dir(&layer)?));
        uppers.push(super::store::open_dir(&layer.join(UPPER))?);
    }
    Ok((dirs, uppers))
}

/// Layer `i`'s upper directory in the change set `dir`.
pub fn upper(dir: &Path, i: usize) -> PathBuf {
    dir.join(i.to_string()).join(UPPER)
}

/// Removes what overlayfs kept in the layers' work directories: nothing of
/// the run's (best effort: a change set without them is whole).
pub fn drop_work(dir: &Path, layers: usize) {
    for i in 0..layers {
        let _ = super::fs::remove_all(&dir.join(i.to_string()).join(WORK));
    }
}

impl Layers {
    /// Whether the run wrote nothing in any of its layers.
    pub fn untouched(&self) -> bool {
        self.uppers.iter().all(super::untouched)
    }
}

impl Drop for Layers {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if self.untouched() {
            let _ = super::fs::remove_all(&self.draft.dir);
            return;
        }
        tracing::error!(
            run_id = self.record.run_id,
            dir = %self.draft.dir.display(),
            "the run's writes were not settled: they are held at the broker's next start"
        );
    }
}
