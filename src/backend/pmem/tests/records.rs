//! The record file beside each namespace: a create the daemon did not finish, the
//! format mark, and records written by older versions.

use super::*;

#[tokio::test]
async fn an_unfinished_create_is_redone_and_never_served() {
    let (f, token) = Fixture::with_volume(VolumeMode::Block).await;
    let b = &f.backend;
    // The daemon died after the namespace was made, before it was cleared.
    let mut file = b.read_record(&token).await.unwrap().unwrap();
    file.pending = true;
    b.write_record(&token, &file).await.unwrap();
    assert!(b.get(&token).await.unwrap().is_none());
    assert!(b.list().await.unwrap().is_empty());
    let before = f.changes().len();
    b.create(&spec("pvc-1", 62 * MIB, VolumeMode::Block))
        .await
        .unwrap();
    assert_eq!(
        f.changes()[before..],
        [
            "ndctl destroy-namespace -f namespace0.0",
            "ndctl create-namespace -r region0 -m fsdax -M dev -s 67108864 -n pvc-1",
            "blkdiscard -f -z /dev/pmem0.1",
        ]
    );
    assert_eq!(f.names(), ["pvc-1"]);
    assert!(b.get(&token).await.unwrap().is_some());
}

/// The `formatted` field of the record file of `name`, as written on disk.
fn formatted_field(f: &Fixture, name: &str) -> Option<bool> {
    let path = f.backend.dir.join(format!("{name}.json"));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    json.get("formatted").map(|v| v.as_bool().unwrap())
}

#[tokio::test]
async fn the_record_marks_a_format_from_before_mkfs_until_after_it() {
    let f = Fixture::new().await;
    let b = &f.backend;
    let token = Token::for_name("pvc-1");
    b.create(&spec("pvc-1", 30 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    // Like a loop record: unformatted from create on, so a kill anywhere before mkfs
    // finished is seen; the first stage's begin writes nothing more.
    assert_eq!(formatted_field(&f, "pvc-1"), Some(false));
    assert!(b.format_unfinished(&token).await.unwrap());
    b.begin_format(&token).await.unwrap();
    b.mark_formatted(&token).await.unwrap();
    assert_eq!(formatted_field(&f, "pvc-1"), Some(true));
    assert!(!b.format_unfinished(&token).await.unwrap());
    // A later format (the filesystem was wiped) is marked again.
    b.begin_format(&token).await.unwrap();
    assert_eq!(formatted_field(&f, "pvc-1"), Some(false));
    assert!(b.format_unfinished(&token).await.unwrap());
    assert!(
        f.changes().iter().all(|c| !c.contains("destroy")),
        "{:?}",
        f.changes()
    );

    // Block volumes are never formatted: no field.
    b.create(&spec("blk", 30 * MIB, VolumeMode::Block)).await.unwrap();
    assert_eq!(formatted_field(&f, "blk"), None);
    assert!(!b.format_unfinished(&Token::for_name("blk")).await.unwrap());
}

#[tokio::test]
async fn older_records_and_pending_creates_are_handled() {
    let f = Fixture::new().await;
    let b = &f.backend;
    let token = Token::for_name("old");
    b.create(&spec("old", 30 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    // A record written before the field existed: blkid alone decides, until a format.
    let path = b.dir.join("old.json");
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    json.as_object_mut().unwrap().remove("formatted");
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    assert!(!b.format_unfinished(&token).await.unwrap());
    b.begin_format(&token).await.unwrap();
    assert_eq!(formatted_field(&f, "old"), Some(false));

    // A pending record (create killed) is no volume: not unfinished, not markable.
    json["pending"] = serde_json::Value::Bool(true);
    json["formatted"] = serde_json::Value::Bool(false);
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    assert!(!b.format_unfinished(&token).await.unwrap());
    assert!(matches!(
        b.mark_formatted(&token).await,
        Err(BackendError::NotFound { .. })
    ));
    assert!(matches!(
        b.begin_format(&Token::for_name("none")).await,
        Err(BackendError::NotFound { .. })
    ));
}
