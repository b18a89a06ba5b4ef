//! `palisade mcp` driven by a real client: the official Python MCP SDK
//! (tests/mcp/drive.py, in the virtual environment `scripts/py-venv.sh`
//! makes) initializes, lists the tools, runs commands, is refused, answers
//! an approval through elicitation (yes, no, and a client that cannot ask)
//! and cancels a call, whose run must then be gone. Once with an embedded
//! broker, once through a daemon. As root the file runs again as the
//! unprivileged test user.

use palisade_tests::*;
use std::path::{Path, PathBuf};

/// The virtual environment's Python, with the `mcp` package.
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("PALISADE_TEST_MCP_PYTHON") {
        return PathBuf::from(p);
    }
    made_by_py_venv("py-venv/bin/python3")
}

/// A policy whose tool `lister` runs only with a person's approval each
/// time (its Trial stage), the stages kept in `dir`, and whose skill
/// plugins are installed there.
fn policy(dir: &Path) -> String {
    format!(
        "[trust]\nstate = {:?}\ntrial_runs = 100\n\n[tools.lister]\ndescription = \"lists the workspace\"\n\
         [tools.lister.overrides]\nfilesystem = [{{ read_only = \"${{WORKSPACE}}\" }}]\n\n\
         [plugins]\nenabled = true\nskills_dir = {:?}\nsecrets_dir = {:?}\n",
        dir.join("trust.json"),
        dir.join("skills"),
        dir.join("secrets"),
    )
}

