//! What a killed or finished `ndctl create-namespace`/`destroy-namespace` leaves in a
//! region, as the VM crash test found it, and how the backend reads it.

use super::*;

#[tokio::test]
async fn a_destroyed_namespace_left_as_a_named_seed_is_not_a_volume() {
    let (f, token) = Fixture::with_volume(VolumeMode::Filesystem).await;
    let b = &f.backend;
    b.delete(&token).await.unwrap();
    let seeds = f.region.lock().unwrap().namespaces.clone();
    assert_eq!(
        seeds.len(),
        1,
        "the kernel keeps the destroyed namespace as a seed"
    );
    assert_eq!(
        (seeds[0].raw, seeds[0].name.clone()),
        (0, Some(namespace_name(&token)))
    );
    assert!(b.get(&token).await.unwrap().is_none());
    // The same name again (a claim recreated, a retried create): a new namespace, not
    // NameTaken, and never the seed.
    let again = b
        .create(&spec("pvc-1", 62 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    assert_eq!(again.size_bytes, ndctl::fsdax_usable(64 * MIB));
    assert_eq!(f.names(), [namespace_name(&token)]);
    b.delete(&token).await.unwrap();
    assert!(f.names().is_empty() && f.records().is_empty());
}

#[tokio::test]
async fn a_namespace_left_disabled_by_a_killed_create_is_destroyed_on_retry() {
    let (f, token) = Fixture::with_volume(VolumeMode::Filesystem).await;
    // As if the daemon and its ndctl died inside create-namespace: a pending record and
    // a named fsdax namespace, disabled, with no size in the listing.
    let mut file = f.backend.read_record(&token).await.unwrap().unwrap();
    file.pending = true;
    f.backend.write_record(&token, &file).await.unwrap();
    {
        let mut region = f.region.lock().unwrap();
        region.namespaces[0].half_made = true;
        region.namespaces[0].enabled = false;
    }
    // The restarted daemon opens the class (the listing parses) and the replayed create
    // destroys the half-made namespace before it makes the volume's.
    let host = Host {
        commands: f.commands.clone(),
        syscalls: Arc::new(FakeSyscalls::default()),
    };
    let restarted = PmemBackend::open(
        ClassName::parse("pmem").unwrap(),
        "region0".into(),
        f.backend.dir.clone(),
        host,
    )
    .await
    .unwrap();
    assert!(restarted.get(&token).await.unwrap().is_none());
    let before = f.changes().len();
    restarted
        .create(&spec("pvc-1", 62 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    assert_eq!(
        f.changes()[before..before + 2],
        [
            "ndctl destroy-namespace -f namespace0.0",
            "ndctl create-namespace -r region0 -m fsdax -M dev -s 67108864 -n pvc-1",
        ]
    );
    assert!(restarted.get(&token).await.unwrap().is_some());
    assert_eq!(f.names(), ["pvc-1"]);
}

#[tokio::test]
async fn a_namespace_left_mid_setup_is_reset_before_the_next_create() {
    let (f, token) = Fixture::with_volume(VolumeMode::Filesystem).await;
    f.backend.delete(&token).await.unwrap();
    // As if ndctl died after writing the seed's uuid and name, before its size: the
    // region holds nothing, and the kernel refuses that namespace a new uuid.
    f.region.lock().unwrap().namespaces[0].uuid_set = true;
    f.backend.cache.invalidate();
    let before = f.changes().len();
    f.backend
        .create(&spec("pvc-2", 62 * MIB, VolumeMode::Filesystem))
        .await
        .expect("the first create after the interruption succeeds");
    assert_eq!(
        f.changes()[before..],
        [
            "ndctl destroy-namespace -f namespace0.0",
            "ndctl create-namespace -r region0 -m fsdax -M dev -s 67108864 -n pvc-2",
        ]
    );
    assert_eq!(f.names(), ["pvc-2"]);
    // A clean seed is never reset.
    let before = f.changes().len();
    f.backend
        .create(&spec("pvc-3", 62 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    assert_eq!(
        f.changes()[before..],
        ["ndctl create-namespace -r region0 -m fsdax -M dev -s 67108864 -n pvc-3"]
    );
}
