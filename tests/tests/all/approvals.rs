//! Approvers and trust stages through the real binaries: a root palisaded
//! serving the unprivileged test user, whose runs of a declared tool are
//! held for approvals that an approver answers from another process
//! (`palisade approve ID`); Draft → Trial → Verified across a restart; each
//! escalation; a changed declaration back to Draft.

use palisade_policy::denial::names_a_fix_or_why_none;
use palisade_protocol::wire::{EscalationReason, PendingApproval};
use palisade_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::Duration;

/// How long a test waits for a held run to show up in `palisade approvals`.
const PENDING_WAIT: Duration = Duration::from_secs(30);

/// A root broker that the test user may use, with tool `show` (reads the
/// file its `file` parameter names; the workspace and the probe's directory
/// are its approved range) and the stages kept in `state`.
struct Setup {
    d: Daemon,
    ws: PathBuf,
    user: nix::unistd::User,
    config: String,
    _dir: TempDir,
}

/// What a test varies: `self_approval`, the approval timeout, `trial_runs`.
#[derive(Clone, Copy)]
struct Knobs {
    self_approval: bool,
    timeout_secs: u64,
    trial_runs: u32,
}

/// An approval timeout no test reaches unless it means to.
const LONG: u64 = 120;

fn tool_config(user: &nix::unistd::User, state: &Path, k: Knobs, tool_extra: &str) -> String {
    let dir = bin("probe").parent().unwrap().to_string_lossy().into_owned();
    format!(
        r#"[broker]
allowed_uids = [0, {uid}]
socket_mode = 0o666
[approvers]
uids = [0]
self_approval = {self_approval}
[policy]
approval_timeout_secs = {timeout}
[trust]
state = {state:?}
trial_runs = {trial_runs}
[tools.show]
preset = "file_processor"
allowed_executables = ["{probe}"]
{tool_extra}
[tools.show.overrides]
filesystem = [{{ read_only = "{dir}" }}, {{ read_only = "${{WORKSPACE}}" }}]
[tools.show.parameters.file]
capability = "filesystem.read_only"
validation = "is_file"
mapping = "single"
"#,
        uid = user.uid,
        probe = probe(),
        self_approval = k.self_approval,
        timeout = k.timeout_secs,
        trial_runs = k.trial_runs,
    )
}

impl Setup {
    /// `None` when not root: serving another user takes a root broker.
    fn start(knobs: Knobs) -> Option<Setup> {
        if !is_root() {
            skipped("not root: a root broker serving the test user cannot be started");
            return None;
        }
        let user = test_user();
        let dir = TempDir::new("approvals");
        let ws = shared_workspace(&dir, "w");
        std::fs::write(ws.join("in.txt"), "hello").unwrap();
        let config = tool_config(&user, &dir.join("state/trust.json"), knobs, "");
        let d = Daemon::start(&config);
        Some(Setup { d, ws, user, config, _dir: dir })
    }

    /// The same broker started again (its stages are on disk), under `config`.
    fn restart(&mut self, config: Option<String>) {
        self.d.stop();
        if let Some(c) = config {
            self.config = c;
        }
        self.d = Daemon::start(&self.config);
    }

    fn state(&self) -> PathBuf {
        self._dir.join("state/trust.json")
    }

    /// `palisade <args> --socket S`, as `user` (root when `None`).
    fn palisade(&self, args: &[&str], user: Option<&nix::unistd::User>) -> Output {
        self.command(args, user).stdout(Stdio::piped()).stderr(Stdio::piped()).output().unwrap()
    }

    /// `palisade <args>`, as root, reaching no broker (`audit` reads files).
    fn palisade_local(&self, args: &[&str]) -> Output {
        let o = std::process::Command::new(bin("palisade")).args(args).output().unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
        o
    }

