//! Shared helpers for palisade's integration tests: locating the built
//! binaries, temporary directories, and running the real helper binary on a
//! plan with outer limits and a wall-clock bound, so that a broken sandbox
//! cannot hurt the machine.
#![cfg(target_os = "linux")]

use palisade_broker::engine::helper::{HelperCommand, Io, OuterLimit, Resource, release, send_plan, spawn};
use palisade_broker::host::requester::{self, Requester};
use palisade_policy::{JailSpec, Limits, build_plan};
use palisade_protocol::{
    ExitReport, HelperFailure, HelperRecord, JailPlan, LandlockReport, Tier, encode_plan,
};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The binaries an installation ships; `PALISADE_TEST_RELEASE_DIR` points
/// the suite at a build of them (`scripts/build-release.sh` makes one in
/// `target/release`), so that what is shipped is what is tested.
const SHIPPED: [&str; 3] = ["palisade-helper", "palisade", "palisaded"];

/// `python3` that imports the Python client of clients/python from its
/// source (the system's Python; nothing installed).
pub fn python_with_client() -> std::process::Command {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python/src");
    let mut command = std::process::Command::new("python3");
    command.env("PYTHONPATH", src).env("PYTHONDONTWRITEBYTECODE", "1");
    command
}

/// `target/REL`, which `scripts/py-venv.sh` makes (the virtual environment
/// `py-venv`, pytest's wheels `py-wheels`): a test that needs it fails
/// saying how to make it.
pub fn made_by_py_venv(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target").join(rel);
    assert!(p.exists(), "{} is missing: `bash scripts/py-venv.sh` makes it (.ci/run does)", p.display());
    p
}

/// PATH with the directory of the binaries under test first: a shell
/// script's `palisade` is the one being tested.
pub fn path_with_palisade() -> String {
    let bins = bin("palisade").parent().expect("the binaries' directory").display().to_string();
    format!("{bins}:{}", std::env::var("PATH").unwrap_or_default())
}

/// `python3 -m palisade_client ARGS`: that client's command line.
pub fn python_client(args: &[&str]) -> std::process::Command {
    let mut command = python_with_client();
    command.args(["-m", "palisade_client"]).args(args);
    command
}

/// A binary built by cargo next to the test executables (`target/<profile>/NAME`),
/// or a shipped one from `PALISADE_TEST_RELEASE_DIR`.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("test binary directory").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    if let Some(release) = std::env::var_os("PALISADE_TEST_RELEASE_DIR").filter(|_| SHIPPED.contains(&name)) {
        dir = std::path::Path::new(&release).canonicalize().expect("PALISADE_TEST_RELEASE_DIR");
    }
    let path = dir.join(name);
    if name == "palisade" {
        // What the CLI reads past the user's own broker is the tests', never the host's.
        let config = std::env::var_os(SYSTEM_CONFIG_ENV).map(PathBuf::from);
        assert!(
            config.is_some_and(|c| c.is_absolute()),
            "{SYSTEM_CONFIG_ENV} is not set: run the tests with cargo (.cargo/config.toml sets it)"
        );
    }
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (cargo test --workspace builds it)",
        path.display()
    );
    path
}

/// The variable naming the system configuration the CLI reads
/// (`/etc/palisade/palisade.toml` otherwise): `.cargo/config.toml` names
/// tests/no-system-broker.toml, and every test's CLI inherits it.
pub const SYSTEM_CONFIG_ENV: &str = "PALISADE_SYSTEM_CONFIG";

/// The tests' system configuration ([`SYSTEM_CONFIG_ENV`]), for a command
/// started with a cleared environment.
pub fn test_system_config() -> std::ffi::OsString {
    std::env::var_os(SYSTEM_CONFIG_ENV).expect("PALISADE_SYSTEM_CONFIG (set by .cargo/config.toml)")
}

/// The host uid and gid sandboxes started by root run as (the broker's default `sandbox_uid`).
pub const SANDBOX_ID: u32 = 65534;

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Says that the calling test skips what follows, and why (once per reason
/// and test), where `cargo test` shows it whatever the test's outcome:
/// `SKIPPED <test>: <reason>` written to the process's stderr itself, which
/// the test harness does not capture (it captures `eprintln!`). A test that
/// cannot run as this user passes without having tested that part, and
/// says so.
pub fn skipped(reason: &str) {
    use std::io::Write;
    thread_local!(static SAID: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) });
    let first = SAID.with(|said| {
        let mut said = said.borrow_mut();
        let new = !said.iter().any(|r| r == reason);
        if new {
            said.push(reason.to_string());
        }
        new
    });
    if first {
        let thread = std::thread::current();
        let test = thread.name().unwrap_or("a test");
        let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {reason}");
    }
}

