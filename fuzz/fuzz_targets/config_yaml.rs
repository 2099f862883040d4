//! The device-class file, then its validation; also the size and duration parsers
//! used by flags and the file.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use localvol::config::{FileConfig, parse_duration, parse_quantity, validate_classes};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(file) = serde_yaml::from_str::<FileConfig>(&text) {
        let _ = validate_classes(file, Path::new("/var/lib/localvol"), 1 << 40);
    }
    let first = text.lines().next().unwrap_or_default();
    let _ = parse_quantity(first);
    let _ = parse_duration(first);
});
