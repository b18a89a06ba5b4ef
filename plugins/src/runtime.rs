//! The plugin runtime: one engine (Cranelift, fuel, epoch interruption, a
//! pooling allocator sized from [`RuntimeConfig`], no WASI), compiling
//! modules to artifacts, and calls, each in a fresh instance of a cached
//! `InstancePre`, under the call's limits.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use palisade_protocol::plugin::{CallDone, CallOutcome, PluginCall};
use wasmtime::{
    Config, Engine, ExternType, InstanceAllocationStrategy, InstancePre, Linker, Module, OptLevel,
    PoolingAllocationConfig, Store, Strategy, Trap,
};

use crate::abi::{self, ALLOC_EXPORT, MEMORY_EXPORT};
use crate::host_fns::{self, AbiError, CallState, HostCalls};
use crate::limits::{CallLimiter, Quota};
use crate::ticker::{EPOCH_TICK, EpochTicker};

/// The wasmtime this crate is pinned to (Cargo.toml): part of the engine digest.
pub const WASMTIME_VERSION: &str = "48.0.8";
/// Bumped when this crate changes the engine's configuration in a way the
/// compatibility hash would not see: part of the engine digest.
const ENGINE_CONFIG_VERSION: u32 = 1;
/// Instantiated modules kept in memory; past this the cache starts over
/// (the broker's artifacts stay on disk, so a miss only costs a deserialize).
const MODULE_CACHE_MAX: usize = 64;
/// A longer deadline is taken as this one (a day): `Instant` arithmetic
/// must not overflow on a broker's `u64::MAX`.
const DEADLINE_MAX_MS: u64 = 24 * 3600 * 1000;
/// Instances alive at once in the pool: one call at a time needs one, a
/// second covers a slot still being returned.
pub const DEFAULT_POOL_INSTANCES: u32 = 2;
/// Linear memory of one instance at most (the pool's slot size); a call's
/// `max_memory_bytes` above it is capped to it.
pub const DEFAULT_MAX_MEMORY_BYTES: u64 = 64 << 20;
/// Table elements of one table at most (the pool's slot size).
pub const DEFAULT_MAX_TABLE_ELEMENTS: u32 = 10_000;

/// The pool's sizes, fixed for the host's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeConfig {
    pub pool_instances: u32,
    pub max_memory_bytes: u64,
    pub max_table_elements: u32,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            pool_instances: DEFAULT_POOL_INSTANCES,
            max_memory_bytes: DEFAULT_MAX_MEMORY_BYTES,
            max_table_elements: DEFAULT_MAX_TABLE_ELEMENTS,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("configuring the engine: {0}")]
    Engine(String),
    #[error("compiling the module: {0}")]
    Compile(String),
    #[error("the module does not follow the plugin ABI: {0}")]
    Abi(String),
    #[error("loading the artifact {path}: {message}")]
    Artifact { path: String, message: String },
}

pub struct Runtime {
    engine: Engine,
    linker: Linker<CallState>,
    config: RuntimeConfig,
    digest: String,
    /// By (artifact path, module sha256).
    modules: HashMap<(String, String), InstancePre<CallState>>,
    ticker: EpochTicker,
}

impl Runtime {
    pub fn new(config: RuntimeConfig) -> Result<Self, PluginError> {
        let engine =
            Engine::new(&engine_config(&config)).map_err(|e| PluginError::Engine(format!("{e:#}")))?;
        let linker = host_fns::linker(&engine).map_err(|e| PluginError::Engine(format!("{e:#}")))?;
        let digest = digest(&engine);
        let ticker = EpochTicker::start(engine.clone())
            .map_err(|e| PluginError::Engine(format!("epoch ticker: {e}")))?;
        Ok(Runtime { engine, linker, config, digest, modules: HashMap::new(), ticker })
    }

    /// The module cache's key part for this engine: wasmtime's version and
    /// its precompiled-compatibility hash, stable across processes.
    pub fn engine_digest(&self) -> &str {
        &self.digest
    }

