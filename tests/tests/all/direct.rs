//! A run that writes its workspace in place (`--direct`, a profile with
//! `allow_direct = true`) finds what the host executes there read-only,
//! and what it makes there that the host executes is taken out and held
//! for a person, through the embedded broker, the user's daemon and a root
//! daemon acting for the user. Each attempt is made without a sandbox too,
//! where it succeeds.

use crate::fidelity::{Fixture, Mode};
use palisade_tests::*;
use std::path::Path;
use std::process::Command;

/// Paths of a workspace the host executes, each with what it holds.
const EXISTING: &[(&str, &str)] = &[
    (".envrc", "export A=1\n"),
    ("sub/.envrc", "export B=1\n"),
    (".vscode/settings.json", "{}\n"),
    (".husky/pre-commit", "#!/bin/sh\nexit 0\n"),
    (".mcp.json", "{\"mcpServers\": {}}\n"),
    (".claude/settings.json", "{}\n"),
    (".bashrc", "# the home's\n"),
];

/// Each attempt on what the host executes (by kind), as `NAME COMMAND`:
/// the script prints `NAME wrote` or `NAME refused`.
const ATTEMPTS: &[(&str, &str)] = &[
    ("git-hook", "printf '#!/bin/sh\\necho ran\\n' > .git/hooks/pre-commit"),
    ("git-config", "printf '[core]\\n\\tfsmonitor = ./x\\n' >> .git/config"),
    ("git-dir", "echo elsewhere > .git/commondir"),
    ("git-dir-moved", "mv .git git-aside"),
    ("hooks-path", "echo evil > .husky/pre-push"),
    ("envrc", "echo evil >> .envrc"),
    ("envrc-nested", "echo evil > sub/.envrc"),
    ("envrc-removed", "rm sub/.envrc"),
    ("editor", "echo '{}' > .vscode/tasks.json"),
    ("editor-moved", "mv .vscode vscode-aside"),
    ("agent", "echo evil > .mcp.json"),
    ("agent-dir", "echo evil > .claude/settings.json"),
    ("shell", "echo evil >> .bashrc"),
];

/// What the script makes that did not exist: the host executes the first
/// three (held), not the rest (in place).
const MADE: &str = "mkdir app && echo evil > app/.envrc\n\
                    mkdir .cursor && echo evil > .cursor/rules\n\
                    git init -q nested && git -C nested config core.fsmonitor ./x\n\
                    git init -q fresh\n\
                    echo plain > plain.txt\n";

