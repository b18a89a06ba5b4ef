//! What the CLI prints on its standard output. A reader that went away (a
//! closed pipe: `palisade run --json ... | head`) ends the process quietly,
//! as SIGPIPE ends other tools, instead of a panic. The process keeps
//! ignoring SIGPIPE otherwise: an embedded broker writes to its runs'
//! pipes, whose readers may leave first.

use std::io::Write;

/// Writes `args` (and a newline with `line`) to stdout, flushed.
pub fn write(args: std::fmt::Arguments<'_>, line: bool) {
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| if line { out.write_all(b"\n") } else { Ok(()) });
    if let Err(e) = written.and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            closed();
        }
    }
}

/// Ends the process as SIGPIPE would (its reader is gone).
pub fn closed() -> ! {
    #[cfg(unix)]
    // SAFETY: signal(2) and raise(3) with a valid signal number and the
    // default disposition; nothing else runs on this thread meanwhile.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    // 128 + SIGPIPE, as a shell reports a command SIGPIPE killed.
    std::process::exit(141)
}

/// `println!`, for a reader that may leave first.
#[macro_export]
macro_rules! outln {
    ($($t:tt)*) => { $crate::out::write(format_args!($($t)*), true) };
}

/// `print!`, for a reader that may leave first.
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::out::write(format_args!($($t)*), false) };
}
