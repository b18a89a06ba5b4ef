//! The plugin ABI's names and its one encoding: a (pointer, length) pair in
//! an `i64`, pointer in the high 32 bits. `docs/plugins.md` is the reference.

use palisade_protocol::plugin::PLUGIN_FRAME_MAX;

/// The entry point called when a call names none.
pub const DEFAULT_ENTRY: &str = "palisade_plugin_main";
/// The exported allocator the host writes inputs and replies through.
pub const ALLOC_EXPORT: &str = "palisade_alloc";
/// The exported linear memory every pointer refers to.
pub const MEMORY_EXPORT: &str = "memory";
/// The import module of the host functions.
pub const IMPORT_MODULE: &str = "palisade";
/// Largest input, output, host function argument or reply that crosses guest
/// memory: whatever carries it must still fit in one frame with its header.
pub const PAYLOAD_MAX: usize = PLUGIN_FRAME_MAX - 4096;
/// Set in a host function's result when it failed: the pair then locates
/// the error's JSON (`{"kind","message"}`) instead of the reply.
pub const ERROR_FLAG: u64 = 1 << 63;
/// Pointers the host hands to the guest stay below this, so a successful
/// result is never negative (bit 63 is the error flag).
pub const HOST_POINTER_LIMIT: u32 = 1 << 31;

/// `(ptr << 32) | len`.
pub fn pack(ptr: u32, len: u32) -> i64 {
    ((u64::from(ptr) << 32) | u64::from(len)) as i64
}

/// The inverse of [`pack`], on the bits as they are (no sign).
pub fn unpack(value: i64) -> (u32, u32) {
    let bits = value as u64;
    ((bits >> 32) as u32, bits as u32)
}

/// A failed host function's result: the error JSON's pair with bit 63 set.
pub fn pack_error(ptr: u32, len: u32) -> i64 {
    (pack(ptr, len) as u64 | ERROR_FLAG) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_and_errors_are_negative() {
        assert_eq!(unpack(pack(0x1234, 0xffff_ffff)), (0x1234, 0xffff_ffff));
        assert!(pack(HOST_POINTER_LIMIT - 1, u32::MAX) >= 0);
        let e = pack_error(8, 40);
        assert!(e < 0);
        assert_eq!(unpack(e & i64::MAX), (8, 40));
    }
}
