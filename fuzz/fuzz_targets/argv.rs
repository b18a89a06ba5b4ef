//! The fuzz target `argv`: what it checks of an input is `palisade_fuzz::argv`
//! (fuzz/src/lib.rs), which the test suite replays the corpus through too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::argv(data));
