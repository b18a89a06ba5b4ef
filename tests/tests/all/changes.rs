//! A run's writes as a change set: a path someone else changed on the host
//! during the run is a conflict (the host's version kept, the run's held),
//! the writes of a run palisade ended are held rather than lost, a change
//! set is reviewed (a diff), applied or discarded by its requester only,
//! an apply that stopped part-way is finished by `changes apply`, and every
//! kind of entry is applied exactly. As root the file runs again as the
//! unprivileged test user.

use palisade_policy::denial::names_a_fix_or_why_none;
use palisade_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

struct Setup {
    _dir: TempDir,
    ws: PathBuf,
    policy: PathBuf,
    journal: PathBuf,
}

impl Setup {
    fn new(tag: &str, extra: &str) -> Setup {
        let dir = TempDir::new(tag);
        let ws = shared_workspace(&dir, "ws");
        let policy = dir.join("policy.toml");
        let changes = dir.join("changes");
        let (defaults, rest) =
            extra.split_once("\n[").map_or((extra, String::new()), |(d, r)| (d, format!("[{r}")));
        std::fs::write(&policy, format!("{}{defaults}\n[changes]\ndir = {changes:?}\n{rest}", base_config()))
            .unwrap();
        let journal = dir.join("journal");
        Setup { _dir: dir, ws, policy, journal }
    }

    fn palisade(&self, args: &[&str]) -> Output {
        Command::new(bin("palisade"))
            .args(args)
            .current_dir(&self.ws)
            .env("PALISADE_JOURNAL", &self.journal)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `palisade run --json --policy P [pre] -- probe ops ...`: the result.
    fn run(&self, pre: &[&str], ops: &[&str]) -> (Value, Output) {
        let policy = self.policy.to_str().unwrap();
        let probe = probe();
        let mut args = vec!["run", "--json", "--policy", policy];
        args.extend(pre);
        args.extend(["--", &probe, "ops"]);
        args.extend(ops);
        let o = self.palisade(&args);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", said(&o)));
        (v, o)
    }

    /// `palisade changes ARGS --policy P --json`: the reply.
    fn changes(&self, args: &[&str]) -> (Value, Output) {
        let mut all = vec!["changes"];
        all.extend(args);
        all.extend(["--policy", self.policy.to_str().unwrap(), "--json"]);
        let o = self.palisade(&all);
        let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        (v, o)
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.ws.join(rel)).unwrap_or_else(|e| format!("<{e}>"))
    }

    /// The journal's `changes` records.
    fn records(&self) -> Vec<Value> {
        let o = Command::new(bin("palisade"))
            .args(["audit", "tail", "-n", "100", "--json"])
            .env("PALISADE_JOURNAL", &self.journal)
            .output()
            .unwrap();
        text(&o.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["event"] == "changes")
            .collect()
    }
}

fn changes(v: &Value) -> &Value {
    &v["result"]["changes"]
}