/// A directory removed (recursively) when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        TempDir::new_in(&std::env::temp_dir().canonicalize().expect("temp dir"), tag)
    }
    /// One under `base` (a place the system's temporary directory is not).
    pub fn new_in(base: &Path, tag: &str) -> TempDir {
        let template = base.join(format!("palisade-{tag}-XXXXXX"));
        let path = nix::unistd::mkdtemp(&template).expect("mkdtemp");
        TempDir(path)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a helper run produced.
#[derive(Debug)]
pub struct Outcome {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub records: Vec<HelperRecord>,
    pub timed_out: bool,
}

impl Outcome {
    pub fn failure(&self) -> Option<&HelperFailure> {
        self.records.iter().find_map(|r| match r {
            HelperRecord::Failed(f) => Some(f),
            _ => None,
        })
    }
    pub fn exit(&self) -> Option<ExitReport> {
        self.records.iter().find_map(|r| match r {
            HelperRecord::Exit(e) => Some(*e),
            _ => None,
        })
    }
    pub fn landlock(&self) -> Option<LandlockReport> {
        self.records.iter().find_map(|r| match r {
            HelperRecord::Landlock(l) => Some(*l),
            _ => None,
        })
    }
    /// The probe's report: `Ok(detail)` for `ok`, `Err(errno name)` for `err`.
    pub fn probe(&self) -> Result<String, String> {
        let line = self.stdout.lines().next().unwrap_or("");
        if let Some(rest) = line.strip_prefix("ok") {
            Ok(rest.trim().to_string())
        } else if let Some(rest) = line.strip_prefix("err ") {
            Err(rest.split_whitespace().next().unwrap_or("").to_string())
        } else {
            panic!("no probe report in {self:#?}")
        }
    }
    /// Panics with everything known unless the command ran to a report.
    pub fn expect_ran(&self) -> &Self {
        assert!(
            self.failure().is_none() && !self.timed_out && self.exit().is_some(),
            "the sandboxed command did not run normally: {self:#?}"
        );
        self
    }
}

/// Outer bounds on the helper process, beyond anything the plan asks: if the
/// sandbox failed, a fork bomb would stop at `processes` (counted for the whole
/// uid), address space at 4 GiB per process, and so on.
pub fn outer_limits() -> Vec<OuterLimit> {
    vec![
        OuterLimit { resource: Resource::Nproc, value: 4096 },
        OuterLimit { resource: Resource::As, value: 4 << 30 },
        OuterLimit { resource: Resource::Cpu, value: 120 },
        OuterLimit { resource: Resource::Fsize, value: 256 << 20 },
    ]
}

/// A sandbox for tests: the probe visible and executable, a workspace, and
/// small limits.
pub struct Jail {
    pub spec: JailSpec,
    pub timeout: Duration,
    pub stdin: Option<std::fs::File>,
    pub dir: TempDir,
}

pub fn test_limits() -> Limits {
    Limits {
        memory_bytes: 1 << 30,
        // The outer bound's: the helper may not raise a hard limit.
        address_space_bytes: 4 << 30,
        cpu_seconds: 30,
        processes: 64,
        open_files: 256,
        file_size_bytes: 16 << 20,
        tmp_bytes: 16 << 20,
        shm_bytes: 16 << 20,
    }
}

impl Jail {
    pub fn new(tier: Tier) -> Jail {
        let dir = TempDir::new("jail");
        let workspace = dir.join("ws");
        std::fs::create_dir(&workspace).unwrap();
        let tmp = dir.join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        // Tier B started by root runs the command as the sandbox's uid (there
        // is no user namespace to map it), as the broker does: give it its
        // directories, as the broker gives it the run's own.
        let (uid, gid) = match tier {
            Tier::B if is_root() => {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
                for d in [&workspace, &tmp] {
                    std::os::unix::fs::chown(d, Some(SANDBOX_ID), Some(SANDBOX_ID)).unwrap();
                }
                (SANDBOX_ID, SANDBOX_ID)
            }
            _ => (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw()),
        };
        let probe = bin("probe");
        let probe_dir = probe.parent().unwrap().to_path_buf();
        let spec = JailSpec {
            tier,
            program: probe.to_string_lossy().into_owned(),
            argv: vec!["probe".into()],
            env: vec![("PATH".into(), "/usr/bin:/bin".into()), ("PALISADE_TEST".into(), "1".into())],
            cwd: workspace.clone(),
            read_write: vec![workspace],
            read_only: vec![probe_dir.clone()],
            exec_dirs: vec![probe_dir],
            tmp_dir: Some(tmp),
            host_network: false,
            limits: test_limits(),
            landlock_required: palisade_protocol::LandlockFeatures::FS,
            hostname: "palisade-test".into(),
            uid,
            gid,
            host_ids: is_root().then_some(palisade_protocol::HostIds { uid: SANDBOX_ID, gid: SANDBOX_ID }),
            // The test acts for itself: its own files are the sandbox's.
            acting_for: is_root().then_some(palisade_protocol::HostIds { uid: 0, gid: 0 }),
            hidden: vec![],
            held: vec![],
            pinned: vec![],
            home: None,
            parent_pid: std::process::id(),
            cgroup: None,
            no_fork: false,
            temp_workspace: None,
            write_bound: None,
            etc_view: None,
            layout: palisade_broker::host::layout(true, true),
            listeners: vec![],
            tcp_connect: None,
            files: vec![],
            umask: None,
            terminal: None,
        };
        Jail { spec, timeout: Duration::from_secs(60), stdin: None, dir }
    }

    pub fn workspace(&self) -> PathBuf {
        self.spec.read_write[0].clone()
    }

    /// The ids files made in the workspace belong to on the host: the
    /// workspace owner's (Tier C maps the sandbox's uid to them).
    pub fn workspace_owner(&self) -> (u32, u32) {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(self.workspace()).unwrap();
        (m.uid(), m.gid())
    }

    pub fn plan(&self, args: &[&str]) -> JailPlan {
        let mut spec = self.spec.clone();
        spec.argv.extend(args.iter().map(|a| a.to_string()));
        build_plan(&spec).expect("plan")
    }

    /// Runs the probe with `args` in this sandbox.
    pub fn run(&mut self, args: &[&str]) -> Outcome {
        let plan = self.plan(args);
        self.run_plan(&plan)
    }

    pub fn run_plan(&mut self, plan: &JailPlan) -> Outcome {
        let stdin = match self.stdin.take() {
            Some(f) => Io::Fd(f.into()),
            None => Io::Null,
        };
        run_helper(plan, stdin, self.timeout)
    }
}

/// The plan's host paths opened as a broker acting for this process opens them.
pub fn open_descriptors(plan: &JailPlan) -> Vec<std::os::fd::OwnedFd> {
    let me = Requester::me();
    me.act(|act| requester::open_paths(plan, &[], act, me.uid))
        .expect("act as this process")
        .unwrap_or_else(|e| panic!("cannot open the plan's paths: {e:?}"))
}

/// Runs the real helper binary on `plan` and collects everything.
pub fn run_helper(plan: &JailPlan, stdin: Io, timeout: Duration) -> Outcome {
    run_helper_with(plan, stdin, timeout, None)
}

/// [`run_helper`], the helper first given `warm` (a warm pool's sandbox):
/// it builds that much before the plan is sent.
pub fn run_helper_with(
    plan: &JailPlan,
    stdin: Io,
    timeout: Duration,
    warm: Option<palisade_protocol::WarmSpec>,
) -> Outcome {
    let mut child = spawn(HelperCommand {
        warm,
        helper: bin("palisade-helper"),
        cgroup_dir: None,
        stdin,
        stdout: Io::Piped,
        stderr: Io::Piped,
        // A system broker's warm helper takes its host ids at once: a
        // prlimit on it then needs CAP_SYS_RESOURCE, which root may lack
        // (as here). Its plans in these tests bomb nothing.
        outer_limits: if warm.is_some_and(|w| w.host_ids.is_some()) { vec![] } else { outer_limits() },
    })
    .expect("spawn palisade-helper");
    let descriptors = open_descriptors(plan);
    // A plan the broker could not clone the mounts of goes with its host
    // paths': the helper's own refusal is what a test of it looks at.
    let sent = palisade_broker::engine::capture::sent(plan, &descriptors);
    let sent = sent.unwrap_or(palisade_broker::engine::capture::Sent::Paths(&descriptors));
    let fds = sent.fds();
    let channel = child.plan_channel.take().expect("the plan channel");
    let encoded = encode_plan(plan).expect("encode plan");
    // The helper reads while this writes: a plan over the socket's buffer does not block forever.
    send_plan(channel, &encoded, &fds).expect("hand the helper its plan");
    release(&child.status).expect("release the command");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = (&mut out).take(1 << 20).read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = (&mut err).take(1 << 20).read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > timeout {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let records = child.read_status().expect("status records");
    Outcome {
        status,
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
        records,
        timed_out,
    }
}

/// The test probe's path, as a command's first argument.
pub fn probe() -> String {
    bin("probe").to_string_lossy().into_owned()
}

/// Bytes a command wrote, as text for assertions and messages.
/// A command's exit status and output, for a failed assertion's message.
pub fn said(o: &std::process::Output) -> String {
    format!("status {:?}\nstdout: {}\nstderr: {}", o.status.code(), text(&o.stdout), text(&o.stderr))
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A request to run the probe with `args` in `cwd`.
pub fn request(cwd: &Path, args: &[&str]) -> palisade_protocol::wire::RunRequest {
    let mut argv = vec![probe()];
    argv.extend(args.iter().map(|s| s.to_string()));
    palisade_protocol::wire::RunRequest {
        argv,
        cwd: Some(cwd.to_string_lossy().into_owned()),
        ..Default::default()
    }
}

/// Runs the probe directly, outside any sandbox: the counter-test.
pub fn probe_outside(args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(bin("probe")).args(args).output().expect("run probe");
    let line = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").to_string();
    if let Some(rest) = line.strip_prefix("ok") {
        Ok(rest.trim().to_string())
    } else if let Some(rest) = line.strip_prefix("err ") {
        Err(rest.split_whitespace().next().unwrap_or("").to_string())
    } else {
        panic!("no probe report: {out:?}")
    }
}

/// A TCP listener on host loopback that accepts in the background.
pub fn loopback_listener() -> (std::net::TcpListener, String) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    (l, addr)
}

/// Whether any process on the host has `token` in its command line.
pub fn process_with_token(token: &str) -> Option<u32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            if cmdline.split(|b| *b == 0).any(|arg| arg == token.as_bytes()) {
                return Some(pid);
            }
        }
    }
    None
}

