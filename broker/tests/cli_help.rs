//! Both binaries document themselves. (End-to-end tests of the broker live in
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

#[test]
fn palisade_has_help_for_run() {
    assert!(help(env!("CARGO_BIN_EXE_palisade"), &["--help"]).contains("run"));
    let text = help(env!("CARGO_BIN_EXE_palisade"), &["run", "--help"]);
    for flag in ["--socket", "--workspace", "--policy", "--timeout", "--max-output", "--json"] {
        assert!(text.contains(flag), "{flag} missing from:\n{text}");
    }
}

#[test]
fn a_usage_error_exits_125_like_any_failure_of_palisade() {
    for args in [&["run"][..], &["run", "--timeout", "soon", "--", "true"], &["frobnicate"]] {
        let o = Command::new(env!("CARGO_BIN_EXE_palisade")).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(125), "{args:?}: {o:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("error:"), "{args:?}: {o:?}");
    }
}
