//! The benchmark itself: Linux launchers only (see `main.rs`).

use crate::{egress, plugins};
use palisade_broker::cli::client::Client;
use palisade_broker::engine::etc_view::{EtcView, Snapshot};
use palisade_broker::engine::helper::{HelperCommand, Io, release, send_plan, spawn};
use palisade_broker::host::requester::{self, Requester};
use palisade_policy::{Config, Context, Decision, HostCapabilities, Policy};
use palisade_protocol::wire::{RunRequest, RunStatus, ServerMessage};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

struct Opts {
    quick: bool,
    rounds: usize,
    runs: usize,
    warmup: usize,
    duration: Duration,
    output_bytes: u64,
}

pub(crate) fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("binary directory").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(name)
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A launcher: something that runs a payload once and waits for it.
trait Launch: Sync {
    fn name(&self) -> &str;
    fn once(&self, payload: &[&str]);
}

#[derive(Clone)]
struct Prefix {
    name: String,
    prefix: Vec<String>,
    cwd: PathBuf,
    env: Vec<(String, String)>,
}

impl Launch for Prefix {
    fn name(&self) -> &str {
        &self.name
    }
    fn once(&self, payload: &[&str]) {
        let mut argv: Vec<&str> = self.prefix.iter().map(String::as_str).collect();
        argv.extend(payload);
        let st = Command::new(argv[0])
            .args(&argv[1..])
            .current_dir(&self.cwd)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("spawn");
        assert!(st.success(), "{} failed: {st}", self.name);
    }
}

/// An agent's call: a connection to the broker's socket, one request, its
/// result (what `palisade run` does, without starting a process for it).
struct SocketClient {
    name: &'static str,
    socket: PathBuf,
    cwd: PathBuf,
}

impl Launch for SocketClient {
    fn name(&self) -> &str {
        self.name
    }
    fn once(&self, payload: &[&str]) {
        let mut c = Client::connect(&self.socket).expect("connect to palisaded");
        let req = RunRequest {
            argv: payload.iter().map(|s| s.to_string()).collect(),
            cwd: Some(self.cwd.to_string_lossy().into_owned()),
            ..Default::default()
        };
        let r = c.run(req, |_| {}).expect("run");
        assert_eq!(r.status, RunStatus::Exited { code: 0 }, "{}", self.name);
    }
}

/// An agent's call in a session: a connection, one command in the
/// session the broker holds (its sandbox built once, at the start), its
/// result.
struct SessionClient {
    name: &'static str,
    socket: PathBuf,
    session: String,
}

impl SessionClient {
    /// Starts the session `name` in `cwd` on the broker at `socket`.
    fn start(name: &'static str, socket: &Path, cwd: &Path) -> SessionClient {
        let mut c = Client::connect(socket).expect("connect to palisaded");
        let run = RunRequest { cwd: Some(cwd.to_string_lossy().into_owned()), ..Default::default() };
        let start = palisade_protocol::wire::StartSession {
            name: Some("bench".into()),
            run,
            idle_timeout_secs: Some(3600),
            max_lifetime_secs: None,
        };
        match c.request(&palisade_protocol::wire::ClientMessage::StartSession(start)) {
            Ok(ServerMessage::SessionStarted(info)) => {
                SessionClient { name, socket: socket.to_path_buf(), session: info.name }
            }
            other => panic!("the benchmark's session did not start: {other:?}"),
        }
    }
}

impl Launch for SessionClient {
    fn name(&self) -> &str {
        self.name
    }
    fn once(&self, payload: &[&str]) {
        let mut c = Client::connect(&self.socket).expect("connect to palisaded");
        c.in_session(self.session.clone());
        let req = RunRequest { argv: payload.iter().map(|s| s.to_string()).collect(), ..Default::default() };
        let r = c.run(req, |_| {}).expect("run in the session");
        assert_eq!(r.status, RunStatus::Exited { code: 0 }, "{}", self.name);
    }
}

/// palisade-helper run directly with a plan resolved by the default policy.
struct Helper {
    name: &'static str,
    plans: Vec<Plan>,
    /// The /etc snapshot the plans bind, as the broker keeps one.
    etc: Option<Arc<Snapshot>>,
}

/// A plan for one payload, encoded, with its host paths opened (as the
/// broker opens them when it decides a run, before the helper starts).
#[derive(Clone)]
struct Plan {
    argv: Vec<String>,
    plan: palisade_protocol::JailPlan,
    bytes: Vec<u8>,
    fds: Arc<Vec<std::os::fd::OwnedFd>>,
}

impl Plan {
    fn new(argv: Vec<String>, plan: palisade_protocol::JailPlan) -> Plan {
        let me = Requester::me();
        let fds = me.act(|act| requester::open_paths(&plan, &[], act, me.uid)).unwrap().unwrap();
        let bytes = palisade_protocol::encode_plan(&plan).unwrap();
        Plan { argv, plan, bytes, fds: Arc::new(fds) }
    }
}

