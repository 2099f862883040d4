//! Thin snapshots, restores and clones (see `lvm/snapshots.rs`).

use super::copies::thin_with_formatted;
use super::*;
use crate::backend::{CopySource, SnapshotSpec};

fn snap(name: &str, source: &str) -> SnapshotSpec {
    SnapshotSpec {
        token: Token::for_name(name),
        name: name.to_string(),
        source: Token::for_name(source),
        freeze: Some("/staged/pvc-1".into()),
    }
}

/// The changes so far, with the creation time tag (a clock reading) and the filesystem
/// UUID (chosen at random by the source's lvcreate) made fixed.
fn changes_without_time(f: &Fixture, seen: usize) -> Vec<String> {
    f.changes()[seen..]
        .iter()
        .map(|c| {
            c.split(' ')
                .map(|w| match w.strip_prefix("localvol.csi.dev/created=") {
                    Some(n) if n.parse::<u64>().is_ok() => "localvol.csi.dev/created=T",
                    _ if w
                        .strip_prefix("localvol.csi.dev/fs-uuid=")
                        .and_then(FsUuid::parse)
                        .is_some() =>
                    {
                        "localvol.csi.dev/fs-uuid=U"
                    }
                    _ => w,
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[tokio::test]
async fn a_snapshot_is_one_tagged_read_only_skipped_thin_snapshot_found_after_a_restart() {
    let f = Fixture::new(Some(true));
    let b = thin_with_formatted(&f).await;
    assert!(b.snapshots());
    let seen = f.changes().len();
    let record = b.create_snapshot(&snap("snap-1", "pvc-1")).await.unwrap();
    assert_eq!(
        changes_without_time(&f, seen),
        [
            "lvcreate -y -s -ky -pr -n s+snap-1 --addtag localvol.csi.dev/snapshot-class=thin \
             --addtag localvol.csi.dev/name=snap-1 --addtag localvol.csi.dev/source=pvc-1 \
             --addtag localvol.csi.dev/created=T --addtag localvol.csi.dev/source-size=67108864 \
             --addtag localvol.csi.dev/mode=filesystem --addtag localvol.csi.dev/fs=ext4 \
             --addtag localvol.csi.dev/format=formatting --addtag localvol.csi.dev/fs-uuid=U vg1/pvc-1",
        ],
        "one lvcreate, no FIFREEZE (lvcreate's suspend locks the filesystem)"
    );
    assert_eq!(record.id.to_string(), "snapshot.thin.snap-1");
    assert_eq!(record.source.to_string(), "thin.pvc-1");
    assert_eq!(record.size_bytes, 64 * MIB);
    assert_eq!(record.mode, VolumeMode::Filesystem);
    assert_eq!(record.fs_type, Some(FsType::Ext4));
    let age = std::time::SystemTime::now()
        .duration_since(record.created)
        .unwrap();
    assert!(age < std::time::Duration::from_secs(60), "{age:?}");

    // Again: returned as is, nothing run.
    let seen = f.changes().len();
    assert_eq!(b.create_snapshot(&snap("snap-1", "pvc-1")).await.unwrap(), record);
    assert_eq!(f.changes().len(), seen);

    // A restarted daemon reads it back from a fresh report; it is no volume.
    let b2 = f.restarted_thin(4.0).await;
    assert_eq!(b2.list_snapshots().await.unwrap(), std::slice::from_ref(&record));
    assert_eq!(
        b2.get_snapshot(&Token::for_name("snap-1")).await.unwrap(),
        Some(record)
    );
    let volumes: Vec<_> = b2.list().await.unwrap().into_iter().map(|r| r.name).collect();
    assert_eq!(volumes, ["pvc-1"]);
    assert_eq!(b2.get_snapshot(&Token::for_name("nope")).await.unwrap(), None);
}

/// A pool past its critical fill takes no snapshot, as it takes no volume, before any
/// lvcreate; one already taken is still answered as taken.
#[tokio::test(start_paused = true)]
async fn a_critical_pool_takes_no_new_snapshot() {
    let f = Fixture::new(Some(true));
    let b = thin_with_formatted(&f).await;
    let taken = b.create_snapshot(&snap("snap-1", "pvc-1")).await.unwrap();
    f.vg.lock().unwrap().pool_fill = Some((96.0, 10.0));
    past_the_report_ttl().await;
    let seen = f.changes().len();
    let err = b.create_snapshot(&snap("snap-2", "pvc-1")).await.unwrap_err();
    assert!(
        matches!(&err, BackendError::Lvm(LvmError::PoolUnusable { reason, .. })
            if reason == "thin pool vg1/pool0: data 96.0% full (critical at 95%)"),
        "{err}"
    );
    assert_eq!(f.changes().len(), seen, "refused before any lvcreate");
    assert_eq!(b.create_snapshot(&snap("snap-1", "pvc-1")).await.unwrap(), taken);
}

#[tokio::test]
async fn a_snapshot_of_a_missing_volume_is_refused_and_snapshots_promise_no_room() {
    let f = Fixture::new(Some(true));
    let b = thin_with_formatted(&f).await;
    let missing = b.create_snapshot(&snap("s", "nope")).await.unwrap_err();
    assert!(matches!(missing, BackendError::NotFound { .. }), "{missing}");
    // Pool 256 MiB × 0.5: 128 MiB promised at most; pvc-1 holds 64. Its snapshots
    // promise nothing: the room left stays 64 MiB, and a 64 MiB clone still fits.
    let small = f.thin(0.5).await;
    for name in ["s1", "s2", "s3"] {
        small.create_snapshot(&snap(name, "pvc-1")).await.unwrap();
    }
    assert_eq!(small.capacity().await.unwrap().available, 64 * MIB);
    let clone = spec("pvc-2", 64 * MIB, VolumeMode::Filesystem);
    let source = CopySource::Snapshot(Token::for_name("s1"));
    small.create_from(&clone, &source).await.unwrap();
    let full = small
        .create_from(&spec("pvc-3", 64 * MIB, VolumeMode::Filesystem), &source)
        .await
        .unwrap_err();
    assert!(matches!(full, BackendError::NoSpace { .. }), "{full}");
}

#[tokio::test]
async fn a_restore_is_a_writable_thin_snapshot_grown_then_committed() {
    let f = Fixture::new(Some(true));
    let b = thin_with_formatted(&f).await;
    b.create_snapshot(&snap("snap-1", "pvc-1")).await.unwrap();
    let seen = f.changes().len();
    let mut restore = spec("pvc-2", 96 * MIB, VolumeMode::Filesystem);
    restore.claim.pv_name = Some("pvc-2".into());
    let source = CopySource::Snapshot(Token::for_name("snap-1"));
    let record = b.create_from(&restore, &source).await.unwrap();
    assert_eq!(
        changes_without_time(&f, seen),
        [
            "lvcreate -y -s -kn -prw -n pvc-2 --addtag localvol.csi.dev/class=thin \
             --addtag localvol.csi.dev/name=pvc-2 --addtag localvol.csi.dev/mode=filesystem \
             --addtag localvol.csi.dev/fs=ext4 --addtag localvol.csi.dev/pvc=data \
             --addtag localvol.csi.dev/namespace=team --addtag localvol.csi.dev/pv=pvc-2 \
             --addtag localvol.csi.dev/state=zeroing --addtag localvol.csi.dev/format=formatting \
             --addtag localvol.csi.dev/fs-uuid=U --addtag localvol.csi.dev/grow=filesystem vg1/s+snap-1",
            "lvextend -L 100663296b vg1/pvc-2",
            "lvchange --deltag localvol.csi.dev/state=zeroing vg1/pvc-2",
        ]
    );
    assert_eq!(record.size_bytes, 96 * MIB);
    assert_eq!(record.name, "pvc-2");
    // The copied filesystem proves itself by its source's UUID at the first stage, and
    // is kept, not formatted over.
    let source_mark = b.format_mark(&Token::for_name("pvc-1")).await.unwrap();
    assert!(matches!(source_mark, FormatMark::Pending(_)), "{source_mark:?}");
    assert_eq!(b.format_mark(&restore.token).await.unwrap(), source_mark);
    // Idempotent.
    let seen = f.changes().len();
    assert_eq!(b.create_from(&restore, &source).await.unwrap(), record);
    assert_eq!(f.changes().len(), seen);
    let gone = b
        .create_from(
            &spec("pvc-3", 64 * MIB, VolumeMode::Filesystem),
            &CopySource::Snapshot(Token::for_name("nope")),
        )
        .await
        .unwrap_err();
    assert!(matches!(gone, BackendError::SnapshotNotFound { .. }), "{gone}");
}

#[tokio::test]
async fn a_clone_of_the_same_size_is_not_extended_and_a_block_copy_takes_no_format_mark() {
    let f = Fixture::new(Some(true));
    let b = thin_with_formatted(&f).await;
    let clone = spec("pvc-2", 64 * MIB, VolumeMode::Filesystem);
    let source = CopySource::Volume {
        token: Token::for_name("pvc-1"),
        freeze: None,
    };
    let seen = f.changes().len();
    b.create_from(&clone, &source).await.unwrap();
    let changes = f.changes()[seen..].to_vec();
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert!(
        changes[0].starts_with("lvcreate -y -s -kn -prw -n pvc-2 ") && changes[0].ends_with(" vg1/pvc-1")
    );
    assert_eq!(
        changes[1],
        "lvchange --deltag localvol.csi.dev/state=zeroing vg1/pvc-2"
    );
    b.create_from(&spec("blk", 64 * MIB, VolumeMode::Block), &source)
        .await
        .unwrap();
    assert!(!f.lv("blk").tags.iter().any(|t| t.contains("/format=")));
    let missing = CopySource::Volume {
        token: Token::for_name("nope"),
        freeze: None,
    };
    let e = b
        .create_from(&spec("x", 64 * MIB, VolumeMode::Block), &missing)
        .await
        .unwrap_err();
    assert!(matches!(e, BackendError::NotFound { .. }), "{e}");
}

#[tokio::test]
async fn a_copy_left_pending_by_a_kill_is_removed_and_made_again() {
    let f = Fixture::new(Some(true));
    let b = thin_with_formatted(&f).await;
    let clone = spec("pvc-2", 96 * MIB, VolumeMode::Filesystem);
    // What a daemon killed between lvcreate and the lvchange left.
    f.plant_pending_copy(&clone, 64 * MIB, &[]);
    assert_eq!(
        b.get(&clone.token).await.unwrap(),
        None,
        "pending is not a volume"
    );
    let seen = f.changes().len();
    let source = CopySource::Volume {
        token: Token::for_name("pvc-1"),
        freeze: None,
    };
    let record = b.create_from(&clone, &source).await.unwrap();
    let changes = f.changes()[seen..].to_vec();
    assert_eq!(changes[0], "lvremove -y vg1/pvc-2");
    assert!(changes[1].starts_with("lvcreate -y -s -kn -prw -n pvc-2 "));
    assert_eq!(record.size_bytes, 96 * MIB);
    assert!(!f.lv("pvc-2").tags.contains(&tags::PENDING.to_string()));
}

#[tokio::test]
async fn snapshots_and_volumes_are_deleted_independently() {
    let f = Fixture::new(Some(true));
    let b = thin_with_formatted(&f).await;
    b.create_snapshot(&snap("snap-1", "pvc-1")).await.unwrap();
    b.delete(&Token::for_name("pvc-1")).await.unwrap();
    assert_eq!(
        f.lv_names(),
        ["pool0", "s+snap-1"],
        "the snapshot outlives its source"
    );
    let restored = b
        .create_from(
            &spec("pvc-2", 64 * MIB, VolumeMode::Filesystem),
            &CopySource::Snapshot(Token::for_name("snap-1")),
        )
        .await
        .unwrap();
    b.delete_snapshot(&Token::for_name("snap-1")).await.unwrap();
    b.delete_snapshot(&Token::for_name("snap-1")).await.unwrap();
    assert_eq!(f.lv_names(), ["pool0", "pvc-2"]);
    assert_eq!(b.get(&restored.id.token).await.unwrap(), Some(restored));
    assert_eq!(b.list_snapshots().await.unwrap(), []);
}

#[tokio::test]
async fn thick_classes_make_no_snapshots() {
    let f = Fixture::new(None);
    assert!(!f.thick(0).await.snapshots());
}

#[test]
fn snapshot_tags_round_trip_and_never_read_as_a_volume() {
    let class = ClassName::parse("thin").unwrap();
    let source = spec("pvc-1", 64 * MIB, VolumeMode::Block);
    let volume_lv = report::Lv {
        name: "pvc-1".into(),
        vg: "vg1".into(),
        size: 64 * MIB,
        attr: "Vwi-a-tz--".into(),
        tags: tags::volume_tags(&class, &source),
        pool: Some("pool0".into()),
        data_percent: None,
        path: None,
    };
    let tags::Ownership::Ours { record, .. } = tags::ownership(&class, "vg1", &volume_lv) else {
        panic!()
    };
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1);
    let spec = snap("a snapshot/with odd name", "pvc-1");
    let lv = report::Lv {
        name: super::super::snapshots::snapshot_lv_name(&spec.token, "vg1"),
        tags: super::super::snapshots::snapshot_tags(&class, &spec, &volume_lv, &record, at),
        attr: "Vri---tz-k".into(),
        ..volume_lv.clone()
    };
    assert!(lv.name.starts_with("s+h+"), "{}", lv.name);
    assert_eq!(tags::ownership(&class, "vg1", &lv), tags::Ownership::Foreign);
    use super::super::snapshots::{SnapshotOwnership, snapshot_ownership};
    let SnapshotOwnership::Ours(s) = snapshot_ownership(&class, "vg1", &lv) else {
        panic!()
    };
    assert_eq!(s.name, "a snapshot/with odd name");
    assert_eq!(s.created, at);
    assert_eq!(s.mode, VolumeMode::Block);
    assert_eq!(s.fs_type, None);
    let other = ClassName::parse("other").unwrap();
    assert_eq!(snapshot_ownership(&other, "vg1", &lv), SnapshotOwnership::Foreign);
    assert_eq!(
        snapshot_ownership(&class, "vg1", &volume_lv),
        SnapshotOwnership::Foreign
    );
    let renamed = report::Lv {
        name: "s+other".into(),
        ..lv
    };
    assert!(matches!(
        snapshot_ownership(&class, "vg1", &renamed),
        SnapshotOwnership::Corrupt(_)
    ));
}

impl Fixture {
    /// The thin class as a restarted daemon opens it: a new VG handle, no cached report.
    async fn restarted_thin(&self, ratio: f64) -> LvmBackend {
        let settings = LvmSettings {
            kind: "lvm-thin",
            layout: Layout::Thin {
                pool: "pool0".into(),
                overprovision_ratio: ratio,
                thresholds: crate::config::PoolThresholds::default(),
            },
            lvcreate_options: Vec::new(),
            dax: false,
        };
        let group = VolumeGroup::new("vg1".into(), self.host.clone());
        LvmBackend::open(
            ClassName::parse("thin").unwrap(),
            settings,
            group,
            self.host.clone(),
        )
        .await
        .unwrap()
    }
}
