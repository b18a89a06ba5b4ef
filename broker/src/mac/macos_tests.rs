//! What Seatbelt enforces, on a Mac (these tests are built and run on macOS
//! only): each forbidden attempt is made from inside a run and fails, and
//! the same attempt made by the test itself succeeds, so each could fail.
//! The paths an attempt uses are read from a file in the workspace, never
//! named on the command line: the policy's scope check would refuse the
//! run before Seatbelt is reached.

use crate::engine::stream::Sink;
use crate::seatbelt::*;
use palisade_policy::{Config, Context, Decision, Policy};
use palisade_protocol::wire::Stream;
use palisade_protocol::wire::{RunRequest, RunResult, RunStatus, ServerMessage};
use std::io::Read;
use std::path::{Path, PathBuf};

struct Mac {
    dir: PathBuf,
    seatbelt: Seatbelt,
}

impl Mac {
    fn new(tag: &str) -> Mac {
        let base = std::env::temp_dir().canonicalize().unwrap();
        let dir = base.join(format!("palisade-seatbelt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["ws", "outside", "runs"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let seatbelt = Seatbelt::new(PathBuf::from(SANDBOX_EXEC), dir.join("profiles")).unwrap();
        Mac { dir, seatbelt }
    }

    /// `sh -c SCRIPT` in the workspace, under `extra` policy settings.
    fn run(&self, script: &str, extra: &str) -> (RunResult, String) {
        let (resolved, request) = match self.decide(script, extra) {
            (Decision::Allow(r), request) => (r, request),
            (other, _) => panic!("{other:?}"),
        };
        let prepared = self.seatbelt.prepare(1, &resolved, &request, &[]).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut sink = Text::default();
        let cancel = std::future::pending();
        let result =
            rt.block_on(self.seatbelt.execute(1, &resolved, &request, prepared, &mut sink, cancel)).unwrap();
        (result, sink.0)
    }

    /// The decision on `sh -c SCRIPT`, on this Mac, under `extra` policy settings.
    fn decide(&self, script: &str, extra: &str) -> (Decision, RunRequest) {
        let toml = format!("[defaults]\nallow_interpreters = true\nallow_inline_code = true\n{extra}");
        let config = Config::parse(&toml, Path::new("macos.toml")).unwrap();
        let host = super::host::gather(Path::new(SANDBOX_EXEC));
        let request = RunRequest {
            argv: ["/bin/sh", "-c", script].map(String::from).into(),
            cwd: Some(self.dir.join("ws").to_string_lossy().into_owned()),
            ..Default::default()
        };
        let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let ctx = Context {
            parent_pid: std::process::id(),
            uid,
            gid,
            serves_others: uid == 0,
            requester: palisade_protocol::HostIds { uid, gid },
            groups: vec![],
            temp_root: self.dir.join("runs"),
            instance: "1-1".into(),
            run: 1,
            etc_view: None,
            trust: None,
            homes: None,
        };
        (Policy::new(config, &*host.files).decide(&host, &ctx, &request), request)
    }

    /// Writes `path` into the workspace's file `name`, for a script to read.
    fn name(&self, name: &str, path: &Path) {
        std::fs::write(self.dir.join("ws").join(name), path.to_string_lossy().as_bytes()).unwrap();
    }
}

impl Drop for Mac {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Default)]
struct Text(String);

impl Sink for Text {
    async fn send(&mut self, msg: ServerMessage) -> bool {
        if let ServerMessage::Output { stream: Stream::Stdout, data } = msg {
            self.0.push_str(&String::from_utf8_lossy(&data));
        }
        true
    }
}

fn exited(r: &RunResult) -> Option<i32> {
    match r.status {
        RunStatus::Exited { code } => Some(code),
        _ => None,
    }
}

#[test]
fn the_basic_utilities_run_and_the_workspace_is_writable() {
    let m = Mac::new("basics");
    let (r, out) = m.run("echo hello > note; ls -la; cat note; git --version && echo ok", "");
    assert_eq!(exited(&r), Some(0), "{out}");
    assert!(out.contains("hello") && out.contains("git version") && out.ends_with("ok\n"), "{out}");
    assert!(m.dir.join("ws/note").exists());
}

/// What the host runs later outside any sandbox (git's hooks and
/// configuration, direnv's `.envrc`, an editor's tasks) cannot be written
/// from a run, in any case of its name; the test itself writes them.
#[test]
fn files_the_host_runs_cannot_be_written() {
    let m = Mac::new("host-executed");
    let attempts = [
        "mkdir -p .git/hooks && echo planted > .git/hooks/pre-commit",
        "echo '[core] fsmonitor = planted' > .git/config",
        "echo planted > .ENVRC",
        "mkdir -p .vscode && echo planted > .vscode/tasks.json",
        "git init -q repo",
    ];
    for attempt in attempts {
        let (r, out) = m.run(attempt, "");
        assert_ne!(exited(&r), Some(0), "{attempt}: {out}");
    }
    for planted in
        [".git/hooks/pre-commit", ".git/config", ".ENVRC", ".vscode/tasks.json", "repo/.git/config"]
    {
        let path = m.dir.join("ws").join(planted);
        assert!(!path.exists() || std::fs::read_to_string(&path).is_ok_and(|t| !t.contains("planted")));
    }
    // The counter-check: the data git keeps inside `.git` is written. `.git`
    // itself is held (a run may not make it), so the test makes it first.
    std::fs::create_dir_all(m.dir.join("ws/.git/objects")).unwrap();
    let (r, out) = m.run("echo data > .git/objects/x && echo ok > plain", "");
    assert_eq!(exited(&r), Some(0), "{out}");
    assert_eq!(std::fs::read_to_string(m.dir.join("ws/.git/objects/x")).unwrap(), "data\n");
    std::fs::create_dir_all(m.dir.join("ws/.git/hooks")).unwrap();
    std::fs::write(m.dir.join("ws/.git/hooks/pre-commit"), "by the test").unwrap();
}

/// The other volumes are not read through `/System/Volumes` (the data
/// volume holds every home), nor Homebrew's `/usr/local`; the system's own
/// directories are.
#[test]
fn the_data_volume_and_usr_local_are_not_read() {
    let m = Mac::new("volumes");
    let secret = m.dir.join("outside/secret");
    std::fs::write(&secret, "SECRET-VALUE").unwrap();
    let through_data = PathBuf::from(format!("/System/Volumes/Data{}", secret.display()));
    assert_eq!(std::fs::read_to_string(&through_data).unwrap(), "SECRET-VALUE");
    m.name("target", &through_data);
    let (r, out) = m.run("cat \"$(cat target)\"", "");
    assert_ne!(exited(&r), Some(0));
    assert!(!out.contains("SECRET-VALUE"), "{out}");
    if Path::new("/usr/local").exists() {
        let (r, out) = m.run("ls /usr/local", "");
        assert_ne!(exited(&r), Some(0), "{out}");
    }
    let (r, out) = m.run("ls /usr/bin/true /System/Library >/dev/null && echo ok", "");
    assert_eq!(exited(&r), Some(0), "{out}");
}

#[test]
fn a_file_outside_the_workspace_cannot_be_read() {
    let m = Mac::new("read");
    let secret = m.dir.join("outside/secret");
    std::fs::write(&secret, "SECRET-VALUE").unwrap();
    m.name("target", &secret);
    let (r, out) = m.run("cat \"$(cat target)\"", "");
    assert_ne!(exited(&r), Some(0));
    assert!(!out.contains("SECRET-VALUE"), "{out}");
    // The test itself reads it.
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "SECRET-VALUE");
}

