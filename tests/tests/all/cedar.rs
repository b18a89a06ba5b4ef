//! Cedar policies (`[policy] cedar`) through the real binaries: a daemon
//! whose Cedar file permits one run and forbids another (and the same runs
//! allowed without it), a group permit for the unprivileged test user,
//! `palisade explain` naming the policies, and files with errors refused
//! at start with their positions.

use palisade_broker::cli::client::{Client, ClientError};
use palisade_protocol::wire::{ErrorKind, RunRequest, RunStatus, ServerMessage};
use palisade_tests::*;
use std::path::{Path, PathBuf};

/// The canonical path of a host program, as Cedar's `Executable` names it.
fn program(name: &str) -> String {
    Path::new("/usr/bin").join(name).canonicalize().unwrap().to_string_lossy().into_owned()
}

/// A run's output, or its refusal: (kind, rule, message).
type Answer = Result<String, (ErrorKind, Option<String>, String)>;

/// Runs `argv` in `cwd` through the daemon at `socket`.
fn run(socket: &Path, cwd: &Path, argv: &[&str], timeout_secs: Option<u64>) -> Answer {
    let mut client = Client::open(socket).unwrap();
    let req = RunRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: Some(cwd.to_string_lossy().into_owned()),
        timeout_secs,
        ..Default::default()
    };
    let mut out = Vec::new();
    let r = client.run(req, |m| {
        if let ServerMessage::Output { data, .. } = m {
            out.extend_from_slice(data);
        }
    });
    match r {
        Ok(r) => {
            assert_eq!(r.status, RunStatus::Exited { code: 0 }, "{}", text(&out));
            Ok(text(&out))
        }
        Err(ClientError::Reply(e)) => Err((e.kind, e.rule, e.message)),
        Err(e) => panic!("{e}"),
    }
}

/// Everyone may run; nobody runs `cat`, nor for more than a minute.
fn policies() -> String {
    format!(
        "@id(\"everyone\")\npermit(principal, action == Action::\"run\", resource);\n\n\
         @id(\"no-cat\")\nforbid(principal, action, resource == Executable::\"{}\");\n\n\
         @id(\"short-runs\")\nforbid(principal, action, resource)\nwhen {{ context.timeout_secs > 60 }};\n",
        program("cat")
    )
}

/// A Cedar file written in `dir`.
fn cedar_file(dir: &TempDir, text: &str) -> PathBuf {
    let file = dir.join("palisade.cedar");
    std::fs::write(&file, text).unwrap();
    file
}

/// The refusal `answer` must be: Cedar's, by `rule`, naming `policy`.
fn assert_refused(answer: Answer, rule: &str, policy: &str) {
    let Err((kind, got, message)) = answer else { panic!("not refused: {answer:?}") };
    assert_eq!((kind, got.as_deref()), (ErrorKind::PolicyDenied, Some(rule)), "{message}");
    assert!(message.contains(&format!("\"{policy}\"")), "{message}");
}

#[test]
fn cedar_permits_one_run_and_forbids_others() {
    let dir = TempDir::new("cedar");
    let file = cedar_file(&dir, &policies());
    let ws = TempDir::new("ws");
    std::fs::write(ws.join("notes"), "kept\n").unwrap();
    let notes = ws.join("notes").to_string_lossy().into_owned();
    let d = Daemon::start(&format!("[policy]\ncedar = {:?}\n", file.to_string_lossy()));

    let echo = [probe(), "echo".into(), "x".into()];
    let echo: Vec<&str> = echo.iter().map(String::as_str).collect();
    assert_eq!(run(&d.socket, ws.path(), &echo, Some(30)), Ok("ok x\n".into()), "{}", d.log());
    // The forbidden program, and a run longer than the policy's minute (the
    // default profile's deadline, 300 s: the context is the resolved run).
    assert_refused(run(&d.socket, ws.path(), &["cat", &notes], Some(30)), "cedar.forbid", "no-cat");
    assert_refused(run(&d.socket, ws.path(), &echo, None), "cedar.forbid", "short-runs");
    // The CLI says it in one line, kind first.
    let socket = d.socket.to_str().unwrap();
    let o = palisade_cli(ws.path(), &["run", "--socket", socket, "--timeout", "30"], &["cat", &notes], None);
    assert_eq!(o.status.code(), Some(125));
    let err = text(&o.stderr);
    assert!(err.starts_with("palisade: PolicyDenied: Cedar policy \"no-cat\" forbids"), "{err}");

    // Without the Cedar file, both run.
    let plain = Daemon::start("");
    assert_eq!(run(&plain.socket, ws.path(), &["cat", &notes], Some(30)), Ok("kept\n".into()));
    assert_eq!(run(&plain.socket, ws.path(), &echo, None), Ok("ok x\n".into()));
}

