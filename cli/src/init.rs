//! `palisade init`: the starter configuration of a user's own palisade
//! (`deploy/user/palisade.toml`), written where the user's daemon and the
//! CLI's embedded broker read it ([`palisade_protocol::clients::user_config`]).

use crate::{EXIT_PALISADE, outln};
use palisade_protocol::wire::ErrorKind;
use std::path::PathBuf;

/// The starter configuration: the profiles the documentation's examples use.
pub const STARTER: &str = include_str!("../../deploy/user/palisade.toml");

/// `palisade init`'s arguments.
#[derive(clap::Args, Debug)]
pub struct InitArgs {
    /// Where to write it [default: $XDG_CONFIG_HOME/palisade/palisade.toml,
    /// else ~/.config/palisade/palisade.toml].
    #[arg(long, value_name = "FILE")]
    pub path: Option<PathBuf>,
    /// Replace a file that is there already (by default it is kept, and
    /// init exits 125).
    #[arg(long)]
    pub force: bool,
    /// Print the starter configuration on stdout instead; write nothing.
    #[arg(long)]
    pub print: bool,
}

/// Writes the starter configuration (mode 0600, its directory made 0700
/// where missing); the exit status.
pub fn main(args: InitArgs) -> i32 {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if args.print {
        outln!("{}", STARTER.trim_end());
        return 0;
    }
    let Some(path) = args.path.or_else(palisade_protocol::clients::user_config) else {
        return crate::fail(
            ErrorKind::InvalidRequest,
            "neither XDG_CONFIG_HOME nor HOME is an absolute path: give --path",
        );
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
            return crate::fail(ErrorKind::RuntimeFailure, format!("{}: {e}", dir.display()));
        }
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).mode(0o600);
    match args.force {
        true => options.create(true).truncate(true),
        false => options.create_new(true),
    };
    let written = options.open(&path).and_then(|mut f| f.write_all(STARTER.as_bytes()));
    match written {
        Ok(()) => {
            outln!(
                "palisade: wrote {}: profiles sh (shell lines and interpreters) and the defaults; \
                 your daemon (palisaded) and palisade run without one read it",
                path.display()
            );
            0
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            eprintln!(
                "palisade: {} exists: kept as it is (--force replaces it, --print shows the starter)",
                path.display()
            );
            EXIT_PALISADE
        }
        Err(e) => crate::fail(ErrorKind::RuntimeFailure, format!("{}: {e}", path.display())),
    }
}
