//! Root-only: full volume lifecycles on real loop devices, filesystems and mounts,
//! driven over the daemon's CSI socket exactly as kubelet and external-provisioner do.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};

use localvol::proto::csi::v1 as csi;
use localvol_testkit::csi_client::{NewVolume, block_capability as block_cap, bytes_total, fs_capability};
use localvol_testkit::{Cleanup, InProcessDaemon, loops_under, mounts_under, privileged};
use tonic::Code;

const MIB: i64 = 1 << 20;

fn mount_cap(fs: &str) -> csi::VolumeCapability {
    fs_capability(fs, &["noatime"])
}

// The helpers below put the shared client (tests/testkit/src/csi_client.rs) on this file's
// paths: one staging path, `stage`, and targets named by the test, in the daemon's dir.

async fn create(d: &InProcessDaemon, name: &str, size: i64, cap: &csi::VolumeCapability) -> csi::Volume {
    let volume = NewVolume {
        capability: cap.clone(),
        ..NewVolume::new(name, size)
    };
    d.client().await.create(volume.request()).await.unwrap()
}

async fn stage(d: &InProcessDaemon, id: &str, cap: &csi::VolumeCapability) -> Result<(), tonic::Status> {
    std::fs::create_dir_all(d.path("stage")).unwrap();
    d.client().await.stage(id, &d.path("stage"), cap).await
}

async fn publish(
    d: &InProcessDaemon,
    id: &str,
    cap: &csi::VolumeCapability,
    target: &str,
) -> Result<(), tonic::Status> {
    d.client()
        .await
        .publish(id, &d.path("stage"), &d.path(target), cap)
        .await
}

async fn teardown(d: &InProcessDaemon, id: &str, target: &str) {
    let csi = d.client().await;
    csi.unpublish(id, &d.path(target)).await.unwrap();
    csi.unstage(id, &d.path("stage")).await.unwrap();
    csi.delete(id).await.unwrap();
}

async fn stats(d: &InProcessDaemon, id: &str, path: &str) -> csi::NodeGetVolumeStatsResponse {
    d.client().await.stats(id, &d.path(path)).await.unwrap()
}

async fn node_expand(
    d: &InProcessDaemon,
    id: &str,
    size: i64,
    path: &str,
    cap: &csi::VolumeCapability,
) -> Result<i64, tonic::Status> {
    d.client()
        .await
        .expand_node(id, &d.path(path), &d.path("stage"), size, cap)
        .await
}

async fn try_expand(
    d: &InProcessDaemon,
    id: &str,
    size: i64,
    path: &str,
    cap: &csi::VolumeCapability,
) -> Result<i64, tonic::Status> {
    let controller = d.client().await.expand_controller(id, size).await.unwrap();
    assert_eq!(controller.capacity_bytes, size);
    assert!(controller.node_expansion_required);
    node_expand(d, id, size, path, cap).await
}

