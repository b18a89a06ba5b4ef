//! The host functions a plugin imports from module `palisade`, the call's
//! state they read, and the guest-memory moves of the ABI. A granted host
//! function is carried out by the broker through [`HostCalls`]; any other
//! answers `CapabilityDenied` without reaching it.

use std::time::Instant;

use palisade_protocol::plugin::{HostFn, HostFnError};
use palisade_protocol::wire::ErrorKind;
use wasmtime::{AsContext, AsContextMut, Caller, Extern, Linker, Memory, TypedFunc};

use crate::abi::{self, ALLOC_EXPORT, HOST_POINTER_LIMIT, IMPORT_MODULE, MEMORY_EXPORT, PAYLOAD_MAX};
use crate::limits::{CallLimiter, Quota};

/// The broker's side of a running call's host functions.
pub trait HostCalls {
    /// Carries out `function` with its JSON `args`, waiting for the answer
    /// until `deadline` at most.
    fn call(&mut self, function: HostFn, args: &[u8], deadline: Instant) -> Result<Vec<u8>, HostCallError>;
}

#[derive(Debug, thiserror::Error)]
pub enum HostCallError {
    /// The broker answered with an error: the guest receives it.
    #[error("{}: {}", .0.kind.name(), .0.message)]
    Failed(HostFnError),
    /// No answer before the call's deadline: the call ends `QuotaExceeded`.
    #[error("no answer before the deadline")]
    DeadlinePassed,
    /// The channel to the broker is gone: the call ends, and so does the host.
    #[error("the broker's channel: {0}")]
    Broken(String),
}