/// Installs tests/plugins/echo.wat as skill `echo` where `policy_file` says.
fn install_echo(policy_file: &Path) {
    let module = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins/echo.wat")).unwrap();
    let dir = policy_file.parent().unwrap();
    std::fs::write(dir.join("echo.wat"), &module).unwrap();
    let sha = palisade_broker::plugins::index::sha256_hex(&module);
    let manifest = dir.join("echo.toml");
    std::fs::write(
        &manifest,
        format!("name = \"echo\"\nversion = \"1.0.0\"\nmodule = \"echo.wat\"\nsha256 = {sha:?}\n"),
    )
    .unwrap();
    let o = std::process::Command::new(bin("palisade"))
        .args(["plugin", "install", manifest.to_str().unwrap(), "--policy", policy_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
}

/// drive.py against `palisade mcp <options>`, in `ws`; panics with its
/// output unless every check passed.
fn drive(ws: &Path, options: &[&str]) -> String {
    // The probe where a run may execute it: its `tick` writes output over time.
    copy_executable(&bin("probe"), &ws.join("probe"));
    let o = std::process::Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/drive.py"))
        .arg(bin("palisade"))
        .arg(ws)
        .args(options)
        .env("DRIVE_APPROVALS", "1")
        .env("DRIVE_PLUGINS", "1")
        .env("PALISADE_JOURNAL", ws.join("journal"))
        .env("PALISADE_STATE", state_beside(ws.join("journal")))
        .output()
        .unwrap();
    let out = format!("{}\n{}", text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "drive.py failed:\n{out}");
    for want in [
        "ok: a plugin's JSON output",
        "ok: a refusal is an MCP error",
        "ok: a cancelled call's run is killed",
        "ok: mcp: an approval answered yes",
        "ok: progress while it ran, with its latest output",
        "ok: mcp: without elicitation the person is told the run waits",
    ] {
        assert!(out.contains(want), "{want} is not in:\n{out}");
    }
    out
}

/// `palisade tools approve lister PRE`; an embedded broker's journal and state in `ws`.
fn approve_tool(ws: &Path, pre: &[&str]) {
    let mut argv = vec!["tools", "approve", "lister"];
    argv.extend_from_slice(pre);
    let o = std::process::Command::new(bin("palisade"))
        .args(&argv)
        .env("PALISADE_JOURNAL", ws.join("journal"))
        .env("PALISADE_STATE", state_beside(ws.join("journal")))
        .output()
        .unwrap();
    assert!(text(&o.stdout).starts_with("tool lister: trial"), "{}{}", text(&o.stdout), text(&o.stderr));
}

#[test]
fn the_python_sdk_drives_palisade_mcp_with_an_embedded_broker() {
    let ws = TempDir::new("agent");
    let file = ws.join("policy.toml");
    std::fs::write(&file, policy(ws.path())).unwrap();
    approve_tool(ws.path(), &["--policy", file.to_str().unwrap()]);
    install_echo(&file);
    // Private sockets' directories of this uid's (another process's may be there already).
    let base = std::env::var_os("XDG_RUNTIME_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let dirs = || -> std::collections::BTreeSet<String> {
        let mine = |e: &std::fs::DirEntry| {
            let uid = std::fs::metadata(e.path()).map(|m| std::os::unix::fs::MetadataExt::uid(&m));
            e.file_name().to_string_lossy().starts_with("palisade-mcp-broker-")
                && uid.ok() == Some(nix::unistd::geteuid().as_raw())
        };
        std::fs::read_dir(&base)
            .unwrap()
            .flatten()
            .filter(mine)
            .map(|e| e.file_name().to_string_lossy().into())
            .collect()
    };
    let before = dirs();
    drive(ws.path(), &["--policy", file.to_str().unwrap()]);
    // The private socket's directory is gone with the server.
    let left = || dirs().difference(&before).cloned().collect::<Vec<_>>();
    let gone = eventually(std::time::Duration::from_secs(10), || left().is_empty());
    assert!(gone, "an embedded broker's directory was left behind: {:?}", left());
}

/// The embedded broker's private directory (mode 0700) of `palisade mcp` process `pid`.
fn broker_dir(pid: u32) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_RUNTIME_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let prefix = format!("palisade-mcp-broker-{pid}-");
    std::fs::read_dir(base)
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
}

#[test]
fn an_embedded_server_ended_by_a_signal_leaves_nothing() {
    use std::os::unix::fs::PermissionsExt;
    for signal in [nix::sys::signal::Signal::SIGTERM, nix::sys::signal::Signal::SIGINT] {
        let ws = TempDir::new("agent-signal");
        let mut child = std::process::Command::new(bin("palisade"))
            .args(["mcp", "--policy", "/dev/null"])
            .current_dir(ws.path())
            .env("PALISADE_JOURNAL", ws.join("journal"))
            .env("PALISADE_STATE", state_beside(ws.join("journal")))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut dir = None;
        assert!(eventually(std::time::Duration::from_secs(20), || {
            dir = broker_dir(child.id());
            dir.is_some()
        }));
        let dir = dir.unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{signal}");
        assert!(!dir.exists(), "{} is left after {signal}", dir.display());
    }
}

#[test]
fn the_python_sdk_drives_palisade_mcp_through_a_daemon() {
    let state = TempDir::new("mcp-state");
    std::fs::set_permissions(state.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let file = state.join("policy.toml");
    std::fs::write(&file, policy(state.path())).unwrap();
    install_echo(&file);
    let d = Daemon::start(&policy(state.path()));
    let socket = d.socket.to_str().unwrap();
    approve_tool(state.path(), &["--socket", socket]);
    let ws = TempDir::new("mcp-ws");
    std::fs::write(ws.join("policy.toml"), "listed\n").unwrap();
    drive(ws.path(), &["--socket", socket]);
    // The daemon's journal has the runs, the refusals and the approvals.
    let journal = std::fs::read_dir(d.journal())
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect::<String>();
    for event in ["\"approval_answered\"", "interpreters.denied", "\"run_finished\""] {
        assert!(journal.contains(event), "{event} is not in the daemon's journal");
    }
}

/// As root, the same file again as the unprivileged test user.
#[test]
fn the_mcp_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_mcp_suite_passes_as_an_unprivileged_user");
}