    fn command(&self, args: &[&str], user: Option<&nix::unistd::User>) -> std::process::Command {
        let mut argv: Vec<String> = user.map(as_user).unwrap_or_default();
        argv.push(bin("palisade").to_string_lossy().into_owned());
        argv.extend(args.iter().map(|a| a.to_string()));
        argv.extend(["--socket".into(), self.d.socket.to_string_lossy().into_owned()]);
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]).current_dir(&self.ws).stdin(Stdio::null());
        cmd
    }

    /// The test user's run of tool `show` with `params`, reading `file`, in
    /// the background.
    fn spawn_show(&self, params: &[&str], file: &str) -> Child {
        self.show_command(Some(&self.user), params, file).spawn().unwrap()
    }

    /// `user`'s (root's when `None`) `palisade run --tool show` command.
    fn show_command(
        &self,
        user: Option<&nix::unistd::User>,
        params: &[&str],
        file: &str,
    ) -> std::process::Command {
        let socket = self.d.socket.to_string_lossy().into_owned();
        let mut args = vec!["run", "--socket", &socket, "--tool", "show"];
        for p in params {
            // A flag (`--json`) goes as it is; anything else is a parameter.
            if p.starts_with("--") {
                args.push(p);
            } else {
                args.extend(["--param", p]);
            }
        }
        let mut argv = user.map(as_user).unwrap_or_default();
        argv.push(bin("palisade").to_string_lossy().into_owned());
        argv.extend(args.iter().map(|a| a.to_string()));
        argv.extend(["--".into(), probe(), "read".into(), file.into()]);
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(&self.ws)
            .env("HOME", self.ws.join("home"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// `user`'s run of `show`, in the background, with a terminal of its own;
    /// returns once its question is at the terminal (and the prompt's text).
    fn at_terminal(&self, user: Option<&nix::unistd::User>) -> (Child, std::fs::File, String) {
        spawn_at_terminal(self.show_command(user, &["file=in.txt"], "in.txt"))
    }

    /// The test user's run of `show` on the workspace's `in.txt`, to its end.
    fn show(&self) -> Output {
        self.spawn_show(&["file=in.txt"], "in.txt").wait_with_output().unwrap()
    }

    /// The runs waiting for an approval, as root lists them.
    fn pending(&self, user: Option<&nix::unistd::User>) -> Vec<PendingApproval> {
        let o = self.palisade(&["approvals", "--json"], user);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o.stdout)))
    }

    /// The first run to be held, once it is.
    fn next_pending(&self) -> PendingApproval {
        let mut found = None;
        let held = eventually(PENDING_WAIT, || {
            found = self.pending(None).into_iter().next();
            found.is_some()
        });
        assert!(held, "no run was held for approval:\n{}", self.d.log());
        found.unwrap()
    }

    /// The tool's stage, as `palisade tools show show` prints it.
    fn stage(&self) -> String {
        let o = self.palisade(&["tools", "show", "show"], None);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        let out = text(&o.stdout);
        let first = out.lines().next().unwrap_or("").to_string();
        first.strip_prefix("tool show: ").unwrap_or(&first).split(' ').next().unwrap_or("").to_string()
    }

    /// An approver (root, in a process of its own) approves the tool.
    fn approve_tool(&self) {
        let o = self.palisade(&["tools", "approve", "show"], None);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        assert!(text(&o.stdout).starts_with("tool show: trial"), "{}", text(&o.stdout));
    }

    /// A run held, approved by root from another process, and its output.
    fn approved_run(&self) -> (PendingApproval, Output) {
        let child = self.spawn_show(&["file=in.txt"], "in.txt");
        let p = self.next_pending();
        let o = self.palisade(&["approve", &p.id.to_string()], None);
        assert_eq!((o.status.code(), text(&o.stdout)), (Some(0), format!("approval {}: approved\n", p.id)));
        (p, child.wait_with_output().unwrap())
    }
}

