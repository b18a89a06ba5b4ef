//! Where a decided run is run on Linux: the helper started (cold or from the
//! warm pool) with its plan, its cgroup, its `/etc` view, and its output
//! streamed back to whoever asked.

#[cfg(target_os = "linux")]
pub mod capture;
#[cfg(target_os = "linux")]
pub(crate) mod cgroup;
#[cfg(target_os = "linux")]
pub mod etc_view;
#[cfg(unix)]
pub mod executor;
#[cfg(target_os = "linux")]
pub(crate) mod exiting;
#[cfg(target_os = "linux")]
pub mod helper;
#[cfg(target_os = "linux")]
pub mod linux;
#[cfg(target_os = "linux")]
pub(crate) mod pool;
#[cfg(target_os = "linux")]
pub(crate) mod publish;
#[cfg(target_os = "linux")]
pub mod requesters;
#[cfg(target_os = "linux")]
pub(crate) mod run;
#[cfg(target_os = "linux")]
pub(crate) mod session;
#[cfg(target_os = "linux")]
pub(crate) mod spawn_thread;
#[cfg(unix)]
pub(crate) mod stream;
