//! GetCapacity against what the tools say, refused creates that leave nothing, and
//! the limits of tests/testkit/src/limits.rs on each class.

use super::*;
use localvol_testkit::limits::{self, Class};

/// What the tools say a class can still hold: (available, largest volume).
fn tool_capacity(class: &str) -> (u64, u64) {
    let vg_free = |vg: &str| lvm_bytes("vgs", "vg_free", vg);
    let align = |bytes: u64, to: u64| bytes / to * to;
    match class {
        "thick" => {
            let a = align(vg_free(VG).saturating_sub(1 << 30), 4 * MIB);
            (a, a)
        }
        "striped" => {
            let a = align(vg_free(VG).saturating_sub(1 << 30), 8 * MIB);
            (a, a)
        }
        "thin" => {
            let pool = lvm_bytes("lvs", "lv_size", "vmvg/pool0");
            let thin: u64 = lvm_report("lvs", "lv_size,pool_lv", VG)
                .lines()
                .filter(|l| l.split_whitespace().nth(1) == Some("pool0"))
                .map(|l| l.split_whitespace().next().unwrap().parse::<u64>().unwrap())
                .sum();
            let a = align((2 * pool).saturating_sub(thin), 4 * MIB);
            (a, a)
        }
        "pmem" => {
            let region: serde_json::Value =
                serde_json::from_str(&sh("ndctl", &["list", "-R", "-r", REGION])).unwrap();
            let region = if region.is_array() {
                region[0].clone()
            } else {
                region
            };
            let usable = |key: &str| fsdax_usable(align(region[key].as_u64().unwrap(), 16 * MIB));
            (usable("available_size"), usable("max_available_extent"))
        }
        "pmem-lvm" => {
            let a = align(vg_free(PMEM_VG), 4 * MIB);
            (a, a)
        }
        other => panic!("{other}"),
    }
}

/// Everything in the storage the classes use, to compare before and after.
fn storage_snapshot() -> String {
    format!(
        "{}\n{}\n{}",
        sh("lvs", &["--noheadings", "-o", "lv_name,lv_size,lv_tags", VG]),
        sh("lvs", &["--noheadings", "-o", "lv_name,lv_size,lv_tags", PMEM_VG]),
        sh("ndctl", &["list", "-N", "-i", "-r", REGION]),
    )
}

pub async fn capacity_matches_the_tools_and_too_big_leaves_nothing() {
    let d = daemon().await;
    let c = Csi::of(&d).await;
    let data = d.dir.path().join("data");
    for class in ["thick", "striped", "thin", "pmem", "pmem-lvm"] {
        let mut t = Steps::new(class);
        let (available, max) = c.capacity(class).await;
        t.done("GetCapacity");
        let expected = tool_capacity(class);
        assert_eq!(
            (available, max),
            expected,
            "{class}: GetCapacity vs vgs/lvs/ndctl"
        );
        assert!(max > 0, "{class} has room");
        eprintln!("capacity {class}: available {available}, largest volume {max} (= tools)");

        let before = storage_snapshot();
        let records = files_under(&data);
        let too_big = max + 16 * MIB;
        for cap in [mount_cap("ext4"), block_cap()] {
            let err = c
                .create(class, &format!("{class}-too-big"), too_big, &cap)
                .await
                .unwrap_err();
            assert_eq!(err.code(), Code::ResourceExhausted, "{class}: {}", err.message());
        }
        t.done("too-big create refused x2");
        assert_eq!(
            storage_snapshot(),
            before,
            "{class}: a refused create leaves no LV or namespace"
        );
        assert_eq!(files_under(&data), records, "{class}: and no record");
    }

    // Block volumes on a pool that does not zero: refused, nothing made.
    let before = storage_snapshot();
    let err = c
        .create("thin-nozero", "nozero-block", 16 * MIB, &block_cap())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().contains("does not zero"), "{}", err.message());
    assert_eq!(storage_snapshot(), before);
    d.stop().await;
}

/// `limit_bytes` kept and GetCapacity's largest volume made, on each class (see
/// tests/testkit/src/limits.rs): whole extents of the VG, usable sizes of fsdax namespaces.
pub async fn limits_are_kept_and_the_largest_volume_fits() {
    let d = daemon().await;
    let extent = |vg: &str| lvm_bytes("vgs", "vg_extent_size", vg);
    let lvm = |name, vg| Class {
        name: Some(name),
        small: 16 * extent(vg),
        large: 32 * extent(vg),
        grows: true,
    };
    for class in [
        lvm("thick", VG),
        lvm("thin", VG),
        lvm("pmem-lvm", PMEM_VG),
        Class {
            name: Some("pmem"),
            small: fsdax_usable(80 * MIB),
            large: fsdax_usable(160 * MIB),
            grows: false,
        },
    ] {
        let mut t = Steps::new(class.name.unwrap());
        limits::check(&d.socket, class).await;
        t.done("limits and largest volume");
    }
    d.stop().await;
}
