//! The warm pool: sandboxes a broker builds ahead of requests (namespaces,
//! monitor, pid 1), each for exactly one run. Its brokers run unprivileged:
//! as the test user when the suite runs as root (a system broker's pools,
//! one per requester, are tested in system.rs).

use palisade_tests::*;
use std::path::PathBuf;
use std::time::Duration;

struct Broker {
    d: Daemon,
    user: Option<nix::unistd::User>,
    ws: PathBuf,
    _dir: TempDir,
}

impl Broker {
    fn start(config: &str) -> Broker {
        Broker::start_in(config, TempDir::new("warm"))
    }

    /// With its workspace in `dir`.
    fn start_in(config: &str, dir: TempDir) -> Broker {
        let user = is_root().then(test_user);
        let d = Daemon::start_with(DaemonOptions {
            config: config.into(),
            user: user.clone(),
            ..Default::default()
        });
        let ws = shared_workspace(&dir, "w");
        Broker { d, user, ws, _dir: dir }
    }

    /// `palisade run --json` of the probe: its stdout and whether its
    /// sandbox was built warm or cold.
    fn run(&self, args: &[&str]) -> (String, String, serde_json::Value) {
        let mut argv = vec![probe()];
        argv.extend(args.iter().map(|a| a.to_string()));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let socket = self.d.socket.to_str().unwrap();
        let o = palisade_cli(&self.ws, &["run", "--json", "--socket", socket], &argv, self.user.as_ref());
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}\n{}", String::from_utf8_lossy(&o.stderr), self.d.log()));
        let enforcement = v["result"]["attestation"]["enforcement"].clone();
        let built = enforcement["built"].as_str().unwrap_or_else(|| panic!("{v}")).to_string();
        (v["stdout"].as_str().unwrap_or_default().to_string(), built, enforcement)
    }

    /// The broker's descendants: its pooled helpers (monitor and pid 1 each)
    /// and whatever they started.
    fn descendants(&self) -> Vec<u32> {
        descendants(self.d.child.id())
    }
}

fn descendants(root: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
                found.push(child);
                queue.push(child);
            }
        }
    }
    found
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// The pool is full: `slots` sandboxes, each a monitor and its pid 1.
fn pool_is_full(b: &Broker, slots: usize) -> bool {
    eventually(Duration::from_secs(20), || b.descendants().len() == 2 * slots)
}

fn field<'a>(seen: &'a str, name: &str) -> &'a str {
    seen.split_whitespace()
        .find_map(|f| f.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {name} in {seen:?}"))
}

#[test]
fn a_warm_sandbox_shows_nothing_of_the_run_before_it() {
    // Two slots: the second sandbox was built before the first run started.
    let b = Broker::start("[broker]\nprespawn = 2\n");
    assert!(pool_is_full(&b, 2), "{:?}\n{}", b.descendants(), b.d.log());
    let token = format!("warm-trace-{}", std::process::id());
    // The first run leaves a file in /tmp, a SysV message queue and shared
    // memory segment and a detached process, and sees them itself: `look` can find each.
    let (first, built, _) = b.run(&["traces", &token]);
    assert_eq!(built, "warm", "{}", b.d.log());
    for trace in ["file", "sysv", "shm", "process"] {
        assert_eq!(field(&first, trace), "yes", "{trace} in {first}");
    }
    // Its sandbox is gone with it, detached process included.
    assert!(eventually(Duration::from_secs(10), || sleeper_with_token(&token).is_none()), "left running");
    let (next, built, _) = b.run(&["look", &token]);
    assert_eq!(built, "warm", "{}", b.d.log());
    for trace in ["file", "sysv", "shm", "process"] {
        assert_eq!(field(&next, trace), "no", "{trace} in {next}");
    }
    assert_eq!(field(&next, "host"), field(&first, "host"), "the plan's host name, not another");
    let (was, now) = (field(&first, "ns"), field(&next, "ns"));
    for (a, z) in was.split(',').zip(now.split(',')) {
        assert_ne!(a, z, "a namespace of one run is another's: {was} / {now}");
    }
    // With `warm = false` the pool's helpers build nothing ahead.
    let cold = Broker::start("[broker]\nprespawn = 1\nwarm = false\n");
    let (out, built, _) = cold.run(&["echo", "z"]);
    assert_eq!((out.as_str(), built.as_str()), ("ok z\n", "cold"), "{}", cold.d.log());
}