/// One mechanism taken out of a plan (not a configuration palisade offers):
/// `--breakdown` removes each alone, and the bwrap-equivalent launcher all but
/// the network namespace, which bwrap's profile has too.
type Cut = (&'static str, fn(&mut palisade_protocol::JailPlan));

const CUTS: [Cut; 6] = [
    ("- seccomp (allow-all filter)", |p| {
        p.seccomp = vec![palisade_protocol::BpfInstruction { code: 0x06, jt: 0, jf: 0, k: 0x7fff_0000 }]
    }),
    ("- Landlock", |p| {
        p.landlock.wanted = palisade_protocol::LandlockFeatures::EMPTY;
        p.landlock.required = palisade_protocol::LandlockFeatures::EMPTY;
    }),
    ("- /etc (its one bind)", |p| {
        p.mounts.retain(|m| !m.target().starts_with("/etc"));
        p.landlock.read.retain(|r| !r.starts_with("/etc"));
    }),
    ("- network namespace", |p| {
        p.namespaces.net = false;
        p.loopback = false;
    }),
    ("- overlay (plain bind)", |p| {
        use palisade_protocol::Mount;
        for m in &mut p.mounts {
            if let Mount::Overlay { source, target, owned, .. } = m.clone() {
                *m = Mount::Bind { source, target, writable: true, owned };
            }
        }
    }),
    ("- host ids (root: no idmap, no uid change)", |p| {
        p.host_ids = None;
        p.acting_for = None;
    }),
];

/// The default plan cut down to what the bwrap anchor does: no /etc, a plain
/// bind for the workspace (no overlay), no Landlock, no seccomp filter (an
/// allow-all one), no idmap. It shows what the same work costs, apart from
/// the protections the default profile adds.
fn like_bwrap(mut plan: palisade_protocol::JailPlan) -> palisade_protocol::JailPlan {
    for (name, cut) in CUTS {
        if name != "- network namespace" {
            cut(&mut plan);
        }
    }
    plan
}

impl Helper {
    fn new(ws: &Path, payloads: &[&[&str]]) -> Helper {
        Helper::with_etc(ws, payloads, true)
    }

    /// The plans the default policy resolves; `snapshot`: with /etc as the
    /// broker's snapshot (as palisaded runs them), else entry by entry.
    fn with_etc(ws: &Path, payloads: &[&[&str]], snapshot: bool) -> Helper {
        // Beside the workspace: reachable by the sandbox's uid, removed with it.
        let base = ws.parent().unwrap().to_path_buf();
        let entries = palisade_policy::jail::ETC_ENTRIES.iter().map(PathBuf::from).collect();
        let etc = snapshot.then(|| EtcView::new(base, entries).current()).flatten();
        let capabilities = HostCapabilities {
            user_namespaces: true,
            landlock_abi: landlock_abi(),
            seatbelt: false,
            cgroup: Err("bench".into()),
        };
        let host = palisade_broker::host::gather(&capabilities, etc.is_none(), Vec::new().into());
        let policy = Policy::new(Config::default(), &*host.files);
        let ctx = Context {
            parent_pid: std::process::id(),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            serves_others: nix::unistd::getuid().is_root(),
            requester: palisade_protocol::HostIds {
                uid: nix::unistd::getuid().as_raw(),
                gid: nix::unistd::getgid().as_raw(),
            },
            groups: vec![],
            temp_root: std::env::temp_dir(),
            instance: "1-1".into(),
            run: 0,
            etc_view: etc.as_ref().map(|e| e.dir().to_path_buf()),
            trust: None,
            homes: None,
        };
        let plans = payloads
            .iter()
            .map(|p| {
                let req = RunRequest {
                    argv: p.iter().map(|s| s.to_string()).collect(),
                    cwd: Some(ws.to_string_lossy().into_owned()),
                    ..Default::default()
                };
                match policy.decide(&host, &ctx, &req) {
                    Decision::Allow(r) => Plan::new(req.argv.clone(), r.plan),
                    other => panic!("the default policy refuses {p:?}: {other:?}"),
                }
            })
            .collect();
        Helper { name: "palisade-helper", plans, etc }
    }

    fn like_bwrap(ws: &Path, payloads: &[&[&str]]) -> Helper {
        let full = Helper::new(ws, payloads);
        let plans = full.plans.iter().cloned().map(|p| Plan::new(p.argv, like_bwrap(p.plan))).collect();
        Helper { name: "palisade-helper, bwrap's work only", plans, etc: full.etc.clone() }
    }
}

fn landlock_abi() -> u32 {
    // SAFETY: a null attribute with size 0 and the VERSION flag only queries the ABI.
    let v = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) };
    if v > 0 { v as u32 } else { 0 }
}

