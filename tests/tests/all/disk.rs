//! A run's writes to its workspace are bounded: they are held in an
//! overlay's layer on disk, in the broker's state, and applied to the host
//! when the command exits by itself. A run whose writes pass their bound
//! (`max_disk_mb`), or would take the filesystem below its floor
//! (`[changes] min_free_mb`), is stopped with a clear error naming the key,
//! and its writes are held, never applied.

use palisade_protocol::attest::Scratch;
use palisade_tests::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// `palisade run --policy` (an embedded broker) with `toml` added to the base configuration.
fn run_with(ws: &Path, toml: &str, args: &[&str]) -> std::process::Output {
    let dir = TempDir::new("policy");
    let path = dir.join("p.toml");
    std::fs::write(&path, test_config(toml)).unwrap();
    palisade_cli(ws, &["run", "--policy", path.to_str().unwrap()], args, None)
}

/// `palisade changes list --json --policy P` in `ws`, with the journal and state of `palisade_cli`.
fn held(ws: &Path, policy: &Path, state: &Path) -> serde_json::Value {
    let o = std::process::Command::new(bin("palisade"))
        .args(["changes", "list", "--json", "--policy", policy.to_str().unwrap()])
        .current_dir(ws)
        .env("PALISADE_STATE", state)
        .env("PALISADE_JOURNAL", state.join("journal"))
        .output()
        .unwrap();
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o.stderr)))
}

