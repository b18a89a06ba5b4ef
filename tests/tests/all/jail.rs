//! The jail, tested from inside: the probe runs in sandboxes built by the real
//! `palisade-helper` binary and attempts what the sandbox must forbid; each
//! attempt is also made outside, where it succeeds, so every test could fail.
//!
//! When run as root, `the_same_suite_passes_as_an_unprivileged_user` re-runs
//! this whole file as an ordinary user (`palisade-test`, created by .ci/run).

use nix::errno::Errno;
use palisade_broker::engine::helper::Io;
use palisade_protocol::{ExitReport, LandlockFeatures, Stage, Tier};
use palisade_tests::*;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::time::Duration;

const BOTH: [Tier; 2] = [Tier::C, Tier::B];

fn plant_secret(jail: &Jail) -> String {
    let secret = jail.dir.join("secret.txt");
    std::fs::write(&secret, "the-secret-value").unwrap();
    secret.to_string_lossy().into_owned()
}

#[test]
fn a_planted_secret_outside_the_allowed_paths_cannot_be_read() {
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        let secret = plant_secret(&jail);
        assert!(probe_outside(&["read", &secret]).unwrap().contains("the-secret-value"));
        let inside = jail.run(&["read", &secret]);
        inside.expect_ran();
        let err = inside.probe().expect_err("secret readable inside");
        assert!(err == "ENOENT" || err == "EACCES", "{tier}: {err}");
        assert!(!inside.stdout.contains("the-secret-value"));
    }
}

#[test]
fn writes_succeed_in_the_workspace_and_fail_everywhere_else() {
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        let inside_file = jail.workspace().join("made-inside");
        let o = jail.run(&["write", inside_file.to_str().unwrap()]);
        assert_eq!(o.expect_ran().probe(), Ok(String::new()), "{tier}");
        assert_eq!(std::fs::read_to_string(&inside_file).unwrap(), "probe\n");
        // Stored as the workspace owner's, also when a sandbox started by root ran as another uid.
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&inside_file).unwrap();
        assert_eq!((meta.uid(), meta.gid()), jail.workspace_owner(), "{tier}");

        // Outside the workspace the write fails, or (Tier C's private /tmp, where the
        // workspace's parent directories are recreated) lands in the sandbox only.
        let outside_file = jail.dir.join("made-outside");
        let target = outside_file.to_str().unwrap();
        let _ = jail.run(&["write", target]).expect_ran();
        assert!(!outside_file.exists(), "{tier}: a write reached the host outside the workspace");
        let beside_probe = bin("probe").with_file_name("palisade-probe-write");
        let beside_probe = beside_probe.to_str().unwrap();
        for system in ["/usr/palisade-probe", "/etc/palisade-probe", "/palisade-probe", beside_probe] {
            assert!(jail.run(&["write", system]).expect_ran().probe().is_err(), "{tier}: {system}");
        }
        assert!(!std::path::Path::new(beside_probe).exists());
        assert_eq!(probe_outside(&["write", target]), Ok(String::new()));
        assert!(outside_file.exists());
    }
}

#[test]
fn symlinks_and_hardlinks_in_the_workspace_that_point_outside_give_nothing() {
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        let secret = plant_secret(&jail);
        let ws = jail.workspace();
        let at = |name: &str| ws.join(name).to_string_lossy().into_owned();

        // A symlink planted from outside before the run.
        std::os::unix::fs::symlink(&secret, ws.join("planted")).unwrap();
        assert!(probe_outside(&["read", &at("planted")]).unwrap().contains("the-secret-value"));
        assert!(jail.run(&["read", &at("planted")]).expect_ran().probe().is_err(), "{tier}: planted symlink");

        // A symlink made inside: making it is harmless, following it gives nothing.
        let _ = jail.run(&["symlink", &secret, &at("made")]);
        assert!(
            jail.run(&["read", &at("made")]).expect_ran().probe().is_err(),
            "{tier}: symlink made inside"
        );
        assert!(probe_outside(&["read", &at("made")]).unwrap().contains("the-secret-value"));

        // A hard link to the secret cannot be made from inside.
        assert!(jail.run(&["link", &secret, &at("hard")]).expect_ran().probe().is_err(), "{tier}: hardlink");
        assert!(!ws.join("hard").exists());
        assert_eq!(probe_outside(&["link", &secret, &at("hard-outside")]), Ok(String::new()));
    }
}

