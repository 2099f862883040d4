//! Growing volumes, leftover zeroing LVs, and deleting.

use super::*;

#[tokio::test]
async fn a_filesystem_volume_grows_with_lvextend_and_never_shrinks() {
    let f = Fixture::new(None);
    let (b, token) = f.thick_with_volume(VolumeMode::Filesystem).await;
    f.changes();
    assert_eq!(b.expand(&token, 128 * MIB).await.unwrap(), 128 * MIB);
    assert_eq!(b.expand(&token, 32 * MIB).await.unwrap(), 128 * MIB);
    let extends: Vec<_> = f
        .changes()
        .into_iter()
        .filter(|c| c.starts_with("lvextend"))
        .collect();
    assert_eq!(extends, ["lvextend -L 134217728b vg1/pvc-1"]);
    let missing = b.expand(&Token::for_name("nope"), MIB).await.unwrap_err();
    assert!(matches!(missing, BackendError::NotFound { .. }), "{missing}");
}

#[tokio::test]
async fn a_block_volume_grows_only_onto_extents_zeroed_first() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    let token = Token::for_name("blk");
    b.create(&spec("blk", 64 * MIB, VolumeMode::Block)).await.unwrap();
    let before = f.changes().len();
    assert_eq!(b.expand(&token, 96 * MIB).await.unwrap(), 96 * MIB);
    let changes = f.changes()[before..].to_vec();
    assert_eq!(
        changes,
        [
            "lvcreate -y -Wn -Zn -n blk+zero -L 33554432b --addtag localvol.csi.dev/zeroing-for=blk vg1",
            "lvs --reportformat json --units b --nosuffix --segments -o lv_name,seg_pe_ranges vg1/blk+zero",
            "blkdiscard -f -z /dev/vg1/blk+zero",
            "lvremove -y vg1/blk+zero",
            "lvextend -L 100663296b vg1/blk /dev/vda:900-907",
        ]
    );
    assert_eq!(f.lv_names(), ["blk"]);
}

#[tokio::test]
async fn a_leftover_zeroing_lv_is_removed_by_the_retry_or_the_delete() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    b.create(&spec("blk", 64 * MIB, VolumeMode::Block)).await.unwrap();
    let leftover = FakeLv {
        name: "blk+zero".into(),
        size: 32 * MIB,
        tags: vec![tags::zeroing_tag("blk")],
        pool: None,
        thin_pool: false,
        zeroing: false,
        in_use: false,
    };
    f.vg.lock().unwrap().lvs.push(leftover.clone());
    f.group.invalidate();
    assert_eq!(b.list().await.unwrap().len(), 1, "a zeroing LV is not a volume");
    b.expand(&Token::for_name("blk"), 96 * MIB).await.unwrap();
    assert_eq!(f.lv_names(), ["blk"]);

    f.vg.lock().unwrap().lvs.push(leftover);
    f.group.invalidate();
    b.delete(&Token::for_name("blk")).await.unwrap();
    assert!(f.lv_names().is_empty(), "{:?}", f.lv_names());
}

#[tokio::test]
async fn delete_is_idempotent_refuses_busy_lvs_and_spares_foreign_ones() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    let token = Token::for_name("pvc-1");
    b.create(&spec("pvc-1", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    f.vg.lock().unwrap().lvs[0].in_use = true;
    let err = b.delete(&token).await.unwrap_err();
    assert!(matches!(err, BackendError::InUse { .. }), "{err}");
    f.vg.lock().unwrap().lvs[0].in_use = false;
    b.delete(&token).await.unwrap();
    b.delete(&token).await.unwrap();
    assert!(f.lv_names().is_empty());

    // An LV of the same name that is not this class's volume is left alone.
    f.plant_thick("root", 8 * MIB, Vec::new());
    b.delete(&Token::for_name("root")).await.unwrap();
    assert_eq!(f.lv_names(), ["root"]);
    let err = b
        .create(&spec("root", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::Lvm(LvmError::NameTaken { .. })),
        "{err}"
    );
}
