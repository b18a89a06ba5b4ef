//! When a run took its view of the host's files, and whether a host entry
//! changed after that.
//!
//! A file's status change time (ctime) is the kernel's real-time clock as
//! it stood at the change: its coarse reading (a tick, 1 to 10 ms, behind
//! the precise one), or a precise one where the kernel keeps multigrain
//! times. Either way it is never later than the precise clock at the
//! change, and never earlier than the coarse clock then. So a view taken
//! at the precise reading `ns` splits the host's changes exactly once the
//! coarse clock has passed `ns` ([`Since::fence`]): every change before
//! the reading has a time at or before `ns`, every change after the fence
//! a time after it. The command is released only after the fence; a change
//! between the reading and the fence (truly concurrent with the run's
//! start) counts as during the run: it holds the run's version, it never
//! loses the host's. Nothing compares a file time with a clock read in the
//! same tick: a run started right after another's apply, or right after a
//! person's edit, sees them as before it.
//!
//! A clock set back during the run (NTP stepping it, a resumed virtual
//! machine) would make later changes look earlier: the real-time clock's
//! distance from the boot-time clock, which nothing sets, is kept with the
//! view, and a step back since widens the window by its size.

use serde::{Deserialize, Serialize};

/// A run's view of the host's files: when it was taken (ns, the precise
/// real-time clock) and how far that clock stood from the boot-time clock.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Since {
    pub ns: i128,
    /// `CLOCK_REALTIME - CLOCK_BOOTTIME` at `ns`.
    #[serde(default)]
    pub offset_ns: i128,
}

/// How far two readings of the clocks' distance may differ without a step:
/// the two clocks are read one after the other, microseconds apart.
const STEP_SLACK_NS: i128 = 1_000_000;
/// The longest [`Since::fence`] waits: ten ticks of the slowest kernel
/// clock (100 Hz); only a clock set back meanwhile makes it wait so long.
const FENCE_MAX: std::time::Duration = std::time::Duration::from_millis(100);

fn read(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is valid for writing for the duration of the call.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ns(ts.tv_sec, ts.tv_nsec)
}

/// A timestamp in nanoseconds.
pub fn ns(sec: i64, nsec: i64) -> i128 {
    i128::from(sec) * 1_000_000_000 + i128::from(nsec)
}

/// `CLOCK_REALTIME - CLOCK_BOOTTIME` now.
fn offset() -> i128 {
    let boot = read(libc::CLOCK_BOOTTIME);
    read(libc::CLOCK_REALTIME) - boot
}

impl Since {
    pub fn now() -> Since {
        let offset_ns = offset();
        Since { ns: read(libc::CLOCK_REALTIME), offset_ns }
    }

    /// How long until every file time the kernel gives is later than this
    /// view (`None`: already).
    pub fn fence_left(&self) -> Option<std::time::Duration> {
        let coarse = read(libc::CLOCK_REALTIME_COARSE);
        (coarse <= self.ns).then(|| {
            // The coarse clock moves a tick at a time: the rest of one, at least.
            let left = (self.ns - coarse).clamp(0, 20_000_000) as u64;
            std::time::Duration::from_nanos(left.max(200_000))
        })
    }

    /// Returns once the coarse clock has passed this view: at most a tick,
    /// or [`FENCE_MAX`] where the clock was set back meanwhile (which
    /// [`Since::threshold`] accounts for).
    pub async fn fence(&self) {
        let start = std::time::Instant::now();
        while let Some(left) = self.fence_left().filter(|_| start.elapsed() < FENCE_MAX) {
            tokio::time::sleep(left).await;
        }
    }

    /// [`Since::fence`], on a thread that may block.
    pub fn fence_blocking(&self) {
        let start = std::time::Instant::now();
        while let Some(left) = self.fence_left().filter(|_| start.elapsed() < FENCE_MAX) {
            std::thread::sleep(left);
        }
    }

    /// The time a host entry's ctime must be later than to have changed
    /// after this view: the view, less `margin` (a filesystem that keeps
    /// another clock) and less any step back of the real-time clock since.
    pub fn threshold(&self, margin: i128) -> i128 {
        let back = (self.offset_ns - offset() - STEP_SLACK_NS).max(0);
        // A view of before the clocks' distance was kept (0) widens nothing.
        let back = if self.offset_ns == 0 { 0 } else { back };
        self.ns - margin - back
    }
}

/// How far before a view a change still counts as after it, on the
/// filesystem of `dir`: none where it keeps the kernel's clock to the
/// nanosecond (ext4, xfs, btrfs, tmpfs, ...); two seconds elsewhere (a
/// network filesystem keeps its server's clock; FAT keeps two-second
/// times): a spurious conflict only holds the run's version, a missed one
/// would overwrite.
pub fn margin(dir: &std::os::fd::OwnedFd) -> i128 {
    use nix::sys::statfs::{BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, FsType, TMPFS_MAGIC, fstatfs};
    // Named here: nix has no XFS constant against musl, which the release binaries are built for.
    const XFS_SUPER_MAGIC: FsType = FsType(0x5846_5342);
    const F2FS_SUPER_MAGIC: FsType = FsType(0xF2F5_2010);
    const ZFS_SUPER_MAGIC: FsType = FsType(0x2FC1_2FC1);
    let nanosecond = [
        EXT4_SUPER_MAGIC,
        XFS_SUPER_MAGIC,
        BTRFS_SUPER_MAGIC,
        TMPFS_MAGIC,
        F2FS_SUPER_MAGIC,
        ZFS_SUPER_MAGIC,
    ];
    let local = fstatfs(dir).is_ok_and(|s| nanosecond.contains(&s.filesystem_type()));
    if local { 0 } else { 2_000_000_000 }
}

/// Whether a host entry of status `st` changed after `threshold` (see
/// [`Since::threshold`]).
pub fn changed_after(st: &nix::sys::stat::FileStat, threshold: i128) -> bool {
    ns(st.st_ctime, st.st_ctime_nsec) > threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_made_before_the_view_is_before_it_and_one_after_the_fence_after_it() {
        let dir = std::env::temp_dir().join(format!("palisade-clock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let stat = |p: &std::path::Path| nix::sys::stat::lstat(p).unwrap();
        for i in 0..200 {
            let before = dir.join(format!("b{i}"));
            std::fs::write(&before, "x").unwrap();
            let since = Since::now();
            since.fence_blocking();
            let after = dir.join(format!("a{i}"));
            std::fs::write(&after, "y").unwrap();
            let t = since.threshold(0);
            assert!(!changed_after(&stat(&before), t), "a write before the view, round {i}");
            assert!(changed_after(&stat(&after), t), "a write after the fence, round {i}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_clock_set_back_widens_the_window_by_the_step() {
        let now = Since::now();
        let stepped = Since { ns: now.ns, offset_ns: now.offset_ns + 5_000_000_000 };
        assert!(stepped.threshold(0) <= now.ns - 4_000_000_000);
        assert_eq!(Since { ns: 7, offset_ns: 0 }.threshold(2), 5, "no distance kept: no widening");
    }
}
