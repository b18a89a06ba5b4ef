//! docs/agents.md's "The first hour", run as written: each shell block of
//! the section in an empty directory of its own, with the `palisade` under
//! test first in PATH, a home whose git identity is Ada's, and pip reading
//! pytest's wheels from target/py-wheels (`scripts/py-venv.sh` fetches
//! them) instead of the network.

use palisade_tests::*;
use std::path::Path;

/// What each block of the first hour prints: on stdout, on stderr.
const EXPECTED: [(&str, &str); 4] = [
    ("1 passed", ""),
    ("node ok", ""),
    ("Ada Lovelace: first, from a sandbox", ""),
    ("served\nrefused\n", "CapabilityDenied: network access to elsewhere.internal is not allowed"),
];

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
    for (block, (out_has, err_has)) in blocks.iter().zip(EXPECTED) {
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

/// An ordinary user's home with the toolchains a developer installs there
/// (rustup, pyenv with Python 3.12 as the global version, nvm's layout, an npm prefix,
/// `pip install --user`: `tests/fixtures/user-home.sh`), owned by the test
/// user, and a temporary directory of the test's own (as `/tmp` is).
struct UserHome {
    user: nix::unistd::User,
    dir: TempDir,
}

impl UserHome {
    fn new() -> UserHome {
        use std::os::unix::fs::PermissionsExt;
        let user = test_user();
        let dir = TempDir::new("user-home");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        for d in ["home", "tmp"] {
            std::fs::create_dir(dir.join(d)).unwrap();
        }
        std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let host_home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        let rustup = std::env::var("RUSTUP_HOME").unwrap_or_else(|_| format!("{host_home}/.rustup"));
        let pyenv = std::env::var("PYENV_ROOT").unwrap_or_else(|_| format!("{host_home}/.pyenv"));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/user-home.sh");
        let wheels = made_by_py_venv("py-wheels");
        let home = dir.join("home");
        let o = std::process::Command::new("bash")
            .arg(&script)
            .args([home.as_os_str(), rustup.as_ref(), pyenv.as_ref(), wheels.as_os_str()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
        // The user's own, but for the toolchains' files (links to the host's installations).
        let (uid, gid) = (user.uid.to_string(), user.gid.to_string());
        let o = std::process::Command::new("find")
            .arg(&home)
            .args([
                "(",
                "-type",
                "d",
                "-o",
                "-links",
                "1",
                ")",
                "-exec",
                "chown",
                "-h",
                &format!("{uid}:{gid}"),
                "{}",
                "+",
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
        std::fs::write(home.join(".gitconfig"), "[user]\n\tname = Ada Lovelace\n\temail = ada@example.org\n")
            .unwrap();
        nix::unistd::chown(&home.join(".gitconfig"), Some(user.uid), Some(user.gid)).unwrap();
        UserHome { user, dir }
    }

    fn home(&self) -> std::path::PathBuf {
        self.dir.join("home")
    }

    /// `script` in bash as the user would type it in a login shell (its
    /// `~/.profile` read; no runtime directory, as over SSH without
    /// logind), in `cwd`, with the `palisade` under test first in PATH.
    fn shell(&self, cwd: &Path, script: &str) -> std::process::Output {
        let bins = bin("palisade").parent().unwrap().display().to_string();
        let home = self.home();
        let script = format!("set -e; . ~/.profile; export PATH={bins}:$PATH\n{script}");
        let mut argv = as_user(&self.user);
        argv.extend(["/bin/bash".to_string(), "-c".to_string(), script]);
        std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(cwd)
            .env_clear()
            .env("HOME", &home)
            .env("USER", &self.user.name)
            .env("LANG", "C.UTF-8")
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("TMPDIR", self.dir.join("tmp"))
            .env("PIP_NO_INDEX", "1")
            .env("PIP_FIND_LINKS", made_by_py_venv("py-wheels"))
            .env(SYSTEM_CONFIG_ENV, test_system_config())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    }

    /// A directory of the user's for a project.
    fn project(&self, name: &str) -> std::path::PathBuf {
        let p = self.dir.join(name);
        std::fs::create_dir(&p).unwrap();
        nix::unistd::chown(&p, Some(self.user.uid), Some(self.user.gid)).unwrap();
        p
    }

    /// The user's own daemon, started by hand as the README says.
    fn daemon(&self) -> std::process::Child {
        let log = std::fs::File::create(self.dir.join("palisaded.log")).unwrap();
        let mut argv = as_user(&self.user);
        let bins = bin("palisade").parent().unwrap().display().to_string();
        argv.extend(["/bin/bash".into(), "-c".into(), format!(". ~/.profile; exec {bins}/palisaded")]);
        let child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .env("HOME", self.home())
            .env("USER", &self.user.name)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("TMPDIR", self.dir.join("tmp"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let socket = self.dir.join(&format!("tmp/palisade-{}/palisade.sock", self.user.uid));
        let up = eventually(std::time::Duration::from_secs(20), || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        });
        assert!(up, "{}", std::fs::read_to_string(self.dir.join("palisaded.log")).unwrap_or_default());
        child
    }

    fn runs_by_daemon(&self) -> usize {
        let log = std::fs::read_to_string(self.dir.join("palisaded.log")).unwrap_or_default();
        log.matches("run finished").count()
    }
}

/// The names of a project's entries.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// What tools keep of their own in a home, which must never land in a project.
const TOOL_STATE: [&str; 9] =
    [".rustup", ".cargo", ".npm", ".cache", ".local", ".config", ".pyenv", ".python_history", ".npmrc"];

/// An ordinary user with rustup, pyenv (Python 3.12, where the system's is
/// 3.11), an npm prefix and a `pip --user` tool in the home runs `python3
/// -m pytest`, `cargo build`, nvm's node, and tools of `~/.local/bin` and the npm
/// prefix by bare name, with no flag beyond `--allow-interpreters`: first
/// with an embedded broker, then through the user's daemon started by
/// hand without a runtime directory, which the CLI finds. The bare names
/// are the user's shell's (pyenv's 3.12, the home's cargo), `explain` says
/// which, and the projects hold no tool state: each workspace's HOME is its
/// own, in the broker's state.
#[test]
fn an_ordinary_users_toolchains_run_by_bare_name_and_leave_the_project_clean() {
    if !is_root() {
        return skipped("making another user's home with the host's toolchains needs root");
    }
    let u = UserHome::new();
    let system = std::process::Command::new("/usr/bin/python3").arg("--version").output().unwrap();
    assert!(!text(&system.stdout).contains("3.12"), "the system's Python must differ from pyenv's");
    let py = u.project("py");
    std::fs::write(py.join("calc.py"), "def add(a, b):\n    return a + b\n").unwrap();
    std::fs::write(
        py.join("test_calc.py"),
        "import sys\nfrom calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n\
         def test_pyenv():\n    assert sys.version_info[:2] == (3, 12), sys.version\n",
    )
    .unwrap();
    let steps = [
        ("py", "palisade run --allow-interpreters -- python3 -m pytest -q -p no:cacheprovider", "2 passed"),
        (
            "py",
            "palisade explain --allow-interpreters -- python3 -m pytest",
            "/.pyenv/shims/python3 (the first python3",
        ),
        ("rs", "palisade run -- cargo build -q && palisade run -- cargo run -q", "Hello, world!"),
        ("rs", "palisade run --allow-interpreters -- hello-local", "hello from ~/.local/bin"),
        ("rs", "palisade run --allow-interpreters -- hello-npm", "hello from the npm prefix"),
        ("rs", "palisade explain --allow-interpreters -- node --version", "/.nvm/versions/node/"),
        ("rs", "palisade run --allow-interpreters -- node --version", "v"),
    ];
    for daemon in [false, true] {
        let rs = u.dir.join("rs");
        let _ = std::fs::remove_dir_all(&rs);
        let rs = u.project("rs");
        let o = u.shell(&rs, "cargo init -q --name rs");
        assert!(o.status.success(), "{}", text(&o.stderr));
        let mut child = daemon.then(|| u.daemon());
        for (at, line, want) in steps {
            let o = u.shell(&u.dir.join(at), line);
            let (out, err) = (text(&o.stdout), text(&o.stderr));
            assert!(o.status.success() && out.contains(want), "daemon {daemon}: {line}\n{out}{err}");
        }
        if daemon {
            // Every run went to the user's daemon (explain is no run).
            assert_eq!(u.runs_by_daemon(), 6, "{}", u.runs_by_daemon());
        }
        if let Some(c) = child.as_mut() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = c.wait();
        }
        assert!(rs.join("target/debug/rs").exists(), "{:?}", entries(&rs));
        for project in [&py, &rs] {
            let names = entries(project);
            assert!(
                !names.iter().any(|n| TOOL_STATE.contains(&n.as_str())),
                "{}: {names:?}",
                project.display()
            );
        }
        // Each workspace's HOME is its own, in the broker's state, and kept.
        let homes = u.home().join(".local/state/palisade/homes");
        let names = entries(&homes);
        assert!(
            names.iter().any(|n| n.starts_with("rs-")) && names.iter().any(|n| n.starts_with("py-")),
            "{names:?}"
        );
    }
}

/// `palisade mcp --allow-interpreters` (the README's MCP entry) as the user
/// in `cwd`: the result of one `run_command` call with `argv`.
fn mcp_call(u: &UserHome, cwd: &Path, argv: &[&str]) -> serde_json::Value {
    use std::io::{BufRead, Write};
    let bins = bin("palisade").parent().unwrap().display().to_string();
    let mut command = as_user(&u.user);
    command.extend([
        "/bin/bash".into(),
        "-c".into(),
        format!(". ~/.profile; exec {bins}/palisade mcp --allow-interpreters"),
    ]);
    let mut child = std::process::Command::new(&command[0])
        .args(&command[1..])
        .current_dir(cwd)
        .env_clear()
        .env("HOME", u.home())
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("TMPDIR", u.dir.join("tmp"))
        .env(SYSTEM_CONFIG_ENV, test_system_config())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "run_command", "arguments": {"argv": argv}}});
    writeln!(stdin, "{init}").unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut answer = |id: u64| loop {
        let line = lines.next().expect("the server ended").unwrap();
        let m: serde_json::Value = serde_json::from_str(&line).unwrap();
        if m["id"] == id {
            return m;
        }
    };
    answer(1);
    writeln!(stdin, "{}", serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .unwrap();
    writeln!(stdin, "{call}").unwrap();
    let result = answer(2);
    drop(stdin);
    let _ = child.wait();
    result
}

/// The README's and docs/agents.md's first steps as an ordinary user,
/// with no daemon and then with the user's own started by hand (no
/// runtime directory): `palisade init` writes the starter configuration,
/// whose `sh` profile `palisade run` and `palisade session start` use; the
/// first-hour flags (`--allow-interpreters`, `--env`) widen the user's own
/// daemon as they widen an embedded broker; and the README's MCP entry
/// (`palisade mcp --allow-interpreters`) runs a call either way.
#[test]
fn the_first_steps_work_with_and_without_the_users_own_daemon() {
    if !is_root() {
        return skipped("making another user's home with the host's toolchains needs root");
    }
    let u = UserHome::new();
    let ws = u.project("ws");
    std::fs::write(ws.join("v.py"), "import sys\nprint(sys.version_info[:2])\n").unwrap();
    let o = u.shell(&ws, "palisade init");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let config = u.home().join(".config/palisade/palisade.toml");
    assert!(text(&o.stdout).contains(&config.display().to_string()), "{}", text(&o.stdout));
    // A second init keeps the file.
    let o = u.shell(&ws, "echo '# mine' >> ~/.config/palisade/palisade.toml; palisade init");
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stderr));
    assert!(std::fs::read_to_string(&config).unwrap().ends_with("# mine\n"));
    for daemon in [false, true] {
        let mut child = daemon.then(|| u.daemon());
        let o = u.shell(&ws, "palisade run --profile sh -- sh -c 'echo $((6 * 7))'");
        assert_eq!(text(&o.stdout), "42\n", "daemon {daemon}: {}", text(&o.stderr));
        let o = u.shell(&ws, "ANSWER=42 palisade run --allow-interpreters --env ANSWER -- python3 v.py && palisade run --env ANSWER=7 -- printenv ANSWER");
        assert_eq!(text(&o.stdout), "(3, 12)\n7\n", "daemon {daemon}: {}", text(&o.stderr));
        let r = mcp_call(&u, &ws, &["python3", "v.py"]);
        let result = &r["result"];
        assert!(result["isError"] != true && result.to_string().contains("(3, 12)"), "daemon {daemon}: {r}");
        if daemon {
            let o = u.shell(
                &ws,
                "palisade session start --name dev --profile sh && palisade session exec dev -- sh -c 'echo in-session' \
                 && palisade session stop dev",
            );
            assert!(
                o.status.success() && text(&o.stdout).contains("in-session"),
                "{}{}",
                text(&o.stdout),
                text(&o.stderr)
            );
            // The runs went to the daemon: three runs, the MCP call, the session's command.
            assert!(u.runs_by_daemon() >= 4, "{}", u.runs_by_daemon());
        }
        if let Some(c) = child.as_mut() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = c.wait();
        }
    }
}

