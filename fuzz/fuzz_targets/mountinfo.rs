//! libFuzzer's entry to `localvol::mount::fuzz::mountinfo`, the property it states (and
//! `tests/fuzz_replay.rs` replays on every test run).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| localvol::mount::fuzz::mountinfo(data));
