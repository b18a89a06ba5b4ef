//! deploy/: the Kubernetes manifest parses, has the shape its guide describes
//! (a Namespace, the ConfigMap holding palisade.toml, a DaemonSet running
//! palisaded with the socket on a hostPath), carries the security settings
//! the guide explains, and a configuration the broker itself accepts; the
//! Debian package's minimal configuration sets who is served and nothing
//! else.

use palisade_policy::Config;
use std::path::{Path, PathBuf};
use yaml_rust2::{Yaml, YamlLoader};

const MANIFEST: &str = "deploy/kubernetes/daemonset.yaml";
/// Where the socket's hostPath directory is, on the node and in the pods.
const SOCKET_DIR: &str = "/run/palisade";
/// The state directory of a root broker (journal, trust stages).
const STATE_DIR: &str = "/var/lib/palisade";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every document of the manifest.
fn manifest() -> Vec<Yaml> {
    YamlLoader::load_from_str(&read(MANIFEST)).unwrap_or_else(|e| panic!("{MANIFEST}: {e}"))
}

/// The one object of `kind`.
fn of_kind<'a>(docs: &'a [Yaml], kind: &str) -> &'a Yaml {
    let found: Vec<&Yaml> = docs.iter().filter(|d| d["kind"].as_str() == Some(kind)).collect();
    assert_eq!(found.len(), 1, "{MANIFEST}: one {kind}, not {}", found.len());
    found[0]
}

/// A sequence of strings (empty when `y` is not one).
fn strings(y: &Yaml) -> Vec<&str> {
    y.as_vec().map(|v| v.iter().filter_map(Yaml::as_str).collect()).unwrap_or_default()
}

/// The entry of a sequence of named objects (volumes, mounts) called `name`.
fn named<'a>(list: &'a Yaml, name: &str) -> &'a Yaml {
    list.as_vec()
        .and_then(|v| v.iter().find(|e| e["name"].as_str() == Some(name)))
        .unwrap_or_else(|| panic!("{MANIFEST}: nothing named {name}"))
}

/// The DaemonSet's pod spec and its one container, palisaded.
fn pod_and_container(docs: &[Yaml]) -> (&Yaml, &Yaml) {
    let pod = &of_kind(docs, "DaemonSet")["spec"]["template"]["spec"];
    let containers = pod["containers"].as_vec().expect("containers");
    assert_eq!(containers.len(), 1, "one container");
    assert_eq!(containers[0]["name"].as_str(), Some("palisaded"));
    (pod, &containers[0])
}

/// The ConfigMap's palisade.toml, as the broker parses it.
fn config_text(docs: &[Yaml]) -> &str {
    of_kind(docs, "ConfigMap")["data"]["palisade.toml"].as_str().expect("ConfigMap data palisade.toml")
}

fn config(docs: &[Yaml]) -> Config {
    Config::parse(config_text(docs), Path::new("palisade.toml")).unwrap_or_else(|e| panic!("{e}"))
}

/// The `--config` file palisaded is started with.
fn config_path(container: &Yaml) -> PathBuf {
    let command = strings(&container["command"]);
    let at = command.iter().position(|a| *a == "--config").expect("palisaded --config");
    PathBuf::from(command[at + 1])
}

/// The volume mounted at `path` in the container, and its mount.
fn volume_at<'a>(pod: &'a Yaml, container: &'a Yaml, path: &str) -> (&'a Yaml, &'a Yaml) {
    let mount = container["volumeMounts"]
        .as_vec()
        .and_then(|v| v.iter().find(|m| m["mountPath"].as_str() == Some(path)))
        .unwrap_or_else(|| panic!("{MANIFEST}: nothing mounted at {path}"));
    (named(&pod["volumes"], mount["name"].as_str().expect("mount name")), mount)
}

/// A Kubernetes memory quantity in MiB (the binary suffixes this manifest uses).
fn mebibytes(quantity: &str) -> u64 {
    let (n, unit) = quantity.split_at(quantity.find(|c: char| !c.is_ascii_digit()).unwrap_or(quantity.len()));
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("memory quantity {quantity:?}"));
    match unit {
        "Mi" => n,
        "Gi" => n * 1024,
        _ => panic!("memory quantity {quantity:?}: write it in Mi or Gi"),
    }
}