fn ran(o: &Output) {
    assert_eq!(
        (o.status.code(), text(&o.stdout).as_str()),
        (Some(0), "ok 5 bytes: hello\n"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn an_approver_in_another_process_answers_and_a_non_approver_cannot() {
    let Some(s) = Setup::start(Knobs { self_approval: false, timeout_secs: LONG, trial_runs: 100 }) else {
        return;
    };
    let user = s.user.clone();
    // Not an approver: it may read the declaration, not approve it.
    let o = s.palisade(&["tools", "approve", "show"], Some(&user));
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("Unauthorized"), "{}", text(&o.stderr));
    assert_eq!(s.stage(), "draft");
    s.approve_tool();

    // The test user's run waits; what it is about to do is listed.
    let child = s.spawn_show(&["file=in.txt"], "in.txt");
    let p = s.next_pending();
    assert_eq!((p.uid, p.tool.as_deref()), (user.uid.as_raw(), Some("show")));
    assert_eq!(p.argv, [probe(), "read".into(), "in.txt".into()]);
    // The parameter's file lies in the workspace, granted read-only as a whole.
    assert!(p.read_only.contains(&s.ws.to_string_lossy().into_owned()), "{:?}", p.read_only);
    assert_eq!(p.trigger.as_ref().map(|t| t.reason), Some(EscalationReason::FirstExecution));
    assert!(p.limits.contains_key("timeout_secs") && !p.network.is_empty(), "{p:?}");
    // The requester sees its own, and may not answer it (self_approval is off).
    assert_eq!(s.pending(Some(&user)).len(), 1);
    let o = s.palisade(&["approve", &p.id.to_string()], Some(&user));
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("Unauthorized") && text(&o.stderr).contains("self_approval"));
    assert_eq!(s.pending(None).len(), 1, "a refused answer changed something");
    // An approver's answer, from another process, starts it.
    let o = s.palisade(&["approve", &p.id.to_string()], None);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    ran(&child.wait_with_output().unwrap());
    assert!(s.pending(None).is_empty());

    // Denied with a reason: nothing runs, and the requester is told why.
    let child = s.spawn_show(&["file=in.txt"], "in.txt");
    let p = s.next_pending();
    assert!(p.trigger.is_none(), "{p:?}");
    let o = s.palisade(&["deny", &p.id.to_string(), "--reason", "not today"], None);
    assert_eq!((o.status.code(), text(&o.stdout)), (Some(0), format!("approval {}: denied\n", p.id)));
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(125));
    let err = text(&o.stderr);
    assert!(err.contains("NeedsApproval") && err.contains("denied by uid 0: not today"), "{err}");
    assert!(o.stdout.is_empty());
    // An answer to what no longer waits is refused.
    let o = s.palisade(&["approve", &p.id.to_string()], None);
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("InvalidRequest"), "{}", text(&o.stderr));
}

#[test]
fn self_approval_lets_a_requester_answer_its_own_from_another_terminal() {
    let Some(s) = Setup::start(Knobs { self_approval: true, timeout_secs: LONG, trial_runs: 100 }) else {
        return;
    };
    let user = s.user.clone();
    s.approve_tool();
    // The requester is asked at its terminal; it answers from another of its
    // processes instead, and the prompt is left unanswered.
    let (child, _terminal, prompt) = s.at_terminal(Some(&user));
    assert!(prompt.contains("tool show is in Trial"), "{prompt}");
    let p = s.next_pending();
    let o = s.palisade(&["approve", &p.id.to_string()], Some(&user));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    ran(&child.wait_with_output().unwrap());
    // Another's request stays out of its reach: root's, held the same way.
    let (child, _terminal, _) = s.at_terminal(None);
    let p = s.next_pending();
    assert_eq!(p.uid, 0);
    assert!(s.pending(Some(&user)).is_empty(), "a non-approver sees another's approval");
    let o = s.palisade(&["approve", &p.id.to_string()], Some(&user));
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("Unauthorized"), "{}", text(&o.stderr));
    assert_eq!(s.palisade(&["deny", &p.id.to_string()], None).status.code(), Some(0));
    assert_eq!(child.wait_with_output().unwrap().status.code(), Some(125));
}

#[test]
fn an_unanswered_run_expires_and_a_requester_gone_takes_its_approval_along() {
    let Some(s) = Setup::start(Knobs { self_approval: false, timeout_secs: 3, trial_runs: 100 }) else {
        return;
    };
    s.approve_tool();
    let o = s.show();
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("expired after 3 s"), "{}", text(&o.stderr));
    assert!(o.stdout.is_empty());
    assert!(s.pending(None).is_empty());
    // The refusal carries the rule that asked: the tool's Trial.
    let o = s.spawn_show(&["file=in.txt", "--json"], "in.txt").wait_with_output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    assert_eq!(
        (v["error"]["kind"].as_str(), v["error"]["rule"].as_str()),
        (Some("NeedsApproval"), Some("trust.trial")),
        "{v}"
    );
    names_a_fix_or_why_none("trust.trial", v["error"]["message"].as_str().unwrap()).unwrap();

    let mut child = s.spawn_show(&["file=in.txt"], "in.txt");
    let p = s.next_pending();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(eventually(PENDING_WAIT, || s.pending(None).is_empty()), "approval {} outlived its client", p.id);
}