async fn filesystem_lifecycle(fs: &str) {
    let d = InProcessDaemon::start(&[]).await;
    let cap = mount_cap(fs);
    let vol = create(&d, &format!("pvc-{fs}"), 320 * MIB, &cap).await;
    assert_eq!(vol.capacity_bytes, 320 * MIB);
    stage(&d, &vol.volume_id, &cap).await.unwrap();
    stage(&d, &vol.volume_id, &cap).await.unwrap();
    publish(&d, &vol.volume_id, &cap, "target").await.unwrap();
    publish(&d, &vol.volume_id, &cap, "target").await.unwrap();
    std::fs::write(d.path("target/data"), b"written through the publish").unwrap();

    let before = stats(&d, &vol.volume_id, "target").await;
    assert!(!before.volume_condition.as_ref().unwrap().abnormal);
    assert!(bytes_total(&before) > 250 * MIB, "{before:?}");
    assert!(
        before
            .usage
            .iter()
            .any(|u| u.unit == csi::volume_usage::Unit::Inodes as i32)
    );

    if fs == "ext4" && !localvol_testkit::has_cap_sys_resource() {
        // The kernel refuses ext4 online resize without CAP_SYS_RESOURCE, which some
        // sandboxes drop even for root. The VM suite runs this step with full
        // capabilities; here the refusal must surface as an error, never as success.
        let err = try_expand(&d, &vol.volume_id, 640 * MIB, "target", &cap)
            .await
            .unwrap_err();
        assert!(err.message().contains("Permission denied"), "{}", err.message());
        eprintln!("NOTE: ext4 online growth not exercised here: no CAP_SYS_RESOURCE (the VM suite runs it)");
    } else {
        let grown = try_expand(&d, &vol.volume_id, 640 * MIB, "target", &cap)
            .await
            .unwrap();
        assert_eq!(grown, 640 * MIB);
        let after = stats(&d, &vol.volume_id, "target").await;
        assert!(
            bytes_total(&after) > bytes_total(&before) + 250 * MIB,
            "{fs} grew online: {after:?}"
        );
        // Kubelet repeats NodeExpandVolume after a restart or a lost reply: the same
        // size again changes nothing, and a smaller one never shrinks.
        for size in [640 * MIB, 320 * MIB] {
            let again = node_expand(&d, &vol.volume_id, size, "target", &cap)
                .await
                .unwrap();
            assert_eq!(
                again,
                640 * MIB,
                "NodeExpandVolume to {size} reports the device's size"
            );
            assert_eq!(
                bytes_total(&stats(&d, &vol.volume_id, "target").await),
                bytes_total(&after)
            );
        }
    }
    assert_eq!(
        std::fs::read(d.path("target/data")).unwrap(),
        b"written through the publish"
    );

    teardown(&d, &vol.volume_id, "target").await;
    assert!(!d.path("target").exists(), "unpublish removes the target");
    assert!(
        mounts_under(d.dir.path()).is_empty(),
        "{:?}",
        mounts_under(d.dir.path())
    );
    assert!(
        loops_under(d.dir.path()).is_empty(),
        "{:?}",
        loops_under(d.dir.path())
    );
    d.stop().await;
}

#[tokio::test]
async fn ext4_lifecycle_with_online_growth() {
    if privileged() {
        filesystem_lifecycle("ext4").await;
    }
}

#[tokio::test]
async fn xfs_lifecycle_with_online_growth() {
    if privileged() {
        filesystem_lifecycle("xfs").await;
    }
}

/// The kernel name of the block device mounted at `path` (`loop3`), from the mount
/// table and sysfs, as an administrator would find it.
fn device_name_at(path: &std::path::Path) -> String {
    let table = localvol::mount::MountTable::parse(&std::fs::read_to_string("/proc/self/mountinfo").unwrap())
        .unwrap();
    let mount = table
        .at(path)
        .unwrap_or_else(|| panic!("nothing mounted at {}", path.display()));
    let link = std::fs::read_link(format!("/sys/dev/block/{}:{}", mount.major, mount.minor)).unwrap();
    link.file_name().unwrap().to_string_lossy().into_owned()
}

fn loop_backing_file(name: &str) -> String {
    std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .unwrap()
        .trim()
        .to_string()
}

/// What a filesystem says of itself reaches NodeGetVolumeStats' condition, and clears
/// once it is repaired: ext4's error count (an error raised through sysfs, which the
/// kernel records as it does a real one) until e2fsck, an xfs shut down (as after a
/// failed metadata write) until it is mounted again.
#[tokio::test]
async fn a_filesystem_in_error_is_abnormal_until_repaired() {
    if !privileged() {
        return;
    }
    let d = InProcessDaemon::start(&[]).await;
    for fs in ["ext4", "xfs"] {
        let cap = mount_cap(fs);
        let vol = create(&d, &format!("pvc-fault-{fs}"), 320 * MIB, &cap).await;
        let id = &vol.volume_id;
        stage(&d, id, &cap).await.unwrap();
        publish(&d, id, &cap, "target").await.unwrap();
        let condition = || async { stats(&d, id, "target").await.volume_condition.unwrap() };
        let healthy = condition().await;
        assert!(!healthy.abnormal, "{fs}: {healthy:?}");

        let device = device_name_at(&d.path("stage"));
        let backing = loop_backing_file(&device);
        let (want, repair): (&str, &[&str]) = if fs == "ext4" {
            std::fs::write(
                format!("/sys/fs/ext4/{device}/trigger_fs_error"),
                "localvol test: an error",
            )
            .unwrap();
            (
                "its ext4 filesystem recorded 1 error since its last fsck",
                &["e2fsck", "-f", "-y"],
            )
        } else {
            let out = std::process::Command::new("xfs_io")
                .args(["-x", "-c", "shutdown"])
                .arg(d.path("stage"))
                .output()
                .unwrap();
            assert!(out.status.success(), "xfs_io: {out:?}");
            ("its xfs filesystem answers I/O errors", &["xfs_repair"])
        };
        let c = condition().await;
        assert!(c.abnormal && c.message.starts_with(want), "{fs}: {c:?}");
        assert!(c.message.ends_with(&format!("(on /dev/{device})")), "{fs}: {c:?}");

        // Taken down, repaired as the message says, staged again: healthy.
        let csi = d.client().await;
        csi.unpublish(id, &d.path("target")).await.unwrap();
        csi.unstage(id, &d.path("stage")).await.unwrap();
        let out = std::process::Command::new(repair[0])
            .args(&repair[1..])
            .arg(&backing)
            .output()
            .unwrap();
        assert!(out.status.success(), "{repair:?}: {out:?}");
        stage(&d, id, &cap).await.unwrap();
        publish(&d, id, &cap, "target").await.unwrap();
        let c = condition().await;
        assert!(!c.abnormal, "{fs} after {}: {c:?}", repair[0]);
        teardown(&d, id, "target").await;
    }
    d.stop().await;
}

