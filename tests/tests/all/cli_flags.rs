//! What `palisade run`'s flags let a run do. With an embedded broker the
//! flags edit the default profile (the person running the CLI owns the
//! policy); through a daemon they can only narrow the daemon's policy, and
//! a flag that would widen it is refused, naming the flag and the key. The
//! common work of an agent (a shell line, Python, make, Node) runs and
//! exits with its own status. As root the file runs again as the
//! unprivileged test user.

use palisade_tests::*;

/// `palisade run <pre> -- <args>` in `ws`, with an embedded broker under
/// the built-in policy (nothing answers on the socket it would try).
fn embedded(ws: &TempDir, pre: &[&str], args: &[&str]) -> std::process::Output {
    let mut argv = vec!["run", "--policy", "/dev/null"];
    argv.extend_from_slice(pre);
    palisade_cli(ws.path(), &argv, args, None)
}

fn status(o: &std::process::Output) -> (Option<i32>, String, String) {
    (o.status.code(), text(&o.stdout), text(&o.stderr))
}

/// A workspace with a Python script, a Makefile with a shell recipe and a
/// Node script, each ending with a status of its own.
fn project() -> TempDir {
    let ws = TempDir::new("flags");
    std::fs::write(ws.join("t.py"), "import sys\nprint('py', sys.argv[1:])\nsys.exit(4)\n").unwrap();
    std::fs::write(
        ws.join("Makefile"),
        "all:\n\t@echo built && test -f t.py\nbad:\n\t@echo failing; exit 5\n",
    )
    .unwrap();
    std::fs::write(ws.join("t.js"), "console.log('node', typeof process.version); process.exit(6)\n")
        .unwrap();
    ws
}

#[test]
fn interpreters_and_inline_code_run_when_the_flags_allow_them() {
    let ws = project();
    // Refused by the default profile, with the reason.
    let (code, out, err) = status(&embedded(&ws, &[], &["sh", "-c", "echo hi"]));
    assert_eq!((code, out.as_str()), (Some(125), ""));
    assert!(err.contains("interpreters are not allowed"), "{err}");
    let (code, _, err) = status(&embedded(&ws, &["--allow-interpreters"], &["sh", "-c", "echo hi"]));
    assert_eq!(code, Some(125));
    assert!(err.contains("inline code is not allowed"), "{err}");
    let both = ["--allow-interpreters", "--allow-inline-code"];
    assert_eq!(status(&embedded(&ws, &both, &["sh", "-c", "echo hi; exit 3"])).0, Some(3));
    assert_eq!(text(&embedded(&ws, &both, &["sh", "-c", "echo hi"]).stdout), "hi\n");
    let o = embedded(&ws, &both, &["python3", "-c", "import sys; print(2 + 2); sys.exit(7)"]);
    assert_eq!(status(&o).0, Some(7), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "4\n");
}

#[test]
fn common_work_runs_and_exits_with_its_own_status() {
    let ws = project();
    let allow = ["--allow-interpreters"];
    let (code, out, err) = status(&embedded(&ws, &allow, &["python3", "t.py", "a"]));
    assert_eq!((code, out.as_str()), (Some(4), "py ['a']\n"), "{err}");
    let (code, out, err) = status(&embedded(&ws, &allow, &["make"]));
    assert_eq!((code, out.as_str()), (Some(0), "built\n"), "{err}");
    let (code, out, err) = status(&embedded(&ws, &allow, &["make", "bad"]));
    assert_eq!((code, out.as_str()), (Some(2), "failing\n"), "{err}");
    assert!(err.contains("Error 5"), "{err}");
    // V8 reserves about 768 MiB of address space before it runs: the
    // default memory limit (512 MiB, RLIMIT_DATA where no cgroup holds it)
    // leaves it room.
    let (code, out, err) = status(&embedded(&ws, &allow, &["node", "t.js"]));
    assert_eq!((code, out.as_str()), (Some(6), "node string\n"), "{err}");
}

#[test]
fn a_directory_outside_the_workspace_is_reached_only_where_a_flag_grants_it() {
    let ws = TempDir::new("flags-ws");
    let cache = TempDir::new("flags-cache");
    std::fs::write(cache.join("entry"), "cached\n").unwrap();
    let entry = cache.join("entry").to_string_lossy().into_owned();
    // Counter-test: outside the sandbox it is there.
    assert_eq!(std::fs::read_to_string(&entry).unwrap(), "cached\n");
    let (code, out, err) = status(&embedded(&ws, &[], &["cat", &entry]));
    assert_eq!((code, out.as_str()), (Some(125), ""));
    assert!(err.contains("outside the allowed roots"), "{err}");
    let dir = cache.path().to_str().unwrap();
    let (code, out, err) = status(&embedded(&ws, &["--read-only", dir], &["cat", &entry]));
    assert_eq!((code, out.as_str()), (Some(0), "cached\n"), "{err}");
    let written = cache.join("written").to_string_lossy().into_owned();
    let o = embedded(&ws, &["--read-only", dir], &["cp", &entry, &written]);
    assert_ne!(o.status.code(), Some(0));
    assert!(!cache.join("written").exists());
    let o = embedded(&ws, &["--read-write", dir], &["cp", &entry, &written]);
    assert_eq!(status(&o).0, Some(0), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "cached\n");
}

