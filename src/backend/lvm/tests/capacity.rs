//! Capacity of thick and thin classes, and what open and create refuse.

use super::*;

#[tokio::test]
async fn thick_capacity_is_vg_free_minus_spare_and_too_big_changes_nothing() {
    let f = Fixture::new(None);
    let b = f.thick(256 * MIB).await;
    let cap = b.capacity().await.unwrap();
    assert_eq!(cap.available, 768 * MIB);
    assert_eq!(cap.total, 768 * MIB);
    assert_eq!(cap.max_volume, 768 * MIB);
    let err = b
        .create(&spec("big", 800 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::NoSpace { available, .. } if available == 768 * MIB),
        "{err}"
    );
    assert!(f.changes().is_empty(), "refused before any lvcreate");
    b.create(&spec("a", 700 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    assert_eq!(b.capacity().await.unwrap().available, 68 * MIB);

    // Someone else took the space meanwhile: lvcreate's own refusal is NoSpace too.
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    f.vg.lock().unwrap().fail.push((
        "lvcreate",
        "  Volume group \"vg1\" has insufficient free space (1 extents): 2 required.\n".into(),
    ));
    let err = b
        .create(&spec("x", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::NoSpace { .. }), "{err}");
}

/// The report is trusted for a minute (an idle node's LVM commands), but a refusal for
/// lack of space is decided on one at most 10 s old: space an administrator added
/// (`vgextend`) serves a create and a growth at once, not a minute later.
#[tokio::test(start_paused = true)]
async fn space_added_behind_localvol_serves_creates_and_growth_before_the_report_expires() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    b.create(&spec("a", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    assert_eq!(b.capacity().await.unwrap().available, 1016 * MIB);
    // vgextend by hand: the VG doubles.
    f.vg.lock().unwrap().size = 2048 * MIB;
    tokio::time::advance(std::time::Duration::from_secs(11)).await;
    assert_eq!(
        b.capacity().await.unwrap().available,
        1016 * MIB,
        "capacity reads the cached report within the minute"
    );
    b.create(&spec("big", 1500 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    f.vg.lock().unwrap().size = 3072 * MIB;
    tokio::time::advance(std::time::Duration::from_secs(11)).await;
    assert_eq!(
        b.expand(&Token::for_name("a"), 1000 * MIB).await.unwrap(),
        1000 * MIB
    );
    // And a refusal still refuses, on a recent report.
    tokio::time::advance(std::time::Duration::from_secs(11)).await;
    let err = b
        .create(&spec("huge", 4096 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::NoSpace { .. }), "{err}");
}

#[tokio::test]
async fn thin_volumes_are_bounded_by_the_overprovision_ratio() {
    let f = Fixture::new(Some(true));
    let b = f.thin(2.0).await;
    assert_eq!(b.capacity().await.unwrap().available, 512 * MIB);
    b.create(&spec("t1", 400 * MIB, VolumeMode::Block)).await.unwrap();
    assert_eq!(
        f.changes(),
        [
            "lvcreate -y -n t1 -V 419430400b --thinpool pool0 --addtag localvol.csi.dev/class=thin \
          --addtag localvol.csi.dev/name=t1 --addtag localvol.csi.dev/mode=block \
          --addtag localvol.csi.dev/pvc=data --addtag localvol.csi.dev/namespace=team \
          --addtag localvol.csi.dev/pv=pvc-1 vg1"
        ],
        "a thin LV reads zeros until written: no pending tag, no zeroing"
    );
    let cap = b.capacity().await.unwrap();
    assert_eq!((cap.available, cap.total), (112 * MIB, 512 * MIB));
    let err = b
        .create(&spec("t2", 200 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::NoSpace { .. }), "{err}");
    let err = b.expand(&Token::for_name("t1"), 600 * MIB).await.unwrap_err();
    assert!(matches!(err, BackendError::NoSpace { .. }), "{err}");
    assert_eq!(
        b.expand(&Token::for_name("t1"), 500 * MIB).await.unwrap(),
        500 * MIB
    );
    assert!(
        f.changes()
            .last()
            .unwrap()
            .starts_with("lvextend -L 524288000b vg1/t1")
    );
}

#[tokio::test]
async fn block_volumes_are_refused_on_a_pool_that_does_not_zero() {
    let f = Fixture::new(Some(false));
    let b = f.thin(1.0).await;
    let err = b
        .create(&spec("t1", 8 * MIB, VolumeMode::Block))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::Lvm(LvmError::PoolNotZeroing { .. })),
        "{err}"
    );
    b.create(&spec("t2", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_missing_vg_or_pool_fails_at_open() {
    let f = Fixture::new(None);
    let settings = |layout| LvmSettings {
        kind: "lvm-thin",
        layout,
        lvcreate_options: Vec::new(),
        dax: false,
    };
    let missing_vg = VolumeGroup::new("nosuchvg".into(), f.host.clone());
    let thick = Layout::Thick {
        spare_bytes: 0,
        stripes: None,
        stripe_size: None,
    };
    let err = LvmBackend::open(
        ClassName::parse("a").unwrap(),
        settings(thick.clone()),
        missing_vg,
        f.host.clone(),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "volume group nosuchvg does not exist on this node"
    );
    // A VG lvm no longer finds while the kernel still holds LVs of it (its only disk
    // failed) is said so; a VG whose name extends this one's is not counted.
    f.syscalls
        .set_device_mapper_names(&["nosuchvg-a", "nosuchvg-b", "nosuchvg--x-c", "vg1-pool0"]);
    let err = LvmBackend::open(
        ClassName::parse("a").unwrap(),
        settings(thick.clone()),
        VolumeGroup::new("nosuchvg".into(), f.host.clone()),
        f.host.clone(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, BackendError::Lvm(LvmError::VgNotFound { active_lvs: 2, .. })),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "volume group nosuchvg is not found by lvm, but 2 of its logical volumes are still active in the \
         kernel: the disks under it failed or are missing (see pvs and the kernel log)"
    );
    f.syscalls.set_device_mapper_names(&[]);
    let thin = Layout::Thin {
        pool: "pool0".into(),
        overprovision_ratio: 1.0,
        thresholds: crate::config::PoolThresholds::default(),
    };
    let err = LvmBackend::open(
        ClassName::parse("a").unwrap(),
        settings(thin),
        Arc::clone(&f.group),
        f.host.clone(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, BackendError::Lvm(LvmError::PoolNotFound { .. })),
        "{err}"
    );
}

/// Once the storage is repaired, at the next report: capacity again, a create of `name`
/// served, and the volume `token` healthy.
async fn serves_again(b: &LvmBackend, token: &Token, name: &str) {
    past_the_report_ttl().await;
    assert!(b.capacity().await.unwrap().available > 0);
    b.create(&spec(name, 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    assert_eq!(b.volume_health(token).await.unwrap(), VolumeHealth::Healthy);
}

/// A thin pool lvm reports out of data space (or past the class's critical fill) offers
/// nothing: capacity 0, so the scheduler sends no claim here, and a create is refused
/// with the pool's state before any lvcreate (RESOURCE_EXHAUSTED, which sends the claim
/// to another node). Its volumes are reported abnormal; past the warning fill they are
/// healthy with the pool's state said. Once the pool has room, all of it comes back.
#[tokio::test(start_paused = true)]
async fn a_critical_thin_pool_takes_no_volume_and_its_volumes_are_abnormal() {
    let f = Fixture::new(Some(true));
    let b = f.thin(2.0).await;
    b.create(&spec("t1", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    let token = Token::for_name("t1");
    assert_eq!(b.volume_health(&token).await.unwrap(), VolumeHealth::Healthy);

    f.vg.lock().unwrap().pool_fill = Some((85.0, 10.0));
    past_the_report_ttl().await;
    assert_eq!(
        b.volume_health(&token).await.unwrap(),
        VolumeHealth::Warning("thin pool vg1/pool0: data 85.0% full (warning at 80%)".into())
    );
    assert!(
        b.capacity().await.unwrap().available > 0,
        "a warning refuses nothing"
    );

    for (health, fill, why) in [
        ('D', (100.0, 10.0), "thin pool vg1/pool0 is out of data space"),
        (
            '-',
            (10.0, 96.0),
            "thin pool vg1/pool0: metadata 96.0% full (critical at 95%)",
        ),
        ('F', (10.0, 10.0), "thin pool vg1/pool0 is failed"),
    ] {
        {
            let mut vg = f.vg.lock().unwrap();
            vg.pool_health = health;
            vg.pool_fill = Some(fill);
        }
        past_the_report_ttl().await;
        assert_eq!(b.capacity().await.unwrap().available, 0, "{why}");
        let before = f.changes().len();
        let err = b
            .create(&spec("t2", 8 * MIB, VolumeMode::Filesystem))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, BackendError::Lvm(LvmError::PoolUnusable { reason, .. }) if reason == why),
            "{err}"
        );
        assert_eq!(f.changes().len(), before, "refused before any lvcreate");
        assert_eq!(
            b.volume_health(&token).await.unwrap(),
            VolumeHealth::Abnormal(why.into())
        );
    }

    // An administrator extends the pool: it serves again at the next report.
    {
        let mut vg = f.vg.lock().unwrap();
        vg.pool_health = '-';
        vg.pool_fill = Some((40.0, 10.0));
    }
    serves_again(&b, &token, "t2").await;
}

/// A VG that lost a disk offers nothing, on either layout: capacity 0 and a create
/// refused before any lvcreate (RESOURCE_EXHAUSTED, naming the VG and the count), while
/// a volume lvm does not report partial is healthy with the VG's state said. The VG
/// whole again, all of it comes back.
#[tokio::test(start_paused = true)]
async fn a_vg_missing_a_disk_takes_no_volume_and_its_volumes_are_warned() {
    for thin in [false, true] {
        let f = Fixture::new(thin.then_some(true));
        let b = if thin { f.thin(2.0).await } else { f.thick(0).await };
        b.create(&spec("v1", 8 * MIB, VolumeMode::Filesystem))
            .await
            .unwrap();
        let token = Token::for_name("v1");
        f.vg.lock().unwrap().missing_pvs = 1;
        past_the_report_ttl().await;
        assert_eq!(b.capacity().await.unwrap().available, 0, "thin {thin}");
        let before = f.changes().len();
        let err = b
            .create(&spec("v2", 8 * MIB, VolumeMode::Filesystem))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "volume group vg1 takes no new volume: 1 of its physical volumes is missing \
             (a disk failed or was removed; pvs shows which)"
        );
        assert_eq!(f.changes().len(), before, "refused before any lvcreate");
        assert_eq!(
            b.volume_health(&token).await.unwrap(),
            VolumeHealth::Warning(
                "volume group vg1 is missing 1 physical volume (its extents are on the others; \
                 the group takes no new volume until pvs shows it whole)"
                    .into()
            )
        );

        f.vg.lock().unwrap().missing_pvs = 0;
        serves_again(&b, &token, "v2").await;
    }
}

/// Deleting the volume that filled a pool empties it: the next create, at once, is not
/// refused on the fill the report had before the delete (a CI run, 2026-12-02: a tenant
/// filled pool0 to 98.4%, was deleted, and the next create was RESOURCE_EXHAUSTED).
#[tokio::test(start_paused = true)]
async fn a_pool_its_own_delete_emptied_takes_the_next_volume_at_once() {
    let f = Fixture::new(Some(true));
    let b = f.thin(2.0).await;
    b.create(&spec("t1", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    f.vg.lock().unwrap().pool_fill = Some((98.4, 10.0));
    past_the_report_ttl().await;
    assert_eq!(b.capacity().await.unwrap().available, 0, "the full pool, read");

    b.delete(&Token::for_name("t1")).await.unwrap();
    f.vg.lock().unwrap().pool_fill = Some((0.0, 9.0));
    b.create(&spec("t2", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    assert!(b.capacity().await.unwrap().available > 0);
}

/// lvm's own refusal of a thin LV in a full pool (the pool filled after the report
/// the create read) is the same refusal.
#[tokio::test]
async fn lvcreate_refused_for_a_full_pool_is_pool_unusable() {
    let f = Fixture::new(Some(true));
    let b = f.thin(2.0).await;
    let stderr = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/lvm/lvcreate-thin-pool-full.txt"
    ))
    .unwrap();
    f.vg.lock().unwrap().fail.push(("lvcreate", stderr));
    let err = b
        .create(&spec("t1", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::Lvm(LvmError::PoolUnusable { .. })),
        "{err}"
    );
}
