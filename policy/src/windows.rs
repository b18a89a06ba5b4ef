//! Windows: a decided run's limits as a Job Object's, and its command as
//! `CreateProcessW` takes it (one command line, one environment block).
//!
//! Data only, built and tested on every system; `palisade-windows` applies
//! it. What the job holds of a run (see [`job_limits`]): its processes
//! (`--no-fork` is one: the command itself), each process's committed
//! memory (the plan's RLIMIT_DATA), the whole job's (the run's memory
//! limit), each process's user-mode CPU time (RLIMIT_CPU's figure; the
//! kernel-mode time a job cannot limit per process). The job always kills every
//! process when its handle closes, forbids breaking away, and restricts
//! the user interface ([`UI_RESTRICTIONS`]); the deadline and the output
//! quota are the executor's.

use crate::decision::Resolved;
use std::time::Duration;

/// What a run's processes may not do to the desktop they share with the
/// user, each a `JOB_OBJECT_UILIMIT_*` flag: read or write the clipboard,
/// use global atoms or other processes' user handles, switch or create
/// desktops, change display settings or system parameters, log off or shut down.
pub const UI_RESTRICTIONS: [&str; 8] = [
    "READCLIPBOARD",
    "WRITECLIPBOARD",
    "GLOBALATOMS",
    "HANDLES",
    "DESKTOP",
    "DISPLAYSETTINGS",
    "SYSTEMPARAMETERS",
    "EXITWINDOWS",
];

/// A run's Job Object limits (`JOBOBJECT_EXTENDED_LIMIT_INFORMATION`).
/// `None`: no limit of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobLimits {
    /// `ActiveProcessLimit`: processes of the run alive at once, the
    /// command's included (at least 1).
    pub active_processes: u32,
    /// `ProcessMemoryLimit`: bytes of memory each process may commit.
    pub process_memory: Option<u64>,
    /// `JobMemoryLimit`: bytes the run's processes may commit together.
    pub job_memory: Option<u64>,
    /// `PerProcessUserTimeLimit`: user-mode CPU time of each process
    /// (kernel-mode time is not limited).
    pub process_cpu: Option<Duration>,
}

/// The job limits of `resolved`'s run: the process count (1 where the run
/// may not fork), RLIMIT_DATA per process, the run's memory limit for the
/// whole job, RLIMIT_CPU per process. An unlimited rlimit is no limit.
pub fn job_limits(resolved: &Resolved) -> JobLimits {
    let process = &resolved.capabilities.process;
    let r = &resolved.plan.rlimits;
    let finite = |v: u64| (v != u64::MAX && v != 0).then_some(v);
    let active_processes =
        if process.no_fork { 1 } else { u32::try_from(r.processes.hard).unwrap_or(u32::MAX).max(1) };
    JobLimits {
        active_processes,
        process_memory: finite(r.data.hard),
        job_memory: finite(process.max_memory_mb.saturating_mul(1 << 20)),
        process_cpu: (r.cpu_seconds.hard != u64::MAX).then(|| Duration::from_secs(r.cpu_seconds.hard)),
    }
}

/// Why a command cannot be given to `CreateProcessW` as it is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CommandError {
    #[error("the command has no program")]
    Empty,
    #[error("a NUL character cannot be passed to a Windows command: {0:?}")]
    Nul(String),
    #[error(
        "an environment variable's name must be ASCII, not empty, with no '=' after its first character: {0:?}"
    )]
    Name(String),
    #[error("two environment variables differ only in case, which Windows takes for one: {0:?} and {1:?}")]
    Duplicate(String, String),
    #[error("the program's name (argv[0]) cannot hold a '\"' on Windows: {0:?}")]
    Argv0(String),
    #[error("the program must be an absolute path: {0:?}")]
    Relative(String),
    #[error(
        "the program's path must name it plainly (no `.` or `..` component, no trailing separator, \
         no `\\\\?\\` or `\\\\.\\` prefix): {0:?}"
    )]
    NotPlain(String),
    #[error(
        "{0:?} is a batch file, which Windows hands to cmd.exe to parse again (its quoting is not the \
         C runtime's): run cmd.exe /c with the script's name instead"
    )]
    Batch(String),
}