#[test]
fn a_host_edit_during_a_run_is_kept_and_the_runs_version_is_held_for_review() {
    let s = Setup::new("changes-conflict", "");
    std::fs::write(s.ws.join("shared.txt"), "original\n").unwrap();
    let (policy, probe, ws) = (s.policy.clone(), probe(), s.ws.clone());
    let journal = s.journal.clone();
    let run = std::thread::spawn(move || {
        Command::new(bin("palisade"))
            .args(["run", "--json", "--policy", policy.to_str().unwrap(), "--", &probe, "ops"])
            .args(["put", "shared.txt", "from-run\n", "put", "other.txt", "the run's\n", "sleep", "3"])
            .current_dir(&ws)
            .env("PALISADE_JOURNAL", journal)
            .output()
            .unwrap()
    });
    // A person edits the file while the run is under way.
    std::thread::sleep(std::time::Duration::from_secs(1));
    std::fs::write(s.ws.join("shared.txt"), "host-edit\n").unwrap();
    let o = run.join().unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", said(&o)));
    let c = changes(&v);
    // The host's edit stands; the rest of the run's writes are applied, and
    // the run says loudly that not all of them were.
    assert_eq!(s.read("shared.txt"), "host-edit\n", "{v}");
    assert_eq!(s.read("other.txt"), "the run's\n");
    assert_eq!(
        (c["outcome"].as_str(), c["files"].as_u64(), c["held"].as_u64()),
        (Some("partial"), Some(1), Some(1)),
        "{v}"
    );
    assert_eq!(o.status.code(), Some(123), "{}", said(&o));
    assert_eq!(v["result"]["status"]["exited"]["code"], 0, "the command's own status stays in the result");
    assert_eq!(c["conflicts"][0], s.ws.join("shared.txt").display().to_string(), "{v}");
    let id = c["id"].as_str().unwrap().to_string();
    // The run's version is in the change set, and shown as a diff.
    let (shown, o) = s.changes(&["show", &id]);
    assert!(o.status.success(), "{}", said(&o));
    let diff = shown["diff"].as_str().unwrap();
    assert!(diff.contains("-host-edit") && diff.contains("+from-run"), "{diff}");
    assert_eq!(shown["entries"][0]["conflict"], true, "{shown}");
    // Applying it keeps the host's version still, unless told to overwrite.
    let (applied, _) = s.changes(&["apply", &id]);
    assert_eq!(s.read("shared.txt"), "host-edit\n", "{applied}");
    assert_eq!(applied["id"], id.as_str(), "still held: {applied}");
    let (applied, o) = s.changes(&["apply", &id, "--overwrite"]);
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(s.read("shared.txt"), "from-run\n", "{applied}");
    assert_eq!(s.changes(&["list"]).0, Value::Array(vec![]));
    // The journal says which run wrote which file, and what conflicted.
    let records = s.records();
    let first = records.iter().find(|r| r["outcome"] == "held").unwrap();
    assert_eq!(
        (first["run_id"].clone(), first["id"].as_str()),
        (v["result"]["run_id"].clone(), Some(id.as_str()))
    );
    assert!(first["conflicts"][0].as_str().unwrap().ends_with("shared.txt"), "{first}");
    let applied: Vec<&Value> = records.iter().filter(|r| r["outcome"] == "applied").collect();
    assert!(
        applied[0]["paths"].as_array().unwrap().iter().any(|p| p.as_str().unwrap().ends_with("other.txt"))
    );
    assert_eq!(applied[0]["sha256"].as_str().map(str::len), Some(64));
    // Which run wrote other.txt: its records, from the file's name.
    let other = s.ws.join("other.txt");
    let o = Command::new(bin("palisade"))
        .args(["audit", "show", "--json", "--path", other.to_str().unwrap()])
        .env("PALISADE_JOURNAL", &s.journal)
        .output()
        .unwrap();
    let events: Vec<Value> = text(&o.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert!(events.iter().any(|r| r["event"] == "run_finished"), "{}", said(&o));
    assert!(events.iter().all(|r| r["run_id"] == v["result"]["run_id"]), "{}", said(&o));
    let o = Command::new(bin("palisade"))
        .args(["audit", "show", "--path", s.ws.join("never-written").to_str().unwrap()])
        .env("PALISADE_JOURNAL", &s.journal)
        .output()
        .unwrap();
    assert!(!o.status.success() && text(&o.stderr).contains("no record"), "{}", said(&o));
}

#[test]
fn without_a_conflict_the_writes_are_applied_as_before() {
    let s = Setup::new("changes-plain", "");
    std::fs::write(s.ws.join("shared.txt"), "original\n").unwrap();
    let (v, o) = s.run(&[], &["put", "shared.txt", "from-run\n"]);
    assert!(o.status.success() && text(&o.stderr).is_empty(), "{}", said(&o));
    assert_eq!(s.read("shared.txt"), "from-run\n");
    let c = changes(&v);
    assert_eq!(
        (c["outcome"].as_str(), c["files"].as_u64(), c["id"].is_null()),
        (Some("applied"), Some(1), true)
    );
    assert!(c["conflicts"].as_array().unwrap().is_empty());
}

#[test]
fn a_timed_out_run_holds_its_writes_and_they_are_applied_later() {
    let s = Setup::new("changes-timeout", "");
    let (v, o) = s.run(&["--timeout", "2"], &["put", "built.txt", "half a build\n", "sleep", "30"]);
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    assert!(text(&o.stderr).is_empty(), "--json says it all: {}", said(&o));
    let c = changes(&v);
    assert_eq!(c["outcome"], "held", "{v}");
    assert!(c["reason"].as_str().unwrap().contains("deadline (max_execution_time)"), "{v}");
    assert!(!s.ws.join("built.txt").exists());
    let id = c["id"].as_str().unwrap();
    let (listed, _) = s.changes(&["list"]);
    assert_eq!(listed[0]["id"], id, "{listed}");
    let (applied, o) = s.changes(&["apply", id]);
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(applied["files"], 1, "{applied}");
    assert_eq!(s.read("built.txt"), "half a build\n");
    // Counter-test: with keep_changes = "discard_when_ended", they are not
    // kept, and the result says so.
    let s = Setup::new("changes-discard", "keep_changes = \"discard_when_ended\"\n");
    let (v, _) = s.run(&["--timeout", "2"], &["put", "built.txt", "x", "sleep", "30"]);
    assert_eq!(changes(&v)["outcome"], "discarded", "{v}");
    assert!(!s.ws.join("built.txt").exists());
    assert_eq!(s.changes(&["list"]).0, Value::Array(vec![]));
}

#[test]
fn hold_changes_shows_a_diff_and_is_applied_or_discarded() {
    let s = Setup::new("changes-hold", "");
    std::fs::write(s.ws.join("notes.txt"), "one\ntwo\nthree\n").unwrap();
    let (v, o) =
        s.run(&["--hold-changes"], &["put", "notes.txt", "one\n2\nthree\n", "put", "new.txt", "new\n"]);
    assert!(text(&o.stderr).is_empty(), "{}", said(&o));
    assert_eq!(o.status.code(), Some(123), "held, not applied: never as if applied");
    let id = changes(&v)["id"].as_str().unwrap().to_string();
    assert_eq!(s.read("notes.txt"), "one\ntwo\nthree\n");
    let (shown, _) = s.changes(&["show", &id]);
    let diff = shown["diff"].as_str().unwrap();
    assert!(diff.contains("-two\n+2\n") && diff.contains("+new"), "{diff}");
    s.changes(&["apply", &id]);
    assert_eq!((s.read("notes.txt"), s.read("new.txt")), ("one\n2\nthree\n".into(), "new\n".into()));
    // The CLI says one line of a held change set.
    let probe = probe();
    let policy = s.policy.to_str().unwrap();
    let o = s.palisade(&[
        "run",
        "--hold-changes",
        "--policy",
        policy,
        "--",
        &probe,
        "ops",
        "put",
        "notes.txt",
        "dropped\n",
    ]);
    let said_ = text(&o.stderr);
    let lines: Vec<&str> = said_.lines().collect();
    assert!(lines[0].starts_with("palisade: changes held as ") && lines.len() == 2, "{said_}");
    assert_eq!(
        lines[1],
        "palisade: the command exited with 0; palisade exits 123 as its writes did not all land"
    );
    assert_eq!(o.status.code(), Some(123));
    let id = lines[0].split_whitespace().nth(4).unwrap().to_string();
    let (discarded, _) = s.changes(&["discard", &id]);
    assert_eq!(discarded["id"], id.as_str(), "{discarded}");
    assert_eq!(s.read("notes.txt"), "one\n2\nthree\n");
    let (v, o) = s.changes(&["show", &id]);
    assert_eq!((o.status.code(), v["error"]["kind"].as_str()), (Some(125), Some("InvalidRequest")), "{v}");
}

/// Every embedded `palisade run` is a broker of its own, whose run ids
/// start at 1: a held change set names the broker that ran it too, as the
/// journal's records do, so two runs' change sets name two runs.
#[test]
fn each_embedded_runs_change_set_names_its_own_run() {
    let s = Setup::new("changes-runs", "");
    let (first, _) = s.run(&["--hold-changes"], &["put", "a.txt", "a\n"]);
    let (second, _) = s.run(&["--hold-changes"], &["put", "b.txt", "b\n"]);
    let ids = [&changes(&first)["id"], &changes(&second)["id"]];
    let (list, o) = s.changes(&["list"]);
    let sets = list.as_array().unwrap_or_else(|| panic!("{}", said(&o)));
    let runs: Vec<(&Value, &Value)> = ids
        .iter()
        .map(|id| sets.iter().find(|c| c["id"] == **id).unwrap_or_else(|| panic!("{id}: {list}")))
        .map(|c| (&c["run_id"], &c["broker"]))
        .collect();
    assert!(runs.iter().all(|(_, b)| b.as_str().is_some_and(|b| !b.is_empty())), "{list}");
    assert_ne!(runs[0], runs[1], "two runs' change sets name one run: {list}");
    let listed = s.palisade(&["changes", "list", "--policy", s.policy.to_str().unwrap()]);
    let records = s.records();
    for (id, (run_id, broker)) in ids.iter().zip(&runs) {
        // The journal's record of what became of its writes names the same run.
        let recorded =
            records.iter().find(|r| r["id"] == **id).unwrap_or_else(|| panic!("{id}: {records:?}"));
        assert_eq!((&recorded["run_id"], &recorded["broker"]), (*run_id, *broker), "{recorded}");
        let line =
            format!("{} run {run_id} (broker {}) held", id.as_str().unwrap(), broker.as_str().unwrap());
        assert!(text(&listed.stdout).contains(&line), "{line}: {}", said(&listed));
    }
}

/// A held change set's workspace replaced by a symlink (to the same files,
/// moved) is not followed when applied: refused, saying so, nothing
/// written; put back, the change set applies.
#[test]
fn a_workspace_swapped_for_a_symlink_is_not_followed_when_applied() {
    let s = Setup::new("changes-swapped", "");
    std::fs::write(s.ws.join("notes.txt"), "before\n").unwrap();
    let (v, o) = s.run(&["--hold-changes"], &["put", "notes.txt", "after\n"]);
    let id = changes(&v)["id"].as_str().unwrap_or_else(|| panic!("{}", said(&o))).to_string();
    let moved = s.ws.with_file_name("ws-moved");
    std::fs::rename(&s.ws, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &s.ws).unwrap();
    let (v, o) = s.changes(&["apply", &id]);
    assert_eq!(v["error"]["rule"], "scope.changed", "{}", said(&o));
    names_a_fix_or_why_none("scope.changed", v["error"]["message"].as_str().unwrap()).unwrap();
    assert_eq!(std::fs::read_to_string(moved.join("notes.txt")).unwrap(), "before\n");
    std::fs::remove_file(&s.ws).unwrap();
    std::fs::rename(&moved, &s.ws).unwrap();
    let (_, o) = s.changes(&["apply", &id]);
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(s.read("notes.txt"), "after\n");
}

#[test]
fn on_conflict_hold_applies_nothing_and_overwrite_applies_everything() {
    for (choice, expected_shared, expected_other) in
        [("hold", "host-edit\n", "<"), ("overwrite", "from-run\n", "the run's\n")]
    {
        let s = Setup::new("changes-on-conflict", "");
        std::fs::write(s.ws.join("shared.txt"), "original\n").unwrap();
        let (policy, probe, ws, journal) = (s.policy.clone(), probe(), s.ws.clone(), s.journal.clone());
        let run = std::thread::spawn(move || {
            Command::new(bin("palisade"))
                .args(["run", "--json", "--on-conflict", choice, "--policy", policy.to_str().unwrap(), "--"])
                .args([
                    &probe,
                    "ops",
                    "put",
                    "shared.txt",
                    "from-run\n",
                    "put",
                    "other.txt",
                    "the run's\n",
                    "sleep",
                    "3",
                ])
                .current_dir(&ws)
                .env("PALISADE_JOURNAL", journal)
                .output()
                .unwrap()
        });
        std::thread::sleep(std::time::Duration::from_secs(1));
        std::fs::write(s.ws.join("shared.txt"), "host-edit\n").unwrap();
        let o = run.join().unwrap();
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", said(&o)));
        assert_eq!(s.read("shared.txt"), expected_shared, "{choice}: {v}");
        assert!(s.read("other.txt").starts_with(expected_other), "{choice}: {v}");
        let outcome = if choice == "hold" { "held" } else { "applied" };
        assert_eq!(changes(&v)["outcome"], outcome, "{v}");
    }
}

#[test]
fn every_kind_of_entry_is_applied_exactly() {
    use std::os::unix::fs::PermissionsExt;
    let s = Setup::new("changes-kinds", "");
    let ws = &s.ws;
    std::fs::write(ws.join("gone.txt"), "x").unwrap();
    std::fs::write(ws.join("old-name.txt"), "moved\n").unwrap();
    std::fs::write(ws.join("script.sh"), "#!/bin/sh\n").unwrap();
    std::fs::create_dir_all(ws.join("tree/deep")).unwrap();
    std::fs::write(ws.join("tree/deep/f"), "f").unwrap();
    std::fs::create_dir_all(ws.join("replaced")).unwrap();
    std::fs::write(ws.join("replaced/stale"), "stale").unwrap();
    let (v, o) = s.run(
        &["--hold-changes"],
        &[
            "rm",
            "gone.txt",
            "mv",
            "old-name.txt",
            "new-name.txt",
            "chmod",
            "755",
            "script.sh",
            "ln",
            "new-name.txt",
            "link",
            "rm",
            "tree",
            "mkdir",
            "made/a/b",
            "put",
            "made/a/b/c.txt",
            "c\n",
            "rm",
            "replaced",
            "mkdir",
            "replaced",
            "put",
            "replaced/fresh",
            "fresh",
            "chmod",
            "4755",
            "made/a/b/c.txt",
        ],
    );
    assert_eq!(o.status.code(), Some(123), "held: {}", said(&o));
    let id = changes(&v)["id"].as_str().unwrap().to_string();
    // A stop part-way: the broker dies after three entries are applied.
    let o = Command::new(bin("palisade"))
        .args(["changes", "apply", &id, "--policy", s.policy.to_str().unwrap()])
        .current_dir(ws)
        .env("PALISADE_JOURNAL", &s.journal)
        .env("PALISADE_FAULT_APPLY", "3")
        .output()
        .unwrap();
    assert_eq!(o.status.signal_or_code(), Err(9), "{}", said(&o));
    let (listed, _) = s.changes(&["list"]);
    assert_eq!(
        (listed[0]["id"].as_str(), listed[0]["status"].as_str()),
        (Some(id.as_str()), Some("partly_applied")),
        "{listed}"
    );
    // Applied again: finished.
    let (applied, o) = s.changes(&["apply", &id]);
    assert!(o.status.success(), "{}", said(&o));
    assert!(applied["id"].is_null(), "nothing left held: {applied}");
    assert!(!ws.join("gone.txt").exists() && !ws.join("old-name.txt").exists());
    assert_eq!(s.read("new-name.txt"), "moved\n");
    let mode = |p: &str| std::fs::symlink_metadata(ws.join(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("script.sh"), 0o755);
    assert_eq!(std::fs::read_link(ws.join("link")).unwrap(), Path::new("new-name.txt"));
    assert!(!ws.join("tree").exists());
    assert_eq!(s.read("made/a/b/c.txt"), "c\n");
    assert_eq!(mode("made/a/b/c.txt"), 0o755, "never setuid");
    assert!(!ws.join("replaced/stale").exists(), "the run's directory replaces the host's whole");
    assert_eq!(s.read("replaced/fresh"), "fresh");
    assert!(s.changes(&["list"]).0.as_array().unwrap().is_empty());
}

/// An exit status, or the signal that ended the process.
trait Ended {
    fn signal_or_code(&self) -> Result<i32, i32>;
}

impl Ended for std::process::ExitStatus {
    fn signal_or_code(&self) -> Result<i32, i32> {
        use std::os::unix::process::ExitStatusExt;
        match self.signal() {
            Some(s) => Err(s),
            None => Ok(self.code().unwrap_or(-1)),
        }
    }
}

#[test]
fn direct_writes_in_place_only_where_the_policy_allows() {
    // Through a daemon whose profile does not allow it: refused, naming the key.
    let d = Daemon::start("[broker]\nowner_widens = false\n");
    let dir = TempDir::new("changes-direct");
    let ws = shared_workspace(&dir, "ws");
    let socket = d.socket.to_str().unwrap();
    let o = palisade_cli(
        &ws,
        &["run", "--socket", socket, "--direct"],
        &[&probe(), "ops", "put", "x", "y"],
        None,
    );
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    assert!(text(&o.stderr).contains("allow_direct"), "{}", said(&o));
    // Allowed: the run writes in place, and the result says so.
    let s = Setup::new("changes-direct-ok", "allow_direct = true\n");
    let (v, o) = s.run(&["--direct"], &["put", "live.txt", "live\n"]);
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(changes(&v)["outcome"], "in_place", "{v}");
    assert_eq!(s.read("live.txt"), "live\n");
}

#[test]
fn a_change_set_is_its_requesters_alone() {
    let Some(users) = system_users() else {
        skipped("not root: a root broker serving two users cannot be started");
        return;
    };
    let (victim, attacker) = (&users.victim, &users.attacker);
    let changes_dir = TempDir::new("changes-store");
    let config = format!(
        "[broker]\nallowed_uids = [{}, {}]\nsocket_mode = 0o666\n[changes]\ndir = {:?}\n",
        victim.uid,
        attacker.uid,
        changes_dir.path()
    );
    let d = Daemon::start(&config);
    let dir = TempDir::new("changes-owner");
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let ws = dir.join("victim-ws");
    owned_dir(&ws, victim, 0o700);
    owned_file(&ws.join("notes.txt"), victim, 0o600, "mine\n");
    let socket = d.socket.to_str().unwrap();
    let as_user = |user: &nix::unistd::User, args: &[&str]| {
        let mut argv = palisade_tests::as_user(user);
        argv.push(bin("palisade").to_string_lossy().into_owned());
        argv.extend(args.iter().map(|a| a.to_string()));
        Command::new(&argv[0]).args(&argv[1..]).current_dir("/").output().unwrap()
    };
    let o = Command::new("setpriv")
        .args(palisade_tests::as_user(victim)[1..].iter())
        .arg(bin("palisade"))
        .args([
            "run",
            "--json",
            "--hold-changes",
            "--socket",
            socket,
            "--",
            &probe(),
            "ops",
            "put",
            "notes.txt",
            "changed\n",
        ])
        .current_dir(&ws)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", said(&o)));
    let id = changes(&v)["id"].as_str().unwrap().to_string();
    // The attacker lists none, and cannot show, apply or discard it.
    let o = as_user(attacker, &["changes", "list", "--socket", socket, "--json"]);
    assert_eq!(text(&o.stdout).trim(), "[]", "{}", said(&o));
    for verb in ["show", "apply", "discard"] {
        let o = as_user(attacker, &["changes", verb, &id, "--socket", socket]);
        assert_eq!(o.status.code(), Some(125), "{verb}: {}", said(&o));
        assert!(text(&o.stderr).contains("holds no change set"), "{verb}: {}", said(&o));
    }
    let o = as_user(attacker, &["changes", "show", &id, "--socket", socket, "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", said(&o)));
    assert_eq!(v["error"]["rule"], "changes.unknown", "{v}");
    names_a_fix_or_why_none("changes.unknown", v["error"]["message"].as_str().unwrap()).unwrap();
    // Files the host executes take an approver, which the attacker is not
    // (asked at a terminal, the person said yes).
    let mut argv = palisade_tests::as_user(attacker);
    argv.push(bin("palisade").to_string_lossy().into_owned());
    let apply = ["changes", "apply", &id, "--host-executed", "--socket", socket, "--json"];
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).args(apply).current_dir("/").stdout(Stdio::piped());
    let (child, mut terminal, _) = spawn_at_terminal(cmd);
    std::io::Write::write_all(&mut terminal, b"y\n").unwrap();
    let o = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", said(&o)));
    assert_eq!(v["error"]["rule"], "changes.host_executed", "{v}");
    names_a_fix_or_why_none("changes.host_executed", v["error"]["message"].as_str().unwrap()).unwrap();
    assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "mine\n");
    // Counter-test: its requester applies it, as itself.
    let o = as_user(victim, &["changes", "apply", &id, "--socket", socket]);
    assert!(o.status.success(), "{}", said(&o));
    let notes = ws.join("notes.txt");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "changed\n");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&notes).unwrap()), victim.uid.as_raw());
}

