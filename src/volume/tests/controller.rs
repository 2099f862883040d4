//! The controller-side operations (create, expand, delete) against the fake host seams
//! of the parent module.

use super::*;

#[tokio::test]
async fn create_is_idempotent_by_name_and_refuses_incompatible_repeats() {
    let f = Fixture::new();
    let a = f.create("pvc-1", ext4()).await;
    let again = f.create("pvc-1", ext4()).await;
    assert_eq!(a, again);
    let mut req = create_req("pvc-1", ext4(), 128 << 20, Some(128 << 20));
    let guard = f.locks.try_lock(&req.token, "create").unwrap();
    let err = f.volumes.create(&guard, &req).await.unwrap_err();
    assert!(matches!(err, VolumeError::AlreadyExists { .. }), "{err}");
    // Too big for the class: nothing is left behind.
    req.name = "pvc-huge".into();
    req.token = crate::model::Token::for_name("pvc-huge");
    req.capacity = CapacityRange {
        required: 20 << 30,
        limit: None,
    };
    drop(guard);
    let guard = f.locks.try_lock(&req.token, "create").unwrap();
    let err = f.volumes.create(&guard, &req).await.unwrap_err();
    assert!(
        matches!(
            err,
            VolumeError::Backend(crate::backend::BackendError::NoSpace { .. })
        ),
        "{err}"
    );
    let files: Vec<_> = std::fs::read_dir(f.path("loop")).unwrap().collect();
    assert_eq!(files.len(), 2, "only pvc-1's image and record");
}

#[tokio::test]
async fn expand_beyond_the_class_is_no_room_to_grow_and_changes_nothing() {
    let f = Fixture::new();
    let id = f.create("pvc-1", ext4()).await;
    let image = f.path("loop").join(format!("{}.img", id.token));
    let before = std::fs::metadata(&image).unwrap().len();
    let guard = f.locks.try_lock(&id.token, "expand").unwrap();
    let req = ControllerExpandRequest {
        id: id.clone(),
        capacity: CapacityRange {
            required: 20 << 30,
            limit: None,
        },
        capability: None,
    };
    let err = f.volumes.expand(&guard, &req).await.unwrap_err();
    assert!(
        matches!(
            &err,
            VolumeError::NoRoomToGrow {
                id: failed,
                source: crate::backend::BackendError::NoSpace { .. },
            } if *failed == id
        ),
        "{err}"
    );
    assert_eq!(crate::error::Error::from(err).code(), tonic::Code::OutOfRange);
    assert_eq!(
        std::fs::metadata(&image).unwrap().len(),
        before,
        "the image kept its size"
    );
}

#[tokio::test]
async fn delete_refuses_an_attached_volume() {
    let f = Fixture::new();
    let id = f.create("pvc-1", ext4()).await;
    f.stage(&f.stage_req(&id, ext4())).await.unwrap();
    let guard = f.locks.try_lock(&id.token, "delete").unwrap();
    let err = f.volumes.delete(&guard, &id).await.unwrap_err();
    assert!(
        matches!(
            err,
            VolumeError::Backend(crate::backend::BackendError::InUse { .. })
        ),
        "{err}"
    );
    assert!(f.volumes.get(&id).await.is_ok(), "still there");
}

#[tokio::test]
async fn topology_of_another_node_is_refused() {
    let f = Fixture::new();
    let req = CreateRequest {
        topologies: vec![[(TOPOLOGY_KEY.to_string(), "node-b".to_string())].into()],
        ..create_req("pvc-t", ext4(), 1 << 20, None)
    };
    let guard = f.locks.try_lock(&req.token, "create").unwrap();
    let err = f.volumes.create(&guard, &req).await.unwrap_err();
    assert!(matches!(err, VolumeError::Topology { .. }), "{err}");
}

#[tokio::test]
async fn expand_keeps_the_limit_and_never_shrinks() {
    let f = Fixture::new();
    let id = f.create("pvc-1", ext4()).await; // 64 MiB
    let expand = |required: u64, limit: Option<u64>| crate::request::ControllerExpandRequest {
        id: id.clone(),
        capacity: CapacityRange { required, limit },
        capability: None,
    };
    let guard = f.locks.try_lock(&id.token, "expand").unwrap();
    let out_of_range =
        |r: Result<_, VolumeError>| matches!(r, Err(VolumeError::Invalid(ValidationError::OutOfRange(_))));
    // Below the current size: no size fits, the volume is left as it is.
    assert!(out_of_range(
        f.volumes.expand(&guard, &expand(1 << 20, Some(32 << 20))).await
    ));
    // Not a whole MiB within the limit: refused rather than rounded past it.
    let inexact = expand((96 << 20) + 1, Some((96 << 20) + 4096));
    assert!(out_of_range(f.volumes.expand(&guard, &inexact).await));
    assert_eq!(f.volumes.get(&id).await.unwrap().size_bytes, 64 << 20);
    let grown = f
        .volumes
        .expand(&guard, &expand(96 << 20, Some(96 << 20)))
        .await
        .unwrap();
    assert_eq!(grown.size_bytes, 96 << 20);
    // Already that size: a no-op within the limit.
    let again = f
        .volumes
        .expand(&guard, &expand(64 << 20, Some(96 << 20)))
        .await
        .unwrap();
    assert_eq!(again.size_bytes, 96 << 20);
}

