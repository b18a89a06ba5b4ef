//! The audit journal through the real binaries: runs recorded in one chain
//! that `palisade audit verify` accepts, tampering named at its record, a
//! broker killed mid-burst, a torn last line set aside, a full filesystem,
//! several writers, rotation and retention, and the recipe of
//! docs/journal.md checked against a real journal.

use palisade_broker::cli::client::{Client, ClientError};
use palisade_protocol::wire::{ErrorKind, RunResult};
use palisade_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `palisade audit verify`'s exit statuses (docs/journal.md).
const EXIT_PRUNED: i32 = 3;
const EXIT_HEAD_MISSING: i32 = 4;

/// `palisade audit ARGS`: its exit status and what it printed (both streams).
fn audit(args: &[&str]) -> (Option<i32>, String) {
    let o = std::process::Command::new(bin("palisade")).arg("audit").args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.code(), text)
}

fn verify(journal: &Path, more: &[&str]) -> (Option<i32>, String) {
    let mut args = vec!["verify", "--journal", journal.to_str().unwrap()];
    args.extend_from_slice(more);
    audit(&args)
}

fn count(records: &[Value], event: &str) -> usize {
    records.iter().filter(|r| r["event"] == event).count()
}

/// `n` runs of `probe echo` through the daemon by `clients` clients at once.
fn runs(d: &Daemon, ws: &Path, n: usize, clients: usize) -> Vec<RunResult> {
    let results = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|s| {
        for c in 0..clients {
            let results = results.clone();
            s.spawn(move || {
                let mut client = Client::connect(&d.socket).unwrap();
                for i in (c..n).step_by(clients) {
                    let r = client.run(request(ws, &["echo", &i.to_string()]), |_| {}).unwrap();
                    results.lock().unwrap().push(r);
                }
            });
        }
    });
    Arc::try_unwrap(results).unwrap().into_inner().unwrap()
}

/// Each result's attestation names its `run_finished` record, as the journal has it.
fn assert_receipts(results: &[RunResult], recs: &[Value]) {
    for r in results {
        let j = r.attestation.journal.as_ref().expect("the attestation's journal record");
        let rec = recs.iter().find(|x| x["seq"] == j.seq).unwrap_or_else(|| panic!("no record {}", j.seq));
        assert_eq!(
            (rec["event"].as_str(), rec["hash"].as_str()),
            (Some("run_finished"), Some(j.hash.as_str()))
        );
        assert_eq!(rec["run_id"], r.run_id);
    }
}

#[test]
fn a_thousand_runs_make_one_chain_that_verifies_and_each_result_names_its_record() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let results = runs(&d, ws.path(), 1000, 4);
    assert_eq!(results.len(), 1000);
    let recs = journal_records(&d.journal());
    assert_receipts(&results, &recs);
    for event in ["request_received", "decision", "run_started", "run_finished"] {
        assert_eq!(count(&recs, event), 1000, "{event}");
    }
    assert_eq!(count(&recs, "broker_started"), 1);
    let (code, out) = verify(&d.journal(), &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("verified: {} records", recs.len())), "{out}");
    // A head kept elsewhere is found in the chain; a head it never had is not.
    let (code, head) = audit(&["head", "--journal", d.journal().to_str().unwrap()]);
    assert_eq!(code, Some(0), "{head}");
    let hash = head.split_whitespace().nth(1).unwrap().to_string();
    assert_eq!(verify(&d.journal(), &["--head", &hash]).0, Some(0));
    let (code, out) = verify(&d.journal(), &["--head", &"ab".repeat(32)]);
    assert_eq!(code, Some(EXIT_HEAD_MISSING), "{out}");
    assert!(out.contains("is not in the journal"), "{out}");
    // Something that is no hash is a usage error, not a missing head.
    let (code, out) = verify(&d.journal(), &["--head", "abc"]);
    assert_eq!(code, Some(2), "{out}");
}

/// A copy of `journal`'s segments in `to`, with `change` applied to the
/// lines of its (only) segment.
fn tampered(journal: &Path, to: &Path, change: impl FnOnce(&mut Vec<String>)) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    let segment = &journal_segments(journal)[0];
    let mut lines: Vec<String> =
        String::from_utf8(segment_content(segment)).unwrap().lines().map(String::from).collect();
    change(&mut lines);
    let copy = to.join(segment.file_name().unwrap());
    std::fs::write(&copy, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    to.to_path_buf()
}

