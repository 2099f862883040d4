//! The property `fuzz/fuzz_targets/config_yaml.rs` fuzzes, and `tests/fuzz_replay.rs`
//! replays on every run: the device-class file, then its validation; also the size and
//! duration parsers used by flags and the file. None may panic.

use std::path::Path;

use super::{FileConfig, parse_duration, parse_quantity, validate_classes};

/// Parses and validates arbitrary bytes as a device-class file; its first line as a
/// quantity and a duration.
pub fn config_yaml(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(file) = serde_yaml::from_str::<FileConfig>(&text) {
        let _ = validate_classes(file, Path::new("/var/lib/localvol"), 1 << 40);
    }
    let first = text.lines().next().unwrap_or_default();
    let _ = parse_quantity(first);
    let _ = parse_duration(first);
}
