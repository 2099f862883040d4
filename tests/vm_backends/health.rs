//! A thin pool that fills up under a volume, on real device-mapper: reported before the
//! next claim or the volume's writes find it.

use super::*;

/// A raw block volume in a 16 MiB pool of its own (which errors at once when full,
/// instead of queueing the writes), filled by its own writer as a pod would: past the
/// class's critical fill the class offers nothing, a create is refused with
/// RESOURCE_EXHAUSTED and the pool's state before any lvcreate, and NodeGetVolumeStats
/// reports the volume abnormal with the reason. Once an administrator extends the pool,
/// all of it serves again, without a restart.
pub async fn a_full_thin_pool_is_reported_and_takes_no_volume() {
    const FULL_VG: &str = "fullvg";
    let config = Path::new(CONFIG_DIR).join("full.yaml");
    std::fs::write(
        &config,
        "device-classes:\n  - name: full\n    kind: lvm-thin\n    volume-group: fullvg\n    default: true\n    \
         thin-pool: {name: pool, overprovision-ratio: 4.0, warning-percent: 50, critical-percent: 90}\n",
    )
    .unwrap();
    let dir = tempfile::Builder::new().prefix("localvol-vm-").tempdir().unwrap();
    let backing = dir.path().join("fullvg.img");
    let loop_dev = guest::volume_group_on_loop(FULL_VG, &backing, 64 * MIB);
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

    // Seen at the next report: at most a minute (the cached report's age).
    let deadline = Instant::now() + Duration::from_secs(90);
    let condition = loop {
        let stats = c.client.stats(&vol.volume_id, &device).await.unwrap();
        let condition = stats.volume_condition.unwrap();
        if condition.abnormal {
            break condition;
        }
        assert!(
            Instant::now() < deadline,
            "not abnormal within 90 s: {condition:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
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
    t.done("reported abnormal, no capacity, a create refused");

    // The pool extended by hand: it serves again, the volume is healthy.
    sh("lvextend", &["-q", "-L", "+24M", &format!("{FULL_VG}/pool")]);
    let deadline = Instant::now() + Duration::from_secs(90);
    while c.capacity("full").await.0 == 0 {
        assert!(
            Instant::now() < deadline,
            "the extended pool not served within 90 s"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let stats = c.client.stats(&vol.volume_id, &device).await.unwrap();
    assert!(
        !stats.volume_condition.as_ref().unwrap().abnormal,
        "{:?}",
        stats.volume_condition
    );
    let another = c.create("full", "another", 4 * MIB, &cap).await.unwrap();
    t.done("extended: served again");

    c.delete(&another.volume_id).await.unwrap();
    c.unpublish(&vol.volume_id, "filled").await.unwrap();
    c.unstage(&vol.volume_id, "filled").await.unwrap();
    c.delete(&vol.volume_id).await.unwrap();
    d.stop().await;
    guest::remove_volume_group_on_loop(FULL_VG, &loop_dev);
}
