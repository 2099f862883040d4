//! A thin pool that fills up under a volume and a volume group that loses a disk, on
//! real device-mapper, and a PMEM region disabled under its volumes, on the emulated
//! NVDIMM: reported before the next claim or the volume's writes find it.

use super::*;

/// A raw block volume in a 16 MiB pool of its own (which errors at once when full,
/// instead of queueing the writes), filled by its own writer as a pod would: past the
/// class's critical fill the class offers nothing, a create is refused with
/// RESOURCE_EXHAUSTED and the pool's state before any lvcreate, and NodeGetVolumeStats
/// reports the volume abnormal with the reason. Once an administrator extends the pool,
/// all of it serves again, without a restart.
///
/// Meanwhile, in the same minute of reports, a thick class's VG of two disks loses the
/// second: the volume with extents on it is abnormal (lvm reports its LV partial), the
/// one wholly on the first is healthy with the VG's state said, the class offers
/// nothing and refuses a create. The disk back, the class serves again.
pub async fn a_full_thin_pool_is_reported_and_takes_no_volume() {
    const FULL_VG: &str = "fullvg";
    const LOSSY_VG: &str = "lossyvg";
    let config = Path::new(CONFIG_DIR).join("full.yaml");
    std::fs::write(
        &config,
        "device-classes:\n  - name: full\n    kind: lvm-thin\n    volume-group: fullvg\n    default: true\n    \
         thin-pool: {name: pool, overprovision-ratio: 4.0, warning-percent: 50, critical-percent: 90}\n  \
         - name: lossy\n    kind: lvm\n    volume-group: lossyvg\n    spare-gb: 0\n",
    )
    .unwrap();
    let dir = tempfile::Builder::new().prefix("localvol-vm-").tempdir().unwrap();
    let backing = dir.path().join("fullvg.img");
    let loop_dev = guest::volume_group_on_loop(FULL_VG, &backing, 64 * MIB);
    let lossy = guest::FailableVg::create(LOSSY_VG, dir.path(), 2, 32 * MIB);
    sh(
        "lvcreate",
        &[
            "-q",
            "-y",
            "--type",
            "thin-pool",
            "-L",
            "16M",
            "-n",
            "pool",
            FULL_VG,
        ],
    );
    sh(
        "lvchange",
        &["-q", "--errorwhenfull", "y", &format!("{FULL_VG}/pool")],
    );
    let d = InProcessDaemon::start_with_config(dir, "vm-node", &config).await;
    let c = Csi::of(&d).await;
    let mut t = Steps::new("full");
    let cap = block_cap();
    let vol = c.create("full", "filled", 48 * MIB, &cap).await.unwrap();
    c.stage(&vol.volume_id, "filled", &cap).await.unwrap();
    c.publish(&vol.volume_id, "filled", &cap).await.unwrap();
    assert!(c.capacity("full").await.0 > 0);
    t.done("a volume of 48 MiB in a 16 MiB pool");
    // 24 MiB wholly on the first disk (of 7 extents), then 24 MiB reaching the second.
    let mut lossy_volumes = Vec::new();
    for name in ["on-first", "on-second"] {
        let v = c.create("lossy", name, 24 * MIB, &cap).await.unwrap();
        c.stage(&v.volume_id, name, &cap).await.unwrap();
        c.publish(&v.volume_id, name, &cap).await.unwrap();
        lossy_volumes.push(v);
    }
    let on_pv = |name: &str| {
        let lv = lvs_named(LOSSY_VG, name).pop().unwrap();
        sh(
            "lvs",
            &["--noheadings", "-o", "devices", &format!("{LOSSY_VG}/{lv}")],
        )
    };
    assert!(!on_pv("on-first").contains(&lossy.pv(1)), "{}", on_pv("on-first"));
    assert!(
        on_pv("on-second").contains(&lossy.pv(1)),
        "{}",
        on_pv("on-second")
    );
    assert!(c.capacity("lossy").await.0 > 0);
    t.done("two volumes on a VG of two disks");

    // The writer fills the pool: a write past its end fails (errorwhenfull).
    let device = c.target("filled");
    let written = std::process::Command::new("dd")
        .args([
            "if=/dev/urandom",
            "bs=1M",
            "count=32",
            "oflag=direct",
            "status=none",
        ])
        .arg(format!("of={}", device.display()))
        .status()
        .unwrap();
    assert!(!written.success(), "32 MiB fit in a 16 MiB pool");
    t.done("the writer filled the pool");
    lossy.fail(1);
    t.done("the lossy VG's second disk failed");

    // Seen at the next report: at most a minute (the cached report's age).
    let condition_of = |id: String, name: &'static str| {
        let c = &c;
        async move {
            let stats = c.client.stats(&id, &c.target(name)).await.unwrap();
            stats.volume_condition.unwrap()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let (condition, second) = loop {
        let conditions = (
            condition_of(vol.volume_id.clone(), "filled").await,
            condition_of(lossy_volumes[1].volume_id.clone(), "on-second").await,
        );
        if conditions.0.abnormal && conditions.1.abnormal {
            break conditions;
        }
        assert!(
            Instant::now() < deadline,
            "not abnormal within 90 s: {conditions:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    // Asked only now: the report that showed the lost disk under the second volume is
    // the one it is read from (asked in the same round, it could come from the report
    // before, which a refresh between the two calls replaced).
    let first = condition_of(lossy_volumes[0].volume_id.clone(), "on-first").await;
    assert!(
        second.message.starts_with(&format!("logical volume {LOSSY_VG}/"))
            && second
                .message
                .contains("is partial: a physical volume of its volume group is missing"),
        "{second:?}"
    );
    assert!(
        !first.abnormal
            && first
                .message
                .contains("volume group lossyvg is missing 1 physical volume"),
        "{first:?}"
    );
    assert_eq!(
        c.capacity("lossy").await.0,
        0,
        "a VG missing a disk offers nothing"
    );
    let refused = c.create("lossy", "more", 4 * MIB, &cap).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("volume group lossyvg takes no new volume: 1 of its physical volumes is missing"),
        "{refused:?}"
    );
    t.done("the lost disk: its volume abnormal, the other warned, a create refused");
    assert!(
        condition
            .message
            .contains("thin pool fullvg/pool is out of data space")
            || condition.message.contains("thin pool fullvg/pool: data"),
        "{condition:?}"
    );
    assert_eq!(c.capacity("full").await.0, 0, "a full pool offers nothing");
    let refused = c.create("full", "another", 4 * MIB, &cap).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("thin pool fullvg/pool"), "{refused:?}");
    assert!(
        lvs_named(FULL_VG, "another").is_empty(),
        "refused before any lvcreate"
    );
    let refused = c.client.snapshot("full-snap", &vol.volume_id).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("thin pool fullvg/pool"), "{refused:?}");
    assert!(
        lvs_named(FULL_VG, "full-snap").is_empty(),
        "refused before any lvcreate"
    );
    // The same in /metrics: each volume's last condition, each class's storage.
    for (v, status) in [
        (&vol, "abnormal"),
        (&lossy_volumes[1], "abnormal"),
        (&lossy_volumes[0], "healthy"),
    ] {
        assert_eq!(
            d.volume_health(&v.volume_id).await.as_deref(),
            Some(status),
            "{}",
            v.volume_id
        );
    }
    d.wait_for_metric(r#"localvol_storage_health{device_class="full",status="critical"} 1"#)
        .await;
    d.wait_for_metric(r#"localvol_storage_health{device_class="lossy",status="degraded"} 1"#)
        .await;
    t.done("reported abnormal, no capacity, a create and a snapshot refused; in /metrics");

    // The pool extended by hand, the disk back: both serve again, the volumes are
    // healthy.
    sh("lvextend", &["-q", "-L", "+24M", &format!("{FULL_VG}/pool")]);
    lossy.restore(1);
    let deadline = Instant::now() + Duration::from_secs(90);
    while c.capacity("full").await.0 == 0 || c.capacity("lossy").await.0 == 0 {
        assert!(
            Instant::now() < deadline,
            "the extended pool or the restored VG not served within 90 s"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    for (v, name) in lossy_volumes.iter().zip(["on-first", "on-second"]) {
        let condition = condition_of(v.volume_id.clone(), name).await;
        assert!(
            !condition.abnormal && condition.message.starts_with("healthy on "),
            "{name}: {condition:?}"
        );
        assert_eq!(d.volume_health(&v.volume_id).await.as_deref(), Some("healthy"));
        c.unpublish(&v.volume_id, name).await.unwrap();
        c.unstage(&v.volume_id, name).await.unwrap();
        c.delete(&v.volume_id).await.unwrap();
    }
    let stats = c.client.stats(&vol.volume_id, &device).await.unwrap();
    assert!(
        !stats.volume_condition.as_ref().unwrap().abnormal,
        "{:?}",
        stats.volume_condition
    );
    assert_eq!(d.volume_health(&vol.volume_id).await.as_deref(), Some("healthy"));
    for class in ["full", "lossy"] {
        d.wait_for_metric(&format!(
            r#"localvol_storage_health{{device_class="{class}",status="healthy"}} 1"#
        ))
        .await;
    }
    let another = c.create("full", "another", 4 * MIB, &cap).await.unwrap();
    t.done("the pool extended, the disk back: served again");

    c.delete(&another.volume_id).await.unwrap();
    c.unpublish(&vol.volume_id, "filled").await.unwrap();
    c.unstage(&vol.volume_id, "filled").await.unwrap();
    c.delete(&vol.volume_id).await.unwrap();
    d.stop().await;
    guest::remove_volume_group_on_loop(FULL_VG, &loop_dev);
    lossy.remove();
}

/// Whether `ndctl` lists the region as disabled (`-i`: without it, a disabled region is
/// not listed at all).
fn region_disabled() -> bool {
    let listed = guest::json_list(&sh("ndctl", &["list", "-R", "-i", "-r", REGION]));
    listed
        .first()
        .unwrap_or_else(|| panic!("ndctl lists no {REGION}"))["state"]
        == "disabled"
}

/// First one namespace disabled under its published volume, then the whole region:
/// `ndctl disable-region` under a volume of the direct PMEM class, as an administrator
/// does before a module is replaced (or as a region the kernel could not enable
/// looks): its namespaces and block devices are gone, and ndctl answers a destroy as
/// for a missing namespace. The class offers nothing and refuses a create for the
/// region; a delete answers UNAVAILABLE and keeps the record (the namespace comes back
/// with the region); the class's storage is critical in /metrics. Enabled again, the
/// delete goes through and the class serves, without a restart.
///
/// The suite's pmemvg sits on a namespace of the same region; it holds no active LV
/// between tests, so nothing keeps the region busy, and it is whole afterwards.
pub async fn a_disabled_pmem_region_is_reported_and_takes_no_volume() {
    let config = Path::new(CONFIG_DIR).join("region.yaml");
    std::fs::write(
        &config,
        "device-classes:\n  - name: pmem\n    kind: pmem\n    mode: direct\n    region: region0\n    default: true\n",
    )
    .unwrap();
    let dir = tempfile::Builder::new().prefix("localvol-vm-").tempdir().unwrap();
    let d = InProcessDaemon::start_with_config(dir, "vm-node", &config).await;
    let c = Csi::of(&d).await;
    let mut t = Steps::new("pmem-region");
    let cap = block_cap();
    let kept = c.create("pmem", "kept", 64 * MIB, &cap).await.unwrap();
    assert_eq!(namespaces_named("kept").len(), 1);

    // One namespace disabled under its published raw block volume (nothing refuses
    // it: only a bind holds the node). Its condition says why within a listing's
    // refusal lifetime (10 s; until then, that its device is gone); enabled again,
    // unpublished and published anew as the condition says, healthy.
    let id = kept.volume_id.clone();
    c.stage(&id, "kept", &cap).await.unwrap();
    c.publish(&id, "kept", &cap).await.unwrap();
    let ns = namespaces_named("kept")[0]["dev"].as_str().unwrap().to_string();
    sh("ndctl", &["disable-namespace", &ns]);
    let disabled = format!("its namespace {ns} is disabled, so its block device is gone");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = c.client.stats(&id, &c.target("kept")).await.unwrap();
        let condition = stats.volume_condition.unwrap();
        assert!(condition.abnormal, "{condition:?}");
        if condition.message.starts_with(&disabled) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not said disabled within 30 s: {condition:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert_eq!(d.volume_health(&id).await.as_deref(), Some("abnormal"));
    sh("ndctl", &["enable-namespace", &ns]);
    c.unpublish(&id, "kept").await.unwrap();
    c.unstage(&id, "kept").await.unwrap();
    c.stage(&id, "kept", &cap).await.unwrap();
    c.publish(&id, "kept", &cap).await.unwrap();
    let condition = c
        .client
        .stats(&id, &c.target("kept"))
        .await
        .unwrap()
        .volume_condition
        .unwrap();
    assert!(!condition.abnormal, "{condition:?}");
    assert_eq!(d.volume_health(&id).await.as_deref(), Some("healthy"));
    c.unpublish(&id, "kept").await.unwrap();
    c.unstage(&id, "kept").await.unwrap();
    t.done("a namespace disabled under its published volume: said so; enabled, served again");
    sh("vgchange", &["-q", "-an", PMEM_VG]);
    let out = std::process::Command::new("ndctl")
        .args(["disable-region", REGION])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && said.contains("disabled 1 region"),
        "{said}"
    );
    assert!(region_disabled());
    t.done("a volume made, the region disabled");

    let refused = c.create("pmem", "refused", 64 * MIB, &cap).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("PMEM region region0 is disabled"),
        "{refused:?}"
    );
    assert_eq!(
        c.capacity("pmem").await,
        (0, 0),
        "a disabled region offers nothing"
    );
    d.wait_for_metric(r#"localvol_storage_health{device_class="pmem",status="critical"} 1"#)
        .await;
    let unreachable = c.delete(&kept.volume_id).await.unwrap_err();
    assert_eq!(unreachable.code(), Code::Unavailable, "{unreachable:?}");
    assert!(
        unreachable.message().ends_with("; nothing was changed"),
        "{unreachable:?}"
    );
    assert!(c.listed(&kept.volume_id).await, "the volume is still listed");
    t.done("no capacity, a create refused, critical, the delete kept the record");

    sh("ndctl", &["enable-region", REGION]);
    assert!(!region_disabled());
    // The refusal's listing is at most REFUSAL_TTL (10 s) old when the next call asks.
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = c.delete(&kept.volume_id).await {
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        assert!(
            Instant::now() < deadline,
            "still unreachable 30 s after enable-region: {e:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert!(namespaces_named("kept").is_empty() && namespaces_named("refused").is_empty());
    assert!(c.capacity("pmem").await.0 > 0);
    let again = c.create("pmem", "again", 64 * MIB, &cap).await.unwrap();
    c.delete(&again.volume_id).await.unwrap();
    d.wait_for_metric(r#"localvol_storage_health{device_class="pmem",status="healthy"} 1"#)
        .await;
    t.done("enabled: deleted, served again, healthy");
    d.stop().await;
    sh("vgs", &[PMEM_VG]);
}