#[test]
fn the_manifest_holds_a_namespace_a_configmap_and_a_daemonset() {
    let docs = manifest();
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(kinds, ["Namespace", "ConfigMap", "DaemonSet"], "{MANIFEST}");
    let namespace = of_kind(&docs, "Namespace")["metadata"]["name"].as_str().expect("namespace name");
    for (kind, api) in [("Namespace", "v1"), ("ConfigMap", "v1"), ("DaemonSet", "apps/v1")] {
        let object = of_kind(&docs, kind);
        assert_eq!(object["apiVersion"].as_str(), Some(api), "{kind}");
        if kind != "Namespace" {
            assert_eq!(object["metadata"]["namespace"].as_str(), Some(namespace), "{kind}");
        }
    }
    // The selector picks the template's pods.
    let ds = &of_kind(&docs, "DaemonSet")["spec"];
    let labels = ds["template"]["metadata"]["labels"].as_hash().expect("template labels");
    let selector = ds["selector"]["matchLabels"].as_hash().expect("selector");
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(labels.get(k), Some(v), "selector {k:?} is not a label of the pods");
    }
}

#[test]
fn the_daemonset_runs_palisaded_with_the_configmaps_file() {
    let docs = manifest();
    let (pod, container) = pod_and_container(&docs);
    assert_eq!(
        strings(&container["command"]),
        ["/usr/bin/palisaded", "--config", "/etc/palisade/palisade.toml"]
    );
    assert_eq!(container["image"].as_str(), Some("ghcr.io/palisade-sandbox/palisade:0.1.0"));
    // The file is the ConfigMap's key, in the directory the ConfigMap is mounted at.
    let file = config_path(container);
    let (volume, mount) = volume_at(pod, container, file.parent().unwrap().to_str().unwrap());
    assert_eq!(mount["readOnly"].as_bool(), Some(true));
    let map = of_kind(&docs, "ConfigMap")["metadata"]["name"].as_str();
    assert_eq!(volume["configMap"]["name"].as_str(), map);
    let key = file.file_name().unwrap().to_str().unwrap();
    assert!(of_kind(&docs, "ConfigMap")["data"][key].as_str().is_some(), "no {key} in the ConfigMap");
}

/// palisaded's flags and the probes' subcommands are those the binaries have.
#[cfg(target_os = "linux")]
#[test]
fn the_commands_parse_as_the_binaries_parse_them() {
    use clap::Parser;
    let docs = manifest();
    let (_, container) = pod_and_container(&docs);
    let command = strings(&container["command"]);
    palisade_broker::serve::daemon::Args::try_parse_from(&command)
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    let mut probes = 0;
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        let exec = strings(&container[probe]["exec"]["command"]);
        if exec.is_empty() {
            continue;
        }
        probes += 1;
        assert_eq!(exec[0], "/usr/bin/palisade", "{probe}");
        palisade_broker::cli::Cli::try_parse_from(&exec).unwrap_or_else(|e| panic!("{probe} {exec:?}: {e}"));
        // A policy it names is the broker's own.
        if let Some(at) = exec.iter().position(|a| *a == "--policy") {
            assert_eq!(Path::new(exec[at + 1]), config_path(container), "{probe}");
        }
    }
    assert!(probes > 0, "no exec probe");
}

#[test]
fn the_socket_is_in_a_host_path_directory_where_the_configuration_puts_it() {
    let docs = manifest();
    let (pod, container) = pod_and_container(&docs);
    let (volume, _) = volume_at(pod, container, SOCKET_DIR);
    assert_eq!(volume["hostPath"]["path"].as_str(), Some(SOCKET_DIR));
    assert_eq!(volume["hostPath"]["type"].as_str(), Some("DirectoryOrCreate"));
    let config = config(&docs);
    let socket = config.broker.socket.expect("[broker] socket");
    assert_eq!(socket.parent(), Some(Path::new(SOCKET_DIR)));
    // Agent pods mount that directory: the broker's own files live elsewhere,
    // on a hostPath of their own that outlives the pod.
    let (state, _) = volume_at(pod, container, STATE_DIR);
    assert_eq!(state["hostPath"]["path"].as_str(), Some(STATE_DIR));
    let temp_root = config.policy.temp_root.expect("[policy] temp_root");
    assert!(temp_root.starts_with(STATE_DIR), "temp_root {}", temp_root.display());
    assert!(config.journal.path.is_none_or(|p| p.starts_with(STATE_DIR)));
    assert!(config.trust.state.is_none_or(|p| p.starts_with(STATE_DIR)));
}