#[test]
fn draft_trial_verified_across_a_restart_and_a_changed_declaration_is_draft_again() {
    let knobs = Knobs { self_approval: false, timeout_secs: LONG, trial_runs: 3 };
    let Some(mut s) = Setup::start(knobs) else { return };
    // Draft: refused, and told how to get it reviewed.
    let o = s.show();
    assert_eq!(o.status.code(), Some(125));
    let err = text(&o.stderr);
    assert!(err.contains("PolicyDenied") && err.contains("palisade tools approve show"), "{err}");
    let shown = text(&s.palisade(&["tools", "show"], None).stdout);
    assert!(shown.contains("tool show: draft") && shown.contains("parameter file:"), "{shown}");
    s.approve_tool();

    // An approved run that fails counts for nothing.
    let child = s.spawn_show(&["file=in.txt"], "missing.txt");
    let p = s.next_pending();
    assert_eq!(s.palisade(&["approve", &p.id.to_string()], None).status.code(), Some(0));
    let o = child.wait_with_output().unwrap();
    assert_ne!(o.status.code(), Some(0), "{}", text(&o.stdout));
    let shown = text(&s.palisade(&["tools", "show", "show"], None).stdout);
    assert!(shown.starts_with("tool show: trial (0 of 3 approved runs succeeded)"), "{shown}");

    // Trial: each run is held; the broker restarts in the middle.
    for i in 0..3 {
        if i == 1 {
            s.restart(None);
            assert_eq!(s.stage(), "trial");
        }
        let (p, o) = s.approved_run();
        ran(&o);
        assert!(p.reason.contains(&format!("({} of 3)", i + 1)), "{}", p.reason);
        let first = p.trigger.map(|t| t.reason) == Some(EscalationReason::FirstExecution);
        assert_eq!(first, i == 0, "run {i}");
    }
    assert_eq!(s.stage(), "verified");
    // Verified: silent (nobody approves here: a held run would expire and fail).
    ran(&s.show());
    s.restart(None);
    ran(&s.show());
    let state = std::fs::read_to_string(s.state()).unwrap();
    assert!(state.contains("\"verified\""), "{state}");

    // The declaration changes: Draft again, refused.
    let changed = tool_config(&s.user, &s.state(), knobs, "max_output_bytes = 4096");
    s.restart(Some(changed));
    assert_eq!(s.stage(), "draft");
    assert_eq!(s.show().status.code(), Some(125));
    // The transition is in the journal of the broker that made it.
    let journal = s.d.journal().to_string_lossy().into_owned();
    let o = s.palisade_local(&["audit", "tail", "--json", "-n", "100", "--journal", &journal]);
    let changes: Vec<serde_json::Value> = text(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["event"] == "trust_changed")
        .collect();
    assert_eq!(changes.len(), 1, "{}", text(&o.stdout));
    assert_eq!(
        (&changes[0]["tool"], &changes[0]["from"], &changes[0]["to"]),
        (&"show".into(), &"verified".into(), &"draft".into())
    );
}

/// The tool Verified (one approved run is enough here).
fn verified(s: &Setup) {
    s.approve_tool();
    ran(&s.approved_run().1);
    assert_eq!(s.stage(), "verified");
}

