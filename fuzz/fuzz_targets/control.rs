//! The control decoder's properties (crates/protocol/tests/properties) on libFuzzer's inputs.
#![no_main]

#[path = "../../crates/protocol/tests/properties/mod.rs"]
#[allow(dead_code)]
mod properties;

libfuzzer_sys::fuzz_target!(|data: &[u8]| properties::control(data));