#[test]
fn resources_are_requested_and_limited() {
    let docs = manifest();
    let (_, container) = pod_and_container(&docs);
    let resources = &container["resources"];
    for (kind, what) in [("requests", "cpu"), ("requests", "memory"), ("limits", "cpu"), ("limits", "memory")]
    {
        assert!(resources[kind][what].as_str().is_some(), "resources.{kind}.{what}");
    }
    // With no cgroup per run, the runs are bounded together by this limit
    // alone: it holds max_concurrent runs of the default profile, and the broker.
    let config = config(&docs);
    let limit = mebibytes(resources["limits"]["memory"].as_str().unwrap());
    let broker = mebibytes(resources["requests"]["memory"].as_str().unwrap());
    let runs = config.broker.max_concurrent as u64 * config.defaults.max_memory_mb;
    assert!(limit >= runs + broker, "memory limit {limit} MiB < {runs} MiB of runs + {broker} MiB");
}

#[test]
fn the_security_settings_are_those_the_guide_explains() {
    let docs = manifest();
    let (pod, container) = pod_and_container(&docs);
    // The host's user namespace: peers' uids as the node sees them, idmapped
    // workspaces, sandbox host ids.
    assert_eq!(pod["hostUsers"].as_bool(), Some(true));
    for shared in ["hostPID", "hostIPC", "hostNetwork"] {
        assert_ne!(pod[shared].as_bool(), Some(true), "{shared}");
    }
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));
    let security = &container["securityContext"];
    assert_eq!(security["runAsUser"].as_i64(), Some(0), "a root broker");
    // A fully visible /proc for the helper's fresh one: procMount: Unmasked
    // is admitted only with hostUsers: false, so privileged it is.
    assert_eq!(security["privileged"].as_bool(), Some(true));
    assert!(
        matches!(security["procMount"].as_str(), None | Some("Default")),
        "procMount: Unmasked needs hostUsers: false, which this broker cannot use"
    );
    assert_eq!(security["seccompProfile"]["type"].as_str(), Some("Unconfined"));
    let apparmor = &security["appArmorProfile"];
    match apparmor["type"].as_str() {
        Some("Unconfined") => {}
        Some("Localhost") => assert_eq!(apparmor["localhostProfile"].as_str(), Some("palisade-helper")),
        other => panic!("appArmorProfile {other:?}: the default profile denies every mount"),
    }
    // Pod Security Admission admits a privileged pod in its namespace.
    let labels = &of_kind(&docs, "Namespace")["metadata"]["labels"];
    assert_eq!(labels["pod-security.kubernetes.io/enforce"].as_str(), Some("privileged"));
}

#[test]
fn the_configmaps_palisade_toml_is_accepted_by_the_broker() {
    let docs = manifest();
    let config = config(&docs);
    // A root broker serves the uids it is told to, and root in another pod is not one.
    assert!(!config.broker.allowed_uids.is_empty() || !config.broker.allowed_gids.is_empty());
    let ids = config.resolve_ids(&palisade_broker::host::Accounts).unwrap();
    assert!(!ids.allowed_uids.contains(&0), "uid 0 in allowed_uids");
    assert!(!ids.allowed_gids.contains(&0), "gid 0 in allowed_gids");
    // The parse is the broker's: a misspelt key fails it, as it fails the pod.
    let typo = config_text(&docs).replacen("allowed_uids", "allowed_uid", 1);
    let e = Config::parse(&typo, Path::new("palisade.toml")).expect_err("a misspelt key");
    assert!(e.to_string().contains("allowed_uid"), "{e}");
}

#[test]
fn the_readmes_point_to_the_deployment() {
    assert!(read("README.md").contains("deploy/kubernetes"), "README.md does not mention deploy/kubernetes");
    let guide = read("deploy/kubernetes/README.md");
    for needle in ["daemonset.yaml", "palisade doctor", "hostUsers", "privileged", "procMount", "AppArmor"] {
        assert!(guide.contains(needle), "deploy/kubernetes/README.md does not mention {needle}");
    }
}

/// A setting of a systemd unit of systemd/.
fn unit_setting(unit: &str, key: &str) -> String {
    let prefix = format!("{key}=");
    read(&format!("systemd/{unit}"))
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
        .unwrap_or_else(|| panic!("no {key}= in systemd/{unit}"))
}

