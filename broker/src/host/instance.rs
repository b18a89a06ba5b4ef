//! This broker among others. What it creates in places other brokers may
//! share (a cgroup subtree, `temp_root`) is named after its instance, `<pid>-<start
//! time>`: brokers tell theirs apart, and what a dead one left is recognised
//! as such (a pid alone could have been reused).

use std::sync::OnceLock;

/// `<pid>-<start time>` of this process.
pub fn tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let pid = std::process::id();
        format!("{pid}-{}", start_time(pid).unwrap_or(0))
    })
}

/// A process's start time: clock ticks after boot, from `/proc/PID/stat`.
#[cfg(not(target_os = "macos"))]
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name (which may hold spaces): field 3 onwards; the start time is field 22.
    stat.rsplit_once(") ")?.1.split_whitespace().nth(19)?.parse().ok()
}

/// A process's start time: microseconds since the epoch, from `proc_pidinfo`.
#[cfg(target_os = "macos")]
pub fn start_time(pid: u32) -> Option<u64> {
    // SAFETY: proc_bsdinfo is plain old data; all-zero is valid.
    let mut info: libc::proc_bsdinfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::proc_bsdinfo>() as libc::c_int;
    // SAFETY: `info` is valid for writing `size` bytes.
    let n = unsafe {
        libc::proc_pidinfo(pid as libc::c_int, libc::PROC_PIDTBSDINFO, 0, (&raw mut info).cast(), size)
    };
    (n == size).then(|| info.pbi_start_tvsec * 1_000_000 + info.pbi_start_tvusec)
}

/// Removes what dead instances left in `dir`: the entries named
/// `PREFIX<instance>...` whose instance is not a live process.
pub fn remove_orphans(dir: &std::path::Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(instance) = name.strip_prefix(prefix) else { continue };
        if !alive(instance) {
            tracing::warn!(path = %e.path().display(), "removing what a dead broker left behind");
            let removed = match e.file_type() {
                Ok(t) if t.is_dir() => std::fs::remove_dir_all(e.path()),
                _ => std::fs::remove_file(e.path()),
            };
            if let Err(err) = removed {
                tracing::warn!("cannot remove {}: {err}", e.path().display());
            }
        }
    }
}

/// Whether the instance a name begins with (`<pid>-<start>-...`) is a live
/// process. A name that does not begin with one is not alive.
pub fn alive(name: &str) -> bool {
    let mut parts = name.split('-').map(|p| p.parse::<u64>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(pid), Some(started)) => u32::try_from(pid).ok().and_then(start_time) == Some(started),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_is_alive_and_an_earlier_one_with_its_pid_is_not() {
        let me = super::tag();
        assert!(super::alive(&format!("{me}-7")));
        let pid = std::process::id();
        let start = super::start_time(pid).unwrap();
        assert!(!super::alive(&format!("{pid}-{}-7", start + 1)));
        assert!(!super::alive("not-an-instance"));
    }
}
