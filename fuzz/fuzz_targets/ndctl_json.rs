//! ndctl's JSON listings and the fsdax size arithmetic: region sizes and alignments come
//! from the kernel through ndctl, and volume sizes from requests. Parsing must never
//! panic, and the size rules must hold for every size a request can carry (≤ i64::MAX).
#![no_main]

use libfuzzer_sys::fuzz_target;
use localvol::backend::pmem::ndctl;

fuzz_target!(|data: &[u8]| {
    let _ = ndctl::parse_regions(data);
    let _ = ndctl::parse_namespace(data);
    if data.len() >= 9 {
        // A CSI capacity is an int64; localvol caps volumes far below that, but the
        // arithmetic must not overflow even there. Alignments: 2 MiB × 1..=128.
        let usable = u64::from_le_bytes(data[..8].try_into().unwrap()) >> 1 >> (data[8] % 24);
        let align = ndctl::FSDAX_ALIGN * (u64::from(data[8] >> 1) % 128 + 1);
        let raw = ndctl::raw_for_usable(usable, align);
        assert_eq!(raw % align, 0);
        assert!(ndctl::fsdax_usable(raw) >= usable, "{usable} {align}: short");
        assert!(
            raw == align || ndctl::fsdax_usable(raw - align) < usable,
            "{usable} {align}: not the smallest"
        );
        if let Some(within) = ndctl::raw_within(usable, align) {
            assert_eq!(within % align, 0);
            assert!(ndctl::fsdax_usable(within) <= usable);
        }
    }
});
