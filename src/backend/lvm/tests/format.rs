//! The format mark on LVs: `format=formatting` written before mkfs, replaced by
//! `format=formatted` after it, so a stage killed mid-mkfs is seen by the next one.

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

#[tokio::test]
async fn a_new_filesystem_volume_is_born_marked() {
    let f = Fixture::new(None);
    let (b, token) = f.thick_with_volume(VolumeMode::Filesystem).await;
    assert!(b.format_unfinished(&token).await.unwrap());
    b.begin_format(&token).await.unwrap();
    assert!(mark_changes(&f).is_empty(), "already marked by lvcreate");
    b.mark_formatted(&token).await.unwrap();
    assert_eq!(mark_changes(&f), [FINISH]);
    // A block volume has no mark: it is never formatted.
    b.create(&spec("blk", 8 * MIB, VolumeMode::Block)).await.unwrap();
    assert!(!b.format_unfinished(&Token::for_name("blk")).await.unwrap());
}

#[tokio::test]
async fn the_mark_is_set_before_mkfs_and_replaced_after_in_one_change() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    let token = Token::for_name("pvc-1");
    // A volume made before lvcreate set the mark: its tags have none.
    f.plant_thick(
        "pvc-1",
        64 * MIB,
        tags::volume_tags(b.class(), &spec("pvc-1", 64 * MIB, VolumeMode::Filesystem)),
    );
    assert!(!b.format_unfinished(&token).await.unwrap(), "no mark");

    b.begin_format(&token).await.unwrap();
    assert_eq!(mark_changes(&f), [BEGIN]);
    assert!(b.format_unfinished(&token).await.unwrap());
    // Still a volume meanwhile: listed, attachable, deletable.
    assert!(b.get(&token).await.unwrap().is_some());
    // Killed here: a restarted daemon (a new report cache) sees the mark in the tags.
    let restarted = VolumeGroup::new("vg1".into(), f.host.clone());
    let again = LvmBackend::open(b.class().clone(), b.settings.clone(), restarted, f.host.clone())
        .await
        .unwrap();
    assert!(again.format_unfinished(&token).await.unwrap());
    // A second begin (the retried stage) changes nothing.
    again.begin_format(&token).await.unwrap();
    assert_eq!(mark_changes(&f), [BEGIN]);

    again.mark_formatted(&token).await.unwrap();
    assert_eq!(mark_changes(&f), [BEGIN, FINISH]);
    let tags = f.lv("pvc-1").tags;
    assert!(tags.contains(&tags::FORMATTED.to_string()), "{tags:?}");
    assert!(!tags.contains(&tags::FORMATTING.to_string()), "{tags:?}");
    assert!(!again.format_unfinished(&token).await.unwrap());
    again.mark_formatted(&token).await.unwrap();
    assert_eq!(mark_changes(&f), [BEGIN, FINISH], "marking twice changes nothing");

    // A filesystem wiped since is formatted again under a new mark.
    again.begin_format(&token).await.unwrap();
    assert_eq!(mark_changes(&f), [BEGIN, FINISH, BEGIN_AGAIN]);
    assert!(again.format_unfinished(&token).await.unwrap());
}

#[tokio::test]
async fn only_finished_volumes_are_marked() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    let missing = Token::for_name("nothing");
    assert!(!b.format_unfinished(&missing).await.unwrap());
    assert!(matches!(
        b.begin_format(&missing).await,
        Err(BackendError::NotFound { .. })
    ));
    assert!(matches!(
        b.mark_formatted(&missing).await,
        Err(BackendError::NotFound { .. })
    ));
    // A pending create (state=zeroing) is not a volume: no mark, and nothing changes.
    let mut tags = tags::volume_tags(b.class(), &spec("half", 8 * MIB, VolumeMode::Filesystem));
    tags.push(tags::PENDING.to_string());
    tags.push(tags::FORMATTING.to_string());
    f.plant_thick("half", 8 * MIB, tags);
    let half = Token::for_name("half");
    assert!(!b.format_unfinished(&half).await.unwrap());
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
    assert!(b.format_unfinished(&token).await.unwrap());
    b.begin_format(&token).await.unwrap();
    assert!(!b.format_options(&token).await.unwrap().prezeroed);
    b.mark_formatted(&token).await.unwrap();
    assert!(!b.format_unfinished(&token).await.unwrap());
}
