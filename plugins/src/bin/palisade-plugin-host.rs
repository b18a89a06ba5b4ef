//! palisade-plugin-host: runs WebAssembly plugin calls for the broker, which
//! starts it inside a Tier C jail (issue 16, `docs/plugins.md`). Frames on
//! stdin and stdout only; a few words on stderr when something fails.

use std::process::ExitCode;

use palisade_plugins::{Runtime, RuntimeConfig, seccomp, serve};

fn main() -> ExitCode {
    // First, before any thread: the threads started later inherit the filter.
    let filter = seccomp::exec_filter().and_then(|p| seccomp::apply_to_current_thread(&p));
    if let Err(e) = filter {
        eprintln!("palisade-plugin-host: {e}");
        return ExitCode::from(2);
    }
    let mut runtime = match Runtime::new(RuntimeConfig::default()) {
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