/// The documented script (docs/journal.md's Python block) run on `journal`.
fn documented_recipe(journal: &Path) -> String {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/journal.md")).unwrap();
    let script = doc.split("```python\n").nth(1).and_then(|s| s.split("```").next()).expect("the recipe");
    let o = std::process::Command::new("python3").arg("-c").arg(script).arg(journal).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[test]
fn an_edit_a_deletion_a_swap_or_an_insertion_is_named_at_its_record() {
    let mut d = Daemon::start("");
    let ws = TempDir::new("ws");
    runs(&d, ws.path(), 5, 1);
    d.stop();
    let journal = d.journal();
    let (code, out) = verify(&journal, &[]);
    assert_eq!(code, Some(0), "{out}");
    // The documented recipe agrees with palisade on the untouched journal.
    let (_, head) = audit(&["head", "--journal", journal.to_str().unwrap()]);
    assert_eq!(documented_recipe(&journal), format!("ok {}", head.trim()));
    let dir = TempDir::new("tampered");
    let name = journal_segments(&journal)[0].file_name().unwrap().to_string_lossy().into_owned();
    // One digit of line 7's time changed.
    let edited = tampered(&journal, &dir.join("edit"), |l| {
        let at = l[6].find("\"time\":\"").unwrap() + 8 + 21;
        let digit = if &l[6][at..at + 1] == "1" { "2" } else { "1" };
        l[6].replace_range(at..at + 1, digit);
    });
    let deleted = tampered(&journal, &dir.join("delete"), |l| {
        l.remove(6);
    });
    let swapped = tampered(&journal, &dir.join("swap"), |l| l.swap(6, 7));
    let inserted = tampered(&journal, &dir.join("insert"), |l| {
        let copy = l[4].clone();
        l.insert(5, copy);
    });
    for (copy, seq, line) in [(&edited, 7, 7), (&deleted, 8, 7), (&swapped, 8, 7), (&inserted, 5, 6)] {
        let (code, out) = verify(copy, &[]);
        assert_eq!(code, Some(1), "{out}");
        assert!(
            out.contains(&format!("record seq {seq} (")) && out.contains(&format!("{name}, line {line})")),
            "{out}"
        );
        let (code, json) = verify(copy, &["--json"]);
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            (code, v["broken"]["seq"].as_u64(), v["broken"]["line"].as_u64()),
            (Some(1), Some(seq), Some(line))
        );
        assert!(documented_recipe(copy).starts_with("broken at seq"), "{}", copy.display());
    }
    // Records end at the zeros reserved ahead: anything after those is no record's.
    let hidden = dir.join("hidden");
    std::fs::create_dir(&hidden).unwrap();
    let zeros = [0u8; 64];
    let bytes =
        [&segment_content(&journal_segments(&journal)[0])[..], &zeros[..], &b"{\"seq\":99}\n"[..]].concat();
    std::fs::write(hidden.join(&name), bytes).unwrap();
    let (code, out) = verify(&hidden, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("bytes after the end of the records"), "{out}");
    // A broker does not write on a journal whose newest records do not chain.
    let config = dir.join("c.toml");
    std::fs::write(&config, base_config()).unwrap();
    let o = std::process::Command::new(bin("palisaded"))
        .args(["--config", config.to_str().unwrap(), "--socket", dir.join("s.sock").to_str().unwrap()])
        .env("PALISADE_JOURNAL", &edited)
        .env("PALISADE_STATE", state_beside(&edited))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is broken at record seq 7 ("), "{o:?}");
    // The last records cut off: the chain left is whole, but the kept head is gone from it.
    let cut = tampered(&journal, &dir.join("cut"), |l| l.truncate(l.len() - 3));
    assert_eq!(verify(&cut, &[]).0, Some(0));
    let hash = head.split_whitespace().nth(1).unwrap();
    let (code, out) = verify(&cut, &["--head", hash]);
    assert_eq!(code, Some(EXIT_HEAD_MISSING), "{out}");
}

#[test]
fn a_broker_killed_mid_burst_leaves_a_chain_that_verifies_and_goes_on() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let received = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|s| {
        for c in 0..4 {
            let (received, ws, socket) = (received.clone(), ws.path(), d.socket.clone());
            s.spawn(move || {
                let Ok(mut client) = Client::connect(&socket) else { return };
                // Bounded: the broker is killed long before.
                for i in 0..500 {
                    match client.run(request(ws, &["echo", &format!("{c}-{i}")]), |_| {}) {
                        Ok(r) => received.lock().unwrap().push(r),
                        Err(_) => return,
                    }
                }
            });
        }
        assert!(eventually(Duration::from_secs(60), || received.lock().unwrap().len() >= 40));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(d.child.id() as i32), nix::sys::signal::SIGKILL)
            .unwrap();
    });
    let received = Arc::try_unwrap(received).unwrap().into_inner().unwrap();
    let journal = d.journal();
    let (code, out) = verify(&journal, &[]);
    assert_eq!(code, Some(0), "{out}");
    // Every result a client got is in the chain, as its attestation says.
    assert_receipts(&received, &journal_records(&journal));
    // A broker started again chains on the last whole record.
    let again = Daemon::start_with(DaemonOptions {
        env: vec![("PALISADE_JOURNAL".into(), journal.to_string_lossy().into_owned())],
        ..Default::default()
    });
    let after = runs(&again, ws.path(), 3, 1);
    let recs = journal_records(&journal);
    assert_receipts(&received, &recs);
    assert_receipts(&after, &recs);
    let (code, out) = verify(&journal, &[]);
    assert_eq!(code, Some(0), "{out}\n{}", again.log());
}

#[test]
fn a_torn_last_line_is_set_aside_recorded_and_the_chain_goes_on() {
    let mut d = Daemon::start("");
    let ws = TempDir::new("ws");
    runs(&d, ws.path(), 3, 1);
    d.stop();
    let journal = d.journal();
    let segment = journal_segments(&journal)[0].clone();
    let before = segment_content(&segment);
    let torn = br#"{"argv":["/usr/bin/echo","half"],"broker":"1-2","ev"#;
    std::fs::write(&segment, [&before[..], &torn[..]].concat()).unwrap();
    let (code, out) = verify(&journal, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("torn tail: the last {} bytes", torn.len())), "{out}");
    let again = Daemon::start_with(DaemonOptions {
        env: vec![("PALISADE_JOURNAL".into(), journal.to_string_lossy().into_owned())],
        ..Default::default()
    });
    assert!(again.log().contains("was set aside"), "{}", again.log());
    runs(&again, ws.path(), 2, 1);
    // Earlier records untouched; the torn bytes kept in a file of their own, and recorded.
    let now = segment_content(&segment);
    assert_eq!(&now[..before.len()], &before[..]);
    let recs = journal_records(&journal);
    let aside = recs.iter().find(|r| r["event"] == "tail_set_aside").expect("a tail_set_aside record");
    let file = journal.join(aside["file"].as_str().unwrap());
    assert_eq!(std::fs::read(&file).unwrap(), torn);
    assert_eq!(aside["bytes"], torn.len());
    assert_eq!(aside["sha256"].as_str(), Some(palisade_broker::journal::attest::sha256_hex(torn).as_str()));
    let (code, out) = verify(&journal, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("set aside: {}", file.display())) && !out.contains("torn tail"), "{out}");
}