/// docs/agents.md's first hour as an ordinary user would run it (rustup,
/// pyenv, an npm prefix in the home; a login shell's PATH): with an
/// embedded broker, then through the user's own daemon started by hand.
#[test]
fn the_first_hour_runs_as_written_for_an_ordinary_user_embedded_and_through_their_daemon() {
    if !is_root() {
        return skipped("making another user's home with the host's toolchains needs root");
    }
    let u = UserHome::new();
    let blocks = blocks();
    for daemon in [false, true] {
        let mut child = daemon.then(|| u.daemon());
        let before = u.runs_by_daemon();
        for (i, (block, (out_has, err_has))) in blocks.iter().zip(EXPECTED).enumerate() {
            let dir = u.project(&format!("hour-{daemon}-{i}"));
            let o = u.shell(&dir, block);
            let (out, err) = (text(&o.stdout), text(&o.stderr));
            assert!(o.status.success(), "daemon {daemon}: {block}\n{out}{err}");
            assert!(out.contains(out_has) && err.contains(err_has), "daemon {daemon}: {block}\n{out}{err}");
        }
        // Through the daemon: the runs of the first three blocks (the fourth names a policy file,
        // which an embedded broker serves).
        assert_eq!(u.runs_by_daemon() - before, if daemon { 4 } else { 0 });
        if let Some(c) = child.as_mut() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = c.wait();
        }
    }
}