/// Whether `program` can be started as it is: an absolute path (drive and
/// root, or a UNC path) naming it plainly (see [`CommandError::NotPlain`]),
/// without a NUL, and not a batch file (`.bat` or
/// `.cmd` in any case, trailing dots and spaces ignored as Windows ignores
/// them), whose command line `cmd.exe` would parse again.
pub fn check_program(program: &str) -> Result<(), CommandError> {
    if program.contains('\0') {
        return Err(CommandError::Nul(program.into()));
    }
    let b = program.as_bytes();
    let drive = b.len() > 2 && b[0].is_ascii_alphabetic() && b[1] == b':' && matches!(b[2], b'\\' | b'/');
    let unc = program.starts_with("\\\\") || program.starts_with("//");
    // Windows normalizes `.`, `..` and a trailing separator away before it
    // decides what the program is (`run.bat\.` is `run.bat`): none is taken.
    let plain = !program.ends_with(['\\', '/'])
        && !program.starts_with("\\\\?\\")
        && !program.starts_with("\\\\.\\")
        && program.split(['\\', '/']).skip(1).all(|c| c != "." && c != "..");
    if !(drive || unc) {
        return Err(CommandError::Relative(program.into()));
    }
    if !plain {
        return Err(CommandError::NotPlain(program.into()));
    }
    let name = program.trim_end_matches(['.', ' ']).to_ascii_lowercase();
    if name.ends_with(".bat") || name.ends_with(".cmd") {
        return Err(CommandError::Batch(program.into()));
    }
    Ok(())
}

/// `argv` as one command line, split back by the Microsoft C runtime (and
/// Rust's, and `CommandLineToArgvW`) into the same arguments: the
/// program's name (`argv[0]`, read to the next quote with no escapes) is
/// quoted as it is and may hold no quote; each other argument with a
/// space, a tab, a quote or nothing in it is quoted, backslashes doubled
/// only before a quote.
pub fn command_line(argv: &[String]) -> Result<String, CommandError> {
    let Some((argv0, rest)) = argv.split_first() else { return Err(CommandError::Empty) };
    if let Some(arg) = argv.iter().find(|a| a.contains('\0')) {
        return Err(CommandError::Nul(arg.clone()));
    }
    if argv0.contains('"') {
        return Err(CommandError::Argv0(argv0.clone()));
    }
    let mut line = format!("\"{argv0}\"");
    for arg in rest {
        line.push(' ');
        quote_into(arg, &mut line);
    }
    Ok(line)
}

fn quote_into(arg: &str, line: &mut String) {
    if !arg.is_empty() && !arg.contains([' ', '\t', '\n', '\u{b}', '"']) {
        line.push_str(arg);
        return;
    }
    line.push('"');
    let mut backslashes = 0;
    for c in arg.chars() {
        match c {
            '\\' => backslashes += 1,
            '"' => {
                // Each backslash before a quote is doubled, and the quote escaped.
                line.extend(std::iter::repeat_n('\\', backslashes * 2 + 1));
                line.push('"');
                backslashes = 0;
            }
            _ => {
                line.extend(std::iter::repeat_n('\\', backslashes));
                line.push(c);
                backslashes = 0;
            }
        }
    }
    // Backslashes before the closing quote are doubled too.
    line.extend(std::iter::repeat_n('\\', backslashes * 2));
    line.push('"');
}

/// `env` as `CreateProcessW`'s Unicode environment block: `NAME=value`
/// entries, sorted by name as Windows keeps them (upper-cased), each ended
/// by a NUL and the block by another. The command inherits nothing else.
/// Names are ASCII (Windows' own upper-casing of other letters is not
/// Unicode's, so two names it takes for one could not be told apart
/// here); two that differ only in case are refused.
pub fn environment_block(env: &[(String, String)]) -> Result<Vec<u16>, CommandError> {
    let mut entries: Vec<(Vec<u16>, &String, &String)> = Vec::with_capacity(env.len());
    for (name, value) in env {
        if name.is_empty() || !name.is_ascii() || name.chars().skip(1).any(|c| c == '=') {
            return Err(CommandError::Name(name.clone()));
        }
        if name.contains('\0') || value.contains('\0') {
            return Err(CommandError::Nul(format!("{name}={value}")));
        }
        entries.push((name.to_ascii_uppercase().encode_utf16().collect(), name, value));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(w) = entries.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(CommandError::Duplicate(w[0].1.clone(), w[1].1.clone()));
    }
    let mut block = Vec::new();
    for (_, name, value) in entries {
        block.extend(format!("{name}={value}").encode_utf16());
        block.push(0);
    }
    if block.is_empty() {
        block.push(0);
    }
    block.push(0);
    Ok(block)
}

#[cfg(test)]
mod tests;
