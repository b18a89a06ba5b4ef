//! macOS's executor: a decided run under Seatbelt.
//!
//! The profile the policy wrote from the plan
//! ([`palisade_policy::seatbelt::profile`]) goes to a private file;
//! `sandbox-exec -f FILE PROGRAM ARGS...` runs the command under it, in a
//! process group of its own, with the plan's environment, working directory
//! and the rlimits macOS enforces. Its output streams as on Linux
//! ([`crate::engine::stream`]: the output quota, the deadline, the client's pace);
//! when palisade ends the run, or the command exits, every process of the
//! run is killed ([`procs`]); the resident memory of the run's processes is
//! sampled and the run ended above the plan's limit, macOS having no kernel
//! limit for it. The profile and the run's directories are removed when the
//! run ends, whatever happened.
//!
//! Built on every Unix: on Linux its supervision is tested with a stand-in
//! launcher (`tests.rs`); what Seatbelt enforces is tested on macOS only
//! (`mac/macos_tests.rs`). [`executor::Macos`] is this module behind the
//! broker's executor seam.

pub mod executor;
mod procs;
#[cfg(all(test, target_os = "linux"))]
pub(crate) mod tests;

use crate::engine::stream::{Bounds, Child, Input, Run, Sink};
use crate::host::paths::HostDirs;
use palisade_policy::Resolved;
use palisade_policy::seatbelt::SeatbeltError;
use palisade_protocol::attest::{Executor, Memory, MemorySource, RlimitEntry};
use palisade_protocol::wire::{Attestation, ErrorKind, RunRequest, RunResult, RunStatus, ServerMessage};
use palisade_protocol::{Rlimit, RlimitName};
use std::future::Future;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::net::unix::pipe;
use tokio::sync::watch;

/// macOS's launcher: applies the profile named by `-f`, then execs the command.
pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

/// How often the resident memory of a run's processes is summed: often
/// enough to catch a steady climb, at a few system calls per process.
pub const MEMORY_SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// The rlimits of the plan set on the command as they are: those macOS
/// enforces. RLIMIT_AS and RLIMIT_DATA are not enforced there (memory is
/// sampled instead); RLIMIT_NPROC counts every process of the user, so it
/// is set to the user's processes plus the plan's (see [`processes_limit`]).
const RLIMITS_SET: [RlimitName; 4] =
    [RlimitName::Cpu, RlimitName::Nofile, RlimitName::Fsize, RlimitName::Core];

/// Why a run could not be started or finished.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Profile(#[from] SeatbeltError),
    #[error("cannot prepare the run's files: {0}")]
    Setup(std::io::Error),
    #[error("cannot start {}: {source}", launcher.display())]
    Spawn { launcher: PathBuf, source: std::io::Error },
    #[error("cannot collect the command's exit: {0}")]
    Wait(std::io::Error),
}

impl ExecError {
    /// The kind a client sees.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ExecError::Profile(SeatbeltError::Path(_)) => ErrorKind::InvalidRequest,
            ExecError::Profile(_) => ErrorKind::Unavailable,
            ExecError::Setup(_) | ExecError::Spawn { .. } | ExecError::Wait(_) => ErrorKind::RuntimeFailure,
        }
    }
}

/// Runs decided plans under Seatbelt.
pub struct Seatbelt {
    /// [`SANDBOX_EXEC`] (a test names a stand-in).
    launcher: PathBuf,
    /// A directory only the broker may enter, for the profiles of runs.
    profiles: PathBuf,
}

/// A run's profile, its process limit and the attestation it will have.
pub struct Prepared {
    pub profile: String,
    /// What marks the run's processes (see [`procs::Marks`]).
    pub marks: procs::Marks,
    /// RLIMIT_NPROC for the run ([`processes_limit`]); `None`: unlimited.
    pub processes: Option<Rlimit>,
    pub attestation: Attestation,
}

