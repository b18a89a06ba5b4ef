//! Cgroup limits, checked where they can be: a throwaway QEMU guest with a
//! pure cgroup v2 hierarchy (this host's cgroups belong to its own process
//! manager and are never written). The guest runs `vmcheck` with the real
//! binaries, as root and as an unprivileged user in a delegated subtree, and
//! a second boot checks the cgroup v1 fallback. The guest's kernel (6.1) has
//! Landlock ABI 2, which also exercises refusing required features it lacks.

use palisade_tests::bin;
use std::path::PathBuf;
use std::process::Command;

fn boot(extra: &[&str], args: &[&str]) -> (bool, String) {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = repo.join("tests/vm/run-in-vm.sh");
    for tool in ["qemu-system-x86_64", "cpio"] {
        let found =
            Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().unwrap().status.success();
        assert!(
            found,
            "{tool} is missing: apt-get install qemu-system-x86 busybox-static cpio (.ci/run does)"
        );
    }
    let dir = bin("vmcheck").parent().unwrap().to_path_buf();
    let cache = dir.join("vmcache");
    let mut cmd = Command::new("bash");
    cmd.arg(&script).args(["--timeout", "900", "--mem", "2G", "--smp", "2"]).args(extra);
    for b in ["palisaded", "palisade", "palisade-helper", "palisade-plugin-host", "probe"] {
        cmd.arg("--add").arg(format!("{}:/vmtest/{b}", stripped(b).display()));
    }
    // The suite's system configuration (no system broker), as on the host.
    let system = repo.join("tests/no-system-broker.toml");
    cmd.arg("--add").arg(format!("{}:/vmtest/no-system-broker.toml", system.display()));
    cmd.args(["--env", "PALISADE_SYSTEM_CONFIG=/vmtest/no-system-broker.toml"]);
    cmd.arg(stripped("vmcheck")).args(args).env("VMCACHE", &cache);
    let out = cmd.output().expect("run-in-vm.sh");
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// `name` without its debug information: the guest unpacks its files into
/// memory, and a debug build's binaries are hundreds of MiB.
fn stripped(name: &str) -> PathBuf {
    let dir = bin("vmcheck").parent().unwrap().join("vmcache/stripped");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(name);
    let o = Command::new("strip").arg("--strip-debug").arg("-o").arg(&out).arg(bin(name)).output().unwrap();
    assert!(o.status.success(), "strip {name}: {o:?}");
    out
}

#[test]
fn cgroup_limits_hold_in_a_pure_cgroup_v2_guest() {
    let (ok, text) = boot(&[], &[]);
    for who in ["root", "user"] {
        for check in [
            "doctor",
            "memory bomb",
            "fork bomb",
            "cpu share",
            "deadline kill",
            "quota and disconnect kill",
            "many runs",
            "landlock abi 2",
            "shutdown",
            "broker killed",
            "helper killed in its cgroup",
            "plugin-host cgroup",
            "plugin-host memory limit",
            "session in a cgroup",
        ] {
            assert!(
                text.contains(&format!("vmcheck PASS [{who}] {check}:")),
                "{who} {check} did not pass:\n{text}"
            );
        }
    }
    assert!(text.contains("vmcheck PASS [root] root delegation:"), "root delegation did not pass:\n{text}");
    assert!(ok, "{text}");
    println!("{}", text.lines().filter(|l| l.starts_with("vmcheck")).collect::<Vec<_>>().join("\n"));
}

#[test]
fn vmcheck_refuses_to_run_outside_the_guest() {
    let o = Command::new(bin("vmcheck")).env_remove("VMTEST_AS").output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("only inside the throwaway guest"), "{o:?}");
}

#[test]
fn cgroup_v1_is_used_under_a_configured_root() {
    let (ok, text) = boot(&["--keep-v1", "--controllers", "", "--as", "root"], &["--v1"]);
    for check in [
        "v1 memory bomb",
        "v1 pool",
        "v1 fork bomb",
        "v1 session in a cgroup",
        "v1 plugin-host cgroup",
        "v1 runs removed",
    ] {
        assert!(text.contains(&format!("vmcheck PASS [root] {check}:")), "{check} did not pass:\n{text}");
    }
    assert!(ok, "{text}");
    println!("{}", text.lines().filter(|l| l.starts_with("vmcheck")).collect::<Vec<_>>().join("\n"));
}
