//! systemd integration without libsystemd: readiness notification and socket
//! activation.

use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `state` (e.g. `READY=1`) to `$NOTIFY_SOCKET`, if set.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let path = path.to_string_lossy().into_owned();
    let addr = if let Some(name) = path.strip_prefix('@') {
        <SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(name.as_bytes())
    } else {
        SocketAddr::from_pathname(&path)
    };
    let sent = addr.and_then(|addr| UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &addr));
    if let Err(e) = sent {
        tracing::warn!("sd_notify {state:?} to {path}: {e}");
    }
}

/// The listening socket systemd passed (`LISTEN_FDS`, for this pid), if any.
pub fn activated_listener() -> Option<std::os::unix::net::UnixListener> {
    const SD_LISTEN_FDS_START: RawFd = 3;
    let pid: u32 = std::env::var("LISTEN_PID").ok()?.parse().ok()?;
    let fds: u32 = std::env::var("LISTEN_FDS").ok()?.parse().ok()?;
    if pid != std::process::id() || fds < 1 {
        return None;
    }
    if fds > 1 {
        tracing::warn!("{fds} sockets passed; using the first");
    }
    // SAFETY: systemd's protocol hands this process fd 3 as a listening socket;
    // nothing else in the process owns it.
    let listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(SD_LISTEN_FDS_START) };
    // SAFETY: setting FD_CLOEXEC on our own descriptor; no memory is involved.
    unsafe { libc::fcntl(SD_LISTEN_FDS_START, libc::F_SETFD, libc::FD_CLOEXEC) };
    Some(listener)
}
