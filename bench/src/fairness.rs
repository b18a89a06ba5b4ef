//! Fairness between requesters of a system broker: how long a run of one
//! user takes to be answered while another user floods the broker, against
//! the same run with nobody else there (the anchor, in the same run).
//!
//! The broker runs as root with two run slots. The flood: eight clients of
//! root, each running `sleep 0.2` again and again, always more than the
//! slots. The measured requester is `nobody` (65534): a thread of the
//! benchmark that takes that user's credentials for itself alone (raw
//! `setresuid`, which changes the calling thread's only), so that the
//! socket's peer credentials are nobody's. Each of its runs is `/bin/true`,
//! timed from the request to the result, after three unmeasured ones.

use crate::linux::{Daemon, percentile};
use palisade_broker::cli::client::Client;
use palisade_protocol::wire::{RunRequest, RunStatus};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const NOBODY: u32 = 65534;
const FLOODERS: usize = 8;

/// The section: the measured requester's latency alone, then under the
/// flood with the default shares (one of the two slots each), then with a
/// share of both slots (only the fair queue between them).
pub fn fairness(dir: &Path, runs: usize) -> String {
    let mut out = String::from("### Fairness: a second requester's run while the first floods\n\n");
    if !nix::unistd::geteuid().is_root() {
        out.push_str("Not measured: two requesters of a system broker need root to be made.\n");
        return out;
    }
    let ws = dir.join("fair-ws");
    std::fs::create_dir_all(&ws).unwrap();
    nix::unistd::chown(&ws, Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
    std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o755)).unwrap();
    let flood_ws = dir.join("fair-flood");
    std::fs::create_dir_all(&flood_ws).unwrap();
    out.push_str(&format!(
        "`max_concurrent = 2`; the flood: {FLOODERS} clients of root running `sleep 0.2` back to back; \
         the measured requester: uid {NOBODY}, {runs} runs of `/bin/true`, one after another, each timed \
         from its request to its result.\n\n| case | median ms | p95 ms | max ms | median / alone |\n|---|---:|---:|---:|---:|\n"
    ));
    let mut alone = f64::NAN;
    for (case, share, flood) in [
        ("alone (the anchor)", "", false),
        ("flooded, default shares (1 slot each)", "", true),
        ("flooded, a share of both slots (the fair queue only)", "max_concurrent_per_uid = 2\n", true),
    ] {
        let name = format!(
            "fair-{}",
            if !flood {
                "alone"
            } else if share.is_empty() {
                "shared"
            } else {
                "queue"
            }
        );
        let tables = format!(
            "[broker]\nmax_concurrent = 2\nmax_queued = 64\nsocket_mode = 0o666\nallowed_uids = [0, {NOBODY}]\n{share}"
        );
        let d = Daemon::start_config(dir, &name, &tables);
        let times = measure(&d, &ws, &flood_ws, runs, flood);
        let (median, p95, max) = (percentile(&times, 0.5), percentile(&times, 0.95), percentile(&times, 1.0));
        if !flood {
            alone = median;
        }
        out.push_str(&format!("| {case} | {median:.1} | {p95:.1} | {max:.1} | {:.2}× |\n", median / alone));
    }
    out
}

/// The measured requester's latencies (ms, sorted), with the flood running
/// meanwhile or not.
fn measure(d: &Daemon, ws: &Path, flood_ws: &Path, runs: usize, flood: bool) -> Vec<f64> {
    let stop = AtomicBool::new(false);
    let mut times = std::thread::scope(|s| {
        if flood {
            for _ in 0..FLOODERS {
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(mut c) = Client::connect(&d.socket) else { continue };
                        let _ = c.run(request(flood_ws, &["sleep", "0.2"]), |_| {});
                    }
                });
            }
            // The flood holds the slots and a queue before the first measured run.
            std::thread::sleep(Duration::from_millis(500));
        }
        let measured = s.spawn(|| {
            become_nobody();
            // Unmeasured: the first runs of a requester start its pool.
            for _ in 0..3 {
                let mut c = Client::connect(&d.socket).expect("connect as nobody");
                c.run(request(ws, &["/bin/true"]), |_| {}).expect("a run of nobody");
            }
            (0..runs)
                .map(|_| {
                    let start = Instant::now();
                    let mut c = Client::connect(&d.socket).expect("connect as nobody");
                    let r = c.run(request(ws, &["/bin/true"]), |_| {}).expect("a run of nobody");
                    assert_eq!(r.status, RunStatus::Exited { code: 0 }, "nobody's run failed");
                    start.elapsed().as_secs_f64() * 1000.0
                })
                .collect::<Vec<f64>>()
        });
        let times = measured.join().expect("the measured requester");
        stop.store(true, Ordering::Relaxed);
        times
    });
    times.sort_by(f64::total_cmp);
    times
}

fn request(cwd: &Path, argv: &[&str]) -> RunRequest {
    RunRequest {
        argv: argv.iter().map(|a| a.to_string()).collect(),
        cwd: Some(cwd.to_string_lossy().into_owned()),
        ..Default::default()
    }
}

/// This thread, and only it, becomes `nobody`: no groups, gid and uid
/// 65534 (the raw system calls change the calling thread's credentials;
/// the C library's wrappers would change every thread's).
fn become_nobody() {
    // SAFETY: plain system calls on the calling thread's credentials, with
    // integer arguments and a null list of groups of length 0.
    let rc = unsafe {
        let groups = libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>());
        let gid = libc::syscall(libc::SYS_setresgid, NOBODY, NOBODY, NOBODY);
        let uid = libc::syscall(libc::SYS_setresuid, NOBODY, NOBODY, NOBODY);
        groups | gid | uid
    };
    assert_eq!(rc, 0, "cannot become nobody: {}", std::io::Error::last_os_error());
}
