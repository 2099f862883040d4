//! `blkid -p -o export` output: labels and UUIDs on a device come from whoever wrote
//! the device, so this is tenant-controlled text.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = localvol::fs::parse_blkid_export(&text);
});