#[test]
fn sparse_files_and_hard_links_are_carried_as_they_are() {
    use std::os::unix::fs::MetadataExt;
    // Two sparse files of 512 MiB take nothing on disk: within a 16 MiB
    // bound, counted by what they take, once per file however many names.
    let s = Setup::new("changes-sparse", "max_disk_mb = 16\n");
    std::fs::write(s.ws.join("src.txt"), "before\n").unwrap();
    let ops = [
        "sparse",
        "a",
        "536870912",
        "sparse",
        "b",
        "536870912",
        "put",
        "small.txt",
        "s",
        "link",
        "small.txt",
        "small-link",
        "put",
        "src.txt",
        "after\n",
    ];
    let (v, o) = s.run(&[], &ops);
    assert!(o.status.success(), "{}", said(&o));
    let c = changes(&v);
    assert_eq!((c["outcome"].as_str(), c["files"].as_u64()), (Some("applied"), Some(5)), "{v}");
    let meta = |p: &str| std::fs::symlink_metadata(s.ws.join(p)).unwrap();
    for sparse in ["a", "b"] {
        assert_eq!(meta(sparse).len(), 512 << 20);
        assert!(meta(sparse).blocks() * 512 < 1 << 20, "{sparse}'s holes are kept");
    }
    assert_eq!(meta("small.txt").ino(), meta("small-link").ino(), "a hard-link pair stays one file");
    assert_eq!(meta("small.txt").nlink(), 2);
    assert_eq!(s.read("src.txt"), "after\n");
    // Counter-test: made on the host, the same sparse file takes its holes too.
    let outside = s.ws.join("host-sparse");
    std::fs::File::create(&outside).unwrap().set_len(512 << 20).unwrap();
    assert!(meta("host-sparse").blocks() * 512 < 1 << 20);
}

