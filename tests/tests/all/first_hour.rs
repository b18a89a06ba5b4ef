//! docs/agents.md's "The first hour", run as written: each shell block of
//! the section in an empty directory of its own, with the `palisade` under
//! test first in PATH, a home whose git identity is Ada's, and pip reading
//! pytest's wheels from target/py-wheels (`scripts/py-venv.sh` fetches
//! them) instead of the network.

use palisade_tests::*;
use std::path::Path;

/// The shell blocks of the section `## The first hour`.
fn blocks() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/agents.md")).unwrap();
    let start = doc.find("## The first hour").expect("the section");
    let section = &doc[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    section.split("```sh\n").skip(1).map(|b| b[..b.find("```").unwrap()].to_string()).collect()
}

#[test]
fn the_first_hour_of_docs_agents_runs_as_written() {
    let wheels = made_by_py_venv("py-wheels");
    let blocks = blocks();
    assert_eq!(blocks.len(), 4, "{blocks:?}");
    let home = TempDir::new("first-hour-home");
    std::fs::write(home.join(".gitconfig"), "[user]\n\tname = Ada Lovelace\n\temail = ada@example.org\n")
        .unwrap();
    let path = path_with_palisade();
    let expected = [
        ("1 passed", ""),
        ("node ok", ""),
        ("Ada Lovelace: first, from a sandbox", ""),
        ("served\nrefused\n", "CapabilityDenied: network access to elsewhere.internal is not allowed"),
    ];
    for (block, (out_has, err_has)) in blocks.iter().zip(expected) {
        let dir = TempDir::new("first-hour");
        let (_journal, journal) = scratch_journal(None);
        let o = std::process::Command::new("/bin/bash")
            .args(["-e", "-c", block])
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("HOME", home.path())
            .env("PALISADE_STATE", state_beside(&journal))
            .env("PALISADE_JOURNAL", &journal)
            .env("PIP_NO_INDEX", "1")
            .env("PIP_FIND_LINKS", &wheels)
            .env_remove("PALISADE_SOCKET")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{block}\n{out}{err}");
        assert!(out.contains(out_has) && err.contains(err_has), "{block}\nstdout: {out}\nstderr: {err}");
    }
}
