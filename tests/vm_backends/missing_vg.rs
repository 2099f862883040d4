//! A configured VG that is missing at start, served once it appears.

use super::*;

/// A configuration naming a VG this node does not have, beside one it has: the daemon
/// serves the present class, offers nothing in the missing one and says why, and
/// serves it once the VG appears, without a restart.
pub async fn a_missing_volume_group_is_served_once_it_appears() {
    const LATE_VG: &str = "latevg";
    let config = Path::new(CONFIG_DIR).join("late.yaml");
    std::fs::write(
        &config,
        "device-classes:\n  - name: thick\n    kind: lvm\n    volume-group: vmvg\n    spare-gb: 1\n    default: true\n  \
         - name: late\n    kind: lvm\n    volume-group: latevg\n    spare-gb: 0\n",
    )
    .unwrap();
    let dir = tempfile::Builder::new().prefix("localvol-vm-").tempdir().unwrap();
    let backing = dir.path().join("latevg.img");
    let d = InProcessDaemon::start_with_config(dir, "vm-node", &config).await;
    let c = Csi::of(&d).await;
    let mut t = Steps::new("late");

    // Ready, the present class served, the missing one empty and explained.
    let (code, body) = d.get("/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("device class late not served"), "{body}");
    assert!(body.contains("volume group latevg does not exist"), "{body}");
    assert_eq!(c.capacity("late").await.0, 0);
    assert!(c.capacity("thick").await.0 > 0);
    let refused = c
        .create("late", "early", 16 * MIB, &block_cap())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("latevg"), "{refused:?}");
    d.wait_for_metric("localvol_device_class_available{device_class=\"late\"} 0")
        .await;
    d.wait_for_metric("localvol_device_class_available{device_class=\"thick\"} 1")
        .await;
    t.done("missing class: ready, no capacity, refused");

    // The VG appears (on a loop device: the guest's disks are taken).
    let loop_dev = guest::volume_group_on_loop(LATE_VG, &backing, 64 * MIB);
    let deadline = Instant::now() + Duration::from_secs(120);
    while c.capacity("late").await.0 == 0 {
        assert!(Instant::now() < deadline, "latevg not picked up within 120 s");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    t.done("VG appeared: picked up");
    let vol = c.create("late", "late-1", 16 * MIB, &block_cap()).await.unwrap();
    assert_eq!(lvs_named(LATE_VG, "late-1").len(), 1);
    c.delete(&vol.volume_id).await.unwrap();
    assert!(lvs_named(LATE_VG, "late-1").is_empty());
    t.done("create+delete in the late class");
    let (_, body) = d.get("/readyz").await;
    assert!(!body.contains("not served"), "{body}");
    d.stop().await;
    guest::remove_volume_group_on_loop(LATE_VG, &loop_dev);
}