#[test]
fn a_listener_on_host_loopback_cannot_be_reached() {
    let (listener, addr) = loopback_listener();
    assert_eq!(probe_outside(&["connect", &addr]), Ok(String::new()));
    listener.accept().expect("the connection from outside");
    listener.set_nonblocking(true).unwrap();
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        let err = jail.run(&["connect", &addr]).expect_ran().probe().expect_err("connected from inside");
        assert!(["ECONNREFUSED", "EACCES", "EPERM", "ENETUNREACH"].contains(&err.as_str()), "{tier}: {err}");
    }
    // Nothing from inside reached the listener.
    assert!(listener.accept().is_err());
}

#[test]
fn a_unix_socket_on_the_host_cannot_be_reached() {
    use std::os::linux::net::SocketAddrExt;
    let dir = TempDir::new("unix");
    let path = dir.join("host.sock");
    let by_path = std::os::unix::net::UnixListener::bind(&path).unwrap();
    // Reachable by the sandbox's uid, were it not for the sandbox.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    let name = format!("palisade-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
    let abstract_ = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let path = path.to_str().unwrap();
    let abstract_name = format!("@{name}");
    for target in [path, abstract_name.as_str()] {
        assert_eq!(probe_outside(&["unix", target]), Ok(String::new()), "{target} from outside");
    }
    by_path.set_nonblocking(true).unwrap();
    abstract_.set_nonblocking(true).unwrap();
    while by_path.accept().is_ok() || abstract_.accept().is_ok() {}
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        for target in [path, abstract_name.as_str()] {
            let err = jail.run(&["unix", target]).expect_ran().probe().expect_err("connected from inside");
            assert!(
                ["ENOENT", "ECONNREFUSED", "EPERM", "EACCES"].contains(&err.as_str()),
                "{tier} {target}: {err}"
            );
        }
        // socketpair, which reaches nothing outside, still works (ordinary tools use it).
        assert_eq!(jail.run(&["socketpair"]).expect_ran().probe(), Ok(String::new()), "{tier}");
    }
    assert!(by_path.accept().is_err() && abstract_.accept().is_err(), "a connection from inside arrived");
}

#[test]
fn only_loopback_exists_inside_tier_c() {
    let outside = probe_outside(&["ifaces"]).unwrap();
    assert!(outside.split(',').any(|i| i != "lo"), "the host has only loopback: {outside}");
    let mut jail = Jail::new(Tier::C);
    assert_eq!(jail.run(&["ifaces"]).expect_ran().probe(), Ok("lo".to_string()), "host has {outside}");
}

#[test]
fn proc_shows_only_the_sandbox_processes() {
    let outside = probe_outside(&["pids"]).unwrap();
    assert!(outside.split(',').any(|p| p == std::process::id().to_string()));
    let mut jail = Jail::new(Tier::C);
    let inside = jail.run(&["pids"]).expect_ran().probe().unwrap();
    // pid 1 (the sandbox's init) and the probe itself.
    assert_eq!(inside, "1,2");
}

fn victim() -> std::process::Child {
    Command::new("sleep").arg("60").spawn().unwrap()
}

#[test]
fn a_host_process_cannot_be_signalled_or_ptraced() {
    let mut v = victim();
    let pid = v.id().to_string();
    assert_eq!(probe_outside(&["signal", &pid]), Ok(String::new()));
    assert_eq!(probe_outside(&["ptrace", &pid]), Ok(String::new()));
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        for check in ["signal", "ptrace"] {
            let err = jail.run(&[check, &pid]).expect_ran().probe().expect_err(check);
            assert!(["ESRCH", "EPERM"].contains(&err.as_str()), "{tier} {check}: {err}");
        }
    }
    let _ = v.kill();
    let _ = v.wait();
}

