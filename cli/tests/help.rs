//! The CLI documents itself, and says what is missing when it cannot hand
//! a command over. (Its runs, through a broker and embedded, are tested end
//! to end in the workspace's `tests` crate.)
#![cfg(target_os = "linux")]

use std::process::{Command, Output};

const PALISADE: &str = env!("CARGO_BIN_EXE_palisade");

fn palisade(args: &[&str]) -> Output {
    Command::new(PALISADE).args(args).output().unwrap()
}

fn help(args: &[&str]) -> String {
    let o = palisade(args);
    assert!(o.status.success(), "palisade {args:?}: {o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn palisade_has_help_for_run() {
    let text = help(&["--help"]);
    for command in ["run", "explain", "doctor", "approvals", "status", "changes", "audit", "plugin", "mcp"] {
        assert!(text.contains(&format!("  {command} ")), "{command} missing from:\n{text}");
    }
    let text = help(&["run", "--help"]);
    for flag in ["--socket", "--workspace", "--policy", "--timeout", "--max-output", "--json"] {
        assert!(text.contains(flag), "{flag} missing from:\n{text}");
    }
}

#[test]
fn a_usage_error_exits_125_like_any_failure_of_palisade() {
    for args in [&["run"][..], &["run", "--timeout", "soon", "--", "true"], &["frobnicate"]] {
        let o = palisade(args);
        assert_eq!(o.status.code(), Some(125), "{args:?}: {o:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("error:"), "{args:?}: {o:?}");
    }
}

/// The CLI alone (as in an agent's container) serves what goes to a broker,
/// and refuses what needs `palisaded`, naming it, instead of doing anything
/// else.
#[test]
fn the_cli_alone_names_the_palisaded_it_needs() {
    let dir = std::env::temp_dir().join(format!("palisade-cli-alone-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let alone = dir.join("palisade");
    // Copied by `cp`, in a process of its own: a copy written here would
    // have its descriptor inherited by what another test forks meanwhile,
    // and executing it would fail with "Text file busy" until that child execs.
    let copied = Command::new("cp").arg(PALISADE).arg(&alone).output().unwrap();
    assert!(copied.status.success(), "cp {PALISADE}: {copied:?}");
    let run = |args: &[&str]| Command::new(&alone).args(args).output().unwrap();
    for args in [&["doctor"][..], &["run", "--policy", "p.toml", "--", "true"], &["help"]] {
        let o = run(args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{args:?}: {o:?}");
        let missing = format!("palisade: RuntimeFailure: {}: No such file", dir.join("palisaded").display());
        assert!(stderr.starts_with(&missing), "{args:?}: {stderr}");
        assert!(stderr.contains("the palisaded installed beside it"), "{args:?}: {stderr}");
    }
    // What a broker serves needs no palisaded: here, no broker answers.
    let o = run(&["status", "--socket", "/nonexistent/palisade.sock"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{o:?}");
    assert!(
        stderr.starts_with("palisade: RuntimeFailure: /nonexistent/palisade.sock: No such file"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
