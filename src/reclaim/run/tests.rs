//! The runner against fake syscalls and a real loop-backend directory: which mount it
//! trims, how usage is measured, and the busy, timeout, block and unstaged paths.

use std::time::Duration;

use super::*;
use crate::error::Error;
use crate::reclaim::testing::{DEV, Fixture, MIB};

#[tokio::test]
async fn trims_the_staged_filesystem_and_measures_the_image() {
    let f = Fixture::new(Duration::from_secs(60)).await;
    let id = f.create("pvc-1", VolumeMode::Filesystem).await;
    f.stage("pvc-1").await;
    f.fitrim_punches("pvc-1", Duration::ZERO);

    let outcome = f.runner.reclaim(&id, &[]).await.unwrap();
    let ReclaimOutcome::Trimmed(trim) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(trim.mount_point, f.path("stage"));
    assert_eq!(trim.measure, Measure::BackingStore);
    assert!(trim.before >= 4 * MIB, "{trim:?}");
    assert_eq!(trim.after, 0);
    assert_eq!(trim.reclaimed(), trim.before);
    assert_eq!(trim.trimmed_bytes, 60 * MIB);
    assert_eq!(f.fitrims(), vec![format!("FITRIM {}", f.path("stage").display())]);
    assert_eq!(f.runs("trimmed"), 1);
    assert_eq!(
        f.metrics
            .reclaim
            .reclaimed_bytes
            .with_label_values(&["default"])
            .get(),
        trim.before
    );
    assert_eq!(f.locks.held_count(), 0, "the lock is released");
    let last = f
        .states
        .get(&id)
        .and_then(|s| s.last_reclaim)
        .expect("last reclaim kept");
    assert_eq!(
        last.result,
        crate::volume_states::ReclaimResult::Trimmed {
            reclaimed_bytes: trim.before,
            trimmed_bytes: 60 * MIB,
        }
    );
}

#[tokio::test]
async fn a_named_path_must_hold_the_volume_and_is_the_one_trimmed() {
    let f = Fixture::new(Duration::from_secs(60)).await;
    let id = f.create("pvc-1", VolumeMode::Filesystem).await;
    f.stage("pvc-1").await;
    crate::mount::bind(&f.host(), &f.path("stage"), &f.path("target"), false)
        .await
        .unwrap();
    let path = |name: &str| {
        HostPath::confined("volume_path", f.path(name).to_str().unwrap(), f.runner.roots()).unwrap()
    };
    // A path holding nothing (or anything but this volume) is refused, and nothing is
    // trimmed, also when another named path does hold it.
    for paths in [vec![path("elsewhere")], vec![path("target"), path("elsewhere")]] {
        let err = f.runner.reclaim(&id, &paths).await.unwrap_err();
        assert_eq!(
            tonic::Status::from(Error::from(err)).code(),
            tonic::Code::NotFound
        );
    }
    assert!(f.fitrims().is_empty());
    f.runner
        .reclaim(&id, &[path("target"), path("stage")])
        .await
        .unwrap();
    assert_eq!(
        f.fitrims(),
        vec![format!("FITRIM {}", f.path("target").display())]
    );
}

#[tokio::test]
async fn without_paths_only_a_mount_below_a_kubelet_root_is_trimmed() {
    let f = Fixture::new(Duration::from_secs(60)).await;
    let id = f.create("pvc-1", VolumeMode::Filesystem).await;
    f.stage("pvc-1").await;
    let outside = std::path::Path::new("/localvol-test-outside-the-roots");
    crate::mount::bind(&f.host(), &f.path("stage"), outside, false)
        .await
        .unwrap();
    f.host().syscalls.umount(&f.path("stage")).await.unwrap();
    let err = f.runner.reclaim(&id, &[]).await.unwrap_err();
    assert!(matches!(err, ReclaimError::NotStaged { .. }), "{err}");
    assert!(f.fitrims().is_empty());
}

