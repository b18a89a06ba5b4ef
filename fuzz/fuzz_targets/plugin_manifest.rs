//! A skill's manifest (TOML): a manifest or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade_policy::Manifest;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = Manifest::parse(text, Path::new("fuzz-skill.toml"));
});
