//! libFuzzer's entry to `localvol::backend::lvm::fuzz::lvm_report`, the property it states (and
//! `tests/fuzz_replay.rs` replays on every test run).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| localvol::backend::lvm::fuzz::lvm_report(data));