/// The pid of `probe sleep TOKEN` (what `probe daemonize TOKEN` leaves
/// behind), and not of any process that merely has the token among its
/// arguments (the one that asked for it, say).
pub fn sleeper_with_token(token: &str) -> Option<u32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).collect();
            if args.len() == 3
                && args[0].ends_with(b"probe")
                && args[1] == b"sleep"
                && args[2] == token.as_bytes()
            {
                return Some(pid);
            }
        }
    }
    None
}

/// Polls `cond` every 20 ms until it holds or `limit` passes.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

pub use palisade_protocol::Tier as SandboxTier;

/// The unprivileged user the suites run things as when they run as root.
pub fn test_user() -> nix::unistd::User {
    let name = std::env::var("PALISADE_TEST_USER").unwrap_or_else(|_| "palisade-test".into());
    nix::unistd::User::from_name(&name).ok().flatten().unwrap_or_else(|| {
        panic!("no user {name:?}: create it (useradd --system --create-home {name}), as .ci/run does")
    })
}

/// When the suite runs as root, runs the tests of `module` (the caller's
/// `module_path!()`) again, all but `skip`, as the unprivileged test user,
/// and fails unless all of them pass: palisade's users are unprivileged. As
/// an ordinary user, this run is that half.
pub fn rerun_unprivileged(module: &str, skip: &str) {
    if !is_root() {
        assert!(!nix::unistd::geteuid().is_root());
        eprintln!("running as uid {}: this run is the unprivileged one", nix::unistd::geteuid());
        return;
    }
    let user = test_user();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid", &user.uid.to_string(), "--regid", &user.gid.to_string(), "--clear-groups", "--"])
        .arg(std::env::current_exe().unwrap())
        .arg(format!("{}::", test_prefix(module)))
        .args(["--test-threads", "4", "--skip", &format!("{}::{skip}", test_prefix(module))])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/tmp")
        .env("TMPDIR", "/tmp")
        .envs(std::env::var_os("PALISADE_TEST_RELEASE_DIR").map(|d| ("PALISADE_TEST_RELEASE_DIR", d)))
        .env(SYSTEM_CONFIG_ENV, test_system_config())
        .output()
        .unwrap();
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "as {}:\n{text}", user.name);
    assert!(text.contains("test result: ok"), "{text}");
    // What that half skipped, shown as this half shows its own (see `skipped`).
    use std::io::Write;
    let mut stderr = std::io::stderr().lock();
    for line in text.lines().filter(|l| l.starts_with("SKIPPED ")) {
        let _ = writeln!(stderr, "{line} (as {})", user.name);
    }
}