impl Seatbelt {
    /// Runs through `launcher`, with profiles written under `profiles`
    /// (made 0700 if missing; refused when anyone else could write there).
    pub fn new(launcher: PathBuf, profiles: PathBuf) -> Result<Seatbelt, String> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&profiles)
            .map_err(|e| format!("cannot create {}: {e}", profiles.display()))?;
        crate::host::paths::check_private(&profiles)?;
        let profiles = profiles.canonicalize().map_err(|e| format!("{}: {e}", profiles.display()))?;
        Ok(Seatbelt { launcher, profiles })
    }

    /// Kills what runs of brokers no longer running left (a broker that
    /// died uncleanly could not): every process marked as one of theirs,
    /// found by the profiles they left in this broker's directory. Call
    /// before those profiles are removed.
    pub fn kill_leftovers(&self) {
        let Ok(entries) = std::fs::read_dir(&self.profiles) else { return };
        let mut dead = std::collections::BTreeSet::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let mut parts = name.splitn(3, '-');
            if let (Some(pid), Some(started)) = (parts.next(), parts.next()) {
                let instance = format!("{pid}-{started}");
                if name.ends_with(".sb") && !crate::host::instance::alive(&instance) {
                    dead.insert(instance);
                }
            }
        }
        // An instance whose start time could not be read (`<pid>-0`) is never taken for dead.
        dead.retain(|instance| !instance.ends_with("-0"));
        for instance in dead {
            let killed = procs::Marks::of_instance(&self.profiles, &instance).kill();
            if killed > 0 {
                tracing::warn!(instance, killed, "killed the processes a dead broker's runs left running");
            }
        }
    }

    /// The profile run `run_id` of `resolved` runs under, and the
    /// attestation its run will have (what the journal records before the
    /// run starts); `host_executed`: `[policy] host_executed`, the globs a
    /// run may not write beside the built-in ones.
    pub fn prepare(
        &self,
        run_id: u64,
        resolved: &Resolved,
        request: &RunRequest,
        host_executed: &[String],
    ) -> Result<Prepared, ExecError> {
        let marks = procs::Marks::of_run(&self.profiles, crate::host::instance::tag(), run_id);
        let mut profile = palisade_policy::seatbelt::profile(resolved, host_executed)?;
        marks.allow_in(&mut profile)?;
        palisade_policy::seatbelt::sbpl::check(&profile)
            .map_err(|e| ExecError::Profile(palisade_policy::seatbelt::SeatbeltError::Malformed(e)))?;
        let processes = processes_limit(resolved);
        let attestation = attestation(request, resolved, &profile, processes);
        Ok(Prepared { profile, marks, processes, attestation })
    }

    /// Runs `resolved` (decided for `request`, [`Seatbelt::prepare`]d) to
    /// its result; `cancel` completing (a client gone, a shutdown) kills it,
    /// and so does dropping the future.
    pub async fn execute<S: Sink + Send>(
        &self,
        run_id: u64,
        resolved: &Resolved,
        request: &RunRequest,
        prepared: Prepared,
        sink: &mut S,
        cancel: impl Future<Output = ()> + Send,
    ) -> Result<RunResult, ExecError> {
        let name = format!("{}-{run_id}.sb", crate::host::instance::tag());
        // Declared before the run: dropped after it, once its processes are dead.
        let files = RunFiles::create(resolved, &self.profiles.join(name), &prepared.profile)?;
        let started = Instant::now();
        let input = Input::of(request, sink.take_stdin());
        let mut command = self.command(resolved, &files.profile, !input.piped(), prepared.processes);
        // Linux, under test: the stand-in's command is found by what it carries.
        #[cfg(not(target_os = "macos"))]
        command.env(procs::MARKS_ENV, prepared.marks.environment());
        let mut spawned =
            command.spawn().map_err(|source| ExecError::Spawn { launcher: self.launcher.clone(), source })?;
        let mut group = Group::watch(spawned.id(), prepared.marks.clone());
        let pipes = (|| -> std::io::Result<[pipe::Receiver; 2]> {
            feed_stdin(spawned.stdin.take(), input)?;
            Ok([receiver(spawned.stdout.take())?, receiver(spawned.stderr.take())?])
        })()
        .map_err(ExecError::Setup)?;
        let memory_bytes = resolved.plan.rlimits.data.hard;
        let (pgid, seen, over) = (group.pgid, Arc::clone(&group.seen), Arc::clone(&group.over_memory));
        group.sampler = Some(tokio::spawn(procs::watch(pgid, memory_bytes, seen, over)));
        let bounds = Bounds {
            max_output_bytes: resolved.max_output_bytes,
            timeout: resolved.timeout,
            chunk_bytes: resolved.capture_chunk_bytes,
            first_signal: libc::SIGKILL,
        };
        let started_msg = ServerMessage::Started { run_id, executor: Executor::MacosSeatbelt };
        let streamed = Run::new(sink, &group, pipes, bounds, cancel).stream(started_msg).await;
        let exited_ms = streamed.exited_at.map(|at| at.duration_since(started).as_millis());
        tracing::debug!(run_id, ?exited_ms, "command exited");
        // Nothing of the run outlives it: what the command left running dies with it.
        let usage = group.finish().await.map_err(ExecError::Wait)?;
        let mut ended = streamed.ended;
        if group.over_memory.load(Ordering::SeqCst) && ended.is_none() {
            ended = Some(RunStatus::MemoryLimitExceeded);
        }
        let status = ended.unwrap_or(usage.status);
        tracing::info!(run_id, ?status, "run finished");
        Ok(RunResult {
            run_id,
            status,
            wall_ms: started.elapsed().as_millis() as u64,
            cpu_user_ms: usage.user_ms,
            cpu_system_ms: usage.system_ms,
            peak_memory_bytes: usage.max_rss_bytes,
            memory_source: MemorySource::Rusage,
            stdout_bytes: streamed.stdout_bytes,
            stderr_bytes: streamed.stderr_bytes,
            written_bytes: 0,
            changes: Default::default(),
            attestation: prepared.attestation,
            // The broker's, once the run is over (`Broker::execute`).
            approved: None,
        })
    }

    /// `sandbox-exec -f PROFILE PROGRAM ARGS...`, in a session (and process
    /// group) of its own, with the plan's environment, directory and rlimits.
    fn command(
        &self,
        resolved: &Resolved,
        profile: &Path,
        no_stdin: bool,
        processes: Option<Rlimit>,
    ) -> std::process::Command {
        let plan = &resolved.plan;
        let mut command = std::process::Command::new(&self.launcher);
        command
            .arg("-f")
            .arg(profile)
            .arg(&plan.program)
            .args(plan.argv.iter().skip(1))
            .env_clear()
            .envs(plan.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&plan.cwd)
            .stdin(if no_stdin { Stdio::null() } else { Stdio::piped() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut limits = limits_set(resolved);
        limits.extend(processes.map(|l| (libc::RLIMIT_NPROC as RlimitResource, l)));
        let umask = plan.umask;
        // `limits` is a copy the closure owns, read without allocating.
        // SAFETY: the closure runs between fork and exec and calls only setsid, setrlimit,
        // umask and what `cloexec_from_3` calls: all async-signal-safe, none allocates.
        unsafe {
            command.pre_exec(move || {
                // A session of its own, and so a group: no process of the run
                // can join a group of the broker's session (another run's,
                // say), which `setpgid` allows within a session.
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                procs::cloexec_from_3();
                for &(resource, limit) in &limits {
                    let rl = libc::rlimit { rlim_cur: native(limit.soft), rlim_max: native(limit.hard) };
                    if libc::setrlimit(resource, &rl) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // The requester's, as the helper sets it on Linux.
                if let Some(mask) = umask {
                    libc::umask(mask as libc::mode_t);
                }
                Ok(())
            })
        };
        command
    }
}

/// A limit in this system's terms: its own `RLIM_INFINITY` (macOS's is not
/// the protocol's `u64::MAX`) for unlimited.
fn native(limit: u64) -> libc::rlim_t {
    if limit == palisade_protocol::RLIM_INFINITY { libc::RLIM_INFINITY } else { limit as libc::rlim_t }
}

/// The rlimits of the plan that are set on the command: those of
/// [`RLIMITS_SET`] that limit something. An unlimited one is left as the
/// broker has it (raising a hard limit to infinity is refused to anyone
/// but root), and is not in the attestation's list.
fn rlimits_set(resolved: &Resolved) -> Vec<(RlimitName, Rlimit)> {
    let unlimited =
        |l: &Rlimit| l.soft == palisade_protocol::RLIM_INFINITY && l.hard == palisade_protocol::RLIM_INFINITY;
    let table = resolved.plan.rlimits.table().into_iter();
    table.filter(|(n, l)| RLIMITS_SET.contains(n) && !unlimited(l)).collect()
}

/// [`rlimits_set`], with the resource numbers of this system.
fn limits_set(resolved: &Resolved) -> Vec<(RlimitResource, Rlimit)> {
    let number = |name: RlimitName| match name {
        RlimitName::Cpu => libc::RLIMIT_CPU,
        RlimitName::Nofile => libc::RLIMIT_NOFILE,
        RlimitName::Fsize => libc::RLIMIT_FSIZE,
        _ => libc::RLIMIT_CORE,
    };
    rlimits_set(resolved).into_iter().map(|(n, l)| (number(n) as RlimitResource, l)).collect()
}

/// RLIMIT_NPROC for a run of `resolved`: macOS counts every process of
/// the user against it, so the run may start the plan's `max_processes`
/// more than the user has now (counted just before the run; what the user
/// starts meanwhile takes from that room), within the user's own hard
/// limit. `None` where the plan sets no limit.
fn processes_limit(resolved: &Resolved) -> Option<Rlimit> {
    let wanted = resolved.plan.rlimits.processes.hard;
    if wanted == palisade_protocol::RLIM_INFINITY {
        return None;
    }
    let now = procs::of_uid(nix::unistd::getuid().as_raw()) as u64;
    let mut own = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `own` is valid for writing one rlimit; nix has no RLIMIT_NPROC on macOS.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NPROC as RlimitResource, &mut own) };
    let hard = if read == 0 && own.rlim_max != libc::RLIM_INFINITY { own.rlim_max } else { u64::MAX };
    let limit = now.saturating_add(wanted).min(hard);
    Some(Rlimit { soft: limit, hard: limit })
}