#[test]
fn mount_chroot_user_namespaces_keyctl_bpf_and_io_uring_fail() {
    // Outside, each succeeds (bpf only for root: the host disables unprivileged bpf).
    for check in ["mount", "chroot", "userns", "keyctl", "io_uring"] {
        assert!(probe_outside(&[check]).is_ok(), "{check} fails even outside: {:?}", probe_outside(&[check]));
    }
    let bpf_outside = probe_outside(&["bpf"]);
    if is_root() {
        assert!(bpf_outside.is_ok(), "bpf as root: {bpf_outside:?}");
    } else {
        assert_eq!(bpf_outside, Err("EPERM".into()), "unprivileged bpf is disabled on this host");
    }
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        for check in ["mount", "chroot", "userns", "keyctl", "bpf", "io_uring"] {
            let o = jail.run(&[check]);
            assert_eq!(o.expect_ran().probe(), Err("EPERM".into()), "{tier} {check}: {o:#?}");
        }
    }
}

#[test]
fn no_capabilities_no_new_privs_and_seccomp_inside() {
    let outside = probe_outside(&["status"]).unwrap();
    assert!(outside.contains("NoNewPrivs=0") && outside.contains("Seccomp=0"), "{outside}");
    if is_root() {
        assert!(!outside.contains("CapEff=0000000000000000"), "{outside}");
    }
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        let inside = jail.run(&["status"]).expect_ran().probe().unwrap();
        for field in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
            assert!(inside.contains(&format!("{field}=0000000000000000")), "{tier}: {inside}");
        }
        if tier == Tier::C || is_root() {
            assert!(inside.contains("CapBnd=0000000000000000"), "{tier}: {inside}");
        }
        assert!(inside.contains("NoNewPrivs=1") && inside.contains("Seccomp=2"), "{tier}: {inside}");
    }
}

#[test]
fn only_stdio_is_inherited_env_is_the_plans_and_hostname_too() {
    // A descriptor without close-on-exec, which a careless spawner would pass on.
    let file = std::fs::File::open("/dev/null").unwrap();
    // SAFETY: duplicating a valid descriptor; the copy is closed below.
    let leaked = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD, 100) };
    assert!(leaked >= 100);
    let outside = probe_outside(&["fds"]).unwrap();
    assert!(outside.split(',').any(|fd| fd == leaked.to_string()), "{outside}");
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        assert_eq!(jail.run(&["fds"]).expect_ran().probe(), Ok("0,1,2".to_string()), "{tier}");
        let o = jail.run(&["env"]);
        let env = o.expect_ran().stdout.strip_prefix("ok ").unwrap();
        let mut vars: Vec<&str> = env.lines().collect();
        vars.sort();
        assert_eq!(vars, ["PALISADE_TEST=1", "PATH=/usr/bin:/bin"], "{tier}");
    }
    // SAFETY: closing the descriptor made above.
    unsafe { libc::close(leaked) };
    let out = Command::new(bin("probe")).arg("env").env("PALISADE_OUTSIDE", "1").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("PALISADE_OUTSIDE=1"));
    let host = probe_outside(&["hostname"]).unwrap();
    assert_ne!(host, "palisade-test");
    let mut jail = Jail::new(Tier::C);
    assert_eq!(jail.run(&["hostname"]).expect_ran().probe(), Ok("palisade-test".to_string()));
}

#[test]
fn tiocsti_on_the_callers_terminal_fails() {
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    // Outside: the terminal is the probe's controlling terminal, and injection works.
    let mut outside = Command::new(bin("probe"));
    outside.arg("tiocsti").stdin(slave.try_clone().unwrap()).stdout(Stdio::piped());
    in_own_session(&mut outside, Some(0));
    let out = outside.output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok"), "outside: {out:?}");
    let mut master = std::fs::File::from(pty.master);
    let mut injected = [0u8; 1];
    master.read_exact(&mut injected).unwrap();
    assert_eq!(&injected, b"#");

    for tier in BOTH {
        let mut jail = Jail::new(tier);
        jail.stdin = Some(slave.try_clone().unwrap());
        let err = jail.run(&["tiocsti"]).expect_ran().probe().expect_err("TIOCSTI worked inside");
        assert_eq!(err, "EPERM", "{tier}");
    }
}