#[test]
fn each_escalation_puts_the_tool_back_to_draft_and_a_sensitive_path_is_never_granted() {
    let Some(s) = Setup::start(Knobs { self_approval: false, timeout_secs: LONG, trial_runs: 1 }) else {
        return;
    };
    verified(&s);
    // PathOutOfScope: a file outside the workspace, held with the trigger;
    // the tool is Draft while it waits; approved, this run reads it.
    let outside = s._dir.join("outside.txt");
    std::fs::write(&outside, "there").unwrap();
    let outside = outside.to_string_lossy().into_owned();
    let child = s.spawn_show(&[&format!("file={outside}")], &outside);
    let p = s.next_pending();
    let t = p.trigger.clone().unwrap();
    assert_eq!(
        (t.reason, t.requested_path.as_deref()),
        (EscalationReason::PathOutOfScope, Some(outside.as_str()))
    );
    assert!(t.approved_paths.iter().any(|a| a.starts_with(s.ws.to_str().unwrap())), "{t:?}");
    assert_eq!(s.stage(), "draft");
    assert_eq!(s.palisade(&["approve", &p.id.to_string()], None).status.code(), Some(0));
    let o = child.wait_with_output().unwrap();
    assert_eq!(text(&o.stdout), "ok 5 bytes: there\n", "{}", text(&o.stderr));
    // ... and the tool's next run is refused until it is approved again.
    assert_eq!(s.show().status.code(), Some(125));

    // UndeclaredBinding: held, denied, Draft.
    verified(&s);
    let child = s.spawn_show(&["file=in.txt", "other=in.txt"], "in.txt");
    let p = s.next_pending();
    let t = p.trigger.clone().unwrap();
    assert_eq!((t.reason, t.requested_path.as_deref()), (EscalationReason::UndeclaredBinding, Some("other")));
    assert_eq!(s.palisade(&["deny", &p.id.to_string()], None).status.code(), Some(0));
    assert_eq!(child.wait_with_output().unwrap().status.code(), Some(125));
    assert_eq!(s.stage(), "draft");
    // Denied, an escalation's run carries its rule (with --json).
    verified(&s);
    let child = s.spawn_show(&["file=in.txt", "other=in.txt", "--json"], "in.txt");
    let p = s.next_pending();
    assert_eq!(s.palisade(&["deny", &p.id.to_string()], None).status.code(), Some(0));
    let o = child.wait_with_output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    assert_eq!(v["error"]["rule"], "trust.escalation", "{v}");
    names_a_fix_or_why_none("trust.escalation", v["error"]["message"].as_str().unwrap()).unwrap();

    // SensitiveDirectory: refused outright (never granted), and Draft.
    verified(&s);
    let ssh = s.ws.join("home/.ssh");
    std::fs::create_dir_all(&ssh).unwrap();
    std::fs::write(ssh.join("id_test"), "key").unwrap();
    let key = ssh.join("id_test").to_string_lossy().into_owned();
    let o = s.spawn_show(&[&format!("file={key}")], &key).wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(125));
    let err = text(&o.stderr);
    assert!(err.contains("SensitiveDirectory"), "{err}");
    assert!(o.stdout.is_empty());
    assert!(s.pending(None).is_empty());
    assert_eq!(s.stage(), "draft");
    // Counter-test: approved again, the same tool reads a file in its range silently.
    verified(&s);
    ran(&s.show());
}