#[test]
fn a_daemon_and_embedded_brokers_at_once_keep_one_chain() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let journal = d.journal();
    let nowhere = ws.join("no-broker.sock");
    std::thread::scope(|s| {
        s.spawn(|| runs(&d, ws.path(), 30, 2));
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..6 {
                    let o = std::process::Command::new(bin("palisade"))
                        .args(["run", "-n", "--", "/usr/bin/echo", "embedded"])
                        .env("PALISADE_SOCKET", &nowhere)
                        .env("PALISADE_JOURNAL", &journal)
                        .env("PALISADE_STATE", state_beside(&journal))
                        .current_dir(ws.path())
                        .output()
                        .unwrap();
                    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
                }
            });
        }
    });
    let recs = journal_records(&journal);
    assert_eq!(count(&recs, "run_finished"), 42);
    let brokers: std::collections::BTreeSet<&str> =
        recs.iter().filter_map(|r| r["broker"].as_str()).collect();
    assert_eq!(brokers.len(), 13, "{brokers:?}");
    let (code, out) = verify(&journal, &[]);
    assert_eq!(code, Some(0), "{out}");
}

/// Fills the filesystem of `dir` (bounded), in a file `filler`.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let filler = dir.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 4096];
    for _ in 0..100_000 {
        if f.write_all(&chunk).is_err() {
            return filler;
        }
    }
    panic!("{} never filled up", dir.display());
}

#[test]
fn a_full_filesystem_refuses_runs_as_journal_unavailable_until_space_returns() {
    if !is_root() {
        skipped("not root: a tmpfs cannot be mounted, so a full filesystem cannot be made");
        return;
    }
    let dir = TempDir::new("fulljournal");
    let tmpfs = Tmpfs::mount(&dir, "size=256k,mode=0755");
    let fs = tmpfs.path();
    let journal = fs.join("journal");
    // No floor: this is the full disk itself (the floor has a test of its own).
    let d = Daemon::start_with(DaemonOptions {
        config: "[journal]\nmin_free_bytes = 0\n".into(),
        env: vec![("PALISADE_JOURNAL".into(), journal.to_string_lossy().into_owned())],
        ..Default::default()
    });
    let ws = TempDir::new("ws");
    runs(&d, ws.path(), 2, 1);
    let filler = fill(fs);
    let mut client = Client::connect(&d.socket).unwrap();
    let mut refused = 0;
    // What is left of the segment's last page may take a record or two; not more runs.
    for i in 0..6 {
        match client.run(request(ws.path(), &["echo", &i.to_string()]), |_| {}) {
            Err(ClientError::Reply(e)) => {
                assert_eq!(e.kind, ErrorKind::JournalUnavailable, "{}", e.message);
                assert!(e.message.contains("No space left"), "{}", e.message);
                refused += 1;
            }
            Ok(r) => assert!(r.attestation.journal.is_some()),
            Err(e) => panic!("{e}"),
        }
    }
    assert!(refused >= 4, "{refused} refused");
    // The CLI says so in its one line.
    let o = d.run(ws.path(), &[&probe(), "echo", "x"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains("JournalUnavailable"));
    // Nothing half written stays: the chain is whole.
    let (code, out) = verify(&journal, &[]);
    assert_eq!(code, Some(0), "{out}");
    std::fs::remove_file(&filler).unwrap();
    let after = client.run(request(ws.path(), &["echo", "back"]), |_| {}).unwrap();
    assert_receipts(&[after], &journal_records(&journal));
    let (code, out) = verify(&journal, &[]);
    assert_eq!(code, Some(0), "{out}");
    drop(d);
}

/// 32 bytes of a lowercase hex sha256.
fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len() / 2).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect()
}

