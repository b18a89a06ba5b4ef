//! What the broker keeps, and what the host executes, stay out of a run's
//! reach: a run started from a home directory (the default workspace is the
//! current directory) that holds the broker's state, configuration and
//! secrets sees none of it and changes none of it; a change to a file the
//! host runs (a git hook, a git setting naming a command) is withheld from
//! the copy-back. Each attempt is made from inside a real sandbox, with the
//! counter-test that shows it works where it is allowed. As root the file
//! runs again as the unprivileged test user.

use palisade_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A home directory as a per-user broker's is laid out, with the broker's
/// state in it (`~/.local/state/palisade`) and its configuration and Cedar
/// file at its top: a person running `palisade run` from `~`.
struct Home {
    dir: TempDir,
}

const SECRET: &str = "plugin-secret-5521";
const TOOL: &str = "greet";

impl Home {
    fn new(tag: &str) -> Home {
        let dir = TempDir::new(tag);
        std::fs::write(dir.join("notes.txt"), "ordinary notes").unwrap();
        let secrets = dir.join(".local/state/palisade/secrets");
        std::fs::create_dir_all(&secrets).unwrap();
        std::fs::write(secrets.join("api-token"), SECRET).unwrap();
        std::fs::write(dir.join("policy.cedar"), "permit(principal, action, resource);\n").unwrap();
        let home = Home { dir };
        let config = format!(
            "{}\n[policy]\ncedar = \"policy.cedar\"\n[tools.{TOOL}]\npreset = \"file_processor\"\n\
             allowed_executables = [{:?}]\n[tools.{TOOL}.overrides]\n\
             filesystem = [{{ read_only = {:?} }}, {{ read_only = \"${{WORKSPACE}}\" }}]\n[trust]\nenabled = true\n{}",
            base_config(),
            probe(),
            bin("probe").parent().unwrap(),
            home.locations()
        );
        std::fs::write(home.dir.join("palisade.toml"), config).unwrap();
        home
    }

