//! Loop snapshots, restores and clones against a real temporary directory, with the
//! fake syscalls recording freezes and copies (the real copy is tested at the end).

use std::path::Path;
use std::sync::Arc;

use super::*;
use crate::backend::{FormatMark, LoopBackend};
use crate::host::fake::{FakeCommands, FakeSyscalls};
use crate::host::{CopyMethod, FsUsage, Syscalls, SystemSyscalls};
use crate::model::ClaimRef;
use crate::model::ClassName;

fn backend(dir: &Path, limit: u64) -> (LoopBackend, Arc<FakeSyscalls>) {
    let syscalls = Arc::new(FakeSyscalls::default());
    syscalls.set_usage(FsUsage {
        total_bytes: 1 << 41,
        available_bytes: 1 << 40,
        ..FsUsage::default()
    });
    let commands = Arc::new(FakeCommands::default());
    commands.ok_mkfs();
    let host = Host {
        commands,
        syscalls: syscalls.clone(),
    };
    let b = LoopBackend::new(ClassName::parse("default").unwrap(), dir.join("c"), limit, host);
    (b, syscalls)
}

fn volume(name: &str, size: u64) -> CreateSpec {
    CreateSpec {
        token: Token::for_name(name),
        name: name.to_string(),
        size_bytes: size,
        mode: VolumeMode::Filesystem,
        fs_type: Some(FsType::Ext4),
        claim: ClaimRef::default(),
        encryption: None,
    }
}

fn snapshot(name: &str, source: &str, freeze: Option<&Path>) -> SnapshotSpec {
    SnapshotSpec {
        token: Token::for_name(name),
        name: name.to_string(),
        source: Token::for_name(source),
        freeze: freeze.map(Path::to_path_buf),
    }
}

/// Writes `data` at `offset` of a volume's image, as a pod would through its filesystem.
fn write(b: &LoopBackend, name: &str, offset: u64, data: &[u8]) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(b.image_path(&Token::for_name(name)))
        .unwrap();
    file.write_all_at(data, offset).unwrap();
}

fn read(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0; len];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut buf, offset)
        .unwrap();
    buf
}

#[tokio::test]
async fn snapshot_restore_and_clone_hold_the_data_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (b, _) = backend(dir.path(), 1 << 30);
    b.prepare().await.unwrap();
    b.create(&volume("src", 4 << 20)).await.unwrap();
    b.mark_formatted(&Token::for_name("src")).await.unwrap();
    write(&b, "src", 1 << 20, b"before");
    let snap = b.create_snapshot(&snapshot("snap-1", "src", None)).await.unwrap();
    assert_eq!(snap.id.to_string(), "snapshot.default.snap-1");
    assert_eq!(snap.source.to_string(), "default.src");
    assert_eq!(snap.size_bytes, 4 << 20);
    // Idempotent: the same record, not a second copy.
    assert_eq!(
        b.create_snapshot(&snapshot("snap-1", "src", None)).await.unwrap(),
        snap
    );
    write(&b, "src", 1 << 20, b"after!");

    let restored = b
        .create_from(
            &volume("restored", 8 << 20),
            &CopySource::Snapshot(Token::for_name("snap-1")),
        )
        .await
        .unwrap();
    assert_eq!(restored.size_bytes, 8 << 20);
    let image = b.image_path(&Token::for_name("restored"));
    assert_eq!(
        std::fs::metadata(&image).unwrap().len(),
        8 << 20,
        "grown to the request"
    );
    assert_eq!(read(&image, 1 << 20, 6), b"before");
    assert_eq!(
        b.format_mark(&Token::for_name("restored")).await.unwrap(),
        FormatMark::Finished,
        "kept, not formatted over"
    );

    let clone = CopySource::Volume {
        token: Token::for_name("src"),
        freeze: None,
    };
    b.create_from(&volume("clone", 4 << 20), &clone).await.unwrap();
    assert_eq!(
        read(&b.image_path(&Token::for_name("clone")), 1 << 20, 6),
        b"after!"
    );

    // Independent copies: the source goes, the snapshot stays restorable; the snapshot
    // goes, the restored volume keeps its data.
    b.delete(&Token::for_name("src")).await.unwrap();
    assert_eq!(b.list_snapshots().await.unwrap(), vec![snap.clone()]);
    b.delete_snapshot(&snap.id.token).await.unwrap();
    b.delete_snapshot(&snap.id.token).await.unwrap();
    assert!(b.list_snapshots().await.unwrap().is_empty());
    assert_eq!(read(&image, 1 << 20, 6), b"before");
    let leftovers: Vec<_> = std::fs::read_dir(b.snapshot_dir()).unwrap().collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test]