/// A journal in `dir` of `segments` segments of `per` records each, all
/// written on 1 January 2001: one chain, as docs/journal.md describes it,
/// made without the broker. The hash of its last record.
fn old_journal(dir: &Path, segments: u64, per: u64) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let mut prev = "0".repeat(64);
    for s in 0..segments {
        let first = s * per + 1;
        let mut text = String::new();
        for seq in first..first + per {
            // Keys sorted, no whitespace: the canonical bytes.
            let time = format!("2001-01-01T00:00:{:02}.000000Z", seq % 60);
            let body = |hash: &str| {
                format!(
                    r#"{{"broker":"1-1","event":"broker_stopped",{hash}"pid":1,"prev":"{prev}","seq":{seq},"time":"{time}"}}"#
                )
            };
            let canonical = body("");
            let hash = palisade_broker::journal::attest::sha256_hex(
                &[unhex(&prev), canonical.into_bytes()].concat(),
            );
            text += &body(&format!(r#""hash":"{hash}","#));
            text.push('\n');
            prev = hash;
        }
        std::fs::write(dir.join(format!("segment-{first:020}.jsonl")), text).unwrap();
    }
    prev
}

#[test]
fn segments_rotate_and_retention_by_age_leaves_a_record_of_what_it_removed() {
    let mut d = Daemon::start("[journal]\nsegment_bytes = 4096\n");
    let ws = TempDir::new("ws");
    let first = runs(&d, ws.path(), 12, 2);
    d.stop();
    let journal = d.journal();
    let many = journal_segments(&journal).len();
    assert!(many >= 4, "{many} segments");
    let (code, out) = verify(&journal, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("in {many} segments")), "{out}");
    assert_receipts(&first, &journal_records(&journal));
    // Retention by age: segments whose records are all older than keep_days
    // go when one is closed, and a record says so; the rest stay.
    let dir = TempDir::new("aged");
    let aged = dir.join("journal");
    old_journal(&aged, 3, 5);
    assert_eq!(verify(&aged, &[]).0, Some(0), "{}", documented_recipe(&aged));
    let kept = Daemon::start_with(DaemonOptions {
        config: "[journal]\nsegment_bytes = 4096\nkeep_days = 1\n".into(),
        env: vec![("PALISADE_JOURNAL".into(), aged.to_string_lossy().into_owned())],
        ..Default::default()
    });
    let last = runs(&kept, ws.path(), 12, 1);
    let left = journal_segments(&aged);
    let names: Vec<String> = left.iter().map(|p| p.file_name().unwrap().to_string_lossy().into()).collect();
    // The two old segments went; the third took the broker's first records, and stays.
    assert_eq!(names[0], format!("segment-{:020}.jsonl", 11), "{names:?}");
    let recs = journal_records(&aged);
    assert_receipts(&last, &recs);
    let removed = recs.iter().find(|r| r["event"] == "segments_removed").expect("a segments_removed record");
    assert_eq!((removed["first_seq"].as_u64(), removed["last_seq"].as_u64()), (Some(1), Some(10)));
    assert_eq!(removed["last_hash"], recs[0]["prev"]);
    let (code, out) = verify(&aged, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("were removed by retention"), "{out}");
    // Counter-test: segments of today are kept whatever their number.
    assert_eq!(count(&recs, "segments_removed"), 1);
    assert!(left.len() > 3, "{names:?}");
    // A segment removed otherwise is no retention's: verify says records
    // were removed (its own status), unless told that is expected.
    drop(kept);
    std::fs::remove_file(&journal_segments(&aged)[0]).unwrap();
    let (code, out) = verify(&aged, &[]);
    assert_eq!(code, Some(EXIT_PRUNED), "{out}");
    assert!(out.contains("no record in it says that retention removed"), "{out}");
    let (code, json) = verify(&aged, &["--json"]);
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(code, Some(EXIT_PRUNED));
    assert!(v["pruned"]["first_seq"].as_u64().is_some_and(|s| s > 11), "{v}");
    let (code, out) = verify(&aged, &["--allow-pruned"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("are missing, and no record says why"), "{out}");
    // Counter-test: the journal that starts at its genesis needs no flag.
    let whole = TempDir::new("whole");
    old_journal(&whole.join("journal"), 2, 3);
    assert_eq!(verify(&whole.join("journal"), &[]).0, Some(0));
    // Its first segment removed: the same status.
    std::fs::remove_file(&journal_segments(&whole.join("journal"))[0]).unwrap();
    assert_eq!(verify(&whole.join("journal"), &[]).0, Some(EXIT_PRUNED));
}

#[test]
fn the_journal_is_private_and_a_directory_others_may_write_is_refused() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    runs(&d, ws.path(), 1, 1);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
    assert_eq!(mode(&d.journal()), 0o700);
    assert_eq!(mode(&journal_segments(&d.journal())[0]), 0o600);
    // A directory others may write to could be swapped or filled by them: refused.
    let dir = TempDir::new("open");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let open = dir.join("journal");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let config = dir.join("c.toml");
    std::fs::write(&config, base_config()).unwrap();
    let o = std::process::Command::new(bin("palisaded"))
        .args(["--config", config.to_str().unwrap(), "--socket", dir.join("s.sock").to_str().unwrap()])
        .env("PALISADE_JOURNAL", &open)
        .env("PALISADE_STATE", state_beside(&open))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nobody else can write to"), "{o:?}");
    assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0, "something was written");
    // Counter-test: the same directory made private is taken, and readable by a group when asked.
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o700)).unwrap();
    let gid = nix::unistd::getegid().as_raw();
    let grouped = Daemon::start_with(DaemonOptions {
        config: format!("[journal]\nreader_gid = {gid}\n"),
        env: vec![("PALISADE_JOURNAL".into(), open.to_string_lossy().into_owned())],
        ..Default::default()
    });
    runs(&grouped, ws.path(), 1, 1);
    assert_eq!(mode(&open), 0o750);
    assert_eq!(mode(&journal_segments(&open)[0]), 0o640);
    assert_eq!(std::fs::metadata(journal_segments(&open)[0].clone()).unwrap().gid(), gid);
    // A directory made on the way lets the readers through, and shows them nothing.
    let deeper = dir.join("state/journal");
    let _made = Daemon::start_with(DaemonOptions {
        config: format!("[journal]\nreader_gid = {gid}\n"),
        env: vec![("PALISADE_JOURNAL".into(), deeper.to_string_lossy().into_owned())],
        ..Default::default()
    });
    assert_eq!((mode(&dir.join("state")), mode(&deeper)), (0o711, 0o750));
}

/// `palisade audit ARGS` as `user`, with `env` (and no journal of its own:
/// `HOME` is `home`, nothing names another).
fn audit_as(
    user: &nix::unistd::User,
    home: &Path,
    args: &[&str],
    env: &[(&str, &Path)],
) -> (Option<i32>, String) {
    let o = std::process::Command::new("setpriv")
        .args(&as_user(user)[1..])
        .arg(bin("palisade"))
        .arg("audit")
        .args(args)
        .env_remove("PALISADE_JOURNAL")
        .env_remove("PALISADE_STATE")
        .env_remove("XDG_STATE_HOME")
        .env("HOME", home)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (o.status.code(), format!("{}{}", text(&o.stdout), text(&o.stderr)))
}

