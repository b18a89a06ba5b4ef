//! The channel between the broker and its plugin-host (Tier A): frames of a
//! u32 big-endian length and a bincode 2 body, broker to host on the host's
//! stdin, host to broker on its stdout. The host runs one call at a time;
//! while a call runs, the host may ask the broker to carry out a host
//! function for it (`HostCall`) and waits for the answer (`HostReply`).

use serde::{Deserialize, Serialize};

/// Largest frame either side accepts (a module to compile, an input, an
/// output, a host function's answer).
pub const PLUGIN_FRAME_MAX: usize = 16 << 20;

/// Longest engine string a plugin-host may say in `Ready`.
pub const MAX_ENGINE_BYTES: usize = 64;
/// What an engine string starts with.
const ENGINE_PREFIX: &str = "wasmtime-";
/// Hex digits of the engine's configuration hash, at the end of its string.
const ENGINE_HASH_HEX: usize = 16;

/// Whether `engine` is an engine string as the plugin-host says it in
/// `Ready`: `wasmtime-<version>-<16 lowercase hex>`, the version of ASCII
/// digits and dots, at most [`MAX_ENGINE_BYTES`] in all. Nothing else is
/// taken: the broker names cache files from it (a digest of it, never the
/// string itself), and a host that says anything else is not used.
pub fn engine_name_ok(engine: &str) -> bool {
    let Some(rest) = engine.strip_prefix(ENGINE_PREFIX) else { return false };
    let Some((version, hash)) = rest.rsplit_once('-') else { return false };
    engine.len() <= MAX_ENGINE_BYTES
        && !version.is_empty()
        && version.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && hash.len() == ENGINE_HASH_HEX
        && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The broker's messages to the plugin-host.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum ToHost {
    /// Compile a module (its bytes: binary WebAssembly or WAT text) for this
    /// host's engine; answered `Compiled` or `Failed`.
    Compile { id: u64, module: Vec<u8> },
    /// One call in a fresh instance of the precompiled module at `artifact`
    /// (a path the host can read: the broker's module cache, bound
    /// read-only), answered `Done` (after any number of `HostCall`s).
    Call(PluginCall),
    /// The answer to the host's `HostCall` of the same id.
    HostReply { id: u64, result: Result<Vec<u8>, HostFnError> },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct PluginCall {
    pub id: u64,
    /// A file of the module cache, written by the broker from `Compiled`.
    pub artifact: String,
    /// The module's sha256 (hex), for the host's own checks and logs.
    pub module_sha256: String,
    /// The exported function to call (`palisade_plugin_main` by default).
    pub entry: String,
    /// The call's input (JSON text).
    pub input: Vec<u8>,
    pub limits: PluginLimits,
    /// The host functions this call may use; any other import it calls
    /// fails with `CapabilityDenied` without reaching the broker.
    pub granted: Vec<HostFn>,
}

/// Limits of one call (Palyra's `WasmPluginRunnerPolicy` fields).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginLimits {
    pub fuel_budget: u64,
    pub max_memory_bytes: u64,
    pub max_table_elements: u32,
    pub max_instances: u32,
    /// Wall-clock deadline of the call (epoch interruption), host calls included.
    pub deadline_ms: u64,
}

/// The plugin-host's messages to the broker.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum FromHost {
    /// Sent once at start: the host's engine configuration, as a digest
    /// (`wasmtime-<version>-<16 hex>`, see [`engine_name_ok`]: the broker
    /// keys the module cache with a digest of it and the module's sha256).
    Ready {
        engine: String,
    },
    Compiled {
        id: u64,
        artifact: Vec<u8>,
    },
    /// A call's plugin called a granted host function; `args` is JSON.
    HostCall {
        id: u64,
        function: HostFn,
        args: Vec<u8>,
    },
    Done(CallDone),
    /// A request could not be carried out at all (`id` 0: a frame that did not decode).
    Failed {
        id: u64,
        message: String,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct CallDone {
    pub id: u64,
    pub outcome: CallOutcome,
    pub fuel_used: u64,
    /// The largest the instance's linear memory grew, bytes.
    pub memory_peak_bytes: u64,
    /// Inside the host: instantiating, and running the entry point.
    pub instantiate_us: u64,
    pub call_us: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// The entry point returned this output (JSON text).
    Output(Vec<u8>),
    /// Fuel, memory, tables, instances or the deadline ran out (which, in words).
    QuotaExceeded(String),
    /// A host function the call was not granted (which).
    CapabilityDenied(String),
    /// A trap, an entry point missing or of the wrong type, an output that
    /// is not where the ABI says.
    Trap(String),
}

/// The host functions a plugin may import (module `palisade`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum HostFn {
    HttpFetch,
    SecretGet,
    StorageGet,
    StoragePut,
    Log,
}

impl HostFn {
    pub const ALL: [HostFn; 5] =
        [HostFn::HttpFetch, HostFn::SecretGet, HostFn::StorageGet, HostFn::StoragePut, HostFn::Log];

    /// The import's name in module `palisade`.
    pub fn name(self) -> &'static str {
        match self {
            HostFn::HttpFetch => "http_fetch",
            HostFn::SecretGet => "secret_get",
            HostFn::StorageGet => "storage_get",
            HostFn::StoragePut => "storage_put",
            HostFn::Log => "log",
        }
    }
}

/// Why the broker refused or failed a host function.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct HostFnError {
    /// A stable kind: `CapabilityDenied` (not on the grant), `QuotaExceeded`
    /// (storage quota, response size), `TimedOut` (the call's deadline),
    /// `RuntimeFailure` (anything else).
    pub kind: crate::kind::ErrorKind,
    pub message: String,
}