#[test]
fn without_a_daemon_the_terminals_user_answers_if_an_approver_and_anyone_else_is_refused() {
    if !is_root() {
        skipped("not root: the stages' file of this test is root's");
        return;
    }
    use std::io::Write;
    let user = test_user();
    let dir = TempDir::new("embedded");
    let ws = shared_workspace(&dir, "w");
    std::fs::write(ws.join("in.txt"), "hello").unwrap();
    let knobs = Knobs { self_approval: false, timeout_secs: LONG, trial_runs: 1 };
    let state = dir.join("state/trust.json");
    // The same tool and stages; root an approver in one, not in the other.
    let mine = dir.join("mine.toml");
    std::fs::write(
        &mine,
        test_config(&tool_config(&user, &state, knobs, "")).replace("uids = [0]", "uids = []"),
    )
    .unwrap();
    let others = dir.join("others.toml");
    std::fs::write(
        &others,
        test_config(&tool_config(&user, &state, knobs, "")).replace("uids = [0]", "uids = [4242]"),
    )
    .unwrap();
    // The embedded broker's journal, root's: the test user is refused before it is opened.
    let (_journal_dir, journal) = scratch_journal(None);
    let palisade = |args: &[&str], as_user: Option<&nix::unistd::User>| {
        let mut argv = as_user.map(palisade_tests::as_user).unwrap_or_default();
        argv.push(bin("palisade").to_string_lossy().into_owned());
        argv.extend(args.iter().map(|a| a.to_string()));
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(&ws)
            .env("PALISADE_JOURNAL", &journal)
            .env("PALISADE_STATE", state_beside(&journal))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    };
    let p = probe();
    let run = |policy: &Path| {
        let policy = policy.to_string_lossy().into_owned();
        let args = [
            "run",
            "--policy",
            &policy,
            "--tool",
            "show",
            "--param",
            "file=in.txt",
            "--",
            &p,
            "read",
            "in.txt",
        ];
        palisade(&args, None)
    };
    let o = run(&mine).output().unwrap();
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("palisade tools approve show"), "{}", text(&o.stderr));
    // Where uid 4242 is the approver, the test user may not approve the tool.
    let o = palisade(&["tools", "approve", "show", "--policy", others.to_str().unwrap()], Some(&user))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("Unauthorized"), "{}", text(&o.stderr));
    let o =
        palisade(&["tools", "approve", "show", "--policy", mine.to_str().unwrap()], None).output().unwrap();
    assert!(text(&o.stdout).starts_with("tool show: trial"), "{}", text(&o.stderr));

    // Not an approver here: nobody can answer, refused without a question.
    let o = run(&others).output().unwrap();
    assert_eq!(o.status.code(), Some(125));
    assert!(
        text(&o.stderr).contains("a running broker (palisaded) with approvers is needed"),
        "{}",
        text(&o.stderr)
    );
    // An approver with no terminal: refused.
    let o = run(&mine).output().unwrap();
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("no terminal to ask"), "{}", text(&o.stderr));
    // At a terminal: asked what the run will do, and "y" runs it (Verified: trial_runs = 1).
    let (child, mut terminal, prompt) = spawn_at_terminal(run(&mine));
    assert!(
        prompt.contains("tool show is in Trial") && prompt.contains("trigger:    FirstExecution"),
        "{prompt}"
    );
    terminal.write_all(b"y\n").unwrap();
    ran(&child.wait_with_output().unwrap());
    let o = palisade(&["tools", "show", "--policy", mine.to_str().unwrap()], None).output().unwrap();
    assert!(text(&o.stdout).starts_with("tool show: verified"), "{}", text(&o.stdout));
    ran(&run(&others).output().unwrap());
}

#[test]
fn a_requesters_own_approval_runs_the_run_but_promotes_nobody() {
    let Some(s) = Setup::start(Knobs { self_approval: true, timeout_secs: LONG, trial_runs: 1 }) else {
        return;
    };
    let user = s.user.clone();
    s.approve_tool();
    // The requester (not an approver) approves its own run, from another of
    // its processes, as self_approval allows: it runs and succeeds, and the
    // tool stays in Trial for everyone.
    let (child, _terminal, _) = s.at_terminal(Some(&user));
    let p = s.next_pending();
    let o = s.palisade(&["approve", &p.id.to_string()], Some(&user));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    ran(&child.wait_with_output().unwrap());
    assert_eq!(s.stage(), "trial", "a self-approved run promoted the tool:\n{}", s.d.log());
    // Counter-test: the same run approved by an approver (root, from its own
    // process) counts, and with trial_runs = 1 the tool is Verified.
    let (child, _terminal, _) = s.at_terminal(Some(&user));
    let p = s.next_pending();
    let o = s.palisade(&["approve", &p.id.to_string()], None);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    ran(&child.wait_with_output().unwrap());
    assert_eq!(s.stage(), "verified");
}

