//! The Python client of clients/python against a real broker: its API
//! (clients/python/tests/check_client.py: a run's bytes, stdin, streaming,
//! a deadline, a refusal with its rule, explain, status, and a client of
//! the previous protocol version), from its source here; installed with pip
//! as a user would, typed (`mypy --strict`) and its command line, in the
//! slow tier (the virtual environment `scripts/py-venv.sh` makes).

use palisade_tests::*;
use std::path::Path;

/// The profile check_client.py runs its shell line under.
const SHELL: &str = "[profiles.sh]\nallow_interpreters = true\nallow_inline_code = true\n";

fn check_script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python/tests/check_client.py")
}

#[test]
fn the_python_client_drives_a_broker_through_its_api() {
    let d = Daemon::start(SHELL);
    let ws = TempDir::new("pyclient");
    let o = python_with_client()
        .arg(check_script())
        .args([d.socket.as_os_str(), ws.path().as_os_str()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}\n{}", text(&o.stdout), text(&o.stderr), d.log());
    assert!(
        text(&o.stdout).ends_with("still served\na broker of version 12 is met in 12\nok\n"),
        "{}",
        text(&o.stdout)
    );
}

/// Which socket the client goes to (clients/python/tests/check_discovery.py):
/// `$PALISADE_SOCKET`, the user's own, then the system broker's, on Linux
/// and on macOS, whose system sockets are the Rust side's.
#[test]
fn the_python_client_finds_a_broker_in_the_one_order_on_both_systems() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python/tests/check_discovery.py");
    let o = python_with_client()
        .arg(script)
        .args([
            palisade_protocol::clients::LINUX_SYSTEM_SOCKET,
            palisade_protocol::clients::MACOS_SYSTEM_SOCKET,
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    assert!(text(&o.stdout).ends_with("then the system broker\nok\n"), "{}", text(&o.stdout));
}

#[cfg(feature = "slow")]
#[test]
fn the_installed_python_client_is_typed_and_runs() {
    let venv = made_by_py_venv("py-venv/bin");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let o = std::process::Command::new(venv.join("mypy"))
        .args(["--strict", "--cache-dir", "/dev/null", "clients/python/src", "clients/python/tests"])
        .current_dir(&root)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    let d = Daemon::start(SHELL);
    let ws = TempDir::new("pyclient");
    // The installed package, not the source: run from elsewhere, no PYTHONPATH.
    let o = std::process::Command::new(venv.join("python3"))
        .arg(check_script())
        .args([d.socket.as_os_str(), ws.path().as_os_str()])
        .env_remove("PYTHONPATH")
        .current_dir(ws.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}\n{}", text(&o.stdout), text(&o.stderr), d.log());
    let cli = |args: &[&str]| {
        let mut argv = vec!["--socket", d.socket.to_str().unwrap(), "--"];
        argv.extend_from_slice(args);
        let o = std::process::Command::new(venv.join("palisade-client"))
            .args(argv)
            .current_dir(ws.path())
            .output()
            .unwrap();
        (o.status.code(), text(&o.stdout), text(&o.stderr))
    };
    let (code, out, err) = cli(&[&probe(), "echo", "installed"]);
    assert_eq!((code, out.as_str()), (Some(0), "ok installed\n"), "{err}");
    assert_eq!(cli(&[&probe(), "exit", "7"]).0, Some(7));
    // Its stdin, streamed to the command.
    let mut child = std::process::Command::new(venv.join("palisade-client"))
        .args(["--socket", d.socket.to_str().unwrap(), "--", "wc", "-c"])
        .current_dir(ws.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &vec![b'x'; 3 << 20]).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!((o.status.code(), text(&o.stdout).trim()), (Some(0), (3 << 20).to_string().as_str()));
}
