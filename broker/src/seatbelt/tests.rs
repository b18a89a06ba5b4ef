//! The executor's supervision on Linux, through a stand-in for
//! `sandbox-exec`: a script that checks the profile it is given (a private
//! file that starts with `(deny default)`), keeps a copy, and runs the
//! command without Seatbelt. What is tested here is palisade's side: the
//! command line, the profile's file and its removal, the output quota, the
//! deadline, cancellation, the memory sampler and the kill of every process
//! of the run. What Seatbelt enforces is tested on macOS only.

use super::*;
use palisade_policy::{Config, Context, Decision, HostCapabilities, Policy};
use palisade_protocol::wire::Stream;
use std::os::unix::fs::PermissionsExt;

/// `-f PROFILE` checked and copied next to the script, then the command.
const STAND_IN: &str = r#"#!/bin/sh
[ "$1" = "-f" ] || { echo "stand-in: no -f" >&2; exit 90; }
profile=$2; shift 2
[ "$(stat -c %a "$profile")" = 600 ] || { echo "stand-in: profile not 0600" >&2; exit 91; }
head -n 2 "$profile" | grep -qx '(deny default)' || { echo "stand-in: not a deny-default profile" >&2; exit 92; }
cp "$profile" "$(dirname "$0")/last.sb"
echo "$profile" > "$(dirname "$0")/last-path"
exec "$@"
"#;

/// The stand-in, written in `dir` (where it keeps the last profile it was
/// given). Written to a file beside it, then copied by `install` in a
/// process of its own: written here, the launcher's descriptor would be
/// inherited by whatever another test forks meanwhile, and executing it
/// would fail with "Text file busy" until that child execs.
pub(crate) fn stand_in(dir: &Path) -> PathBuf {
    let (staged, launcher) = (dir.join("sandbox-exec.staged"), dir.join("sandbox-exec"));
    std::fs::write(&staged, STAND_IN).unwrap();
    let out = std::process::Command::new("install")
        .args(["-m", "0755"])
        .arg(&staged)
        .arg(&launcher)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "install {}: {out:?}", launcher.display());
    std::fs::remove_file(&staged).unwrap();
    launcher
}

/// A Linux host that says it has Seatbelt: Tier B's plan, as on a Mac.
pub(crate) fn seatbelt_host() -> palisade_policy::Host {
    let capabilities = HostCapabilities {
        user_namespaces: false,
        landlock_abi: 0,
        seatbelt: true,
        cgroup: Err("none (test)".into()),
    };
    crate::host::gather(&capabilities, true, Vec::new().into())
}

struct Setup {
    dir: PathBuf,
    seatbelt: Seatbelt,
}