/// deploy/debian/palisade.toml, the /etc/palisade/palisade.toml the Debian
/// package installs: only who is served, nothing more (every other key
/// keeps its default), each key one palisade.example.toml shows in the same
/// table, and the group it serves is the one the package makes and the
/// socket admits.
#[test]
fn the_debian_configuration_is_minimal_and_serves_the_sockets_group() {
    let table = |relative: &str| -> toml::Table {
        read(relative).parse().unwrap_or_else(|e| panic!("{relative}: {e}"))
    };
    let minimal = table("deploy/debian/palisade.toml");
    let example = table("palisade.example.toml");
    let mut keys = Vec::new();
    for (name, section) in &minimal {
        let section = section.as_table().unwrap_or_else(|| panic!("{name} is not a table"));
        for key in section.keys() {
            let shown = example.get(name).and_then(|t| t.as_table()).is_some_and(|t| t.contains_key(key));
            assert!(shown, "[{name}] {key} is not in palisade.example.toml");
            keys.push(format!("{name}.{key}"));
        }
    }
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["broker.allowed_gids", "broker.allowed_uids", "clients.require_system_broker"],
        "what the minimal configuration sets"
    );
    let group = unit_setting("palisade.socket", "SocketGroup");
    assert_eq!(minimal["broker"]["allowed_gids"], toml::Value::Array(vec![group.clone().into()]));
    // The group the package makes (its sysusers.d line) is the socket's.
    assert!(
        read("scripts/build-deb.sh").contains(&format!("\ng {group} -\n")),
        "build-deb.sh makes no group {group}"
    );
    // The unit reads the file the package installs.
    let exec = unit_setting("palisade.service", "ExecStart");
    assert!(exec.ends_with(" --config /etc/palisade/palisade.toml"), "{exec}");
}

/// Who owns /var/lib/palisade, said alike by what makes it (the package's
/// tmpfiles.d and sysusers.d lines, the unit's `User=` and
/// `StateDirectory=`) and by what describes it (README.md's "A Debian
/// package", `man palisaded`'s FILES, build-deb.sh's own notes): the
/// unit's user, 0700; never root's.
#[test]
fn the_state_directory_is_the_units_user_in_the_package_the_readme_and_the_manual() {
    let user = unit_setting("palisade.service", "User");
    assert_eq!(user, "palisade");
    assert_eq!(unit_setting("palisade.service", "StateDirectory"), "palisade");
    let mode = unit_setting("palisade.service", "StateDirectoryMode");
    assert_eq!(mode, "0700");
    let package = read("scripts/build-deb.sh");
    let tmpfiles = format!("\nd {STATE_DIR} {mode} {user} {user} -\n");
    assert!(package.contains(&tmpfiles), "build-deb.sh's tmpfiles.d line is not {tmpfiles:?}");
    let sysusers = format!("\nu {user} - \"palisade sandbox broker\" {STATE_DIR} /usr/sbin/nologin\n");
    assert!(package.contains(&sysusers), "build-deb.sh makes no user {user} at home in {STATE_DIR}");
    assert!(package.contains(&format!("{STATE_DIR}, {user}:{user}\n#       {mode}")), "build-deb.sh's notes");
    let installed = read("scripts/check-deb-install.sh");
    assert!(
        installed.contains(&format!("\"directory {} {user}:{user}\"", &mode[1..])),
        "check-deb-install.sh"
    );
    let readme: String = read("README.md").split_whitespace().collect::<Vec<_>>().join(" ");
    let said = format!("`{STATE_DIR}`, the user `{user}`'s, {mode}");
    assert!(readme.contains(&said), "README.md does not say {said:?}");
    let man: String = read("broker/examples/man.rs").split_whitespace().collect::<Vec<_>>().join(" ");
    let said = format!("The user {user}'s, mode {mode}");
    assert!(man.contains(&said), "man palisaded's FILES (broker/examples/man.rs) does not say {said:?}");
    for wrong in
        [format!("`{STATE_DIR}` (root, "), "A root broker's state".to_string(), "No `palisade` user".into()]
    {
        for (file, text) in
            [("README.md", &readme), ("broker/examples/man.rs", &man), ("scripts/build-deb.sh", &package)]
        {
            assert!(!text.contains(&wrong), "{file} still says {wrong:?}");
        }
    }
}