/// The name the test harness gives `module`'s tests before their own: its
/// path without the crate's name (`all::jail` gives `jail`).
fn test_prefix(module: &str) -> &str {
    module.split_once("::").map_or(module, |(_, rest)| rest)
}

/// `setpriv` arguments that run a command as `user` with no supplementary groups.
pub fn as_user(user: &nix::unistd::User) -> Vec<String> {
    vec![
        "setpriv".into(),
        "--reuid".into(),
        user.uid.to_string(),
        "--regid".into(),
        user.gid.to_string(),
        "--clear-groups".into(),
        "--".into(),
    ]
}

/// A prefix (for [`DaemonOptions::prefix`], or any command) that runs the
/// rest under `umask` (octal, as the shell takes it): what a unit's `UMask=`
/// does to the service it starts.
pub fn under_umask(umask: &str) -> Vec<String> {
    ["sh", "-c", &format!("umask {umask} && exec \"$@\""), "sh"].iter().map(|s| s.to_string()).collect()
}

/// The configuration every broker test starts from: the probe is visible.
pub fn base_config() -> String {
    let probe_dir = bin("probe").parent().unwrap().to_path_buf();
    format!("[defaults]\nread_only = [{:?}]\n", probe_dir.to_string_lossy())
}

/// A test's configuration: [`base_config`], `toml`'s lines before any table
/// header added to its `[defaults]`, then `toml`'s tables. Trust stages are
/// off unless `toml` has a `[trust]` table: the suites that are not about
/// them run declared tools as they always did, and none writes a state file
/// outside its temporary directory.
pub fn test_config(toml: &str) -> String {
    let (defaults, rest) = split_defaults(toml);
    let trust = if toml.contains("[trust]") { "" } else { "\n[trust]\nenabled = false\n" };
    format!("{}{}\n{}{trust}", base_config(), defaults, rest)
}

/// Splits test TOML into lines for `[defaults]` (those before any table
/// header) and the rest, so tests can add defaults to the base configuration.
fn split_defaults(config: &str) -> (String, String) {
    let header = if config.starts_with('[') { Some(0) } else { config.find("\n[").map(|i| i + 1) };
    match header {
        Some(i) => (config[..i].to_string(), config[i..].to_string()),
        None => (config.to_string(), String::new()),
    }
}

/// A running `palisaded`, stopped (SIGTERM) when dropped.
pub struct Daemon {
    pub child: std::process::Child,
    pub socket: PathBuf,
    pub dir: TempDir,
}

#[derive(Default)]
pub struct DaemonOptions {
    /// TOML appended to [`base_config`].
    pub config: String,
    /// Run the daemon as this user (via setpriv).
    pub user: Option<nix::unistd::User>,
    pub env: Vec<(String, String)>,
    /// A command the daemon runs under (e.g. `prlimit ... --`).
    pub prefix: Vec<String>,
    /// Start without `--socket`: the daemon picks its default socket, which
    /// must appear at this path.
    pub default_socket: Option<PathBuf>,
    /// The daemon's directory (its state, journal and socket) is this
    /// user's, as systemd makes a unit's state and runtime directories its
    /// `User=`'s; the prefix runs the daemon as that user ([`as_the_unit`]).
    pub owner: Option<nix::unistd::User>,
}

impl Daemon {
    pub fn start(config: &str) -> Daemon {
        Daemon::start_with(DaemonOptions { config: config.into(), ..Default::default() })
    }

    pub fn start_with(opts: DaemonOptions) -> Daemon {
        use std::os::unix::fs::PermissionsExt;
        let dir = TempDir::new("daemon");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        if let Some(u) = opts.user.as_ref().or(opts.owner.as_ref()) {
            nix::unistd::chown(dir.path(), Some(u.uid), Some(u.gid)).unwrap();
        }
        let socket = opts.default_socket.clone().unwrap_or_else(|| dir.join("palisade.sock"));
        let config = dir.join("palisade.toml");
        std::fs::write(&config, test_config(&opts.config)).unwrap();
        let log = std::fs::File::create(dir.join("palisaded.log")).unwrap();
        let mut argv: Vec<String> = opts.prefix.clone();
        argv.extend(opts.user.as_ref().map(as_user).unwrap_or_default());
        argv.push(bin("palisaded").to_string_lossy().into_owned());
        argv.extend(["--config".into(), config.to_string_lossy().into_owned()]);
        if opts.default_socket.is_none() {
            argv.extend(["--socket".into(), socket.to_string_lossy().into_owned()]);
        }
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        cmd.env("PALISADE_LOG", "palisade_broker=debug,info");
        // A journal of its own, never the host's.
        cmd.env("PALISADE_JOURNAL", dir.join("journal"));
        // Its state (trust stages, change sets, ...) too: never the host's.
        cmd.env("PALISADE_STATE", dir.join("state"));
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start palisaded");
        let mut d = Daemon { child, socket, dir };
        let up = eventually(Duration::from_secs(20), || {
            std::os::unix::net::UnixStream::connect(&d.socket).is_ok()
        });
        if !up {
            let _ = d.child.kill();
            panic!("palisaded did not start:\n{}", d.log());
        }
        d
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("palisaded.log")).unwrap_or_default()
    }

    /// The daemon's audit journal (unless its configuration names another).
    pub fn journal(&self) -> PathBuf {
        self.dir.join("journal")
    }

    /// How many runs the daemon has finished (its log says each).
    pub fn runs_finished(&self) -> usize {
        self.log().matches("run finished").count()
    }

    /// SIGTERM, then wait (bounded).
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }

    /// `palisade run --socket <this daemon> <args>` in `cwd`.
    pub fn run(&self, cwd: &Path, args: &[&str]) -> std::process::Output {
        palisade_cli(cwd, &["run", "--socket", self.socket.to_str().unwrap()], args, None)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

/// `len` bytes that give away a piece lost, repeated or out of place
/// (`salt` tells two streams apart); the probe's `pattern` writes them.
pub fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_right(13 + salt as u32) as u8).collect()
}

