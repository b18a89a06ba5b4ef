//! The policy file: any text is a configuration or an error with its
//! position, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade_policy::Config;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = Config::parse(text, Path::new("fuzz.toml"));
});
