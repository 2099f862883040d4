//! A volume's staging path named as a target, and a target named as its staging path
//! (issue 33). In the mount table the staging mount and a bind of it at a target are the
//! same mount of the volume's filesystem root, so the ownership proof passes both; what
//! tells them apart is what this daemon mounted where. Each refusal is INVALID_ARGUMENT
//! naming the volume and the path, and leaves every mount and directory as it was.

use super::*;

fn code(err: VolumeError) -> tonic::Code {
    crate::error::Error::from(err).code()
}

impl Fixture {
    fn unstage_req(&self, id: &VolumeId, staging: &str) -> UnstageRequest {
        UnstageRequest {
            id: id.clone(),
            staging_path: self.host_path(staging),
        }
    }

    async fn unstage(&self, id: &VolumeId, staging: &str) -> Result<(), VolumeError> {
        let guard = self.locks.try_lock(&id.token, "unstage").unwrap();
        self.volumes.unstage(&guard, &self.unstage_req(id, staging)).await
    }

    /// The mounts and unmounts made so far.
    fn mount_calls(&self) -> Vec<String> {
        self.syscalls
            .calls()
            .into_iter()
            .filter(|c| c.starts_with("mount ") || c.starts_with("umount "))
            .collect()
    }
}

/// The refusal names the field, the volume and the path.
fn assert_refused(err: VolumeError, field: &str, id: &VolumeId, path: &Path) {
    let message = err.to_string();
    assert_eq!(code(err), tonic::Code::InvalidArgument, "{message}");
    assert!(message.starts_with(&format!("{field}: ")), "{message}");
    assert!(message.contains(&id.to_string()), "{message}");
    assert!(message.contains(&path.display().to_string()), "{message}");
}

#[tokio::test]
async fn unpublish_at_the_volumes_own_staging_path_is_refused_and_unmounts_nothing() {
    let f = Fixture::new();
    let id = f.published("pvc-1", "target").await;
    let mounts = f.mount_calls();

    let err = f.unpublish(&id, "stage").await.unwrap_err();
    assert_refused(err, "target_path", &id, &f.path("stage"));
    assert_eq!(f.mount_calls(), mounts, "nothing mounted or unmounted");
    assert_eq!(f.syscalls.mount_points(), vec![f.path("stage"), f.path("target")]);
    assert!(f.path("stage").is_dir(), "the staging directory is kept");

    // The legitimate order still works, and then the path is a stage no more.
    f.unpublish(&id, "target").await.unwrap();
    f.unstage(&id, "stage").await.unwrap();
    assert!(f.syscalls.mount_points().is_empty());
    f.unpublish(&id, "stage").await.unwrap();
}

/// The record outlives the daemon: after a restart, with the volume staged and
/// published, every call naming a path in the other role is refused as before.
#[tokio::test]
async fn a_restarted_daemon_still_tells_the_stage_from_a_target() {
    let mut f = Fixture::new();
    let id = f.published("pvc-1", "target").await;
    f.restart();
    let mounts = f.mount_calls();
    let err = f.unpublish(&id, "stage").await.unwrap_err();
    assert_refused(err, "target_path", &id, &f.path("stage"));
    let err = f.unstage(&id, "target").await.unwrap_err();
    assert_refused(err, "staging_target_path", &id, &f.path("target"));
    assert_eq!(f.mount_calls(), mounts, "nothing mounted or unmounted");
    assert!(f.path("stage").is_dir());
    // The legitimate teardown forgets every path, on disk too.
    f.unpublish(&id, "target").await.unwrap();
    f.unstage(&id, "stage").await.unwrap();
    assert!(f.syscalls.mount_points().is_empty());
    assert_eq!(std::fs::read_dir(f.path("placed")).unwrap().count(), 0);

    // A raw block volume's staging directory, which holds no mount at all.
    let block = f.create("pvc-b", AccessType::Block).await;
    f.stage(&f.stage_req(&block, AccessType::Block)).await.unwrap();
    f.restart();
    let err = f.unpublish(&block, "stage").await.unwrap_err();
    assert_refused(err, "target_path", &block, &f.path("stage"));
    assert!(f.path("stage").is_dir(), "the staging directory is kept");
    f.unstage(&block, "stage").await.unwrap();
    assert_eq!(std::fs::read_dir(f.path("placed")).unwrap().count(), 0);
}

/// A deleted volume leaves no record behind: its paths may be anyone's next.
#[tokio::test]
async fn delete_forgets_the_volumes_paths() {
    let f = Fixture::new();
    let id = f.create("pvc-1", ext4()).await;
    f.stage(&f.stage_req(&id, ext4())).await.unwrap();
    assert!(f.path("placed").join(id.to_string()).is_file());
    // A crash between the unmount and the record's update leaves a stale path; the
    // volume's deletion drops it.
    f.syscalls.umount(&f.path("stage")).await.unwrap();
    f.syscalls.loop_detach(Path::new(LOOP_DEV)).await.unwrap();
    let guard = f.locks.try_lock(&id.token, "delete").unwrap();
    f.volumes.delete(&guard, &id).await.unwrap();
    assert!(!f.path("placed").join(id.to_string()).exists());
}

