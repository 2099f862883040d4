//! The property `fuzz/fuzz_targets/lvm_report.rs` fuzzes, and `tests/fuzz_replay.rs`
//! replays on every run: lvs/vgs JSON reports, `dmsetup status` lines and LV tags. LV
//! names and tags are chosen by whoever can run lvm on the node, not only by localvol:
//! parsing and reading ownership must never panic, and a report never makes a foreign
//! LV look like ours.

use super::{report, tags};
use crate::model::ClassName;

/// Parses arbitrary bytes as each LVM report localvol reads, and checks what ownership
/// and tag encoding promise of whatever parses.
pub fn lvm_report(data: &[u8]) {
    let class = ClassName::parse("fuzz").expect("a valid class name");
    if let Ok(lvs) = report::parse_lvs(data) {
        for lv in &lvs {
            let _ = (lv.is_thin_pool(), lv.is_thin_volume(), lv.is_active());
            let _ = lv.zeroes_new_blocks();
            let _ = tags::ownership(&class, "vg", lv);
            // Without a class tag of localvol's, no LV is ours.
            let class_tag = format!("{}class=", tags::PREFIX);
            if !lv.tags.iter().any(|t| t.starts_with(&class_tag)) {
                assert!(matches!(
                    tags::ownership(&class, "vg", lv),
                    tags::Ownership::Foreign
                ));
            }
        }
    }
    let _ = report::parse_vgs(data);
    let _ = report::parse_report(data, "vg");
    let _ = report::parse_segments(data);
    let text = String::from_utf8_lossy(data);
    let _ = report::parse_thin_mapped_sectors(&text);
    // Tags are stored encoded; whatever decodes must encode back to the same tag.
    if let Some(decoded) = tags::decode(&text) {
        assert_eq!(
            tags::decode(&tags::encode(&decoded)).as_deref(),
            Some(decoded.as_str())
        );
    }
}