#[test]
fn a_directory_removed_by_a_held_run_and_edited_since_is_a_conflict_when_applied() {
    let s = Setup::new("changes-held-tree", "");
    std::fs::create_dir_all(s.ws.join("src/a")).unwrap();
    std::fs::write(s.ws.join("src/a/b.rs"), "original\n").unwrap();
    let (v, _) = s.run(&["--hold-changes"], &["rm", "src"]);
    let id = changes(&v)["id"].as_str().unwrap().to_string();
    // The person edits a file deep in it (the directory's own status does not change).
    std::fs::write(s.ws.join("src/a/b.rs"), "the person's edit\n").unwrap();
    let (applied, _) = s.changes(&["apply", &id]);
    assert_eq!(s.read("src/a/b.rs"), "the person's edit\n", "{applied}");
    assert!(applied["conflicts"][0].as_str().unwrap().ends_with("/src"), "{applied}");
    // Counter-test: told to, it removes the tree.
    s.changes(&["apply", &id, "--overwrite"]);
    assert!(!s.ws.join("src").exists());
}

#[test]
fn a_mount_inside_the_workspace_is_never_touched_by_a_copy_back() {
    if !is_root() {
        skipped("not root: a filesystem cannot be mounted inside the workspace");
        return;
    }
    let s = Setup::new("changes-mount", "");
    let nas = s.ws.join("nas");
    std::fs::create_dir(&nas).unwrap();
    let _mounted = Tmpfs::mount_at(&nas, "size=1m");
    std::fs::write(nas.join("precious"), "on another filesystem").unwrap();
    std::fs::write(s.ws.join("plain.txt"), "x").unwrap();
    // The overlay shows an empty nas/: the run removes it and writes into it.
    let (v, o) = s.run(&[], &["rm", "nas", "mkdir", "nas", "put", "nas/new", "n", "rm", "plain.txt"]);
    assert_eq!(o.status.code(), Some(123), "not all of it landed: {}", said(&o));
    assert_eq!(std::fs::read_to_string(nas.join("precious")).unwrap(), "on another filesystem", "{v}");
    assert!(!nas.join("new").exists(), "{v}");
    assert_eq!(changes(&v)["withheld"][0]["reason"], "other_filesystem", "{v}");
    // Counter-test: the removal beside it is applied.
    assert!(!s.ws.join("plain.txt").exists());
}

