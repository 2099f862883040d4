//! Node calls that ask the kernel about their paths (statmount) instead of reading the
//! whole mount table, and what they do where it cannot answer.

use super::*;

#[tokio::test]
async fn stats_ask_the_kernel_for_the_one_mount_not_the_whole_table() {
    let f = Fixture::new();
    let id = f.create("pvc-1", ext4()).await;
    f.stage(&f.stage_req(&id, ext4())).await.unwrap();
    std::fs::create_dir_all(f.path("target")).unwrap();
    f.publish(&f.publish_req(&id, "target", ext4(), false))
        .await
        .unwrap();
    let (f, id) = (&f, &id);
    let stats = |path: &str| {
        let req = f.stats_req(id, path);
        async move { f.volumes.stats(&req).await }
    };
    let reads = f.syscalls.mountinfo_reads();
    let answer = stats("target").await.unwrap();
    assert!(matches!(answer.usage, Usage::Filesystem(_)), "{answer:?}");
    assert_eq!(f.syscalls.mountinfo_reads(), reads, "answered from statmount");

    // What statmount cannot confirm goes the long way, with the answer it always had:
    // a path holding something else, and a path holding nothing.
    f.mount_tmpfs("target").await;
    let err = stats("target").await.unwrap_err();
    assert!(matches!(err, VolumeError::NotAtPath { .. }), "{err:?}");
    let err = stats("elsewhere").await.unwrap_err();
    assert!(matches!(err, VolumeError::NotAtPath { .. }), "{err:?}");
    assert_eq!(f.syscalls.mountinfo_reads(), reads + 2);

    // A kernel before statmount (Linux 6.8): the table, and the same answer.
    f.syscalls.umount(&f.path("target")).await.unwrap();
    f.syscalls.without_statmount();
    let answer = stats("target").await.unwrap();
    assert!(matches!(answer.usage, Usage::Filesystem(_)), "{answer:?}");
    assert_eq!(f.syscalls.mountinfo_reads(), reads + 3);
}

#[tokio::test]
async fn publish_and_unpublish_ask_the_kernel_about_their_paths_not_the_whole_table() {
    let f = Fixture::new();
    let id = f.create("pvc-1", ext4()).await;
    f.stage(&f.stage_req(&id, ext4())).await.unwrap();
    let (f, id) = (&f, &id);
    let writer = |target: &str, mode: AccessMode| PublishRequest {
        capability: Capability { access: ext4(), mode },
        ..f.publish_req(id, target, ext4(), false)
    };
    let unpublish = |target: &str| {
        let req = UnpublishRequest {
            id: id.clone(),
            target_path: f.host_path(target),
        };
        async move {
            let guard = f.locks.try_lock(&req.id.token, "unpublish").unwrap();
            f.volumes.unpublish(&guard, &req).await
        }
    };
    let reads = f.syscalls.mountinfo_reads();
    // The staging path shows this volume and the target does not exist: nothing to
    // read the table for, and the same bind as ever.
    f.publish(&writer("a", AccessMode::SingleNodeWriter))
        .await
        .unwrap();
    assert_eq!(f.syscalls.mount_points(), vec![f.path("stage"), f.path("a")]);
    unpublish("a").await.unwrap();
    assert_eq!(f.syscalls.mount_points(), vec![f.path("stage")]);
    assert!(!f.path("a").exists(), "the target publish made is gone");
    assert_eq!(f.syscalls.mountinfo_reads(), reads, "answered from statmount");

    // An empty directory is as clear as no target.
    std::fs::create_dir(f.path("b")).unwrap();
    f.publish(&writer("b", AccessMode::SingleNodeWriter))
        .await
        .unwrap();
    assert_eq!(f.syscalls.mountinfo_reads(), reads);

    // What the kernel cannot prove by path goes the long way, with the answer it always
    // had: a retry onto the publication (done), a single writer (published nowhere
    // else: only the table shows that), a target with something in it.
    f.publish(&writer("b", AccessMode::SingleNodeWriter))
        .await
        .unwrap();
    assert_eq!(f.syscalls.mountinfo_reads(), reads + 1);
    let err = f
        .publish(&writer("c", AccessMode::SingleNodeSingleWriter))
        .await
        .unwrap_err();
    assert!(matches!(err, VolumeError::SingleWriter { .. }), "{err:?}");
    assert_eq!(f.syscalls.mountinfo_reads(), reads + 2);
    std::fs::create_dir_all(f.path("d/inside")).unwrap();
    f.mount_tmpfs("d/inside").await;
    let err = f
        .publish(&writer("d", AccessMode::SingleNodeWriter))
        .await
        .unwrap_err();
    assert!(matches!(err, VolumeError::Occupied { .. }), "{err:?}");
    assert_eq!(f.syscalls.mountinfo_reads(), reads + 3);
    // Another mount on top of the publication: unpublish names it from the table.
    f.mount_tmpfs("b").await;
    let err = unpublish("b").await.unwrap_err();
    assert!(matches!(err, VolumeError::Occupied { .. }), "{err:?}");
    assert_eq!(f.syscalls.mountinfo_reads(), reads + 4);
    f.syscalls.umount(&f.path("b")).await.unwrap();
    unpublish("b").await.unwrap();
    assert_eq!(f.syscalls.mountinfo_reads(), reads + 4);

    // A kernel before statmount (Linux 6.8): the table, and the same binds.
    f.syscalls.without_statmount();
    f.publish(&writer("e", AccessMode::SingleNodeWriter))
        .await
        .unwrap();
    assert_eq!(f.syscalls.mountinfo_reads(), reads + 5);
    unpublish("e").await.unwrap();
    assert_eq!(f.syscalls.mountinfo_reads(), reads + 6);
    assert_eq!(
        f.syscalls.mount_points(),
        vec![f.path("stage"), f.path("d/inside")]
    );
}