async fn a_staged_source_is_frozen_around_the_copy_and_thawed_after() {
    let dir = tempfile::tempdir().unwrap();
    let (b, syscalls) = backend(dir.path(), 1 << 30);
    b.prepare().await.unwrap();
    b.create(&volume("src", 1 << 20)).await.unwrap();
    let staged = Path::new("/var/lib/kubelet/plugins/staging/src");
    b.create_snapshot(&snapshot("snap-1", "src", Some(staged)))
        .await
        .unwrap();
    let calls: Vec<_> = syscalls
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("FI") || c.starts_with("copy"))
        .collect();
    let tmp = b.snapshot_dir().join("snap-1.img.tmp");
    assert_eq!(
        calls,
        vec![
            format!("FIFREEZE {}", staged.display()),
            format!("copy {}", tmp.display()),
            format!("FITHAW {}", staged.display()),
        ]
    );
    assert!(!b.freeze_record_path(&Token::for_name("src")).exists());
}

#[tokio::test]
async fn a_failed_copy_still_thaws_and_leaves_no_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (b, syscalls) = backend(dir.path(), 1 << 30);
    b.prepare().await.unwrap();
    b.create(&volume("src", 1 << 20)).await.unwrap();
    syscalls.fail_next("copy", libc::EIO);
    let staged = Path::new("/staging/src");
    let err = b
        .create_snapshot(&snapshot("snap-1", "src", Some(staged)))
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::Syscall(_)), "{err}");
    assert!(syscalls.calls().contains(&format!("FITHAW {}", staged.display())));
    assert!(
        b.get_snapshot(&Token::for_name("snap-1"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(!b.freeze_record_path(&Token::for_name("src")).exists());
    // The retry succeeds and finds nothing in its way.
    b.create_snapshot(&snapshot("snap-1", "src", None)).await.unwrap();
}

#[tokio::test]
async fn start_up_thaws_what_a_killed_snapshot_left_frozen() {
    let dir = tempfile::tempdir().unwrap();
    let (b, syscalls) = backend(dir.path(), 1 << 30);
    b.prepare().await.unwrap();
    // Killed between FIFREEZE and FITHAW: the record is all that is left.
    let record = b.freeze_record_path(&Token::for_name("src"));
    std::fs::write(&record, "/staging/src").unwrap();
    // So is a half-written copy.
    std::fs::write(b.snapshot_dir().join("snap-1.img.tmp"), b"half").unwrap();
    b.prepare().await.unwrap();
    assert!(syscalls.calls().contains(&"FITHAW /staging/src".to_string()));
    assert!(!record.exists());
    assert!(
        b.list_snapshots().await.unwrap().is_empty(),
        "a copy without a record is no snapshot"
    );
    assert!(
        !b.snapshot_dir().join("snap-1.img.tmp").exists(),
        "and is removed"
    );
}

#[tokio::test]
async fn snapshots_count_against_the_class_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (b, _) = backend(dir.path(), 100 << 20);
    b.prepare().await.unwrap();
    b.create(&volume("src", 10 << 20)).await.unwrap();
    write(&b, "src", 0, &vec![7u8; 4 << 20]);
    let before = b.capacity().await.unwrap().available;
    b.create_snapshot(&snapshot("snap-1", "src", None)).await.unwrap();
    let after = b.capacity().await.unwrap().available;
    assert!(before - after >= 4 << 20, "{before} -> {after}");
    // A restore is at least a new volume's worth of promise.
    let err = b
        .create_from(
            &volume("big", 200 << 20),
            &CopySource::Snapshot(Token::for_name("snap-1")),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::NoSpace { .. }), "{err}");
    assert!(!b.image_path(&Token::for_name("big")).exists());
}

#[tokio::test]
async fn a_missing_snapshot_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let (b, _) = backend(dir.path(), 1 << 30);
    b.prepare().await.unwrap();
    let err = b
        .create_from(
            &volume("v", 1 << 20),
            &CopySource::Snapshot(Token::for_name("nope")),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::SnapshotNotFound { .. }), "{err}");
}

/// The real copy: holes stay holes, data is copied, FICLONE where the filesystem can.
#[tokio::test]
async fn the_real_copy_keeps_holes() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source.img");
    let file = std::fs::File::create(&source).unwrap();
    file.set_len(64 << 20).unwrap();
    file.write_all_at(b"head", 0).unwrap();
    file.write_all_at(b"tail", (64 << 20) - 4).unwrap();
    drop(file);
    let target = dir.path().join("target.img");
    let method = SystemSyscalls.copy_file(&source, &target).await.unwrap();
    assert_eq!(std::fs::metadata(&target).unwrap().len(), 64 << 20);
    assert_eq!(read(&target, 0, 4), b"head");
    assert_eq!(read(&target, (64 << 20) - 4, 4), b"tail");
    if method == CopyMethod::Sparse {
        let blocks = std::fs::metadata(&target).unwrap().blocks() * 512;
        assert!(
            blocks < 8 << 20,
            "a sparse copy of 8 bytes of data took {blocks} bytes"
        );
    }
    assert!(
        SystemSyscalls.copy_file(&source, &target).await.is_err(),
        "never over an existing file"
    );
}

