//! NodeGetVolumeStats' condition for what the filesystem says of itself: I/O errors at
//! its root, a read-only turn the kernel made, ext4's error count; each clears when the
//! filesystem does.

use super::*;
use crate::host::FilesystemState;

#[tokio::test]
async fn a_filesystem_the_kernel_found_errors_in_is_abnormal_until_it_is_sound() {
    let f = Fixture::new();
    let id = f.published("pvc-1", "target").await;
    let req = crate::request::StatsRequest {
        id: id.clone(),
        volume_path: Some(f.host_path("target")),
    };
    let condition = || async {
        match f.volumes.stats(&req).await.unwrap() {
            VolumeStats::Filesystem { condition, .. } => condition,
            other => panic!("{other:?}"),
        }
    };
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
