//! The fuzz target `plugin_manifest`: what it checks of an input is `palisade_fuzz::plugin_manifest`
//! (fuzz/src/lib.rs), which the test suite replays the corpus through too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::plugin_manifest(data));