#[test]
fn a_fork_bomb_stops_at_the_process_limit() {
    for tier in BOTH {
        let forks = |limit: u64| {
            let mut jail = Jail::new(tier);
            jail.spec.limits.processes = limit;
            let o = jail.run(&["forkbomb"]);
            o.expect_ran();
            let line = o.stdout.lines().next().unwrap_or_default().to_string();
            assert!(line.starts_with("err EAGAIN stopped after"), "{tier}: {line}");
            line.rsplit(' ').nth(1).unwrap().parse::<u64>().unwrap()
        };
        // Tier B's limit counts every process of the uid, the test's own included.
        let small = forks(16);
        assert!(small < 16, "{tier}: {small} forks under a limit of 16");
        let large = forks(200);
        assert!(
            large >= 120,
            "{tier}: only {large} forks under a limit of 200: the limit is not what stopped the small one"
        );
    }
}

#[test]
fn a_memory_bomb_stops_at_the_data_limit() {
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        jail.spec.limits.memory_bytes = 256 << 20;
        let o = jail.run(&["membomb", "2048"]);
        let line = o.expect_ran().stdout.lines().next().unwrap_or_default().to_string();
        assert!(line.starts_with("err ENOMEM stopped after"), "{tier}: {line}");
        let mib: u64 = line.split_whitespace().nth(4).unwrap().parse().unwrap();
        assert!(mib < 256, "{tier}: {mib} MiB allocated under a 256 MiB limit");
        // Counter-test: the same allocation pattern goes further with more room.
        let mut roomy = Jail::new(tier);
        roomy.spec.limits.memory_bytes = 1 << 30;
        assert_eq!(
            roomy.run(&["membomb", "512"]).expect_ran().probe(),
            Ok("allocated 512 MiB".to_string()),
            "{tier}"
        );
    }
}

#[test]
fn a_cpu_spinner_is_stopped_by_the_cpu_limit() {
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        jail.spec.limits.cpu_seconds = 1;
        jail.timeout = Duration::from_secs(60);
        let o = jail.run(&["spin"]);
        assert!(!o.timed_out, "{tier}: the spinner ran until the outer timeout: {o:#?}");
        assert_eq!(o.exit(), Some(ExitReport::Signal(libc::SIGXCPU)), "{tier}: {o:#?}");
        // Counter-test: with room, the same spinner is still running when the outer bound ends it.
        let mut roomy = Jail::new(tier);
        roomy.spec.limits.cpu_seconds = 60;
        roomy.timeout = Duration::from_secs(3);
        let o = roomy.run(&["spin"]);
        assert!(o.timed_out, "{tier}: the spinner stopped by itself: {o:#?}");
    }
}

#[test]
fn a_huge_file_write_is_stopped_by_the_file_size_limit() {
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        jail.spec.limits.file_size_bytes = 1 << 20;
        let big = jail.workspace().join("big");
        let o = jail.run(&["bigfile", big.to_str().unwrap(), "64"]);
        assert!(o.expect_ran().stdout.starts_with("err EFBIG"), "{tier}: {o:#?}");
        assert!(std::fs::metadata(&big).unwrap().len() <= 1 << 20);
        let mut roomy = Jail::new(tier);
        let big = roomy.workspace().join("big");
        assert!(roomy.run(&["bigfile", big.to_str().unwrap(), "8"]).expect_ran().probe().is_ok(), "{tier}");
        assert_eq!(std::fs::metadata(&big).unwrap().len(), 8 << 20);
    }
}