#[tokio::test]
async fn a_busy_volume_is_not_waited_for() {
    let f = Fixture::new(Duration::from_secs(60)).await;
    let id = f.create("pvc-1", VolumeMode::Filesystem).await;
    f.stage("pvc-1").await;
    let held = f.locks.try_lock(&id.token, "NodeUnstageVolume").unwrap();
    let err = f.runner.reclaim(&id, &[]).await.unwrap_err();
    assert!(matches!(err, ReclaimError::Busy(_)), "{err}");
    assert_eq!(tonic::Status::from(Error::from(err)).code(), tonic::Code::Aborted);
    assert!(f.fitrims().is_empty());
    assert_eq!(f.runs("busy"), 1);
    assert_eq!(f.states.get(&id), None, "a skipped run is no last reclaim");
    drop(held);
    f.runner.reclaim(&id, &[]).await.unwrap();
    assert_eq!(f.fitrims().len(), 1);
    assert!(f.states.get(&id).unwrap().last_reclaim.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_trim_keeps_the_volume_until_the_kernel_returns() {
    let f = Fixture::new(Duration::from_secs(10)).await;
    let id = f.create("pvc-1", VolumeMode::Filesystem).await;
    f.stage("pvc-1").await;
    f.fitrim_punches("pvc-1", Duration::from_secs(3600));

    let err = f.runner.reclaim(&id, &[]).await.unwrap_err();
    assert!(matches!(err, ReclaimError::TimedOut { .. }), "{err}");
    assert_eq!(
        tonic::Status::from(Error::from(err)).code(),
        tonic::Code::DeadlineExceeded
    );
    assert_eq!(f.runs("timeout"), 1);
    // The ioctl is still running: the volume stays locked.
    assert!(f.locks.try_lock(&id.token, "NodeUnstageVolume").is_err());
    tokio::time::sleep(Duration::from_secs(3600)).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(
        f.locks.try_lock(&id.token, "NodeUnstageVolume").is_ok(),
        "released once FITRIM returned"
    );
}

#[tokio::test]
async fn block_volumes_are_never_discarded() {
    let f = Fixture::new(Duration::from_secs(60)).await;
    let id = f.create("pvc-raw", VolumeMode::Block).await;
    f.stage("pvc-raw").await;
    let outcome = f.runner.reclaim(&id, &[]).await.unwrap();
    assert_eq!(outcome, ReclaimOutcome::NotDiscarded(Undiscarded::RawBlock));
    assert!(outcome.summary().contains("not discarded"));
    assert!(f.fitrims().is_empty());
    assert_eq!(f.runs("not_discarded"), 1);
    let data = std::fs::read(f.image("pvc-raw")).unwrap();
    assert!(data[..4 * MIB as usize].iter().all(|b| *b == 0xA5));
}

#[tokio::test]
async fn unstaged_and_unknown_volumes_are_errors() {
    let f = Fixture::new(Duration::from_secs(60)).await;
    let id = f.create("pvc-1", VolumeMode::Filesystem).await;
    let err = f.runner.reclaim(&id, &[]).await.unwrap_err();
    assert_eq!(
        tonic::Status::from(Error::from(err)).code(),
        tonic::Code::FailedPrecondition
    );
    // Attached but not mounted: still nothing to trim.
    f.syscalls.add_device(DEV, 7, 7, 64 * MIB);
    f.syscalls.attach_loop(DEV, f.image("pvc-1"));
    let err = f.runner.reclaim(&id, &[]).await.unwrap_err();
    assert!(matches!(err, ReclaimError::NotStaged { .. }), "{err}");
    let unknown = VolumeId::parse("default.pvc-nope").unwrap();
    let err = f.runner.reclaim(&unknown, &[]).await.unwrap_err();
    assert_eq!(
        tonic::Status::from(Error::from(err)).code(),
        tonic::Code::NotFound
    );
    assert!(f.fitrims().is_empty());
    assert_eq!(f.locks.held_count(), 0);
}

#[tokio::test]
async fn a_failing_fitrim_is_reported() {
    let f = Fixture::new(Duration::from_secs(60)).await;
    let id = f.create("pvc-1", VolumeMode::Filesystem).await;
    f.stage("pvc-1").await;
    f.syscalls.fail_next("FITRIM", libc::EOPNOTSUPP);
    let err = f.runner.reclaim(&id, &[]).await.unwrap_err();
    assert_eq!(err.label(), "syscall");
    match f.states.get(&id).and_then(|s| s.last_reclaim).map(|l| l.result) {
        Some(crate::volume_states::ReclaimResult::Failed { error }) => {
            assert!(error.contains("FITRIM"), "{error}")
        }
        other => panic!("the failure is kept as the last reclaim: {other:?}"),
    }
    let status = tonic::Status::from(Error::from(err));
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(status.message().contains("FITRIM"), "{}", status.message());
}

#[tokio::test]
async fn encrypted_volumes_are_discarded_only_when_their_class_lets_discards_through() {
    let f = Fixture::new(Duration::from_secs(60)).await;
    let id = f.create_encrypted("pvc-sealed", false).await;
    f.stage("pvc-sealed").await;
    let outcome = f.runner.reclaim(&id, &[]).await.unwrap();
    assert_eq!(
        outcome,
        ReclaimOutcome::NotDiscarded(Undiscarded::EncryptedWithoutDiscards)
    );
    assert!(
        outcome.summary().contains("localvol.csi.dev/encryption-discards"),
        "{}",
        outcome.summary()
    );
    assert!(f.fitrims().is_empty());
    assert_eq!(f.runs("not_discarded"), 1);

    let f = Fixture::new(Duration::from_secs(60)).await;
    let id = f.create_encrypted("pvc-open", true).await;
    f.stage("pvc-open").await;
    f.fitrim_punches("pvc-open", Duration::ZERO);
    let outcome = f.runner.reclaim(&id, &[]).await.unwrap();
    assert!(matches!(outcome, ReclaimOutcome::Trimmed(_)), "{outcome:?}");
    assert_eq!(f.fitrims().len(), 1);
}
