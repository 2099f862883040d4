//! The format mark on LVs: `format=formatting` from lvcreate (or written before mkfs on
//! an LV that had none), so a stage killed mid-mkfs is seen by the next one; finished
//! either by the superblock of the UUID chosen at lvcreate (`fs-uuid`, no lvchange) or,
//! on LVs without one, by `format=formatted` in one lvchange after mkfs.

use super::*;

/// Every lvchange of a format mark so far.
fn mark_changes(f: &Fixture) -> Vec<String> {
    f.changes()
        .into_iter()
        .filter(|c| c.starts_with("lvchange") && c.contains("/format="))
        .collect()
}

const BEGIN: &str = "lvchange --addtag localvol.csi.dev/format=formatting vg1/pvc-1";
const FINISH: &str = "lvchange --deltag localvol.csi.dev/format=formatting \
                      --addtag localvol.csi.dev/format=formatted vg1/pvc-1";
const BEGIN_AGAIN: &str = "lvchange --deltag localvol.csi.dev/format=formatted \
                           --addtag localvol.csi.dev/format=formatting vg1/pvc-1";

/// The tag-level question: was a format begun and never recorded as finished?
async fn unfinished(b: &LvmBackend, token: &Token) -> bool {
    matches!(
        b.format_mark(token).await.unwrap(),
        FormatMark::Unfinished | FormatMark::Pending(_)
    )
}

#[tokio::test]
async fn a_new_filesystem_volume_is_born_pending_on_its_own_uuid_and_never_retagged() {
    let f = Fixture::new(None);
    let (b, token) = f.thick_with_volume(VolumeMode::Filesystem).await;
    let uuid = f.fs_uuid("pvc-1").expect("lvcreate tagged the UUID");
    assert_eq!(b.format_mark(&token).await.unwrap(), FormatMark::Pending(uuid));
    b.begin_format(&token).await.unwrap();
    b.mark_formatted(&token).await.unwrap();
    assert!(
        mark_changes(&f).is_empty(),
        "the superblock is the mark: no lvchange before or after mkfs"
    );
    assert_eq!(b.format_mark(&token).await.unwrap(), FormatMark::Pending(uuid));
    // Each lvcreate chooses its own UUID, so no earlier tenant's superblock matches.
    b.create(&spec("pvc-2", 64 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    assert_ne!(f.fs_uuid("pvc-2"), Some(uuid));
    // A block volume has no mark: it is never formatted.
    b.create(&spec("blk", 8 * MIB, VolumeMode::Block)).await.unwrap();
    assert_eq!(
        b.format_mark(&Token::for_name("blk")).await.unwrap(),
        FormatMark::Unknown
    );
    assert_eq!(f.fs_uuid("blk"), None);
}

#[tokio::test]
async fn an_encrypted_volume_keeps_the_tag_that_covers_its_header() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    let token = Token::for_name("pvc-1");
    let encrypted = CreateSpec {
        encryption: Some(Encryption {
            allow_discards: false,
        }),
        ..spec("pvc-1", 64 * MIB, VolumeMode::Filesystem)
    };
    b.create(&encrypted).await.unwrap();
    assert_eq!(f.fs_uuid("pvc-1"), None);
    assert_eq!(b.format_mark(&token).await.unwrap(), FormatMark::Unfinished);
    b.mark_formatted(&token).await.unwrap();
    assert_eq!(mark_changes(&f), [FINISH]);
    assert_eq!(b.format_mark(&token).await.unwrap(), FormatMark::Unknown);
}

#[tokio::test]
async fn a_uuid_tag_edited_into_nonsense_hands_the_decision_to_blkid() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    f.plant_thick_volume(
        "pvc-1",
        64 * MIB,
        VolumeMode::Filesystem,
        &[tags::FORMATTING, "localvol.csi.dev/fs-uuid=not-a-uuid"],
    );
    let token = Token::for_name("pvc-1");
    assert_eq!(b.format_mark(&token).await.unwrap(), FormatMark::Unknown);
    // Not pending, so a finished mkfs is recorded the old way.
    b.mark_formatted(&token).await.unwrap();
    assert_eq!(mark_changes(&f), [FINISH]);
}