#[test]
fn nothing_is_written_outside_the_workspace() {
    let m = Mac::new("write");
    let target = m.dir.join("outside/planted");
    m.name("target", &target);
    let (r, _) = m.run("echo planted > \"$(cat target)\"", "");
    assert_ne!(exited(&r), Some(0));
    assert!(!target.exists());
    std::fs::write(&target, "planted").unwrap();
    assert!(target.exists());
}

#[test]
fn the_network_is_closed_unless_the_policy_opens_it() {
    let m = Mac::new("network");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!("/usr/bin/nc -z -w 2 127.0.0.1 {port} && echo connected");
    let (_, out) = m.run(&script, "");
    assert!(!out.contains("connected"), "{out}");
    assert!(listener.accept().is_err(), "a connection from inside the sandbox reached the listener");
    // With the host's network, the same command connects.
    let (_, out) = m.run(&script, "network = \"allow_all\"\n");
    assert!(out.contains("connected"), "{out}");
    let mut accepted = listener.accept().map(|(s, _)| s);
    if let Ok(s) = accepted.as_mut() {
        let _ = s.read(&mut [0u8; 1]);
    }
    assert!(accepted.is_ok());
}

/// Allowed domains cannot be enforced by a profile (it could only open every
/// address, the Mac's own local services included): such a run is refused,
/// never run with the host's network. The local service it would reach is
/// there: the test itself connects to it.
#[test]
fn allowed_domains_are_refused_rather_than_opening_the_hosts_network() {
    let m = Mac::new("domains");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!("/usr/bin/nc -z -w 2 127.0.0.1 {port} && echo connected");
    for egress in ["none", "preflight"] {
        let extra = format!("egress = \"{egress}\"\nnetwork = {{ allow_domains = [\"example.org\"] }}\n");
        match m.decide(&script, &extra).0 {
            Decision::Deny(d) => assert_eq!(d.rule, "egress.domains_unenforced", "{}", d.reason),
            other => panic!("{egress}: {other:?}"),
        }
    }
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
}