    /// Compiles a module (binary or WAT text), checks its imports and the
    /// ABI's exports, and returns the artifact to cache.
    pub fn compile(&self, bytes: &[u8]) -> Result<Vec<u8>, PluginError> {
        let module = Module::new(&self.engine, bytes).map_err(|e| PluginError::Compile(format!("{e:#}")))?;
        self.linker.instantiate_pre(&module).map_err(|e| PluginError::Abi(format!("{e:#}")))?;
        match module.get_export(MEMORY_EXPORT) {
            Some(ExternType::Memory(_)) => {}
            _ => return Err(PluginError::Abi(AbiError::NoMemory.to_string())),
        }
        match module.get_export(ALLOC_EXPORT) {
            Some(ExternType::Func(_)) => {}
            _ => return Err(PluginError::Abi(AbiError::NoAlloc("missing".into()).to_string())),
        }
        module.serialize().map_err(|e| PluginError::Compile(format!("{e:#}")))
    }

    /// One call in a fresh instance. `Err` only when the artifact cannot be
    /// loaded; everything the plugin does ends in the `CallDone`'s outcome.
    pub fn call(&mut self, call: &PluginCall, host: &mut dyn HostCalls) -> Result<CallDone, PluginError> {
        let deadline = Instant::now() + Duration::from_millis(call.limits.deadline_ms.min(DEADLINE_MAX_MS));
        let pre = self.instance_pre(call)?;
        let limiter = CallLimiter::new(&call.limits, self.config.max_memory_bytes);
        // SAFETY: `store` is dropped at the end of this function, inside `host`'s borrow.
        let state =
            unsafe { CallState::new(limiter, host, call.granted.clone(), deadline, call.limits.deadline_ms) };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        let fuel_set = store.set_fuel(call.limits.fuel_budget);
        store.set_epoch_deadline(
            call.limits.deadline_ms.min(DEADLINE_MAX_MS).div_ceil(EPOCH_TICK.as_millis() as u64).max(1),
        );
        let _ticking = self.ticker.ticking();

        let mut done = CallDone {
            id: call.id,
            outcome: CallOutcome::Output(Vec::new()),
            fuel_used: 0,
            memory_peak_bytes: 0,
            instantiate_us: 0,
            call_us: 0,
        };
        let result = match fuel_set {
            Err(e) => Err(e),
            Ok(()) if call.limits.max_instances == 0 => Err(wasmtime::Error::new(Quota::Instances(0))),
            Ok(()) => run(&mut store, &pre, call, &mut done),
        };
        done.outcome = match result {
            Ok(output) => CallOutcome::Output(output),
            Err(e) => outcome_of(&e, call),
        };
        done.fuel_used = call.limits.fuel_budget.saturating_sub(store.get_fuel().unwrap_or(0));
        done.memory_peak_bytes = store.data().limiter.memory_peak as u64;
        for f in &store.data().denied {
            eprintln!("palisade-plugin-host: call {}: {} denied (not granted)", call.id, f.name());
        }
        Ok(done)
    }

    fn instance_pre(&mut self, call: &PluginCall) -> Result<InstancePre<CallState>, PluginError> {
        let key = (call.artifact.clone(), call.module_sha256.clone());
        if let Some(pre) = self.modules.get(&key) {
            return Ok(pre.clone());
        }
        let failed = |e: wasmtime::Error| PluginError::Artifact {
            path: call.artifact.clone(),
            message: format!("{e:#}"),
        };
        // The artifact is a file of the broker's module cache, written by the
        // broker from this engine's own `Compiled` answer under a name of its
        // own, its MAC (a key this process never sees) checked before the
        // broker names it here, and mounted read-only into this process's
        // jail; a file of another engine is refused by wasmtime's header check.
        // SAFETY: relies on that file being this engine's own output, which nothing this process runs can change.
        let module = unsafe { Module::deserialize_file(&self.engine, &call.artifact) }.map_err(failed)?;
        let pre = self.linker.instantiate_pre(&module).map_err(failed)?;
        if self.modules.len() >= MODULE_CACHE_MAX {
            self.modules.clear();
        }
        self.modules.insert(key, pre.clone());
        Ok(pre)
    }
}