/// The state directory beside a test's journal (`PALISADE_STATE`): a
/// broker's trust stages, change sets and skills, never the host's.
pub fn state_beside(journal: impl AsRef<Path>) -> PathBuf {
    journal.as_ref().with_file_name("state")
}

/// A directory of its own for the audit journal of a CLI (or broker) run
/// as `user` (root when `None`): no test writes to the host's journal. The
/// journal is `path`, inside the returned directory (removed when dropped).
pub fn scratch_journal(user: Option<&nix::unistd::User>) -> (TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("journal");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    if let Some(u) = user {
        nix::unistd::chown(dir.path(), Some(u.uid), Some(u.gid)).unwrap();
    }
    let path = dir.join("journal");
    (dir, path)
}

/// Runs the `palisade` CLI: `pre` (subcommand and options), then `-- args`.
pub fn palisade_cli(
    cwd: &Path,
    pre: &[&str],
    args: &[&str],
    user: Option<&nix::unistd::User>,
) -> std::process::Output {
    let mut argv: Vec<String> = user.map(as_user).unwrap_or_default();
    argv.push(bin("palisade").to_string_lossy().into_owned());
    argv.extend(pre.iter().map(|s| s.to_string()));
    argv.push("--".into());
    argv.extend(args.iter().map(|s| s.to_string()));
    let (_journal, path) = scratch_journal(user);
    std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(cwd)
        .stdin(Stdio::null())
        .env("PALISADE_STATE", state_beside(&path))
        .env("PALISADE_JOURNAL", path)
        .output()
        .expect("run palisade")
}

/// `palisade ARGS` as `user` with exactly the supplementary `groups`, umask
/// 022 as a login shell has, in `cwd`, with `env` (no socket named unless
/// ARGS names one), and a scratch journal of the user's for a broker the
/// CLI would embed.
pub fn palisade_in_groups(
    user: &nix::unistd::User,
    groups: &[nix::unistd::Gid],
    cwd: &Path,
    args: &[&str],
    env: &[(&str, &Path)],
) -> std::process::Output {
    let mut argv: Vec<String> = ["sh", "-c", "umask 022 && exec \"$@\"", "sh"].map(String::from).into();
    argv.extend(as_user_in(user, groups));
    argv.push(bin("palisade").to_string_lossy().into_owned());
    argv.extend(args.iter().map(|a| a.to_string()));
    let (_journal, path) = scratch_journal(Some(user));
    std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(cwd)
        .stdin(Stdio::null())
        .env_remove("PALISADE_SOCKET")
        .env("PALISADE_STATE", state_beside(&path))
        .env("PALISADE_JOURNAL", &path)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// A directory the test user can use as a workspace (mode 0777 under a 0755 parent).
pub fn shared_workspace(dir: &TempDir, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ws = dir.join(name);
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o777)).unwrap();
    ws
}

/// The two users a root broker's tests serve: one that attacks, one whose
/// files are attacked. Made by the suite (as root) the first time it needs
/// them.
pub struct SystemUsers {
    pub attacker: nix::unistd::User,
    pub victim: nix::unistd::User,
}

/// `None` unless the suite runs as root (only root can make users, and only
/// a root broker serves other users).
pub fn system_users() -> Option<SystemUsers> {
    let user = |name: &str| {
        let add = ["useradd", "--system", "--create-home", "--shell", "/usr/sbin/nologin", name];
        made_once(|| nix::unistd::User::from_name(name).unwrap(), || add.map(String::from).into())
    };
    Some(SystemUsers { attacker: user("palisade-attacker")?, victim: user("palisade-victim")? })
}

/// An account of this host, as `find` finds it, made the first time by the
/// command `make` gives (its arguments decided once the others are done):
/// one at a time across every fixture here, which all write /etc/passwd and
/// /etc/group. `None`, and the test says it skips, unless the suite runs as
/// root.
fn made_once<T>(find: impl Fn() -> Option<T>, make: impl FnOnce() -> Vec<String>) -> Option<T> {
    static MADE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if !is_root() {
        skipped("not root: only root makes the users and groups of a system broker's tests");
        return None;
    }
    let _one_at_a_time = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = find() {
        return Some(found);
    }
    let argv = make();
    let out = std::process::Command::new(&argv[0]).args(&argv[1..]).output().expect("run the command");
    assert!(out.status.success(), "{argv:?}: {}", String::from_utf8_lossy(&out.stderr));
    Some(find().unwrap_or_else(|| panic!("{argv:?} made nothing")))
}