/// A run forks at most `max_processes` more processes than its user had as
/// it started (RLIMIT_NPROC counts every process of the user): a loop
/// starting far more gets `fork` refused past them; the test itself starts
/// as many.
#[test]
fn a_run_cannot_fork_past_its_process_limit() {
    let m = Mac::new("processes");
    // What started is what `jobs` lists: a fork refused makes no job.
    let script = "n=0; while [ $n -lt 40 ]; do sleep 5 & n=$((n+1)); done 2>/dev/null; \
                  jobs -p > started; echo started $(wc -l < started); kill $(cat started) 2>/dev/null; wait";
    let (_, out) = m.run(script, "max_processes = 8\n");
    let started: usize = out.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(out.starts_with("started") && (1..=8).contains(&started), "{out}");
    let mut outside: Vec<_> =
        (0..40).map(|_| std::process::Command::new("/bin/sleep").arg("5").spawn().unwrap()).collect();
    for child in &mut outside {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

/// A double fork into a session of its own, with the command exiting at
/// once, does not outlive the run: its sandbox marks it (`sandbox_check`
/// on the run's mark). Outside a run the same double fork lives on.
#[test]
fn a_process_that_escaped_the_group_dies_with_the_run() {
    let m = Mac::new("escaped");
    let pid_of =
        |file: &Path| -> libc::pid_t { std::fs::read_to_string(file).unwrap().trim().parse().unwrap() };
    // SAFETY: kill with signal 0 only asks whether the process exists.
    let alive = |pid: libc::pid_t| unsafe { libc::kill(pid, 0) } == 0;
    // macOS has no setsid(1): perl's fork, then setsid in the child, whose parent exits.
    let script = "/usr/bin/perl -MPOSIX -e 'if (my $p = fork) { open F, \">escaped\"; print F $p; exit } \
                  POSIX::setsid(); exec \"/bin/sleep\", \"1000\"'; exit 0";
    let (r, out) = m.run(script, "");
    assert_eq!(exited(&r), Some(0), "{out}");
    let escaped = pid_of(&m.dir.join("ws/escaped"));
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(!alive(escaped), "a process that left the run's group outlived the run");
    // The sleep's output goes nowhere: the pipe read here closes with the echo.
    let outside = std::process::Command::new("sh")
        .args(["-c", "(sleep 1000 >/dev/null 2>&1 & echo $!) &"])
        .output()
        .unwrap();
    let leftover: libc::pid_t = String::from_utf8_lossy(&outside.stdout).trim().parse().unwrap();
    assert!(alive(leftover));
    // SAFETY: kill takes plain integers.
    unsafe { libc::kill(leftover, libc::SIGKILL) };
}

/// launchd is outside the sandbox: a run that could set its environment or
/// submit a job there would run code outside it later. Both are refused;
/// the test itself can do both (and undoes them).
#[test]
fn launchctl_cannot_reach_outside_the_run() {
    let m = Mac::new("launchctl");
    let label = format!("dev.palisade.planted.{}", std::process::id());
    let script = format!(
        "launchctl setenv PALISADE_PLANTED 1; launchctl submit -l {label} -- /usr/bin/true; echo tried"
    );
    let (_, out) = m.run(&script, "");
    assert!(out.contains("tried"), "{out}");
    let launchctl = |args: &[&str]| std::process::Command::new("launchctl").args(args).output().unwrap();
    let planted = launchctl(&["getenv", "PALISADE_PLANTED"]);
    let submitted = launchctl(&["list", &label]).status.success();
    // Undone before anything is asserted, should the run have reached launchd.
    launchctl(&["unsetenv", "PALISADE_PLANTED"]);
    launchctl(&["remove", &label]);
    assert!(String::from_utf8_lossy(&planted.stdout).trim().is_empty(), "launchctl setenv reached launchd");
    assert!(!submitted, "launchctl submit reached launchd");
    // The test itself reaches launchd: the checks above could fail.
    assert!(launchctl(&["setenv", "PALISADE_PLANTED", "1"]).status.success());
    assert_eq!(String::from_utf8_lossy(&launchctl(&["getenv", "PALISADE_PLANTED"]).stdout).trim(), "1");
    assert!(launchctl(&["unsetenv", "PALISADE_PLANTED"]).status.success());
}

/// Another process's details (`ps` of the test's own process), the
/// hardware's serial number (`ioreg`) and the firmware's variables
/// (`nvram`) are not read from a run; the test itself reads all three.
/// What stops `ps` is the `sysctl-read` list, which names nothing about
/// processes (`ps` asks `kern.proc`), not the `process-info*` deny: that one
/// is checked in the profile's text only (golden), as `file-map-executable` is.
#[test]
fn other_processes_the_hardware_and_the_firmware_are_not_read() {
    let m = Mac::new("process-info");
    let me = std::process::id();
    let attempts = [
        format!("/bin/ps -o comm= -p {me}"),
        "/usr/sbin/ioreg -c IOPlatformExpertDevice -d 2 | grep IOPlatformSerialNumber".to_string(),
        "/usr/sbin/nvram -p | head -n 3".to_string(),
    ];
    for attempt in &attempts {
        let (_, out) = m.run(&format!("{attempt} > seen 2>/dev/null; wc -c < seen"), "");
        assert_eq!(out.trim(), "0", "{attempt}: something was read");
        let outside = std::process::Command::new("sh").args(["-c", attempt]).output().unwrap();
        assert!(!outside.stdout.is_empty(), "{attempt}: nothing read outside a run either");
    }
}

/// SIGHUP reloads `palisaded`'s configuration on a Mac, as on Linux (what
/// `launchctl kill HUP` sends): the daemon's life is the one both share.
#[test]
fn sighup_reloads_the_configuration() {
    let dir =
        std::env::temp_dir().canonicalize().unwrap().join(format!("palisade-mac-hup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    super::hangup::sighup_reloads(&dir, |config| {
        crate::mac::broker(config, PathBuf::from(SANDBOX_EXEC), || {
            super::host::gather(Path::new(SANDBOX_EXEC))
        })
    });
    let _ = std::fs::remove_dir_all(&dir);
}
