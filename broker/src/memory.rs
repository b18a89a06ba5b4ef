//! The daemon's memory between bursts. A long-running broker serves bursts
//! (a thousand clients at once, say) and then idles; glibc's allocator, left
//! to itself, keeps the pages a burst freed inside its heaps. They are
//! handed back here. Elsewhere (musl, macOS) this is a no-op.

/// Gives the allocator's free pages back to the system (an idle daemon
/// after a burst: see `crate::server`).
pub fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory of the allocator's own
    // to the system; it takes no pointer and is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}
