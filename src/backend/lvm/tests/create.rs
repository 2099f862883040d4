//! Creating LVM volumes: tags and the commit mark, zeroing, the container config, and
//! what a crash in the middle leaves.

use super::*;

#[tokio::test]
async fn a_thick_filesystem_volume_is_tagged_committed_and_listed() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    let record = b
        .create(&spec("pvc-1", 64 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    assert_eq!(record.size_bytes, 64 * MIB);
    assert_eq!(record.claim.pvc_namespace.as_deref(), Some("team"));
    let uuid = f.fs_uuid("pvc-1").expect("the UUID mkfs will be given");
    assert_eq!(
        f.changes(),
        [format!(
            "lvcreate -y -n pvc-1 -L 67108864b -Wy -Zy --addtag localvol.csi.dev/class=thick \
             --addtag localvol.csi.dev/name=pvc-1 --addtag localvol.csi.dev/mode=filesystem \
             --addtag localvol.csi.dev/fs=ext4 --addtag localvol.csi.dev/pvc=data \
             --addtag localvol.csi.dev/namespace=team --addtag localvol.csi.dev/pv=pvc-1 \
             --addtag localvol.csi.dev/format=formatting --addtag localvol.csi.dev/fs-uuid={uuid} vg1"
        )],
        "a filesystem volume is a volume once lvcreate returns: it is formatted over at \
         its first stage, whatever its device holds"
    );
    assert!(!f.lv("pvc-1").tags.contains(&tags::PENDING.to_string()));
    assert_eq!(
        b.get(&Token::for_name("pvc-1")).await.unwrap(),
        Some(record.clone())
    );
    assert_eq!(b.list().await.unwrap(), [record]);
    assert_eq!(
        b.device(&Token::for_name("pvc-1")).await.unwrap(),
        Some(PathBuf::from("/dev/vg1/pvc-1"))
    );
    // A repeated create changes nothing.
    b.create(&spec("pvc-1", 64 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    assert!(f.changes().iter().filter(|c| c.starts_with("lvcreate")).count() == 1);
}

#[tokio::test]
async fn a_thick_block_volume_is_zeroed_before_it_becomes_a_volume() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    b.create(&spec("blk", 8 * MIB, VolumeMode::Block)).await.unwrap();
    let changes = f.changes();
    assert!(changes[0].starts_with("lvcreate") && changes[0].ends_with("state=zeroing vg1"));
    assert_eq!(
        changes[1..],
        [
            "blkdiscard -f -z /dev/vg1/blk",
            "lvchange --deltag localvol.csi.dev/state=zeroing vg1/blk"
        ]
    );
}

#[tokio::test]
async fn a_failed_zeroing_leaves_nothing_behind() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    f.vg.lock()
        .unwrap()
        .fail
        .push(("blkdiscard", "blkdiscard: Input/output error".into()));
    let err = b
        .create(&spec("blk", 8 * MIB, VolumeMode::Block))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Input/output error"), "{err}");
    assert!(f.lv_names().is_empty(), "{:?}", f.lv_names());
    assert!(b.get(&Token::for_name("blk")).await.unwrap().is_none());
}

#[tokio::test]
async fn every_lvm_command_carries_the_container_config() {
    let f = Fixture::new(Some(true));
    let thick = f.thick(0).await;
    let thin = f.thin(2.0).await;
    f.commands
        .on("dmsetup", |_| ok("0 131072 thin 0 131071\n".to_string()));
    for (b, name, mode) in [
        (&thick, "blk", VolumeMode::Block),
        (&thick, "fs", VolumeMode::Filesystem),
        (&thin, "thin-fs", VolumeMode::Filesystem),
    ] {
        let token = Token::for_name(name);
        b.create(&spec(name, 64 * MIB, mode)).await.unwrap();
        if mode == VolumeMode::Filesystem {
            b.begin_format(&token).await.unwrap();
            b.mark_formatted(&token).await.unwrap();
        }
        b.expand(&token, 96 * MIB).await.unwrap();
        b.delete(&token).await.unwrap();
    }
    let mut calls = f.commands.calls();
    // A VG without LVs, whose report needs `vgs` beside `lvs`.
    let empty = Fixture::new(None);
    empty.thick(0).await;
    calls.extend(empty.commands.calls());
    let mut seen: Vec<&str> = Vec::new();
    for call in &calls {
        let (program, rest) = call.split_once(' ').unwrap_or((call, ""));
        if LVM_PROGRAMS.contains(&program) {
            assert!(
                rest.starts_with(&format!("--config {CONTAINER_CONFIG} ")),
                "{call}"
            );
            seen.push(program);
        }
    }
    seen.sort_unstable();
    seen.dedup();
    let mut all = LVM_PROGRAMS.to_vec();
    all.sort_unstable();
    assert_eq!(seen, all, "the lifecycle ran every LVM program: {calls:#?}");
}

#[tokio::test]
async fn a_pending_lv_from_a_crash_is_not_a_volume_and_is_redone() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    // The daemon died while zeroing: the LV exists with the pending tag.
    f.plant_thick_volume("blk", 8 * MIB, VolumeMode::Block, &[tags::PENDING]);
    assert!(b.get(&Token::for_name("blk")).await.unwrap().is_none());
    assert!(b.list().await.unwrap().is_empty());
    assert!(b.device(&Token::for_name("blk")).await.unwrap().is_none());
    b.create(&spec("blk", 8 * MIB, VolumeMode::Block)).await.unwrap();
    let changes = f.changes();
    assert_eq!(changes[0], "lvremove -y vg1/blk");
    assert!(changes[1].starts_with("lvcreate"));
    assert_eq!(changes[2], "blkdiscard -f -z /dev/vg1/blk");
    assert!(b.get(&Token::for_name("blk")).await.unwrap().is_some());

    // Or the retry is a delete: it removes the pending LV just the same.
    f.vg.lock().unwrap().lvs[0].tags.push(tags::PENDING.to_string());
    f.group.invalidate();
    b.delete(&Token::for_name("blk")).await.unwrap();
    assert!(f.lv_names().is_empty());
}