/// `palisade ARGS --socket S` as `user` with exactly the supplementary groups `groups`.
fn palisade_in_groups(
    s: &Setup,
    user: &nix::unistd::User,
    groups: &[nix::unistd::Gid],
    args: &[&str],
) -> Output {
    let mut argv = as_user_in(user, groups);
    argv.push(bin("palisade").to_string_lossy().into_owned());
    argv.extend(args.iter().map(|a| a.to_string()));
    argv.extend(["--socket".into(), s.d.socket.to_string_lossy().into_owned()]);
    std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(&s.ws)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Approvers named by a group's name (`[approvers] gids = ["NAME"]`): a
/// user in it as a supplementary group approves the tool and answers a
/// held run; the same user without the group may do neither.
#[test]
fn an_approver_by_a_supplementary_groups_name_answers_and_without_it_cannot() {
    let (Some(users), Some(group)) = (system_users(), system_group("palisade-approvers")) else {
        skipped("not root: a root broker serving other users cannot be started");
        return;
    };
    let approver = users.victim.clone();
    let user = test_user();
    let dir = TempDir::new("approvers-group");
    let ws = shared_workspace(&dir, "w");
    std::fs::write(ws.join("in.txt"), "hello").unwrap();
    let knobs = Knobs { self_approval: false, timeout_secs: LONG, trial_runs: 100 };
    let config = tool_config(&user, &dir.join("state/trust.json"), knobs, "")
        .replace("[approvers]\nuids = [0]\n", "[approvers]\ngids = [\"palisade-approvers\"]\n")
        .replace(
            &format!("allowed_uids = [0, {}]", user.uid),
            &format!("allowed_uids = [0, {}, {}]", user.uid, approver.uid),
        );
    assert!(config.contains("gids = [\"palisade-approvers\"]") && config.contains(&approver.uid.to_string()));
    let d = Daemon::start(&config);
    let s = Setup { d, ws, user, config, _dir: dir };
    let (with, without) = ([group.gid], []);
    let refused = |o: &Output| o.status.code() == Some(125) && text(&o.stderr).contains("Unauthorized");

    let o = palisade_in_groups(&s, &approver, &without, &["tools", "approve", "show"]);
    assert!(refused(&o), "{}", text(&o.stderr));
    let o = palisade_in_groups(&s, &approver, &with, &["tools", "approve", "show"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(text(&o.stdout).starts_with("tool show: trial"), "{}", text(&o.stdout));

    let child = s.spawn_show(&["file=in.txt"], "in.txt");
    let mut held = Vec::new();
    let listed = eventually(PENDING_WAIT, || {
        let o = palisade_in_groups(&s, &approver, &with, &["approvals", "--json"]);
        held = serde_json::from_slice::<Vec<PendingApproval>>(&o.stdout).unwrap_or_default();
        !held.is_empty()
    });
    assert!(listed, "no run was held for approval:\n{}", s.d.log());
    let id = held[0].id.to_string();
    // Without the group it sees none of the others' runs, and may not answer.
    let o = palisade_in_groups(&s, &approver, &without, &["approvals", "--json"]);
    assert_eq!(text(&o.stdout).trim(), "[]", "{}", text(&o.stderr));
    let o = palisade_in_groups(&s, &approver, &without, &["approve", &id]);
    assert!(refused(&o), "{}", text(&o.stderr));
    let o = palisade_in_groups(&s, &approver, &with, &["approve", &id]);
    assert_eq!(
        (o.status.code(), text(&o.stdout)),
        (Some(0), format!("approval {id}: approved\n")),
        "{}",
        text(&o.stderr)
    );
    ran(&child.wait_with_output().unwrap());
}

/// README.md's worked example of a declared tool, run as written: its
/// shell block, in an empty directory, at a terminal where the person
/// answers `y` to the one question, the Trial run's.
#[test]
fn the_readmes_declared_tool_goes_from_draft_to_verified_as_written() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    let section =
        &readme[readme.find("#### A declared tool, from declaration to Verified").expect("the section")..];
    let block = &section[section.find("```sh\n").unwrap() + 6..];
    let block = &block[..block.find("```").unwrap()];
    let dir = TempDir::new("readme-tool");
    let (_journal, journal) = scratch_journal(None);
    let path = path_with_palisade();
    let mut cmd = std::process::Command::new("/bin/bash");
    cmd.args(["-e", "-c", block])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("PALISADE_STATE", state_beside(&journal))
        .env("PALISADE_JOURNAL", &journal)
        .env_remove("PALISADE_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (child, mut terminal, question) = spawn_at_terminal(cmd);
    assert!(
        question.contains("tool count is in Trial") && question.ends_with("Run it? [y/N] "),
        "{question}"
    );
    std::io::Write::write_all(&mut terminal, b"y\n").unwrap();
    let o = child.wait_with_output().unwrap();
    // What else the terminal was shown: nothing but the answer's echo (no second question).
    drop(terminal);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("tool count: draft") && out.contains("tool count: trial"), "{out}");
    let notes = dir.join("count-demo/notes.txt");
    let counted = format!("2 {}\n", notes.display());
    assert_eq!(out.matches(&counted).count(), 2, "{out}{err}");
    let stages = std::fs::read_to_string(state_beside(&journal).join("trust.json")).unwrap_or_default();
    assert!(stages.contains("verified") || stages.contains("Verified"), "{stages}");
}
