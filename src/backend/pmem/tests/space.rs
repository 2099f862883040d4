//! Too-big creates: refused before ndctl when the cached listing knows the free
//! sizes, by ndctl's own refusal once our own changes made them unknown. Either way
//! NoSpace, and no namespace or record is left.

use super::*;

#[tokio::test]
async fn too_big_is_no_space_and_leaves_nothing() {
    let f = Fixture::new().await;
    let err = f
        .backend
        .create(&spec("big", 2 << 30, VolumeMode::Filesystem))
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::NoSpace { .. }), "{err}");
    assert!(f.changes().is_empty(), "refused before ndctl");
    assert!(f.records().is_empty());

    // ndctl's own refusal (the region changed meanwhile) is NoSpace too, and undone.
    f.region.lock().unwrap().size = 32 * MIB;
    let err = f
        .backend
        .create(&spec("mid", 62 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::NoSpace { .. }), "{err}");
    assert!(f.records().is_empty(), "{:?}", f.records());
    assert!(f.names().is_empty());
}

#[tokio::test]
async fn after_our_own_changes_too_big_is_still_no_space_and_leaves_nothing() {
    let f = Fixture::new().await;
    let b = &f.backend;
    b.create(&spec("a", 62 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    b.delete(&Token::for_name("a")).await.unwrap();
    // The cached listing now knows the namespaces but not the free space: ndctl decides.
    let err = b
        .create(&spec("big", 2 << 30, VolumeMode::Filesystem))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::NoSpace { available, .. } if available == ndctl::fsdax_usable(1 << 30)),
        "{err}"
    );
    assert!(f.records().is_empty());
    assert!(f.names().is_empty());
}
