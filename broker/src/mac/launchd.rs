//! Socket activation by launchd: the listening sockets launchd made for an
//! entry of the job's `Sockets` dictionary, handed over once.

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};

// libSystem's (`<launch.h>`), macOS 10.10 and later.
unsafe extern "C" {
    fn launch_activate_socket(
        name: *const libc::c_char,
        fds: *mut *mut libc::c_int,
        cnt: *mut libc::size_t,
    ) -> libc::c_int;
}

/// The sockets of the `Sockets` entry `name`; `None` when launchd did not
/// start this process for a job with sockets (`ESRCH`). Any other failure
/// (no entry of that name, sockets already taken) is an error: a broker
/// started by launchd must not bind a socket of its own instead.
pub fn activated(name: &str) -> std::io::Result<Option<Vec<OwnedFd>>> {
    let c_name = CString::new(name).map_err(std::io::Error::other)?;
    let mut fds: *mut libc::c_int = std::ptr::null_mut();
    let mut count: libc::size_t = 0;
    // SAFETY: `c_name` is a NUL-terminated string that outlives the call;
    // `fds` and `count` are valid for writing. On success launchd gives us
    // an array of `count` descriptors allocated with malloc.
    let rc = unsafe { launch_activate_socket(c_name.as_ptr(), &mut fds, &mut count) };
    match rc {
        0 => {}
        libc::ESRCH => return Ok(None),
        e => {
            let e = std::io::Error::from_raw_os_error(e);
            return Err(std::io::Error::new(e.kind(), format!("launchd socket {name:?}: {e}")));
        }
    }
    let given: &[libc::c_int] = match fds.is_null() {
        true => &[],
        // SAFETY: on success `fds` points to `count` descriptors, which launchd hands over.
        false => unsafe { std::slice::from_raw_parts(fds, count) },
    };
    let owned = given
        .iter()
        .map(|&fd| {
            // Close-on-exec (launchd leaves it inheritable): no command is given the socket.
            // SAFETY: fcntl takes a descriptor number; each is owned once, here.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            // SAFETY: launchd opened `fd` for this process and nothing else owns it.
            unsafe { OwnedFd::from_raw_fd(fd) }
        })
        .collect();
    // SAFETY: the array was allocated by launchd with malloc, and is not used after.
    unsafe { libc::free(fds.cast()) };
    Ok(Some(owned))
}
