//! The property `fuzz/fuzz_targets/blkid_export.rs` fuzzes, and `tests/fuzz_replay.rs`
//! replays on every run: `blkid -p -o export` output. Labels and UUIDs on a device come
//! from whoever wrote the device, so this is tenant-controlled text; parsing it must
//! never panic.

/// Parses arbitrary bytes as blkid's export output.
pub fn blkid_export(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = super::parse_blkid_export(&text);
}
