//! A run's writes bounded on disk: while the run goes on, the broker checks
//! its layers against the run's bound (`max_disk_mb`, and as many files as
//! a tmpfs of that size would hold) and the filesystem's free-space floor
//! (`[changes] min_free_mb`), and stops the run at the first one passed
//! (`DiskLimitExceeded`): its writes are held, never applied.
//!
//! Each check is one `statvfs` of the layers' filesystem, every
//! [`DISK_CHECK_MS`]: the layers themselves are walked (each file's
//! allocated blocks counted once, however many names it has) only when the
//! filesystem has grown by the rest of the bound since the last walk, or
//! is below its floor. A run that writes faster than a check sees may pass
//! its bound by what it writes in that time; one that wrote all it wrote
//! between two checks is caught by the same check when it is over, before
//! its writes are settled ([`Watch::passed_at_end`]). A directory the run
//! closed to its owner counts as all the filesystem grew by since the run
//! started.

use palisade_policy::config::DISK_CHECK_MS;
use palisade_protocol::tmpfs_inodes;
use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

/// What a run's writes may take.
pub struct Watch {
    /// Each layer's upper directory: what the run wrote (overlayfs's work
    /// directory holds a file only while it copies it up, and is its own).
    layers: Vec<OwnedFd>,
    bound: u64,
    files: u64,
    floor: u64,
    /// The filesystem's figures before the run wrote.
    start: Option<Usage>,
}

/// What the layers hold: bytes on disk, entries, and whether every
/// directory was read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub bytes: u64,
    pub files: u64,
    pub complete: bool,
}

/// The filesystem's figures: bytes and files in use, bytes free.
#[derive(Debug, Clone, Copy)]
struct Usage {
    used: u64,
    files: u64,
    free: u64,
}

fn usage(fd: &OwnedFd) -> io::Result<Usage> {
    let s = nix::sys::statvfs::fstatvfs(fd)?;
    let block = s.fragment_size();
    Ok(Usage {
        used: (s.blocks() - s.blocks_free()).saturating_mul(block),
        files: s.files().saturating_sub(s.files_free()),
        free: s.blocks_available().saturating_mul(block),
    })
}

impl Watch {
    /// The bound `bound` (bytes) of the writes in `layers` (the broker's
    /// descriptors of each layer's upper directory), on a filesystem that
    /// keeps `floor` bytes free.
    pub fn new(layers: Vec<OwnedFd>, bound: u64, floor: u64) -> Watch {
        let start = layers.first().and_then(|l| usage(l).ok());
        Watch { layers, bound, files: tmpfs_inodes(bound), floor, start }
    }

    /// Another watch of the same layers, bound and start.
    pub fn try_clone(&self) -> io::Result<Watch> {
        let layers = self.layers.iter().map(OwnedFd::try_clone).collect::<io::Result<_>>()?;
        Ok(Watch { layers, ..*self })
    }

    /// Why the run's writes are past a bound once it is over (`None`: they
    /// are not, or the filesystem cannot be read): a run that wrote all it
    /// wrote between two of [`Watch::exceeded`]'s looks is caught here.
    pub async fn passed_at_end(self) -> Option<String> {
        let (first, start) = (self.layers.first()?, self.start?);
        let now = usage(first).ok()?;
        let low = self.floor > 0 && now.free < self.floor;
        if !low && now.used < start.used.saturating_add(self.bound) && now.files < start.files + self.files {
            return None;
        }
        self.passed(&self.held(now, start).await, low)
    }

    /// What the layers hold, measured; what could not be read counts as
    /// all the filesystem grew by since `start`.
    async fn held(&self, now: Usage, start: Usage) -> Held {
        let layers: Vec<OwnedFd> = self.layers.iter().filter_map(|l| l.try_clone().ok()).collect();
        let held = tokio::task::spawn_blocking(move || measure(&layers)).await.unwrap_or_default();
        match held.complete {
            true => held,
            false => Held {
                bytes: held.bytes.max(now.used.saturating_sub(start.used)),
                files: held.files.max(now.files.saturating_sub(start.files)),
                complete: false,
            },
        }
    }

