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
    // Each `d*/.envrc` takes two mounts: itself, and its directory pinned.
    let f = Fixture::with_profile("direct-many", &[], "allow_direct = true\n", many(max / 2 + 1));
    let (o, _) = f.sandboxed_with(Mode::Embedded, &["--direct"], "echo x > plain.txt");
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    assert!(text(&o.stderr).contains(&format!("than {max} mounts hold")), "{}", said(&o));
    assert!(!f.ws.join("plain.txt").exists());
    // As many as there are mounts for: the run writes in place, and none of them.
    let f = Fixture::with_profile("direct-enough", &[], "allow_direct = true\n", many(max / 2));
    let script = "echo x > plain.txt; for d in d*; do echo evil >> $d/.envrc || true; done";
    let (o, _) = f.sandboxed_with(Mode::Embedded, &["--direct"], script);
    assert!(o.status.success(), "{}", said(&o));
    assert!(f.ws.join("plain.txt").exists());
    for i in 0..max / 2 {
        assert_eq!(std::fs::read_to_string(f.ws.join(format!("d{i}/.envrc"))).unwrap(), "export A=1\n");
    }
}

/// A workspace laid out for the ways around the read-only paths: a
/// repository whose hooks directory is `./.githooks` and which includes
/// `../tools-gitconfig` and `../later.gitconfig` (not there yet), and two
/// nested ones (hooks in `.nh`, and in an absolute path inside the
/// workspace).
fn around(initial: &Path) -> bool {
    let ws = initial.parent().unwrap().join("ws");
    let git = |dir: &Path, args: &[&str]| {
        std::fs::create_dir_all(dir).unwrap();
        match Command::new("git").args(args).current_dir(dir).output() {
            Ok(o) => assert!(o.status.success(), "{}", text(&o.stderr)),
            Err(_) => return false,
        }
        true
    };
    if !git(initial, &["init", "-q"]) {
        return false;
    }
    git(initial, &["config", "core.hooksPath", "./.githooks"]);
    git(initial, &["config", "--add", "include.path", "../tools-gitconfig"]);
    git(initial, &["config", "--add", "include.path", "../later.gitconfig"]);
    let (lib, abs) = (initial.join("vendor/lib"), initial.join("vendor/abs"));
    git(&lib, &["init", "-q"]);
    git(&lib, &["config", "core.hooksPath", ".nh"]);
    git(&abs, &["init", "-q"]);
    git(&abs, &["config", "core.hooksPath", &ws.join("abs-hooks").to_string_lossy()]);
    for dir in [".githooks", "vendor/lib/.nh", "abs-hooks"] {
        std::fs::create_dir_all(initial.join(dir)).unwrap();
        std::fs::write(initial.join(dir).join("pre-commit"), "#!/bin/sh\nexit 0\n").unwrap();
    }
    std::fs::write(initial.join("tools-gitconfig"), "[user]\n\tname = someone\n").unwrap();
    true
}

/// What a run tries around the read-only paths (each must be refused).
const AROUND: &[(&str, &str)] = &[
    ("hooks-path-dot", "echo evil > .githooks/pre-push"),
    ("hooks-path-nested", "echo evil > vendor/lib/.nh/pre-push"),
    ("hooks-path-absolute", "echo evil > abs-hooks/pre-push"),
    ("included", "printf '[core]\\n\\tfsmonitor = ./x\\n' >> tools-gitconfig"),
    ("parent-renamed", "mv vendor/lib lib-aside"),
    ("grandparent-renamed", "mv vendor vendor-aside"),
];

/// What a run makes around them, each held when it ends (and `keep.txt`,
/// another name of `.mcp.json`, which stays).
const AROUND_MADE: &str = "printf '[core]\\n\\tfsmonitor = ./x\\n' > later.gitconfig\n\
     git init -q locked && git -C locked config core.fsmonitor ./x && chmod 311 locked/.git\n\
     mkdir -p closed/deep && echo evil > closed/deep/.envrc && chmod 111 closed\n\
     mkdir .claude && echo '{}' > .claude/settings.json && chmod 555 .claude\n\
     echo '{}' > .devcontainer.json; echo 'pre-commit: {}' > lefthook.yml\n\
     git init -q rb && mkdir rb/.git/rebase-merge && echo 'exec ./x' > rb/.git/rebase-merge/git-rebase-todo\n\
     echo benign > .mcp.json && ln .mcp.json keep.txt\n";