/// What a plugin call was given and used, and where it ran (in
/// `ServerMessage::PluginResult`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct PluginAttestation {
    pub skill: String,
    /// The module's sha256 (hex), checked against the manifest at load.
    pub module_sha256: String,
    pub entry: String,
    /// The grants in force: the manifest's request within the policy's.
    pub grants: PluginGrantsInForce,
    pub limits: PluginLimits,
    pub fuel_used: u64,
    pub memory_peak_bytes: u64,
    /// Host function calls the broker served, and refused.
    pub host_calls: u64,
    pub host_calls_refused: u64,
    pub jail: PluginHostJail,
    /// The call's `plugin_finished` record in the audit journal.
    #[serde(default)]
    pub journal: Option<crate::attest::JournalRecord>,
    /// The storage `storage_get` and `storage_put` acted on: the
    /// requester's own, for this skill; `None` when the call was granted no
    /// storage.
    #[serde(default)]
    pub store: Option<PluginStore>,
}

/// A requester's storage of one skill (each requester has its own, with
/// its own quota).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct PluginStore {
    /// The requester's uid.
    pub uid: u32,
    pub skill: String,
    /// Bytes of keys and values it may hold (`[plugins] storage_quota_bytes`).
    pub quota_bytes: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PluginGrantsInForce {
    pub http_hosts: Vec<String>,
    pub secrets: Vec<String>,
    pub storage_prefixes: Vec<String>,
    pub log: bool,
    /// The host functions these make callable.
    pub functions: Vec<HostFn>,
}

/// The jail the plugin-host runs in, as built when it started.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct PluginHostJail {
    pub executor: crate::attest::Executor,
    pub pid: u32,
    pub namespaces: Vec<String>,
    /// sha256 of the seccomp program installed (BPF bytes).
    pub seccomp_sha256: String,
    /// Landlock as the helper reported it reached.
    pub landlock: Option<crate::attest::LandlockEnforcement>,
    /// sha256 of the plan the host was started with (canonical encoding).
    pub execution_sha256: String,
    /// The engine's configuration digest (`Ready`).
    pub engine: String,
    /// RLIMIT_AS (and RLIMIT_DATA) are unlimited in this jail: the pooling
    /// allocator reserves address space it does not use; memory is bounded
    /// per call instead.
    pub address_space_unlimited: bool,
    /// The host's own cgroup, where the broker has cgroups.
    pub cgroup: Option<PluginHostCgroup>,
}

/// The plugin-host's cgroup and its limits: every process of the host, its
/// engine and the call running, together.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct PluginHostCgroup {
    pub name: String,
    pub v1: bool,
    pub memory_bytes: u64,
    pub processes: u64,
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<PLUGIN_FRAME_MAX>()
}

/// Encodes one frame: its length, then its body.
pub fn encode_frame<T: Serialize>(message: &T) -> Result<Vec<u8>, String> {
    let body = bincode::serde::encode_to_vec(message, config()).map_err(|e| e.to_string())?;
    if body.len() > PLUGIN_FRAME_MAX {
        return Err(format!("a frame of {} bytes exceeds {PLUGIN_FRAME_MAX}", body.len()));
    }
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decodes one frame's body (its length prefix already read and checked
/// against [`PLUGIN_FRAME_MAX`]).
pub fn decode_body<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, String> {
    let (message, used) = bincode::serde::decode_from_slice(body, config()).map_err(|e| e.to_string())?;
    if used != body.len() {
        return Err(format!("{} bytes after a frame's message", body.len() - used));
    }
    Ok(message)
}

/// Reads one frame from a blocking reader: `None` at a clean end of input.
pub fn read_frame<T: for<'de> Deserialize<'de>>(r: &mut impl std::io::Read) -> std::io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > PLUGIN_FRAME_MAX {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("a frame of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    decode_body(&body).map(Some).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_strings_are_of_one_strict_form() {
        assert!(engine_name_ok("wasmtime-48.0.8-0123456789abcdef"));
        for bad in [
            "",
            "wasmtime-48.0.8-0123456789ABCDEF",
            "wasmtime-48.0.8-0123456789abcde",
            "wasmtime--0123456789abcdef",
            "wasmtime-48/../0-0123456789abcdef",
            "../wasmtime-48.0.8-0123456789abcdef",
            "wasmtime-48.0.8-0123456789abcdef/x",
            "wasmtime-48.0.8-0123456789abcdef\0",
            "cranelift-48.0.8-0123456789abcdef",
        ] {
            assert!(!engine_name_ok(bad), "{bad:?}");
        }
        let long = format!("wasmtime-{}-0123456789abcdef", "1.".repeat(30));
        assert!(!engine_name_ok(&long));
    }

    #[test]
    fn frames_round_trip() {
        let call = ToHost::Call(PluginCall {
            id: 7,
            artifact: "/cache/x.cwasm".into(),
            module_sha256: "ab".repeat(32),
            entry: "palisade_plugin_main".into(),
            input: b"{}".to_vec(),
            limits: PluginLimits {
                fuel_budget: 1,
                max_memory_bytes: 2,
                max_table_elements: 3,
                max_instances: 4,
                deadline_ms: 5,
            },
            granted: vec![HostFn::Log],
        });
        let bytes = encode_frame(&call).unwrap();
        let back: Option<ToHost> = read_frame(&mut &bytes[..]).unwrap();
        assert_eq!(back, Some(call));
        let none: Option<ToHost> = read_frame(&mut &[][..]).unwrap();
        assert_eq!(none, None);
        let mut huge = ((PLUGIN_FRAME_MAX + 1) as u32).to_be_bytes().to_vec();
        huge.extend_from_slice(&[0; 8]);
        assert!(read_frame::<ToHost>(&mut &huge[..]).is_err());
    }
}