#[tokio::test]
async fn a_first_stage_asks_the_kernel_about_its_path_and_looks_for_the_device_once() {
    let f = Fixture::new();
    let lists = || {
        f.syscalls
            .calls()
            .iter()
            .filter(|c| c.starts_with("list loop devices"))
            .count()
    };
    let stage_at = |id: &VolumeId, path: &str, access: AccessType| {
        std::fs::create_dir_all(f.path(path)).unwrap();
        StageRequest {
            staging_path: f.host_path(path),
            ..f.stage_req(id, access)
        }
    };
    // Three volumes attached at once: two more loop devices than the fixture's.
    for (device, minor) in [("/dev/loop8", 8), ("/dev/loop9", 9)] {
        f.syscalls.add_device(device, 7, minor, 64 << 20);
        f.syscalls.add_free_loop(device);
    }
    let id = f.create("pvc-1", ext4()).await;
    let block = f.create("pvc-b", AccessType::Block).await;
    let (reads, listed) = (f.syscalls.mountinfo_reads(), lists());
    // Nothing at or below the staging path, and the volume on no device: no table, and
    // one look for the device (attaching does not look again).
    f.stage(&stage_at(&id, "stage", ext4())).await.unwrap();
    assert_eq!(f.syscalls.mount_points(), vec![f.path("stage")]);
    assert_eq!(f.syscalls.mountinfo_reads(), reads, "answered from statmount");
    assert_eq!(lists(), listed + 1);
    f.stage(&stage_at(&block, "stage-b", AccessType::Block))
        .await
        .unwrap();
    assert_eq!(f.syscalls.mountinfo_reads(), reads);
    assert_eq!(lists(), listed + 2);

    // What the kernel cannot prove free goes the long way, with the answer it always
    // had: a retry onto the staged volume (done, nothing mounted again), another mount
    // at the path or below it (refused), a raw block volume's staging path in use.
    f.stage(&stage_at(&id, "stage", ext4())).await.unwrap();
    assert_eq!(f.syscalls.mount_points(), vec![f.path("stage")]);
    assert_eq!(f.syscalls.mountinfo_reads(), reads + 1);
    let other = f.create("pvc-2", ext4()).await;
    std::fs::create_dir_all(f.path("taken")).unwrap();
    f.mount_tmpfs("taken").await;
    let err = f.stage(&stage_at(&other, "taken", ext4())).await.unwrap_err();
    assert!(matches!(err, VolumeError::Occupied { .. }), "{err:?}");
    std::fs::create_dir_all(f.path("hiding/inside")).unwrap();
    f.mount_tmpfs("hiding/inside").await;
    let err = f.stage(&stage_at(&other, "hiding", ext4())).await.unwrap_err();
    assert!(matches!(err, VolumeError::Occupied { .. }), "{err:?}");
    let err = f
        .stage(&stage_at(&block, "taken", AccessType::Block))
        .await
        .unwrap_err();
    assert!(matches!(err, VolumeError::Occupied { .. }), "{err:?}");
    assert_eq!(f.syscalls.mountinfo_reads(), reads + 4);
    assert_eq!(
        f.syscalls.mount_points(),
        vec![f.path("stage"), f.path("taken"), f.path("hiding/inside")]
    );

    // A kernel before statmount (Linux 6.8): the table, and the same mount.
    f.syscalls.without_statmount();
    f.stage(&stage_at(&other, "stage-2", ext4())).await.unwrap();
    assert_eq!(f.syscalls.mountinfo_reads(), reads + 5);
    assert_eq!(f.syscalls.mount_points().last(), Some(&f.path("stage-2")));
}
