//! palisade-plugin-host: runs WebAssembly plugin calls for the broker, which
//! starts it inside a Tier C jail (issue 16, `docs/plugins.md`). Frames on
//! stdin and stdout only; a few words on stderr when something fails.

use std::process::ExitCode;

#[cfg(target_os = "linux")]
use palisade_plugins::{Runtime, RuntimeConfig, seccomp, serve};

/// The plugin tier runs its host in a Tier C jail, which only Linux has.
#[cfg(not(target_os = "linux"))]
fn main() -> ExitCode {
    eprintln!("palisade-plugin-host: WebAssembly plugins run inside a Linux jail; this system has none");
    ExitCode::from(2)
}

#[cfg(target_os = "linux")]
fn main() -> ExitCode {
    // First, before any thread: the threads started later inherit the filter.
    let filter = seccomp::exec_filter().and_then(|p| seccomp::apply_to_current_thread(&p));
    if let Err(e) = filter {
        eprintln!("palisade-plugin-host: {e}");
        return ExitCode::from(2);
    }
    let config = match config_from_args(std::env::args().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("palisade-plugin-host: {e}");
            return ExitCode::from(2);
        }
    };
    let mut runtime = match Runtime::new(config) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("palisade-plugin-host: {e}");
            return ExitCode::from(2);
        }
    };
    let served = serve::spawn_reader(std::io::stdin())
        .and_then(|inbox| serve::serve(&mut runtime, &inbox, &mut std::io::stdout().lock()));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("palisade-plugin-host: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--pool-instances N`, `--max-memory-bytes N`, `--max-table-elements N`:
/// the pool's sizes (no secret, so argv is fine); the rest of the defaults.
#[cfg(target_os = "linux")]
fn config_from_args(mut args: impl Iterator<Item = String>) -> Result<RuntimeConfig, String> {
    let mut config = RuntimeConfig::default();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: std::num::ParseIntError| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--pool-instances" => config.pool_instances = value.parse().map_err(bad)?,
            "--max-memory-bytes" => config.max_memory_bytes = value.parse().map_err(bad)?,
            "--max-table-elements" => config.max_table_elements = value.parse().map_err(bad)?,
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    Ok(config)
}