    /// Completes when the run's writes pass their bound, or the
    /// filesystem's floor: why, in words naming the key. Never, where the
    /// filesystem cannot be read.
    pub async fn exceeded(self) -> String {
        let (Some(first), Some(start)) = (self.layers.first(), self.start) else {
            return std::future::pending().await;
        };
        let (mut bytes_at, mut files_at) = (start.used.saturating_add(self.bound), start.files + self.files);
        let mut tick = tokio::time::interval(Duration::from_millis(DISK_CHECK_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Ok(now) = usage(first) else { continue };
            let low = self.floor > 0 && now.free < self.floor;
            if !low && now.used < bytes_at && now.files < files_at {
                continue;
            }
            let held = self.held(now, start).await;
            if let Some(why) = self.passed(&held, low) {
                return why;
            }
            bytes_at = now.used.saturating_add(self.bound - held.bytes);
            files_at = now.files.saturating_add(self.files - held.files);
            if low {
                // Below the floor by others' writes, not the run's: looked at again in a while.
                tokio::time::sleep(Duration::from_millis(DISK_CHECK_MS * 25)).await;
            }
        }
    }

    /// Why `held` is past a bound, if it is (`low`: the filesystem is below its floor).
    fn passed(&self, held: &Held, low: bool) -> Option<String> {
        use palisade_protocol::attest::exact_size;
        if held.bytes > self.bound {
            return Some(format!(
                "its writes passed their bound of {} (max_disk_mb), at {}",
                exact_size(self.bound),
                exact_size(held.bytes)
            ));
        }
        if held.files > self.files {
            return Some(format!(
                "its writes passed their bound of {} files (max_disk_mb: one file per {} KiB of it)",
                self.files,
                palisade_protocol::plan::TMPFS_BYTES_PER_INODE >> 10
            ));
        }
        (low && held.bytes > 0).then(|| {
            format!(
                "the filesystem holding its writes has less than {} free ([changes] min_free_mb), {} of it \
                 the run's",
                exact_size(self.floor),
                exact_size(held.bytes)
            )
        })
    }
}

/// What `layers` hold (see [`Held`]).
pub fn measure(layers: &[OwnedFd]) -> Held {
    let mut held = Held { complete: true, ..Held::default() };
    let mut seen = std::collections::HashSet::new();
    for layer in layers {
        if walk(layer, &mut held, &mut seen, 0).is_err() {
            held.complete = false;
        }
    }
    held
}

fn walk(
    dir: &OwnedFd,
    held: &mut Held,
    seen: &mut std::collections::HashSet<u64>,
    depth: usize,
) -> io::Result<()> {
    if depth > super::capture::MAX_DEPTH {
        held.complete = false;
        return Ok(());
    }
    for name in super::fs::names(dir)? {
        let Ok(st) = super::fs::stat_at(dir, &name) else { continue };
        held.files += 1;
        if st.st_nlink <= 1 || seen.insert(st.st_ino) {
            held.bytes += super::fs::allocated(&st);
        }
        if super::fs::kind(&st) == nix::sys::stat::SFlag::S_IFDIR {
            match super::fs::open_dir_at(dir, &name) {
                Ok(sub) => {
                    if walk(&sub, held, seen, depth + 1).is_err() {
                        held.complete = false;
                    }
                }
                Err(_) => held.complete = false,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Watch;
    use std::os::fd::OwnedFd;

    fn layer(dir: &std::path::Path) -> OwnedFd {
        std::fs::File::open(dir).unwrap().into()
    }

    /// A run that wrote past its bound between two of the watch's looks
    /// (here: no look at all while it ran) is caught when it is over; one
    /// within its bound is not.
    #[tokio::test]
    async fn writes_past_the_bound_are_caught_when_the_run_is_over() {
        let dir = std::env::temp_dir().join(format!("palisade-bound-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let watch = Watch::new(vec![layer(&dir)], 1 << 20, 0);
        let within = watch.try_clone().unwrap();
        std::fs::write(dir.join("small"), vec![1u8; 64 << 10]).unwrap();
        assert_eq!(within.passed_at_end().await, None);
        std::fs::write(dir.join("big"), vec![1u8; 4 << 20]).unwrap();
        let why = watch.passed_at_end().await.expect("the bound passed");
        assert!(why.contains("(max_disk_mb)"), "{why}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
