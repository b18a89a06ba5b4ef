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
/// of its own to give), when stdin, stdout and stderr are terminals, this
/// process is in the terminal's foreground (not a job started with `&`,
/// which the terminal would stop) and the run is not `quiet` (`--json`,
/// `--no-stdin`: not interactive). Its size is this terminal's window.
/// Chosen by itself (no `-t`), a terminal that the broker cannot give
/// (Tier B) is done without.
pub fn wanted(asked: bool, refused: bool, quiet: bool) -> Option<WindowSize> {
    let terminals =
        std::io::stdin().is_terminal() && std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
    // SAFETY: tcgetpgrp and getpgrp take no pointer.
    let foreground = unsafe { libc::tcgetpgrp(libc::STDIN_FILENO) == libc::getpgrp() };
    let interactive = terminals && foreground;
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

/// The signals that end this process while its terminal may be raw: it is
/// put back as it was ([`Raw`]) before they do.
const ENDING: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Blocks SIGWINCH, and the [`ENDING`] signals, in the calling thread, and
/// so in every thread it starts afterwards, for [`on_resize`]'s thread
/// alone to take: a thread that did not block SIGWINCH would take it and
/// drop it (its default is to be ignored). Call it before any other thread
/// starts; `None` if it could not be.
pub fn block_resizes() -> Option<libc::sigset_t> {
    // SAFETY: an empty set is initialised by sigemptyset before any other use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t for these calls, which only write
    // it and this thread's mask.
    let blocked = unsafe {
        libc::sigemptyset(&mut set);
        for signal in ENDING.into_iter().chain([libc::SIGWINCH]) {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    (blocked == 0).then_some(set)
}

/// This terminal as it was before [`Raw::enter`], while it is raw.
static SAVED: std::sync::Mutex<Option<libc::termios>> = std::sync::Mutex::new(None);

/// Puts this terminal back as [`SAVED`] holds it, if it is raw.
fn restore() {
    let saved = SAVED.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(saved) = saved {
        // SAFETY: `saved` is a termios tcgetattr filled in.
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSADRAIN, &saved) };
    }
}

/// Ends this process by `signal` (one of [`ENDING`]), its terminal first
/// put back as it was.
fn end_by(signal: libc::c_int) -> ! {
    restore();
    // SAFETY: default disposition, then the signal unblocked in this thread
    // and raised there: the process ends as the signal's default does.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        let mut one: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut one);
        libc::sigaddset(&mut one, signal);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
        libc::raise(signal);
    }
    std::process::exit(128 + signal)
}

/// Calls `each` with the new window whenever this terminal is resized
/// (SIGWINCH), from a thread of its own, until `each` returns `false`;
/// SIGTERM, SIGHUP and SIGQUIT end the process there, its terminal put
/// back first. They are blocked ([`block_resizes`]) in the calling thread:
/// call that before any other thread starts (a helper's spawn resets it).
pub fn on_resize(mut each: impl FnMut(WindowSize) -> bool + Send + 'static) {
    let Some(set) = block_resizes() else { return };
    std::thread::spawn(move || {
        let mut watching = true;
        loop {
            let mut signal = 0;
            // SAFETY: `set` and `signal` are valid for the call, which writes `signal`.
            if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
                return;
            }
            if ENDING.contains(&signal) {
                end_by(signal);
            }
            if let Some(size) = window().filter(|_| watching) {
                watching = each(size);
            }
        }
    });
}

/// This terminal (stdin) in raw mode, until dropped: every key goes to the
/// run as it is typed, the CLI's own line editing and signals are off. A
/// signal that ends the process meanwhile puts it back ([`on_resize`]).
pub struct Raw(());

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
        *SAVED.lock().unwrap_or_else(|e| e.into_inner()) = Some(saved);
        // SAFETY: `raw` is valid for reading.
        if unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSADRAIN, &raw) } != 0 {
            restore();
            return None;
        }
        Some(Raw(()))
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        restore();
    }
}
