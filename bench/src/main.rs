//! palisade-bench: palisade against the anchors a user would pick instead,
//! measured in the same run on the same machine.
//!
//! - launch latency of `/bin/true` and `/bin/echo hello`: bare exec; `unshare`
//!   with the same namespaces; bwrap with an equivalent profile;
//!   palisade-helper driven directly with a plan; `palisade run` through a
//!   running broker; and a client of the broker's socket, as an agent calls
//!   it (the request and its result, without the CLI's process).
//!   Candidates are interleaved in every round, so drift hits them all
//!   alike; medians and p99 pool all rounds.
//! - throughput: sandboxed `/bin/true` launches per second, 1, 2 and 8 clients.
//! - output: bytes written by a sandboxed command and received by a client
//!   over the socket, against a plain pipe.
//! - broker memory: RSS idle and with 50 runs in flight.
//! - enforcement precision: bytes delivered past the output quota, and how
//!   late past the deadline the run's last process died.
//!
//! Flags:
//! - `--quick`: every measurement small (the CI runs it once);
//! - egress: a download from a loopback origin through strict egress (the
//!   broker's proxy, and its transparent path), against the same download
//!   without a sandbox.
//! - plugins: a call to a trivial plugin through the socket, and its part
//!   inside the plugin-host, against a Tier C launch of `/bin/true`.
//! - builds: `cargo build` of a crate with dependencies, a venv with `pip
//!   install`, `npm install`, 20,000 files: bare, bwrap, and palisade
//!   (embedded and daemon), with where palisade's time goes.
//! - `--only latency,throughput,output,memory,precision,egress,plugins,copyback,builds,fairness`: some sections only;
//! - `--breakdown`: where the helper's time goes, by removing one mechanism
//!   at a time from its plan;
//! - `--loop LAUNCHER N [--clients K]`: N launches of `/bin/true` (by K
//!   concurrent clients) and nothing else, with how busy the CPUs were, for a
//!   profiler to watch (`perf record -a -g -- palisade-bench --loop palisade-helper 500`).
//!
//! Build as an installation would (`scripts/build-release.sh`, which
//! `bench/run.sh` does): a dynamically linked helper and CLI start slower.

#[cfg(target_os = "linux")]
mod builds;
#[cfg(target_os = "linux")]
mod copyback;
#[cfg(target_os = "linux")]
mod egress;
#[cfg(target_os = "linux")]
mod fairness;
#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
mod plugins;

#[cfg(target_os = "linux")]
use linux::{Daemon, bin, percentile};

#[cfg(target_os = "linux")]
fn main() {
    linux::main();
}

/// The launchers it times (bwrap, unshare, palisade's jail) are Linux's.
#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("palisade-bench: the launchers it compares exist on Linux only");
    std::process::exit(2);
}
