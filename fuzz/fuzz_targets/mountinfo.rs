//! /proc/self/mountinfo text (mount points can be named by unprivileged users, with
//! escapes): parsing must never panic, whatever the kernel or a user put there.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(entries) = localvol::mount::parse_mountinfo(&text) {
        for entry in &entries {
            let _ = entry.device_number();
            let _ = entry.is_read_only();
        }
    }
    let _ = localvol::mount::MountTable::parse(&text);
});
