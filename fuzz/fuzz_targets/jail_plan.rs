//! The plan the helper reads from the broker: decoded and checked
//! (`JailPlan::check`), never a panic, whatever the bytes. A plan that
//! decodes and passes its checks encodes back to the same plan. Half the
//! inputs get a valid header (magic, version, architecture) in front, so
//! that the fuzzer spends its time on the body rather than the magic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade_protocol::plan::{PLAN_ARCH, PLAN_MAGIC, PLAN_VERSION};
use palisade_protocol::{decode_plan, encode_plan};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let bytes = if selector % 2 == 0 {
        let mut b = PLAN_MAGIC.to_vec();
        b.extend_from_slice(&PLAN_VERSION.to_be_bytes());
        b.push(PLAN_ARCH.len() as u8);
        b.extend_from_slice(PLAN_ARCH.as_bytes());
        b.extend_from_slice(rest);
        b
    } else {
        rest.to_vec()
    };
    let Ok(plan) = decode_plan(&bytes) else { return };
    if plan.check().is_ok() {
        let encoded = encode_plan(&plan).expect("a checked plan encodes");
        assert_eq!(decode_plan(&encoded).expect("and decodes"), plan);
    }
});
