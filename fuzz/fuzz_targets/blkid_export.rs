//! libFuzzer's entry to `localvol::fs::fuzz::blkid_export`, the property it states (and
//! `tests/fuzz_replay.rs` replays on every test run).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| localvol::fs::fuzz::blkid_export(data));