/// What `setrlimit` takes for a resource: glibc names its own type.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
type RlimitResource = libc::__rlimit_resource_t;
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
type RlimitResource = libc::c_int;

/// What the run had in force; its executor `macos-seatbelt`.
fn attestation(
    request: &RunRequest,
    resolved: &Resolved,
    profile: &str,
    processes: Option<Rlimit>,
) -> Attestation {
    let mut a = crate::journal::attest::attestation(request, resolved, None, None, None);
    a.executor = Executor::MacosSeatbelt;
    let e = &mut a.enforcement;
    e.seatbelt_sha256 = Some(crate::journal::attest::sha256_hex(profile.as_bytes()));
    e.seccomp_sha256 = crate::journal::attest::sha256_hex(b"");
    e.seccomp_instructions = 0;
    e.rlimits = rlimits_set(resolved).into_iter().map(|(n, l)| RlimitEntry::new(n, l)).collect();
    e.rlimits.extend(processes.map(|l| RlimitEntry::new(RlimitName::Nproc, l)));
    // In the protocol's order (docs/protocol.md): the enum's.
    e.rlimits.sort_by_key(|r| r.name as u8);
    e.memory = Memory::Sampled {
        bytes: resolved.plan.rlimits.data.hard,
        every_ms: MEMORY_SAMPLE_EVERY.as_millis() as u64,
    };
    a
}