#[test]
fn no_permit_is_a_refusal() {
    let dir = TempDir::new("cedar-none");
    let file = cedar_file(
        &dir,
        "@id(\"tools only\")\npermit(principal, action == Action::\"run_tool\", resource);\n",
    );
    let ws = TempDir::new("ws");
    let d = Daemon::start(&format!("[policy]\ncedar = {:?}\n", file.to_string_lossy()));
    let Err((kind, rule, message)) = run(&d.socket, ws.path(), &[&probe(), "echo", "x"], None) else {
        panic!("ran without a permit")
    };
    assert_eq!((kind, rule.as_deref()), (ErrorKind::PolicyDenied, Some("cedar.no_permit")), "{message}");
    assert!(message.contains("no Cedar policy") && message.contains("Action::\"run\""), "{message}");
}

/// Cedar sees a requester as its uid in its groups: a permit for the
/// unprivileged test user's group lets it run, and not root.
#[test]
fn a_group_permit_for_the_unprivileged_user() {
    if !is_root() {
        return a_group_permit_for_this_user();
    }
    let user = test_user();
    let dir = TempDir::new("cedar-group");
    let file = cedar_file(
        &dir,
        &format!("@id(\"testers\")\npermit(principal in Group::\"{}\", action, resource);\n", user.gid),
    );
    let ws_dir = TempDir::new("ws");
    let ws = shared_workspace(&ws_dir, "ws");
    owned_dir(&ws, &user, 0o755);
    let root_ws = TempDir::new("root-ws");
    let config = |cedar: bool| {
        let key =
            if cedar { format!("[policy]\ncedar = {:?}\n", file.to_string_lossy()) } else { String::new() };
        format!("[broker]\nallowed_uids = [0, {}]\nsocket_mode = 0o666\n{key}", user.uid)
    };
    let d = Daemon::start(&config(true));
    let socket = d.socket.to_str().unwrap();
    let o = palisade_cli(&ws, &["run", "--socket", socket], &[&probe(), "echo", "x"], Some(&user));
    assert_eq!(text(&o.stdout), "ok x\n", "{}\n{}", text(&o.stderr), d.log());
    let o = palisade_cli(root_ws.path(), &["run", "--socket", socket], &[&probe(), "echo", "x"], None);
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).starts_with("palisade: PolicyDenied: no Cedar policy"), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("User::\"0\""), "{}", text(&o.stderr));
    // Without the file, root's run goes ahead.
    let plain = Daemon::start(&config(false));
    let socket = plain.socket.to_str().unwrap();
    let o = palisade_cli(root_ws.path(), &["run", "--socket", socket], &[&probe(), "echo", "x"], None);
    assert_eq!(text(&o.stdout), "ok x\n", "{}", text(&o.stderr));
}

/// Unprivileged, the broker serves only this user: a permit for its group
/// lets it run, one for another group does not.
fn a_group_permit_for_this_user() {
    let gid = nix::unistd::getgid().as_raw();
    let dir = TempDir::new("cedar-group");
    let ws = TempDir::new("ws");
    for (group, allowed) in [(gid, true), (gid.wrapping_add(1), false)] {
        let permit =
            format!("@id(\"testers\")\npermit(principal in Group::\"{group}\", action, resource);\n");
        let file = cedar_file(&dir, &permit);
        let d = Daemon::start(&format!("[policy]\ncedar = {:?}\n", file.to_string_lossy()));
        match run(&d.socket, ws.path(), &[&probe(), "echo", "x"], None) {
            Ok(out) => assert!(allowed && out == "ok x\n", "group {group}: {out}"),
            Err((kind, rule, message)) => {
                assert!(!allowed, "group {group}: {message}");
                assert_eq!(
                    (kind, rule.as_deref()),
                    (ErrorKind::PolicyDenied, Some("cedar.no_permit")),
                    "{message}"
                );
            }
        }
    }
}

