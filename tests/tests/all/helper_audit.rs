//! The helper is what a security reviewer reads line by line: it stays small,
//! free of heavy dependencies, and every `unsafe` block says why it is sound.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every Rust file under `helper/src`, its folders included.
fn helper_sources() -> Vec<(PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../helper/src");
    let (mut files, mut folders) = (Vec::new(), vec![dir.clone()]);
    while let Some(folder) = folders.pop() {
        for path in std::fs::read_dir(&folder).unwrap().map(|e| e.unwrap().path()) {
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                files.push((path, text));
            }
        }
    }
    files.sort();
    assert!(files.len() > 5, "helper sources not found in {}", dir.display());
    files
}

#[test]
fn helper_src_stays_under_1500_lines_of_code() {
    let loc: usize = helper_sources()
        .iter()
        .map(|(_, text)| {
            text.lines().filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with("//")).count()
        })
        .sum();
    assert!(loc < 1500, "helper/src has {loc} lines of code");
}

#[test]
fn every_unsafe_block_in_the_helper_has_a_safety_comment() {
    for (path, text) in helper_sources() {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim_start().starts_with("//")
                || !line.contains("unsafe {") && !line.contains("unsafe fn")
            {
                continue;
            }
            let above = &lines[i.saturating_sub(3)..i];
            assert!(
                above.iter().any(|l| l.contains("// SAFETY:")),
                "{}:{}: unsafe without a // SAFETY: comment",
                path.display(),
                i + 1
            );
        }
    }
}

#[test]
fn the_helper_never_unwraps() {
    for (path, text) in helper_sources() {
        for (i, line) in text.lines().enumerate() {
            assert!(
                !line.contains(".unwrap()") && !line.contains(".expect("),
                "{}:{}: {line}",
                path.display(),
                i + 1
            );
        }
    }
}

#[test]
fn the_helper_depends_on_neither_tokio_nor_serde_json() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "--offline", "-e", "normal", "-p", "palisade-helper", "--prefix", "none"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(tree.contains("palisade-protocol") && tree.contains("landlock"), "{tree}");
    for banned in ["tokio", "serde_json", "tracing", "wasmtime", "seccompiler"] {
        assert!(
            !tree.lines().any(|l| l.starts_with(&format!("{banned} "))),
            "the helper pulls in {banned}:\n{tree}"
        );
    }
}