impl Launch for Helper {
    fn name(&self) -> &str {
        self.name
    }
    fn once(&self, payload: &[&str]) {
        let plan = self
            .plans
            .iter()
            .find(|p| p.argv.iter().map(String::as_str).eq(payload.iter().copied()))
            .unwrap();
        let mut child = spawn(HelperCommand {
            warm: None,
            helper: bin("palisade-helper"),
            cgroup_dir: None,
            stdin: Io::Null,
            stdout: Io::Null,
            stderr: Io::Null,
            outer_limits: vec![],
        })
        .expect("spawn the helper");
        // As root: the trees of its mounts, cloned for each launch (a tree is attached once), as a system broker does.
        let sent =
            palisade_broker::engine::capture::sent(&plan.plan, &plan.fds).expect("clone the plan's mounts");
        send_plan(child.plan_channel.take().unwrap(), &plan.bytes, &sent.fds()).expect("send the plan");
        release(&child.status).expect("release the command");
        let st = child.wait().unwrap();
        assert!(st.success(), "palisade-helper failed: {st} {:?}", child.read_status());
    }
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

pub(crate) struct Daemon {
    child: std::process::Child,
    pub(crate) socket: PathBuf,
}

impl Daemon {
    /// A broker for the benchmark; `journal`: its audit journal on (the
    /// default, kept in `dir`) or off; `warm`: its pool's sandboxes built
    /// ahead (the default; a root broker never does) or not.
    fn start(dir: &Path, name: &str, journal: bool, warm: bool) -> Daemon {
        Daemon::start_with(dir, name, journal, warm, "", "")
    }

    /// A broker named `name`, its `[defaults]` with `defaults` added and
    /// `tables` after them.
    pub(crate) fn start_with(
        dir: &Path,
        name: &str,
        journal: bool,
        warm: bool,
        defaults: &str,
        tables: &str,
    ) -> Daemon {
        let journal = match journal {
            true => {
                format!("[journal]\npath = {:?}\n", dir.join(format!("{name}-journal")).to_string_lossy())
            }
            false => "[journal]\nenabled = false\n".to_string(),
        };
        let text = format!(
            "[broker]\nmax_concurrent = 64\nmax_queued = 256\nwarm = {warm}\n{journal}[defaults]\nmax_output_bytes = 17179869184\nallow_interpreters = true\nallow_inline_code = true\n{defaults}{tables}"
        );
        Daemon::spawn(dir, name, &text)
    }

    /// A broker named `name` whose configuration is `tables` (its journal off).
    pub(crate) fn start_config(dir: &Path, name: &str, tables: &str) -> Daemon {
        Daemon::spawn(dir, name, &format!("{tables}[journal]\nenabled = false\n"))
    }