#[test]
fn explain_names_the_cedar_policies() {
    let dir = TempDir::new("cedar-explain");
    cedar_file(&dir, &policies());
    // A relative path: next to the configuration file.
    let config = dir.join("palisade.toml");
    std::fs::write(&config, "[policy]\ncedar = \"palisade.cedar\"\n").unwrap();
    let ws = TempDir::new("ws");
    std::fs::write(ws.join("notes"), "kept\n").unwrap();
    let explain = |config: &Path, argv: &[&str]| {
        palisade_cli(ws.path(), &["explain", "--policy", config.to_str().unwrap()], argv, None)
    };

    let o = explain(&config, &["echo", "x"]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}{}", text(&o.stderr));
    assert!(out.contains("rule:     cedar.forbid") && out.contains("\"short-runs\""), "{out}");
    std::fs::write(&config, "[policy]\ncedar = \"palisade.cedar\"\n[defaults]\nmax_execution_time = 60\n")
        .unwrap();
    let o = explain(&config, &["echo", "x"]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    let want = format!(
        "cedar:    permitted by \"everyone\" for the request (User::\"{}\", Action::\"run\", Executable::\"{}\")",
        nix::unistd::getuid(),
        program("echo")
    );
    assert!(out.contains(&want), "{want}\n{out}");
    let o = explain(&config, &["cat", "notes"]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(1));
    assert!(out.contains("rule:     cedar.forbid") && out.contains("\"no-cat\""), "{out}");

    // Without the key: no Cedar, and cat is allowed.
    std::fs::write(&config, "").unwrap();
    let o = explain(&config, &["cat", "notes"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(text(&o.stdout).contains("cedar:    no Cedar policies configured"), "{}", text(&o.stdout));
}

#[test]
fn a_cedar_file_with_errors_stops_the_daemon_naming_each_position() {
    let dir = TempDir::new("cedar-bad");
    let file = cedar_file(
        &dir,
        "permit(principal, action == Action::\"run\", resource)\nwhen { context.netwrk };\n\
         forbid(principal in Grup::\"1\", action, resource);\n",
    );
    let config = dir.join("palisade.toml");
    std::fs::write(&config, "[policy]\ncedar = \"palisade.cedar\"\n").unwrap();
    let wanted = [
        format!("{}:2:8: for policy `policy0`, attribute `netwrk` in context", file.display()),
        format!("{}:3:21: for policy `policy1`, unrecognized entity type `Grup`", file.display()),
    ];
    let o = std::process::Command::new(bin("palisaded"))
        .args(["--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    for w in &wanted {
        assert!(text(&o.stderr).contains(w.as_str()), "{w}\n{}", text(&o.stderr));
    }
    let ws = TempDir::new("ws");
    let o = palisade_cli(ws.path(), &["explain", "--policy", config.to_str().unwrap()], &["true"], None);
    assert_eq!(o.status.code(), Some(125));
    for w in &wanted {
        assert!(text(&o.stderr).contains(w.as_str()), "{w}\n{}", text(&o.stderr));
    }

    // A syntax error, and a file that is not there.
    std::fs::write(&file, "permit(principal, action, resource)\n  wen { true };\n").unwrap();
    let o = std::process::Command::new(bin("palisaded"))
        .args(["--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let want = format!("{}:2:3: invalid policy condition: wen", file.display());
    assert!(text(&o.stderr).contains(&want), "{}", text(&o.stderr));
    std::fs::remove_file(&file).unwrap();
    let o = std::process::Command::new(bin("palisaded"))
        .args(["--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let want = format!("[policy] cedar: cannot read {}", file.display());
    assert!(text(&o.stderr).contains(&want), "{}", text(&o.stderr));
}

/// As root, the same file again as the unprivileged test user.
#[test]
fn the_cedar_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_cedar_suite_passes_as_an_unprivileged_user");
}

/// Cedar's `approve`: an approver's yes to a waiting run must be permitted
/// too. Here nobody may approve their own request: root (an approver) is
/// refused on its own run, naming the policy, while its denial is taken;
/// the test user (also an approver) approves root's next run, which runs.
#[test]
fn cedar_approve_narrows_who_may_approve_a_waiting_run() {
    if !is_root() {
        skipped("not root: a root broker serving the test user cannot be started");
        return;
    }
    let user = test_user();
    let dir = TempDir::new("cedar-approve");
    let ws = shared_workspace(&dir, "w");
    let file = dir.join("approve.cedar");
    std::fs::write(
        &file,
        "@id(\"everyone\")\npermit(principal, action == Action::\"run\", resource);\n\n\
         @id(\"approvers\")\npermit(principal, action == Action::\"approve\", resource);\n\n\
         @id(\"not your own\")\nforbid(principal, action == Action::\"approve\", resource)\n\
         when { context.requester_uid == principal.uid };\n",
    )
    .unwrap();
    let config = format!(
        "[broker]\nuser_namespaces = false\nallowed_uids = [0, {uid}]\nsocket_mode = 0o666\n\
         [approvers]\nuids = [0, {uid}]\n[policy]\nfallback = \"request_approval\"\ncedar = {file:?}\n",
        uid = user.uid,
        file = file.to_string_lossy()
    );
    let d = Daemon::start(&config);
    let socket = d.socket.to_string_lossy().into_owned();
    let palisade = |args: &[&str], who: Option<&nix::unistd::User>| {
        let mut argv = who.map(as_user).unwrap_or_default();
        argv.push(bin("palisade").to_string_lossy().into_owned());
        argv.extend(args.iter().map(|a| a.to_string()));
        argv.extend(["--socket".into(), socket.clone()]);
        std::process::Command::new(&argv[0]).args(&argv[1..]).output().unwrap()
    };
    // Root's run waits; it may not answer it itself (Cedar forbids), so nobody here does.
    let requester = |ws: PathBuf, socket: PathBuf| {
        std::thread::spawn(move || {
            let mut client = Client::open(&socket).unwrap();
            let req = RunRequest {
                argv: vec![probe(), "echo".into(), "approved".into()],
                cwd: Some(ws.to_string_lossy().into_owned()),
                ..Default::default()
            };
            let mut may_answer = None;
            let r = client.run_events(
                req,
                |_| {},
                |ask| {
                    may_answer = Some(ask.may_answer);
                    None
                },
            );
            (may_answer, r.map(|r| r.status).map_err(|e| e.to_string()))
        })
    };
    let waiting = |d: &Daemon| {
        let mut id = None;
        let held = eventually(std::time::Duration::from_secs(20), || {
            let o = palisade(&["approvals", "--json"], None);
            let list: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap_or_default();
            id = list.first().and_then(|p| p["id"].as_u64());
            id.is_some()
        });
        assert!(held, "no run was held:\n{}", d.log());
        id.unwrap().to_string()
    };

    let first = requester(ws.clone(), d.socket.clone());
    let id = waiting(&d);
    let o = palisade(&["approve", &id], None);
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stdout));
    let err = text(&o.stderr);
    assert!(err.contains("PolicyDenied") && err.contains("not your own"), "{err}");
    // A denial is the role's alone: taken.
    assert_eq!(palisade(&["deny", &id], None).status.code(), Some(0));
    let (may_answer, status) = first.join().unwrap();
    assert_eq!(may_answer, Some(false));
    assert!(status.unwrap_err().contains("NeedsApproval"));

    // Counter-test: another approver's yes is permitted, and the run runs.
    let second = requester(ws.clone(), d.socket.clone());
    let id = waiting(&d);
    let o = palisade(&["approve", &id], Some(&user));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let (_, status) = second.join().unwrap();
    assert_eq!(status, Ok(RunStatus::Exited { code: 0 }));
}

/// `git push`'s stand-in: a forbid with `@ask` holds what it matches for an
/// approver; a plain forbid beside it refuses at once.
fn asking_policies() -> String {
    "@id(\"everyone\")\npermit(principal, action, resource);\n\n\
     @id(\"push\")\n@ask(\"pushing needs an approver\")\nforbid(principal, action, resource)\n\
     when { context.argv.contains(\"push\") };\n\n\
     @id(\"no force\")\nforbid(principal, action, resource)\nwhen { context.argv.contains(\"--force\") };\n"
        .into()
}

/// A Cedar `@ask` holds a command for an approver, who is named in the
/// result: the requester (root, not an approver here) waits; the test user
/// approves one run (it runs, and its result's `approved` names them, on
/// the CLI's stderr and in `--json`), denies another (refused, rule
/// `cedar.ask`, nothing ran); a command the rule does not match runs
/// unasked, and one a plain forbid matches too is refused unasked.
#[test]
fn a_cedar_ask_holds_a_command_for_an_approver_who_is_named() {
    if !is_root() {
        skipped("not root: a root broker serving the test user cannot be started");
        return;
    }
    let user = test_user();
    let dir = TempDir::new("cedar-ask");
    let ws = shared_workspace(&dir, "w");
    let file = cedar_file(&dir, &asking_policies());
    let config = format!(
        "[broker]\nallowed_uids = [0, {uid}]\nsocket_mode = 0o666\n[approvers]\nuids = [{uid}]\n\
         [policy]\ncedar = {file:?}\n",
        uid = user.uid,
        file = file.to_string_lossy()
    );
    let d = Daemon::start(&config);
    let socket = d.socket.to_string_lossy().into_owned();
    let palisade = |args: &[&str], who: Option<&nix::unistd::User>| {
        let mut argv = who.map(as_user).unwrap_or_default();
        argv.push(bin("palisade").to_string_lossy().into_owned());
        argv.extend(args.iter().map(|a| a.to_string()));
        argv.extend(["--socket".into(), socket.clone()]);
        std::process::Command::new(&argv[0]).args(&argv[1..]).output().unwrap()
    };
    let run = |pre: &'static [&'static str], word: &'static str| {
        let (ws, socket) = (ws.clone(), socket.clone());
        std::thread::spawn(move || {
            let mut args = vec!["run", "--socket", &socket];
            args.extend(pre);
            palisade_cli(&ws, &args, &[&probe(), "echo", word], None)
        })
    };
    let waiting = || {
        let mut held = None;
        let found = eventually(std::time::Duration::from_secs(20), || {
            let o = palisade(&["approvals", "--json"], None);
            let list: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap_or_default();
            held = list.first().cloned();
            held.is_some()
        });
        assert!(found, "no run was held:\n{}", d.log());
        let held = held.unwrap();
        assert_eq!(held["reason"], "pushing needs an approver", "{held}");
        held["id"].as_u64().unwrap().to_string()
    };

    // The control: a command the rule does not match runs at once, nobody asked.
    let o = run(&[], "status").join().unwrap();
    assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(0), "ok status\n"), "{}", text(&o.stderr));
    assert!(!text(&o.stderr).contains("approved by"), "{}", text(&o.stderr));

    // Held; the requester may not answer (root is no approver here); the test user approves.
    let pushing = run(&[], "push");
    let id = waiting();
    let o = palisade(&["approve", &id], None);
    assert_eq!(o.status.code(), Some(125), "root approved: {}", text(&o.stdout));
    let o = palisade(&["approve", &id], Some(&user));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = pushing.join().unwrap();
    let err = text(&o.stderr);
    assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(0), "ok push\n"), "{err}");
    let named = format!("palisade: approved by {} (uid {}): cedar.ask\n", user.name, user.uid);
    assert!(err.contains("waiting for an approver") && err.contains(&named), "{err}");

    // --json: the result's `approved`.
    let pushing = run(&["--json"], "push");
    let id = waiting();
    assert_eq!(palisade(&["approve", &id], Some(&user)).status.code(), Some(0));
    let o = pushing.join().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["result"]["approved"],
        serde_json::json!({"uid": user.uid.as_raw(), "name": user.name, "rule": "cedar.ask", "reason": "pushing needs an approver"}),
        "{v}"
    );
    assert_eq!(v["stdout"], "ok push\n", "{v}");

    // Denied: refused for want of an approval, and nothing ran.
    let pushing = run(&[], "push");
    let id = waiting();
    assert_eq!(palisade(&["deny", &id], Some(&user)).status.code(), Some(0));
    let o = pushing.join().unwrap();
    let err = text(&o.stderr);
    assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(125), ""), "{err}");
    assert!(
        err.contains("NeedsApproval: pushing needs an approver") && err.contains("Not approved"),
        "{err}"
    );
    let message = err.lines().last().unwrap_or_default().to_string();
    palisade_policy::denial::names_a_fix_or_why_none("cedar.ask", &message).unwrap();

    // A plain forbid that matches too refuses at once: asking never overrides a refusal.
    let o = palisade_cli(&ws, &["run", "--socket", &socket], &[&probe(), "echo", "push", "--force"], None);
    let err = text(&o.stderr);
    assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(125), ""), "{err}");
    assert!(err.starts_with("palisade: PolicyDenied: Cedar policy \"no force\" forbids"), "{err}");
    let o = palisade(&["approvals", "--json"], None);
    assert_eq!(text(&o.stdout).trim(), "[]", "{}", d.log());
}