/// A root broker with `[journal] reader_gid`, under the system unit's umask
/// (0077), its journal inside a state directory made 0700 as the unit's
/// `StateDirectory=` is: the journal and its segments are the group's to
/// read whatever the umask, and the state directory lets the group through
/// (search only). A member of the group verifies the journal (exit 0), and
/// finds it by default when it has none of its own (`--system` says so
/// explicitly); a user outside the group is told it cannot read it (exit 5,
/// naming the directory that refuses it), not that it is broken (exit 1),
/// and so is the member for a segment root made private.
#[test]
fn the_journals_readers_verify_it_under_the_units_umask_and_others_cannot_read_it() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Some(users) = system_users() else {
        eprintln!(
            "not root: a root broker's journal read by other users cannot be tested as an ordinary user"
        );
        return;
    };
    let (reader, other) = (&users.victim, &users.attacker);
    let base = TempDir::new("system-state");
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (state, journal) = (base.join("state"), base.join("state/journal"));
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let d = Daemon::start_with(DaemonOptions {
        config: format!("[journal]\nreader_gid = {}\n", reader.gid),
        env: vec![
            ("PALISADE_STATE".into(), state.to_string_lossy().into_owned()),
            ("PALISADE_JOURNAL".into(), journal.to_string_lossy().into_owned()),
        ],
        prefix: under_umask("0077"),
        ..Default::default()
    });
    let ws = TempDir::new("ws");
    runs(&d, ws.path(), 3, 1);
    let meta = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.mode() & 0o7777, m.gid())
    };
    let group = reader.gid.as_raw();
    assert_eq!(meta(&state), (0o710, group));
    assert_eq!(meta(&journal), (0o750, group));
    assert_eq!(meta(&journal.join("lock")), (0o640, group));
    assert!(journal_segments(&journal).iter().all(|s| meta(s) == (0o640, group)));
    let home = TempDir::new("reader-home");
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let at = ["verify", "--journal", journal.to_str().unwrap()];
    let (code, out) = audit_as(reader, home.path(), &at, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with("verified: "), "{out}");
    // By default, with no journal of its own: the system broker's, as the
    // system configuration names it, and said so; --system explicitly.
    let system = base.join("system.toml");
    std::fs::write(&system, format!("[journal]\npath = {journal:?}\n")).unwrap();
    let env = [(SYSTEM_CONFIG_ENV, system.as_path())];
    let (code, out) = audit_as(reader, home.path(), &["verify"], &env);
    let own = home.join(".local/state/palisade/journal");
    let said = format!(
        "palisade audit: no journal of yours at {}: the system broker's, {}",
        own.display(),
        journal.display()
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("verified: ") && out.contains(&said), "{out}");
    assert_eq!(audit_as(reader, home.path(), &["verify", "--system"], &env).0, Some(0));
    // Another user: it cannot read the journal, which is not broken.
    let (code, out) = audit_as(other, home.path(), &at, &[]);
    assert_eq!(code, Some(5), "{out}");
    let refused = format!(
        "cannot read: {}: Permission denied (os error 13): uid {} (groups {}) may not search {} \
         (mode 0710, owner uid 0, group gid {group})",
        journal.display(),
        other.uid,
        other.gid,
        state.display()
    );
    assert!(out.contains(&refused) && out.contains("reader_gid"), "{out}");
    let (code, out) = audit_as(other, home.path(), &["verify"], &env);
    assert_eq!(code, Some(5), "{out}");
    // A segment the reader may not read: cannot read (naming it), not broken.
    let first = journal_segments(&journal)[0].clone();
    std::fs::set_permissions(&first, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, out) = audit_as(reader, home.path(), &at, &[]);
    assert_eq!(code, Some(5), "{out}");
    assert!(out.contains(&format!("may not read {} (mode 0600", first.display())), "{out}");
    // Counter-test: a segment it may read but whose record was changed is broken.
    std::fs::set_permissions(&first, std::fs::Permissions::from_mode(0o640)).unwrap();
    let tampered = String::from_utf8(segment_content(&first)).unwrap().replacen("\"echo\"", "\"ohce\"", 1);
    assert!(tampered.contains("ohce"), "no record to change in {}", first.display());
    std::fs::write(&first, tampered).unwrap();
    let (code, out) = audit_as(reader, home.path(), &at, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.starts_with("broken: "), "{out}");
}

#[test]
fn with_the_journal_off_nothing_is_written_and_results_say_so() {
    let d = Daemon::start("[journal]\nenabled = false\n");
    let ws = TempDir::new("ws");
    let results = runs(&d, ws.path(), 2, 1);
    assert!(results.iter().all(|r| r.attestation.journal.is_none()));
    assert!(!d.journal().exists());
    // Counter-test: on (the default), the result names its record.
    let on = Daemon::start("");
    assert!(runs(&on, ws.path(), 1, 1)[0].attestation.journal.is_some());
}

#[test]
fn approvals_asked_and_answered_are_recorded_with_the_run() {
    let d = Daemon::start("[broker]\nuser_namespaces = false\n[policy]\nfallback = \"request_approval\"\n");
    let ws = TempDir::new("ws");
    let ws_path = shared_workspace(&ws, "w");
    let mut c = Client::connect(&d.socket).unwrap();
    let refused = c.run_with_approval(request(&ws_path, &["echo", "no"]), |_| {}, |_| false);
    assert!(
        matches!(refused, Err(ClientError::Reply(ref e)) if e.kind == ErrorKind::NeedsApproval),
        "{refused:?}"
    );
    let approved = c.run_with_approval(request(&ws_path, &["echo", "yes"]), |_| {}, |_| true).unwrap();
    // The result says what was approved: Tier B in place of Tier C.
    let warned = approved.attestation.warnings.iter().any(|w| w.ends_with("no namespaces), as approved"));
    assert!(warned, "{:?}", approved.attestation.warnings);
    let recs = journal_records(&d.journal());
    let of = |run: u64| -> Vec<&str> {
        recs.iter().filter(|r| r["run_id"] == run).map(|r| r["event"].as_str().unwrap()).collect()
    };
    let me = nix::unistd::getuid().as_raw();
    assert_eq!(of(1), ["request_received", "decision", "approval_asked", "approval_answered"]);
    assert_eq!(
        of(approved.run_id),
        [
            "request_received",
            "decision",
            "approval_asked",
            "approval_answered",
            "run_started",
            "run_finished"
        ]
    );
    let answers: Vec<&Value> = recs.iter().filter(|r| r["event"] == "approval_answered").collect();
    assert_eq!(
        (answers[0]["approved"].as_bool(), answers[0]["by_uid"].as_u64()),
        (Some(false), Some(me.into()))
    );
    assert_eq!(
        (answers[1]["approved"].as_bool(), answers[1]["by_uid"].as_u64()),
        (Some(true), Some(me.into()))
    );
    assert!(recs.iter().any(|r| r["event"] == "decision" && r["decision"] == "needs_approval"));
    assert_receipts(&[approved], &recs);
}