#[test]
fn a_warm_sandbox_has_the_dev_proc_and_workspace_of_a_cold_one() {
    // A pooled sandbox builds /dev and /proc before its plan, under a
    // staging tmpfs that covers the old root's /tmp: a workspace under
    // the host's /tmp must still be the host's, not the staging's.
    let at_tmp = || TempDir::new_in(std::path::Path::new("/tmp"), "warm-tmp");
    let warm = Broker::start_in("[broker]\nprespawn = 1\n", at_tmp());
    let cold = Broker::start_in("[broker]\nprespawn = 1\nwarm = false\n", at_tmp());
    assert!(pool_is_full(&warm, 1), "{}", warm.d.log());
    let mut seen = Vec::new();
    for (b, want) in [(&warm, "warm"), (&cold, "cold")] {
        std::fs::write(b.ws.join("mark"), "the host's\n").unwrap();
        let (read, built, _) = b.run(&["read", &b.ws.join("mark").display().to_string()]);
        assert_eq!((read.as_str(), built.as_str()), ("ok 11 bytes: the host's\n\n", want), "{}", b.d.log());
        let (root, built, _) = b.run(&["root"]);
        assert_eq!(built, want, "{}", b.d.log());
        seen.push(root);
    }
    let warm_root = &seen[0];
    assert!(field(warm_root, "dev").split(',').any(|n| n == "null"), "{warm_root}");
    assert_eq!(field(warm_root, "pts"), "ptmx", "{warm_root}");
    assert_eq!(field(warm_root, "pids"), "1,2", "the sandbox's processes alone: {warm_root}");
    assert_eq!(field(warm_root, "dev_write"), "EROFS", "{warm_root}");
    assert_eq!(field(warm_root, "shm_write"), "yes", "{warm_root}");
    assert_eq!(seen[0], seen[1], "warm, then cold");
}

#[test]
fn a_plan_the_pool_was_not_built_for_gets_a_cold_sandbox() {
    let b = Broker::start("[broker]\nprespawn = 1\n");
    assert!(pool_is_full(&b, 1), "{}", b.d.log());
    let pooled = b.descendants();
    // The host's network: no network namespace, which the pool has built.
    let host_net = Broker::start("network = \"allow_all\"\n[broker]\nprespawn = 1\n");
    assert!(pool_is_full(&host_net, 1), "{}", host_net.d.log());
    let (out, built, enforcement) = host_net.run(&["echo", "x"]);
    assert_eq!((out.as_str(), built.as_str()), ("ok x\n", "cold"), "{}", host_net.d.log());
    let namespaces: Vec<&str> =
        enforcement["namespaces"].as_array().unwrap().iter().filter_map(|n| n.as_str()).collect();
    assert!(!namespaces.contains(&"net"), "{namespaces:?}");
    // The pool's sandbox is left for a run it fits: the same one is still there.
    assert!(pool_is_full(&host_net, 1));
    assert!(host_net.d.log().contains("does not fit the warm pool's sandboxes"), "{}", host_net.d.log());
    // Counter-test: a default run on the first broker takes its pooled one.
    let (out, built, _) = b.run(&["echo", "y"]);
    assert_eq!((out.as_str(), built.as_str()), ("ok y\n", "warm"), "{}", b.d.log());
    // Gone with its run: its monitor's exit may come just after the answer.
    let gone = eventually(Duration::from_secs(10), || pooled.iter().all(|p| !alive(*p)));
    assert!(gone, "the pooled sandbox served the run and is gone");
}

#[test]
fn pooled_sandboxes_whose_broker_dies_leave_nothing_behind() {
    let mut b = Broker::start("[broker]\nprespawn = 2\n");
    assert!(pool_is_full(&b, 2), "{}", b.d.log());
    let pooled = b.descendants();
    assert!(pooled.iter().all(|p| alive(*p)));
    b.d.child.kill().unwrap();
    b.d.child.wait().unwrap();
    // Each monitor dies with the broker (its death signal), each pid 1 with its monitor.
    let gone = eventually(Duration::from_secs(10), || pooled.iter().all(|p| !alive(*p)));
    assert!(gone, "left behind: {:?}", pooled.iter().filter(|p| alive(**p)).collect::<Vec<_>>());
}

#[test]
fn doctor_says_what_the_pool_builds_ahead() {
    let doctor = |user: Option<&nix::unistd::User>| {
        let mut argv = user.map(as_user).unwrap_or_default();
        argv.push(bin("palisade").to_string_lossy().into_owned());
        let o = std::process::Command::new(&argv[0]).args(&argv[1..]).arg("doctor").output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        text.lines().find(|l| l.starts_with("warm pool:")).unwrap_or_else(|| panic!("{text}")).to_string()
    };
    let user = is_root().then(test_user);
    let line = doctor(user.as_ref());
    assert!(line.contains("2 sandboxes built ahead (namespaces, monitor, pid 1, /proc, /dev)"), "{line}");
    if is_root() {
        let line = doctor(None);
        assert!(
            line.contains(
                "2 sandboxes built ahead (namespaces, monitor, pid 1, /proc, /dev) for each requester"
            ),
            "{line}"
        );
    }
}