#[test]
fn in_place_renames_closed_modes_hard_links_and_gits_other_code_paths_do_not_get_around_it() {
    let mut has_git = true;
    let f = Fixture::with_profile("direct-around", &[], "allow_direct = true\n", |ws| has_git = around(ws));
    if !has_git {
        skipped("git is not installed: no repository to write in place");
        return;
    }
    let mut script = String::from(
        "try() { if (eval \"$2\") 2>/dev/null; then echo \"$1 wrote\"; else echo \"$1 refused\"; fi; }\n",
    );
    for (name, attempt) in AROUND {
        script.push_str(&format!("try {name} {}\n", shell_quote(attempt)));
    }
    script.push_str(AROUND_MADE);
    // Without a sandbox, every attempt writes.
    f.reset();
    let o = f.as_user(&[], &["sh", "-c", &script]).output().unwrap();
    assert!(o.status.success(), "{}", said(&o));
    for (name, _) in AROUND {
        assert!(text(&o.stdout).contains(&format!("{name} wrote\n")), "bare: {}", said(&o));
    }
    for mode in f.modes() {
        let (o, _) = f.sandboxed_with(mode, &["--direct", "--json"], &script);
        assert_eq!(o.status.code(), Some(123), "{mode:?}: {}", said(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let out = v["stdout"].as_str().unwrap();
        for (name, _) in AROUND {
            assert!(out.contains(&format!("{name} refused\n")), "{mode:?}: {out}");
        }
        let ws = &f.ws;
        assert_eq!(
            std::fs::read_to_string(ws.join("tools-gitconfig")).unwrap(),
            "[user]\n\tname = someone\n"
        );
        let changes = &v["result"]["changes"];
        assert_eq!(changes["outcome"], "partial", "{mode:?}: {v}");
        let mut withheld: Vec<&str> =
            changes["withheld"].as_array().unwrap().iter().map(|w| w["path"].as_str().unwrap()).collect();
        withheld.sort();
        let held = [
            "/.claude",
            "/.devcontainer.json",
            "/.mcp.json",
            "/closed/deep/.envrc",
            "/later.gitconfig",
            "/lefthook.yml",
            // The copy `mv` made when the rename was refused (EXDEV) takes the repository's configuration.
            "/lib-aside/.git/config",
            "/locked/.git/config",
            "/rb/.git/rebase-merge",
        ]
        .map(|p| format!("{}{p}", ws.display()));
        assert_eq!(withheld, held, "{mode:?}: {v}");
        for gone in [".claude", "later.gitconfig", "locked/.git/config", "rb/.git/rebase-merge", ".mcp.json"]
        {
            assert!(std::fs::symlink_metadata(ws.join(gone)).is_err(), "{mode:?}: {gone}");
        }
        // The modes the run left are what it left; its other name of a held file stays.
        use std::os::unix::fs::PermissionsExt;
        let mode_of = |p: &str| std::fs::metadata(ws.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!((mode_of("closed"), mode_of("locked/.git")), (0o111, 0o311), "{mode:?}");
        assert!(!ws.join("closed/deep/.envrc").exists(), "{mode:?}");
        assert_eq!(std::fs::read_to_string(ws.join("keep.txt")).unwrap(), "benign\n");
        if mode == Mode::Embedded {
            // The held copy is not the file `keep.txt` names: writing that changes nothing held.
            std::fs::write(ws.join("keep.txt"), "evil\n").unwrap();
            let id = changes["id"].as_str().unwrap();
            let o = f.palisade(mode, &["changes", "show", id]);
            assert!(o.status.success(), "{}", said(&o));
            assert!(
                text(&o.stdout).contains("+benign") && !text(&o.stdout).contains("evil\n+"),
                "{}",
                said(&o)
            );
        }
    }
}

#[test]
fn in_place_a_file_the_host_executes_with_another_name_is_refused() {
    let f = Fixture::with_profile("direct-linked", &[], "allow_direct = true\n", |ws| {
        std::fs::create_dir(ws.join(".vscode")).unwrap();
        std::fs::write(ws.join(".vscode/settings.json"), "{}\n").unwrap();
        std::fs::hard_link(ws.join(".vscode/settings.json"), ws.join("notes.json")).unwrap();
    });
    let (o, _) = f.sandboxed_with(Mode::Embedded, &["--direct"], "echo evil > notes.json");
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    assert!(text(&o.stderr).contains("another name (a hard link)"), "{}", said(&o));
    assert_eq!(std::fs::read_to_string(f.ws.join(".vscode/settings.json")).unwrap(), "{}\n");
    // Counter-test: the same write, without a sandbox, changes the editor's settings.
    f.reset();
    let o = f.as_user(&[], &["sh", "-c", "echo evil > notes.json"]).output().unwrap();
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(std::fs::read_to_string(f.ws.join(".vscode/settings.json")).unwrap(), "evil\n");
}