#[test]
fn every_rlimit_of_the_plan_holds_inside() {
    let outside = probe_outside(&["limits"]).unwrap();
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        jail.spec.limits = palisade_policy::Limits {
            memory_bytes: 300 << 20,
            address_space_bytes: 900 << 20,
            cpu_seconds: 17,
            processes: 33,
            open_files: 77,
            file_size_bytes: 5 << 20,
            tmp_bytes: 16 << 20,
            shm_bytes: 16 << 20,
        };
        let inside = jail.run(&["limits"]).expect_ran().probe().unwrap();
        let (fsize, address_space, data) = (5 << 20, 900 << 20, 300 << 20);
        let want = format!("nofile=77 core=0 nproc=33 fsize={fsize} as={address_space} data={data} cpu=17");
        assert_eq!(inside, want, "{tier}");
        assert_ne!(outside, want);
    }
}

#[test]
fn killing_the_helpers_caller_kills_the_whole_tree() {
    for tier in BOTH {
        let jail = Jail::new(tier);
        let token = format!("palisade-daemon-{}-{tier}", std::process::id());
        let plan = jail.plan(&["daemonize", &token]);
        let mut caller = Command::new(bin("probe"))
            .args(["caller", bin("palisade-helper").to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // A survivor holding the test's stderr would keep the harness waiting.
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        caller.stdin.take().unwrap().write_all(&palisade_protocol::encode_plan(&plan).unwrap()).unwrap();
        let mut stdout = std::io::BufReader::new(caller.stdout.take().unwrap());
        let mut first = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut first).unwrap();
        drop(stdout);
        assert_eq!(first, "ok daemonized\n", "{tier}");
        // The double-forked, setsid sleeper exists on the host before the kill...
        assert!(
            eventually(Duration::from_secs(10), || sleeper_with_token(&token).is_some()),
            "{tier}: the sleeper never started"
        );
        let sleeper = sleeper_with_token(&token).unwrap();
        let session = nix::unistd::getsid(Some(nix::unistd::Pid::from_raw(sleeper as i32))).unwrap();
        assert_ne!(session, nix::unistd::getsid(None).unwrap(), "{tier}: the sleeper did not call setsid");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(caller.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let _ = caller.wait();
        // ... and nothing of the sandbox survives it.
        if !eventually(Duration::from_secs(10), || process_with_token(&token).is_none()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(sleeper as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("{tier}: pid {sleeper} survived the caller");
        }
    }
}

#[test]
fn a_missing_executable_reports_exec_enoent() {
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        let mut plan = jail.plan(&[]);
        plan.program = "/nonexistent/palisade-probe".into();
        let o = jail.run_plan(&plan);
        let f = o.failure().unwrap_or_else(|| panic!("{tier}: no failure reported: {o:#?}"));
        assert_eq!((f.stage, f.errno), (Stage::Exec, Errno::ENOENT as i32), "{tier}");
        assert_eq!(f.message, "exec /nonexistent/palisade-probe: ENOENT");
        assert_eq!(o.status.code(), Some(127));
    }
}

#[test]
fn a_tier_b_plan_that_would_run_the_command_as_host_root_is_refused() {
    let mut jail = Jail::new(Tier::B);
    let marker = jail.workspace().join("ran");
    let mut plan = jail.plan(&["write", marker.to_str().unwrap()]);
    plan.uid = 0;
    plan.gid = 0;
    let o = jail.run_plan(&plan);
    let f = o.failure().expect("failure reported");
    assert_eq!((f.stage, f.errno), (Stage::Plan, Errno::EINVAL as i32));
    assert!(f.message.contains("host root"), "{}", f.message);
    assert!(!marker.exists());
}

/// Without namespaces Landlock is the filesystem boundary: the helper runs
/// no Tier B plan that does not require it, whatever the broker decided.
#[test]
fn a_tier_b_plan_that_does_not_require_landlock_is_refused() {
    let mut jail = Jail::new(Tier::B);
    let marker = jail.workspace().join("ran");
    let mut plan = jail.plan(&["write", marker.to_str().unwrap()]);
    plan.landlock.required = palisade_protocol::LandlockFeatures::EMPTY;
    let o = jail.run_plan(&plan);
    let f = o.failure().expect("failure reported");
    assert_eq!((f.stage, f.errno), (Stage::Plan, Errno::EINVAL as i32));
    assert_eq!(f.message, "the plan asks for Tier B without Landlock's filesystem rules as a requirement");
    assert!(!marker.exists());
    // Counter-test: the same plan requiring them runs.
    let plan = jail.plan(&["write", marker.to_str().unwrap()]);
    jail.run_plan(&plan).expect_ran();
    assert!(marker.exists());
}

#[test]
fn a_failed_step_is_reported_as_stage_and_errno_and_nothing_runs() {
    let mut jail = Jail::new(Tier::C);
    let marker = jail.workspace().join("ran");
    let mut plan = jail.plan(&["write", marker.to_str().unwrap()]);
    plan.mounts.push(palisade_protocol::Mount::Bind {
        source: "/nonexistent-source".into(),
        target: "/srv/x".into(),
        writable: false,
        owned: false,
    });
    // The helper binds only what the broker opened and sent: a path alone is
    // refused, before anything is built.
    let o = jail.run_plan(&plan);
    let f = o.failure().expect("failure reported");
    assert_eq!((f.stage, f.errno), (Stage::Plan, Errno::EINVAL as i32));
    assert_eq!(f.message, "the plan asks for a mount of /nonexistent-source without its descriptor");
    assert_eq!(o.status.code(), Some(125));
    assert!(!marker.exists() && o.stdout.is_empty());

    // The caller must be the plan's parent.
    let mut plan = jail.plan(&["write", marker.to_str().unwrap()]);
    plan.parent_pid = 1;
    let o = jail.run_plan(&plan);
    assert_eq!(o.failure().map(|f| (f.stage, f.errno)), Some((Stage::Lifeline, Errno::ESRCH as i32)));
    assert!(!marker.exists());
}

#[test]
fn a_corrupt_plan_is_refused_before_anything_happens() {
    let jail = Jail::new(Tier::C);
    let mut bytes = palisade_protocol::encode_plan(&jail.plan(&["echo", "x"])).unwrap();
    bytes[7] = 99; // version
    let mut child = palisade_broker::engine::helper::spawn(palisade_broker::engine::helper::HelperCommand {
        warm: None,
        helper: bin("palisade-helper"),
        cgroup_dir: None,
        stdin: Io::Null,
        stdout: Io::Piped,
        stderr: Io::Piped,
        outer_limits: vec![],
    })
    .unwrap();
    palisade_broker::engine::helper::send_plan(child.plan_channel.take().unwrap(), &bytes, &[]).unwrap();
    palisade_broker::engine::helper::release(&child.status).unwrap();
    let out = child.wait_with_output_ref();
    let records = child.read_status().unwrap();
    assert!(out.is_empty(), "{out}");
    match records.as_slice() {
        [palisade_protocol::HelperRecord::Failed(f)] => {
            assert_eq!(f.stage, Stage::Plan);
            assert!(f.message.starts_with("plan version 99"), "{}", f.message);
        }
        other => panic!("{other:?}"),
    }
}

trait WaitOutput {
    fn wait_with_output_ref(&mut self) -> String;
}

impl WaitOutput for palisade_broker::engine::helper::HelperChild {
    fn wait_with_output_ref(&mut self) -> String {
        let mut s = String::new();
        self.stdout.take().unwrap().read_to_string(&mut s).unwrap();
        self.wait().unwrap();
        s
    }
}

#[test]
fn tier_b_has_no_namespaces_but_landlock_seccomp_and_a_new_session() {
    let outside_ns = probe_outside(&["ns"]).unwrap();
    let mut b = Jail::new(Tier::B);
    let o = b.run(&["ns"]);
    assert_eq!(o.expect_ran().probe(), Ok(outside_ns.clone()), "Tier B must not create namespaces");
    let landlock = o.landlock().expect("Landlock report");
    assert!(landlock.enforced.contains(LandlockFeatures::FS), "{landlock:?}");

    let mut c = Jail::new(Tier::C);
    let inside_c = c.run(&["ns"]).expect_ran().probe().unwrap();
    let differ = outside_ns.split(',').zip(inside_c.split(',')).filter(|(a, b)| a != b).count();
    assert_eq!(differ, 7, "Tier C must create every namespace: {outside_ns} vs {inside_c}");

    for tier in BOTH {
        let mut jail = Jail::new(tier);
        let s = jail.run(&["session"]).expect_ran().probe().unwrap();
        let f: Vec<&str> = s.split(' ').map(|kv| kv.split('=').nth(1).unwrap()).collect();
        assert_eq!(f[0], f[1], "{tier}: the command leads its own session: {s}");
    }
    let outside = probe_outside(&["session"]).unwrap();
    let f: Vec<&str> = outside.split(' ').map(|kv| kv.split('=').nth(1).unwrap()).collect();
    assert_ne!(f[0], f[1], "outside, the probe is not a session leader: {outside}");
}

#[test]
fn the_command_runs_with_the_plans_ids_cwd_and_exit_status() {
    for tier in BOTH {
        let mut jail = Jail::new(tier);
        let ids = jail.run(&["ids"]).expect_ran().probe().unwrap();
        assert_eq!(ids, format!("uid={} gid={}", jail.spec.uid, jail.spec.gid), "{tier}");
        if is_root() && tier == Tier::B {
            assert_eq!(jail.spec.uid, SANDBOX_ID, "Tier B started by root must not run as root");
        }
        let cwd = jail.run(&["cwd"]).expect_ran().probe().unwrap();
        assert_eq!(cwd, jail.workspace().display().to_string());
        let o = jail.run(&["exit", "7"]);
        assert_eq!((o.exit(), o.status.code()), (Some(ExitReport::Code(7)), Some(7)), "{tier}");
        let o = jail.run(&["kill-self", "15"]);
        assert_eq!((o.exit(), o.status.code()), (Some(ExitReport::Signal(15)), Some(143)), "{tier}");
    }
}

/// A warm pool's helper builds its namespaces, monitor and pid 1 before it
/// has a plan, then runs the plan its spec admits, and refuses any other
/// at stage `plan`, whatever the broker sends. A root caller's (a system
/// broker's) is built as the plan's host ids, for its requester alone.
#[test]
fn a_warm_helper_runs_only_a_plan_its_spec_admits() {
    let jail = Jail::new(Tier::C);
    let plan = jail.plan(&["ns"]);
    assert_eq!(plan.host_ids.is_some(), is_root());
    let spec = palisade_protocol::WarmSpec::of(&plan).expect("a plan that can be built ahead");
    let warm = run_helper_with(&plan, Io::Null, Duration::from_secs(60), Some(spec));
    let namespaces = warm.expect_ran().probe().unwrap();
    let cold = run_helper(&plan, Io::Null, Duration::from_secs(60));
    assert_ne!(cold.expect_ran().probe().unwrap(), namespaces, "two sandboxes, two sets of namespaces");
    for (what, change) in [
        ("other ids", (|p| p.uid += 1) as fn(&mut palisade_protocol::JailPlan)),
        ("no network namespace", |p| (p.namespaces.net, p.loopback) = (false, false)),
        ("another broker", |p| p.parent_pid = 1),
        ("another requester", |p| p.acting_for = Some(palisade_protocol::HostIds { uid: 4242, gid: 4242 })),
        ("other host ids", |p| p.host_ids = Some(palisade_protocol::HostIds { uid: 4242, gid: 4242 })),
    ] {
        // A plan of host ids is a root caller's only.
        if ["another requester", "other host ids"].contains(&what) && !is_root() {
            continue;
        }
        let mut other = plan.clone();
        change(&mut other);
        let o = run_helper_with(&other, Io::Null, Duration::from_secs(60), Some(spec));
        let f = o.failure().unwrap_or_else(|| panic!("{what}: no failure: {o:#?}"));
        assert_eq!(f.stage, Stage::Plan, "{what}: {f}");
        assert!(f.message.contains("built ahead") || f.message.contains("built for"), "{what}: {f}");
        assert!(o.stdout.is_empty(), "{what}: the command ran: {}", o.stdout);
    }
}

/// Re-runs this file as an ordinary user when the suite runs as root: the
/// broker's users are unprivileged, so everything above must hold for them.
#[test]
fn the_same_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_same_suite_passes_as_an_unprivileged_user");
}
