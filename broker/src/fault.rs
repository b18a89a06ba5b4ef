//! Fault injection for the test suite (`tests/tests/all/faults.rs`), compiled
//! into debug builds only: in a release build every hook here is a no-op
//! and the variables below are not read.
//!
//! - `PALISADE_FAULT_PANIC=TOKEN`: a run whose argv holds `TOKEN` panics in
//!   the broker once its sandbox is running.
//! - `PALISADE_HELPER_FAULT=STAGE`: passed on to every helper, which stops at
//!   that stage of its order (named `fault-STAGE`) until it is killed.
//! - `PALISADE_FAULT_SPAWN=ERRNO:N` (`ENOMEM`, `EAGAIN` or `EMFILE`): the
//!   first `N` helpers fail to start with that error, as when the host is
//!   out of memory, processes or descriptors.
//! - `PALISADE_FAULT_APPLY=N`: the broker dies (SIGKILL to itself) after
//!   applying `N` entries of a change set, as a broker that crashes in the
//!   middle of an apply.
//! - `PALISADE_FAULT_APPLY_WINDOW=FILE`: before each entry of a change set
//!   replaces the host's (or removes it), the broker writes the entry's
//!   path into `FILE` and waits (10 s at most) until `FILE` is removed: a
//!   test edits the host's file in the window between the check and the
//!   replacement.
//! - `PALISADE_FAULT_NO_RENAME_FLAGS=1`: `renameat2` with a flag
//!   (`RENAME_EXCHANGE`, `RENAME_NOREPLACE`) fails with `EINVAL`, as on a
//!   filesystem without them: an apply takes its fallbacks.
//! - `PALISADE_FAULT_RECORD=N`: the start records of the first `N` runs are
//!   answered as not written, 1 s after the journal's own answer (as a sync
//!   that fails late), while their sandboxes are built.

/// The variable the helper reads (see `helper/src/jail/fault.rs`).
const HELPER_FAULT: &str = "PALISADE_HELPER_FAULT";

/// Panics if this run is the one `PALISADE_FAULT_PANIC` names.
pub fn panic_if_named(argv: &[String]) {
    if cfg!(debug_assertions) {
        if let Some(token) = std::env::var_os("PALISADE_FAULT_PANIC") {
            if argv.iter().any(|a| std::ffi::OsStr::new(a) == token) {
                panic!("fault injected (PALISADE_FAULT_PANIC) into a run of {argv:?}");
            }
        }
    }
}

/// `PALISADE_HELPER_FAULT=STAGE` for the helper's environment, when the
/// broker has it in its own.
pub fn helper_env() -> Option<std::ffi::CString> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let stage = std::env::var(HELPER_FAULT).ok()?;
    std::ffi::CString::new(format!("{HELPER_FAULT}={stage}")).ok()
}

/// The error `PALISADE_FAULT_SPAWN` puts in place of this helper's start,
/// while its count lasts.
pub fn spawn_error() -> Option<std::io::Error> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static FAILED: AtomicUsize = AtomicUsize::new(0);
    if !cfg!(debug_assertions) {
        return None;
    }
    let asked = std::env::var("PALISADE_FAULT_SPAWN").ok()?;
    let (name, count) = asked.split_once(':')?;
    let errno = match name {
        "ENOMEM" => libc::ENOMEM,
        "EAGAIN" => libc::EAGAIN,
        "EMFILE" => libc::EMFILE,
        _ => return None,
    };
    let count: usize = count.parse().ok()?;
    (FAILED.fetch_add(1, Ordering::Relaxed) < count).then(|| std::io::Error::from_raw_os_error(errno))
}

/// Kills this process, as a crash would, once `PALISADE_FAULT_APPLY`
/// entries of a change set have been applied.
pub fn die_after_applying(applied: usize) {
    if !cfg!(debug_assertions) {
        return;
    }
    let Some(n) = std::env::var("PALISADE_FAULT_APPLY").ok().and_then(|n| n.parse::<usize>().ok()) else {
        return;
    };
    if applied >= n {
        // SAFETY: kill with this process's own pid; nothing is passed in memory.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// Holds the apply of `rel` while `PALISADE_FAULT_APPLY_WINDOW`'s file exists.
pub fn apply_window(rel: &std::path::Path) {
    if !cfg!(debug_assertions) {
        return;
    }
    let Some(marker) = std::env::var_os("PALISADE_FAULT_APPLY_WINDOW") else { return };
    let marker = std::path::PathBuf::from(marker);
    // Whole when it appears: written aside, then renamed.
    let aside = marker.with_extension("new");
    let written = std::fs::write(&aside, rel.as_os_str().as_encoded_bytes())
        .and_then(|()| std::fs::rename(&aside, &marker));
    if written.is_err() {
        return;
    }
    let start = std::time::Instant::now();
    while marker.exists() && start.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Whether `PALISADE_FAULT_NO_RENAME_FLAGS` takes `renameat2`'s flags away.
pub fn no_rename_flags() -> bool {
    cfg!(debug_assertions) && std::env::var_os("PALISADE_FAULT_NO_RENAME_FLAGS").is_some_and(|v| v == "1")
}

/// The error `PALISADE_FAULT_RECORD` puts in place of this run's start
/// records being on disk, after a delay, while its count lasts.
pub async fn start_not_recorded() -> Option<crate::journal::JournalError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static FAILED: AtomicUsize = AtomicUsize::new(0);
    if !cfg!(debug_assertions) {
        return None;
    }
    let count: usize = std::env::var("PALISADE_FAULT_RECORD").ok()?.parse().ok()?;
    if FAILED.fetch_add(1, Ordering::Relaxed) >= count {
        return None;
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    Some(crate::journal::JournalError::Io("fault injected (PALISADE_FAULT_RECORD)".into()))
}
