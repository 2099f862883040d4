//! NodeGetVolumeStats' condition for what the filesystem says of itself (I/O errors at
//! its root, a read-only turn the kernel made, ext4's error count; each clears when the
//! filesystem does) and for what fails under a loop volume (its image deleted, the disk
//! under it full), and a raw block volume whose device node went while it was published.

use super::*;
use crate::host::FilesystemState;

#[tokio::test]
async fn a_filesystem_the_kernel_found_errors_in_is_abnormal_until_it_is_sound() {
    let f = Fixture::new();
    let id = f.published("pvc-1", "target").await;
    let condition = || f.condition(&id, "target");
    let healthy = condition().await;
    assert!(!healthy.abnormal, "{healthy:?}");
    let mount = f.syscalls.mount_at(&f.path("target")).await.unwrap().unwrap();
    let dev = (mount.major, mount.minor);

    f.syscalls.set_filesystem_state(
        dev,
        FilesystemState {
            root_errno: None,
            ext4_errors: Some(2),
        },
    );
    let c = condition().await;
    assert!(c.abnormal, "{c:?}");
    assert!(
        c.message
            .starts_with("its ext4 filesystem recorded 2 errors since its last fsck")
            && c.message.ends_with(&format!("(on {LOOP_DEV})")),
        "{c:?}"
    );

    f.syscalls.set_filesystem_read_only(dev, true);
    let c = condition().await;
    assert!(c.message.contains("made read-only by the kernel"), "{c:?}");

    f.syscalls.set_filesystem_state(
        dev,
        FilesystemState {
            root_errno: Some(libc::EIO),
            ext4_errors: Some(0),
        },
    );
    let c = condition().await;
    assert!(c.message.contains("answers I/O errors"), "{c:?}");

    // fsck'd and mounted again: healthy, as before.
    f.syscalls.set_filesystem_read_only(dev, false);
    f.syscalls.set_filesystem_state(
        dev,
        FilesystemState {
            root_errno: None,
            ext4_errors: Some(0),
        },
    );
    assert_eq!(condition().await, healthy);
}

/// A loop volume's image deleted under its device, and the disk under the images
/// filled by something else: each in the condition, in the backend's words.
#[tokio::test]
async fn a_loop_image_deleted_under_its_device_or_a_full_disk_is_reported() {
    let f = Fixture::new();
    let id = f.published("pvc-1", "target").await;
    let condition = || f.condition(&id, "target");
    let healthy = condition().await;
    assert!(!healthy.abnormal, "{healthy:?}");
    let image = f.path("loop").join(format!("{}.img", id.token));
    let disk = |available_bytes| crate::host::FsUsage {
        total_bytes: 100 << 30,
        available_bytes,
        ..crate::host::FsUsage::default()
    };

    f.syscalls.set_usage(disk(0));
    let c = condition().await;
    assert!(c.abnormal, "{c:?}");
    assert!(c.message.contains("/loop) is full (0 KiB free)"), "{c:?}");
    f.syscalls.set_usage(disk(50 << 30));
    assert_eq!(condition().await, healthy);

    f.syscalls.delete_loop_backing(Path::new(LOOP_DEV));
    let c = condition().await;
    assert_eq!(
        c.message,
        format!(
            "its image {} was deleted while {LOOP_DEV} still holds it: the data is lost once the \
             device is detached; copy it off the device before unstaging the volume",
            image.display()
        )
    );
}

/// A raw block volume whose device node is gone while what the backend last listed
/// still names it (a PMEM namespace disabled since the class's cached listing: the
/// listing gives `/dev/pmem0.1`, which no longer exists): the stats answer with the
/// condition, not an error for the missing node, and unpublish unmounts the bind.
#[tokio::test]
async fn a_block_volume_whose_listed_device_node_is_gone_is_abnormal_not_an_error() {
    let f = Fixture::new();
    let id = f.published_as("pvc-b", "target", AccessType::Block).await;
    assert!(!f.condition(&id, "target").await.abnormal);

    f.syscalls.remove_device(Path::new(LOOP_DEV));
    let stats = f.volumes.stats(&f.stats_req(&id, "target")).await.unwrap();
    assert!(stats.condition.abnormal, "{:?}", stats.condition);
    assert_eq!(stats.usage, Usage::Block { size_bytes: 64 << 20 });
    f.unpublish(&id, "target").await.unwrap();
    assert!(f.syscalls.mounts().is_empty(), "{:?}", f.syscalls.mounts());
}
