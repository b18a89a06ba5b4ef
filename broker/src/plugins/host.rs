//! The plugin-host process: palisade-plugin-host started through
//! palisade-helper in its own Tier C jail, its stdin and stdout the
//! channel (`palisade_protocol::plugin`). Long-lived, started at the first
//! call, restarted after it dies; one call at a time.

use crate::engine::cgroup::RunCgroup;
use crate::engine::helper::{HelperCommand, Io, pidfd_kill};
use crate::engine::spawn_thread::Spawner;
use palisade_protocol::plugin::{
    FromHost, PLUGIN_FRAME_MAX, PluginHostCgroup, PluginHostJail, ToHost, decode_body, encode_frame,
};
use palisade_protocol::{HelperRecord, JailPlan};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

/// How long a plugin-host may take to say `Ready` (its engine built, its
/// pooling allocator reserved).
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot start the plugin-host: {0}")]
    Start(String),
    #[error("the plugin-host died ({0})")]
    Died(String),
    #[error("the plugin-host broke the channel: {0}")]
    Protocol(String),
}

/// A running plugin-host.
pub struct Running {
    pub pid: u32,
    pidfd: OwnedFd,
    stdin: pipe::Sender,
    stdout: pipe::Receiver,
    /// The engine's configuration digest, from `Ready`.
    pub engine: String,
    pub jail: PluginHostJail,
    /// Its own cgroup, removed when it ends.
    cgroup: Option<RunCgroup>,
}

impl Running {
    pub async fn send(&mut self, message: &ToHost) -> Result<(), HostError> {
        let frame = encode_frame(message).map_err(HostError::Protocol)?;
        self.stdin.write_all(&frame).await.map_err(|e| HostError::Died(format!("writing to it: {e}")))
    }

    pub async fn receive(&mut self) -> Result<FromHost, HostError> {
        let mut len = [0u8; 4];
        self.stdout
            .read_exact(&mut len)
            .await
            .map_err(|e| HostError::Died(format!("reading from it: {e}")))?;
        let len = u32::from_be_bytes(len) as usize;
        if len > PLUGIN_FRAME_MAX {
            return Err(HostError::Protocol(format!("a frame of {len} bytes exceeds {PLUGIN_FRAME_MAX}")));
        }
        let mut body = vec![0u8; len];
        self.stdout
            .read_exact(&mut body)
            .await
            .map_err(|e| HostError::Died(format!("reading from it: {e}")))?;
        decode_body(&body).map_err(HostError::Protocol)
    }

    /// Whether the helper is still running (its pidfd is not yet readable).
    pub fn alive(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut poll = libc::pollfd { fd: self.pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: poll on one valid pollfd that outlives the call, without waiting.
        let rc = unsafe { libc::poll(&mut poll, 1, 0) };
        rc == 0
    }

    /// Ends the plugin-host (SIGKILL to the helper: pid 1 of its namespace
    /// goes, and everything in it), reaps it and removes its cgroup off the
    /// runtime's threads.
    pub fn kill(mut self) {
        let _ = pidfd_kill(&self.pidfd, libc::SIGKILL);
        let pid = self.pid;
        let cgroup = self.cgroup.take();
        tokio::task::spawn_blocking(move || {
            // SAFETY: waitpid on our own child; no memory is passed.
            unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0) };
            if let Some(c) = cgroup {
                c.remove();
            }
        });
    }
}