impl Setup {
    fn new(tag: &str) -> Setup {
        let dir = std::env::temp_dir()
            .canonicalize()
            .unwrap()
            .join(format!("palisade-seatbelt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["bin", "ws", "runs"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let launcher = stand_in(&dir.join("bin"));
        let seatbelt = Seatbelt::new(launcher, dir.join("profiles")).unwrap();
        Setup { dir, seatbelt }
    }

    /// `sh -c SCRIPT` decided by a policy that allows it, on a Seatbelt host.
    fn resolve(&self, script: &str, limits: &str) -> (RunRequest, Resolved) {
        let config = format!("[defaults]\nallow_interpreters = true\nallow_inline_code = true\n{limits}");
        let config = Config::parse(&config, Path::new("seatbelt.toml")).unwrap();
        let host = seatbelt_host();
        let request = RunRequest {
            argv: ["/bin/sh", "-c", script].map(String::from).into(),
            cwd: Some(self.dir.join("ws").to_string_lossy().into_owned()),
            ..Default::default()
        };
        let ctx = Context {
            parent_pid: std::process::id(),
            uid: 0,
            gid: 0,
            serves_others: true,
            requester: palisade_protocol::HostIds { uid: 0, gid: 0 },
            groups: vec![],
            temp_root: self.dir.join("runs"),
            instance: "1-1".into(),
            run: 1,
            etc_view: None,
            trust: None,
            homes: None,
        };
        match Policy::new(config, &*host.files).decide(&host, &ctx, &request) {
            Decision::Allow(r) => (request, *r),
            other => panic!("{other:?}"),
        }
    }

    fn run(&self, script: &str, limits: &str) -> (RunResult, Vec<u8>, Resolved) {
        self.run_until(script, limits, std::future::pending())
    }

    fn run_until(
        &self,
        script: &str,
        limits: &str,
        cancel: impl Future<Output = ()> + Send,
    ) -> (RunResult, Vec<u8>, Resolved) {
        let (request, resolved) = self.resolve(script, limits);
        let prepared = self.seatbelt.prepare(1, &resolved, &request, &[]).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut sink = Collect::default();
        let result =
            rt.block_on(self.seatbelt.execute(1, &resolved, &request, prepared, &mut sink, cancel)).unwrap();
        assert!(matches!(
            sink.messages.first(),
            Some(ServerMessage::Started { run_id: 1, executor: Executor::MacosSeatbelt })
        ));
        (result, sink.stdout, resolved)
    }

    fn last_profile(&self) -> (PathBuf, String) {
        let path = std::fs::read_to_string(self.dir.join("bin/last-path")).unwrap();
        (PathBuf::from(path.trim()), std::fs::read_to_string(self.dir.join("bin/last.sb")).unwrap())
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Default)]
struct Collect {
    messages: Vec<ServerMessage>,
    stdout: Vec<u8>,
}

impl Sink for Collect {
    async fn send(&mut self, msg: ServerMessage) -> bool {
        if let ServerMessage::Output { stream: Stream::Stdout, data } = &msg {
            self.stdout.extend_from_slice(data);
        }
        self.messages.push(msg);
        true
    }
}

/// A process of the run that outlived it, by the pid it wrote in `file`.
fn alive(file: &Path) -> bool {
    let Ok(pid) = std::fs::read_to_string(file) else { return false };
    let pid: libc::pid_t = pid.trim().parse().unwrap();
    // A zombie waiting for its reaper is dead for this purpose.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = state.rfind(')').and_then(|i| state.get(i + 2..i + 3)).unwrap_or("");
    !state.is_empty() && state != "Z"
}

#[test]
fn a_run_goes_through_the_launcher_with_its_profile_which_is_removed_after() {
    let s = Setup::new("plain");
    let (result, stdout, resolved) = s.run("echo hello; exit 3", "");
    assert_eq!((result.status, stdout.as_slice()), (RunStatus::Exited { code: 3 }, &b"hello\n"[..]));
    let (path, text) = s.last_profile();
    // The policy's profile, and the rule of the run's marks (in the broker's private directory).
    let policys = palisade_policy::seatbelt::profile(&resolved, &[]).unwrap();
    let marks = text.strip_prefix(&policys).unwrap();
    let dir = s.dir.join("profiles").canonicalize().unwrap().join("marks");
    let tag = crate::host::instance::tag();
    let rule =
        format!("(allow file-read-data (literal \"{0}/{tag}-1\") (literal \"{0}/{tag}\"))", dir.display());
    assert!(marks.contains(&rule), "{marks}");
    let a = &result.attestation;
    assert_eq!(a.executor, Executor::MacosSeatbelt);
    assert_eq!(
        a.enforcement.seatbelt_sha256.as_deref(),
        Some(crate::journal::attest::sha256_hex(text.as_bytes()).as_str())
    );
    assert!(matches!(a.enforcement.memory, Memory::Sampled { bytes, .. } if bytes == 512 << 20));
    let set: Vec<RlimitName> = a.enforcement.rlimits.iter().map(|r| r.name).collect();
    let (cpu, nproc) = (RlimitName::Cpu, RlimitName::Nproc);
    assert_eq!(set, [cpu, nproc, RlimitName::Nofile, RlimitName::Fsize, RlimitName::Core]);
    assert_eq!(RLIMITS_SET, [cpu, RlimitName::Nofile, RlimitName::Fsize, RlimitName::Core]);
    // The profile and the run's directories are gone; the directory holding them is private.
    assert!(path.starts_with(s.dir.join("profiles")) && !path.exists());
    assert!(resolved.host_dirs.iter().all(|d| !d.exists()), "{:?}", resolved.host_dirs);
    assert_eq!(std::fs::metadata(s.dir.join("profiles")).unwrap().permissions().mode() & 0o777, 0o700);
}

/// RLIMIT_NPROC counts every process of the user: a run gets the room of
/// `max_processes` more than the user has as it starts, as its attestation
/// says and as the command finds it set.
#[test]
fn the_process_limit_is_the_users_processes_and_the_plans() {
    let s = Setup::new("processes");
    let count = || procs::of_uid(nix::unistd::getuid().as_raw()) as u64;
    // Other processes and threads of the user (this test binary's own
    // among them) come and go meanwhile: the limit is within what they
    // were before and after the run, at a moment when they hold still.
    let mut seen = Vec::new();
    let (stdout, limit) = loop {
        let before = count();
        let (result, stdout, _) = s.run("grep 'Max processes' /proc/self/limits", "max_processes = 20\n");
        let after = count();
        assert_eq!(result.status, RunStatus::Exited { code: 0 });
        let set = result.attestation.enforcement.rlimits.iter().find(|r| r.name == RlimitName::Nproc);
        let limit = set.and_then(|r| r.soft.zip(r.hard)).unwrap();
        assert_eq!(limit.0, limit.1);
        if (before.min(after) + 20..=before.max(after) + 20).contains(&limit.0) {
            break (stdout, limit);
        }
        seen.push((before, limit.0, after));
        assert!(seen.len() < 20, "never within the user's count + 20: (before, limit, after) {seen:?}");
    };
    let seen = String::from_utf8(stdout).unwrap();
    let fields: Vec<&str> = seen.split_whitespace().collect();
    assert_eq!(fields[2..4], [limit.0.to_string(), limit.1.to_string()], "{seen}");
    // The broker's own limit is not it: the run's was set for the run.
    let own = std::fs::read_to_string("/proc/self/limits").unwrap();
    assert!(!own.lines().any(|l| l.starts_with("Max processes") && l.contains(&format!(" {} ", limit.0))));
}

#[test]
fn the_deadline_kills_every_process_of_the_run_even_one_that_left_the_group() {
    let s = Setup::new("deadline");
    let pids = s.dir.join("ws");
    // One child in the group, one in a session of its own; both would sleep on.
    let script = format!(
        "sleep 1000 & echo $! > {0}/in-group; \
         setsid sh -c 'echo $$ $(ps -o pgid= -p $$) > {0}/detached.tmp; exec sleep 1000' & \
         while [ ! -s {0}/detached.tmp ]; do sleep 0.05; done; \
         mv {0}/detached.tmp {0}/detached; echo started; sleep 1000",
        pids.display()
    );
    let (result, stdout, _) = s.run(&script, "max_execution_time = 2\n");
    assert_eq!((result.status, stdout.as_slice()), (RunStatus::TimedOut, &b"started\n"[..]));
    assert!(!alive(&pids.join("in-group")), "a process of the group outlived the run");
    // It had left the run's group: it led a session and a group of its own.
    let detached = std::fs::read_to_string(pids.join("detached")).unwrap();
    let (pid, pgid) = detached.trim().split_once(' ').unwrap();
    assert_eq!(pid, pgid.trim());
    std::fs::write(pids.join("detached-pid"), pid).unwrap();
    assert!(!alive(&pids.join("detached-pid")), "the process in a session of its own outlived the run");
    // Outside a run, the same detached sleep lives on: the check above could fail.
    let mut outside = std::process::Command::new("setsid").args(["sleep", "1000"]).spawn().unwrap();
    std::fs::write(pids.join("outside"), outside.id().to_string()).unwrap();
    assert!(alive(&pids.join("outside")));
    outside.kill().unwrap();
    outside.wait().unwrap();
}

#[test]
fn output_past_the_quota_ends_the_run_and_never_leaves() {
    let s = Setup::new("quota");
    let (result, stdout, _) = s.run("yes", "max_output_bytes = 100000\n");
    assert_eq!(result.status, RunStatus::QuotaExceeded);
    assert_eq!((stdout.len(), result.stdout_bytes), (100_000, 100_000));
}

#[test]
fn memory_past_the_limit_ends_the_run() {
    let s = Setup::new("memory");
    // 200 MB held in a shell variable, against a limit of 64 MiB.
    let script = "a=$(head -c 200000000 /dev/zero | tr '\\0' x); sleep 1000";
    let (result, _, _) = s.run(script, "max_memory_mb = 64\nmax_execution_time = 20\n");
    assert_eq!(result.status, RunStatus::MemoryLimitExceeded);
    // The same command within a larger limit holds its memory to the end.
    let (result, _, _) =
        s.run("a=$(head -c 20000000 /dev/zero | tr '\\0' x); echo ${#a}", "max_memory_mb = 256\n");
    assert_eq!(result.status, RunStatus::Exited { code: 0 });
}

#[test]
fn a_cancelled_run_is_killed() {
    let s = Setup::new("cancel");
    let cancel = async { tokio::time::sleep(Duration::from_millis(300)).await };
    let (result, _, _) = s.run_until("echo $$ > pid; sleep 1000", "", cancel);
    assert_eq!(result.status, RunStatus::Cancelled);
    assert!(!alive(&s.dir.join("ws/pid")));
}

/// Waits up to 2 s for the process whose pid `file` holds to be gone.
fn gone(file: &Path) -> bool {
    for _ in 0..40 {
        if !alive(file) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn a_process_that_left_the_group_dies_with_a_run_that_ended_by_itself() {
    let s = Setup::new("orphan");
    let pid = s.dir.join("ws/detached");
    // It leaves the group and outlives its parent, the shell, which exits 0 at once.
    let script = format!(
        "setsid sh -c 'echo $$ > {0}.tmp; exec sleep 1000' & \
         while [ ! -s {0}.tmp ]; do sleep 0.05; done; mv {0}.tmp {0}; sleep 0.3",
        pid.display()
    );
    let (result, _, _) = s.run(&script, "");
    assert_eq!(result.status, RunStatus::Exited { code: 0 });
    assert!(gone(&pid), "a process that left the run's group outlived the run");
}

#[test]
fn a_dropped_run_is_killed() {
    let s = Setup::new("dropped");
    let (request, resolved) = s.resolve("echo $$ > pid; sleep 1000", "");
    let prepared = s.seatbelt.prepare(1, &resolved, &request, &[]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut sink = Collect::default();
    let run = s.seatbelt.execute(1, &resolved, &request, prepared, &mut sink, std::future::pending());
    // The future is dropped half way, as when its connection's task is aborted.
    let timed_out =
        rt.block_on(async { tokio::time::timeout(Duration::from_millis(500), run).await.is_err() });
    assert!(timed_out);
    assert!(gone(&s.dir.join("ws/pid")), "the run outlived its future");
}

#[test]
fn a_descriptor_palisade_inherited_does_not_reach_the_command() {
    let s = Setup::new("fds");
    let mut fds = [0; 2];
    // SAFETY: `fds` is valid for writing two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let [read, write] = fds;
    // By its path: `>&N` takes one digit in dash, and a test process running
    // others beside it holds descriptors past 9.
    let script = format!("echo leaked > /dev/fd/{write} && echo wrote");
    // Outside a run, a child inherits it and writes.
    let outside = std::process::Command::new("/bin/sh").args(["-c", &script]).output().unwrap();
    assert_eq!(String::from_utf8(outside.stdout).unwrap(), "wrote\n");
    let (result, stdout, _) = s.run(&script, "");
    assert_ne!(result.status, RunStatus::Exited { code: 0 });
    assert!(stdout.is_empty());
    // Marked in the run's child only: the broker's own descriptor is as it was.
    // SAFETY: fcntl on this test's own descriptor.
    assert_eq!(unsafe { libc::fcntl(write, libc::F_GETFD) } & libc::FD_CLOEXEC, 0);
    // SAFETY: both are this test's own, closed once.
    unsafe {
        libc::close(read);
        libc::close(write);
    }
}

/// A run leads a session of its own: it cannot join a process group of the
/// broker's session (another run's), which it could from the same session.
#[test]
fn a_run_cannot_join_a_process_group_outside_its_session() {
    let s = Setup::new("session");
    let mut group = std::process::Command::new("sleep").arg("1000").process_group(0).spawn().unwrap();
    let pgid = group.id();
    let join = format!("/usr/bin/python3 -c 'import os; os.setpgid(0, {pgid}); print(\"joined\")'");
    // A deadline: a run that joined the group would leave its own empty and be waited for.
    let (_, stdout, _) = s.run(&join, "max_execution_time = 10\n");
    assert!(!String::from_utf8_lossy(&stdout).contains("joined"), "{}", String::from_utf8_lossy(&stdout));
    // From this process's session, the same command joins it: the check above could fail.
    let outside = std::process::Command::new("/bin/sh").args(["-c", &join]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&outside.stdout), "joined\n", "{outside:?}");
    group.kill().unwrap();
    group.wait().unwrap();
}

/// A double fork into a session of its own, faster than any sample, with
/// the command exiting at once: nothing of the run's group or its
/// descendants holds the process then, only its marks (on a Mac, its
/// sandbox; here, what the stand-in's command carries). Outside a run the
/// same double fork lives on.
#[test]
fn a_process_that_escaped_before_any_sample_dies_with_the_run() {
    let s = Setup::new("escaped");
    let pid = s.dir.join("ws/escaped");
    let script =
        format!("setsid sh -c 'sleep 1000 & echo $! > {0}.tmp; mv {0}.tmp {0}'; exit 0", pid.display());
    let (result, _, _) = s.run(&script, "");
    assert_eq!(result.status, RunStatus::Exited { code: 0 });
    assert!(std::fs::metadata(&pid).is_ok_and(|m| m.len() > 0), "the double fork did not happen");
    assert!(gone(&pid), "a process that escaped before any sample outlived the run");
    // Outside a run, the same double fork lives on: the check above could fail.
    let outside = s.dir.join("outside-escaped");
    let script = format!("setsid sh -c 'sleep 1000 & echo $! > {0}.tmp; mv {0}.tmp {0}'", outside.display());
    assert!(std::process::Command::new("sh").args(["-c", &script]).status().unwrap().success());
    assert!(alive(&outside));
    let leftover: libc::pid_t = std::fs::read_to_string(&outside).unwrap().trim().parse().unwrap();
    // SAFETY: kill takes plain integers.
    unsafe { libc::kill(leftover, libc::SIGKILL) };
}

/// At start, a broker kills what the runs of a dead broker left running
/// (found by the profiles it left), and nothing of a broker still running.
#[test]
fn a_start_kills_what_a_dead_brokers_runs_left() {
    let s = Setup::new("leftovers");
    let profiles = s.dir.join("profiles").canonicalize().unwrap();
    let dead = "999999999-1";
    std::fs::write(profiles.join(format!("{dead}-3.sb")), "(version 1)").unwrap();
    let marked = |instance: &str, run: u64| {
        let marks = procs::Marks::of_run(&profiles, instance, run);
        std::process::Command::new("sleep")
            .arg("1000")
            .env(procs::MARKS_ENV, marks.environment())
            .spawn()
            .unwrap()
    };
    let (mut left, mut live) = (marked(dead, 3), marked(crate::host::instance::tag(), 4));
    s.seatbelt.kill_leftovers();
    let waited = left.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&waited), Some(libc::SIGKILL));
    assert!(live.try_wait().unwrap().is_none(), "a live broker's run was killed");
    live.kill().unwrap();
    live.wait().unwrap();
}
