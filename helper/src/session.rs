//! Working directory and a new session.

use crate::error::{Context, Result, fail};
use nix::errno::Errno;
use nix::unistd::{chdir, getcwd, setsid};
use palisade_protocol::Stage;
use std::path::Path;

/// Enters the working directory and checks that it is the one the plan named
/// (no symlink took the process elsewhere).
pub fn enter_cwd(cwd: &str) -> Result<()> {
    chdir(cwd).at(Stage::Cwd, || format!("chdir {cwd}"))?;
    let actual = getcwd().at(Stage::Cwd, || "getcwd".into())?;
    if actual != Path::new(cwd) {
        return Err(fail(Stage::Cwd, Errno::EXDEV, format!("chdir {cwd} landed in {}", actual.display())));
    }
    Ok(())
}

/// A new session without a controlling terminal: the command cannot inject
/// input into the caller's terminal (TIOCSTI) or receive its job-control signals.
pub fn new_session() -> Result<()> {
    setsid().map(drop).at(Stage::Session, || "setsid".into())
}
