//! Tier A's speed: a call to a trivial plugin (echo: a fresh instance, fuel
//! on) through the broker's socket, as an agent makes it (a connection, the
//! request, the result), against a Tier C launch of `/bin/true` by the same
//! kind of client in the same run; and the part of the call spent inside
//! the plugin-host (instantiating and running it), as the host reports it.

use crate::{Daemon, bin, percentile};
use palisade_broker::cli::client::Client;
use palisade_protocol::wire::{ClientMessage, RunRequest, RunStatus, ServerMessage};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// The trivial plugin: the tests' echo.
const ECHO: &str = include_str!("../../tests/plugins/echo.wat");

/// Installs echo into a skills directory of `dir` and starts a broker that
/// serves it; returns the broker.
fn plugin_broker(dir: &Path) -> Daemon {
    let skills = dir.join("skills");
    let src = dir.join("plugin-src");
    std::fs::create_dir_all(&src).expect("plugin source directory");
    std::fs::write(src.join("echo.wat"), ECHO).expect("write echo.wat");
    let sha = palisade_broker::plugins::index::sha256_hex(ECHO.as_bytes());
    let manifest = src.join("echo.toml");
    std::fs::write(
        &manifest,
        format!("name = \"echo\"\nversion = \"1.0.0\"\nmodule = \"echo.wat\"\nsha256 = \"{sha}\"\n"),
    )
    .expect("write the manifest");
    let tables = format!(
        "[plugins]\nenabled = true\nskills_dir = {:?}\nsecrets_dir = {:?}\n",
        skills.to_string_lossy(),
        dir.join("secrets").to_string_lossy()
    );
    let policy = dir.join("bench-plugins-policy.toml");
    std::fs::write(&policy, &tables).expect("write the policy");
    let st = Command::new(bin("palisade"))
        .args(["plugin", "install", manifest.to_str().unwrap(), "--policy", policy.to_str().unwrap()])
        .status()
        .expect("palisade plugin install");
    assert!(st.success(), "palisade plugin install failed: {st}");
    Daemon::start_with(dir, "bench-plugins", true, true, "", &tables)
}

/// One call of echo through a new connection: (whole µs, in-host µs).
fn plugin_call(socket: &Path) -> (f64, f64) {
    let t = Instant::now();
    let mut c = Client::connect(socket).expect("connect to palisaded");
    let msg = ClientMessage::RunPlugin {
        skill: "echo".into(),
        input: "{}".into(),
        inline_module: None,
        timeout_ms: None,
    };
    match c.request(&msg) {
        Ok(ServerMessage::PluginResult { instantiate_us, call_us, .. }) => {
            (t.elapsed().as_secs_f64() * 1e6, (instantiate_us + call_us) as f64)
        }
        other => panic!("echo: {other:?}"),
    }
}

/// One Tier C launch of `/bin/true` through a new connection, µs.
fn launch(socket: &Path, ws: &Path) -> f64 {
    let t = Instant::now();
    let mut c = Client::connect(socket).expect("connect to palisaded");
    let req = RunRequest {
        argv: vec!["/bin/true".into()],
        cwd: Some(ws.to_string_lossy().into_owned()),
        ..Default::default()
    };
    let r = c.run(req, |_| {}).expect("run");
    assert_eq!(r.status, RunStatus::Exited { code: 0 });
    t.elapsed().as_secs_f64() * 1e6
}

pub fn calls(dir: &Path, ws: &Path, launcher: &Daemon, runs: usize) -> String {
    let d = plugin_broker(dir);
    // The first call starts the plugin-host and compiles the module.
    plugin_call(&d.socket);
    launch(&launcher.socket, ws);
    let (mut whole, mut inside, mut launches) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let (w, i) = plugin_call(&d.socket);
        whole.push(w);
        inside.push(i);
        launches.push(launch(&launcher.socket, ws));
    }
    for v in [&mut whole, &mut inside, &mut launches] {
        v.sort_by(f64::total_cmp);
    }
    let p50 = |v: &[f64]| percentile(v, 0.5);
    format!(
        "### Plugins (echo, a fresh instance per call, fuel on; {runs} calls, interleaved with as many launches)\n\n\
         | measure | p50 µs | p99 µs | × `/bin/true` launch |\n|---|---:|---:|---:|\n\
         | inside the plugin-host (instantiate + call) | {:.1} | {:.1} | {:.3} |\n\
         | the whole call through the socket (a new connection each) | {:.0} | {:.0} | {:.3} |\n\
         | `/bin/true` in Tier C through the socket (the same client) | {:.0} | {:.0} | 1.000 |\n",
        p50(&inside),
        percentile(&inside, 0.99),
        p50(&inside) / p50(&launches),
        p50(&whole),
        percentile(&whole, 0.99),
        p50(&whole) / p50(&launches),
        p50(&launches),
        percentile(&launches, 0.99),
    )
}