/// NodeExpandVolume holds to the same limit: a volume already above it is refused with
/// OUT_OF_RANGE before anything is looked at or grown, not answered with its size.
#[tokio::test]
async fn node_expand_below_the_size_is_out_of_range_and_grows_nothing() {
    let f = Fixture::new();
    let id = f.create("pvc-1", ext4()).await; // 64 MiB
    f.stage(&f.stage_req(&id, ext4())).await.unwrap();
    let calls_before = (f.commands.calls().len(), f.syscalls.calls().len());
    let req = crate::request::NodeExpandRequest {
        id: id.clone(),
        volume_path: Some(f.host_path("stage")),
        staging_path: Some(f.host_path("stage")),
        capacity: CapacityRange {
            required: 32 << 20,
            limit: Some(32 << 20),
        },
        capability: None,
    };
    let guard = f.locks.try_lock(&id.token, "expand").unwrap();
    let err = f.volumes.expand_on_node(&guard, &req).await.unwrap_err();
    assert!(
        matches!(err, VolumeError::Invalid(ValidationError::OutOfRange(_))),
        "{err}"
    );
    assert_eq!((f.commands.calls().len(), f.syscalls.calls().len()), calls_before);
    assert_eq!(f.volumes.get(&id).await.unwrap().size_bytes, 64 << 20);
}

/// A new filesystem volume is never smaller than mkfs makes its filesystem: a small
/// xfs request is raised to xfs's 300 MiB when its limit allows (the volume reports
/// the size it has), and is OUT_OF_RANGE naming the minimum when not, with nothing
/// made. The type is the request's or, unnamed, the class's default (ext4 here, whose
/// minimum is below any allocation). Raw block volumes have no filesystem to fit.
#[tokio::test]
async fn a_filesystem_volume_is_at_least_what_mkfs_accepts() {
    let f = Fixture::new();
    let xfs = AccessType::Mount {
        fs_type: Some(crate::fs::FsType::Xfs),
        mount_flags: Vec::new(),
    };
    let unnamed = AccessType::Mount {
        fs_type: None,
        mount_flags: Vec::new(),
    };
    let xfs_min = crate::fs::FsType::Xfs.min_bytes();
    assert_eq!(xfs_min, 300 << 20);
    for (name, access, required, limit, size) in [
        ("xfs-small", xfs.clone(), 64 << 20, None, xfs_min),
        ("xfs-within", xfs.clone(), 64 << 20, Some(1 << 30), xfs_min),
        ("xfs-big", xfs.clone(), 320 << 20, None, 320 << 20),
        ("xfs-default", xfs.clone(), 0, Some(512 << 20), 512 << 20),
        ("ext4-tiny", ext4(), 1, None, 1 << 20),
        ("unnamed-tiny", unnamed.clone(), 1, None, 1 << 20),
        (
            "block-small",
            AccessType::Block,
            64 << 20,
            Some(64 << 20),
            64 << 20,
        ),
    ] {
        let req = create_req(name, access, required, limit);
        let guard = f.locks.try_lock(&req.token, "create").unwrap();
        let created = f.volumes.create(&guard, &req).await.unwrap();
        assert_eq!(created.record.size_bytes, size, "{name}");
        // A retry with the same request finds the volume it made.
        let again = f.volumes.create(&guard, &req).await.unwrap();
        assert_eq!(again.record, created.record, "{name}");
    }
    let made = std::fs::read_dir(f.path("loop")).unwrap().count();
    for (name, limit) in [
        ("xfs-capped", Some(64 << 20)),
        ("xfs-at-default", Some(299 << 20)),
    ] {
        let req = create_req(
            name,
            xfs.clone(),
            if name == "xfs-capped" { 64 << 20 } else { 0 },
            limit,
        );
        let guard = f.locks.try_lock(&req.token, "create").unwrap();
        let err = f.volumes.create(&guard, &req).await.unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("an xfs filesystem needs at least {xfs_min} bytes")),
            "{name}: {err}"
        );
        assert_eq!(
            crate::error::Error::from(err).code(),
            tonic::Code::OutOfRange,
            "{name}"
        );
    }
    assert_eq!(
        std::fs::read_dir(f.path("loop")).unwrap().count(),
        made,
        "nothing made"
    );
}