/// The run's files on the host: the directories the plan names (0700) and
/// its profile (0600), all removed when the run is dropped.
struct RunFiles {
    profile: PathBuf,
    /// Dropped after the profile is removed.
    _dirs: HostDirs,
}

impl RunFiles {
    fn create(resolved: &Resolved, profile: &Path, text: &str) -> Result<RunFiles, ExecError> {
        let me = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        let dirs = HostDirs::create(&resolved.host_dirs, me).map_err(ExecError::Setup)?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(profile)
            .map_err(ExecError::Setup)?;
        let files = RunFiles { profile: profile.to_path_buf(), _dirs: dirs };
        std::io::Write::write_all(&mut file, text.as_bytes()).map_err(ExecError::Setup)?;
        Ok(files)
    }
}

impl Drop for RunFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.profile);
    }
}

/// Writes the run's input to the command's stdin from a task of its own (a
/// command that does not read it must not hold up the run), then closes it.
fn feed_stdin(stdin: Option<std::process::ChildStdin>, input: Input) -> std::io::Result<()> {
    let Some(stdin) = stdin else { return Ok(()) };
    let tx = pipe::Sender::from_owned_fd(OwnedFd::from(stdin))?;
    tokio::spawn(input.feed(tx));
    Ok(())
}

fn receiver<T: Into<OwnedFd>>(end: Option<T>) -> std::io::Result<pipe::Receiver> {
    pipe::Receiver::from_owned_fd(end.ok_or_else(|| std::io::Error::other("missing pipe"))?.into())
}

