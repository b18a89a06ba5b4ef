//! What a sandboxed command sends the broker's strict-egress listeners
//! (see broker/src/egress/): parsed, or refused, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = palisade_broker::egress::fuzzing::dns_query(data);
});