/// A directory owned by `user` with `mode`, made by root.
pub fn owned_dir(path: &Path, user: &nix::unistd::User, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path).unwrap();
    nix::unistd::chown(path, Some(user.uid), Some(user.gid)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A file owned by `user` with `mode` and `contents`, made by root.
pub fn owned_file(path: &Path, user: &nix::unistd::User, mode: u32, contents: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, contents).unwrap();
    nix::unistd::chown(path, Some(user.uid), Some(user.gid)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `from` copied to `to` (mode 0755) by `install`, in a process of its own,
/// for a test to execute. Written from the test's own process, the copy's
/// descriptor would be inherited by whatever another test forks in the
/// meantime, and executing the copy would fail with `ETXTBSY` ("Text file
/// busy") until that child execs: `install`'s descriptors are never in the
/// test's process.
pub fn copy_executable(from: &Path, to: &Path) {
    let out = std::process::Command::new("install")
        .args(["-m", "0755"])
        .arg(from)
        .arg(to)
        .stdin(Stdio::null())
        .output()
        .expect("run install");
    assert!(
        out.status.success(),
        "install {} {}: {}",
        from.display(),
        to.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `contents` as an executable file (mode 0755) at `path`, its directories
/// made: written to a file beside it that is never executed, then copied by
/// [`copy_executable`] (why the executable itself is not written here).
pub fn write_executable(path: &Path, contents: impl AsRef<[u8]>) {
    let dir = path.parent().expect("a file in a directory");
    std::fs::create_dir_all(dir).unwrap();
    let name = path.file_name().expect("a file name").to_string_lossy();
    let staged = dir.join(format!(".{name}.staged"));
    std::fs::write(&staged, contents).unwrap();
    copy_executable(&staged, path);
    std::fs::remove_file(&staged).unwrap();
}

/// Swaps two names (`renameat2(RENAME_EXCHANGE)`) over and over in a thread
/// until dropped: what a requester racing the broker's checks does.
pub struct Swapper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Swapper {
    pub fn start(a: &Path, b: &Path) -> Swapper {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (a, b) = (std::ffi::CString::new(a.as_os_str().as_encoded_bytes()).unwrap(), {
            std::ffi::CString::new(b.as_os_str().as_encoded_bytes()).unwrap()
        });
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut swaps = 0;
            while !flag.load(Ordering::Relaxed) {
                // SAFETY: both paths are NUL-terminated strings that outlive the call.
                let rc = unsafe {
                    libc::syscall(
                        libc::SYS_renameat2,
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                assert_eq!(rc, 0, "renameat2: {}", std::io::Error::last_os_error());
                swaps += 1;
            }
            swaps
        });
        Swapper { stop, thread: Some(thread) }
    }

    /// Stops swapping; how many swaps were made.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().map(|t| t.join().unwrap()).unwrap_or(0)
    }
}

/// Runs `attempt` while `swapper` swaps, at least `RACE_RUNS` times and on
/// until `RACE_THROUGH` attempts got through (`attempt` returns true when the
/// run went ahead rather than being refused), at most `RACE_MAX_RUNS` times:
/// most attempts meet a symlink at one of the checks, and a run that went
/// through is what shows the race reached the mount. Returns (swaps, runs that
/// went through, runs refused); fails the test when the race did not run.
pub fn race(swapper: Swapper, mut attempt: impl FnMut() -> bool) -> (u64, usize, usize) {
    const RACE_RUNS: usize = 100;
    const RACE_THROUGH: usize = 3;
    const RACE_MAX_RUNS: usize = 3000;
    let (mut through, mut refused) = (0, 0);
    while through + refused < RACE_RUNS || (through < RACE_THROUGH && through + refused < RACE_MAX_RUNS) {
        if attempt() {
            through += 1;
        } else {
            refused += 1;
        }
    }
    let swaps = swapper.stop();
    eprintln!("{swaps} swaps; {through} runs went through, {refused} were refused");
    assert!(
        swaps > 100 && through > 0,
        "the race did not run: {swaps} swaps, {through} of {} runs",
        through + refused
    );
    (swaps, through, refused)
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An origin server on host loopback for the egress tests: what a sandbox
/// reaches through the broker. It answers, by the first bytes of a
/// connection: `GET ` with a small HTTP response naming the path; `big N\n`
/// with N bytes; `ping` with `pong\n` (and holds the connection open);
/// anything else by echoing all it received once the client closes its
/// side. It counts the connections it accepted.
pub struct Origin {
    pub addr: std::net::SocketAddr,
    pub accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Origin {
    /// Listens on `ip` (a loopback address), on `port` (0: any).
    pub fn start(ip: &str, port: u16) -> std::io::Result<Origin> {
        let listener = std::net::TcpListener::bind((ip, port))?;
        let addr = listener.local_addr()?;
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                std::thread::spawn(move || Origin::serve(conn));
            }
        });
        Ok(Origin { addr, accepted })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn serve(mut conn: std::net::TcpStream) {
        use std::io::{Read, Write};
        let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(30)));
        let mut first = vec![0u8; 64 * 1024];
        let n = conn.read(&mut first).unwrap_or(0);
        first.truncate(n);
        let head = String::from_utf8_lossy(&first).into_owned();
        if head.starts_with("GET ") {
            let path = head.split_whitespace().nth(1).unwrap_or("");
            let body = format!("origin saw GET {path}");
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        } else if let Some(n) = head.strip_prefix("big ").and_then(|r| r.trim().parse::<usize>().ok()) {
            let chunk = vec![b'x'; 64 * 1024];
            let mut left = n;
            while left > 0 {
                let take = left.min(chunk.len());
                if conn.write_all(&chunk[..take]).is_err() {
                    return;
                }
                left -= take;
            }
        } else if head.starts_with("ping") {
            let _ = conn.write_all(b"pong\n");
            let _ = conn.read_to_end(&mut Vec::new());
        } else {
            let _ = conn.read_to_end(&mut first);
            let _ = conn.write_all(&first);
        }
    }
}

/// What a daemon holds, and what its runs left on the host: the figures the
/// soak, load and fault tests compare before and after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Census {
    /// Processes descended from the daemon (its idle helpers included).
    pub processes: usize,
    /// The daemon's open descriptors, but the user namespaces a system
    /// broker keeps, one per requester, for idmapping its files (bounded).
    pub descriptors: usize,
    /// Mounts in the daemon's mount namespace.
    pub mounts: usize,
    /// Entries under the run directories' root (`[policy] temp_root`), but
    /// the daemon's /etc snapshots.
    pub temp_entries: usize,
    /// The daemon's resident memory, KiB.
    pub rss_kib: u64,
}