#[test]
fn through_a_daemon_a_request_may_only_hold_more_never_overwrite() {
    let d = Daemon::start("[broker]\nowner_widens = false\n");
    let dir = TempDir::new("changes-asks");
    let ws = shared_workspace(&dir, "ws");
    let socket = d.socket.to_str().unwrap();
    let o = palisade_cli(
        &ws,
        &["run", "--socket", socket, "--on-conflict", "overwrite"],
        &[&probe(), "echo", "x"],
        None,
    );
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    assert!(text(&o.stderr).contains("on_conflict (--on-conflict) would widen"), "{}", said(&o));
    // Counter-tests: holding more is always allowed.
    for pre in [&["--on-conflict", "hold"][..], &["--hold-changes"][..]] {
        let mut args = vec!["run", "--socket", socket];
        args.extend(pre);
        let o = palisade_cli(&ws, &args, &[&probe(), "echo", "x"], None);
        assert!(o.status.success(), "{pre:?}: {}", said(&o));
    }
}

/// A requester past `[changes] max_sets` still has its run's writes held,
/// never dropped to keep the bound, and is told which bound it passed;
/// nothing held before is removed to make room.
#[test]
fn past_max_sets_a_runs_writes_are_held_all_the_same_and_it_is_said() {
    let s = Setup::new("changes-max-sets", "");
    let policy =
        std::fs::read_to_string(&s.policy).unwrap().replace("[changes]\n", "[changes]\nmax_sets = 1\n");
    std::fs::write(&s.policy, policy).unwrap();
    let (first, _) = s.run(&["--hold-changes"], &["put", "one.txt", "1"]);
    let first_id = changes(&first)["id"].as_str().unwrap().to_string();
    assert!(!changes(&first)["reason"].as_str().unwrap().contains("max_sets"), "{first}");
    let (second, o) = s.run(&["--hold-changes"], &["put", "two.txt", "2"]);
    assert_eq!(o.status.code(), Some(123), "{}", said(&o));
    let c = changes(&second);
    assert_eq!(c["outcome"], "held", "{second}");
    assert!(c["reason"].as_str().unwrap().contains("([changes] max_sets)"), "{second}");
    let (listed, _) = s.changes(&["list"]);
    let mut ids: Vec<&str> = listed.as_array().unwrap().iter().filter_map(|l| l["id"].as_str()).collect();
    let mut want = [first_id.as_str(), c["id"].as_str().unwrap()];
    ids.sort();
    want.sort();
    assert_eq!(ids, want, "both held: {listed}");
}