#[tokio::test]
async fn unpublish_at_the_staging_path_is_refused_with_no_publication_too() {
    let f = Fixture::new();
    let id = f.create("pvc-1", ext4()).await;
    f.stage(&f.stage_req(&id, ext4())).await.unwrap();
    let err = f.unpublish(&id, "stage").await.unwrap_err();
    assert_refused(err, "target_path", &id, &f.path("stage"));
    assert_eq!(f.syscalls.mount_points(), vec![f.path("stage")]);
    // Publish still finds the volume staged there.
    f.publish(&f.publish_req(&id, "target", ext4(), false))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_raw_block_volumes_staging_directory_is_no_target_either() {
    let f = Fixture::new();
    let id = f.published_as("pvc-b", "dev", AccessType::Block).await;
    let err = f.unpublish(&id, "stage").await.unwrap_err();
    assert_refused(err, "target_path", &id, &f.path("stage"));
    // kubelet skips NodeUnstageVolume when the block staging directory is gone.
    assert!(f.path("stage").is_dir(), "the staging directory is kept");
    assert_eq!(f.syscalls.mount_points(), vec![f.path("dev")]);
    f.unpublish(&id, "dev").await.unwrap();
    f.unstage(&id, "stage").await.unwrap();
}

#[tokio::test]
async fn a_target_named_as_the_staging_path_is_refused_by_every_call() {
    let f = Fixture::new();
    let id = f.published("pvc-1", "target").await;
    let mounts = f.mount_calls();
    let target = f.path("target");

    let err = f.unstage(&id, "target").await.unwrap_err();
    assert_refused(err, "staging_target_path", &id, &target);
    let mut stage = f.stage_req(&id, ext4());
    stage.staging_path = f.host_path("target");
    let err = f.stage(&stage).await.unwrap_err();
    assert_refused(err, "staging_target_path", &id, &target);
    // The two paths swapped: the target as the staging path, the staging path as target.
    let mut swapped = f.publish_req(&id, "stage", ext4(), false);
    swapped.staging_path = f.host_path("target");
    let err = f.publish(&swapped).await.unwrap_err();
    assert_refused(err, "target_path", &id, &f.path("stage"));
    let mut from_target = f.publish_req(&id, "other", ext4(), false);
    from_target.staging_path = f.host_path("target");
    let err = f.publish(&from_target).await.unwrap_err();
    assert_refused(err, "staging_target_path", &id, &target);
    assert!(!f.path("other").exists(), "a refused publish creates nothing");

    assert_eq!(f.mount_calls(), mounts, "nothing mounted or unmounted");
    assert_eq!(f.syscalls.mount_points(), vec![f.path("stage"), target.clone()]);
    assert_eq!(f.loop_calls("LOOP_CLR_FD"), Vec::<String>::new(), "not detached");
    f.unpublish(&id, "target").await.unwrap();
    f.unstage(&id, "stage").await.unwrap();
    assert!(f.syscalls.mount_points().is_empty());
}

#[tokio::test]
async fn publish_at_above_or_below_the_staging_path_is_refused() {
    let f = Fixture::new();
    let id = f.create("pvc-1", ext4()).await;
    f.stage(&f.stage_req(&id, ext4())).await.unwrap();
    let mounts = f.mount_calls();
    let below = f.path("stage").join("pod");
    for target in [f.path("stage"), below.clone(), f.dir.path().to_path_buf()] {
        let mut req = f.publish_req(&id, "target", ext4(), false);
        req.target_path = HostPath::parse("t", target.to_str().unwrap()).unwrap();
        let err = f.publish(&req).await.unwrap_err();
        let message = err.to_string();
        assert_eq!(code(err), tonic::Code::InvalidArgument, "{target:?}: {message}");
    }
    assert!(!below.exists(), "nothing created below the staging path");
    assert_eq!(f.mount_calls(), mounts, "nothing mounted");
}

/// Paths inside a volume (below its staging path or a target) are no staging or target
/// paths of another volume either: a stage or publish there would make a directory in the
/// tenant's filesystem and mount over it, an unpublish would remove its empty directory.
#[tokio::test]
async fn paths_inside_another_volume_are_refused_and_left_as_they_are() {
    let f = Fixture::new();
    let a = f.create("pvc-a", ext4()).await;
    let other = f.create("pvc-f", ext4()).await;
    f.stage(&f.stage_req(&a, ext4())).await.unwrap();
    f.publish(&f.publish_req(&a, "target", ext4(), false))
        .await
        .unwrap();
    // Tenant A's empty directory, as the fake's unmounted paths show it.
    let empty = f.path("stage").join("a-empty");
    std::fs::create_dir(&empty).unwrap();
    let mounts = f.mount_calls();

    let guard = f.locks.try_lock(&other.token, "unpublish").unwrap();
    let unpublish = UnpublishRequest {
        id: other.clone(),
        target_path: HostPath::parse("t", empty.to_str().unwrap()).unwrap(),
    };
    let err = f.volumes.unpublish(&guard, &unpublish).await.unwrap_err();
    assert_refused(err, "target_path", &a, &empty);
    assert!(empty.is_dir(), "tenant A's empty directory is kept");
    drop(guard);

    let inside_target = f.path("target").join("f");
    let mut stage = f.stage_req(&other, ext4());
    stage.staging_path = HostPath::parse("s", inside_target.to_str().unwrap()).unwrap();
    let err = f.stage(&stage).await.unwrap_err();
    assert_refused(err, "staging_target_path", &a, &inside_target);
    let mut publish = f.publish_req(&other, "target", ext4(), false);
    publish.target_path = HostPath::parse("t", inside_target.to_str().unwrap()).unwrap();
    let err = f.publish(&publish).await.unwrap_err();
    assert_refused(err, "target_path", &a, &inside_target);
    assert!(!inside_target.exists(), "nothing made inside A");
    assert_eq!(f.mount_calls(), mounts, "nothing mounted or unmounted");
}