impl Census {
    pub fn of(d: &Daemon, temp_root: &Path) -> Census {
        let pid = d.child.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let rss_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        Census {
            processes: descendants(pid).len(),
            descriptors: std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| {
                let kept = |e: &std::fs::DirEntry| {
                    std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("user:["))
                };
                d.flatten().filter(|e| !kept(e)).count()
            }),
            mounts: std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
                .map_or(0, |m| m.lines().count()),
            temp_entries: run_entries(temp_root),
            rss_kib,
        }
    }

    /// None of the figures but memory above `before`'s: nothing a run made
    /// is left. (Fewer is no leak: a daemon may close what it opened
    /// lazily before its first run.)
    pub fn nothing_left_since(&self, before: &Census) -> bool {
        self.processes <= before.processes
            && self.descriptors <= before.descriptors
            && self.mounts <= before.mounts
            && self.temp_entries <= before.temp_entries
    }
}

/// The entries below `temp_root` but the daemon's /etc snapshots (`etc-*`:
/// kept as long as the daemon runs, see broker/src/engine/etc_view.rs).
fn run_entries(temp_root: &Path) -> usize {
    let entries = std::fs::read_dir(temp_root).into_iter().flatten().flatten();
    let runs = entries.filter(|e| !e.file_name().to_string_lossy().starts_with("etc-"));
    runs.map(|e| 1 + count_entries(&e.path())).sum()
}

/// Every entry below `dir`, recursively (0 when it does not exist).
fn count_entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| 1 + count_entries(&e.path())).sum()
}

/// The pids descended from `pid` (children of any of its threads, and theirs).
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parent = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // The fields after the command name (which may hold spaces): state, ppid, ...
        let ppid = stat.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent.insert(p, ppid);
        }
    }
    let descends = |mut p: u32| {
        while let Some(&up) = parent.get(&p) {
            if up == pid {
                return true;
            }
            p = up;
        }
        false
    };
    parent.keys().copied().filter(|&p| descends(p)).collect()
}

/// A tmpfs the test mounted (as root) at `fs` inside a directory of its
/// own (nosuid, nodev, noexec), unmounted when dropped, whatever happens.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `options`: the mount's, e.g. `size=256k,mode=0755`.
    pub fn mount(dir: &TempDir, options: &str) -> Tmpfs {
        use nix::mount::MsFlags;
        let fs = dir.join("fs");
        std::fs::create_dir(&fs).unwrap();
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        nix::mount::mount(Some("tmpfs"), &fs, Some("tmpfs"), flags, Some(options)).unwrap();
        Tmpfs(fs)
    }

    /// A tmpfs mounted on `dir` itself (root only).
    pub fn mount_at(dir: &Path, options: &str) -> Tmpfs {
        use nix::mount::MsFlags;
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        nix::mount::mount(Some("tmpfs"), dir, Some("tmpfs"), flags, Some(options)).unwrap();
        Tmpfs(dir.to_path_buf())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A group of `name` on this host, made (`groupadd --system`) the first
/// time a test needs it; `None` unless the suite runs as root.
pub fn system_group(name: &str) -> Option<nix::unistd::Group> {
    made_once(
        || nix::unistd::Group::from_name(name).unwrap(),
        || ["groupadd", "--system", name].map(String::from).into(),
    )
}

/// `setpriv` arguments that run a command as `user` with exactly the
/// supplementary groups `groups` (none: as [`as_user`]).
pub fn as_user_in(user: &nix::unistd::User, groups: &[nix::unistd::Gid]) -> Vec<String> {
    let mut argv = as_user(user);
    if !groups.is_empty() {
        let list: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        let at = argv.iter().position(|a| a == "--clear-groups").unwrap();
        argv[at] = "--groups".into();
        argv.insert(at + 1, list.join(","));
    }
    argv
}

/// A named pipe a sandboxed `probe read GATE` blocks on until the test
/// opens it: a run that stays in progress exactly as long as the test
/// wants, with no timing involved.
pub struct Gate {
    pub dir: PathBuf,
    pub path: PathBuf,
}

impl Gate {
    /// A gate in a directory of its own under `base` (mode 0755), readable
    /// by `owner` (root when `None`), who owns it.
    pub fn new(base: &Path, owner: Option<&nix::unistd::User>) -> Gate {
        use std::os::unix::fs::PermissionsExt;
        let dir = base.join("gate");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.join("fifo");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        if let Some(u) = owner {
            nix::unistd::chown(&path, Some(u.uid), Some(u.gid)).unwrap();
        }
        Gate { dir, path }
    }

    /// Lets the run that waits on the gate go on: writes `go` once it has
    /// opened the gate (waiting for that at most `limit`); false if it
    /// never did.
    pub fn open(&self, limit: Duration) -> bool {
        use std::os::unix::fs::OpenOptionsExt;
        let mut writer = None;
        // Opening a pipe for writing without blocking fails until a reader has it open.
        eventually(limit, || {
            writer =
                std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&self.path).ok();
            writer.is_some()
        });
        match writer {
            Some(mut w) => std::io::Write::write_all(&mut w, b"go").is_ok(),
            None => false,
        }
    }
}

