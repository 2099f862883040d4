//! The property `fuzz/fuzz_targets/mountinfo.rs` fuzzes, and `tests/fuzz_replay.rs`
//! replays on every run: /proc/self/mountinfo text. Mount points can be named by
//! unprivileged users, with escapes: parsing must never panic, whatever the kernel or a
//! user put there.

/// Parses arbitrary bytes as a mount table and reads what stage and publish read of it.
pub fn mountinfo(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(entries) = super::parse_mountinfo(&text) {
        for entry in &entries {
            let _ = entry.device_number();
            let _ = entry.is_read_only();
        }
    }
    let _ = super::MountTable::parse(&text);
}