    /// A broker named `name` of configuration `text`, its socket in `dir`.
    fn spawn(dir: &Path, name: &str, text: &str) -> Daemon {
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, text).unwrap();
        // A directory of their own: a broker's socket directory is nobody's
        // workspace, and the workspace is in `dir`.
        let sockets = dir.join("sockets");
        std::fs::create_dir_all(&sockets).unwrap();
        let socket = sockets.join(format!("{name}.sock"));
        let mut cmd = Command::new(bin("palisaded"));
        cmd.arg("--config")
            .arg(&config)
            .arg("--socket")
            .arg(&socket)
            .env("PALISADE_LOG", "warn")
            // Its state (change sets, trust stages) in the benchmark's directory, never the host's.
            .env("PALISADE_STATE", dir.join(format!("{name}-state")))
            .stdin(Stdio::null());
        // SAFETY: prctl is async-signal-safe. The daemon goes when the benchmark
        // does, even if it is killed (it is spawned from the main thread).
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start palisaded");
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(start.elapsed() < Duration::from_secs(30), "palisaded did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon { child, socket }
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

fn latency(opts: &Opts, launchers: &[&dyn Launch], payloads: &[&[&str]]) -> String {
    let mut out = String::from(
        "### Launch latency\n\n| payload | launcher | median ms | p99 ms | × bare | × bwrap |\n|---|---|---:|---:|---:|---:|\n",
    );
    for payload in payloads {
        let mut samples: Vec<Vec<f64>> = vec![vec![]; launchers.len()];
        for (l, _) in launchers.iter().zip(0..) {
            for _ in 0..opts.warmup {
                l.once(payload);
            }
        }
        for _ in 0..opts.rounds {
            for (i, l) in launchers.iter().enumerate() {
                for _ in 0..opts.runs {
                    let t = Instant::now();
                    l.once(payload);
                    samples[i].push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
        }
        for s in &mut samples {
            s.sort_by(|a, b| a.partial_cmp(b).unwrap());
        }
        let median = |i: usize| percentile(&samples[i], 0.5);
        let bwrap = launchers.iter().position(|l| l.name() == "bwrap");
        for (i, l) in launchers.iter().enumerate() {
            let vs_bwrap = bwrap.map_or("-".to_string(), |b| format!("{:.2}", median(i) / median(b)));
            out.push_str(&format!(
                "| `{}` | {} | {:.2} | {:.2} | {:.2} | {} |\n",
                payload.join(" "),
                l.name(),
                median(i),
                percentile(&samples[i], 0.99),
                median(i) / median(0),
                vs_bwrap
            ));
        }
        // A command in a live session against a fresh run of it, the same way.
        let at = |name: &str| launchers.iter().position(|l| l.name() == name);
        if let (Some(session), Some(fresh)) =
            (at("palisade, socket client, in a session"), at("palisade, socket client"))
        {
            out.push_str(&format!(
                "\n`{}` in a session: {:.2}× a fresh run through the socket client (median).\n\n",
                payload.join(" "),
                median(session) / median(fresh)
            ));
        }
    }
    out
}

fn throughput(opts: &Opts, launchers: &[&dyn Launch]) -> String {
    let mut out = String::from(
        "### Throughput (`/bin/true` launches per second)\n\n| launcher | 1 client | 2 clients | 8 clients |\n|---|---:|---:|---:|\n",
    );
    let mut rows: Vec<(String, Vec<f64>)> =
        launchers.iter().map(|l| (l.name().to_string(), vec![])).collect();
    // Each launcher's time at a concurrency is cut into windows, taken in
    // rounds that alternate the launchers' order (ABC, CBA, ...), so that the
    // machine's drift hits them all alike; the rate pools the windows.
    let windows = if opts.quick { 1 } else { 5 };
    let window = opts.duration / windows as u32;
    for clients in [1usize, 2, 8] {
        let mut totals = vec![(0u64, Duration::ZERO); launchers.len()];
        for round in 0..windows {
            let mut order: Vec<usize> = (0..launchers.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let l = launchers[i];
                let done = AtomicU64::new(0);
                let stop = AtomicBool::new(false);
                let start = Instant::now();
                std::thread::scope(|s| {
                    for _ in 0..clients {
                        s.spawn(|| {
                            while !stop.load(Ordering::Relaxed) {
                                l.once(&["/bin/true"]);
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                        });
                    }
                    std::thread::sleep(window);
                    stop.store(true, Ordering::Relaxed);
                });
                totals[i].0 += done.load(Ordering::Relaxed);
                totals[i].1 += start.elapsed();
            }
        }
        for (i, (n, t)) in totals.into_iter().enumerate() {
            rows[i].1.push(n as f64 / t.as_secs_f64());
        }
    }
    for (name, rates) in rows {
        out.push_str(&format!("| {name} | {:.0} | {:.0} | {:.0} |\n", rates[0], rates[1], rates[2]));
    }
    out
}

/// The machine's CPU time from `/proc/stat`: busy and idle (idle and I/O wait), in ticks.
struct CpuTimes(f64, f64);

fn cpu_times() -> CpuTimes {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let idle = fields.get(3).copied().unwrap_or(0.0) + fields.get(4).copied().unwrap_or(0.0);
    CpuTimes(fields.iter().sum::<f64>() - idle, idle)
}

impl CpuTimes {
    /// Busy ticks and all ticks since `before`.
    fn delta(&self, before: &CpuTimes) -> (f64, f64) {
        let busy = self.0 - before.0;
        (busy, busy + self.1 - before.1)
    }
}

/// Both paths end in the same reader (this process, through a pipe), so the
/// anchor is the issue's `head -c N /dev/zero | cat` as a client would see it.
fn output(opts: &Opts, d: &Daemon, ws: &Path) -> String {
    let size = opts.output_bytes;
    let drain = |mut cmd: Command| -> f64 {
        let t = Instant::now();
        let mut child = cmd.current_dir(ws).stdout(Stdio::piped()).spawn().unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        loop {
            match std::io::Read::read(&mut out, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k as u64,
            }
        }
        let st = child.wait().unwrap();
        assert!(st.success() && n == size, "{cmd:?}: {st}, {n} of {size} bytes");
        t.elapsed().as_secs_f64()
    };
    let rounds = if opts.quick { 1 } else { 3 };
    let (mut pipe, mut palisade) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let mut sh = Command::new("sh");
        sh.args(["-c", &format!("head -c {size} /dev/zero | cat")]);
        pipe.push(drain(sh));
        let mut run = Command::new(bin("palisade"));
        run.args([
            "run",
            "--socket",
            d.socket.to_str().unwrap(),
            "--",
            "head",
            "-c",
            &size.to_string(),
            "/dev/zero",
        ]);
        palisade.push(drain(run));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (pipe, palisade) = (median(&mut pipe), median(&mut palisade));
    let gbs = |secs: f64| size as f64 / secs / 1e9;
    format!(
        "### Output ({} MiB written by the sandboxed command, read by the client; median of {rounds})\n\n\
         | path | GB/s | × plain pipe |\n|---|---:|---:|\n\
         | plain pipe (`head -c \\| cat`) | {:.2} | 1.00 |\n| `palisade run` over the socket | {:.2} | {:.2} |\n",
        size >> 20,
        gbs(pipe),
        gbs(palisade),
        pipe / palisade
    )
}

/// A client in Python over JSON lines (clients/python's, which decodes
/// every line and its base64), against the socket read raw by Python for
/// the same run: what the encoding costs a client in another language.
fn json_client(opts: &Opts, d: &Daemon, ws: &Path) -> String {
    let size: u64 = if opts.quick { 16 << 20 } else { 100 << 20 };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // A script of the tree, or a module of the Python client (clients/python).
    let time = |script: &str, command: &[&str], expect: &dyn Fn(&[u8]) -> bool| -> f64 {
        let mut python = Command::new("python3");
        match script.strip_prefix("-m ") {
            Some(module) => python.args(["-m", module]).env("PYTHONPATH", root.join("clients/python/src")),
            None => python.arg(root.join(script)),
        };
        let t = Instant::now();
        let o = python
            .args(["--socket", d.socket.to_str().unwrap(), "--"])
            .args(command)
            .current_dir(ws)
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        let elapsed = t.elapsed().as_secs_f64();
        assert!(o.status.success() && expect(&o.stdout), "{script} {command:?}: {}", o.status);
        elapsed
    };
    let rounds = if opts.quick { 1 } else { 5 };
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mbs = |secs: f64| size as f64 / secs / 1e6;
    let mut rows = String::new();
    // Text (lines of a log, say): JSON strings. Bytes that are not text (NULs): base64.
    let text = format!("yes 'a line of text, as a tool writes it' | head -c {size}");
    let zeros = format!("head -c {size} /dev/zero");
    for (what, command) in [("text", text), ("binary (NUL bytes)", zeros)] {
        let argv = ["sh", "-c", command.as_str()];
        let (mut raw, mut client) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let whole =
                |out: &[u8]| String::from_utf8_lossy(out).trim().parse::<u64>().is_ok_and(|n| n > size);
            raw.push(time("bench/python/raw_read.py", &argv, &whole));
            client.push(time("-m palisade_client", &argv, &|out| out.len() as u64 == size));
        }
        let (raw, client) = (median(&mut raw), median(&mut client));
        rows.push_str(&format!("| {what} | {:.0} | {:.0} | {:.2} |\n", mbs(raw), mbs(client), raw / client));
    }
    format!(
        "### A Python client over JSON lines ({} MiB of output; median of {rounds})\n\n\
         Python reading the socket raw (`bench/python/raw_read.py`: nothing decoded), and \
         the client of `clients/python` (each line parsed, its data decoded, written to a pipe), for the same run.\n\n\
         | output | raw read, MB/s | Python client, MB/s | client × raw |\n|---|---:|---:|---:|\n{rows}",
        size >> 20,
    )
}

fn memory(d: &Daemon, ws: &Path) -> String {
    let idle = d.rss_kib();
    let peak = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..50 {
            s.spawn(|| {
                let mut c = Client::connect(&d.socket).unwrap();
                let req = RunRequest {
                    argv: vec!["sleep".into(), "2".into()],
                    cwd: Some(ws.to_string_lossy().into_owned()),
                    ..Default::default()
                };
                let r = c.run(req, |_| {}).unwrap();
                assert_eq!(r.status, RunStatus::Exited { code: 0 }, "a run in flight failed");
            });
        }
        s.spawn(|| {
            let t = Instant::now();
            while !done.load(Ordering::Relaxed) && t.elapsed() < Duration::from_secs(10) {
                peak.fetch_max(d.rss_kib(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        std::thread::sleep(Duration::from_millis(2500));
        done.store(true, Ordering::Relaxed);
    });
    format!(
        "### Broker memory\n\n| state | RSS MiB |\n|---|---:|\n| idle | {:.1} |\n| 50 runs in flight | {:.1} |\n",
        idle as f64 / 1024.0,
        peak.load(Ordering::Relaxed) as f64 / 1024.0
    )
}

fn precision(d: &Daemon, ws: &Path, rounds: usize) -> String {
    let cwd = Some(ws.to_string_lossy().into_owned());
    let limit = 100_000u64;
    let mut past = 0u64;
    for _ in 0..rounds {
        let mut c = Client::connect(&d.socket).unwrap();
        let req = RunRequest {
            argv: vec!["head".into(), "-c".into(), "10000000".into(), "/dev/zero".into()],
            cwd: cwd.clone(),
            max_output_bytes: Some(limit),
            ..Default::default()
        };
        let mut got = 0u64;
        let r = c
            .run(req, |m| {
                if let ServerMessage::Output { data, .. } = m {
                    got += data.len() as u64;
                }
            })
            .unwrap();
        assert_eq!(r.status, RunStatus::QuotaExceeded);
        past = past.max(got.saturating_sub(limit));
    }
    // The last process: a run that leaves sleepers behind (one in the
    // background, one in a session of its own, one double-forked), none of
    // them holding the output pipes, so that only the kill can end them.
    // Each round's sleepers carry a duration of their own, by which the host
    // finds them in /proc; a thread watches for the moment the last is gone.
    let mut late = Vec::new();
    for round in 0..rounds {
        let token = format!("{}.{}{}", 30 + round, std::process::id() % 1000, round);
        let quiet = "</dev/null >/dev/null 2>&1";
        let script = format!(
            "sleep {token} {quiet} & setsid sleep {token} {quiet} & (sleep {token} {quiet} &) ; exec sleep {token} {quiet}"
        );
        let mut c = Client::connect(&d.socket).unwrap();
        let req = RunRequest {
            argv: vec!["sh".into(), "-c".into(), script],
            cwd: cwd.clone(),
            timeout_secs: Some(1),
            ..Default::default()
        };
        let t = Instant::now();
        let last_gone = std::thread::scope(|s| {
            let watcher = s.spawn(|| {
                let alive = || sleepers(&token);
                while alive() < 4 && t.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(Duration::from_micros(200));
                }
                while alive() > 0 && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_micros(200));
                }
                t.elapsed()
            });
            let r = c.run(req, |_| {}).unwrap();
            assert_eq!(r.status, RunStatus::TimedOut);
            (watcher.join().unwrap(), r.wall_ms)
        });
        assert_eq!(sleepers(&token), 0, "a sleeper survived its run");
        late.push((last_gone.0.as_secs_f64() * 1000.0 - 1000.0, last_gone.1 as f64 - 1000.0));
    }
    late.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    let worst = late.last().copied().unwrap_or((f64::NAN, f64::NAN));
    let med = late[late.len() / 2];
    format!(
        "### Enforcement precision\n\n| measure | value |\n|---|---:|\n| bytes delivered past `max_output_bytes` (worst of {rounds}) | {past} |\n\
         | last process gone after the deadline, seen from the host (median / worst, ms) | {:.1} / {:.1} |\n\
         | the run's end after the deadline, measured by the broker (median / worst, ms) | {:.1} / {:.1} |\n",
        med.0, worst.0, med.1, worst.1
    )
}

/// How many processes on the host run `sleep TOKEN`.
fn sleepers(token: &str) -> usize {
    let want = format!("sleep\0{token}\0");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c.ends_with(want.as_bytes())))
        .count()
}

/// Where the helper's time goes: the full plan against plans with one
/// mechanism removed at a time (not a configuration palisade offers).
fn breakdown(ws: &Path, runs: usize) -> String {
    let base = Helper::new(ws, &[&["/bin/true"]]);
    let plan = base.plans[0].plan.clone();
    let mut variants = vec![("full plan", plan.clone())];
    for (name, cut) in CUTS {
        if name.starts_with("- host ids") && plan.host_ids.is_none() {
            continue;
        }
        let mut p = plan.clone();
        cut(&mut p);
        variants.push((name, p));
    }
    // What the snapshot of /etc saves: the entries bound one by one.
    let one_by_one = Helper::with_etc(ws, &[&["/bin/true"]], false);
    variants
        .push(("/etc entries bound one by one (`etc_snapshot = false`)", one_by_one.plans[0].plan.clone()));
    let helpers: Vec<(String, Helper)> = variants
        .into_iter()
        .map(|(n, p)| {
            (
                n.to_string(),
                Helper {
                    name: "variant",
                    plans: vec![Plan::new(vec!["/bin/true".into()], p)],
                    etc: base.etc.clone(),
                },
            )
        })
        .collect();
    let mut samples: Vec<Vec<f64>> = vec![vec![]; helpers.len()];
    for _ in 0..runs {
        for (i, (_, h)) in helpers.iter().enumerate() {
            let t = Instant::now();
            h.once(&["/bin/true"]);
            samples[i].push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let mut out = String::from(
        "### Helper breakdown (`/bin/true`, median ms)\n\n| plan | median ms | Δ vs full |\n|---|---:|---:|\n",
    );
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        percentile(v, 0.5)
    };
    let full = med(&mut samples[0].clone());
    for ((n, _), s) in helpers.iter().zip(samples.iter_mut()) {
        let m = med(s);
        out.push_str(&format!("| {n} | {m:.2} | {:+.2} |\n", m - full));
    }
    out
}

impl Opts {
    fn new(quick: bool) -> Opts {
        if quick {
            Opts {
                quick,
                rounds: 1,
                runs: 3,
                warmup: 1,
                duration: Duration::from_millis(300),
                output_bytes: 64 << 20,
            }
        } else {
            Opts {
                quick,
                rounds: 5,
                runs: 20,
                warmup: 3,
                duration: Duration::from_secs(5),
                output_bytes: 1 << 30,
            }
        }
    }
}

/// The brokers the launchers go through: with its journal (the default),
/// without, and without a warm pool (as a root broker's, every sandbox cold).
struct Brokers {
    journal: Daemon,
    no_journal: Daemon,
    cold: Daemon,
}

/// The payloads every launcher starts.
const PAYLOADS: [&[&str]; 2] = [&["/bin/true"], &["/bin/echo", "hello"]];

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// The anchors, bare exec, `unshare` and `bwrap`, as the same run measures them.
fn anchors(ws: &Path) -> [Prefix; 3] {
    let bare = Prefix { name: "bare exec".into(), prefix: vec![], cwd: ws.to_path_buf(), env: vec![] };
    let namespaces = ["--user", "--map-root-user", "--pid", "--net", "--mount", "--ipc", "--uts", "--cgroup"];
    let unshare = Prefix {
        name: "unshare".into(),
        prefix: [strings(&["unshare"]), strings(&namespaces), strings(&["--fork"])].concat(),
        cwd: ws.to_path_buf(),
        env: vec![],
    };
    let w = ws.to_string_lossy().into_owned();
    let mut bwrap_args = strings(&["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]);
    for dir in ["/usr", "/lib", "/lib64", "/bin"] {
        if Path::new(dir).exists() {
            bwrap_args.extend(strings(&["--ro-bind", dir, dir]));
        }
    }
    let rest = [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--bind",
        &w,
        &w,
        "--chdir",
        &w,
        "--clearenv",
    ];
    bwrap_args.extend(strings(&rest));
    let bwrap = Prefix { name: "bwrap".into(), prefix: bwrap_args, cwd: ws.to_path_buf(), env: vec![] };
    [bare, unshare, bwrap]
}

/// Every launcher the benchmark compares.
struct Launchers {
    anchors: [Prefix; 3],
    helpers: [Helper; 2],
    cli: [Prefix; 3],
    sockets: [SocketClient; 3],
    session: SessionClient,
}

impl Launchers {
    fn new(dir: &Path, ws: &Path, b: &Brokers) -> Launchers {
        let via = |name: &str, d: &Daemon| Prefix {
            name: name.into(),
            prefix: vec![
                bin("palisade").to_string_lossy().into_owned(),
                "run".into(),
                "--socket".into(),
                d.socket.to_string_lossy().into_owned(),
                "--".into(),
            ],
            cwd: ws.to_path_buf(),
            env: vec![],
        };
        // The README's first command where no broker runs: the built-in default
        // policy in palisaded, which the CLI becomes, its journal in the bench's directory.
        let embedded = Prefix {
            name: "palisade run, embedded".into(),
            prefix: vec![bin("palisade").to_string_lossy().into_owned(), "run".into(), "--".into()],
            cwd: ws.to_path_buf(),
            env: vec![
                ("PALISADE_SOCKET".into(), dir.join("no-broker.sock").to_string_lossy().into_owned()),
                ("PALISADE_JOURNAL".into(), dir.join("embedded-journal").to_string_lossy().into_owned()),
                ("PALISADE_STATE".into(), dir.join("embedded-state").to_string_lossy().into_owned()),
            ],
        };
        let socket =
            |name, d: &Daemon| SocketClient { name, socket: d.socket.clone(), cwd: ws.to_path_buf() };
        Launchers {
            anchors: anchors(ws),
            helpers: [Helper::new(ws, &PAYLOADS), Helper::like_bwrap(ws, &PAYLOADS)],
            cli: [via("palisade run", &b.journal), via("palisade run, journal off", &b.no_journal), embedded],
            sockets: [
                socket("palisade, socket client", &b.journal),
                socket("palisade, socket client, journal off", &b.no_journal),
                socket("palisade, socket client, journal off, warm = false", &b.cold),
            ],
            session: SessionClient::start("palisade, socket client, in a session", &b.journal.socket, ws),
        }
    }

    /// In the tables' order, and a note for each anchor not installed.
    fn list(&self) -> (Vec<&dyn Launch>, Vec<String>) {
        let [bare, unshare, bwrap] = &self.anchors;
        let [helper, helper_like_bwrap] = &self.helpers;
        let [cli, cli_no_journal, embedded] = &self.cli;
        let [socket, socket_no_journal, socket_cold] = &self.sockets;
        let mut launchers: Vec<&dyn Launch> = vec![bare];
        let mut notes = Vec::new();
        for (tool, l) in [("unshare", unshare as &dyn Launch), ("bwrap", bwrap)] {
            if have(tool) {
                launchers.push(l);
            } else {
                notes.push(format!("{tool} is not installed (bench/run.sh installs it): not measured"));
            }
        }
        launchers.extend([
            helper as &dyn Launch,
            helper_like_bwrap,
            cli,
            socket,
            &self.session,
            cli_no_journal,
            socket_no_journal,
            socket_cold,
            embedded,
        ]);
        (launchers, notes)
    }
}

/// The value after `flag` on the command line.
fn arg_after<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(String::as_str)
}

/// `--loop NAME N [--clients C]`: launches `/bin/true` N times with one
/// launcher and nothing else, for a profiler to watch (perf record, strace -c -f).
fn launch_loop(args: &[String], launchers: &[&dyn Launch]) -> Result<(), String> {
    let i = args.iter().position(|a| a == "--loop").unwrap_or(0);
    let name = args.get(i + 1).map(String::as_str).unwrap_or("palisade run");
    let n: usize = args.get(i + 2).and_then(|n| n.parse().ok()).unwrap_or(100);
    let Some(l) = launchers.iter().find(|l| l.name() == name) else {
        let names: Vec<&str> = launchers.iter().map(|l| l.name()).collect();
        return Err(format!("--loop: no launcher {name:?}; one of {names:?}"));
    };
    let clients: usize = arg_after(args, "--clients").and_then(|c| c.parse().ok()).unwrap_or(1).max(1);
    let cpu = cpu_times();
    let t = Instant::now();
    std::thread::scope(|s| {
        for c in 0..clients {
            s.spawn(move || {
                for _ in (c..n).step_by(clients) {
                    l.once(&["/bin/true"]);
                }
            });
        }
    });
    let (busy, total) = cpu_times().delta(&cpu);
    println!(
        "{name}: {n} launches by {clients} client(s), {:.2} ms each; the CPUs {:.0}% busy",
        t.elapsed().as_secs_f64() * 1e3 / n as f64,
        busy * 100.0 / total.max(1.0)
    );
    Ok(())
}

/// The sections `--only latency,throughput,output,json,memory,egress,plugins,precision,copyback,builds`
/// names (all without it), measured in that order.
fn sections(
    opts: &Opts,
    args: &[String],
    launchers: &[&dyn Launch],
    dir: &Path,
    ws: &Path,
    d: &Daemon,
) -> Vec<String> {
    let only: Option<Vec<&str>> = arg_after(args, "--only").map(|v| v.split(',').collect());
    let wanted = |name: &str| only.as_ref().is_none_or(|o| o.contains(&name));
    let (quick, mut out) = (opts.quick, Vec::new());
    if wanted("latency") {
        out.push(latency(opts, launchers, &PAYLOADS));
    }
    if wanted("throughput") {
        let compared = |l: &&dyn Launch| {
            let n = l.name();
            n == "bare exec"
                || n == "bwrap"
                || n.starts_with("palisade run")
                || n.starts_with("palisade, socket client")
        };
        let tput: Vec<&dyn Launch> = launchers.iter().copied().filter(compared).collect();
        out.push(throughput(opts, &tput));
    }
    if wanted("output") {
        out.push(output(opts, d, ws));
    }
    if wanted("json") {
        out.push(json_client(opts, d, ws));
    }
    if wanted("memory") {
        out.push(memory(d, ws));
    }
    if wanted("egress") {
        let (bytes, rounds) = if quick { (8 << 20, 1) } else { (100 << 20, 5) };
        out.push(egress::download(dir, ws, bytes, rounds));
        out.push(egress::tls_download(dir, ws, bytes, rounds));
    }
    if wanted("plugins") {
        out.push(plugins::calls(dir, ws, d, if quick { 5 } else { 500 }));
    }
    if wanted("precision") {
        out.push(precision(d, ws, if quick { 1 } else { 5 }));
    }
    if wanted("copyback") {
        out.push(crate::copyback::copyback(dir, if quick { 1 } else { 5 }));
    }
    if wanted("builds") {
        out.push(crate::builds::builds(dir, if quick { 1 } else { 3 }));
    }
    if wanted("fairness") {
        out.push(crate::fairness::fairness(dir, if quick { 3 } else { 40 }));
    }
    out
}

/// The report's first lines: the machine, and what was not measured.
fn header(opts: &Opts, notes: &[String]) -> String {
    let uname =
        nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut out = format!(
        "Linux {uname}, {cpus} CPUs, running as uid {}{}\n\n",
        nix::unistd::getuid(),
        if opts.quick { " (--quick: too few samples to compare)" } else { "" }
    );
    for n in notes {
        out.push_str(&format!("Note: {n}\n\n"));
    }
    out
}

pub(crate) fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let dir = std::env::temp_dir().join(format!("palisade-bench-{}", std::process::id()));
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let ws = ws.canonicalize().unwrap();
    if args.iter().any(|a| a == "--breakdown") {
        println!("{}", breakdown(&ws, if quick { 5 } else { 100 }));
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let opts = Opts::new(quick);
    let brokers = Brokers {
        journal: Daemon::start(&dir, "bench", true, true),
        no_journal: Daemon::start(&dir, "bench-no-journal", false, true),
        cold: Daemon::start(&dir, "bench-cold", false, false),
    };
    let all = Launchers::new(&dir, &ws, &brokers);
    let (launchers, notes) = all.list();
    let mut failed = None;
    if args.iter().any(|a| a == "--loop") {
        failed = launch_loop(&args, &launchers).err();
    } else {
        let report = header(&opts, &notes)
            + &sections(&opts, &args, &launchers, &dir, &ws, &brokers.journal).join("\n");
        println!("{report}");
    }
    drop(all);
    drop(brokers);
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(e) = failed {
        eprintln!("palisade-bench: {e}");
        std::process::exit(2);
    }
}