fn script() -> String {
    let mut s = String::from(
        "try() { if (eval \"$2\") 2>/dev/null; then echo \"$1 wrote\"; else echo \"$1 refused\"; fi; }\n",
    );
    for (name, attempt) in ATTEMPTS {
        s.push_str(&format!("try {name} {}\n", shell_quote(attempt)));
    }
    s.push_str(MADE);
    s
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A repository whose hooks directory is `.husky` (core.hooksPath), with
/// every path of [`EXISTING`]; `None` where git is missing.
fn repository(ws: &Path) -> bool {
    let git = |args: &[&str]| Command::new("git").args(args).current_dir(ws).output();
    match git(&["init", "-q"]) {
        Ok(o) => assert!(o.status.success(), "{}", text(&o.stderr)),
        Err(_) => return false,
    }
    assert!(git(&["config", "core.hooksPath", ".husky"]).unwrap().status.success());
    for (path, contents) in EXISTING {
        std::fs::create_dir_all(ws.join(path).parent().unwrap()).unwrap();
        std::fs::write(ws.join(path), contents).unwrap();
    }
    true
}

#[test]
fn in_place_what_the_host_executes_is_read_only_and_what_a_run_makes_of_it_is_held() {
    let mut has_git = true;
    let f = Fixture::with_profile("direct-held", &[], "allow_direct = true\n", |ws| has_git = repository(ws));
    if !has_git {
        skipped("git is not installed: no repository to write in place");
        return;
    }
    let script = script();
    // Without a sandbox, every attempt writes.
    f.reset();
    let config = std::fs::read(f.ws.join(".git/config")).unwrap();
    let o = f.as_user(&[], &["sh", "-c", &script]).output().unwrap();
    assert!(o.status.success(), "{}", said(&o));
    for (name, _) in ATTEMPTS {
        assert!(text(&o.stdout).contains(&format!("{name} wrote\n")), "bare: {}", said(&o));
    }
    assert!(f.ws.join("nested/.git/config").exists() && f.ws.join("app/.envrc").exists());
    for mode in f.modes() {
        let (o, _) = f.sandboxed_with(mode, &["--direct", "--json"], &script);
        assert_eq!(o.status.code(), Some(123), "{mode:?}: {}", said(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let out = v["stdout"].as_str().unwrap();
        for (name, _) in ATTEMPTS {
            assert!(out.contains(&format!("{name} refused\n")), "{mode:?}: {out}");
        }
        let ws = &f.ws;
        let was = |p: &str| std::fs::read(ws.join(p)).ok();
        for (path, contents) in EXISTING {
            assert_eq!(was(path).as_deref(), Some(contents.as_bytes()), "{mode:?}: {path}");
        }
        assert_eq!(was(".git/config"), Some(config.clone()), "{mode:?}");
        for absent in [".git/hooks/pre-commit", ".git/commondir", ".husky/pre-push", ".vscode/tasks.json"] {
            assert!(!ws.join(absent).exists(), "{mode:?}: {absent}");
        }
        // What it made that the host executes: taken out, held, and said.
        let changes = &v["result"]["changes"];
        assert_eq!(changes["outcome"], "partial", "{mode:?}: {v}");
        let mut withheld: Vec<&str> =
            changes["withheld"].as_array().unwrap().iter().map(|w| w["path"].as_str().unwrap()).collect();
        withheld.sort();
        let held = ["/.cursor", "/app/.envrc", "/nested/.git/config"].map(|p| format!("{}{p}", ws.display()));
        assert_eq!(withheld, held, "{mode:?}: {v}");
        for gone in ["app/.envrc", ".cursor", "nested/.git/config"] {
            assert!(!ws.join(gone).exists(), "{mode:?}: {gone}");
        }
        let id = changes["id"].as_str().unwrap();
        assert!(changes["reason"].as_str().unwrap().contains(id), "{v}");
        // The rest is in place: an ordinary file, a new repository's own files.
        assert_eq!(was("plain.txt").as_deref(), Some(&b"plain\n"[..]), "{mode:?}");
        assert!(ws.join("fresh/.git/config").exists() && ws.join("nested/.git/HEAD").exists(), "{mode:?}");
    }
}

#[test]
fn in_place_a_link_to_what_the_host_executes_or_too_many_of_them_are_refused_with_the_reason() {
    let f = Fixture::with_profile("direct-refused", &[], "allow_direct = true\n", |ws| {
        std::fs::write(ws.join("envrc.real"), "export A=1\n").unwrap();
        std::os::unix::fs::symlink("envrc.real", ws.join(".envrc")).unwrap();
    });
    let (o, _) = f.sandboxed_with(Mode::Embedded, &["--direct"], "echo x > plain.txt");
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    assert!(text(&o.stderr).contains("symbolic link"), "{}", said(&o));
    assert!(text(&o.stderr).contains("run it with a change set (without --direct)"), "{}", said(&o));
    assert!(!f.ws.join("plain.txt").exists());
    // Counter-test: with a change set, the same run writes.
    let (o, _) = f.sandboxed_with(Mode::Embedded, &[], "echo x > plain.txt");
    assert!(o.status.success(), "{}", said(&o));
    assert!(f.ws.join("plain.txt").exists());

    let max = palisade_policy::MAX_HELD_IN_PLACE;
    let many = |n: usize| {
        move |ws: &Path| {
            for i in 0..n {
                std::fs::create_dir(ws.join(format!("d{i}"))).unwrap();
                std::fs::write(ws.join(format!("d{i}/.envrc")), "export A=1\n").unwrap();
            }
        }
    };
    let f = Fixture::with_profile("direct-many", &[], "allow_direct = true\n", many(max + 1));
    let (o, _) = f.sandboxed_with(Mode::Embedded, &["--direct"], "echo x > plain.txt");
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    assert!(text(&o.stderr).contains(&format!("more than {max} paths the host executes")), "{}", said(&o));
    assert!(!f.ws.join("plain.txt").exists());
    // As many as there are mounts for: the run writes in place, and none of them.
    let f = Fixture::with_profile("direct-enough", &[], "allow_direct = true\n", many(max));
    let script = "echo x > plain.txt; for d in d*; do echo evil >> $d/.envrc || true; done";
    let (o, _) = f.sandboxed_with(Mode::Embedded, &["--direct"], script);
    assert!(o.status.success(), "{}", said(&o));
    assert!(f.ws.join("plain.txt").exists());
    for i in 0..max {
        assert_eq!(std::fs::read_to_string(f.ws.join(format!("d{i}/.envrc"))).unwrap(), "export A=1\n");
    }
}