#[tokio::test]
async fn a_larger_filesystem_copy_carries_the_grow_mark_from_its_record_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (b, _) = backend(dir.path(), 1 << 30);
    b.prepare().await.unwrap();
    b.create(&volume("src", 4 << 20)).await.unwrap();
    let clone = CopySource::Volume {
        token: Token::for_name("src"),
        freeze: None,
    };
    let big = Token::for_name("big");
    // What a copy killed after its truncate, before its record, left: an image and no
    // volume. The retry copies again and commits the mark with the record.
    std::fs::write(b.image_path(&big), vec![7u8; 8 << 20]).unwrap();
    assert!(!b.filesystem_grow_pending(&big).await.unwrap());
    b.create_from(&volume("big", 8 << 20), &clone).await.unwrap();
    assert!(b.filesystem_grow_pending(&big).await.unwrap());
    let record = std::fs::read_to_string(b.record_path(&big)).unwrap();
    assert!(record.contains("\"grow_filesystem\": true"), "{record}");
    b.filesystem_grown(&big).await.unwrap();
    b.filesystem_grown(&big).await.unwrap();
    assert!(!b.filesystem_grow_pending(&big).await.unwrap());
    let record = std::fs::read_to_string(b.record_path(&big)).unwrap();
    assert!(
        !record.contains("grow_filesystem"),
        "an unmarked record as before: {record}"
    );

    b.create_from(&volume("same", 4 << 20), &clone).await.unwrap();
    assert!(!b.filesystem_grow_pending(&Token::for_name("same")).await.unwrap());
    let mut block = volume("block", 8 << 20);
    block.mode = VolumeMode::Block;
    block.fs_type = None;
    b.create_from(&block, &clone).await.unwrap();
    assert!(!b.filesystem_grow_pending(&block.token).await.unwrap());
}

/// The ledger that capacity reads, against a count of the storage after each change:
/// the same after every change localvol makes; after a pod's write, on the side that
/// refuses until the stats refresh counts again.
#[tokio::test]
async fn the_ledger_is_the_storages_count_after_every_change() {
    let dir = tempfile::tempdir().unwrap();
    let (b, _) = backend(dir.path(), 1 << 30);
    b.prepare().await.unwrap();
    let same_as_storage = async |b: &LoopBackend, step: &str| {
        let counted = b.count().await.unwrap().totals();
        assert_eq!(b.ledger().totals(), counted, "after {step}");
    };
    b.create(&volume("src", 10 << 20)).await.unwrap();
    same_as_storage(&b, "a create (formatted in its image)").await;
    write(&b, "src", 0, &vec![7u8; 4 << 20]);
    let counted = b.count().await.unwrap().totals();
    let ledger = b.ledger().totals();
    assert_eq!(ledger.promised, counted.promised);
    assert!(
        ledger.unbacked > counted.unbacked,
        "a write is counted later, never as free: {ledger:?} {counted:?}"
    );
    b.capacity_and_health().await.unwrap();
    same_as_storage(&b, "the stats refresh").await;
    b.create_snapshot(&snapshot("snap-1", "src", None)).await.unwrap();
    same_as_storage(&b, "a snapshot").await;
    let restore = volume("restored", 20 << 20);
    b.create_from(&restore, &CopySource::Snapshot(Token::for_name("snap-1")))
        .await
        .unwrap();
    same_as_storage(&b, "a restore").await;
    b.create_from(
        &volume("clone", 10 << 20),
        &CopySource::Volume {
            token: Token::for_name("src"),
            freeze: None,
        },
    )
    .await
    .unwrap();
    same_as_storage(&b, "a clone").await;
    b.expand(&Token::for_name("clone"), 30 << 20).await.unwrap();
    same_as_storage(&b, "an expand").await;
    b.delete_snapshot(&Token::for_name("snap-1")).await.unwrap();
    same_as_storage(&b, "a snapshot's delete").await;
    b.delete(&Token::for_name("src")).await.unwrap();
    same_as_storage(&b, "a delete").await;
    // Another process of this class's (a restart) counts the same from the storage alone.
    let (again, _) = backend(dir.path(), 1 << 30);
    again.prepare().await.unwrap();
    assert_eq!(again.ledger().totals(), b.ledger().totals());
}