#[test]
fn variables_limits_and_fork_follow_the_flags() {
    let ws = TempDir::new("flags-env");
    assert_eq!(status(&embedded(&ws, &[], &["printenv", "PALISADE_FLAG_TEST"])).0, Some(1));
    let o = embedded(&ws, &["--env", "PALISADE_FLAG_TEST=given"], &["printenv", "PALISADE_FLAG_TEST"]);
    assert_eq!(status(&o), (Some(0), "given\n".into(), String::new()));
    let o = embedded(&ws, &["--env", "PALISADE_FLAG_UNSET"], &["true"]);
    assert!(text(&o.stderr).contains("PALISADE_FLAG_UNSET is not set here"), "{}", text(&o.stderr));
    // Forking: allowed by default, refused with --no-fork.
    let shell = ["--allow-interpreters", "--allow-inline-code"];
    let o = embedded(&ws, &shell, &["sh", "-c", "/bin/true && echo forked"]);
    assert_eq!(text(&o.stdout), "forked\n", "{}", text(&o.stderr));
    let o = embedded(&ws, &[&shell[..], &["--no-fork"]].concat(), &["sh", "-c", "/bin/true && echo forked"]);
    assert!(o.stdout.is_empty() && text(&o.stderr).contains("fork"), "{}", text(&o.stderr));
    // The attestation's limits are the flags'.
    let o = embedded(&ws, &["--json", "--memory", "100", "--processes", "7"], &["true"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rlimits = v["result"]["attestation"]["enforcement"]["rlimits"].as_array().unwrap().clone();
    let limit = |name: &str| rlimits.iter().find(|r| r["name"] == name).and_then(|r| r["hard"].as_u64());
    assert_eq!((limit("DATA"), limit("NPROC")), (Some(100 << 20), Some(7)), "{rlimits:?}");
}

#[test]
fn through_a_daemon_the_flags_only_narrow_its_policy() {
    // Requests that only narrow, as a system broker's, or (run as the test user) a user's with
    // owner_widens = false.
    let d = Daemon::start(
        "[profiles.py]\nallow_interpreters = true\nmax_memory_mb = 256\n[broker]\nowner_widens = false\n",
    );
    let ws = project();
    let via = |pre: &[&str], args: &[&str]| {
        let mut argv = vec!["run", "--socket", d.socket.to_str().unwrap()];
        argv.extend_from_slice(pre);
        status(&palisade_cli(ws.path(), &argv, args, None))
    };
    for (flags, named) in [
        (&["--allow-interpreters"][..], "[defaults] allow_interpreters = true"),
        (&["--memory", "4096"][..], "[defaults] max_memory_mb = 4096"),
        (&["--processes", "100000"][..], "[defaults] max_processes = 100000"),
        (&["--read-only", "/var/lib"][..], "[defaults] read_only = [\"/var/lib\"]"),
        (&["--env", "TERM_PROGRAM=x"][..], "[defaults] pass_env = [\"TERM_PROGRAM\"]"),
        (&["--profile", "py", "--memory", "512"][..], "[profiles.py] max_memory_mb = 512"),
        (&["--timeout", "4000"][..], "[defaults] max_execution_time = 4000"),
        (&["--max-output", "999999999999"][..], "[defaults] max_output_bytes = 999999999999"),
    ] {
        let (code, out, err) = via(flags, &["python3", "t.py"]);
        assert_eq!((code, out.as_str()), (Some(125), ""), "{flags:?}");
        let flag = if flags[0] == "--profile" { flags[2] } else { flags[0] };
        assert!(err.starts_with("palisade: CapabilityDenied: "), "{flags:?}: {err}");
        assert!(err.contains(&format!("({flag})")) && err.contains(named), "{flags:?}: {err}");
    }
    // What the policy allows, the flags may ask for.
    let (code, out, err) =
        via(&["--profile", "py", "--allow-interpreters", "--memory", "200"], &["python3", "t.py"]);
    assert_eq!((code, out.as_str()), (Some(4), "py []\n"), "{err}");
    let (code, _, err) = via(&["--profile", "nope"], &["true"]);
    assert_eq!(code, Some(125));
    assert!(err.contains("no profile \"nope\" is declared (declared: py)"), "{err}");
}

#[test]
fn explain_asks_the_daemon_and_says_which_policy_decided() {
    let d = Daemon::start("[profiles.py]\nallow_interpreters = true\n[broker]\nowner_widens = false\n");
    let ws = project();
    let socket = d.socket.to_str().unwrap();
    let explain = |pre: &[&str]| {
        let mut argv = vec!["explain"];
        argv.extend_from_slice(pre);
        status(&palisade_cli(ws.path(), &argv, &["python3", "t.py"], None))
    };
    let config = d.dir.join("palisade.toml");
    let by_daemon = format!("policy:   {} (the broker on {socket})\n", config.display());
    let (code, out, err) = explain(&["--socket", socket, "--profile", "py", "--allow-interpreters"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.starts_with("decision: allow") && out.ends_with(&by_daemon), "{out}");
    let (code, out, _) = explain(&["--socket", socket]);
    assert_eq!(code, Some(1));
    assert!(out.contains("rule:     interpreters.denied") && out.ends_with(&by_daemon), "{out}");
    // A widening flag is the daemon's to refuse, as for a run.
    let (code, out, _) = explain(&["--socket", socket, "--allow-interpreters"]);
    assert_eq!(code, Some(1));
    assert!(out.contains("rule:     request.widens"), "{out}");
    // Here, the flags edit the policy that decides.
    let (code, out, _) = explain(&["--policy", "/dev/null", "--allow-interpreters"]);
    assert_eq!(code, Some(0));
    assert!(out.ends_with("policy:   /dev/null (decided here)\n"), "{out}");
}

/// `palisade explain` takes `palisade run`'s flags, `--timeout` and
/// `--max-output` among them: here they raise the embedded broker's
/// deadline and quota as a run's would (past the ceiling: refused, naming
/// it); through a daemon the request carries them, as a run's.
#[test]
fn explain_takes_the_limit_flags_of_run() {
    let ws = project();
    let explain = |pre: &[&str]| {
        let mut argv = vec!["explain"];
        argv.extend_from_slice(pre);
        status(&palisade_cli(ws.path(), &argv, &["true"], None))
    };
    let (code, out, err) = explain(&["--policy", "/dev/null", "--timeout", "400", "--max-output", "1000"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("deadline: 400 s; output quota 1000 bytes"), "{out}");
    let (code, _, err) = explain(&["--policy", "/dev/null", "--timeout", "4000"]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("--timeout 4000 is above the profile's ceiling of 3600"), "{err}");
    let d = Daemon::start("");
    let (code, out, err) = explain(&["--socket", d.socket.to_str().unwrap(), "--timeout", "30"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("deadline: 30 s;"), "{out}");
}

/// As root, the same file again as the unprivileged test user.
#[test]
fn the_flags_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_flags_suite_passes_as_an_unprivileged_user");
}

/// A toolchain installed under a home (pyenv-shaped: a venv in the
/// workspace whose python links to pyenv's; nvm-shaped: a script whose `#!`
/// names nvm's node) is visible to the command that runs through it, read
/// only; without toolchains the command is refused before it runs, naming
/// the interpreter and the `--read-only` that would show it. Outside a
/// sandbox both run, and write their installation (the interpreters here
/// are shell scripts standing in for python and node, which try to).
#[test]
fn a_toolchain_under_a_home_is_visible_to_the_command_that_runs_through_it() {
    let (home, ws) = (TempDir::new("home"), TempDir::new("toolchain"));
    let stand_in = |name: &str| {
        format!(
            "#!/bin/sh\necho \"{name} ran $*\"\n\
             if echo x >> \"$(dirname \"$(readlink -f \"$0\")\")/../written\" 2>/dev/null; then echo wrote its installation; fi\n"
        )
    };
    let python = home.join(".pyenv/versions/3.12.1/bin/python3.12");
    write_executable(&python, stand_in("pyenv python"));
    std::fs::create_dir_all(ws.join(".venv/bin")).unwrap();
    std::os::unix::fs::symlink(&python, ws.join(".venv/bin/python")).unwrap();
    write_executable(&ws.join(".venv/bin/pytest"), format!("#!{}\n", ws.join(".venv/bin/python").display()));
    let node = home.join(".nvm/versions/node/v20.11.0/bin/node");
    write_executable(&node, stand_in("nvm node"));
    write_executable(&ws.join("tool.js"), format!("#!{}\n", node.display()));
    let pyenv = (home.join(".pyenv"), home.join(".pyenv/versions/3.12.1/written"));
    let nvm = (home.join(".nvm/versions/node/v20.11.0"), home.join(".nvm/versions/node/v20.11.0/written"));
    for (command, ran, (root, written)) in
        [(".venv/bin/pytest", "pyenv python ran", pyenv), ("./tool.js", "nvm node ran", nvm)]
    {
        let outside = std::process::Command::new(ws.join(command)).arg("-q").output().unwrap();
        assert!(text(&outside.stdout).contains(&format!("{ran} ")), "outside: {outside:?}");
        assert!(text(&outside.stdout).contains("wrote its installation"), "outside: {outside:?}");
        std::fs::remove_file(&written).unwrap();
        let (code, out, err) = status(&embedded(&ws, &["--allow-interpreters"], &[command, "-q"]));
        assert_eq!(code, Some(0), "{command}: {err}");
        assert!(out.contains(ran) && out.contains("-q"), "{command}: {out}");
        // Read-only: the run cannot change the toolchain.
        assert!(!out.contains("wrote") && !written.exists(), "{command}: {out}");
        let (code, _, err) = status(&embedded(&ws, &["--allow-interpreters", "--no-toolchains"], &[command]));
        assert_eq!(code, Some(125), "{command}: {err}");
        let show = format!("--read-only {}", root.canonicalize().unwrap().display());
        assert!(err.contains("PolicyDenied") && err.contains("does not see") && err.contains(&show), "{err}");
        palisade_policy::denial::names_a_fix_or_why_none("executables.interpreter_hidden", &err).unwrap();
    }
}

/// The requester's git identity reaches the run (the sandbox's home is the
/// workspace, so git would not find `~/.gitconfig`): `git commit` works
/// and records it. Nothing else of the configuration comes along: its
/// credential helper, which git outside a sandbox finds, is not there.
/// Where the profile says no, the commit fails as it would without one.
#[test]
fn a_commit_in_a_run_carries_the_requesters_git_identity_and_nothing_else() {
    let (home, ws) = (TempDir::new("home"), TempDir::new("git"));
    std::fs::write(
        home.join(".gitconfig"),
        "[user]\n\tname = Ada Lovelace\n\temail = ada@example.org\n[credential]\n\thelper = store\n",
    )
    .unwrap();
    let outside = std::process::Command::new("git")
        .args(["config", "--global", "credential.helper"])
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert_eq!(text(&outside.stdout).trim(), "store", "outside: {outside:?}");
    let script = "git init -q . && git -c commit.gpgsign=false commit -q --allow-empty -m first \
                  && git log -1 --format='%an <%ae> %cn'; echo helper=$(git config credential.helper)";
    let run = |policy: &str| {
        let (_journal, path) = scratch_journal(None);
        let o = std::process::Command::new(bin("palisade"))
            .args(["run", "--policy", policy, "--allow-interpreters", "--allow-inline-code", "--"])
            .args(["/bin/sh", "-c", script])
            .current_dir(ws.path())
            .env("HOME", home.path())
            .env("PALISADE_STATE", state_beside(&path))
            .env("PALISADE_JOURNAL", path)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(ws.join(".git"));
        o
    };
    let (code, out, err) = status(&run("/dev/null"));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("Ada Lovelace <ada@example.org> Ada Lovelace"), "{out}");
    assert!(out.contains("helper=\n"), "the credential helper reached the run: {out}");
    let no = ws.join("no-identity.toml");
    std::fs::write(&no, "[defaults]\ngit_identity = false\n").unwrap();
    let (_, out, err) = status(&run(no.to_str().unwrap()));
    assert!(!out.contains("Ada Lovelace"), "{out}");
    assert!(err.contains("Author identity unknown") || err.contains("empty ident"), "{err}");
}

/// Every refusal a flag or a key could lift ends with the fix: with an
/// embedded broker (the person's own policy) the flag and the key, in
/// those words; through a daemon, whose policy a request can only narrow,
/// that its policy does not allow it and the key an operator would set. A
/// refusal nothing lifts says so, and an inline script is never shown as
/// a path. Each command runs outside a sandbox (the refusal is the
/// policy's, not the command failing).
#[test]
fn a_refusal_names_its_fix_embedded_and_through_a_daemon() {
    // A daemon whose requests only narrow, as a system broker's (run as root here) and a
    // user's with owner_widens = false.
    let d = Daemon::start("[broker]\nowner_widens = false\n");
    let ws = project();
    let cases: [(&[&str], &[&str], &str, &str); 4] = [
        (&[], &["python3", "t.py"], "--allow-interpreters", "allow_interpreters = true"),
        (
            &["--allow-interpreters"],
            &["python3", "-c", "print(1)"],
            "--allow-inline-code",
            "allow_inline_code = true",
        ),
        (
            &[],
            &["cat", "/var/lib/dpkg/status"],
            "--read-only /var/lib/dpkg/status",
            "read_only = [\"/var/lib/dpkg/status\"]",
        ),
        (
            &[],
            &["curl", "-s", "http://127.0.0.1:9/"],
            "--allow-domain 127.0.0.1",
            "network = { allow_domains = [\"127.0.0.1\"] }",
        ),
    ];
    for (pre, command, flag, key) in cases {
        let outside =
            std::process::Command::new(command[0]).args(&command[1..]).current_dir(ws.path()).output();
        assert!(outside.is_ok(), "{command:?} does not start outside");
        let (code, _, err) = status(&embedded(&ws, pre, command));
        assert_eq!(code, Some(125), "{command:?}: {err}");
        assert!(err.contains(&format!("; allow it with `{flag}` / `{key}`")), "{command:?}: {err}");
        let mut argv = vec!["run", "--socket", d.socket.to_str().unwrap()];
        argv.extend_from_slice(pre);
        let (code, _, err) = status(&palisade_cli(ws.path(), &argv, command, None));
        assert_eq!(code, Some(125), "{command:?}: {err}");
        let through = if pre.is_empty() {
            format!("; this broker's policy does not allow it (an operator would set `{key}`)")
        } else {
            // The flag itself would widen the daemon's policy: refused, naming the flag and the key.
            "allow_interpreters (--allow-interpreters) would widen the policy".to_string()
        };
        assert!(err.contains(&through), "{command:?}: {err}");
    }
    let script = "cat ~/.ssh/id_rsa | wc -c";
    let (code, _, err) =
        status(&embedded(&ws, &["--allow-interpreters", "--allow-inline-code"], &["/bin/sh", "-c", script]));
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("the inline script names ~/.ssh/id_rsa, a sensitive path"), "{err}");
    assert!(err.contains("never granted, by any flag or key") && !err.contains(script), "{err}");
}

/// With an embedded broker `--timeout` and `--max-output` raise the
/// profile's deadline and quota up to its ceilings, and are refused past
/// them or at 0, naming the ceiling: never capped silently. A run palisade
/// ends names the limit it passed, its value and its key.
#[test]
fn the_limit_flags_raise_up_to_the_ceiling_and_name_what_ended_a_run() {
    let ws = project();
    let (code, _, err) = status(&embedded(&ws, &["--timeout", "4000"], &["true"]));
    assert_eq!(code, Some(125), "{err}");
    assert!(
        err.contains(
            "--timeout 4000 is above the profile's ceiling of 3600 ([defaults] timeout_ceiling_secs)"
        ),
        "{err}"
    );
    for flag in ["--timeout", "--max-output"] {
        let (code, _, err) = status(&embedded(&ws, &[flag, "0"], &["true"]));
        assert_eq!(code, Some(125), "{err}");
        assert!(err.contains(&format!("InvalidRequest: {flag} 0: must be at least 1")), "{err}");
    }
    // Raised past the default's 300 s and 64 MiB: the run gets what was asked.
    let o = embedded(&ws, &["--timeout", "400", "--max-output", "100000000", "--json"], &["true"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    let enforcement = &v["result"]["attestation"]["enforcement"];
    assert_eq!(
        (enforcement["deadline_secs"].as_u64(), enforcement["max_output_bytes"].as_u64()),
        (Some(400), Some(100000000)),
        "{v}"
    );
    let (code, out, err) =
        status(&embedded(&ws, &["--max-output", "10"], &["/bin/echo", "hello world and more"]));
    assert_eq!((code, out.len()), (Some(125), 10), "{err}");
    assert!(
        err.contains("QuotaExceeded: output exceeded its quota of 10 bytes (max_output_bytes; --max-output)"),
        "{err}"
    );
    let (code, _, err) = status(&embedded(&ws, &["--timeout", "1"], &["/bin/sleep", "30"]));
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("TimedOut: killed at the deadline of 1 s (max_execution_time; --timeout)"), "{err}");
}

/// `palisade run --json` read by a reader that leaves (`| head`) ends
/// quietly, as SIGPIPE ends other tools, with no panic; a run interrupted
/// (^C) exits 130 and its result says `cancelled`.
#[test]
fn a_closed_pipe_ends_quietly_and_an_interrupt_exits_130() {
    let ws = project();
    let (_journal, path) = scratch_journal(None);
    let (out, err) =
        piped_into(&ws, &path, "run --policy /dev/null --json -- /usr/bin/seq 1 200000", "head -c 10");
    assert_eq!(out.trim(), "status=141", "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // A sleep of its own length: the token that finds its process.
    let token = format!("29.{}", std::process::id());
    let child = std::process::Command::new(bin("palisade"))
        .args(["run", "--policy", "/dev/null", "--json", "--", "/bin/sleep", &token])
        .current_dir(ws.path())
        .env("PALISADE_STATE", state_beside(&path))
        .env("PALISADE_JOURNAL", &path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    // Once the command runs (its sleep is a process of the sandbox's).
    let sleeping = format!("/bin/sleep\0{token}\0");
    let sleeps = || {
        let mut procs = std::fs::read_dir("/proc").into_iter().flatten().flatten();
        procs.any(|p| std::fs::read(p.path().join("cmdline")).is_ok_and(|c| c == sleeping.as_bytes()))
    };
    let started = eventually(std::time::Duration::from_secs(10), sleeps);
    assert!(started, "the run never started");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
}

/// A reader of the output that leaves (`palisade run ... | head`) ends the
/// run, as SIGPIPE ends a command whose reader left: palisade exits as
/// SIGPIPE would (141 to the shell) where the run, a line every 50 ms,
/// would otherwise go on to its deadline (30 s: then the status would be
/// 125, TimedOut), and what the run wrote is held, as a cancelled run's
/// writes are, and said on stderr. Through a daemon and with an embedded
/// broker.
#[test]
fn a_reader_that_leaves_ends_the_run_and_its_writes_are_held() {
    let ws = project();
    let d = Daemon::start("[profiles.sh]\nallow_interpreters = true\nallow_inline_code = true\n");
    let (_journal, path) = scratch_journal(None);
    let routes = [
        format!("--socket {} --profile sh", d.socket.display()),
        "--policy /dev/null --allow-interpreters --allow-inline-code".to_string(),
    ];
    for route in routes {
        let writer = "/bin/sh -c 'echo kept > written.txt; while :; do echo line; sleep 0.05; done'";
        let (out, err) =
            piped_into(&ws, &path, &format!("run {route} --timeout 30 -- {writer}"), "head -n 1");
        assert_eq!(out.trim(), "status=141", "{route}: {err}");
        assert!(err.contains("changes held as"), "{route}: {err}");
        assert!(!err.contains("interrupted"), "{route}: {err}");
        assert!(!ws.join("written.txt").exists(), "{route}: the cancelled run's write was applied");
    }
}

/// `palisade ARGS | READER` by bash in `ws` (the journal at `journal`, the
/// state beside it), under an outer bound of two minutes: bash's stdout,
/// `status=` palisade's exit status as the shell saw it, and its stderr.
fn piped_into(ws: &TempDir, journal: &std::path::Path, args: &str, reader: &str) -> (String, String) {
    let shell = format!(
        "timeout 120 {} {args} | {reader} >/dev/null; echo status=${{PIPESTATUS[0]}}",
        bin("palisade").display()
    );
    let o = std::process::Command::new("/bin/bash")
        .args(["-c", &shell])
        .current_dir(ws.path())
        .env("PALISADE_STATE", state_beside(journal))
        .env("PALISADE_JOURNAL", journal)
        .output()
        .unwrap();
    (text(&o.stdout), text(&o.stderr))
}

/// `palisade tools show --policy FILE` names a Draft tool's approval with
/// the same `--policy`: the hint works as printed.
#[test]
fn the_approval_hint_of_a_tool_keeps_its_policy() {
    let ws = project();
    let policy = ws.join("tools.toml");
    std::fs::write(&policy, "[tools.lint]\npreset = \"code_analyzer\"\n").unwrap();
    let (_journal, path) = scratch_journal(None);
    let o = std::process::Command::new(bin("palisade"))
        .args(["tools", "show", "--policy", policy.to_str().unwrap()])
        .current_dir(ws.path())
        .env("PALISADE_STATE", state_beside(&path))
        .env("PALISADE_JOURNAL", &path)
        .output()
        .unwrap();
    let (code, out, err) = status(&o);
    assert_eq!(code, Some(0), "{err}");
    let hint = format!("approve it (an approver): palisade tools approve lint --policy {}", policy.display());
    assert!(out.contains("tool lint: draft") && out.contains(&hint), "{out}");
}

/// `palisade tools list` (what `palisade tools` alone does) prints a line
/// a declared tool, and with `--json` an array of each tool's fields (an
/// error as `{"error": ...}`): under a policy file here, and a daemon's.
#[test]
fn tools_list_prints_each_declared_tool_and_json_when_asked() {
    let ws = project();
    let policy = ws.join("tools.toml");
    std::fs::write(
        &policy,
        "[tools.lint]\npreset = \"code_analyzer\"\n[tools.fmt]\npreset = \"file_processor\"\n",
    )
    .unwrap();
    let p = policy.to_str().unwrap();
    for argv in [&["tools", "list", "--policy", p][..], &["tools", "--policy", p]] {
        let (code, out, err) = status(&palisade_plain(ws.path(), argv));
        assert_eq!(code, Some(0), "{argv:?}: {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(
            lines[0].starts_with("fmt: draft (capabilities ") && lines[1].starts_with("lint: draft"),
            "{out}"
        );
    }
    let listed = json_of(&palisade_plain(ws.path(), &["tools", "list", "--json", "--policy", p]));
    let tools = listed.as_array().unwrap_or_else(|| panic!("{listed}"));
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["fmt", "lint"], "{listed}");
    for t in tools {
        assert_eq!((t["stage"].as_str(), t["trial_successes"].as_u64()), (Some("draft"), Some(0)), "{t}");
        assert_eq!(t["capabilities_sha256"].as_str().map(str::len), Some(64), "{t}");
        assert!(t["declaration"].as_str().is_some_and(|d| d.contains("preset: ")), "{t}");
    }
    let o = palisade_plain(ws.path(), &["tools", "show", "nope", "--json", "--policy", p]);
    assert_eq!((o.status.code(), json_of(&o)["error"]["kind"].as_str()), (Some(125), Some("InvalidRequest")));
    // A daemon's: its stages off, each tool untracked.
    let d = Daemon::start("[tools.lint]\npreset = \"code_analyzer\"\n");
    let listed =
        json_of(&palisade_plain(ws.path(), &["tools", "--json", "--socket", d.socket.to_str().unwrap()]));
    assert_eq!(
        (listed[0]["name"].as_str(), listed[0]["stage"].as_str()),
        (Some("lint"), Some("untracked")),
        "{listed}"
    );
}

/// `palisade CMD ARGS`, no command after `--`, with the environment of
/// [`palisade_cli`]; the output.
fn palisade_plain(cwd: &std::path::Path, args: &[&str]) -> std::process::Output {
    let (_journal, path) = scratch_journal(None);
    std::process::Command::new(bin("palisade"))
        .args(args)
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .env("PALISADE_STATE", state_beside(&path))
        .env("PALISADE_JOURNAL", path)
        .output()
        .unwrap()
}

/// One JSON object (or array) on stdout, whatever the exit status.
fn json_of(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&o.stdout), text(&o.stderr)))
}

/// `doctor`, `explain`, `approvals`, `changes` and `audit` print JSON with
/// `--json`, errors included (`{"error": {"kind", "message"}}`), where
/// without it they print text for a person.
#[test]
fn the_report_commands_print_json_when_asked() {
    let d = Daemon::start("[profiles.py]\nallow_interpreters = true\n");
    let ws = project();
    let socket = d.socket.to_str().unwrap();
    let doctor = palisade_plain(ws.path(), &["doctor", "--json"]);
    let v = json_of(&doctor);
    assert_eq!(v["complete"].as_bool().map(|c| if c { 0 } else { 1 }), doctor.status.code(), "{v}");
    assert!(v["tier"].as_str().is_some_and(|t| t.starts_with("linux-tier")), "{v}");
    assert!(!text(&palisade_plain(ws.path(), &["doctor"]).stdout).starts_with('{'));

    let explain = |pre: &[&str]| palisade_cli(ws.path(), pre, &["python3", "t.py"], None);
    let o = explain(&["explain", "--json", "--socket", socket, "--profile", "py"]);
    let v = json_of(&o);
    assert_eq!((o.status.code(), v["decision"].as_str()), (Some(0), Some("allow")), "{v}");
    assert_eq!(v["by"], format!("the broker on {socket}"), "{v}");
    let o = explain(&["explain", "--json", "--socket", socket]);
    let v = json_of(&o);
    assert_eq!((o.status.code(), v["rule"].as_str()), (Some(1), Some("interpreters.denied")), "{v}");
    let missing = ws.join("no-broker.sock");
    let o = explain(&["explain", "--json", "--socket", missing.to_str().unwrap()]);
    let v = json_of(&o);
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(o.status.code() == Some(125) && message.contains("no-broker.sock"), "{v}");

    let o = palisade_plain(ws.path(), &["approvals", "--json", "--socket", socket]);
    assert_eq!((o.status.code(), json_of(&o)), (Some(0), serde_json::json!([])));
    for command in ["approvals", "status"] {
        let o = palisade_plain(ws.path(), &[command, "--json", "--socket", missing.to_str().unwrap()]);
        assert!(o.status.code() == Some(125) && json_of(&o)["error"]["kind"].is_string(), "{o:?}");
    }
    let o = palisade_plain(ws.path(), &["changes", "list", "--json", "--socket", socket]);
    assert!(o.status.success() && json_of(&o).is_array(), "{o:?}");
    let o = palisade_plain(ws.path(), &["changes", "show", "nope", "--json", "--socket", socket]);
    let v = json_of(&o);
    assert_eq!((o.status.code(), v["error"]["kind"].as_str()), (Some(125), Some("InvalidRequest")), "{v}");
    let journal = d.journal();
    let o = palisade_plain(ws.path(), &["audit", "head", "--json", "--journal", journal.to_str().unwrap()]);
    let v = json_of(&o);
    assert!(o.status.success() && v["seq"].is_u64() && v["hash"].is_string(), "{v}");
    for audit in ["head", "verify", "tail"] {
        let o = palisade_plain(ws.path(), &["audit", audit, "--json", "--journal", "/nonexistent/journal"]);
        assert_eq!(json_of(&o)["error"]["kind"], "JournalUnavailable", "{audit}: {o:?}");
    }
    let o = palisade_plain(
        ws.path(),
        &["audit", "verify", "--json", "--head", "nope", "--journal", journal.to_str().unwrap()],
    );
    assert_eq!(json_of(&o)["error"]["kind"], "InvalidRequest", "{o:?}");
    // A broker's refusal comes as it was given, its rule with it.
    let o = palisade_plain(ws.path(), &["changes", "show", "nope", "--json", "--socket", socket]);
    assert_eq!(json_of(&o)["error"]["rule"], "changes.unknown", "{o:?}");
}

/// A user's own daemon serves its owner, whose configuration it is: the
/// owner's flags widen the profile as they widen an embedded broker's (up
/// to the profile's ceilings, past which the refusal names the ceiling),
/// unless `[broker] owner_widens = false`; another user's requests (root,
/// let in by `allowed_uids`) only narrow.
#[test]
fn a_users_own_daemon_lets_its_owner_widen_as_the_embedded_broker_does() {
    let user = if is_root() { Some(test_user()) } else { None };
    let dir = TempDir::new("owner");
    let ws = shared_workspace(&dir, "ws");
    let start = |config: &str| {
        Daemon::start_with(DaemonOptions { config: config.into(), user: user.clone(), ..Default::default() })
    };
    let uid = user.as_ref().map_or_else(|| nix::unistd::geteuid().as_raw(), |u| u.uid.as_raw());
    let d = start(&format!("[broker]\nallowed_uids = [0, {uid}]\n"));
    let run = |d: &Daemon, pre: &[&str], command: &[&str], who: Option<&nix::unistd::User>| {
        let mut argv = vec!["run", "--socket", d.socket.to_str().unwrap()];
        argv.extend_from_slice(pre);
        status(&palisade_cli(&ws, &argv, command, who))
    };
    let python = ["--allow-interpreters", "--allow-inline-code"];
    let (code, out, err) = run(&d, &python, &["python3", "-c", "print(6 * 7)"], user.as_ref());
    assert_eq!((code, out.as_str()), (Some(0), "42\n"), "{err}");
    let (code, out, err) = run(&d, &["--env", "ANSWER=42"], &["printenv", "ANSWER"], user.as_ref());
    assert_eq!((code, out.as_str()), (Some(0), "42\n"), "{err}");
    let (code, _, err) = run(&d, &["--timeout", "1000"], &["true"], user.as_ref());
    assert_eq!(code, Some(0), "{err}");
    // Past the ceiling: refused, naming it.
    let (code, _, err) = run(&d, &["--timeout", "4000"], &["true"], user.as_ref());
    assert_eq!(code, Some(125), "{err}");
    assert!(
        err.contains("is above the profile's ceiling of 3600 ([defaults] timeout_ceiling_secs)"),
        "{err}"
    );
    // Counter-test: another user's request only narrows.
    if user.is_some() {
        let (code, _, err) = run(&d, &python, &["python3", "-c", "print(6 * 7)"], None);
        assert_eq!(code, Some(125), "{err}");
        assert!(err.contains("allow_interpreters (--allow-interpreters) would widen the policy"), "{err}");
    }
    // Counter-test: the key turns it off.
    let off = start("[broker]\nowner_widens = false\n");
    let (code, _, err) = run(&off, &python, &["python3", "-c", "print(6 * 7)"], user.as_ref());
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("allow_interpreters (--allow-interpreters) would widen the policy"), "{err}");
}
