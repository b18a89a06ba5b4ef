//! Resource limits on this host, where no cgroup subtree may be used (its
//! cgroups belong to the host's own process manager): limits fall back to
//! rlimits, the attestation says so, and a policy that requires a cgroup is
//! refused with the reason. The cgroup limits themselves are checked in a
//! pure cgroup v2 guest (guest.rs).

use palisade_tests::*;

/// `palisade run --json --policy` (an embedded broker) with `toml` added to the base configuration.
fn run_json(toml: &str, args: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let dir = TempDir::new("limits");
    let path = dir.join("p.toml");
    std::fs::write(&path, test_config(toml)).unwrap();
    let ws = TempDir::new("ws");
    let o = palisade_cli(ws.path(), &["run", "--json", "--policy", path.to_str().unwrap()], args, None);
    let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    (o.status.code(), v, text(&o.stderr))
}

#[test]
fn without_a_usable_cgroup_root_limits_fall_back_to_rlimits_and_say_so() {
    let nowhere = "[broker]\ncgroup_root = \"/nonexistent-palisade-cgroup\"\n";
    let (code, v, err) = run_json(nowhere, &[&probe(), "echo", "x"]);
    assert_eq!(code, Some(0), "{err} {v}");
    let e = &v["result"]["attestation"]["enforcement"];
    assert_eq!(e["limits_by"], "rlimits", "{v}");
    assert!(e["cgroup"].is_null(), "{v}");
    assert_eq!(v["result"]["memory_source"], "rusage", "{v}");
    assert!(
        e["rlimits"].as_array().unwrap().iter().any(|r| r["name"] == "NPROC" && r["hard"].as_u64().is_some()),
        "{v}"
    );

    // Required: refused, with the exact reason, and nothing runs.
    let required = format!("{nowhere}[policy]\nrequire_cgroup = true\n");
    let (code, v, _) = run_json(&required, &[&probe(), "echo", "x"]);
    assert_eq!(code, Some(125));
    assert_eq!(v["error"]["kind"], "Unavailable", "{v}");
    assert_eq!(v["error"]["rule"], "cgroup.unavailable", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("cgroup_root /nonexistent-palisade-cgroup does not exist"), "{message}");
    assert_eq!(v["stdout"], "", "{v}");

    // A tool may require it on its own.
    let dir = bin("probe").parent().unwrap().display().to_string();
    let tool = |name: &str, require: bool| {
        format!(
            "[tools.{name}]\nallowed_executables = [\"{p}\"]\nrequire_cgroup = {require}\n[tools.{name}.overrides]\nfilesystem = [{{ read_only = \"{dir}\" }}, \"temp_workspace\"]\n",
            p = probe()
        )
    };
    let tool = format!("{nowhere}{}{}", tool("strict", true), tool("loose", false));
    let dir = TempDir::new("tools");
    let path = dir.join("p.toml");
    std::fs::write(&path, test_config(&tool)).unwrap();
    let ws = TempDir::new("ws");
    let run = |name: &str| {
        palisade_cli(
            ws.path(),
            &["run", "--policy", path.to_str().unwrap(), "--tool", name],
            &[&probe(), "echo", "t"],
            None,
        )
    };
    let o = run("strict");
    assert!(
        text(&o.stderr).starts_with("palisade: Unavailable: the policy requires cgroup limits"),
        "{}",
        text(&o.stderr)
    );
    let o = run("loose");
    assert_eq!(text(&o.stdout), "ok t\n", "{}", text(&o.stderr));
}

/// On this host as it is (no configured root): `palisade doctor`, a run's
/// attestation and a refusal of `require_cgroup` tell the same story.
#[test]
fn doctor_the_attestation_and_require_cgroup_agree_about_this_host() {
    let doctor = std::process::Command::new(bin("palisade")).arg("doctor").output().unwrap();
    let report = text(&doctor.stdout);
    let line =
        report.lines().find(|l| l.starts_with("cgroup for runs:")).unwrap_or_else(|| panic!("{report}"));
    let layout = report.lines().find(|l| l.starts_with("cgroups:")).unwrap().to_string();
    let (code, v, err) = run_json("", &[&probe(), "echo", "x"]);
    assert_eq!(code, Some(0), "{err}");
    let limits_by = v["result"]["attestation"]["enforcement"]["limits_by"].as_str().unwrap().to_string();
    match line.trim_start_matches("cgroup for runs:").trim().strip_prefix("none: ") {
        Some(reason) => {
            assert_eq!(limits_by, "rlimits", "{report}");
            let (code, refused, _) = run_json("[policy]\nrequire_cgroup = true\n", &[&probe(), "echo", "x"]);
            assert_eq!(code, Some(125));
            let message = refused["error"]["message"].as_str().unwrap();
            assert!(message.contains(reason), "doctor: {reason}\nrefusal: {message}");
            assert!(message.contains("`palisade doctor` prints the lines that give runs one"), "{message}");
            // Where the host mounts cgroups as v1 or a hybrid, that is the reason.
            if !layout.contains("v2 (pure)") {
                assert!(reason.contains("not a pure cgroup v2 mount"), "{layout}: {reason}");
            }
            // Doctor gives the lines that would change it, in this host's form.
            let root = if layout.contains("v2 (pure)") {
                "/sys/fs/cgroup/palisade"
            } else {
                "/sys/fs/cgroup/memory/palisade"
            };
            assert!(report.contains(&format!("cgroup_root = \"{root}\"")), "{report}");
            assert!(warnings(&v).contains("memory: no cgroup holds this run"), "{v}");
        }
        None => {
            assert!(limits_by.starts_with("cgroup"), "{report}\n{limits_by}");
            assert!(!warnings(&v).contains("no cgroup holds this run"), "{v}");
        }
    }
}

/// A run result's warnings, one per line.
fn warnings(v: &serde_json::Value) -> String {
    let all = v["result"]["attestation"]["warnings"].as_array().cloned().unwrap_or_default();
    all.iter().filter_map(|w| w.as_str()).collect::<Vec<_>>().join("\n")
}

/// As root, the same file again as the unprivileged test user.
#[test]
fn the_limits_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_limits_suite_passes_as_an_unprivileged_user");
}