#[test]
fn show_and_tail_read_the_journal_for_people_and_tools() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let results = runs(&d, ws.path(), 3, 1);
    let j = d.journal();
    let journal = j.to_str().unwrap();
    let run = results[1].run_id.to_string();
    let (code, out) = audit(&["show", &run, "--journal", journal, "--json"]);
    assert_eq!(code, Some(0), "{out}");
    let shown: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let events: Vec<&str> = shown.iter().map(|r| r["event"].as_str().unwrap()).collect();
    assert_eq!(events, ["request_received", "decision", "run_started", "run_finished"]);
    assert!(shown.iter().all(|r| r["run_id"] == results[1].run_id));
    let (code, out) = audit(&["show", &run, "--journal", journal]);
    assert_eq!(code, Some(0));
    assert!(
        out.lines().nth(3).is_some_and(|l| l.contains(" run_finished ") && l.contains("status=\"exited 0\"")),
        "{out}"
    );
    // Counter-test: a run it never had.
    let (code, out) = audit(&["show", "999999", "--journal", journal]);
    assert_eq!(code, Some(2), "{out}");
    let (code, out) = audit(&["tail", "-n", "2", "--journal", journal]);
    assert_eq!((code, out.lines().count()), (Some(0), 2), "{out}");
    assert!(out.lines().nth(1).unwrap().contains(" run_finished "), "{out}");
    // -f prints what is appended after it started: the last record first, then the new ones.
    let mut follow = std::process::Command::new(bin("palisade"))
        .args(["audit", "tail", "-n", "1", "-f", "--json", "--journal", journal])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = follow.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let Ok(line) = line else { return };
            if tx.send(serde_json::from_str::<Value>(&line).unwrap()).is_err() {
                return;
            }
        }
    });
    // Bounded: a tail that prints nothing fails the test, it does not hang it.
    let next = || rx.recv_timeout(Duration::from_secs(30)).expect("a record from tail -f");
    assert_eq!(next()["run_id"], results[2].run_id);
    let later = runs(&d, ws.path(), 1, 1);
    let seen: Vec<Value> = (0..4).map(|_| next()).collect();
    follow.kill().unwrap();
    follow.wait().unwrap();
    assert!(seen.iter().all(|r| r["run_id"] == later[0].run_id), "{seen:?}");
    assert_eq!(seen[3]["event"], "run_finished");
}

#[test]
fn the_embedded_broker_records_that_nobody_was_there_to_approve() {
    use std::os::unix::process::CommandExt;
    let ws = TempDir::new("ws");
    // Not in the workspace: a Tier B workspace holding the broker's configuration is refused.
    let etc = TempDir::new("policy");
    let policy = etc.join("p.toml");
    let config = "[broker]\nuser_namespaces = false\n[policy]\nfallback = \"request_approval\"\n";
    std::fs::write(&policy, format!("{}{config}", base_config())).unwrap();
    let (_journal, journal) = scratch_journal(None);
    let mut cmd = std::process::Command::new(bin("palisade"));
    cmd.args(["run", "-n", "--policy", policy.to_str().unwrap(), "--", &probe(), "echo", "x"])
        .env("PALISADE_JOURNAL", &journal)
        .env("PALISADE_STATE", state_beside(&journal))
        .current_dir(ws.path());
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        // No controlling terminal: nobody to ask.
        cmd.pre_exec(|| nix::unistd::setsid().map(drop).map_err(std::io::Error::from));
    }
    let o = cmd.output().unwrap();
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains("NeedsApproval"), "{o:?}");
    let recs = journal_records(&journal);
    let events: Vec<&str> = recs.iter().map(|r| r["event"].as_str().unwrap()).collect();
    assert_eq!(events, ["request_received", "decision", "approval_asked", "approval_answered"]);
    let answer = &recs[3];
    assert_eq!((answer["approved"].as_bool(), answer["by_uid"].is_null()), (Some(false), true));
    assert_eq!(answer["why"], "no terminal to ask");
    assert_eq!(verify(&journal, &[]).0, Some(0));
}

/// The bytes of records in a journal (the zeros reserved ahead not counted).
fn record_bytes(journal: &Path) -> usize {
    journal_segments(journal).iter().map(|s| segment_content(s).len()).sum()
}

/// The canonical line of a record (its bytes in the journal, newline included).
fn line_len(record: &Value) -> usize {
    serde_json::to_string(record).unwrap().len() + 1
}

/// A request the policy refuses for its size: one argument of 256 KiB
/// (the default limit is 4096 bytes), `tag` telling each apart.
fn oversized(ws: &Path, tag: usize) -> palisade_protocol::wire::RunRequest {
    let mut r = request(ws, &["echo", &format!("{tag:06}{}", "x".repeat(256 << 10))]);
    r.env.insert("BIG".into(), "v".repeat(64 << 10));
    r
}

/// docs/journal.md: the longest line of a refused request's records and of
/// a `refusals_summarized`.
const REFUSAL_RECORD_BYTES: usize = 16 << 10;

