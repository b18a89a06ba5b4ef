//! palisaded documents itself, and reads the command line palisade hands over. (End-to-end tests of the broker live in
//! the workspace's `tests` crate.)
#![cfg(target_os = "linux")]

use std::process::Command;

fn help(bin: &str, args: &[&str]) -> String {
    let o = Command::new(bin).args(args).output().unwrap();
    assert!(o.status.success(), "{bin} {args:?}: {o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn palisaded_has_help() {
    let text = help(env!("CARGO_BIN_EXE_palisaded"), &["--help"]);
    for flag in ["--config", "--socket", "--helper"] {
        assert!(text.contains(flag), "{flag} missing from:\n{text}");
    }
}

/// `palisaded cli` reads `palisade`'s command line: its help, and its
/// usage errors, exit 125 like any failure of palisade.
#[test]
fn palisaded_cli_reads_the_command_line_of_palisade() {
    let text = help(env!("CARGO_BIN_EXE_palisaded"), &["cli", "run", "--help"]);
    assert!(text.starts_with("Run a command in a sandbox"), "{text}");
    for flag in ["--socket", "--workspace", "--policy", "--timeout", "--max-output", "--json"] {
        assert!(text.contains(flag), "{flag} missing from:\n{text}");
    }
    let text = help(env!("CARGO_BIN_EXE_palisaded"), &["cli", "doctor", "--help"]);
    assert!(text.contains("Usage: palisade doctor [OPTIONS]") && text.contains("--policy"), "{text}");
    for args in
        [&["cli", "run"][..], &["cli", "run", "--timeout", "soon", "--", "true"], &["cli", "frobnicate"]]
    {
        let o = Command::new(env!("CARGO_BIN_EXE_palisaded")).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(125), "{args:?}: {o:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("error:"), "{args:?}: {o:?}");
    }
}