/// Instantiates, writes the input, calls the entry, reads the output; times both halves.
fn run(
    store: &mut Store<CallState>,
    pre: &InstancePre<CallState>,
    call: &PluginCall,
    done: &mut CallDone,
) -> wasmtime::Result<Vec<u8>> {
    let started = Instant::now();
    let instance = pre.instantiate(&mut *store);
    done.instantiate_us = started.elapsed().as_micros() as u64;
    let instance = instance?;
    let started = Instant::now();
    let result = (|| {
        let memory = instance.get_memory(&mut *store, MEMORY_EXPORT).ok_or(AbiError::NoMemory)?;
        let alloc = instance
            .get_typed_func::<i32, i32>(&mut *store, ALLOC_EXPORT)
            .map_err(|e| AbiError::NoAlloc(e.to_string()))?;
        let entry = instance
            .get_typed_func::<(i32, i32), i64>(&mut *store, &call.entry)
            .map_err(|e| AbiError::Entry(call.entry.clone(), e.to_string()))?;
        let ptr = host_fns::write_guest(&mut *store, memory, &alloc, "the input", &call.input)?;
        let result = entry.call(&mut *store, (ptr as i32, call.input.len() as i32))?;
        let (out_ptr, out_len) = abi::unpack(result);
        host_fns::read_guest(&*store, memory, "the output", out_ptr, out_len)
    })();
    done.call_us = started.elapsed().as_micros() as u64;
    result
}

/// A failed call's outcome: limits are `QuotaExceeded`, the rest `Trap`.
fn outcome_of(e: &wasmtime::Error, call: &PluginCall) -> CallOutcome {
    if let Some(q) = e.downcast_ref::<Quota>() {
        return CallOutcome::QuotaExceeded(q.to_string());
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => CallOutcome::QuotaExceeded(Quota::Fuel(call.limits.fuel_budget).to_string()),
        Some(Trap::Interrupt) => {
            CallOutcome::QuotaExceeded(Quota::Deadline(call.limits.deadline_ms).to_string())
        }
        Some(t) => CallOutcome::Trap(t.to_string()),
        None => CallOutcome::Trap(e.root_cause().to_string()),
    }
}

/// Bytes at the start of each pool slot's memory and table that are reset by
/// zeroing rather than returned to the kernel between calls: a small
/// plugin's next call then takes no page faults (a page fault costs
/// microseconds under a hypervisor).
const KEEP_RESIDENT_BYTES: usize = 128 << 10;

fn engine_config(config: &RuntimeConfig) -> Config {
    let mut pool = PoolingAllocationConfig::new();
    pool.total_core_instances(config.pool_instances)
        .total_memories(config.pool_instances)
        .total_tables(config.pool_instances)
        .total_component_instances(0)
        .max_memories_per_module(1)
        .max_tables_per_module(1)
        .max_memory_size(usize::try_from(config.max_memory_bytes).unwrap_or(usize::MAX))
        .table_elements(config.max_table_elements as usize)
        .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
        .table_keep_resident(KEEP_RESIDENT_BYTES);
    let mut c = Config::new();
    c.strategy(Strategy::Cranelift)
        .cranelift_opt_level(OptLevel::Speed)
        .consume_fuel(true)
        .epoch_interruption(true)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    c
}

/// FNV-1a, 64 bits: a hash whose value does not change with the Rust
/// release (std's `DefaultHasher` may), as a cache key must not.
struct Fnv1a(u64);

impl Hasher for Fnv1a {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

fn digest(engine: &Engine) -> String {
    let mut h = Fnv1a(0xcbf2_9ce4_8422_2325);
    WASMTIME_VERSION.hash(&mut h);
    ENGINE_CONFIG_VERSION.hash(&mut h);
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("wasmtime-{WASMTIME_VERSION}-{:016x}", h.finish())
}
