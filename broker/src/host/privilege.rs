//! Whether this broker serves other users.
//!
//! A system broker acts as each requester and gives their sandboxes host ids
//! of their own. It is either root (bounded by the unit's capability
//! bounding set) or a dedicated user holding the capabilities that work
//! needs as ambient ones (the system unit: `User=palisade`,
//! `AmbientCapabilities=`). Any other broker acts only as itself: it serves
//! its own uid and root.

/// Whether this process serves other users: it is root, or (Linux) it holds
/// `CAP_SETUID` in its effective set, without which it cannot act as another
/// uid. Read once: a broker's own credentials do not change while it runs.
pub fn serves_others() -> bool {
    static SYSTEM: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SYSTEM.get_or_init(|| nix::unistd::geteuid().is_root() || holds_setuid())
}

#[cfg(target_os = "linux")]
fn holds_setuid() -> bool {
    caps::has_cap(None, caps::CapSet::Effective, caps::Capability::CAP_SETUID).unwrap_or(false)
}

#[cfg(not(target_os = "linux"))]
fn holds_setuid() -> bool {
    false
}

static EMBEDDED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// This process is the CLI's (`palisaded cli`): a broker it embeds keeps
/// its state, journal and run directories where a user's would, root's
/// included (root's `palisade run` is root's own, not the system broker's,
/// whose directories a later start of the system unit must find its own).
pub fn mark_embedded() {
    EMBEDDED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`mark_embedded`] was called.
pub fn embedded() -> bool {
    EMBEDDED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether this process keeps the system broker's directories
/// (`/var/lib/palisade`, `/run/palisade`): it serves others and is not
/// the CLI's.
pub fn system_paths() -> bool {
    serves_others() && !embedded()
}