    /// Root's broker keeps its state in /var/lib/palisade, which no test
    /// touches: as root the same places are named in the configuration (the
    /// broker keeps them out of reach by where they are, not by their name);
    /// as a user they are the defaults.
    fn locations(&self) -> String {
        if !is_root() {
            return String::new();
        }
        let state = self.state();
        format!(
            "state = {:?}\n[journal]\npath = {:?}\n[changes]\ndir = {:?}\n[plugins]\nskills_dir = {:?}\nsecrets_dir = {:?}\n",
            state.join("trust.json"),
            state.join("journal"),
            state.join("changes"),
            state.join("skills"),
            state.join("secrets"),
        )
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn state(&self) -> PathBuf {
        self.dir.join(".local/state/palisade")
    }

    /// `palisade ARGS` with this home as `HOME` (and the current directory),
    /// and nothing else of the caller's: the state and the journal go where
    /// a person's would.
    fn palisade(&self, args: &[&str]) -> Output {
        Command::new(bin("palisade"))
            .args(args)
            .current_dir(self.path())
            .env_clear()
            .env(SYSTEM_CONFIG_ENV, test_system_config())
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", self.path())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `palisade run --policy ~/palisade.toml [PRE] -- ARGS`.
    fn run(&self, pre: &[&str], args: &[&str]) -> Output {
        let policy = self.dir.join("palisade.toml");
        let mut argv = vec!["run", "--policy", policy.to_str().unwrap()];
        argv.extend(pre);
        argv.push("--");
        argv.extend(args);
        self.palisade(&argv)
    }
}

fn bytes_of(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every segment of a journal directory, with its contents.
fn segments(journal: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(journal)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("segment-")))
        .map(|p| {
            let b = bytes_of(&p);
            (p, b)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_run_from_home_reaches_none_of_what_the_broker_keeps() {
    let home = Home::new("home-state");
    let state = home.state();
    // The tool approved: the trust stages are on disk, beside their key.
    let o = home.palisade(&[
        "tools",
        "approve",
        TOOL,
        "--policy",
        home.dir.join("palisade.toml").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", said(&o));
    let trust = state.join("trust.json");
    let trust_before = bytes_of(&trust);
    assert!(
        String::from_utf8_lossy(&trust_before).contains("\"trial\""),
        "{}",
        String::from_utf8_lossy(&trust_before)
    );
    let journal = state.join("journal");
    let journal_before = segments(&journal);
    assert!(!journal_before.is_empty());

    let secret = state.join("secrets/api-token");
    let segment = journal_before[0].0.clone();
    let verified = String::from_utf8_lossy(&trust_before).replace("\"trial\"", "\"verified\"");
    // Each attempt from inside a sandbox whose workspace is the home.
    let attempts: Vec<Vec<String>> = vec![
        vec!["read".into(), secret.display().to_string()],
        vec!["list".into(), state.join("secrets").display().to_string()],
        vec!["put".into(), trust.display().to_string(), verified],
        vec!["truncate".into(), segment.display().to_string(), "0".into()],
        vec!["read".into(), home.dir.join("palisade.toml").display().to_string()],
        vec!["read".into(), home.dir.join("policy.cedar").display().to_string()],
    ];
    for attempt in &attempts {
        let mut args = vec![probe()];
        args.extend(attempt.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = home.run(&[], &args);
        let out = text(&o.stdout);
        assert!(
            out.starts_with("err ") || out.trim().is_empty() && attempt[0] == "list",
            "{attempt:?}: {}",
            said(&o)
        );
        assert!(!out.contains(SECRET) && !out.contains("cedar") && !out.contains("permit"), "{}", said(&o));
    }
    // Nothing of it changed: the stages, the journal's records (the runs
    // appended theirs), and the chain verifies.
    assert_eq!(bytes_of(&trust), trust_before);
    for (path, before) in &journal_before {
        // Segments are allocated ahead, zeros past the last record.
        let records = &before[..before.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1)];
        assert!(!records.is_empty());
        assert!(bytes_of(path).starts_with(records), "{} was cut or changed", path.display());
    }
    let o = home.palisade(&["audit", "verify", "--journal", journal.to_str().unwrap()]);
    assert!(o.status.success(), "{}", said(&o));

    // Counter-tests: outside, each is there to take; inside, the home's
    // ordinary files are the run's, and the hidden entries only are hidden.
    assert!(probe_outside(&["read", secret.to_str().unwrap()]).unwrap().contains(SECRET));
    assert!(
        probe_outside(&["read", home.dir.join("policy.cedar").to_str().unwrap()]).unwrap().contains("permit")
    );
    let notes = home.dir.join("notes.txt");
    let o = home.run(&[], &[&probe(), "read", notes.to_str().unwrap()]);
    assert!(text(&o.stdout).contains("ordinary notes"), "{}", said(&o));
    let o = home.run(&[], &[&probe(), "put", "made-here.txt", "kept"]);
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(bytes_of(&home.dir.join("made-here.txt")), b"kept");
}

#[test]
fn the_brokers_state_is_never_granted_nor_a_workspace_that_writes_in_place() {
    let home = Home::new("home-grants");
    // Make the state directory as a first run would.
    assert!(home.run(&[], &[&probe(), "echo", "first"]).status.success());
    let state = home.state();
    let refused = |o: &Output| {
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{}", said(o));
        assert!(err.contains("WorkspaceScopeDenied") && err.contains(state.to_str().unwrap()), "{}", said(o));
    };
    // A grant of what it keeps, or of something inside that.
    let secrets = state.join("secrets");
    refused(&home.run(&["--read-only", secrets.to_str().unwrap()], &[&probe(), "echo", "x"]));
    let journal = state.join("journal");
    refused(&home.run(&["--read-write", journal.to_str().unwrap()], &[&probe(), "echo", "x"]));
    // A workspace holding it, where the run writes in place: `disk = "direct"`.
    let direct = home.dir.join("direct.toml");
    let policy = std::fs::read_to_string(home.dir.join("palisade.toml")).unwrap();
    std::fs::write(&direct, policy.replacen("[defaults]\n", "[defaults]\ndisk = \"direct\"\n", 1)).unwrap();
    let o = home.palisade(&["run", "--policy", direct.to_str().unwrap(), "--", &probe(), "echo", "x"]);
    refused(&o);
    assert!(text(&o.stderr).contains("direct"), "{}", said(&o));
    // Counter-test: the same workspace with the overlay (the default) runs,
    // and so does the direct disk in a directory that holds none of it.
    assert!(home.run(&[], &[&probe(), "echo", "x"]).status.success());
    let elsewhere = home.dir.join("project");
    std::fs::create_dir(&elsewhere).unwrap();
    let o = Command::new(bin("palisade"))
        .args(["run", "--policy", direct.to_str().unwrap(), "--", &probe(), "put", "in-place.txt", "y"])
        .current_dir(&elsewhere)
        .env_clear()
        .env(SYSTEM_CONFIG_ENV, test_system_config())
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(bytes_of(&elsewhere.join("in-place.txt")), b"y");
}

#[test]
fn tier_b_refuses_a_workspace_that_holds_the_brokers_state() {
    let home = Home::new("home-tier-b");
    let tier_b = home.dir.join("tier-b.toml");
    let policy = std::fs::read_to_string(home.dir.join("palisade.toml")).unwrap();
    let policy = policy.replace("[policy]\n", "[policy]\nfallback = \"warn_and_execute\"\n");
    std::fs::write(&tier_b, format!("{policy}[broker]\nuser_namespaces = false\n")).unwrap();
    // In the home: refused, naming the state directory.
    let o = home.palisade(&["run", "--policy", tier_b.to_str().unwrap(), "--", &probe(), "echo", "x"]);
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    let err = text(&o.stderr);
    assert!(err.contains("WorkspaceScopeDenied") && err.contains(".local/state/palisade"), "{err}");
    // Counter-test: Tier B runs in a directory that holds none of it (one
    // the sandbox's uid can use: a root broker's Tier B runs as another).
    let project = shared_workspace(&home.dir, "project");
    let o = Command::new(bin("palisade"))
        .args(["run", "--policy", tier_b.to_str().unwrap(), "--", &probe(), "echo", "tier-b"])
        .current_dir(&project)
        .env_clear()
        .env(SYSTEM_CONFIG_ENV, test_system_config())
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert!(text(&o.stdout).contains("tier-b"), "{}", said(&o));
}

#[test]
fn a_trust_stage_the_broker_did_not_write_refuses_the_tool() {
    let home = Home::new("home-trust");
    let policy = home.dir.join("palisade.toml");
    let o = home.palisade(&["tools", "approve", TOOL, "--policy", policy.to_str().unwrap()]);
    assert!(o.status.success(), "{}", said(&o));
    std::fs::write(home.dir.join("in.txt"), "input").unwrap();
    let run_tool = || {
        home.palisade(&[
            "run",
            "--policy",
            policy.to_str().unwrap(),
            "--tool",
            TOOL,
            "--",
            &probe(),
            "read",
            "in.txt",
        ])
    };
    // Trial: the run asks for an approval (no terminal here: refused so).
    let o = run_tool();
    assert!(text(&o.stderr).contains("NeedsApproval"), "{}", said(&o));
    // Verified, written by someone else than the broker (as a run in an
    // unprotected home did): refused, with that reason.
    let trust = home.state().join("trust.json");
    let forged = std::fs::read_to_string(&trust).unwrap().replace("\"trial\"", "\"verified\"");
    std::fs::write(&trust, forged).unwrap();
    let o = run_tool();
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    let err = text(&o.stderr);
    assert!(err.contains("PolicyDenied") && err.contains("not written by this broker"), "{err}");
    // An approver approves it again: the stage is the broker's once more.
    let o = home.palisade(&["tools", "approve", TOOL, "--policy", policy.to_str().unwrap()]);
    assert!(o.status.success(), "{}", said(&o));
    let o = run_tool();
    assert!(text(&o.stderr).contains("NeedsApproval"), "{}", said(&o));
}

#[test]
fn a_per_user_daemon_keeps_its_state_out_of_a_run_from_home() {
    let home = Home::new("home-daemon");
    // Its secrets where a per-user broker's are by default, named (root's default is elsewhere).
    let secrets = home.state().join("secrets");
    let d = Daemon::start_with(DaemonOptions {
        config: format!("[plugins]\nsecrets_dir = {secrets:?}\n"),
        env: vec![("HOME".into(), home.path().display().to_string())],
        ..Default::default()
    });
    let secret = home.state().join("secrets/api-token");
    let o = d.run(home.path(), &[&probe(), "read", secret.to_str().unwrap()]);
    assert!(text(&o.stdout).starts_with("err "), "{}", said(&o));
    assert!(!text(&o.stdout).contains(SECRET));
    // The daemon's socket and its directory are the broker's too.
    let o = d.run(d.dir.path(), &[&probe(), "echo", "x"]);
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    assert!(text(&o.stderr).contains("socket directory"), "{}", said(&o));
    // Counter-test: the home's own files are the run's.
    let o = d.run(home.path(), &[&probe(), "read", "notes.txt"]);
    assert!(text(&o.stdout).contains("ordinary notes"), "{}", said(&o));
}

#[test]
fn writes_where_the_broker_keeps_its_state_are_withheld_from_the_copy_back() {
    // A home as the workspace, with no state directory yet; the trust stages
    // named in a directory that does not exist yet either.
    let dir = TempDir::new("state-to-be");
    let home = dir.join("home");
    std::fs::create_dir(&home).unwrap();
    let (_j, journal) = scratch_journal(None);
    let trust = home.join("stages/trust.json");
    // Root's state is elsewhere: its change sets are named here instead.
    let store = match is_root() {
        true => format!("[changes]\ndir = {:?}\n", home.join(".local/state/palisade/changes")),
        false => String::new(),
    };
    let policy = dir.join("policy.toml");
    let config = format!("{}[trust]\nstate = {trust:?}\n{store}", base_config());
    std::fs::write(&policy, config).unwrap();
    let run = |ops: &[&str]| {
        let o = Command::new(bin("palisade"))
            .args(["run", "--json", "--policy", policy.to_str().unwrap(), "--", &probe(), "put"])
            .args(ops)
            .current_dir(&home)
            .env_clear()
            .env(SYSTEM_CONFIG_ENV, test_system_config())
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &home)
            .env("PALISADE_JOURNAL", &journal)
            .output()
            .unwrap();
        let result: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", said(&o)));
        (o, result)
    };
    // Where the trust stages will be: written in the sandbox, withheld from the copy-back.
    let (o, result) = run(&["stages/trust.json", "{}", "stages/other.txt", "kept"]);
    assert_eq!(o.status.code(), Some(123), "not all of it landed: {}", said(&o));
    assert!(!trust.exists(), "the run made the broker's trust stages");
    let withheld = &result["result"]["changes"]["withheld"];
    assert_eq!(withheld[0]["reason"], "broker_state", "{result}");
    assert!(withheld[0]["path"].as_str().unwrap().ends_with("trust.json"), "{result}");
    // Counter-test: the file beside it is applied.
    assert_eq!(bytes_of(&home.join("stages/other.txt")), b"kept");
    // The user's own configuration (palisade init's), which the next
    // embedded broker and the user's daemon read: never made by a run.
    let (o, result) = run(&[".config/palisade/palisade.toml", "[broker]\n", ".config/other.toml", "kept"]);
    assert_eq!(o.status.code(), Some(123), "not all of it landed: {}", said(&o));
    assert!(!home.join(".config/palisade/palisade.toml").exists(), "{result}");
    assert_eq!(result["result"]["changes"]["withheld"][0]["reason"], "broker_state", "{result}");
    assert_eq!(bytes_of(&home.join(".config/other.toml")), b"kept");
    // The store of change sets (in the state directory) is made before any
    // run is decided: there from the start, it is hidden, and a run cannot
    // write there at all.
    let (_, result) = run(&[".local/state/other.txt", "kept", ".local/state/palisade/changes/x", "{}"]);
    assert!(result["stdout"].as_str().unwrap().starts_with("err "), "{result}");
    assert!(!home.join(".local/state/palisade/changes/x").exists());
    assert_eq!(bytes_of(&home.join(".local/state/other.txt")), b"kept");
}

/// A git repository made on the host, with one commit.
fn repository(dir: &TempDir) -> Option<PathBuf> {
    let repo = dir.join("repo");
    std::fs::create_dir(&repo).unwrap();
    let git = |args: &[&str]| {
        Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(&repo)
            .env("HOME", dir.path())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
    };
    let Ok(o) = git(&["init", "-q"]) else {
        skipped("git is not installed (.ci/run installs it)");
        return None;
    };
    assert!(o.status.success());
    std::fs::write(repo.join("a.txt"), "a").unwrap();
    assert!(git(&["add", "a.txt"]).unwrap().status.success());
    assert!(git(&["commit", "-q", "-m", "one"]).unwrap().status.success());
    Some(repo)
}

/// `palisade run --json -- probe put PATH TEXT...` in `dir` through the
/// embedded broker, with the journal and state beside `journal`.
fn put_as_a_run(policy: &Path, journal: &Path, dir: &Path, puts: &[String]) -> Output {
    Command::new(bin("palisade"))
        .args(["run", "--json", "--policy", policy.to_str().unwrap(), "--", &probe(), "put"])
        .args(puts)
        .current_dir(dir)
        .env("PALISADE_JOURNAL", journal)
        .env("PALISADE_STATE", state_beside(journal))
        .output()
        .unwrap()
}

/// `git commit` on the host, outside any sandbox, as the person would.
fn commit_on_host(repo: &Path, home: &Path) -> Output {
    std::fs::write(repo.join("b.txt"), format!("{:?}", std::time::SystemTime::now())).unwrap();
    let git = |args: &[&str]| {
        Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .current_dir(repo)
            .env("HOME", home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap()
    };
    git(&["add", "b.txt"]);
    git(&["commit", "-q", "-m", "next"])
}

#[test]
fn a_run_cannot_plant_a_git_hook_or_fsmonitor_that_the_host_runs_later() {
    let dir = TempDir::new("git-hooks");
    let Some(repo) = repository(&dir) else { return };
    let (_j, journal) = scratch_journal(None);
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, base_config()).unwrap();
    let config = bytes_of(&repo.join(".git/config"));
    let planted = format!("{}[core]\n\tfsmonitor = ./fsmonitor.sh\n", String::from_utf8_lossy(&config));
    let hook = "#!/bin/sh\necho ran > hook-ran.txt\n";
    let puts =
        [".git/hooks/pre-commit", hook, ".git/config", &planted, "fsmonitor.sh", hook, "notes.txt", "beside"];
    let puts: Vec<String> =
        puts.iter().chain(&[".git/commondir", "elsewhere"]).map(|p| p.to_string()).collect();
    let o = put_as_a_run(&policy, &journal, &repo, &puts);
    // Held for a person, so not all of the run's writes landed: loudly so.
    assert_eq!(o.status.code(), Some(123), "{}", said(&o));
    let result: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let withheld: Vec<String> = result["result"]["changes"]["withheld"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            assert_eq!(w["reason"], "host_executed", "{w}");
            w["path"].as_str().unwrap().to_string()
        })
        .collect();
    let expected = [".git/hooks/pre-commit", ".git/config", ".git/commondir"]
        .map(|p| repo.join(p).display().to_string());
    let mut withheld = withheld;
    withheld.sort();
    let mut expected = expected.to_vec();
    expected.sort();
    assert_eq!(withheld, expected, "{result}");
    assert!(!repo.join(".git/hooks/pre-commit").exists());
    assert!(!repo.join(".git/commondir").exists());
    assert_eq!(bytes_of(&repo.join(".git/config")), config);
    // The journal's record of the run names them.
    let shown = Command::new(bin("palisade"))
        .args(["audit", "tail", "-n", "1"])
        .env("PALISADE_JOURNAL", &journal)
        .env("PALISADE_STATE", state_beside(&journal))
        .output()
        .unwrap();
    assert!(text(&shown.stdout).contains(".git/hooks"), "{}", said(&shown));
    // The person's next commit runs nothing of the run's.
    let o = commit_on_host(&repo, dir.path());
    assert!(o.status.success(), "{}", said(&o));
    assert!(!repo.join("hook-ran.txt").exists(), "the planted hook ran on the host");
    // Counter-tests: the ordinary files beside them were applied; a change to
    // .git/config that names no command is applied too; and the hook the
    // run wrote does run on the host when a person puts it there.
    assert_eq!(bytes_of(&repo.join("notes.txt")), b"beside");
    let with_email = format!("{}[user]\n\temail = agent@example.invalid\n", String::from_utf8_lossy(&config));
    let o = Command::new(bin("palisade"))
        .args([
            "run",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            &probe(),
            "put",
            ".git/config",
            &with_email,
        ])
        .current_dir(&repo)
        .env("PALISADE_JOURNAL", &journal)
        .env("PALISADE_STATE", state_beside(&journal))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(bytes_of(&repo.join(".git/config")), with_email.as_bytes());
    write_executable(&repo.join(".git/hooks/pre-commit"), hook);
    assert!(commit_on_host(&repo, dir.path()).status.success());
    assert!(
        repo.join("hook-ran.txt").exists(),
        "a hook on the host does run: the withholding is what stopped it"
    );
}

#[test]
fn the_boundaries_hold_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_boundaries_hold_as_an_unprivileged_user");
}

/// A Tier B configuration (as on a host without user namespaces), with `policy` in its `[policy]`.
fn tier_b(policy: &str) -> String {
    format!("[policy]\nfallback = \"warn_and_execute\"\n{policy}[broker]\nuser_namespaces = false\n")
}

#[test]
fn a_temp_root_that_is_not_the_brokers_own_is_refused_and_the_default_cannot_be_squatted() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("temp-root");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ws = shared_workspace(&dir, "ws");
    let (_j, journal) = scratch_journal(None);
    let run = |config: &str, envs: &[(&str, &str)]| {
        let policy = dir.join("policy.toml");
        std::fs::write(&policy, format!("{}{config}", base_config())).unwrap();
        Command::new(bin("palisade"))
            .args(["run", "--policy", policy.to_str().unwrap(), "--", &probe(), "env"])
            .current_dir(&ws)
            .env_remove("XDG_RUNTIME_DIR")
            .env("PALISADE_JOURNAL", &journal)
            .env("PALISADE_STATE", state_beside(&journal))
            .envs(envs.iter().copied())
            .output()
            .unwrap()
    };
    // A temp_root anybody may write to (as a directory another user made
    // first would be): the broker does not start on it, and says why.
    let squatted = dir.join("squatted");
    std::fs::create_dir(&squatted).unwrap();
    std::fs::set_permissions(&squatted, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(squatted.join("planted"), "from another user").unwrap();
    let o = run(&tier_b(&format!("temp_root = {squatted:?}\n")), &[]);
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    let err = text(&o.stderr);
    assert!(err.contains("temp_root") && err.contains(squatted.to_str().unwrap()), "{err}");
    assert_eq!(std::fs::read_dir(&squatted).unwrap().count(), 1, "the broker used the squatted directory");
    // Counter-test: the broker's own directory serves Tier B's runs.
    let own = dir.join("own");
    let o = run(&tier_b(&format!("temp_root = {own:?}\n")), &[]);
    assert!(o.status.success(), "{}", said(&o));
    assert!(text(&o.stdout).contains(&format!("TMPDIR={}/run-", own.display())), "{}", said(&o));
    // Without XDG_RUNTIME_DIR, a user's default is the same for every broker
    // (/tmp/palisade-UID/runs: the next finds what a dead one left), made
    // private; where another has taken that name (a directory anybody may
    // write), a fresh one nobody could predict, which goes with the run,
    // and the taken one is not used.
    if !is_root() {
        let tmp = dir.join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        let predictable = tmp.join(format!("palisade-{}", nix::unistd::geteuid()));
        let tmpdir_of = |o: &std::process::Output| {
            let out = text(&o.stdout);
            out.lines().find_map(|l| l.strip_prefix("TMPDIR=")).unwrap_or_default().to_string()
        };
        let o = run(&tier_b(""), &[("TMPDIR", tmp.to_str().unwrap())]);
        assert!(o.status.success(), "{}", said(&o));
        assert!(tmpdir_of(&o).starts_with(&format!("{}/runs/run-", predictable.display())), "{}", said(&o));
        let mode = std::fs::metadata(&predictable).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::remove_dir_all(&predictable).unwrap();
        std::fs::create_dir(&predictable).unwrap();
        std::fs::set_permissions(&predictable, std::fs::Permissions::from_mode(0o777)).unwrap();
        let o = run(&tier_b(""), &[("TMPDIR", tmp.to_str().unwrap())]);
        assert!(o.status.success(), "{}", said(&o));
        assert!(tmpdir_of(&o).starts_with(&format!("{}-", predictable.display())), "{}", said(&o));
        assert_eq!(std::fs::read_dir(&predictable).unwrap().count(), 0, "the taken name was used");
        assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 1, "the fresh temp_root was left behind");
    }
}

#[test]
fn a_configuration_changed_while_the_daemon_runs_changes_nothing_by_itself() {
    let d = Daemon::start("");
    let dir = TempDir::new("config-change");
    let ws = shared_workspace(&dir, "ws");
    let shell = ["sh", "-c", "true"];
    let refused = |o: &Output| o.status.code() == Some(125) && text(&o.stderr).contains("interpreters");
    assert!(refused(&d.run(&ws, &shell)), "{}", said(&d.run(&ws, &shell)));
    // The file rewritten to allow interpreters and inline code: the policy
    // the daemon serves is still the one it read.
    let config = d.dir.join("palisade.toml");
    let widened = std::fs::read_to_string(&config).unwrap().replacen(
        "[defaults]\n",
        "[defaults]\nallow_interpreters = true\nallow_inline_code = true\n",
        1,
    );
    std::fs::write(&config, &widened).unwrap();
    let o = d.run(&ws, &shell);
    assert!(refused(&o), "{}", said(&o));
    // Counter-test: a broker started on the file now serves what it says.
    let mut d = d;
    d.stop();
    let again = Command::new(bin("palisaded"))
        .args(["--config", config.to_str().unwrap(), "--socket", d.socket.to_str().unwrap()])
        .env("PALISADE_JOURNAL", d.journal())
        .env("PALISADE_STATE", state_beside(d.journal()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _stop = ChildGuard(again);
    assert!(eventually(std::time::Duration::from_secs(20), || std::os::unix::net::UnixStream::connect(
        &d.socket
    )
    .is_ok()));
    let o = d.run(&ws, &shell);
    assert!(o.status.success(), "{}", said(&o));
}

/// A child killed when dropped.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The configurations other tools execute (agents' MCP servers, hook
/// runners' commands), each written by a run: held for a person, none on
/// the host, the run's exit 123; a plain file beside them applied. And a
/// repository whose `core.hooksPath` is absolute, pointing into the
/// workspace: a hook written there is held like `.git/hooks`.
#[test]
fn the_configurations_other_tools_execute_are_held_and_an_absolute_hooks_path_too() {
    let dir = TempDir::new("tool-configs");
    let (_j, journal) = scratch_journal(None);
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, base_config()).unwrap();
    let ws = dir.join("ws");
    std::fs::create_dir(&ws).unwrap();
    let git =
        |args: &[&str]| Command::new("git").args(args).current_dir(&ws).output().map(|o| o.status.success());
    if git(&["init", "-q"]).ok() != Some(true) {
        panic!("git is not installed: .ci/run installs it");
    }
    let hooks = ws.join("tools/hooks");
    assert_eq!(git(&["config", "core.hooksPath", hooks.to_str().unwrap()]).ok(), Some(true));
    let held = [
        ".roo/mcp.json",
        ".kiro/settings/mcp.json",
        ".amazonq/mcp.json",
        ".junie/mcp/mcp.json",
        "opencode.json",
        ".crush.json",
        ".aider.conf.yml",
        "lefthook.yml",
        ".lintstagedrc",
        "tools/hooks/pre-commit",
    ];
    let mut args: Vec<String> = Vec::new();
    for p in held.iter().chain(&["plain.txt"]) {
        args.push(p.to_string());
        args.push("{\"command\": \"touch /tmp/pwned\"}\n".into());
    }
    let o = put_as_a_run(&policy, &journal, &ws, &args);
    assert_eq!(o.status.code(), Some(123), "{}", said(&o));
    let result: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let withheld: Vec<String> = result["result"]["changes"]["withheld"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["reason"] == "host_executed")
        .map(|w| w["path"].as_str().unwrap().to_string())
        .collect();
    // Each is held, itself or in the new directory held whole that holds it.
    for p in held {
        assert!(withheld.iter().any(|w| ws.join(p).starts_with(w)), "{p} is not held: {result}");
    }
    assert!(!withheld.iter().any(|w| ws.join("plain.txt").starts_with(w)), "{result}");
    for p in held {
        assert!(!ws.join(p).exists(), "{p} reached the host");
    }
    assert!(ws.join("plain.txt").exists(), "the plain file is applied");
}