/// What fails under a loop volume reaches its condition: the disk under the class's
/// images filled by something else (the sparse image's next first writes would fail)
/// until space is freed, then the image deleted while its device still holds it. The
/// class's images are on a 96 MiB ext4 of the test's own, so filling it touches
/// nothing else.
#[tokio::test]
async fn a_full_disk_or_a_deleted_image_under_a_loop_volume_is_abnormal() {
    use localvol_testkit::guest::sh;
    if !privileged() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("localvol-test-")
        .tempdir()
        .unwrap();
    let disk = dir.path().join("disk.img");
    let images = dir.path().join("data/loop");
    std::fs::create_dir_all(&images).unwrap();
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(96 * MIB as u64)
        .unwrap();
    sh("mkfs.ext4", &["-q", "-F", "-m", "0", disk.to_str().unwrap()]);
    sh(
        "mount",
        &["-o", "loop", disk.to_str().unwrap(), images.to_str().unwrap()],
    );
    // Whatever fails below, nothing of the test stays mounted or attached.
    let _cleanup = Cleanup {
        mounts: vec![
            images.clone(),
            dir.path().join("stage"),
            dir.path().join("target"),
        ],
        data: dir.path().to_path_buf(),
    };
    let d = InProcessDaemon::start_in(dir, &[]).await;
    let cap = mount_cap("ext4");
    let vol = create(&d, "pvc-loop-health", 32 * MIB, &cap).await;
    let id = &vol.volume_id;
    stage(&d, id, &cap).await.unwrap();
    publish(&d, id, &cap, "target").await.unwrap();
    let condition = || async { stats(&d, id, "target").await.volume_condition.unwrap() };
    assert!(!condition().await.abnormal, "{:?}", condition().await);

    // Something else takes the rest of the disk.
    let filler = images.join("filler");
    {
        let mut file = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0x5A; 64 << 10];
        while file.write_all(&chunk).is_ok() {}
        let _ = file.sync_all();
    }
    let c = condition().await;
    assert!(c.abnormal, "{c:?}");
    let want = format!(
        "the filesystem holding its image ({}/default) is full",
        images.display()
    );
    assert!(c.message.starts_with(&want), "{c:?}");
    std::fs::remove_file(&filler).unwrap();
    let c = condition().await;
    assert!(!c.abnormal, "space freed: {c:?}");

    // The image unlinked under the staged volume: its data lives on in the device only.
    let device = device_name_at(&d.path("stage"));
    let image = images.join(format!("default/{}.img", id.split_once('.').unwrap().1));
    std::fs::remove_file(&image).unwrap();
    let c = condition().await;
    assert!(c.abnormal, "{c:?}");
    assert!(
        c.message.starts_with(&format!(
            "its image {} was deleted while /dev/{device} still holds it",
            image.display()
        )),
        "{c:?}"
    );
    // Taken down as usual: the device is detached, the volume deleted.
    teardown(&d, id, "target").await;
    assert!(loops_under(&images).is_empty(), "{:?}", loops_under(&images));
    d.stop().await;
}

