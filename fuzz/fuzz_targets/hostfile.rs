//! rlaunch's hostfile parser and its properties (rlaunch::fuzzing) on libFuzzer's inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rlaunch::fuzzing::hostfile(data));
