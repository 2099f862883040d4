//! libFuzzer's entry to `localvol::config::fuzz::config_yaml`, the property it states (and
//! `tests/fuzz_replay.rs` replays on every test run).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| localvol::config::fuzz::config_yaml(data));