/// The segments of the journal in `dir`, oldest first.
pub fn journal_segments(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    found.sort();
    found
}

/// A segment's bytes up to its zero-filled tail.
pub fn segment_content(segment: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(segment).unwrap();
    bytes.truncate(bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len()));
    bytes
}

/// Every whole record of the journal in `dir`, oldest first.
pub fn journal_records(dir: &Path) -> Vec<serde_json::Value> {
    let mut all = Vec::new();
    for s in journal_segments(dir) {
        let text = String::from_utf8(segment_content(&s)).unwrap();
        all.extend(
            text.split_inclusive('\n')
                .filter(|l| l.ends_with('\n'))
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", s.display()))),
        );
    }
    all
}

/// The system unit, systemd/palisade.service.
pub fn unit() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd/palisade.service"))
        .unwrap()
}

/// A setting of the system unit.
pub fn unit_setting(key: &str) -> String {
    let prefix = format!("{key}=");
    unit()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {key}= in the unit"))
        .into()
}

/// Capabilities (`CAP_SYS_ADMIN` ...) as setpriv's `--bounding-set` adds them.
pub fn setpriv_caps(capabilities: &[String]) -> String {
    capabilities
        .iter()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect::<Vec<_>>()
        .join(",")
}

/// The unit's capability bounding set.
pub fn unit_caps() -> Vec<String> {
    unit_setting("CapabilityBoundingSet").split_whitespace().map(String::from).collect()
}

/// `config` with `[policy] temp_root` set to `dir`: where a broker run as
/// the unit's user keeps its runs' host directories, as the unit's runtime
/// directory is that user's (the host's `/run/palisade/runs` is root's, and
/// other tests' root brokers use it).
pub fn with_temp_root(config: &str, dir: &Path) -> String {
    let line = format!("temp_root = {:?}\n", dir.to_string_lossy());
    match config.find("[policy]\n") {
        Some(i) => format!("{}[policy]\n{line}{}", &config[..i], &config[i + "[policy]\n".len()..]),
        None => format!("{config}\n[policy]\n{line}"),
    }
}

/// The runs' directory of a broker run as the unit's `user`, under `base`:
/// `base/run/runs`, in a directory that is `user`'s (0755), as systemd makes
/// the unit's runtime directory; the broker makes the rest.
pub fn unit_runs_dir(base: &Path, user: &nix::unistd::User) -> PathBuf {
    owned_dir(&base.join("run"), user, 0o755);
    base.join("run/runs")
}

/// The system unit's `User=`, made on this host (`useradd --system`, in the
/// group of its name where there is one, as systemd-sysusers makes it) the
/// first time a test needs it; `None` unless the suite runs as root.
pub fn unit_user() -> Option<nix::unistd::User> {
    let name = unit_setting("User");
    let make = || {
        let mut add = vec!["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"];
        match nix::unistd::Group::from_name(&name).unwrap() {
            Some(_) => add.extend(["-g", &name]),
            None => add.push("--user-group"),
        }
        add.push(&name);
        add.into_iter().map(String::from).collect()
    };
    made_once(|| nix::unistd::User::from_name(&name).unwrap(), make)
}

/// A palisaded started as the system unit starts it, as far as the process
/// goes: as the unit's `user` with `capabilities` ambient and as its bounding
/// set, no supplementary groups, its umask and no_new_privs. (Its state
/// directories must be that user's: [`DaemonOptions::owner`].)
pub fn as_the_unit(capabilities: &[String], user: &nix::unistd::User) -> Vec<String> {
    let start = format!("umask {} && exec \"$@\"", unit_setting("UMask"));
    let caps = format!("-all,{}", setpriv_caps(capabilities));
    let (uid, gid) = (user.uid.to_string(), user.gid.to_string());
    let setpriv = ["setpriv", "--reuid", &uid, "--regid", &gid, "--clear-groups", "--no-new-privs"];
    let sets = ["--inh-caps", &caps, "--ambient-caps", &caps, "--bounding-set", &caps, "--"];
    let shell = ["sh", "-c", &start, "sh"];
    shell.iter().chain(&setpriv).chain(&sets).map(|s| s.to_string()).collect()
}

/// `cmd` will start in a session of its own, with `controlling` (a
/// terminal open in the child: 0 when its stdin is one) as its controlling
/// terminal, or none.
pub fn in_own_session(cmd: &mut std::process::Command, controlling: Option<std::os::fd::RawFd>) {
    // SAFETY: setsid and ioctl are async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            if let Some(tty) = controlling
                && libc::ioctl(tty, libc::TIOCSCTTY, 0) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Starts `cmd` in a session of its own whose controlling terminal is a new
/// pty; returns once a question ending in `[y/N] ` is at the terminal, with
/// the terminal's other end and the question.
pub fn spawn_at_terminal(mut cmd: std::process::Command) -> (std::process::Child, std::fs::File, String) {
    let pty = nix::pty::openpty(None, None).unwrap();
    in_own_session(&mut cmd, Some(std::os::fd::AsRawFd::as_raw_fd(&pty.slave)));
    let child = cmd.spawn().unwrap();
    drop(pty.slave);
    let mut prompt = Vec::new();
    let mut master = std::fs::File::from(pty.master);
    while !prompt.ends_with(b"[y/N] ") {
        let mut byte = [0u8; 1];
        std::io::Read::read_exact(&mut master, &mut byte).unwrap();
        prompt.push(byte[0]);
    }
    (child, master, text(&prompt))
}