#[tokio::test]
async fn the_mark_is_set_before_mkfs_and_replaced_after_in_one_change() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    let token = Token::for_name("pvc-1");
    // A volume made before lvcreate set the mark (or the UUID): its tags have neither.
    f.plant_thick_volume("pvc-1", 64 * MIB, VolumeMode::Filesystem, &[]);
    assert!(!unfinished(&b, &token).await, "no mark");

    b.begin_format(&token).await.unwrap();
    assert_eq!(mark_changes(&f), [BEGIN]);
    assert!(unfinished(&b, &token).await);
    // Still a volume meanwhile: listed, attachable, deletable.
    assert!(b.get(&token).await.unwrap().is_some());
    // Killed here: a restarted daemon (a new report cache) sees the mark in the tags.
    let restarted = VolumeGroup::new("vg1".into(), f.host.clone());
    let again = LvmBackend::open(b.class().clone(), b.settings.clone(), restarted, f.host.clone())
        .await
        .unwrap();
    assert!(unfinished(&again, &token).await);
    // A second begin (the retried stage) changes nothing.
    again.begin_format(&token).await.unwrap();
    assert_eq!(mark_changes(&f), [BEGIN]);

    again.mark_formatted(&token).await.unwrap();
    assert_eq!(mark_changes(&f), [BEGIN, FINISH]);
    let tags = f.lv("pvc-1").tags;
    assert!(tags.contains(&tags::FORMATTED.to_string()), "{tags:?}");
    assert!(!tags.contains(&tags::FORMATTING.to_string()), "{tags:?}");
    assert!(!unfinished(&again, &token).await);
    again.mark_formatted(&token).await.unwrap();
    assert_eq!(mark_changes(&f), [BEGIN, FINISH], "marking twice changes nothing");

    // A filesystem wiped since is formatted again under a new mark.
    again.begin_format(&token).await.unwrap();
    assert_eq!(mark_changes(&f), [BEGIN, FINISH, BEGIN_AGAIN]);
    assert!(unfinished(&again, &token).await);
}

#[tokio::test]
async fn only_finished_volumes_are_marked() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    let missing = Token::for_name("nothing");
    assert!(!unfinished(&b, &missing).await);
    assert!(matches!(
        b.begin_format(&missing).await,
        Err(BackendError::NotFound { .. })
    ));
    assert!(matches!(
        b.mark_formatted(&missing).await,
        Err(BackendError::NotFound { .. })
    ));
    // A pending create (state=zeroing) is not a volume: no mark, and nothing changes.
    f.plant_thick_volume(
        "half",
        8 * MIB,
        VolumeMode::Filesystem,
        &[tags::PENDING, tags::FORMATTING],
    );
    let half = Token::for_name("half");
    assert!(!unfinished(&b, &half).await);
    assert!(b.begin_format(&half).await.is_err());
    assert!(mark_changes(&f).is_empty());
}

#[tokio::test]
async fn an_interrupted_mkfs_on_thin_gets_an_ordinary_format_next_time() {
    let f = Fixture::new(Some(true));
    let b = f.thin(2.0).await;
    let token = Token::for_name("thin-1");
    b.create(&spec("thin-1", 64 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    let mapped = Arc::new(Mutex::new(0u64));
    {
        let mapped = Arc::clone(&mapped);
        f.commands.on("dmsetup", move |_| {
            ok(format!("0 131072 thin {} 131071\n", mapped.lock().unwrap()))
        });
    }
    // The first stage: the mark does not map anything, so the LV is still prezeroed.
    b.begin_format(&token).await.unwrap();
    assert!(b.format_options(&token).await.unwrap().prezeroed);
    assert_eq!(f.commands.calls_of("dmsetup"), ["dmsetup status vg1-thin--1"]);
    // mkfs was killed after writing some blocks; the mark is still there.
    *mapped.lock().unwrap() = 2048;
    assert!(unfinished(&b, &token).await);
    b.begin_format(&token).await.unwrap();
    assert!(!b.format_options(&token).await.unwrap().prezeroed);
    b.mark_formatted(&token).await.unwrap();
    // The filesystem proves itself from here: nothing was retagged.
    assert!(mark_changes(&f).is_empty());
}
