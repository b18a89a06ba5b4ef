//! Measures a call inside the plugin-host alone (no frames, no broker): the
//! trivial echo plugin, a fresh instance per call, fuel on. Prints medians;
//! asserts nothing. `cargo run --release -p palisade-plugins --example call_bench`.

use std::time::{Duration, Instant};

use palisade_plugins::{HostCallError, HostCalls, Runtime, RuntimeConfig};
use palisade_protocol::plugin::{CallOutcome, HostFn, PluginCall, PluginLimits};

/// Calls measured, after as many to warm up.
const CALLS: usize = 1000;

struct NoHost;

impl HostCalls for NoHost {
    fn call(&mut self, _: HostFn, _: &[u8], _: Instant) -> Result<Vec<u8>, HostCallError> {
        Err(HostCallError::Broken("echo calls no host function".into()))
    }
}

fn median<T: Ord + Copy>(mut v: Vec<T>) -> T {
    v.sort_unstable();
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut runtime = Runtime::new(RuntimeConfig::default())?;
    let wat = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/plugins/echo.wat"))?;
    let artifact = std::env::temp_dir().join(format!("palisade-call-bench-{}.cwasm", std::process::id()));
    std::fs::write(&artifact, runtime.compile(&wat)?)?;
    let call = PluginCall {
        id: 1,
        artifact: artifact.to_string_lossy().into_owned(),
        module_sha256: "00".repeat(32),
        entry: "palisade_plugin_main".into(),
        input: br#"{"hello":"world"}"#.to_vec(),
        limits: PluginLimits {
            fuel_budget: 1_000_000,
            max_memory_bytes: 16 << 20,
            max_table_elements: 1000,
            max_instances: 1,
            deadline_ms: 1000,
        },
        granted: vec![],
    };
    let (mut inst, mut run, mut whole) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..2 * CALLS {
        let started = Instant::now();
        let done = runtime.call(&call, &mut NoHost)?;
        let took = started.elapsed();
        assert!(matches!(done.outcome, CallOutcome::Output(_)), "{done:?}");
        if i >= CALLS {
            inst.push(done.instantiate_us);
            run.push(done.call_us);
            whole.push(took);
        }
    }
    std::fs::remove_file(&artifact)?;
    let whole: Duration = median(whole);
    println!(
        "echo, in-host, median of {CALLS}: instantiate_us {} call_us {} whole Runtime::call {:.1} us",
        median(inst),
        median(run),
        whole.as_secs_f64() * 1e6
    );
    Ok(())
}
