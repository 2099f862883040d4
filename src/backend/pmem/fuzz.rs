//! The property `fuzz/fuzz_targets/ndctl_json.rs` fuzzes, and `tests/fuzz_replay.rs`
//! replays on every run: ndctl's JSON listings and the fsdax size arithmetic. Region
//! sizes and alignments come from the kernel through ndctl, and volume sizes from
//! requests. Parsing must never panic, and the size rules must hold for every size a
//! request can carry (at most i64::MAX).

use super::ndctl;

/// Parses arbitrary bytes as ndctl's listings; reads the first nine as a size and an
/// alignment and checks the fsdax size rules on them.
pub fn ndctl_json(data: &[u8]) {
    let _ = ndctl::parse_regions(data);
    let _ = ndctl::parse_namespace(data);
    let Some((size, rest)) = data.split_first_chunk::<8>() else {
        return;
    };
    let Some(&shape) = rest.first() else {
        return;
    };
    // A CSI capacity is an int64; localvol caps volumes far below that, but the
    // arithmetic must not overflow even there. Alignments: 2 MiB × 1..=128.
    let usable = u64::from_le_bytes(*size) >> 1 >> (shape % 24);
    let align = ndctl::FSDAX_ALIGN * (u64::from(shape >> 1) % 128 + 1);
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