/// Starts a plugin-host in the jail of `plan` (in `cgroup`, when there is
/// one) and waits for its `Ready`.
pub async fn start(
    spawner: &Spawner,
    helper: PathBuf,
    plan: &JailPlan,
    descriptors: Vec<OwnedFd>,
    cgroup: Option<(RunCgroup, PluginHostCgroup)>,
) -> Result<Running, HostError> {
    let (cgroup, reported) = cgroup.unzip();
    let encoded = palisade_protocol::plan::encode_plan(plan).map_err(|e| HostError::Start(e.to_string()))?;
    let cgroup_dir = cgroup.as_ref().map(RunCgroup::open_dir).transpose();
    let cgroup_dir = cgroup_dir.map_err(|e| HostError::Start(format!("its cgroup: {e}")))?.flatten();
    // A system broker's clones of the plugin's mounts, or its host paths: before the helper starts.
    let sent = crate::engine::capture::sent(plan, &descriptors);
    let sent = sent.map_err(|e| HostError::Start(format!("its mounts: {e}")))?;
    let mut child = spawner
        .spawn(HelperCommand {
            warm: None,
            helper: helper.clone(),
            cgroup_dir,
            stdin: Io::Piped,
            stdout: Io::Piped,
            stderr: Io::Piped,
            outer_limits: vec![],
        })
        .await
        .map_err(|e| HostError::Start(format!("{}: {e}", helper.display())))?;
    let channel = child.plan_channel.take().ok_or_else(|| HostError::Start("no plan channel".into()))?;
    let fds = sent.fds();
    let pidfd = child.pidfd.try_clone().map_err(|e| HostError::Start(e.to_string()))?;
    let pid = child.pid;
    let status = child.status.try_clone().map_err(|e| HostError::Start(e.to_string()))?;
    let wrap = |e: std::io::Error| HostError::Start(e.to_string());
    let stdin = child.stdin.take().ok_or_else(|| HostError::Start("no stdin pipe".into()))?;
    let stdout = child.stdout.take().ok_or_else(|| HostError::Start("no stdout pipe".into()))?;
    if let Some(stderr) = child.stderr.take() {
        log_stderr(pipe::Receiver::from_owned_fd(OwnedFd::from(stderr)).map_err(wrap)?, pid);
    }
    let mut running = Running {
        pid,
        pidfd,
        stdin: pipe::Sender::from_owned_fd(OwnedFd::from(stdin)).map_err(wrap)?,
        stdout: pipe::Receiver::from_owned_fd(OwnedFd::from(stdout)).map_err(wrap)?,
        engine: String::new(),
        jail: jail_of(plan, pid, reported),
        cgroup,
    };
    // cgroup v1: placed by the broker before the helper has its plan.
    let placed = running.cgroup.as_ref().map_or(Ok(()), |c| c.place(pid)).map_err(|e| e.to_string());
    if let Err(e) = placed
        .and_then(|()| crate::engine::helper::send_plan(channel, &encoded, &fds).map_err(|e| e.to_string()))
        // palisade's own program, released at once: each call it serves is recorded before it runs.
        .and_then(|()| crate::engine::helper::release(&status).map_err(|e| e.to_string()))
    {
        running.kill();
        return Err(HostError::Start(format!("handing over the plan: {e}")));
    }
    match tokio::time::timeout(READY_TIMEOUT, running.receive()).await {
        Ok(Ok(FromHost::Ready { engine })) if palisade_protocol::plugin::engine_name_ok(&engine) => {
            running.engine = engine
        }
        Ok(Ok(FromHost::Ready { engine })) => {
            running.kill();
            return Err(HostError::Protocol(format!(
                "its engine string {:?} is not of the form wasmtime-<version>-<16 hex>",
                engine.chars().take(palisade_protocol::plugin::MAX_ENGINE_BYTES * 2).collect::<String>()
            )));
        }
        Ok(Ok(other)) => {
            running.kill();
            return Err(HostError::Protocol(format!("{other:?} before Ready")));
        }
        Ok(Err(e)) => {
            // The helper's report first: it writes it as the host ends.
            let why = tokio::time::timeout(READY_TIMEOUT, helper_failure(status)).await.unwrap_or_default();
            running.kill();
            return Err(HostError::Start(format!("{e}{why}")));
        }
        Err(_) => {
            running.kill();
            return Err(HostError::Start(format!("no Ready within {READY_TIMEOUT:?}")));
        }
    }
    running.jail.engine = running.engine.clone();
    running.jail.landlock = landlock_reached(&status, plan);
    Ok(running)
}

/// Most bytes of a plugin-host's stderr that go into the broker's log; the
/// rest is read and dropped (a host that writes without end fills no disk).
const STDERR_LOGGED_BYTES: usize = 64 << 10;

/// The plugin-host's stderr (its panics, the engine's warnings), line by
/// line into the broker's log, bounded.
fn log_stderr(stderr: pipe::Receiver, pid: u32) {
    use tokio::io::AsyncBufReadExt;
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let mut logged = 0;
        while let Ok(Some(line)) = lines.next_line().await {
            if logged < STDERR_LOGGED_BYTES {
                logged += line.len();
                tracing::warn!(pid, "plugin-host: {line}");
            }
        }
    });
}

/// What the jail was built as (the Landlock status is filled in once the
/// helper has reported it).
fn jail_of(plan: &JailPlan, pid: u32, cgroup: Option<PluginHostCgroup>) -> PluginHostJail {
    PluginHostJail {
        executor: plan.tier().into(),
        pid,
        namespaces: plan.namespaces.names().iter().map(|s| s.to_string()).collect(),
        seccomp_sha256: crate::journal::attest::seccomp_sha256(plan),
        landlock: None,
        execution_sha256: crate::journal::attest::sha256_hex(&palisade_protocol::wire::canonical_bytes(plan)),
        engine: String::new(),
        address_space_unlimited: plan.rlimits.address_space.soft == palisade_protocol::RLIM_INFINITY,
        cgroup,
    }
}

/// The helper's Landlock record: written before its exec, so waiting on
/// the status channel now (without blocking: the monitor holds it open).
fn landlock_reached(
    status: &std::fs::File,
    plan: &JailPlan,
) -> Option<palisade_protocol::wire::LandlockEnforcement> {
    nix::fcntl::fcntl(status, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).ok()?;
    let mut read = crate::engine::helper::StatusRead::default();
    let _ = read.receive(status);
    read.records.into_iter().find_map(|r| match r {
        HelperRecord::Landlock(l) => Some(crate::journal::attest::landlock_enforcement(l, plan)),
        _ => None,
    })
}

/// The helper's own words when the plugin-host never started.
async fn helper_failure(status: std::fs::File) -> String {
    let read = tokio::task::spawn_blocking(move || crate::engine::helper::read_status(&status)).await;
    match read {
        Ok(Ok((records, _))) => records
            .into_iter()
            .find_map(|r| match r {
                HelperRecord::Failed(f) => {
                    Some(format!(": the helper failed at {}: {}", f.stage.name(), f.message))
                }
                HelperRecord::Exit(e) => Some(format!(": it ended ({e:?})")),
                _ => None,
            })
            .unwrap_or_default(),
        Ok(Err(e)) => format!(" (its status channel: {e})"),
        Err(e) => format!(" ({e})"),
    }
}
