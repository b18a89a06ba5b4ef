//! The checks themselves (see `main.rs`).

use palisade_broker::cli::client::{Client, ClientError};
use palisade_protocol::RulesetState;
use palisade_protocol::attest::{Built, LimitsBy};
use palisade_protocol::plugin::PluginAttestation;
use palisade_protocol::wire::{
    ClientMessage, ErrorKind, MemorySource, RunRequest, RunResult, RunStatus, ServerMessage, StartSession,
};
use palisade_tests::{bin, eventually, process_with_token};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type Check = Result<String, String>;

struct Guest {
    tmp: PathBuf,
    ws: PathBuf,
    /// The cgroup the harness delegated (root: named in the configuration).
    delegated: PathBuf,
    root: bool,
}

fn probe() -> String {
    bin("probe").to_string_lossy().into_owned()
}

impl Guest {
    /// The guest's configuration (its tools are not about trust stages: they
    /// are off). Interpreters are allowed: a session's start is decided as
    /// `true`, which in the guest is busybox's.
    fn config(&self, extra_defaults: &str, cgroup_root: Option<&Path>) -> PathBuf {
        let dir = bin("probe").parent().unwrap().to_path_buf();
        let broker = cgroup_root.map(|r| format!("[broker]\ncgroup_root = {:?}\n", r)).unwrap_or_default();
        let text = format!(
            "{broker}[defaults]\ndisk = \"direct\"\nread_only = [{dir:?}]\nmax_memory_mb = 64\nmax_processes = 32\nmax_cpu_percent = 20\nallow_interpreters = true\n{extra_defaults}\n\
             [tools.spinfree]\npreset = \"data_transformer\"\nallowed_executables = [{p:?}]\n\
             [tools.spinfree.overrides]\nfilesystem = [{{ read_only = {dir:?} }}]\nprocess = {{ max_cpu_percent = 0, no_fork = false }}\n\
             [tools.guest]\npreset = \"file_processor\"\nallow_interpreters = true\n\
             [tools.guest.overrides]\nfilesystem = [\"temp_workspace\", {{ read_only = {dir:?} }}]\n\
             process = {{ max_memory_mb = 64, max_processes = 32, max_cpu_percent = 20, no_fork = false }}\n\
             [trust]\nenabled = false\n",
            p = probe()
        );
        let path = self.tmp.join(format!("palisade-{}.toml", text.len()));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The configuration with plugins on (inline modules allowed) and the
    /// plugin-host's memory limit `host_memory`.
    fn plugin_config(&self, cgroup_root: Option<&Path>, host_memory: u64) -> PathBuf {
        let base = std::fs::read_to_string(self.config("", cgroup_root)).unwrap();
        let skills = self.tmp.join(format!("skills-{host_memory}"));
        let text = format!(
            "{base}[plugins]\nenabled = true\nallow_inline_modules = true\nskills_dir = {skills:?}\n\
             host_memory_bytes = {host_memory}\nmax_memory_bytes = {}\n\
             # memory.fill costs fuel per byte; the guest may be emulated.\n\
             fuel_budget = 10000000000\ntimeout_ms = 60000\n",
            host_memory.min(64 << 20)
        );
        let path = self.tmp.join(format!("palisade-plugins-{host_memory}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `check` against a broker of its own with plugins on, given its
    /// socket and the cgroup its runs go in: root's, the configured root;
    /// the user's, a fresh cgroup `name` of the delegated subtree that the
    /// broker starts in (the first broker's is no longer a leaf).
    fn with_plugin_daemon(
        &self,
        name: &str,
        host_memory: u64,
        check: impl FnOnce(&Path, &Path) -> Check,
    ) -> Check {
        let runs_dir = if self.root { self.delegated.clone() } else { self.delegated.join(name) };
        std::fs::create_dir_all(&runs_dir).unwrap();
        let config = self.plugin_config(self.root.then_some(self.delegated.as_path()), host_memory);
        let (mut d, socket) = self.daemon(&config, (!self.root).then_some(runs_dir.as_path()));
        let checked = check(&socket, &runs_dir);
        stop(&mut d);
        checked
    }

    /// Starts palisaded; `cgroup`: the cgroup it starts in (as a systemd
    /// unit's process would), where this program does not live.
    fn daemon(&self, config: &Path, cgroup: Option<&Path>) -> (Child, PathBuf) {
        self.daemon_with_env(config, cgroup, &[])
    }

    /// [`Guest::daemon`], with `env` added to the daemon's environment.
    fn daemon_with_env(
        &self,
        config: &Path,
        cgroup: Option<&Path>,
        env: &[(&str, &str)],
    ) -> (Child, PathBuf) {
        // A directory of its own: the socket's directory is the broker's, nobody's workspace.
        let sockets = self.tmp.join("sockets");
        std::fs::create_dir_all(&sockets).unwrap();
        let socket = sockets.join(format!("palisade-{}.sock", config.file_name().unwrap().to_string_lossy()));
        let mut cmd = Command::new(bin("palisaded"));
        cmd.arg("--config")
            .arg(config)
            .arg("--socket")
            .arg(&socket)
            .env("PALISADE_LOG", "palisade_broker=info,warn")
            .env(
                "PALISADE_JOURNAL",
                self.tmp.join(format!("journal-{}", config.file_name().unwrap().to_string_lossy())),
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null());
        if let Some(cg) = cgroup {
            let procs = std::ffi::CString::new(cg.join("cgroup.procs").into_os_string().into_encoded_bytes())
                .unwrap();
            // SAFETY: open, write and close are async-signal-safe; the strings outlive the call.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::close(fd);
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().unwrap();
        if !eventually(Duration::from_secs(60), || std::os::unix::net::UnixStream::connect(&socket).is_ok()) {
            panic!("palisaded did not start");
        }
        (child, socket)
    }

    /// A run of the probe. As root, of the `guest` tool: a root broker gives
    /// a sandbox the requester's files through an idmapped mount, which the
    /// guest's tmpfs (kernel 6.1) cannot make, and the guest's kernel has no
    /// overlayfs; the tool has a temporary workspace instead.
    fn request(&self, args: &[&str]) -> RunRequest {
        let mut argv = vec![probe()];
        argv.extend(args.iter().map(|s| s.to_string()));
        let tool = self.root.then(|| "guest".to_string());
        RunRequest { argv, cwd: Some(self.ws.to_string_lossy().into_owned()), tool, ..Default::default() }
    }
}

fn run(socket: &Path, req: RunRequest) -> (String, Result<RunResult, (ErrorKind, String)>) {
    let mut c = Client::connect(socket).unwrap();
    let mut out = Vec::new();
    let r = c.run(req, |m| {
        if let ServerMessage::Output { data, .. } = m {
            out.extend_from_slice(data);
        }
    });
    let r = r.map_err(|e| match e {
        ClientError::Reply(e) => (e.kind, e.message),
        other => (ErrorKind::RuntimeFailure, other.to_string()),
    });
    (String::from_utf8_lossy(&out).into_owned(), r)
}

/// Every run cgroup in `dir`, the warm pool's slots included.
fn run_cgroups(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("run-"))
                .collect()
        })
        .unwrap_or_default()
}

/// Run cgroups left behind after runs: every one but the warm pool's idle
/// slots, of which a broker keeps `prespawn` (2); with more, all of them
/// (a slot that served a run must have gone with it).
fn runs_left(dir: &Path) -> Vec<String> {
    let all = run_cgroups(dir);
    let idle_slots = all.iter().filter(|n| n.contains("-pool-")).count();
    if idle_slots > 2 {
        return all;
    }
    all.into_iter().filter(|n| !n.contains("-pool-")).collect()
}

fn ensure(cond: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if cond { Ok(()) } else { Err(why()) }
}

fn doctor(g: &Guest, config: &Path) -> Check {
    let o = Command::new(bin("palisade")).arg("doctor").arg("--policy").arg(config).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    ensure(text.contains("cgroups:          v2 (pure)"), || text.clone())?;
    let how = if g.root { "(configured)" } else { "(delegated)" };
    ensure(text.contains("cgroup for runs:  cgroup v2 at") && text.contains(how), || text.clone())?;
    ensure(text.contains("landlock:         ABI 2"), || text.clone())?;
    ensure(o.status.success(), || format!("exit {:?}: {text}", o.status))?;
    Ok(text.lines().find(|l| l.starts_with("cgroup for runs")).unwrap_or("").to_string())
}

fn memory_bomb(g: &Guest, socket: &Path, runs_dir: &Path) -> Check {
    let (out, r) = run(socket, g.request(&["membomb", "4096"]));
    let r = r.map_err(|e| format!("{e:?}"))?;
    ensure(r.status == RunStatus::MemoryLimitExceeded, || format!("status {:?}, output {out:?}", r.status))?;
    ensure(r.memory_source == MemorySource::Cgroup, || format!("{:?}", r.memory_source))?;
    ensure(r.peak_memory_bytes > 32 << 20 && r.peak_memory_bytes <= 66 << 20, || {
        format!("peak {}", r.peak_memory_bytes)
    })?;
    let e = &r.attestation.enforcement;
    ensure(e.limits_by != LimitsBy::Rlimits, || e.limits_by.to_string())?;
    ensure(
        e.cgroup.as_deref().is_some_and(|c| c.starts_with(&runs_dir.to_string_lossy().into_owned())),
        || format!("{:?}", e.cgroup),
    )?;
    // The user's broker runs it in a warm pool slot's cgroup, limited when
    // claimed; a root broker's first run for a requester (this one) is cold,
    // and starts that requester's pool.
    let (built, slot) = if g.root { (Built::Cold, false) } else { (Built::Warm, true) };
    ensure(e.built == Some(built), || format!("{:?}", e.built))?;
    let cgroup = e.cgroup.clone().unwrap_or_default();
    ensure(cgroup.contains("-pool-") == slot, || cgroup.clone())?;
    // Removed once its helper has exited, which may come just after the answer.
    let gone = eventually(Duration::from_secs(10), || !Path::new(&cgroup).exists());
    ensure(gone, || format!("{cgroup} left behind"))?;
    let none_left = eventually(Duration::from_secs(10), || runs_left(runs_dir).is_empty());
    ensure(none_left, || format!("left behind: {:?}", runs_left(runs_dir)))?;
    let root = if g.root { root_pool_slot(g, socket)? } else { String::new() };
    Ok(format!(
        "4 GiB bomb under memory.max=64M: OOM-killed, peak {} MiB, {built:?} sandbox, cgroup {} removed{root}",
        r.peak_memory_bytes >> 20,
        Path::new(&cgroup).file_name().unwrap_or_default().to_string_lossy()
    ))
}

/// A root broker's runs after a requester's first take a slot of that
/// requester's pool, built as its host ids in a cgroup of its own.
fn root_pool_slot(g: &Guest, socket: &Path) -> Result<String, String> {
    let mut seen = None;
    let warm = eventually(Duration::from_secs(60), || {
        let (_, r) = run(socket, g.request(&["echo", "w"]));
        seen = r.ok().map(|r| r.attestation.enforcement);
        seen.as_ref().is_some_and(|e| e.built == Some(Built::Warm))
    });
    let e = seen.ok_or("no run")?;
    ensure(warm && e.cgroup.as_deref().is_some_and(|c| c.contains("-pool-")), || format!("{e:?}"))?;
    Ok(format!("; the next ones warm, as host uid {}, in a slot's cgroup", e.host_uid))
}

fn fork_bomb(g: &Guest, socket: &Path) -> Check {
    let (out, r) = run(socket, g.request(&["forkbomb"]));
    let r = r.map_err(|e| format!("{e:?}"))?;
    let n: u64 =
        out.rsplit(' ').nth(1).and_then(|n| n.parse().ok()).ok_or_else(|| format!("output {out:?}"))?;
    ensure(out.starts_with("err EAGAIN stopped after"), || out.clone())?;
    // RLIMIT_NPROC is 64 when the cgroup holds pids.max = 32: the cgroup stopped it.
    ensure(n < 32, || format!("{n} forks under pids.max=32"))?;
    Ok(format!("fork bomb stopped after {n} forks at pids.max=32 ({:?})", r.status))
}

fn cpu_share(g: &Guest, socket: &Path) -> Check {
    let mut req = g.request(&["spin"]);
    req.timeout_secs = Some(4);
    let (_, r) = run(socket, req);
    let r = r.map_err(|e| format!("{e:?}"))?;
    ensure(r.status == RunStatus::TimedOut, || format!("{:?}", r.status))?;
    let limited = r.cpu_user_ms + r.cpu_system_ms;
    let share = limited as f64 / r.wall_ms as f64;
    // Counter-test: the same spinner without a cpu.max gets the whole CPU.
    let mut free = g.request(&["spin"]);
    free.timeout_secs = Some(4);
    free.tool = Some("spinfree".into());
    let (_, f) = run(socket, free);
    let f = f.map_err(|e| format!("{e:?}"))?;
    let free_share = (f.cpu_user_ms + f.cpu_system_ms) as f64 / f.wall_ms as f64;
    ensure(share > 0.08 && share < 0.40, || {
        format!("cpu.max=20%: the spinner used {:.0}% of wall", share * 100.0)
    })?;
    ensure(free_share > share * 1.8, || {
        format!("without cpu.max {:.0}%, with {:.0}%", free_share * 100.0, share * 100.0)
    })?;
    Ok(format!(
        "spinner at cpu.max=20%: {:.0}% of wall (unlimited: {:.0}%)",
        share * 100.0,
        free_share * 100.0
    ))
}

fn deadline_kills_the_cgroup(g: &Guest, socket: &Path) -> Check {
    let token = format!("vm-daemon-{}", std::process::id());
    let mut req = g.request(&["daemonize", &token]);
    req.timeout_secs = Some(2);
    let (_, r) = run(socket, req);
    let r = r.map_err(|e| format!("{e:?}"))?;
    ensure(r.status == RunStatus::TimedOut, || format!("{:?}", r.status))?;
    ensure(eventually(Duration::from_secs(5), || process_with_token(&token).is_none()), || {
        "the daemon survived".into()
    })?;
    Ok("a double-forked setsid daemon died with its run's cgroup".into())
}

/// A quota and a client gone end a run through its cgroup too: a daemon
/// that double-forked and called setsid dies with it.
fn quota_and_disconnect_kill_the_cgroup(g: &Guest, socket: &Path) -> Check {
    let token = format!("vm-quota-{}", std::process::id());
    let mut req = g.request(&["daemonize", &token, "flood"]);
    req.max_output_bytes = Some(100_000);
    let (out, r) = run(socket, req);
    let r = r.map_err(|e| format!("{e:?}"))?;
    ensure(r.status == RunStatus::QuotaExceeded, || format!("{:?}", r.status))?;
    ensure(out.len() == 100_000, || format!("{} bytes delivered", out.len()))?;
    ensure(eventually(Duration::from_secs(5), || process_with_token(&token).is_none()), || {
        "the daemon survived the quota".into()
    })?;
    let token = format!("vm-gone-{}", std::process::id());
    let mut c = Client::connect(socket).map_err(|e| e.to_string())?;
    c.send(&palisade_protocol::wire::ClientMessage::Run(g.request(&["daemonize", &token])))
        .map_err(|e| e.to_string())?;
    ensure(eventually(Duration::from_secs(20), || process_with_token(&token).is_some()), || {
        "the daemon never started".into()
    })?;
    drop(c);
    ensure(eventually(Duration::from_secs(5), || process_with_token(&token).is_none()), || {
        "the daemon survived its client".into()
    })?;
    Ok("a quota and a disconnect each took a setsid daemon with the run's cgroup".into())
}

/// A session in a cgroup: its commands join the session's (what one left
/// running too), its memory limit ends a command that goes over it and
/// leaves the rest, its pids.max counts the whole session, and its end
/// kills everything in it and removes the cgroup.
fn session_in_cgroup(g: &Guest, socket: &Path) -> Check {
    let mut c = Client::connect(socket).map_err(|e| e.to_string())?;
    let run = RunRequest { argv: vec![], ..g.request(&[]) };
    let start = StartSession { name: Some("cg".into()), run, ..Default::default() };
    match c.request(&ClientMessage::StartSession(start)).map_err(|e| e.to_string())? {
        ServerMessage::SessionStarted(_) => {}
        other => return Err(format!("the session did not start: {other:?}")),
    }
    let exec = |args: &[&str], timeout: Option<u64>| {
        let argv = std::iter::once(probe()).chain(args.iter().map(|a| a.to_string())).collect();
        let mut c = Client::connect(socket).map_err(|e| e.to_string())?;
        c.in_session("cg".into());
        let mut out = Vec::new();
        let r = c.run(RunRequest { argv, timeout_secs: timeout, ..Default::default() }, |m| {
            if let ServerMessage::Output { data, .. } = m {
                out.extend_from_slice(data);
            }
        });
        r.map(|r| (String::from_utf8_lossy(&out).into_owned(), r)).map_err(|e| format!("{args:?}: {e}"))
    };
    let checked = session_checks(exec);
    let stopped = c.request(&ClientMessage::StopSession { session: "cg".into() });
    let (token, cgroup) = checked?;
    ensure(matches!(stopped, Ok(ServerMessage::Finished(_))), || format!("stop: {stopped:?}"))?;
    ensure(eventually(Duration::from_secs(10), || process_with_token(&token).is_none()), || {
        "a process of the session survived its end".into()
    })?;
    let gone =
        !cgroup.starts_with('/') || eventually(Duration::from_secs(10), || !Path::new(&cgroup).exists());
    ensure(gone, || format!("the session's cgroup {cgroup} was left behind"))?;
    Ok(format!(
        "every process of the session in {cgroup}: the bomb OOM-killed alone, forks stopped, all gone at stop"
    ))
}

/// The checks in a started session (`exec` runs the probe in it): the
/// token of the process left running, and the session's cgroup.
fn session_checks(
    exec: impl Fn(&[&str], Option<u64>) -> Result<(String, RunResult), String>,
) -> Result<(String, String), String> {
    let token = format!("vm-session-{}", std::process::id());
    // Its deadline comes after the sleeper is left running: a run under
    // emulation takes seconds to start (the suite's guest has no KVM).
    let (out, r) = exec(&["daemonize", &token], Some(20))?;
    ensure(r.status == RunStatus::TimedOut, || format!("daemonize: {:?}", r.status))?;
    ensure(out.contains("ok daemonized"), || {
        format!("the deadline came before the sleeper was left: {out:?}")
    })?;
    let cgroup = r.attestation.enforcement.cgroup.clone().ok_or("the command names no cgroup")?;
    let name = Path::new(&cgroup).file_name().unwrap_or_default().to_string_lossy().into_owned();
    let pid = process_with_token(&token).ok_or("the process left running is gone")?;
    let its = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    ensure(its.lines().any(|l| l.ends_with(&format!("/{name}"))), || {
        format!("the process left running is in {its:?}, not the session's {name}")
    })?;
    let (out, r) = exec(&["membomb", "4096"], None)?;
    ensure(r.status == RunStatus::MemoryLimitExceeded, || format!("membomb: {:?} {out}", r.status))?;
    ensure(r.memory_source == MemorySource::Rusage, || format!("{:?}", r.memory_source))?;
    ensure(process_with_token(&token) == Some(pid), || "the OOM kill took the process left running".into())?;
    let (out, _) = exec(&["forkbomb"], None)?;
    let n: u64 = out.rsplit(' ').nth(1).and_then(|n| n.parse().ok()).ok_or_else(|| format!("{out:?}"))?;
    // The session's own processes count too: fewer forks than a run's.
    ensure(out.starts_with("err EAGAIN stopped after") && n < 30, || out.clone())?;
    Ok((token, cgroup))
}

/// A root broker with no cgroup_root uses the cgroup it starts in only when
/// systemd delegated it (`trusted.delegate`): then it moves into a leaf,
/// enables the controllers and limits runs there; without the mark, none.
fn root_delegation(g: &Guest) -> Check {
    let config = g.config("", None);
    let mut found = Vec::new();
    for marked in [false, true] {
        let dir = g.delegated.join(if marked { "marked" } else { "unmarked" });
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        if marked {
            let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: NUL-terminated strings and a one-byte value, valid for the call.
            let rc = unsafe {
                libc::setxattr(path.as_ptr(), c"trusted.delegate".as_ptr(), b"1".as_ptr().cast(), 1, 0)
            };
            ensure(rc == 0, || format!("setxattr: {}", std::io::Error::last_os_error()))?;
        }
        let (mut d, socket) = g.daemon(&config, Some(&dir));
        let (_, r) = run(&socket, g.request(&["membomb", "4096"]));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(d.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = d.wait();
        let r = r.map_err(|e| format!("{e:?}"))?;
        let e = &r.attestation.enforcement;
        if marked {
            ensure(r.status == RunStatus::MemoryLimitExceeded, || format!("{:?}", r.status))?;
            ensure(e.cgroup.as_deref().is_some_and(|c| c.starts_with(&*dir.to_string_lossy())), || {
                format!("{:?}", e.cgroup)
            })?;
            let leaf = std::fs::read_to_string(dir.join("broker/cgroup.procs")).is_ok();
            ensure(leaf, || "the broker did not move into a leaf".into())?;
            ensure(runs_left(&dir).is_empty(), || format!("{:?}", runs_left(&dir)))?;
        } else {
            ensure(e.cgroup.is_none() && e.limits_by == LimitsBy::Rlimits, || format!("{e:?}"))?;
            ensure(!dir.join("broker").exists(), || "wrote into an undelegated cgroup".into())?;
        }
        found.push(format!("{}: {}", if marked { "marked" } else { "unmarked" }, e.limits_by));
    }
    Ok(format!("trusted.delegate decides ({})", found.join(", ")))
}

/// Runs enough to show a leak (a cgroup, a pool slot) without a load test:
/// the guest is emulated, and each run there costs about a third of a second.
const MANY_RUNS: usize = 60;

fn many_runs(g: &Guest, socket: &Path, runs_dir: &Path) -> Check {
    let start = Instant::now();
    // Four clients at a time: the guest is emulated, and slow.
    let failures: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|w| {
                s.spawn(move || {
                    let mut bad = Vec::new();
                    for i in (w..MANY_RUNS).step_by(4) {
                        let (out, r) = run(socket, g.request(&["echo", &i.to_string()]));
                        match r {
                            Ok(r)
                                if out == format!("ok {i}\n")
                                    && r.status == RunStatus::Exited { code: 0 } => {}
                            other => bad.push(format!("run {i}: {out:?} {other:?}")),
                        }
                    }
                    bad
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    });
    ensure(failures.is_empty(), || failures.join("; "))?;
    // The last runs' cgroups go once their helpers have exited, just after their answers.
    let none_left = eventually(Duration::from_secs(10), || runs_left(runs_dir).is_empty());
    let left = runs_left(runs_dir);
    ensure(none_left, || format!("left behind after {MANY_RUNS} runs: {left:?}"))?;
    Ok(format!(
        "{MANY_RUNS} runs (4 clients) in {:.1} s, no cgroup left behind",
        start.elapsed().as_secs_f64()
    ))
}

/// A broker `kill -9`ed with runs in flight: no sandbox survives it (the
/// lifeline, and the run's cgroup) and the next broker serves. Root's next
/// broker, under the same configured cgroup root, removes the run cgroups
/// the dead one left; a user's runs live in the unit's own cgroup, which
/// systemd empties and removes when it restarts the unit (here, a fresh
/// cgroup for each), so there the dead one's must only be empty.
fn broker_killed(g: &Guest, config: &Path, runs_dir: &Path) -> Check {
    let fresh = |name: &str| {
        let dir = g.delegated.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    };
    let runs_dir = if g.root { runs_dir.to_path_buf() } else { fresh("killed") };
    let (mut d, socket) = g.daemon(config, (!g.root).then_some(runs_dir.as_path()));
    let dead = format!("run-{}-", d.id());
    let tokens: Vec<String> = (0..2).map(|i| format!("vm-killed-{i}-{}", std::process::id())).collect();
    let mut clients = Vec::new();
    for token in &tokens {
        let mut c = Client::connect(&socket).map_err(|e| e.to_string())?;
        c.send(&palisade_protocol::wire::ClientMessage::Run(g.request(&["daemonize", token])))
            .map_err(|e| e.to_string())?;
        clients.push(c);
    }
    ensure(
        eventually(Duration::from_secs(30), || tokens.iter().all(|t| process_with_token(t).is_some())),
        || "the runs never started".into(),
    )?;
    let theirs =
        || -> Vec<String> { run_cgroups(&runs_dir).into_iter().filter(|n| n.starts_with(&dead)).collect() };
    let in_flight = theirs().len();
    ensure(in_flight >= 2, || format!("{in_flight} run cgroups of the broker's in {}", runs_dir.display()))?;
    let _ =
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(d.id() as i32), nix::sys::signal::Signal::SIGKILL);
    let _ = d.wait();
    ensure(
        eventually(Duration::from_secs(10), || tokens.iter().all(|t| process_with_token(t).is_none())),
        || "a sandbox survived its broker".into(),
    )?;
    // The runs' processes are gone; the pool's idle sandboxes end by their
    // lifeline too, each in its own time.
    let populated = || -> Vec<String> {
        theirs()
            .into_iter()
            .filter(|n| cgroup_file(&runs_dir.join(n), "cgroup.events").contains("populated 1"))
            .collect()
    };
    let emptied = eventually(Duration::from_secs(10), || populated().is_empty());
    ensure(emptied, || format!("processes left in {:?}", populated()))?;
    let next_dir = if g.root { runs_dir.clone() } else { fresh("after-kill") };
    let (mut next, socket) = g.daemon(config, (!g.root).then_some(next_dir.as_path()));
    let left = if g.root { theirs() } else { Vec::new() };
    let (out, r) = run(&socket, g.request(&["echo", "next"]));
    stop(&mut next);
    ensure(left.is_empty(), || format!("the dead broker's cgroups were left: {left:?}"))?;
    ensure(out == "ok next\n" && r.is_ok(), || format!("the next broker: {out:?} {r:?}"))?;
    let cleaned =
        if g.root { "removed by the next broker" } else { "emptied (the unit's cgroup is systemd's)" };
    Ok(format!(
        "kill -9 with 2 runs in flight ({in_flight} run cgroups): no sandbox survived, their cgroups {cleaned}, the next broker served"
    ))
}

/// The helper killed once it has joined its run's cgroup (a hook of debug
/// builds, `PALISADE_HELPER_FAULT`, stops it there until then): the client
/// is answered, the run's cgroup removed, and the broker serves.
fn helper_killed_in_its_cgroup(g: &Guest, config: &Path, runs_dir: &Path) -> Check {
    // No helper started ahead: the run's helper joins its cgroup itself.
    let text = std::fs::read_to_string(config).unwrap();
    let text = match text.strip_prefix("[broker]\n") {
        Some(rest) => format!("[broker]\nprespawn = 0\n{rest}"),
        None => format!("[broker]\nprespawn = 0\n{text}"),
    };
    let cold = g.tmp.join("palisade-cold.toml");
    std::fs::write(&cold, text).unwrap();
    let runs_dir = if g.root { runs_dir.to_path_buf() } else { g.delegated.join("helper-killed") };
    std::fs::create_dir_all(&runs_dir).unwrap();
    let env = [("PALISADE_HELPER_FAULT", "cgroup")];
    let (mut d, socket) = g.daemon_with_env(&cold, (!g.root).then_some(runs_dir.as_path()), &env);
    let answer = std::thread::scope(|s| {
        let client = s.spawn(|| run(&socket, g.request(&["echo", "never"])));
        let mut stopped = None;
        let found = eventually(Duration::from_secs(30), || {
            stopped = palisade_tests::descendants(d.id()).into_iter().find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim_end() == "fault-cgroup")
            });
            stopped.is_some()
        });
        if let Some(pid) = stopped {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        (found, client.join().unwrap())
    });
    let (found, (_, r)) = answer;
    let left = eventually(Duration::from_secs(10), || runs_left(&runs_dir).is_empty());
    let leftover = runs_left(&runs_dir);
    stop(&mut d);
    ensure(found, || "no helper stopped after joining its cgroup".into())?;
    ensure(r.as_ref().map_or(true, |r| r.status != RunStatus::Exited { code: 0 }), || format!("{r:?}"))?;
    ensure(left, || format!("run cgroups left: {leftover:?}"))?;
    Ok(format!(
        "killed in its cgroup: answered {:?}, its cgroup removed",
        r.map(|r| r.status).map_err(|e| e.0)
    ))
}

fn landlock_abi2(g: &Guest, socket: &Path) -> Check {
    let (_, r) = run(socket, g.request(&["echo", "x"]));
    let r = r.map_err(|e| format!("{e:?}"))?;
    let l = r.attestation.enforcement.landlock.ok_or("no Landlock report")?;
    ensure(l.abi == 2 && l.enforced == ["fs", "fs.refer"], || format!("{l:?}"))?;
    for f in ["fs.truncate", "scope.abstract_unix", "scope.signal"] {
        ensure(l.not_enforced.iter().any(|n| n == f), || format!("{f} not reported as not enforced: {l:?}"))?;
    }
    ensure(l.ruleset == RulesetState::Partial, || format!("{:?}", l.ruleset))?;
    // Required parts the kernel lacks: refused before spawning, with the reason.
    let strict = g.config("", None).with_file_name("palisade-require.toml");
    let dir = bin("probe").parent().unwrap().to_path_buf();
    std::fs::write(
        &strict,
        format!(
            "[policy]\nrequire_landlock = [\"fs\", \"scope.signal\"]\n[defaults]\ndisk = \"direct\"\nread_only = [{dir:?}]\n"
        ),
    )
    .unwrap();
    let o = Command::new(bin("palisade"))
        .args(["run", "--policy"])
        .arg(&strict)
        .args(["--", &probe(), "echo", "x"])
        .current_dir(&g.ws)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    ensure(o.status.code() == Some(125), || format!("{o:?}"))?;
    ensure(
        err.contains("palisade: Unavailable: the policy requires Landlock scope.signal")
            && err.contains("ABI 2"),
        || err.clone(),
    )?;
    // And the helper itself refuses a plan that requires them (defense in depth).
    let mut jail = palisade_tests::Jail::new(palisade_protocol::Tier::C);
    if g.root {
        // The guest's tmpfs cannot idmap: the workspace is the sandbox's own,
        // and the plan acts for the sandbox's ids (no idmap needed).
        let nobody = Some(nix::unistd::Uid::from_raw(65534));
        nix::unistd::chown(&jail.workspace(), nobody, Some(nix::unistd::Gid::from_raw(65534))).unwrap();
        jail.spec.acting_for = jail.spec.host_ids;
    }
    jail.spec.landlock_required =
        palisade_protocol::LandlockFeatures::FS.union(palisade_protocol::LandlockFeatures::SCOPE_SIGNAL);
    let o = jail.run(&["echo", "x"]);
    let f = o.failure().ok_or_else(|| format!("no failure: {o:?}"))?;
    ensure(f.stage == palisade_protocol::Stage::Landlock && f.errno_name == "EOPNOTSUPP", || format!("{f}"))?;
    Ok(format!(
        "ABI 2: enforced {:?}, not enforced {:?}; required scope.signal refused",
        l.enforced, l.not_enforced
    ))
}

/// tests/plugins/echo.wat without its comments (an inline module starts
/// with its `(`).
fn echo() -> String {
    let text = include_str!("../../../plugins/echo.wat");
    text.lines().filter(|l| !l.trim_start().starts_with(";;")).collect::<Vec<_>>().join("\n")
}

/// A plugin that grows its memory by `pages` (64 KiB each) and touches
/// them, then returns its input.
fn toucher(pages: u32) -> String {
    let echo = echo();
    let main = "(func (export \"palisade_plugin_main\")";
    let touch = format!(
        "(func $touch (drop (memory.grow (i32.const {pages}))) \
         (memory.fill (i32.const 65536) (i32.const 7) (i32.const {bytes})))\n  (start $touch)\n  {main}",
        bytes = pages << 16,
    );
    echo.replacen(main, &touch, 1)
}

fn call_plugin(socket: &Path, module: String) -> Result<PluginAttestation, String> {
    let mut c = Client::connect(socket).map_err(|e| e.to_string())?;
    let message = ClientMessage::RunPlugin {
        skill: "inline".into(),
        input: "{}".into(),
        inline_module: Some(module),
        timeout_ms: None,
    };
    match c.request(&message) {
        Ok(ServerMessage::PluginResult { output, attestation, .. }) if output == "{}" => Ok(*attestation),
        Ok(other) => Err(format!("{other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

fn cgroup_file(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_default().trim().to_string()
}

/// The plugin-host lives in a cgroup of its own with its limits: a plugin
/// that touches 56 MiB of memory runs, and the host is in that cgroup.
fn plugin_host_cgroup(g: &Guest) -> Check {
    g.with_plugin_daemon("plugins-big", 512 << 20, |socket, runs_dir| {
        let a = call_plugin(socket, toucher(56 * 16))?;
        let cg = a.jail.cgroup.ok_or("the attestation names no cgroup for the plugin-host")?;
        ensure(cg.name.contains("-plugin-host-") && !cg.v1, || format!("{cg:?}"))?;
        ensure((cg.memory_bytes, cg.processes) == (512 << 20, 64), || format!("{cg:?}"))?;
        let dir = runs_dir.join(&cg.name);
        let (max, pids, procs) = (
            cgroup_file(&dir, "memory.max"),
            cgroup_file(&dir, "pids.max"),
            cgroup_file(&dir, "cgroup.procs"),
        );
        ensure(max == "536870912" && pids == "64", || {
            format!("{}: memory.max {max}, pids.max {pids}", dir.display())
        })?;
        ensure(procs.lines().any(|p| p == a.jail.pid.to_string()), || {
            format!("the host's helper {} is not in {}: {procs:?}", a.jail.pid, dir.display())
        })?;
        let peak = cgroup_file(&dir, "memory.peak").parse::<u64>().unwrap_or(0);
        ensure(peak > 56 << 20, || format!("memory.peak {peak}: the touched pages are not counted"))?;
        Ok(format!("{} holds the host (memory.max {max}, pids.max {pids}, peak {} MiB)", cg.name, peak >> 20))
    })
}

/// A plugin that touches all of the 64 MiB a call may grow to, in a host
/// whose cgroup allows 64 MiB for the call and the engine together: the kernel kills
/// the host, the call fails, the next call gets a new host in a new cgroup,
/// and the dead host's cgroup is removed.
fn plugin_host_memory_limit(g: &Guest) -> Check {
    g.with_plugin_daemon("plugins-small", 64 << 20, |socket, runs_dir| {
        let first = call_plugin(socket, echo())?;
        let first = first.jail.cgroup.ok_or("no cgroup for the plugin-host")?.name;
        // The whole 64 MiB a call may have (its first page and 1023 more).
        let ooms = || oom_kills(&runs_dir.join("memory.events"));
        let before = ooms();
        let killed = call_plugin(socket, toucher(1023));
        ensure(killed.as_ref().is_err_and(|e| e.contains("plugin-host died")), || format!("{killed:?}"))?;
        // memory.events counts the subtree's: the dead host's cgroup is gone.
        ensure(ooms() > before, || format!("no OOM kill under {}: {before} before", runs_dir.display()))?;
        let next = call_plugin(socket, echo())?;
        let next = next.jail.cgroup.ok_or("no cgroup for the second plugin-host")?.name;
        ensure(next != first, || format!("the second host is in {next}, as the first"))?;
        ensure(eventually(Duration::from_secs(10), || !runs_dir.join(&first).exists()), || {
            format!("{first} was left behind")
        })?;
        Ok(format!(
            "OOM-killed in {first} ({} of the subtree's oom_kill): {}; the next host runs in {next}",
            ooms() - before,
            killed.unwrap_err()
        ))
    })
}

fn oom_kills(events: &Path) -> u64 {
    let text = std::fs::read_to_string(events).unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

fn stop(d: &mut Child) {
    let _ =
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(d.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = d.wait();
}

/// cgroup v1: the hierarchies this program mounts (as root) in the guest.
fn v1_checks(g: &Guest) -> Vec<(&'static str, Check)> {
    let base = g.tmp.join("cgv1");
    for c in ["memory", "pids", "cpu,cpuacct", "freezer"] {
        let dir = base.join(c.replace(',', "_"));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "cgroup", "-o", c, "cgroup"])
            .arg(&dir)
            .status()
            .unwrap()
            .success();
        if !ok {
            return vec![("v1 mounts", Err(format!("cannot mount the v1 {c} hierarchy")))];
        }
        std::fs::create_dir_all(dir.join("palisade")).unwrap();
    }
    let root = base.join("memory/palisade");
    let config = g.config("", Some(&root));
    let (mut d, socket) = g.daemon(&config, None);
    let runs = root.clone();
    let mut out = vec![
        ("v1 memory bomb", {
            let (o, r) = run(&socket, g.request(&["membomb", "4096"]));
            r.map_err(|e| format!("{e:?}")).and_then(|r| {
                ensure(
                    r.status == RunStatus::MemoryLimitExceeded && r.memory_source == MemorySource::Cgroup,
                    || format!("{:?} {o}", r.status),
                )?;
                ensure(r.attestation.enforcement.limits_by == LimitsBy::CgroupV1, || {
                    r.attestation.enforcement.limits_by.to_string()
                })?;
                Ok(format!(
                    "OOM-killed under memory.limit_in_bytes=64M, peak {} MiB",
                    r.peak_memory_bytes >> 20
                ))
            })
        }),
        ("v1 pool", v1_pool(g, &socket, &base)),
        ("v1 fork bomb", fork_bomb(g, &socket)),
        ("v1 session in a cgroup", session_in_cgroup(g, &socket)),
        ("v1 plugin-host cgroup", v1_plugin_host(g, &base)),
    ];
    out.push((
        "v1 runs removed",
        ensure(eventually(Duration::from_secs(10), || runs_left(&runs).is_empty()), || {
            format!("{:?}", runs_left(&runs))
        })
        .map(|_| "no run cgroup left".into()),
    ));
    let _ =
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(d.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = d.wait();
    out
}

/// cgroup v1: the root broker's pool for the requester, after its first
/// (cold) run. Each idle slot's monitor and pid 1 are in the slot's cgroup
/// of every hierarchy before any run claims it. A warm run is limited there
/// (the memory bomb is killed in the slot's cgroup, limited at the claim),
/// and the next warm run sees none of the traces of the one before it.
fn v1_pool(g: &Guest, socket: &Path, base: &Path) -> Check {
    let hierarchies = [base.join("memory/palisade"), base.join("pids/palisade")];
    let slots = || -> Vec<String> {
        run_cgroups(&hierarchies[0]).into_iter().filter(|n| n.contains("-pool-")).collect()
    };
    let members = |slot: &str| -> Vec<usize> {
        hierarchies.iter().map(|h| cgroup_file(&h.join(slot), "cgroup.procs").lines().count()).collect()
    };
    let filled = eventually(Duration::from_secs(60), || {
        let slots = slots();
        slots.len() == 2 && slots.iter().all(|s| members(s) == [2, 2])
    });
    ensure(filled, || {
        let seen: Vec<_> = slots().into_iter().map(|s| (members(&s), s)).collect();
        format!("idle slots (members in memory, pids): {seen:?}")
    })?;
    let (out, r) = run(socket, g.request(&["membomb", "4096"]));
    let r = r.map_err(|e| format!("{e:?}"))?;
    let e = &r.attestation.enforcement;
    let cgroup = e.cgroup.clone().unwrap_or_default();
    ensure(e.built == Some(Built::Warm) && cgroup.contains("-pool-"), || format!("{e:?}"))?;
    ensure(
        r.status == RunStatus::MemoryLimitExceeded
            && r.memory_source == MemorySource::Cgroup
            && e.limits_by == LimitsBy::CgroupV1,
        || format!("{:?} {:?} {} {out}", r.status, r.memory_source, e.limits_by),
    )?;
    let token = format!("v1-trace-{}", std::process::id());
    let warm_run = |args: &[&str]| -> Result<String, String> {
        let (out, r) = run(socket, g.request(args));
        let e = r.map_err(|e| format!("{args:?}: {e:?}"))?.attestation.enforcement;
        ensure(e.built == Some(Built::Warm), || format!("{args:?}: {e:?}"))?;
        Ok(out)
    };
    let first = warm_run(&["traces", &token])?;
    ensure(first.contains("file=yes sysv=yes shm=yes process=yes"), || first.clone())?;
    ensure(eventually(Duration::from_secs(10), || process_with_token(&token).is_none()), || {
        "the first run's detached process outlived it".into()
    })?;
    let next = warm_run(&["look", &token])?;
    ensure(next.contains("file=no sysv=no shm=no process=no"), || next.clone())?;
    Ok(format!(
        "2 idle slots, monitor and pid 1 in each one's memory and pids cgroups; a warm run OOM-killed \
         in {}; the next warm run sees none of its traces",
        Path::new(&cgroup).file_name().unwrap_or_default().to_string_lossy()
    ))
}

/// cgroup v1: the broker places the plugin-host in its cgroup of every
/// hierarchy, and removes it when it stops.
fn v1_plugin_host(g: &Guest, base: &Path) -> Check {
    let config = g.plugin_config(Some(&base.join("memory/palisade")), 512 << 20);
    let (mut d, socket) = g.daemon(&config, None);
    let (memory, pids) = (base.join("memory/palisade"), base.join("pids/palisade"));
    let placed = call_plugin(&socket, echo()).and_then(|a| {
        let cg = a.jail.cgroup.ok_or("the attestation names no cgroup for the plugin-host")?;
        ensure(cg.v1 && cg.memory_bytes == 512 << 20, || format!("{cg:?}"))?;
        let (limit, max) = (
            cgroup_file(&memory.join(&cg.name), "memory.limit_in_bytes"),
            cgroup_file(&pids.join(&cg.name), "pids.max"),
        );
        ensure(limit == "536870912" && max == "64", || {
            format!("memory.limit_in_bytes {limit}, pids.max {max}")
        })?;
        for h in [&memory, &pids] {
            let procs = cgroup_file(&h.join(&cg.name), "cgroup.procs");
            ensure(procs.lines().any(|p| p == a.jail.pid.to_string()), || {
                format!(
                    "the host's helper {} is not in {}: {procs:?}",
                    a.jail.pid,
                    h.join(&cg.name).display()
                )
            })?;
        }
        Ok(cg)
    });
    stop(&mut d);
    let cg = placed?;
    ensure(!memory.join(&cg.name).exists() && !pids.join(&cg.name).exists(), || {
        format!("{} was left behind after the broker stopped", cg.name)
    })?;
    Ok(format!(
        "{} holds the host in the memory and pids hierarchies; removed when the broker stopped",
        cg.name
    ))
}

pub(crate) fn main() {
    // It mounts cgroup hierarchies and writes cgroups: never on a real host.
    if std::env::var_os("VMTEST_AS").is_none() {
        eprintln!(
            "vmcheck runs only inside the throwaway guest of tests/vm/run-in-vm.sh (which sets VMTEST_AS)"
        );
        std::process::exit(2);
    }
    let v1 = std::env::args().any(|a| a == "--v1");
    let tmp = PathBuf::from(std::env::var("TMPDIR").unwrap_or_else(|_| "/tmp".into()));
    let ws = tmp.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let g = Guest {
        ws,
        delegated: PathBuf::from(std::env::var("VMTEST_CGROUP").unwrap_or_default()),
        root: nix::unistd::geteuid().is_root(),
        tmp,
    };
    let checks: Vec<(&str, Check)> = if v1 {
        v1_checks(&g)
    } else {
        // Root names the delegated subtree in its configuration; the user is
        // found there by default, as systemd's Delegate=yes would leave it.
        let config = g.config("", g.root.then_some(g.delegated.as_path()));
        let runs_dir = if g.root { g.delegated.clone() } else { own_cgroup() };
        if !g.root {
            // Like a systemd unit's cgroup, the delegated one holds only the
            // broker: this program steps aside into a leaf of its own.
            let leaf = runs_dir.join("vmcheck");
            std::fs::create_dir_all(&leaf).unwrap();
            std::fs::write(leaf.join("cgroup.procs"), std::process::id().to_string()).unwrap();
        }
        let (mut d, socket) = g.daemon(&config, (!g.root).then_some(runs_dir.as_path()));
        let checks = vec![
            ("doctor", doctor(&g, &config)),
            ("memory bomb", memory_bomb(&g, &socket, &runs_dir)),
            ("fork bomb", fork_bomb(&g, &socket)),
            ("cpu share", cpu_share(&g, &socket)),
            ("deadline kill", deadline_kills_the_cgroup(&g, &socket)),
            ("quota and disconnect kill", quota_and_disconnect_kill_the_cgroup(&g, &socket)),
            ("many runs", many_runs(&g, &socket, &runs_dir)),
            ("landlock abi 2", landlock_abi2(&g, &socket)),
            ("session in a cgroup", session_in_cgroup(&g, &socket)),
        ];
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(d.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let status = d.wait().unwrap();
        let mut checks = checks;
        checks.push((
            "shutdown",
            ensure(status.success(), || format!("palisaded exited {status:?}"))
                .and_then(|()| {
                    let left = run_cgroups(&runs_dir);
                    ensure(left.is_empty(), || format!("left at exit: {left:?}"))
                })
                .map(|_| "palisaded exited 0, no run cgroup or pool slot left".into()),
        ));
        checks.push(("broker killed", broker_killed(&g, &config, &runs_dir)));
        checks.push(("helper killed in its cgroup", helper_killed_in_its_cgroup(&g, &config, &runs_dir)));
        checks.push(("plugin-host cgroup", plugin_host_cgroup(&g)));
        checks.push(("plugin-host memory limit", plugin_host_memory_limit(&g)));
        if g.root {
            checks.push(("root delegation", root_delegation(&g)));
        }
        checks
    };
    let mut failures = 0;
    let who = if g.root { "root" } else { "user" };
    for (name, result) in &checks {
        match result {
            Ok(detail) => println!("vmcheck PASS [{who}] {name}: {detail}"),
            Err(why) => {
                failures += 1;
                println!("vmcheck FAIL [{who}] {name}: {why}");
            }
        }
    }
    println!("vmcheck [{who}]: {} passed, {failures} failed", checks.len() - failures);
    std::process::exit(failures as i32);
}

/// This process's cgroup v2 directory: where a delegated broker puts its runs.
fn own_cgroup() -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let rel = text.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/");
    Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'))
}
