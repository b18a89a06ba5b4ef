//! The policy through the real binaries: explain, refusals with their kinds,
//! configuration errors, tools with bound parameters and temporary
//! workspaces, no_fork, hidden sensitive entries, environment and network
//! capabilities, each checked from inside the sandbox.

use palisade_broker::cli::client::{Client, ClientError};
use palisade_protocol::wire::{
    ClientMessage, ErrorKind, Executor, ParamValue, RunRequest, RunStatus, ServerMessage,
};
use palisade_tests::*;
use std::path::Path;

/// Runs one request through a client and returns (stdout, result or error).
fn run(client: &mut Client, req: RunRequest) -> (String, Result<RunStatus, (ErrorKind, String)>) {
    let mut out = Vec::new();
    let r = client.run(req, |m| {
        if let ServerMessage::Output { data, .. } = m {
            out.extend_from_slice(data);
        }
    });
    let r = match r {
        Ok(r) => Ok(r.status),
        Err(ClientError::Reply(e)) => Err((e.kind, e.message)),
        Err(e) => panic!("{e}"),
    };
    (text(&out), r)
}

#[test]
fn explain_prints_the_decision_and_the_plan_without_running() {
    let ws = TempDir::new("ws");
    let marker = ws.join("ran");
    let o = palisade_cli(ws.path(), &["explain"], &["touch", marker.to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    for needle in [
        "decision: allow (linux-tier-c)",
        "program:  /usr/bin/touch",
        "mounts",
        "/usr  read-only bind",
        "landlock:",
        "limits:",
        "seccomp:",
        "network:  none",
    ] {
        assert!(out.contains(needle), "{needle:?} missing from:\n{out}");
    }
    assert!(out.contains(&format!("{}  read-write overlay", ws.path().display())), "{out}");
    assert!(!marker.exists(), "explain ran the command");

    let o = palisade_cli(ws.path(), &["explain"], &["sh", "-c", "id"], None);
    assert_eq!(o.status.code(), Some(1));
    let out = text(&o.stdout);
    assert!(
        out.contains("decision: deny")
            && out.contains("kind:     PolicyDenied")
            && out.contains("rule:     interpreters.denied"),
        "{out}"
    );
}

#[test]
fn refusals_name_their_kind_and_nothing_runs() {
    let ws = TempDir::new("ws");
    let outside = TempDir::new("outside");
    std::fs::write(outside.join("secret"), "s").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["sh".into(), "-c".into(), format!("touch {}/ran", ws.path().display())], "PolicyDenied"),
        (vec!["cat".into(), outside.join("secret").to_string_lossy().into()], "WorkspaceScopeDenied"),
        (vec!["cat".into(), "/etc/shadow".into()], "WorkspaceScopeDenied"),
        (vec!["curl".into(), "https://example.com/".into()], "CapabilityDenied"),
        (vec!["echo".into(), "x".repeat(5000)], "InvalidRequest"),
    ];
    for (argv, kind) in cases {
        let args: Vec<&str> = argv.iter().map(String::as_str).collect();
        let o = palisade_cli(ws.path(), &["run"], &args, None);
        assert_eq!(o.status.code(), Some(125), "{argv:?}");
        let err = text(&o.stderr);
        assert!(err.starts_with(&format!("palisade: {kind}: ")), "{argv:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    assert!(!ws.join("ran").exists());
}

#[test]
fn configuration_errors_name_the_line_and_column() {
    let dir = TempDir::new("cfg");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[defaults]\nmax_memory_mb = 512\nnetwork = \"sometimes\"\n").unwrap();
    let o = palisade_cli(dir.path(), &["run", "--policy", bad.to_str().unwrap()], &["true"], None);
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("bad.toml:3:11: "), "{}", text(&o.stderr));
    let o = std::process::Command::new(bin("palisaded"))
        .args(["--config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("bad.toml:3:11: "), "{}", text(&o.stderr));
    std::fs::write(
        &bad,
        "[tools.t]\npreset = \"file_processor\"\n[tools.t.overrides]\nnetwork = \"allow_all\"\n",
    )
    .unwrap();
    let o = std::process::Command::new(bin("palisaded"))
        .args(["--config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("bad.toml:4:11: tool t: the network of preset file_processor is immutable"),
        "{}",
        text(&o.stderr)
    );
}

fn tool_config() -> String {
    let probe = probe();
    let dir = bin("probe").parent().unwrap().to_string_lossy().into_owned();
    format!(
        r#"
[tools.convert]
preset = "file_processor"
allowed_executables = ["{probe}"]
[tools.convert.overrides]
filesystem = [{{ read_only = "{dir}" }}]
[tools.convert.parameters.input]
capability = "filesystem.read_only"
validation = "is_file"
mapping = "single"
[tools.convert.parameters.out]
capability = "filesystem.read_write"
validation = "is_directory"
mapping = "single"

[tools.quiet]
preset = "data_transformer"
allowed_executables = ["{probe}"]
[tools.quiet.overrides]
filesystem = [{{ read_only = "{dir}" }}]
environment = "none"
process = {{ no_fork = false }}

[tools.netdeny]
preset = "data_transformer"
allowed_executables = ["{probe}"]
egress = "none"
[tools.netdeny.overrides]
filesystem = [{{ read_only = "{dir}" }}]

[tools.netty]
preset = "data_transformer"
allowed_executables = ["{probe}"]
egress = "none"
[tools.netty.overrides]
filesystem = [{{ read_only = "{dir}" }}]
network = "allow_all"
"#
    )
}

fn tool_request(cwd: &Path, tool: &str, args: &[&str], params: &[(&str, &Path)]) -> RunRequest {
    let mut r = request(cwd, args);
    r.tool = Some(tool.into());
    r.params =
        params.iter().map(|(k, v)| (k.to_string(), ParamValue::One(v.to_string_lossy().into()))).collect();
    r
}

#[test]
fn a_tool_gets_its_bound_paths_and_a_fresh_temporary_workspace_each_run() {
    let d = Daemon::start(&tool_config());
    let work = TempDir::new("tool");
    // A sandbox started by root runs as another uid, which must reach the bound paths.
    shared_workspace(&work, "out");
    let input = work.join("in.txt");
    std::fs::write(&input, "input-data").unwrap();
    let out_dir = work.join("out");
    let mut c = Client::connect(&d.socket).unwrap();

    let params: [(&str, &Path); 2] = [("input", &input), ("out", &out_dir)];
    // The bound input is readable, and read-only.
    let (out, r) =
        run(&mut c, tool_request(work.path(), "convert", &["read", input.to_str().unwrap()], &params));
    assert_eq!(
        (out.as_str(), r),
        ("ok 10 bytes: input-data\n".to_string().as_str(), Ok(RunStatus::Exited { code: 0 }))
    );
    let (out, _) =
        run(&mut c, tool_request(work.path(), "convert", &["write", input.to_str().unwrap()], &params));
    assert!(out.starts_with("err "), "{out}");
    // The bound output directory is writable.
    let made = out_dir.join("made");
    let (out, _) =
        run(&mut c, tool_request(work.path(), "convert", &["write", made.to_str().unwrap()], &params));
    assert_eq!(out, "ok \n");
    assert!(made.exists());
    // The temporary workspace is the working directory, writable, and new every run.
    let (out, _) =
        run(&mut c, tool_request(work.path(), "convert", &["write", "/workspace/left-behind"], &[]));
    assert_eq!(out, "ok \n");
    let (out, _) = run(&mut c, tool_request(work.path(), "convert", &["list", "/workspace"], &[]));
    assert_eq!(out, "ok \n", "the previous run's file survived");
    let (out, _) = run(&mut c, tool_request(work.path(), "convert", &["cwd"], &[]));
    assert_eq!(out, "ok /workspace\n");
    // Paths the tool was not granted are refused before anything runs.
    let (_, r) = run(&mut c, tool_request(work.path(), "convert", &["read", input.to_str().unwrap()], &[]));
    assert_eq!(r.map_err(|e| e.0), Err(ErrorKind::WorkspaceScopeDenied));
    // An undeclared parameter is refused.
    let (_, r) = run(&mut c, tool_request(work.path(), "convert", &["cwd"], &[("other", &input)]));
    assert_eq!(r.map_err(|e| e.0), Err(ErrorKind::PolicyDenied));
    // Only the allowed executable.
    let mut req = tool_request(work.path(), "convert", &[], &[]);
    req.argv = vec!["/usr/bin/true".into()];
    assert_eq!(run(&mut c, req).1.map_err(|e| e.0), Err(ErrorKind::PolicyDenied));
    // In JSON a parameter is a path, as palisade mcp's run_tool takes it.
    let script = "import sys, palisade_client as p\n\
                  r = p.Client(sys.argv[1]).run([sys.argv[2], 'read', sys.argv[3]], cwd=sys.argv[4], tool='convert', \
                  params={'input': sys.argv[3], 'out': sys.argv[5]})\n\
                  sys.stdout.buffer.write(r.stdout)";
    let probe = probe();
    let o = python_with_client()
        .args(["-c", script])
        .args([
            d.socket.as_os_str(),
            probe.as_ref(),
            input.as_os_str(),
            work.path().as_os_str(),
            out_dir.as_os_str(),
        ])
        .output()
        .unwrap();
    assert_eq!(text(&o.stdout), "ok 10 bytes: input-data\n", "{}", text(&o.stderr));
}

#[test]
fn palisade_run_takes_a_tool_and_its_parameters() {
    let d = Daemon::start(&tool_config());
    let work = TempDir::new("tool-cli");
    shared_workspace(&work, "out");
    let input = work.join("in.txt");
    std::fs::write(&input, "cli-input").unwrap();
    let sock = d.socket.to_str().unwrap();
    let (p_in, p_out) = (format!("input={}", input.display()), format!("out={}", work.join("out").display()));
    let o = palisade_cli(
        work.path(),
        &["run", "--socket", sock, "--tool", "convert", "--param", &p_in, "--param", &p_out],
        &[&probe(), "read", input.to_str().unwrap()],
        None,
    );
    assert_eq!(text(&o.stdout), "ok 9 bytes: cli-input\n", "{}", text(&o.stderr));
    // Counter-test: without the parameter, the tool does not see the file.
    let o = palisade_cli(
        work.path(),
        &["run", "--socket", sock, "--tool", "convert", "--param", &p_out],
        &[&probe(), "read", input.to_str().unwrap()],
        None,
    );
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stdout));
    let o =
        palisade_cli(work.path(), &["run", "--socket", sock, "--tool", "nosuch"], &[&probe(), "echo"], None);
    assert!(
        text(&o.stderr).starts_with("palisade: InvalidRequest: no tool \"nosuch\""),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn no_fork_leaves_threads_only() {
    let d = Daemon::start(&tool_config());
    let ws = TempDir::new("ws");
    let mut c = Client::connect(&d.socket).unwrap();
    // file_processor: no_fork. The first fork fails.
    let (out, r) = run(&mut c, tool_request(ws.path(), "convert", &["forkbomb"], &[]));
    assert_eq!(out, "err EPERM stopped after 0 forks\n", "{r:?}");
    // Counter-test: the same preset with no_fork = false forks until its limit.
    let (out, _) = run(&mut c, tool_request(ws.path(), "quiet", &["forkbomb"], &[]));
    assert!(out.starts_with("err EAGAIN stopped after"), "{out}");
}

#[test]
fn the_environment_capability_decides_what_the_command_sees() {
    let d = Daemon::start(&tool_config());
    let ws = TempDir::new("ws");
    let mut c = Client::connect(&d.socket).unwrap();
    let mut req = request(ws.path(), &["env"]);
    req.env.insert("LANG".into(), "C.UTF-8".into());
    req.env.insert("SECRET_TOKEN".into(), "hunter2".into());
    let (out, _) = run(&mut c, req.clone());
    let mut vars: Vec<&str> =
        out.trim_start_matches("ok ").lines().map(|l| l.split('=').next().unwrap()).collect();
    vars.sort();
    assert_eq!(vars, ["HOME", "LANG", "PATH"], "restricted: {out}");
    req.tool = Some("quiet".into());
    let (out, _) = run(&mut c, req);
    assert_eq!(out, "ok \n", "none: {out}");
}

#[test]
fn sensitive_entries_of_the_workspace_are_hidden_inside() {
    let d = Daemon::start("");
    let ws = TempDir::new("ws");
    std::fs::create_dir(ws.join(".ssh")).unwrap();
    std::fs::write(ws.join(".ssh/id_ed25519"), "private-key").unwrap();
    std::fs::write(ws.join(".netrc"), "machine x password y").unwrap();
    let key = ws.join(".ssh/id_ed25519").to_string_lossy().into_owned();
    assert!(probe_outside(&["read", &key]).unwrap().contains("private-key"));
    // Named directly, the path is refused by the policy.
    let o = d.run(ws.path(), &[&probe(), "read", &key]);
    assert!(text(&o.stderr).starts_with("palisade: WorkspaceScopeDenied: "), "{}", text(&o.stderr));
    // Reached by a walk the policy cannot foresee, the kernel hides it.
    std::fs::write(ws.join("visible.txt"), "fine").unwrap();
    let mut c = Client::connect(&d.socket).unwrap();
    let (out, r) = run(&mut c, request(ws.path(), &["readall", ws.path().to_str().unwrap()]));
    assert!(out.contains("visible.txt=fine"), "{out} {r:?}");
    assert!(!out.contains("private-key") && !out.contains("password"), "a secret was readable inside: {out}");
    assert!(out.contains(".ssh!EACCES") || out.contains(".ssh!EPERM"), "{out}");
    // Counter-test: the same walk outside reads them.
    let outside = probe_outside(&["readall", ws.path().to_str().unwrap()]).unwrap();
    assert!(outside.contains("private-key") && outside.contains("password"), "{outside}");

    // A workspace that holds the requester's home directory deeper down: that
    // home's secrets are hidden too.
    let above = TempDir::new("above");
    let home = above.join("users/someone");
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    std::fs::write(home.join(".aws/credentials"), "aws-secret").unwrap();
    std::fs::write(home.join("notes.txt"), "fine").unwrap();
    let mut req = request(above.path(), &["readall", above.path().to_str().unwrap()]);
    req.env.insert("HOME".into(), home.to_string_lossy().into_owned());
    let (out, r) = run(&mut c, req);
    assert!(out.contains("notes.txt=fine"), "{out} {r:?}");
    assert!(!out.contains("aws-secret"), "a secret was readable inside: {out}");
    let outside = probe_outside(&["readall", above.path().to_str().unwrap()]).unwrap();
    assert!(outside.contains("aws-secret"), "{outside}");
}

#[test]
fn network_deny_and_allow_all_differ_on_a_loopback_listener() {
    let (listener, addr) = loopback_listener();
    let d = Daemon::start(&tool_config());
    let ws = TempDir::new("ws");
    let mut c = Client::connect(&d.socket).unwrap();
    // Default profile: the preflight refuses a named host.
    let (out, r) = run(&mut c, request(ws.path(), &["connect", &addr]));
    assert_eq!((out.as_str(), r.map_err(|e| e.0)), ("", Err(ErrorKind::CapabilityDenied)));
    // network = deny without the preflight: the kernel refuses.
    let (out, r) = run(&mut c, tool_request(ws.path(), "netdeny", &["connect", &addr], &[]));
    assert!(out.starts_with("err "), "{out} {r:?}");
    // allow_all: the host network.
    let (out, r) = run(&mut c, tool_request(ws.path(), "netty", &["connect", &addr], &[]));
    assert_eq!(out, "ok \n", "{r:?} {}", d.log());
    listener.accept().unwrap();
}

/// A broker that acts as on a host without user namespaces, with `fallback`.
fn without_user_namespaces(fallback: &str, extra: &str) -> Daemon {
    Daemon::start(&format!("[broker]\nuser_namespaces = false\n[policy]\nfallback = \"{fallback}\"\n{extra}"))
}

#[test]
fn request_approval_puts_the_run_to_the_client_and_runs_it_in_tier_b_only_when_approved() {
    let d = without_user_namespaces("request_approval", "approval_timeout_secs = 2\n");
    let ws = TempDir::new("ws");
    let ws_path = shared_workspace(&ws, "w");
    let marker = ws_path.join("ran");
    let write = request(&ws_path, &["write", marker.to_str().unwrap()]);

    // Refused: nothing runs.
    let mut asked = Vec::new();
    let mut c = Client::connect(&d.socket).unwrap();
    let refused = c.run_with_approval(
        write.clone(),
        |_| {},
        |reason| {
            asked.push(reason.to_string());
            false
        },
    );
    match refused {
        Err(ClientError::Reply(e)) => {
            assert_eq!(e.kind, ErrorKind::NeedsApproval);
            assert!(e.message.contains("Not approved: refused"), "{}", e.message);
            assert_eq!(e.rule.as_deref(), Some("fallback.request_approval"));
            palisade_policy::denial::names_a_fix_or_why_none("fallback.request_approval", &e.message)
                .unwrap();
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(asked.len(), 1);
    assert!(asked[0].contains("Tier B"), "{asked:?}");
    assert!(!marker.exists());

    // Approved: it runs, in Tier B, and the attestation says so.
    let mut executor = None;
    let r = c
        .run_with_approval(
            write,
            |m| {
                if let ServerMessage::Started { executor: e, .. } = m {
                    executor = Some(*e)
                }
            },
            |_| true,
        )
        .unwrap();
    assert_eq!(r.status, RunStatus::Exited { code: 0 });
    assert_eq!((executor, r.attestation.executor), (Some(Executor::LinuxTierB), Executor::LinuxTierB));
    assert!(r.attestation.enforcement.namespaces.is_empty());
    assert!(marker.exists());

    // Unanswered: refused when the time is up.
    let mut raw = Client::connect(&d.socket).unwrap();
    raw.send(&ClientMessage::Run(request(&ws_path, &["echo", "x"]))).unwrap();
    assert!(matches!(raw.receive().unwrap(), ServerMessage::ApprovalRequired { .. }));
    match raw.receive().unwrap() {
        ServerMessage::Error(e) => assert!(e.message.contains("expired after 2 s"), "{}", e.message),
        other => panic!("{other:?}"),
    }

    // A command the pipeline refuses is refused outright, not put to anyone.
    let mut c = Client::connect(&d.socket).unwrap();
    let r = c.run_with_approval(request(&ws_path, &["read", "/etc/shadow"]), |_| {}, |_| panic!("asked"));
    assert!(matches!(r, Err(ClientError::Reply(e)) if e.kind == ErrorKind::WorkspaceScopeDenied));

    // Counter-test: with user namespaces, the same broker configuration asks nobody.
    let d = Daemon::start("[policy]\nfallback = \"request_approval\"\n");
    let mut c = Client::connect(&d.socket).unwrap();
    let r = c.run_with_approval(request(&ws_path, &["echo", "x"]), |_| {}, |_| panic!("asked")).unwrap();
    assert_eq!(r.attestation.executor, Executor::LinuxTierC);
}

#[test]
fn the_cli_asks_at_its_terminal_and_refuses_without_one() {
    use std::io::{BufRead, Write};
    let d = without_user_namespaces("request_approval", "");
    let ws = TempDir::new("ws");
    let ws_path = shared_workspace(&ws, "w");
    let cli = |controlling: Option<std::os::fd::OwnedFd>| {
        let mut cmd = std::process::Command::new(bin("palisade"));
        cmd.args(["run", "--socket", d.socket.to_str().unwrap(), "--", &probe(), "echo", "asked"])
            .current_dir(&ws_path)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        in_own_session(&mut cmd, controlling.as_ref().map(std::os::fd::AsRawFd::as_raw_fd));
        let child = cmd.spawn().unwrap();
        drop(controlling);
        child
    };
    // No controlling terminal: nobody to ask, so no.
    let o = cli(None).wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("NeedsApproval"), "{}", text(&o.stderr));
    assert!(o.stdout.is_empty());

    // A terminal: the question appears there, and "y" runs the command.
    let pty = nix::pty::openpty(None, None).unwrap();
    let child = cli(Some(pty.slave.try_clone().unwrap()));
    drop(pty.slave);
    let mut master = std::fs::File::from(pty.master);
    let mut reader = std::io::BufReader::new(master.try_clone().unwrap());
    let mut prompt = Vec::new();
    while !prompt.ends_with(b"[y/N] ") {
        let mut byte = [0u8; 1];
        std::io::Read::read_exact(&mut reader, &mut byte).unwrap();
        prompt.push(byte[0]);
    }
    assert!(text(&prompt).contains("Tier B"), "{}", text(&prompt));
    master.write_all(b"y\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(0), "ok asked\n"), "{}", text(&o.stderr));
    let _ = reader.fill_buf();
}

#[test]
fn warn_and_execute_runs_in_tier_b_says_so_and_still_kills_the_tree_at_the_deadline() {
    let d = without_user_namespaces("warn_and_execute", "");
    let ws = TempDir::new("ws");
    let ws_path = shared_workspace(&ws, "w");
    let mut c = Client::connect(&d.socket).unwrap();
    let (out, status) = run(&mut c, request(&ws_path, &["echo", "b"]));
    assert_eq!((out.as_str(), status), ("ok b\n", Ok(RunStatus::Exited { code: 0 })));
    let r = c.run(request(&ws_path, &["ns"]), |_| {}).unwrap();
    assert_eq!(r.attestation.executor, Executor::LinuxTierB);
    assert!(r.attestation.warnings.iter().any(|w| w.contains("Tier B")), "{:?}", r.attestation.warnings);
    // The deadline takes a double-forked, setsid sleeper with it, without namespaces.
    let tok = format!("palisade-tier-b-{}", std::process::id());
    let mut req = request(&ws_path, &["daemonize", &tok]);
    req.timeout_secs = Some(2);
    let (_, status) = run(&mut c, req);
    assert_eq!(status, Ok(RunStatus::TimedOut));
    assert!(
        eventually(std::time::Duration::from_secs(5), || process_with_token(&tok).is_none()),
        "a process of the Tier B sandbox outlived the deadline"
    );
}

/// `palisade explain --policy P -- args` in `cwd`, with `HOME` set to `home`.
fn explain_with_home(cwd: &Path, home: &Path, args: &[&str]) -> String {
    let policy = cwd.join("p.toml");
    std::fs::write(&policy, base_config()).unwrap();
    let o = std::process::Command::new(bin("palisade"))
        .args(["explain", "--policy", policy.to_str().unwrap(), "--"])
        .args(args)
        .current_dir(cwd)
        .env("HOME", home)
        .output()
        .unwrap();
    text(&o.stdout) + &text(&o.stderr)
}

/// Finding 12: the dynamic loader (`ld-linux-x86-64.so.2 /usr/bin/bash -c
/// ...`), `script -c` and `git -c alias.x='!cmd'` ran commands past the
/// interpreter deny-list. They are refused, a loader under another name too.
#[cfg(target_arch = "x86_64")]
#[test]
fn loaders_script_and_git_commands_in_arguments_are_refused() {
    let dir = TempDir::new("interp");
    let loader = std::path::PathBuf::from("/lib64/ld-linux-x86-64.so.2");
    let copy = dir.join("innocent");
    copy_executable(&loader, &copy);
    let out =
        explain_with_home(dir.path(), dir.path(), &[loader.to_str().unwrap(), "/usr/bin/bash", "-c", "id"]);
    assert!(out.contains("rule:     interpreters.loader"), "{out}");
    let out = explain_with_home(dir.path(), dir.path(), &[copy.to_str().unwrap(), "/usr/bin/true"]);
    assert!(out.contains("rule:     interpreters.loader"), "{out}");
    let out = explain_with_home(dir.path(), dir.path(), &["script", "-q", "-c", "id", "/dev/null"]);
    assert!(out.contains("rule:     interpreters.denied"), "{out}");
    let out = explain_with_home(dir.path(), dir.path(), &["git", "-c", "alias.x=!id", "x"]);
    assert!(out.contains("rule:     interpreters.denied"), "{out}");
    assert!(out.contains("git -c alias.x=!id runs a command given on the command line"), "{out}");
    // Counter-tests: the loader runs a program it is given; plain git runs.
    assert!(std::process::Command::new(&copy).arg("/usr/bin/true").status().unwrap().success());
    let out = explain_with_home(dir.path(), dir.path(), &["git", "-c", "alias.st=status", "st"]);
    assert!(out.starts_with("decision: allow"), "{out}");
}

/// Finding 13: common credentials were missing from the sensitive list
/// (`~/.config/gh`, `~/.npmrc`, `~/.cargo/credentials.toml`, ...). They are
/// refused when named and hidden inside a granted home; a project's own
/// `.npmrc` is left alone.
#[test]
fn common_credentials_are_refused_when_named_and_hidden_when_granted() {
    let home = TempDir::new("home");
    for (name, contents) in [
        (".config/gh/hosts.yml", "token"),
        (".npmrc", "//r/:_authToken=t"),
        (".cargo/credentials.toml", "t"),
        (".pgpass", "t"),
    ] {
        let path = home.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, contents).unwrap();
    }
    for name in [".config/gh/hosts.yml", ".npmrc", ".cargo/credentials.toml", ".pgpass"] {
        let path = home.join(name);
        let out = explain_with_home(home.path(), home.path(), &["cat", path.to_str().unwrap()]);
        assert!(out.contains("rule:     scope.sensitive_path"), "{name}: {out}");
        // Counter-test: the file is there and readable outside.
        assert!(std::fs::read(&path).is_ok());
    }
    // The home as a workspace: its credentials are hidden inside.
    let out = explain_with_home(home.path(), home.path(), &["ls"]);
    for name in [".config/gh", ".npmrc", ".cargo/credentials.toml", ".pgpass"] {
        assert!(out.contains(&format!("{}  hidden (sensitive)", home.join(name).display())), "{name}: {out}");
    }
    // A project's own .npmrc (its registry settings) is not a home's.
    let project = TempDir::new("project");
    std::fs::write(project.join(".npmrc"), "registry=https://r.example/").unwrap();
    let out =
        explain_with_home(project.path(), home.path(), &["cat", project.join(".npmrc").to_str().unwrap()]);
    assert!(out.starts_with("decision: allow"), "{out}");
}

/// The credential stores of common tools, in a home: hidden when the home
/// is the workspace, and under a granted parent of theirs (`~/.config`),
/// each read by a walk from inside; the same walk outside reads them all.
#[test]
fn a_homes_credential_stores_are_hidden_as_the_workspace_and_under_a_granted_parent() {
    let home = TempDir::new("home");
    let d = Daemon::start("");
    let stores = [
        ".gitconfig",
        ".config/git/config",
        ".config/git/credentials",
        ".config/pip/pip.conf",
        ".config/containers/auth.json",
        ".config/gh/hosts.yml",
        ".m2/settings.xml",
        ".gradle/gradle.properties",
        ".yarnrc.yml",
        ".git-credentials",
        ".npmrc",
    ];
    for (i, name) in stores.iter().enumerate() {
        let path = home.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("stored-secret-{i}")).unwrap();
    }
    std::fs::write(home.join(".config/plain.txt"), "fine").unwrap();
    let secrets = |out: &str| -> Vec<&str> {
        stores
            .iter()
            .enumerate()
            .filter(|(i, _)| out.contains(&format!("stored-secret-{i}")))
            .map(|(_, n)| *n)
            .collect()
    };
    let outside = probe_outside(&["readall", home.path().to_str().unwrap()]).unwrap();
    assert_eq!(secrets(&outside), stores, "outside, every store is read: {outside}");
    let mut c = Client::connect(&d.socket).unwrap();
    let mut req = request(home.path(), &["readall", home.path().to_str().unwrap()]);
    req.env.insert("HOME".into(), home.path().to_string_lossy().into_owned());
    let (out, r) = run(&mut c, req);
    assert!(out.contains("plain.txt=fine"), "{out} {r:?}");
    assert_eq!(secrets(&out), Vec::<&str>::new(), "the home as the workspace: {out}");
    // A granted parent inside the home: `~/.config` as the workspace.
    let config = home.join(".config");
    let mut req = request(&config, &["readall", config.to_str().unwrap()]);
    req.env.insert("HOME".into(), home.path().to_string_lossy().into_owned());
    let (out, r) = run(&mut c, req);
    assert!(out.contains("plain.txt=fine"), "{out} {r:?}");
    assert_eq!(secrets(&out), Vec::<&str>::new(), "under a granted ~/.config: {out}");
}

/// As root, the same file again as the unprivileged test user.
#[test]
fn the_policy_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_policy_suite_passes_as_an_unprivileged_user");
}