/// A call's mistake against the ABI: the call ends `Trap` with these words.
#[derive(Debug, thiserror::Error)]
pub enum AbiError {
    #[error("the module exports no memory named `{MEMORY_EXPORT}`")]
    NoMemory,
    #[error("the module's `{ALLOC_EXPORT}` is missing or not (i32) -> i32: {0}")]
    NoAlloc(String),
    #[error("the entry point `{0}` is missing or not (i32, i32) -> i64: {1}")]
    Entry(String, String),
    #[error("{what} of {len} bytes exceeds the ABI's {PAYLOAD_MAX}")]
    TooLarge { what: &'static str, len: usize },
    #[error("{what} at {ptr}+{len} lies outside the guest's memory of {size} bytes")]
    OutOfBounds { what: &'static str, ptr: u32, len: u32, size: usize },
    #[error("`{ALLOC_EXPORT}` returned {0}, at or above the ABI's 2 GiB pointer limit")]
    HighPointer(u32),
}

/// One call's store data.
pub struct CallState {
    pub(crate) limiter: CallLimiter,
    host: *mut (dyn HostCalls + 'static),
    granted: Vec<HostFn>,
    deadline: Instant,
    deadline_ms: u64,
    /// Host functions the guest called without a grant, in order.
    pub(crate) denied: Vec<HostFn>,
}

impl CallState {
    /// # Safety
    /// `host` must outlive the store this state goes into: the store must be
    /// dropped before `host`'s borrow ends.
    pub(crate) unsafe fn new(
        limiter: CallLimiter,
        host: &mut dyn HostCalls,
        granted: Vec<HostFn>,
        deadline: Instant,
        deadline_ms: u64,
    ) -> Self {
        // SAFETY: only the lifetime is erased; the caller keeps `host` alive
        // for as long as the store (see this function's contract), and the
        // pointer is dereferenced only from host functions of that store.
        let host: *mut (dyn HostCalls + 'static) = unsafe { std::mem::transmute(host) };
        CallState { limiter, host, granted, deadline, deadline_ms, denied: Vec::new() }
    }

    fn host(&mut self) -> &mut dyn HostCalls {
        // SAFETY: `new`'s contract keeps the pointee alive and unaliased while
        // the store (and so this state) exists; `&mut self` makes this the only borrow.
        unsafe { &mut *self.host }
    }
}

/// Every host function, for any call; the grant is checked per call.
pub(crate) fn linker(engine: &wasmtime::Engine) -> wasmtime::Result<Linker<CallState>> {
    let mut linker = Linker::new(engine);
    for function in HostFn::ALL {
        linker.func_wrap(
            IMPORT_MODULE,
            function.name(),
            move |caller: Caller<'_, CallState>, ptr: i32, len: i32| host_fn(caller, function, ptr, len),
        )?;
    }
    Ok(linker)
}

fn host_fn(mut caller: Caller<'_, CallState>, function: HostFn, ptr: i32, len: i32) -> wasmtime::Result<i64> {
    let (memory, alloc) = exports(&mut caller)?;
    let args = read_guest(&caller, memory, "a host function's arguments", ptr as u32, len as u32)?;
    let answer = if caller.data().granted.contains(&function) {
        let deadline = caller.data().deadline;
        if Instant::now() >= deadline {
            return Err(wasmtime::Error::new(Quota::Deadline(caller.data().deadline_ms)));
        }
        match caller.data_mut().host().call(function, &args, deadline) {
            Ok(reply) => Ok(reply),
            Err(HostCallError::Failed(e)) => Err(e),
            Err(HostCallError::DeadlinePassed) => {
                return Err(wasmtime::Error::new(Quota::Deadline(caller.data().deadline_ms)));
            }
            Err(e @ HostCallError::Broken(_)) => return Err(wasmtime::Error::new(e)),
        }
    } else {
        caller.data_mut().denied.push(function);
        Err(HostFnError {
            kind: ErrorKind::CapabilityDenied,
            message: format!("{} is not granted to this call", function.name()),
        })
    };
    match answer {
        Ok(reply) => {
            let ptr = write_guest(&mut caller, memory, &alloc, "a host function's reply", &reply)?;
            Ok(abi::pack(ptr, reply.len() as u32))
        }
        Err(e) => {
            let json = error_json(&e);
            let ptr = write_guest(&mut caller, memory, &alloc, "a host function's error", &json)?;
            Ok(abi::pack_error(ptr, json.len() as u32))
        }
    }
}

/// `{"kind": "...", "message": "..."}`.
pub fn error_json(e: &HostFnError) -> Vec<u8> {
    serde_json::json!({"kind": e.kind.name(), "message": e.message}).to_string().into_bytes()
}

fn exports(caller: &mut Caller<'_, CallState>) -> wasmtime::Result<(Memory, TypedFunc<i32, i32>)> {
    let Some(Extern::Memory(memory)) = caller.get_export(MEMORY_EXPORT) else {
        return Err(wasmtime::Error::new(AbiError::NoMemory));
    };
    let Some(Extern::Func(alloc)) = caller.get_export(ALLOC_EXPORT) else {
        return Err(wasmtime::Error::new(AbiError::NoAlloc("missing".into())));
    };
    let alloc = alloc.typed::<i32, i32>(&caller).map_err(|e| AbiError::NoAlloc(e.to_string()))?;
    Ok((memory, alloc))
}

/// Copies `len` bytes at `ptr` out of the guest, bounds checked.
pub(crate) fn read_guest(
    store: impl AsContext,
    memory: Memory,
    what: &'static str,
    ptr: u32,
    len: u32,
) -> wasmtime::Result<Vec<u8>> {
    if len as usize > PAYLOAD_MAX {
        return Err(wasmtime::Error::new(AbiError::TooLarge { what, len: len as usize }));
    }
    let data = memory.data(&store);
    let range = ptr as usize..ptr as usize + len as usize;
    match data.get(range) {
        Some(bytes) => Ok(bytes.to_vec()),
        None => Err(wasmtime::Error::new(AbiError::OutOfBounds { what, ptr, len, size: data.len() })),
    }
}

/// Allocates `bytes.len()` in the guest with its allocator and copies `bytes` there.
pub(crate) fn write_guest<T: AsContextMut<Data = CallState>>(
    mut store: T,
    memory: Memory,
    alloc: &TypedFunc<i32, i32>,
    what: &'static str,
    bytes: &[u8],
) -> wasmtime::Result<u32> {
    if bytes.len() > PAYLOAD_MAX {
        return Err(wasmtime::Error::new(AbiError::TooLarge { what, len: bytes.len() }));
    }
    let len = bytes.len() as u32;
    let ptr = alloc.call(&mut store, len as i32)? as u32;
    if ptr >= HOST_POINTER_LIMIT {
        return Err(wasmtime::Error::new(AbiError::HighPointer(ptr)));
    }
    let size = memory.data_size(&store);
    let Some(dest) = memory.data_mut(&mut store).get_mut(ptr as usize..ptr as usize + len as usize) else {
        return Err(wasmtime::Error::new(AbiError::OutOfBounds { what, ptr, len, size }));
    };
    dest.copy_from_slice(bytes);
    Ok(ptr)
}