/// A loop device detached by hand under a published raw block volume (nothing holds a
/// device no one has open, so `losetup -d` detaches it at once; its node stays): the
/// volume's condition says so, the unpublish it asks for unmounts the bind, and a new
/// stage serves the same data, healthy.
#[tokio::test]
async fn a_loop_device_detached_under_a_published_block_volume_is_abnormal_until_staged_again() {
    use localvol_testkit::guest::sh;
    if !privileged() {
        return;
    }
    const MARKER: &[u8] = b"LOCALVOL-DETACHED-MARKER";
    let d = InProcessDaemon::start(&[]).await;
    // Whatever fails below, nothing of the test stays mounted or attached.
    let _cleanup = Cleanup {
        mounts: vec![d.path("stage"), d.path("target")],
        data: d.path(""),
    };
    let cap = block_cap();
    let vol = create(&d, "pvc-loop-detached", 16 * MIB, &cap).await;
    let id = &vol.volume_id;
    stage(&d, id, &cap).await.unwrap();
    publish(&d, id, &cap, "target").await.unwrap();
    let write_marker = || {
        let mut dev = std::fs::OpenOptions::new()
            .write(true)
            .open(d.path("target"))
            .unwrap();
        dev.write_all(MARKER).unwrap();
        dev.sync_all().unwrap();
    };
    let read_marker = || {
        let mut got = vec![0; MARKER.len()];
        std::fs::File::open(d.path("target"))
            .unwrap()
            .read_exact(&mut got)
            .unwrap();
        got
    };
    write_marker();
    let devices = loops_under(&d.path(""));
    assert_eq!(devices.len(), 1, "{devices:?}");
    sh("losetup", &["-d", &format!("/dev/{}", devices[0])]);
    assert!(loops_under(&d.path("")).is_empty());

    let c = stats(&d, id, "target").await.volume_condition.unwrap();
    assert!(c.abnormal, "{c:?}");
    assert!(c.message.starts_with("no loop device holds its image "), "{c:?}");
    assert!(
        c.message
            .contains("(detached outside localvol): unpublish and unstage the volume, and stage it again"),
        "{c:?}"
    );
    let csi = d.client().await;
    csi.unpublish(id, &d.path("target")).await.unwrap();
    assert!(
        mounts_under(&d.path("")).is_empty(),
        "{:?}",
        mounts_under(&d.path(""))
    );
    csi.unstage(id, &d.path("stage")).await.unwrap();
    stage(&d, id, &cap).await.unwrap();
    publish(&d, id, &cap, "target").await.unwrap();
    assert_eq!(read_marker(), MARKER);
    let c = stats(&d, id, "target").await.volume_condition.unwrap();
    assert!(!c.abnormal, "{c:?}");
    teardown(&d, id, "target").await;
    d.stop().await;
}

#[tokio::test]
async fn block_lifecycle_and_no_data_from_a_previous_tenant() {
    if !privileged() {
        return;
    }
    let d = InProcessDaemon::start(&[]).await;
    let cap = block_cap();
    let vol = create(&d, "pvc-block", 16 * MIB, &cap).await;
    stage(&d, &vol.volume_id, &cap).await.unwrap();
    publish(&d, &vol.volume_id, &cap, "dev").await.unwrap();
    publish(&d, &vol.volume_id, &cap, "dev").await.unwrap();
    {
        use std::os::unix::fs::FileTypeExt;
        assert!(
            std::fs::metadata(d.path("dev"))
                .unwrap()
                .file_type()
                .is_block_device()
        );
        let mut dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(d.path("dev"))
            .unwrap();
        dev.write_all(&[0xA5; 4096]).unwrap();
        dev.sync_all().unwrap();
        dev.seek(SeekFrom::Start(0)).unwrap();
        let mut back = vec![0; 4096];
        dev.read_exact(&mut back).unwrap();
        assert!(back.iter().all(|b| *b == 0xA5));
    }
    assert_eq!(bytes_total(&stats(&d, &vol.volume_id, "dev").await), 16 * MIB);
    let grown = try_expand(&d, &vol.volume_id, 32 * MIB, "dev", &cap)
        .await
        .unwrap();
    assert_eq!(grown, 32 * MIB, "the device sees the grown file");
    teardown(&d, &vol.volume_id, "dev").await;

    // The same name again is a new volume: it must read as zeros.
    let vol = create(&d, "pvc-block", 16 * MIB, &cap).await;
    stage(&d, &vol.volume_id, &cap).await.unwrap();
    publish(&d, &vol.volume_id, &cap, "dev").await.unwrap();
    let mut first = vec![0xFF; 4096];
    std::fs::File::open(d.path("dev"))
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    assert!(
        first.iter().all(|b| *b == 0),
        "a new volume never shows a previous tenant's bytes"
    );
    teardown(&d, &vol.volume_id, "dev").await;
    assert!(loops_under(d.dir.path()).is_empty());
    d.stop().await;
}