#[test]
fn a_flood_of_refused_oversized_requests_writes_bounded_records_at_a_rate_and_a_summary() {
    const FLOOD: usize = 200;
    const RECORDED: usize = 20;
    // Small segments and retention on: nothing of the requester's earlier records may go.
    let config = format!(
        "[journal]\nsegment_bytes = 4096\nkeep_days = 1\nrefusals_recorded = {RECORDED}\n\
         refusal_period_secs = 86400\n"
    );
    let mut d = Daemon::start(&config);
    let ws = TempDir::new("ws");
    let earlier = runs(&d, ws.path(), 3, 1);
    let journal = d.journal();
    let before = record_bytes(&journal);
    let mut client = Client::connect(&d.socket).unwrap();
    for i in 0..FLOOD {
        match client.run(oversized(ws.path(), i), |_| {}) {
            Err(ClientError::Reply(e)) => {
                assert_eq!(
                    (e.kind, e.rule.as_deref()),
                    (ErrorKind::InvalidRequest, Some("limits.argument_bytes"))
                )
            }
            other => panic!("{other:?}"),
        }
    }
    // At most two records a refusal within the rate, each within the documented bound.
    let grown = record_bytes(&journal) - before;
    let ceiling = 2 * RECORDED * REFUSAL_RECORD_BYTES;
    eprintln!("{FLOOD} refused requests wrote {grown} bytes of records (ceiling {ceiling})");
    assert!(grown <= ceiling, "{FLOOD} refusals wrote {grown} bytes (ceiling {ceiling})");
    let recs = journal_records(&journal);
    let refused: Vec<&Value> =
        recs.iter().filter(|r| r["event"] == "request_received" && r["bounded"] == true).collect();
    assert_eq!(refused.len(), RECORDED);
    // Counter-test: the first ones within the rate are each recorded, in bounded form.
    for (i, r) in refused.iter().enumerate() {
        assert!(line_len(r) <= REFUSAL_RECORD_BYTES, "{}", line_len(r));
        let argv = oversized(ws.path(), i).argv;
        assert_eq!(r["argv"]["count"], 3);
        assert_eq!(r["argv"]["bytes"], argv.iter().map(String::len).sum::<usize>());
        let sha =
            palisade_broker::journal::attest::sha256_hex(serde_json::to_string(&argv).unwrap().as_bytes());
        assert_eq!(r["argv"]["sha256"].as_str(), Some(sha.as_str()));
        assert_eq!(r["argv"]["heads"][2].as_str(), Some(&argv[2][..64]));
        assert_eq!(
            (r["env"]["heads"][0].as_str(), r["env_values_bytes"].as_u64()),
            (Some("BIG"), Some(64 << 10))
        );
        let decision = recs.iter().find(|x| x["event"] == "decision" && x["run_id"] == r["run_id"]).unwrap();
        assert_eq!(
            (decision["decision"].as_str(), decision["rule"].as_str()),
            (Some("deny"), Some("limits.argument_bytes"))
        );
    }
    // The requester's earlier records are all there.
    assert_receipts(&earlier, &recs);
    assert_eq!(count(&recs, "refusals_summarized"), 0);
    // The rest are counted, and recorded as a count when the broker stops.
    d.stop();
    let recs = journal_records(&journal);
    let summaries: Vec<&Value> = recs.iter().filter(|r| r["event"] == "refusals_summarized").collect();
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    let s = summaries[0];
    assert!(line_len(s) <= REFUSAL_RECORD_BYTES);
    assert_eq!(
        (s["count"].as_u64(), s["recorded"].as_u64()),
        (Some((FLOOD - RECORDED) as u64), Some(RECORDED as u64))
    );
    assert_eq!(
        (s["uid"].as_u64(), s["period_secs"].as_u64()),
        (Some(nix::unistd::getuid().as_raw().into()), Some(86400))
    );
    // Written before the broker's last record.
    assert_eq!(recs.last().unwrap()["event"], "broker_stopped");
    assert_receipts(&earlier, &recs);
    let (code, out) = verify(&journal, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("removed"), "{out}");
}

#[test]
fn refusals_past_the_rate_are_summarized_when_their_period_ends() {
    const FLOOD: usize = 12;
    let mut d = Daemon::start("[journal]\nrefusals_recorded = 2\nrefusal_period_secs = 1\n");
    let ws = TempDir::new("ws");
    let mut client = Client::connect(&d.socket).unwrap();
    for i in 0..FLOOD {
        assert!(matches!(client.run(oversized(ws.path(), i), |_| {}), Err(ClientError::Reply(_))));
    }
    // A period ends without the broker stopping: its count is recorded then
    // (bounded: a summary that never comes fails the test, it does not hang it).
    let journal = d.journal();
    let summarized = || journal_records(&journal).iter().any(|r| r["event"] == "refusals_summarized");
    assert!(eventually(Duration::from_secs(30), summarized), "{}", d.log());
    d.stop();
    // Every refusal is either recorded one by one or counted in a summary.
    let recs = journal_records(&journal);
    let one_by_one = recs.iter().filter(|r| r["bounded"] == true).count();
    let counted: u64 = recs
        .iter()
        .filter(|r| r["event"] == "refusals_summarized")
        .map(|r| r["count"].as_u64().unwrap())
        .sum();
    assert_eq!(one_by_one as u64 + counted, FLOOD as u64, "{one_by_one} + {counted}");
    assert!(one_by_one >= 2);
    assert_eq!(verify(&journal, &[]).0, Some(0));
}