#[test]
fn a_disk_fill_attempt_is_stopped_at_its_bound_with_a_clear_error_and_its_writes_held() {
    let ws = TempDir::new("fill");
    let dir = TempDir::new("policy");
    let (policy, state) = (dir.join("p.toml"), dir.join("state"));
    std::fs::write(&policy, test_config("max_disk_mb = 16\n")).unwrap();
    // 2 GiB, past a bound of 16 MiB: stopped long before its end.
    let o = std::process::Command::new(bin("palisade"))
        .args(["run", "--policy", policy.to_str().unwrap(), "--", &probe(), "bigfile", "fill", "2048"])
        .current_dir(ws.path())
        .env("PALISADE_STATE", &state)
        .env("PALISADE_JOURNAL", state.join("journal"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    let last = err.lines().last().unwrap_or("");
    assert!(last.starts_with("palisade: DiskLimitExceeded: ") && last.contains("(max_disk_mb)"), "{err}");
    assert!(err.starts_with("palisade: changes held as "), "{err}");
    assert!(!ws.join("fill").exists(), "a write of the stopped run reached the workspace");
    let held = held(ws.path(), &policy, &state);
    let bytes = held[0]["bytes"].as_u64().unwrap();
    assert!((16 << 20..1 << 30).contains(&bytes), "{held}: stopped at its bound, not at the end");
    assert!(held[0]["reason"].as_str().unwrap().contains("bound of 16 MiB (max_disk_mb)"), "{held}");

    // Counter-test: writing directly, the same command does reach the host's disk.
    let o = run_with(
        ws.path(),
        "disk = \"direct\"\nmax_file_size_mb = 64\n",
        &[&probe(), "bigfile", "direct", "48"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(std::fs::metadata(ws.join("direct")).unwrap().len(), 48 << 20);
}

#[test]
fn a_run_that_would_take_the_filesystem_below_its_floor_is_stopped_and_its_writes_held() {
    if !is_root() {
        skipped("not root: a small filesystem for the change sets cannot be mounted");
        return;
    }
    // The change sets on a filesystem of 96 MiB that keeps 64 MiB free: a
    // run writing 64 MiB is stopped at about 32, and the filesystem (a
    // tmpfs here, the host's disk anywhere else) keeps its floor.
    let ws = TempDir::new("floor");
    let dir = TempDir::new("policy");
    let small = Tmpfs::mount(&dir, "size=96m");
    let (policy, state) = (dir.join("p.toml"), dir.join("state"));
    let config = format!("[changes]\ndir = {:?}\nmin_free_mb = 64\n", small.path());
    std::fs::write(&policy, test_config(&config)).unwrap();
    let o = std::process::Command::new(bin("palisade"))
        .args(["run", "--policy", policy.to_str().unwrap(), "--", &probe(), "bigfile", "fill", "64"])
        .current_dir(ws.path())
        .env("PALISADE_STATE", &state)
        .env("PALISADE_JOURNAL", state.join("journal"))
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(err.contains("less than 64 MiB free ([changes] min_free_mb)"), "{err}");
    assert!(!ws.join("fill").exists());
    let held = held(ws.path(), &policy, &state);
    assert_eq!(held.as_array().map(Vec::len), Some(1), "{held}");
    // Counter-test, once the held writes are gone: a run that keeps the floor is applied.
    let id = held[0]["id"].as_str().unwrap();
    let o = std::process::Command::new(bin("palisade"))
        .args(["changes", "discard", id, "--policy", policy.to_str().unwrap()])
        .env("PALISADE_STATE", &state)
        .env("PALISADE_JOURNAL", state.join("journal"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = std::process::Command::new(bin("palisade"))
        .args(["run", "--policy", policy.to_str().unwrap(), "--", &probe(), "bigfile", "fits", "8"])
        .current_dir(ws.path())
        .env("PALISADE_STATE", &state)
        .env("PALISADE_JOURNAL", state.join("journal"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(std::fs::metadata(ws.join("fits")).unwrap().len(), 8 << 20);
}

#[test]
fn many_small_files_hit_the_same_bound() {
    let ws = TempDir::new("fill-many");
    let toml = "max_disk_mb = 8\nallow_interpreters = true\nallow_inline_code = true\n";
    let script = "i=0; while [ $i -lt 4000 ]; do head -c 4096 /dev/zero > f$i || exit 3; i=$((i+1)); done";
    let o = run_with(ws.path(), toml, &["sh", "-c", script]);
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.lines().last().unwrap_or("").starts_with("palisade: DiskLimitExceeded"), "{err}");
    assert_eq!(std::fs::read_dir(ws.path()).unwrap().count(), 0);
}

#[test]
fn empty_files_hit_the_bound_too() {
    // Empty files take no blocks, only inodes: the bound counts those as well
    // (a 1 MiB bound holds 1024 files), so they cannot grow the kernel's memory
    // or, when copied back, the host's inode table without limit.
    let ws = TempDir::new("fill-inodes");
    let toml = "max_disk_mb = 1
allow_interpreters = true
allow_inline_code = true
";
    let script = "i=0; while [ $i -lt 5000 ]; do : > e$i || exit 3; i=$((i+1)); done";
    let o = run_with(ws.path(), toml, &["sh", "-c", script]);
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.lines().last().unwrap_or("").starts_with("palisade: DiskLimitExceeded"), "{err}");
    assert_eq!(std::fs::read_dir(ws.path()).unwrap().count(), 0);
    // Counter-test: fewer files than the bound are kept.
    let script = "i=0; while [ $i -lt 500 ]; do : > e$i || exit 3; i=$((i+1)); done";
    let o = run_with(ws.path(), toml, &["sh", "-c", script]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_dir(ws.path()).unwrap().count(), 500);
}

#[test]
fn writes_are_copied_back_when_the_command_exits_by_itself() {
    let ws = TempDir::new("commit");
    let outside = TempDir::new("outside");
    let p = |n: &str| ws.join(n);
    std::fs::write(p("keep.txt"), "unchanged").unwrap();
    std::fs::write(p("edit.txt"), "old").unwrap();
    std::fs::write(p("gone.txt"), "delete me").unwrap();
    std::fs::create_dir_all(p("olddir/sub")).unwrap();
    std::fs::write(p("olddir/sub/f"), "x").unwrap();
    std::fs::write(p("rename-me"), "moving").unwrap();
    std::fs::write(p("was-file"), "becomes a dir").unwrap();
    let stamp = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
    let script = format!(
        "set -e; echo new > edit.txt; rm gone.txt; rm -r olddir; mv rename-me renamed; \
         mkdir -p new/deep/tree; echo leaf > new/deep/tree/leaf; \
         ln -s {out}/target link-out; echo tool > tool.sh; chmod 755 tool.sh; \
         touch -d @1600000000 stamped; rm was-file; mkdir was-file; echo inner > was-file/inner; \
         printf '%s' \"$(cat keep.txt)\" > /dev/null",
        out = outside.path().display()
    );
    let toml = "allow_interpreters = true\nallow_inline_code = true\n";
    let o = run_with(ws.path(), toml, &["sh", "-c", &script]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));

    let read = |n: &str| std::fs::read_to_string(p(n)).unwrap();
    assert_eq!(read("keep.txt"), "unchanged");
    assert_eq!(read("edit.txt"), "new\n");
    assert!(!p("gone.txt").exists() && !p("olddir").exists() && !p("rename-me").exists());
    assert_eq!(read("renamed"), "moving");
    assert_eq!(read("new/deep/tree/leaf"), "leaf\n");
    assert_eq!(read("was-file/inner"), "inner\n");
    assert_eq!(std::fs::read_link(p("link-out")).unwrap(), outside.join("target"));
    assert!(!outside.join("target").exists(), "a symlink was followed");
    assert_eq!(std::fs::metadata(p("tool.sh")).unwrap().permissions().mode() & 0o777, 0o755);
    assert_eq!(std::fs::metadata(p("stamped")).unwrap().modified().unwrap(), stamp);
    // Everything belongs to the workspace's owner.
    let owner = std::fs::metadata(ws.path()).unwrap().uid();
    for n in ["edit.txt", "renamed", "new/deep/tree/leaf", "was-file", "tool.sh"] {
        assert_eq!(std::fs::metadata(p(n)).unwrap().uid(), owner, "{n}");
    }
    // No temporary name is left behind.
    assert!(
        std::fs::read_dir(ws.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".palisade"))
    );
}

#[test]
fn writes_are_held_not_applied_when_palisade_ends_the_run() {
    let ws = TempDir::new("dropped");
    let toml = "allow_interpreters = true\nallow_inline_code = true\n";
    let dir = TempDir::new("p");
    let path = dir.join("p.toml");
    std::fs::write(&path, test_config(toml)).unwrap();
    let o = palisade_cli(
        ws.path(),
        &["run", "--policy", path.to_str().unwrap(), "--timeout", "1"],
        &["sh", "-c", "echo half > written; sleep 30"],
        None,
    );
    assert_eq!(o.status.code(), Some(125));
    let err = text(&o.stderr);
    assert!(err.contains("palisade: TimedOut"), "{err}");
    assert!(err.starts_with("palisade: changes held as "), "the writes of a killed run are held: {err}");
    assert!(!ws.join("written").exists(), "the writes of a killed run were applied");
}

#[test]
fn a_temporary_workspace_is_a_tmpfs_of_the_configured_size() {
    let ws = TempDir::new("temp");
    let probe_dir = bin("probe").parent().unwrap().to_string_lossy().into_owned();
    let toml = format!(
        "tmp_size_mb = 8\n[tools.t]\npreset = \"file_processor\"\nallowed_executables = [{:?}]\n[tools.t.overrides]\nfilesystem = [{{ read_only = {probe_dir:?} }}]\n",
        probe()
    );
    let d = Daemon::start(&toml);
    let mut c = palisade_broker::cli::client::Client::connect(&d.socket).unwrap();
    let req = palisade_protocol::wire::RunRequest {
        argv: vec![probe(), "bigfile".into(), "/workspace/fill".into(), "64".into()],
        cwd: Some(ws.path().to_string_lossy().into_owned()),
        tool: Some("t".into()),
        ..Default::default()
    };
    let mut out = Vec::new();
    let r = c
        .run(req, |m| {
            if let palisade_protocol::wire::ServerMessage::Output { data, .. } = m {
                out.extend_from_slice(data);
            }
        })
        .unwrap();
    assert!(text(&out).starts_with("err ENOSPC stopped after"), "{} {r:?}", text(&out));
    let written: u64 = text(&out).split_whitespace().nth(4).unwrap().parse().unwrap();
    assert!(written <= 8 << 20, "{written} bytes in an 8 MiB temporary workspace");
    let disk = &r.attestation.enforcement.disk;
    assert!(
        matches!(&disk.scratch, Scratch::WorkspaceAndTmp { workspace, .. } if workspace == "/workspace"),
        "{disk}"
    );
}

/// As root, the same file again as the unprivileged test user.
#[test]
fn the_disk_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_disk_suite_passes_as_an_unprivileged_user");
}