#[test]
fn the_changes_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_changes_suite_passes_as_an_unprivileged_user");
}

/// What a run names and writes reaches a person's terminal escaped: a
/// file name with an OSC 52 (clipboard) sequence, a cursor-up-and-erase
/// that would hide the line before it, and a newline that forges an entry
/// line; a diff line with a title sequence and a carriage return. `--raw`
/// keeps the bytes, `--json` the exact text.
#[test]
fn review_output_shows_a_runs_control_characters_escaped() {
    let s = Setup::new("escaped", "");
    std::fs::write(s.ws.join("notes.txt"), "before\n").unwrap();
    let evil = "x\u{1b}]52;c;aGk=\u{7}\u{1b}[1A\u{1b}[2K\nA       forged.txt";
    let (v, o) = s.run(
        &["--hold-changes"],
        &[
            "put",
            evil,
            "new\n",
            "put",
            "notes.txt",
            "after\u{1b}]0;title\u{7}\rforged\n",
            "put",
            ".claude/a\nb",
            "x",
        ],
    );
    assert_eq!(o.status.code(), Some(123), "{}", said(&o));
    let id = changes(&v)["id"].as_str().unwrap().to_string();
    // The run's own line (stderr) names the held agent file escaped.
    let policy = s.policy.to_str().unwrap();
    let o = s.palisade(&["run", "--policy", policy, "--", &probe(), "put", ".claude/c\u{1b}[2Kd", "x"]);
    let stderr = text(&o.stderr);
    assert!(!stderr.contains('\u{1b}') && stderr.contains("\\x1b[2K"), "{stderr}");
    let show = s.palisade(&["changes", "show", &id, "--policy", s.policy.to_str().unwrap()]);
    let shown = text(&show.stdout);
    assert!(show.status.success(), "{}", said(&show));
    assert!(!shown.contains('\u{1b}') && !shown.contains('\r') && !shown.contains('\u{7}'), "{shown:?}");
    assert!(shown.contains("/x\\x1b]52;c;aGk=\\x07\\x1b[1A\\x1b[2K\\nA       forged.txt\""), "{shown}");
    assert!(shown.contains("+after\\x1b]0;title\\x07\\r"), "{shown}");
    assert!(!shown.lines().any(|l| l.starts_with("A       forged.txt")), "a forged line: {shown}");
    // The raw bytes on request, and exact in JSON.
    let raw = s.palisade(&["changes", "show", &id, "--raw", "--policy", s.policy.to_str().unwrap()]);
    assert!(text(&raw.stdout).contains("after\u{1b}]0;title\u{7}\r"), "{}", said(&raw));
    let (j, _) = s.changes(&["show", &id]);
    assert!(j.to_string().contains("\\u001b]52;c;aGk="), "{j}");
    let list = s.palisade(&["changes", "list", "--policy", s.policy.to_str().unwrap()]);
    assert!(!text(&list.stdout).contains('\u{1b}'), "{}", said(&list));
}