#[test]
fn below_the_free_space_floor_runs_are_refused_before_the_disk_is_full_and_served_above_it() {
    if !is_root() {
        skipped("not root: a tmpfs cannot be mounted, so the free space cannot be set");
        return;
    }
    const FLOOR: u64 = 4 << 20;
    let dir = TempDir::new("floorjournal");
    let tmpfs = Tmpfs::mount(&dir, "size=16m,mode=0755");
    let fs = tmpfs.path();
    let journal = fs.join("journal");
    let d = Daemon::start_with(DaemonOptions {
        config: format!("[journal]\nmin_free_bytes = {FLOOR}\n"),
        env: vec![("PALISADE_JOURNAL".into(), journal.to_string_lossy().into_owned())],
        ..Default::default()
    });
    let ws = TempDir::new("ws");
    // Counter-test: above the floor, runs are served.
    let mut client = Client::connect(&d.socket).unwrap();
    let served = client.run(request(ws.path(), &["echo", "above"]), |_| {}).unwrap();
    assert_receipts(&[served], &journal_records(&journal));
    // Below it (half of it free), with the disk far from full: refused, naming the floor.
    let free = || {
        let s = nix::sys::statvfs::statvfs(fs).unwrap();
        s.blocks_available() as u64 * s.fragment_size() as u64
    };
    let filler = fs.join("filler");
    std::fs::write(&filler, vec![0u8; (free() - FLOOR / 2) as usize]).unwrap();
    assert!(free() < FLOOR && free() > FLOOR / 4, "{} bytes free", free());
    for i in 0..3 {
        match client.run(request(ws.path(), &["echo", &i.to_string()]), |_| {}) {
            Err(ClientError::Reply(e)) => {
                assert_eq!(e.kind, ErrorKind::JournalUnavailable, "{}", e.message);
                assert_eq!(e.rule.as_deref(), Some("journal.min_free_bytes"));
                assert!(e.message.contains(&format!("floor of {FLOOR} bytes")), "{}", e.message);
            }
            other => panic!("a run below the floor: {other:?}"),
        }
    }
    // A refusal too is not written below it.
    let refused = client.run(oversized(ws.path(), 0), |_| {});
    assert!(
        matches!(refused, Err(ClientError::Reply(ref e)) if e.kind == ErrorKind::JournalUnavailable),
        "{refused:?}"
    );
    let o = d.run(ws.path(), &[&probe(), "echo", "x"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains("min_free_bytes"), "{o:?}");
    assert!(d.log().contains("below the journal's floor"), "{}", d.log());
    let (code, out) = verify(&journal, &[]);
    assert_eq!(code, Some(0), "{out}");
    // Space back: served again.
    std::fs::remove_file(&filler).unwrap();
    let after = client.run(request(ws.path(), &["echo", "back"]), |_| {}).unwrap();
    assert_receipts(&[after], &journal_records(&journal));
    assert_eq!(verify(&journal, &[]).0, Some(0));
    drop(d);
}

/// The heads a daemon's log gives: `journal head SEQ HASH (WHY)`.
fn logged_heads(log: &str) -> Vec<(u64, String, String)> {
    log.lines()
        .filter_map(|l| {
            let rest = &l[l.find("journal head ")? + "journal head ".len()..];
            let mut words = rest.splitn(3, ' ');
            let seq = words.next()?.parse().ok()?;
            let hash = words.next()?.to_string();
            Some((seq, hash, words.next()?.to_string()))
        })
        .collect()
}

#[test]
fn the_head_is_logged_at_each_segment_close_and_at_shutdown_and_a_journal_cut_before_it_fails() {
    let mut d = Daemon::start("[journal]\nsegment_bytes = 4096\n");
    let ws = TempDir::new("ws");
    runs(&d, ws.path(), 8, 1);
    d.stop();
    let journal = d.journal();
    let recs = journal_records(&journal);
    let heads = logged_heads(&d.log());
    let closes: Vec<&(u64, String, String)> = heads.iter().filter(|h| h.2.ends_with("closed)")).collect();
    // Every segment but the newest was closed, and its last record logged as it was.
    let all = journal_segments(&journal);
    assert_eq!(closes.len(), all.len() - 1, "{heads:?}");
    for ((seq, hash, why), segment) in closes.iter().map(|h| (h.0, &h.1, &h.2)).zip(&all) {
        let last: Value = serde_json::from_str(
            String::from_utf8(segment_content(segment)).unwrap().lines().last().unwrap(),
        )
        .unwrap();
        assert_eq!((last["seq"].as_u64(), last["hash"].as_str()), (Some(seq), Some(hash.as_str())));
        assert!(why.contains(&*segment.file_name().unwrap().to_string_lossy()), "{why}");
    }
    let (seq, hash, why) = heads.last().unwrap().clone();
    assert_eq!(why, "(the broker stops)");
    let end = recs.last().unwrap();
    assert_eq!(
        (end["event"].as_str(), end["seq"].as_u64(), end["hash"].as_str()),
        (Some("broker_stopped"), Some(seq), Some(hash.as_str()))
    );
    // Counter-test: the untouched journal holds every head the log gave.
    for (_, h, _) in &heads {
        let (code, out) = verify(&journal, &["--head", h]);
        assert_eq!(code, Some(0), "{out}");
    }
    // Cut back before the last logged head (its last segment gone, and a
    // record of the one before): the chain left is whole, the head is not in it.
    let dir = TempDir::new("cut");
    let cut = dir.join("journal");
    std::fs::create_dir(&cut).unwrap();
    for s in &all[..all.len() - 1] {
        std::fs::copy(s, cut.join(s.file_name().unwrap())).unwrap();
    }
    let before_last = cut.join(all[all.len() - 2].file_name().unwrap());
    let text = String::from_utf8(segment_content(&before_last)).unwrap();
    let kept: Vec<&str> = text.lines().collect();
    std::fs::write(&before_last, kept[..kept.len() - 1].iter().map(|l| format!("{l}\n")).collect::<String>())
        .unwrap();
    assert_eq!(verify(&cut, &[]).0, Some(0));
    let (code, out) = verify(&cut, &["--head", &hash]);
    assert_eq!(code, Some(EXIT_HEAD_MISSING), "{out}");
    assert!(out.contains(&format!("the kept head {hash} is not in the journal")), "{out}");
    let (code, json) = verify(&cut, &["--head", &hash, "--json"]);
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!((code, v["head_missing"]["head"].as_str()), (Some(EXIT_HEAD_MISSING), Some(hash.as_str())));
    // The head logged when that segment closed, cut too, is missing as well.
    let closed = &closes[closes.len() - 2..];
    assert_eq!(verify(&cut, &["--head", &closed[1].1]).0, Some(EXIT_HEAD_MISSING));
    assert_eq!(verify(&cut, &["--head", &closed[0].1]).0, Some(0));
}

/// docs/journal.md: the longest line of any record.
const MAX_RECORD_BYTES: usize = 1 << 20;

#[test]
fn a_runs_record_keeps_its_argv_and_none_is_longer_than_the_documented_bound() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    let mut client = Client::connect(&d.socket).unwrap();
    // Within the default limits (128 arguments of 4096 bytes): a run's argv is recorded whole.
    let mut plain = request(ws.path(), &["exit", "0"]);
    plain.argv.extend(std::iter::repeat_n("a".repeat(4096), 8));
    let whole = client.run(plain.clone(), |_| {}).unwrap();
    // The same limits, each byte one that JSON writes in six: the record would be 3 MB.
    let mut escaped = request(ws.path(), &["exit", "0"]);
    escaped.argv.extend(std::iter::repeat_n("\u{1}".repeat(4096), 126));
    let clipped = client.run(escaped.clone(), |_| {}).unwrap();
    let recs = journal_records(&d.journal());
    let received =
        |run: u64| recs.iter().find(|r| r["event"] == "request_received" && r["run_id"] == run).unwrap();
    assert_eq!(received(whole.run_id)["argv"], serde_json::json!(plain.argv));
    let r = received(clipped.run_id);
    assert!(line_len(r) <= MAX_RECORD_BYTES, "{}", line_len(r));
    assert!(r["clipped"]["bytes"].as_u64().unwrap() > 3 * MAX_RECORD_BYTES as u64 / 2, "{}", r["clipped"]);
    assert_eq!(r["argv"][1], "exit");
    // Both ran, and every record is within the bound.
    assert_receipts(&[whole, clipped], &recs);
    assert!(recs.iter().all(|r| line_len(r) <= MAX_RECORD_BYTES));
    assert_eq!(verify(&d.journal(), &[]).0, Some(0));
}
