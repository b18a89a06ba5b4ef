//! The daemon's memory between bursts. A long-running broker serves bursts
//! (a thousand clients at once, say) and then idles; glibc's allocator, left
//! to itself, keeps the pages a burst freed inside its heaps, and spread
//! across many of them. The daemon starts with glibc tuned to keep them
//! together, and an idle daemon hands them back. Elsewhere (musl, macOS)
//! both are no-ops.

/// Gives the allocator's free pages back to the system (an idle daemon
/// after a burst: see `crate::serve::server`).
pub fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory of the allocator's own
    // to the system; it takes no pointer and is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// glibc's tunables for a daemon that serves bursts and then idles: one
/// arena and no per-thread caches, so that what a burst freed lies together
/// and `malloc_trim` can hand it back. After bursts of 1,000 clients a
/// release build's idle daemon keeps 0.4 MiB more than before the first,
/// where with glibc's defaults it kept 2.8 MiB, and 4.1 MiB by the third
/// (bench/README.md, "Soak and load", has the other settings tried). And a
/// fixed mmap threshold (glibc's initial one, 128 KiB): every buffer from
/// there up (a large frame's, a run's stdin) is mapped on its own and
/// unmapped when freed, where glibc would otherwise raise the threshold
/// after the first such free and serve the next ones from its heap, whose
/// freed holes stay resident (32 clients each sending 4 MiB of an unfinished
/// frame under a 16 MiB budget: +21 to +26 MiB at the peak without it, +19
/// with it).
#[cfg(target_env = "gnu")]
const DAEMON_TUNABLES: &str =
    "glibc.malloc.arena_max=1:glibc.malloc.tcache_count=0:glibc.malloc.mmap_threshold=131072";

/// Starts the daemon again, once, with `DAEMON_TUNABLES` added to
/// `GLIBC_TUNABLES`: glibc reads them only when a program starts. Returns,
/// leaving glibc's defaults, where they are set already, where the person
/// set any of them themselves (or `MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`), in a privileged
/// (secure-execution) start, whose tunables glibc would drop, where the
/// program was started through the dynamic loader (`/proc/self/exe` is the
/// loader then), or where the exec fails. Call it first
/// in `main`, before any thread exists. Commands never see the variable:
/// the helper starts with an environment of its own.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        const NAME: &str = "GLIBC_TUNABLES";
        let current = std::env::var_os(NAME).unwrap_or_default();
        let current = current.to_string_lossy();
        // SAFETY: getauxval reads the auxiliary vector; it takes no pointer.
        let secure = unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
        let chosen = ["arena_max", "tcache_count", "mmap_threshold"]
            .iter()
            .any(|t| current.contains(&format!("glibc.malloc.{t}")))
            || ["MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_"].iter().any(|v| std::env::var_os(v).is_some());
        if secure || chosen || through_loader() {
            return;
        }
        let value = if current.is_empty() {
            DAEMON_TUNABLES.to_string()
        } else {
            format!("{current}:{DAEMON_TUNABLES}")
        };
        let pair = |k: &[u8], v: &[u8]| CString::new([k, b"=", v].concat());
        let env: Result<Vec<CString>, _> = std::env::vars_os()
            .filter(|(k, _)| k != NAME)
            .map(|(k, v)| pair(k.as_bytes(), v.as_bytes()))
            .chain([pair(NAME.as_bytes(), value.as_bytes())])
            .collect();
        let args: Result<Vec<CString>, _> = std::env::args_os().map(|a| CString::new(a.as_bytes())).collect();
        if let (Ok(env), Ok(args)) = (env, args) {
            // On success this does not return; on failure the daemon goes on as it is.
            let _ = nix::unistd::execve(c"/proc/self/exe", &args, &env);
        }
    }
}

/// Whether this program runs as the dynamic loader's argument (`ld.so
/// palisaded`), where executing `/proc/self/exe` would start the loader.
#[cfg(target_env = "gnu")]
fn through_loader() -> bool {
    let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
    let name = exe.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.starts_with("ld-linux") || name.starts_with("ld.so") || name.starts_with("ld64.so")
}