#[tokio::test]
async fn an_expansion_that_cannot_fit_fails_and_changes_nothing() {
    if !privileged() {
        return;
    }
    // The default loop class of the test daemon holds 1 GiB.
    let d = InProcessDaemon::start(&[]).await;
    let cap = mount_cap("xfs");
    let vol = create(&d, "pvc-too-big-to-grow", 320 * MIB, &cap).await;
    stage(&d, &vol.volume_id, &cap).await.unwrap();
    publish(&d, &vol.volume_id, &cap, "target").await.unwrap();
    std::fs::write(d.path("target/data"), b"kept").unwrap();
    let before = bytes_total(&stats(&d, &vol.volume_id, "target").await);
    let expand = |size: i64| csi::ControllerExpandVolumeRequest {
        volume_id: vol.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: size,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let status = d
        .controller()
        .await
        .controller_expand_volume(expand(4096 * MIB))
        .await
        .unwrap_err();
    // OUT_OF_RANGE, CSI's "unsupported capacity": external-resizer ends it as
    // infeasible instead of retrying.
    assert_eq!(status.code(), Code::OutOfRange, "{}", status.message());
    assert!(status.message().contains("bytes free"), "{}", status.message());
    // The node path (kubelet after a central resizer) refuses it the same way.
    let status = node_expand(&d, &vol.volume_id, 4096 * MIB, "target", &cap)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{}", status.message());
    assert_eq!(bytes_total(&stats(&d, &vol.volume_id, "target").await), before);
    assert_eq!(std::fs::read(d.path("target/data")).unwrap(), b"kept");
    // A size that fits still works afterwards.
    let grown = try_expand(&d, &vol.volume_id, 640 * MIB, "target", &cap)
        .await
        .unwrap();
    assert_eq!(grown, 640 * MIB);
    assert_eq!(std::fs::read(d.path("target/data")).unwrap(), b"kept");
    let (_, metrics) = d.get("/metrics").await;
    for line in [
        r#"localvol_resize_operations_total{device_class="default",result="backend"} 1"#,
        r#"localvol_resize_operations_total{device_class="default",result="ok"} 1"#,
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
    teardown(&d, &vol.volume_id, "target").await;
    assert!(loops_under(d.dir.path()).is_empty());
    d.stop().await;
}

/// `limit_bytes` kept and GetCapacity's largest volume made on the loop class, which
/// allocates whole MiB (see tests/testkit/src/limits.rs).
#[tokio::test]
async fn limits_are_kept_and_the_largest_volume_fits() {
    let d = InProcessDaemon::start(&[]).await;
    let class = localvol_testkit::limits::Class {
        name: None,
        small: 4 * MIB as u64,
        large: 8 * MIB as u64,
        grows: true,
    };
    localvol_testkit::limits::check(&d.socket, class).await;
    d.stop().await;
}

#[tokio::test]
async fn state_survives_a_restart() {
    if !privileged() {
        return;
    }
    let d = InProcessDaemon::start(&[]).await;
    let cap = mount_cap("ext4");
    let vol = create(&d, "pvc-restart", 64 * MIB, &cap).await;
    stage(&d, &vol.volume_id, &cap).await.unwrap();
    std::fs::write(d.path("stage/kept"), b"before restart").unwrap();
    let dir = d.stop().await;

    // A new daemon knows the volume from disk and the mount table alone.
    let d = InProcessDaemon::start_in(dir, &[]).await;
    let listed = d
        .controller()
        .await
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 1);
    stage(&d, &vol.volume_id, &cap).await.unwrap();
    publish(&d, &vol.volume_id, &cap, "target").await.unwrap();
    assert_eq!(std::fs::read(d.path("target/kept")).unwrap(), b"before restart");
    teardown(&d, &vol.volume_id, "target").await;
    assert!(loops_under(d.dir.path()).is_empty());
    d.stop().await;
}

#[tokio::test]
async fn bad_requests_get_precise_codes_and_change_nothing() {
    if !privileged() {
        return;
    }
    let d = InProcessDaemon::start(&[]).await;
    let cap = mount_cap("ext4");
    let vol = create(&d, "pvc-bad", 16 * MIB, &cap).await;
    let files_before: Vec<_> = walk(d.dir.path());
    let stage_req =
        |id: &str, path: String, cap: Option<csi::VolumeCapability>| csi::NodeStageVolumeRequest {
            volume_id: id.to_string(),
            staging_target_path: path,
            volume_capability: cap,
            ..Default::default()
        };
    let good_path = d.path("stage").display().to_string();
    let escaping = format!("{}/../../etc", d.dir.path().display());
    let cases: Vec<(&str, csi::NodeStageVolumeRequest, Code)> = vec![
        (
            "empty id",
            stage_req("", good_path.clone(), Some(cap.clone())),
            Code::InvalidArgument,
        ),
        (
            "unknown volume",
            stage_req("default.nope", good_path.clone(), Some(cap.clone())),
            Code::NotFound,
        ),
        (
            "relative path",
            stage_req(&vol.volume_id, "stage".into(), Some(cap.clone())),
            Code::InvalidArgument,
        ),
        (
            "escaping path",
            stage_req(&vol.volume_id, escaping, Some(cap.clone())),
            Code::InvalidArgument,
        ),
        (
            "no capability",
            stage_req(&vol.volume_id, good_path.clone(), None),
            Code::InvalidArgument,
        ),
        (
            "unknown fs",
            stage_req(&vol.volume_id, good_path.clone(), Some(mount_cap("zfs"))),
            Code::InvalidArgument,
        ),
        (
            "block on fs volume",
            stage_req(&vol.volume_id, good_path.clone(), Some(block_cap())),
            Code::InvalidArgument,
        ),
    ];
    let mut node = d.node().await;
    for (what, req, expected) in cases {
        let status = node.node_stage_volume(req).await.unwrap_err();
        assert_eq!(status.code(), expected, "{what}: {}", status.message());
    }
    // A symlink in the staging path is refused before anything is attached.
    std::fs::create_dir(d.path("real")).unwrap();
    std::os::unix::fs::symlink(d.path("real"), d.path("link")).unwrap();
    let status = node
        .node_stage_volume(stage_req(
            &vol.volume_id,
            d.path("link").display().to_string(),
            Some(cap.clone()),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    std::fs::remove_file(d.path("link")).unwrap();
    std::fs::remove_dir(d.path("real")).unwrap();

    let mut controller = d.controller().await;
    let absurd = controller
        .create_volume(csi::CreateVolumeRequest {
            name: "pvc-absurd".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: i64::MAX,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap.clone()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(absurd.code(), Code::OutOfRange);
    let too_big = controller
        .create_volume(csi::CreateVolumeRequest {
            name: "pvc-too-big".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 2 << 30,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap.clone()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(too_big.code(), Code::ResourceExhausted, "{}", too_big.message());

    assert_eq!(
        walk(d.dir.path()),
        files_before,
        "refused requests leave the host as it was"
    );
    assert!(mounts_under(d.dir.path()).is_empty());
    assert!(loops_under(d.dir.path()).is_empty());
    d.stop().await;
}

#[tokio::test]
async fn identity_and_probe() {
    let d = InProcessDaemon::start(&[]).await;
    let mut identity = d.identity().await;
    let info = identity
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "localvol.csi.dev");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    let probe = identity.probe(csi::ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    let node_info = d
        .node()
        .await
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node_info.node_id, "test-node");
    let topology: HashMap<_, _> = node_info.accessible_topology.unwrap().segments;
    assert_eq!(
        topology.get("topology.localvol.csi.dev/node").map(String::as_str),
        Some("test-node")
    );
    d.stop().await;
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        out.push(path.display().to_string());
        if entry.file_type().unwrap().is_dir() {
            out.extend(walk(&path));
        }
    }
    out.sort();
    out
}

/// The running kernel's major and minor version.
fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut numbers = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse().unwrap_or(0));
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
}

/// statmount(2), the short way stats take, says of a path what the mount table says:
/// for a mount, a bind of it, a bind of a subdirectory, a mount stacked over another, a
/// read-only bind, a directory inside a mount, and this host's root and /proc.
#[tokio::test]
async fn statmount_agrees_with_the_mount_table() {
    use localvol::host::{Syscalls, SystemSyscalls};
    use localvol::mount::MountTable;
    use nix::mount::{MsFlags, mount};
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name);
    for name in ["fs", "bind", "sub", "stacked", "ro", "rofs", "rofs-bind"] {
        std::fs::create_dir(at(name)).unwrap();
    }
    let none = None::<&str>;
    let _cleanup = localvol_testkit::Cleanup {
        mounts: [
            "fs",
            "bind",
            "sub",
            "stacked",
            "stacked",
            "ro",
            "rofs",
            "rofs-bind",
        ]
        .iter()
        .map(|n| at(n))
        .collect(),
        data: at("no-loop-devices"),
    };
    mount(
        Some("lv-test"),
        &at("fs"),
        Some("tmpfs"),
        MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    std::fs::create_dir(at("fs/dir")).unwrap();
    mount(Some(&at("fs")), &at("bind"), none, MsFlags::MS_BIND, none).unwrap();
    mount(Some(&at("fs/dir")), &at("sub"), none, MsFlags::MS_BIND, none).unwrap();
    mount(Some(&at("fs")), &at("stacked"), none, MsFlags::MS_BIND, none).unwrap();
    mount(
        Some("lv-over"),
        &at("stacked"),
        Some("tmpfs"),
        MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    mount(Some(&at("fs")), &at("ro"), none, MsFlags::MS_BIND, none).unwrap();
    let remount = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
    mount(none, &at("ro"), none, remount, none).unwrap();
    // A filesystem read-only for every mount of it, and a writable bind of it: the
    // shape of an ext4 the kernel turned read-only after an error.
    mount(
        Some("lv-rofs"),
        &at("rofs"),
        Some("tmpfs"),
        MsFlags::MS_RDONLY,
        Some("size=1m"),
    )
    .unwrap();
    mount(Some(&at("rofs")), &at("rofs-bind"), none, MsFlags::MS_BIND, none).unwrap();
    let writable = MsFlags::MS_BIND | MsFlags::MS_REMOUNT;
    mount(none, &at("rofs-bind"), none, writable, none).unwrap();

    let syscalls = SystemSyscalls;
    // Before Linux 6.8 (the tests/vm guest runs 6.1) there is no statmount: the call
    // must say so with ENOSYS, which sends stats the long way, through the table.
    if kernel_version() < (6, 8) {
        let unsupported = syscalls.mount_at(&at("fs")).await.unwrap_err();
        assert_eq!(unsupported.errno(), Some(libc::ENOSYS), "{unsupported}");
        return;
    }
    let table = MountTable::parse(&syscalls.mountinfo().await.unwrap()).unwrap();
    let paths = [
        "fs",
        "bind",
        "sub",
        "stacked",
        "ro",
        "rofs",
        "rofs-bind",
        "fs/dir",
    ]
    .map(at);
    for path in paths
        .iter()
        .map(|p| p.as_path())
        .chain([std::path::Path::new("/"), "/proc".as_ref()])
    {
        let fast = syscalls.mount_at(path).await.unwrap();
        let slow = table.at(path).map(|e| e.mounted_at());
        assert_eq!(fast, slow, "{}", path.display());
    }
    // The cases the comparison must have covered.
    let sub = syscalls.mount_at(&at("sub")).await.unwrap().unwrap();
    assert_eq!(sub.root, std::path::Path::new("/dir"));
    let fs = syscalls.mount_at(&at("fs")).await.unwrap().unwrap();
    let stacked = syscalls.mount_at(&at("stacked")).await.unwrap().unwrap();
    assert_ne!(
        (stacked.major, stacked.minor),
        (fs.major, fs.minor),
        "the mount on top"
    );
    let ro = syscalls.mount_at(&at("ro")).await.unwrap().unwrap();
    assert!(ro.read_only && !ro.sb_read_only, "{ro:?}");
    let rofs_bind = syscalls.mount_at(&at("rofs-bind")).await.unwrap().unwrap();
    assert!(!rofs_bind.read_only && rofs_bind.sb_read_only, "{rofs_bind:?}");
    assert_eq!(syscalls.mount_at(&at("fs/dir")).await.unwrap(), None);
}
