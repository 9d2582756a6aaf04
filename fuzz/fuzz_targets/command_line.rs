//! rlaunch's command_line parser and its properties (rlaunch::fuzzing) on libFuzzer's inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rlaunch::fuzzing::command_line(data));