/// Without a daemon, the embedded broker puts a Cedar `@ask` to the
/// person at the terminal (an approver of their own policy): "y" runs it,
/// its result naming them; "n" refuses it, rule `cedar.ask`; a command the
/// rule does not match is not asked.
#[test]
fn the_embedded_broker_asks_at_the_terminal_and_names_who_approved() {
    use std::io::Write;
    let dir = TempDir::new("cedar-ask-embedded");
    let file = cedar_file(&dir, &asking_policies());
    let policy = dir.join("palisade.toml");
    std::fs::write(&policy, test_config(&format!("[policy]\ncedar = {:?}\n", file.to_string_lossy())))
        .unwrap();
    let ws = TempDir::new("ws");
    let (_journal_dir, journal) = scratch_journal(None);
    let p = probe();
    let run = |json: bool, word: &str| {
        let mut cmd = std::process::Command::new(bin("palisade"));
        cmd.args(["run", "--policy", policy.to_str().unwrap()]);
        if json {
            cmd.arg("--json");
        }
        cmd.args(["--", &p, "echo", word])
            .current_dir(ws.path())
            .env("PALISADE_JOURNAL", &journal)
            .env("PALISADE_STATE", state_beside(&journal))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        cmd
    };
    let me = nix::unistd::User::from_uid(nix::unistd::geteuid()).unwrap().unwrap();

    let o = run(false, "status").output().unwrap();
    assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(0), "ok status\n"), "{}", text(&o.stderr));

    // No terminal: nobody to ask, refused.
    let o = run(false, "push").output().unwrap();
    let err = text(&o.stderr);
    assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(125), ""), "{err}");
    assert!(err.contains("Not approved: no terminal to ask"), "{err}");
    let (child, mut terminal, prompt) = spawn_at_terminal(run(true, "push"));
    assert!(prompt.contains("pushing needs an approver"), "{prompt}");
    terminal.write_all(b"y\n").unwrap();
    let o = child.wait_with_output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["stdout"], "ok push\n", "{v}");
    let approved = &v["result"]["approved"];
    assert_eq!(
        (approved["uid"].as_u64(), approved["name"].as_str()),
        (Some(me.uid.as_raw().into()), Some(me.name.as_str())),
        "{v}"
    );
    assert_eq!(
        (approved["rule"].as_str(), approved["reason"].as_str()),
        (Some("cedar.ask"), Some("pushing needs an approver"))
    );

    let (child, mut terminal, _) = spawn_at_terminal(run(false, "push"));
    terminal.write_all(b"n\n").unwrap();
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(125), ""), "{err}");
    assert!(err.contains("pushing needs an approver Not approved: refused."), "{err}");
}
