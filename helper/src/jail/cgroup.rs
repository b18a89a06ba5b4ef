//! Joining the run's cgroup. The broker creates it, sets its limits and kills
//! it; the helper only moves itself in.

use super::error::{Context, Result};
use super::fds;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use palisade_protocol::Stage;

pub fn join(path: &str) -> Result<()> {
    let dir = fds::take_cgroup_dir();
    let procs = openat(&dir, "cgroup.procs", OFlag::O_WRONLY | OFlag::O_CLOEXEC, Mode::empty())
        .at(Stage::Cgroup, || format!("open {path}/cgroup.procs"))?;
    nix::unistd::write(&procs, b"0").at(Stage::Cgroup, || format!("join {path}"))?;
    nix::unistd::close(dir).at(Stage::Cgroup, || "close fd 5".into())
}
