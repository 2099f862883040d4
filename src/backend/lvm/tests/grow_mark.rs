//! The filesystem-grow mark of a thin restore or clone made larger than its source:
//! committed by the lvcreate that makes the copy, so no kill can leave a grown copy
//! without it, and dropped only by [`LvmBackend::filesystem_grown`].

use super::copies::thin_with_formatted;
use super::*;
use crate::backend::CopySource;

fn clone_of_pvc_1() -> CopySource {
    CopySource::Volume {
        token: Token::for_name("pvc-1"),
        freeze: None,
    }
}

#[tokio::test]
async fn a_larger_filesystem_copy_is_marked_in_its_lvcreate_and_the_mark_is_dropped_once() {
    let f = Fixture::new(Some(true));
    let b = thin_with_formatted(&f).await;
    let clone = spec("pvc-2", 128 * MIB, VolumeMode::Filesystem);
    let seen = f.changes().len();
    b.create_from(&clone, &clone_of_pvc_1()).await.unwrap();
    let changes = f.changes()[seen..].to_vec();
    assert!(
        changes[0].starts_with("lvcreate -y -s -kn -prw -n pvc-2 ")
            && changes[0].contains(" --addtag localvol.csi.dev/grow=filesystem "),
        "the mark comes with the LV, before lvextend: {changes:?}"
    );
    assert_eq!(changes[1], "lvextend -L 134217728b vg1/pvc-2");
    assert!(b.filesystem_grow_pending(&clone.token).await.unwrap());

    let seen = f.changes().len();
    b.filesystem_grown(&clone.token).await.unwrap();
    b.filesystem_grown(&clone.token).await.unwrap();
    assert_eq!(
        f.changes()[seen..],
        ["lvchange --deltag localvol.csi.dev/grow=filesystem vg1/pvc-2"],
        "one lvchange, and none when the mark is gone"
    );
    assert!(!b.filesystem_grow_pending(&clone.token).await.unwrap());
    assert!(!f.lv("pvc-2").tags.iter().any(|t| t.contains("/grow=")));
}

#[tokio::test]
async fn copies_of_the_same_size_and_block_copies_are_not_marked() {
    let f = Fixture::new(Some(true));
    let b = thin_with_formatted(&f).await;
    let same = spec("pvc-2", 64 * MIB, VolumeMode::Filesystem);
    b.create_from(&same, &clone_of_pvc_1()).await.unwrap();
    assert!(!b.filesystem_grow_pending(&same.token).await.unwrap());
    let block = spec("blk", 128 * MIB, VolumeMode::Block);
    b.create_from(&block, &clone_of_pvc_1()).await.unwrap();
    assert!(
        !b.filesystem_grow_pending(&block.token).await.unwrap(),
        "a raw block device is the size asked: nothing to grow"
    );
    assert!(
        !b.filesystem_grow_pending(&Token::for_name("pvc-1"))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_copy_killed_after_lvextend_is_made_again_with_the_mark() {
    let f = Fixture::new(Some(true));
    let b = thin_with_formatted(&f).await;
    let clone = spec("pvc-2", 128 * MIB, VolumeMode::Filesystem);
    // What a daemon killed between lvextend and the lvchange that ends the create left:
    // grown, still pending, marked (lvcreate wrote the mark).
    f.plant_pending_copy(&clone, 128 * MIB, &[tags::GROW_FILESYSTEM]);
    assert!(
        !b.filesystem_grow_pending(&clone.token).await.unwrap(),
        "a pending copy is not a volume yet"
    );
    let seen = f.changes().len();
    b.create_from(&clone, &clone_of_pvc_1()).await.unwrap();
    let changes = f.changes()[seen..].to_vec();
    assert_eq!(changes[0], "lvremove -y vg1/pvc-2");
    assert!(changes[1].contains(" --addtag localvol.csi.dev/grow=filesystem "));
    assert!(b.filesystem_grow_pending(&clone.token).await.unwrap());
    let lv = f.lv("pvc-2");
    assert!(!lv.tags.contains(&tags::PENDING.to_string()));
    assert_eq!(lv.size, 128 * MIB);
}