/// How the command ended by itself, and what it used.
struct Usage {
    status: RunStatus,
    user_ms: u64,
    system_ms: u64,
    max_rss_bytes: u64,
}

/// The command's process group. A thread of its own sees the leader exit
/// (without reaping it: while it is a zombie its group id cannot be reused,
/// so killing the group never reaches another); [`Group::finish`] kills
/// what is left and reaps it. Dropped before that (the run's future
/// dropped), it kills and reaps all the same.
struct Group {
    pid: libc::pid_t,
    pgid: libc::pid_t,
    /// `true` once the leader has exited.
    exited: watch::Receiver<bool>,
    /// Every process of the run the sampler saw, by pid and start time.
    seen: Arc<procs::Seen>,
    /// Set by the sampler when it ended the run.
    over_memory: Arc<AtomicBool>,
    /// What marks every process of the run, wherever it went.
    marks: procs::Marks,
    sampler: Option<tokio::task::JoinHandle<()>>,
    reaped: bool,
}

impl Group {
    fn watch(pid: u32, marks: procs::Marks) -> Group {
        let (exited_tx, exited) = watch::channel(false);
        let pid = pid as libc::pid_t;
        std::thread::spawn(move || {
            if let Err(e) = wait_exit(pid) {
                tracing::error!(pid, "cannot wait for the command: {e}");
            }
            let _ = exited_tx.send(true);
        });
        Group {
            pid,
            pgid: pid,
            exited,
            seen: Arc::default(),
            over_memory: Arc::new(AtomicBool::new(false)),
            marks,
            sampler: None,
            reaped: false,
        }
    }

    /// Kills every process of the run, stops the sampler, and reaps the
    /// leader (which has exited): its exit and usage.
    async fn finish(&mut self) -> std::io::Result<Usage> {
        self.kill_all();
        if let Some(s) = self.sampler.take() {
            s.abort();
        }
        let pid = self.pid;
        let usage = tokio::task::spawn_blocking(move || wait(pid)).await.map_err(std::io::Error::other)?;
        self.reaped = true;
        usage
    }

    fn kill_all(&self) {
        procs::kill_all(self.pgid, libc::SIGKILL);
        self.seen.kill();
        self.marks.kill();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(s) = self.sampler.take() {
            s.abort();
        }
        if !self.reaped {
            self.kill_all();
            let pid = self.pid;
            std::thread::spawn(move || wait(pid));
        }
    }
}

impl Child for &Group {
    async fn exited(&self) {
        let mut rx = self.exited.clone();
        let _ = rx.wait_for(|exited| *exited).await;
    }

    fn kill(&self, signal: i32) {
        procs::kill_all(self.pgid, signal);
        if signal == libc::SIGKILL {
            self.seen.kill();
            self.marks.kill();
        }
    }
}

/// Waits (blocking) until `pid` has exited, leaving it to be reaped.
fn wait_exit(pid: libc::pid_t) -> std::io::Result<()> {
    loop {
        // SAFETY: siginfo_t is plain old data; all-zero is valid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is valid for writing for the duration of the call.
        let rc =
            unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Waits for the leader `pid` (blocking), with its usage and its children's.
fn wait(pid: libc::pid_t) -> std::io::Result<Usage> {
    let mut status = 0;
    // SAFETY: rusage is plain old data; all-zero is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `ru` are valid for writing for the duration of the call.
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if rc >= 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let ms = |tv: libc::timeval| tv.tv_sec as u64 * 1000 + tv.tv_usec as u64 / 1000;
    let status = if libc::WIFEXITED(status) {
        RunStatus::Exited { code: libc::WEXITSTATUS(status) }
    } else {
        RunStatus::Signaled { signal: libc::WTERMSIG(status) }
    };
    Ok(Usage {
        status,
        user_ms: ms(ru.ru_utime),
        system_ms: ms(ru.ru_stime),
        max_rss_bytes: procs::maxrss_bytes(ru.ru_maxrss),
    })
}
