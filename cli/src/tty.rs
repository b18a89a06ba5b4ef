//! `palisade run` in a terminal (`-t`, or by itself when stdin and stdout
//! are terminals): this terminal's window is the run's, resized with it,
//! and its keys go to the run's own terminal untouched (raw mode, so that
//! Ctrl-C and Ctrl-Z reach the command through its terminal rather than
//! stopping the CLI), until the run ends.

use palisade_protocol::wire::WindowSize;
use std::io::IsTerminal;

/// The window a run without one of its own gets (a terminal's usual size).
const DEFAULT_WINDOW: WindowSize = WindowSize { rows: 24, cols: 80 };

/// The terminal a run asks for: with `-t` (`asked`) always, with `-T`
/// (`refused`) never; otherwise, on Linux (macOS's sandbox has no terminal
/// of its own to give), when stdin and stdout are both terminals and the
/// run is not `quiet` (`--json`, `--no-stdin`: not interactive). Its size
/// is this terminal's window. Chosen by itself (no `-t`), a terminal that
/// the broker cannot give (Tier B) is done without.
pub fn wanted(asked: bool, refused: bool, quiet: bool) -> Option<WindowSize> {
    let interactive = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let auto = cfg!(target_os = "linux") && interactive && !quiet && !refused;
    (asked || auto).then(|| window().unwrap_or(DEFAULT_WINDOW))
}

/// The rule of a broker's refusal to give a run a terminal.
pub const UNAVAILABLE_RULE: &str = "terminal.unavailable";

/// This terminal's window: stdout's, else stdin's.
pub fn window() -> Option<WindowSize> {
    [libc::STDOUT_FILENO, libc::STDIN_FILENO].into_iter().find_map(|fd| {
        let mut w = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
        // SAFETY: TIOCGWINSZ writes one winsize through the pointer, a local valid for it.
        let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut w) };
        let size = WindowSize { rows: w.ws_row, cols: w.ws_col };
        (rc == 0 && size.check().is_ok()).then_some(size)
    })
}

/// Blocks SIGWINCH in the calling thread, and so in every thread it starts
/// afterwards, for [`on_resize`]'s thread alone to take: a thread that did
/// not block it would take it and drop it (its default is to be ignored).
/// Call it before any other thread starts; `None` if it could not be.
pub fn block_resizes() -> Option<libc::sigset_t> {
    // SAFETY: an empty set is initialised by sigemptyset before any other use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t for these calls, which only write
    // it and this thread's mask.
    let blocked = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGWINCH);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    (blocked == 0).then_some(set)
}

/// Calls `each` with the new window whenever this terminal is resized
/// (SIGWINCH), from a thread of its own, until `each` returns `false`.
/// SIGWINCH is blocked ([`block_resizes`]) in the calling thread: call
/// that before any other thread starts (a helper's spawn resets it).
pub fn on_resize(mut each: impl FnMut(WindowSize) -> bool + Send + 'static) {
    let Some(set) = block_resizes() else { return };
    std::thread::spawn(move || {
        loop {
            let mut signal = 0;
            // SAFETY: `set` and `signal` are valid for the call, which writes `signal`.
            if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
                return;
            }
            if let Some(size) = window()
                && !each(size)
            {
                return;
            }
        }
    });
}

/// This terminal (stdin) in raw mode, until dropped: every key goes to the
/// run as it is typed, the CLI's own line editing and signals are off.
pub struct Raw {
    saved: libc::termios,
}

impl Raw {
    /// `None` when stdin is no terminal (`-t` with stdin a pipe, say).
    pub fn enter() -> Option<Raw> {
        // SAFETY: termios is plain old data; tcgetattr fills it in.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `saved` is valid for writing.
        if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        // SAFETY: `raw` is an initialised termios, changed in place.
        unsafe { libc::cfmakeraw(&mut raw) };
        // SAFETY: `raw` is valid for reading.
        if unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSADRAIN, &raw) } != 0 {
            return None;
        }
        Some(Raw { saved })
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: `saved` is the termios read when raw mode was entered.
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSADRAIN, &self.saved) };
    }
}
