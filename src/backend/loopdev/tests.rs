//! The loop backend's on-disk records, against a real temporary directory (no loop
//! devices needed: attach/detach are covered by the privileged tests).

use std::sync::Arc;

use super::*;
use crate::host::FsUsage;
use crate::host::fake::{FakeCommands, FakeSyscalls};

fn backend(limit: u64, disk_free: u64) -> (LoopBackend, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let syscalls = FakeSyscalls::default();
    syscalls.set_usage(FsUsage {
        total_bytes: disk_free * 2,
        available_bytes: disk_free,
        ..FsUsage::default()
    });
    let commands = FakeCommands::default();
    commands.ok_mkfs();
    let host = Host {
        commands: Arc::new(commands),
        syscalls: Arc::new(syscalls),
    };
    let b = LoopBackend::new(
        ClassName::parse("default").unwrap(),
        dir.path().join("c"),
        limit,
        host,
    );
    (b, dir)
}

/// A prepared 1 GiB loop class in a new directory, on fakes with a roomy disk.
async fn prepared_on_fakes() -> (LoopBackend, Arc<FakeSyscalls>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let syscalls = Arc::new(FakeSyscalls::default());
    syscalls.set_usage(FsUsage {
        total_bytes: 1 << 41,
        available_bytes: 1 << 40,
        ..FsUsage::default()
    });
    let commands = Arc::new(FakeCommands::default());
    commands.ok_mkfs();
    let b = backend_with(dir.path(), commands, syscalls.clone());
    b.prepare().await.unwrap();
    (b, syscalls, dir)
}

/// A 1 GiB loop class under `dir` on the given fakes.
fn backend_with(dir: &Path, commands: Arc<FakeCommands>, syscalls: Arc<FakeSyscalls>) -> LoopBackend {
    LoopBackend::new(
        ClassName::parse("default").unwrap(),
        dir.join("c"),
        1 << 30,
        Host { commands, syscalls },
    )
}

fn spec(name: &str, size: u64) -> CreateSpec {
    CreateSpec {
        token: Token::for_name(name),
        name: name.to_string(),
        size_bytes: size,
        mode: VolumeMode::Filesystem,
        fs_type: Some(FsType::Xfs),
        claim: ClaimRef {
            pvc_name: Some("data".into()),
            pvc_namespace: Some("team".into()),
            pv_name: None,
        },
        encryption: None,
    }
}

#[tokio::test]
async fn create_list_get_delete() {
    let (b, _dir) = backend(1 << 30, 1 << 40);
    b.prepare().await.unwrap();
    let mode = std::fs::metadata(b.directory()).unwrap().permissions();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o700);
    let record = b.create(&spec("pvc-a", 8 << 20)).await.unwrap();
    assert_eq!(record.size_bytes, 8 << 20);
    assert_eq!(record.claim.pvc_namespace.as_deref(), Some("team"));
    let image = b.directory().join("pvc-a.img");
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 8 << 20);
    b.create(&spec("pvc-b", 1 << 20)).await.unwrap();
    let listed: Vec<_> = b.list().await.unwrap().into_iter().map(|r| r.name).collect();
    assert_eq!(listed, vec!["pvc-a", "pvc-b"]);
    assert_eq!(b.get(&Token::for_name("pvc-a")).await.unwrap(), Some(record));
    b.delete(&Token::for_name("pvc-a")).await.unwrap();
    b.delete(&Token::for_name("pvc-a")).await.unwrap();
    assert!(!image.exists());
    assert_eq!(b.list().await.unwrap().len(), 1);
}

/// A filesystem volume whose type the request names is formatted at create, in its image
/// file before that is in place, and recorded as formatted (stage then only probes and
/// mounts it). Without a named type, or raw block, nothing is formatted at create.
#[tokio::test]
async fn a_named_filesystem_is_made_at_create_before_the_image_is_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let commands = Arc::new(FakeCommands::default());
    let images = b_dir(dir.path());
    {
        let images = images.clone();
        commands.on("mkfs.xfs", move |cmd| {
            let target = cmd.args_display();
            assert!(target.ends_with(".img.tmp"), "mkfs on {target}");
            assert!(
                !images.join("pvc-a.img").exists(),
                "the image is in place before mkfs"
            );
            Ok(crate::host::CommandOutput::default())
        });
    }
    let (_, syscalls, _) = prepared_on_fakes().await;
    let b = backend_with(dir.path(), Arc::clone(&commands), syscalls);
    b.prepare().await.unwrap();

    b.create(&spec("pvc-a", 8 << 20)).await.unwrap();
    let calls = commands.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(calls[0].starts_with("mkfs.xfs "), "{calls:?}");
    assert_eq!(
        b.format_mark(&Token::for_name("pvc-a")).await.unwrap(),
        FormatMark::Finished
    );
    assert!(!images.join("pvc-a.img.tmp").exists());

    let unnamed = CreateSpec {
        fs_type: None,
        ..spec("pvc-b", 8 << 20)
    };
    b.create(&unnamed).await.unwrap();
    let block = CreateSpec {
        mode: VolumeMode::Block,
        ..spec("pvc-c", 8 << 20)
    };
    b.create(&block).await.unwrap();
    assert_eq!(commands.calls().len(), 1, "{:?}", commands.calls());
    assert_eq!(
        b.format_mark(&Token::for_name("pvc-b")).await.unwrap(),
        FormatMark::Unfinished
    );
    assert_eq!(
        b.format_mark(&Token::for_name("pvc-c")).await.unwrap(),
        FormatMark::Unknown
    );
}

/// The class directory of [`backend_with`] under `dir`.
fn b_dir(dir: &Path) -> PathBuf {
    dir.join("c")
}

#[tokio::test]
async fn a_crash_before_the_record_leaves_no_volume_and_no_old_bytes() {
    let (b, _dir) = backend(1 << 30, 1 << 40);
    b.prepare().await.unwrap();
    // An earlier attempt wrote data into the image, then died before the record.
    let image = b.directory().join("pvc-a.img");
    std::fs::write(&image, b"previous tenant's secret").unwrap();
    std::fs::write(b.directory().join("pvc-a.img.tmp"), b"half").unwrap();
    assert!(b.get(&Token::for_name("pvc-a")).await.unwrap().is_none());
    assert!(b.list().await.unwrap().is_empty());
    b.create(&spec("pvc-a", 1 << 20)).await.unwrap();
    let bytes = std::fs::read(&image).unwrap();
    assert_eq!(bytes.len(), 1 << 20);
    assert!(
        bytes.iter().all(|b| *b == 0),
        "the retried create starts from a new, empty file"
    );
    assert!(!b.directory().join("pvc-a.img.tmp").exists());
}

#[tokio::test]
async fn capacity_counts_promises_and_free_disk() {
    let (b, _dir) = backend(100 << 20, 1 << 40);
    b.prepare().await.unwrap();
    assert_eq!(b.capacity().await.unwrap().available, 100 << 20);
    b.create(&spec("pvc-a", 60 << 20)).await.unwrap();
    assert_eq!(b.capacity().await.unwrap().available, 40 << 20);
    let err = b.create(&spec("pvc-b", 50 << 20)).await.unwrap_err();
    assert!(matches!(err, BackendError::NoSpace { .. }), "{err}");
    assert!(
        !b.directory().join("pvc-b.img").exists(),
        "a refused create leaves nothing"
    );

    // Free disk bounds too: it must first hold what existing sparse volumes may still write.
    let (small, _dir2) = backend(1 << 40, 100 << 20);
    small.prepare().await.unwrap();
    small.create(&spec("pvc-a", 60 << 20)).await.unwrap();
    assert_eq!(small.capacity().await.unwrap().available, 40 << 20);
}

#[tokio::test]
async fn expand_grows_and_never_shrinks() {
    let (b, _dir) = backend(100 << 20, 1 << 40);
    b.prepare().await.unwrap();
    let token = Token::for_name("pvc-a");
    b.create(&spec("pvc-a", 8 << 20)).await.unwrap();
    assert_eq!(b.expand(&token, 16 << 20).await.unwrap(), 16 << 20);
    assert_eq!(b.expand(&token, 4 << 20).await.unwrap(), 16 << 20);
    assert_eq!(
        std::fs::metadata(b.directory().join("pvc-a.img")).unwrap().len(),
        16 << 20
    );
    assert_eq!(b.get(&token).await.unwrap().unwrap().size_bytes, 16 << 20);
    let err = b.expand(&token, 200 << 20).await.unwrap_err();
    assert!(matches!(err, BackendError::NoSpace { .. }), "{err}");
    let missing = b.expand(&Token::for_name("nope"), 1 << 20).await.unwrap_err();
    assert!(matches!(missing, BackendError::NotFound { .. }), "{missing}");
}

#[tokio::test]
async fn corrupt_records_are_reported_not_ignored() {
    let (b, _dir) = backend(100 << 20, 1 << 40);
    b.prepare().await.unwrap();
    std::fs::write(b.directory().join("pvc-a.json"), b"{not json").unwrap();
    let err = b.get(&Token::for_name("pvc-a")).await.unwrap_err();
    assert!(matches!(err, BackendError::CorruptRecord { .. }), "{err}");
}

#[tokio::test]
async fn detach_also_frees_a_device_whose_image_was_deleted_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let commands = Arc::new(FakeCommands::default());
    let syscalls = Arc::new(FakeSyscalls::default());
    // As when another opener holds the device at LOOP_CLR_FD: the kernel only marks it
    // for autoclear, and it goes a moment later.
    syscalls.defer_detach(std::time::Duration::from_millis(50));
    let b = backend_with(dir.path(), commands.clone(), syscalls.clone());
    let image = b.directory().join("pvc-a.img");
    syscalls.attach_loop("/dev/loop7", format!("{} (deleted)", image.display()));
    syscalls.attach_loop("/dev/loop8", b.directory().join("pvc-b.img (deleted)"));
    // Not this volume's device, even though the image's device is gone.
    assert_eq!(b.device(&Token::for_name("pvc-a")).await.unwrap(), None);
    b.detach(&Token::for_name("pvc-a")).await.unwrap();
    assert_eq!(loop_clr_fd_calls(&syscalls), vec!["LOOP_CLR_FD /dev/loop7"]);
    // Detach returns only once the deleted image's device is really gone.
    let left: Vec<_> = crate::host::Syscalls::loop_devices(syscalls.as_ref())
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.device)
        .collect();
    assert_eq!(left, [PathBuf::from("/dev/loop8")]);
}

/// A daemon restarted in a new container finds the devices its predecessor attached:
/// the kernel then prints the image's path relative to its filesystem (the old
/// container's bind mount is gone), so only the inode says it is ours.
#[tokio::test]
async fn devices_attached_by_a_previous_container_are_found_by_inode() {
    use std::os::unix::fs::MetadataExt;
    let (b, syscalls, _dir) = prepared_on_fakes().await;
    b.create(&spec("pvc-a", 8 << 20)).await.unwrap();
    b.create(&spec("pvc-b", 8 << 20)).await.unwrap();
    let inode = |name: &str| {
        let meta = std::fs::metadata(b.directory().join(format!("{name}.img"))).unwrap();
        (meta.dev(), meta.ino())
    };
    syscalls.attach_loop_by_inode("/dev/loop5", "/c/pvc-a.img", inode("pvc-a"));
    syscalls.attach_loop_by_inode("/dev/loop6", "/c/pvc-b.img", inode("pvc-b"));
    let a = Token::for_name("pvc-a");
    assert_eq!(b.device(&a).await.unwrap(), Some(PathBuf::from("/dev/loop5")));
    assert_eq!(
        b.attach(&a).await.unwrap(),
        PathBuf::from("/dev/loop5"),
        "not attached twice"
    );
    b.detach(&a).await.unwrap();
    assert_eq!(loop_clr_fd_calls(&syscalls), vec!["LOOP_CLR_FD /dev/loop5"]);
    assert_eq!(
        b.device(&Token::for_name("pvc-b")).await.unwrap(),
        Some(PathBuf::from("/dev/loop6"))
    );
}

/// Lookups cost what a node with hundreds of volumes can pay on every stats call: only
/// devices named like the image are opened for their inode, and a device once found is
/// confirmed by one sysfs read, without listing the loop devices again. A device that
/// shows another file since is looked up afresh.
#[tokio::test]
async fn lookups_open_only_the_image_own_devices_and_remember_them() {
    use std::os::unix::fs::MetadataExt;
    let (b, syscalls, _dir) = prepared_on_fakes().await;
    b.create(&spec("pvc-a", 8 << 20)).await.unwrap();
    let meta = std::fs::metadata(b.directory().join("pvc-a.img")).unwrap();
    for n in 0..50 {
        syscalls.attach_loop_by_inode(format!("/dev/loop{n}"), format!("/c/pvc-other-{n}.img"), (9, n));
    }
    syscalls.attach_loop_by_inode("/dev/loop77", "/c/pvc-a.img", (meta.dev(), meta.ino()));
    let a = Token::for_name("pvc-a");
    let count = |call: &str| syscalls.calls().iter().filter(|c| c.starts_with(call)).count();

    assert_eq!(b.device(&a).await.unwrap(), Some(PathBuf::from("/dev/loop77")));
    assert_eq!(
        count("LOOP_GET_STATUS64"),
        1,
        "only the device named like the image is opened"
    );
    assert_eq!(count("list loop devices"), 1);

    let reads = count("read backing_file /dev/loop77");
    assert_eq!(b.device(&a).await.unwrap(), Some(PathBuf::from("/dev/loop77")));
    assert_eq!(count("list loop devices"), 1, "the second lookup lists nothing");
    assert_eq!(count("read backing_file /dev/loop77"), reads + 1);

    // Detached and the number reused for another file: found again, not believed.
    syscalls.detach_loop(Path::new("/dev/loop77"));
    syscalls.attach_loop("/dev/loop77", "/elsewhere/x.img");
    assert_eq!(b.device(&a).await.unwrap(), None);
    assert_eq!(count("list loop devices"), 2);
}

/// After a restart the first lookup remembers every volume's device (each checked by
/// inode once): kubelet's stats calls for the other volumes then read one sysfs file
/// each, and list nothing.
#[tokio::test]
async fn the_first_lookup_after_a_restart_finds_every_volume_device() {
    use std::os::unix::fs::MetadataExt;
    let (b, syscalls, _dir) = prepared_on_fakes().await;
    let names: Vec<String> = (0..20).map(|n| format!("pvc-{n}")).collect();
    for (n, name) in names.iter().enumerate() {
        b.create(&spec(name, 8 << 20)).await.unwrap();
        let meta = std::fs::metadata(b.directory().join(format!("{name}.img"))).unwrap();
        // As a previous container's daemon left them: shown relative to its mount.
        syscalls.attach_loop_by_inode(
            format!("/dev/loop{n}"),
            format!("/c/{name}.img"),
            (meta.dev(), meta.ino()),
        );
    }
    // Another program's image, named as if it were a volume of this class.
    syscalls.attach_loop_by_inode("/dev/loop99", "/elsewhere/pvc-x.img", (9, 9));
    let count = |call: &str| syscalls.calls().iter().filter(|c| c.starts_with(call)).count();

    for (n, name) in names.iter().enumerate() {
        let device = b.device(&Token::for_name(name)).await.unwrap();
        assert_eq!(device, Some(PathBuf::from(format!("/dev/loop{n}"))));
    }
    assert_eq!(count("list loop devices"), 1, "one list for all 20");
    assert_eq!(count("LOOP_GET_STATUS64"), 20, "each device's inode once");
    assert_eq!(
        b.device(&Token::for_name("pvc-x")).await.unwrap(),
        None,
        "not a volume here"
    );
}

/// The LOOP_CLR_FD calls the fake syscalls saw.
fn loop_clr_fd_calls(syscalls: &FakeSyscalls) -> Vec<String> {
    syscalls
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("LOOP_CLR_FD "))
        .collect()
}

/// A create formats its image outside the allocation lock (a burst of creates must not
/// wait in line behind each other's mkfs), but its space is taken from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_formatting_its_image_holds_its_space_but_not_the_lock() {
    use std::sync::Mutex as StdMutex;
    use std::sync::mpsc;
    let dir = tempfile::tempdir().unwrap();
    let commands = Arc::new(FakeCommands::default());
    let (entered, in_mkfs) = mpsc::channel::<()>();
    let (go, wait) = mpsc::channel::<()>();
    let (entered, wait) = (StdMutex::new(entered), StdMutex::new(wait));
    commands.on("mkfs.xfs", move |_| {
        entered.lock().unwrap().send(()).unwrap();
        wait.lock().unwrap().recv().unwrap();
        Ok(crate::host::CommandOutput::default())
    });
    let syscalls = Arc::new(FakeSyscalls::default());
    syscalls.set_usage(FsUsage {
        total_bytes: 1 << 41,
        available_bytes: 1 << 40,
        ..FsUsage::default()
    });
    let b = Arc::new(LoopBackend::new(
        ClassName::parse("default").unwrap(),
        dir.path().join("c"),
        100 << 20,
        Host { commands, syscalls },
    ));
    b.prepare().await.unwrap();
    let first = {
        let b = Arc::clone(&b);
        tokio::spawn(async move { b.create(&spec("pvc-a", 60 << 20)).await })
    };
    tokio::task::spawn_blocking(move || in_mkfs.recv().unwrap())
        .await
        .unwrap();

    let block = |name: &str, size: u64| CreateSpec {
        mode: VolumeMode::Block,
        fs_type: None,
        ..spec(name, size)
    };
    let without_waiting = Duration::from_secs(5);
    let err = tokio::time::timeout(without_waiting, b.create(&block("pvc-b", 50 << 20)))
        .await
        .expect("a create waited for another's mkfs")
        .unwrap_err();
    assert!(
        matches!(err, BackendError::NoSpace { available, .. } if available == 40 << 20),
        "{err}"
    );
    tokio::time::timeout(without_waiting, b.create(&block("pvc-c", 40 << 20)))
        .await
        .expect("a create waited for another's mkfs")
        .unwrap();
    go.send(()).unwrap();
    first.await.unwrap().unwrap();
    assert_eq!(b.capacity().await.unwrap().available, 0);
    assert_eq!(b.list().await.unwrap().len(), 2);
}

/// A create that fails at any step leaves none of its files: not the image it was
/// making (the `.img.tmp` that a failed mkfs left was found by Kubernetes' e2e suite),
/// not the image in place, not the record's temporary file. Each step is made to fail
/// in turn: mkfs, the image's rename (a directory planted at its name) and the record's
/// write (a directory planted at its temporary name).
#[tokio::test]
async fn a_failed_create_leaves_nothing_at_any_step() {
    let leftovers = |dir: &Path, planted: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != planted && n != "snapshots")
            .collect();
        names.sort();
        names
    };
    let token = Token::for_name("pvc-f");
    for (step, planted) in [
        ("mkfs", String::new()),
        ("rename", format!("{token}.img")),
        ("record", format!("{token}.json.tmp")),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let commands = Arc::new(FakeCommands::default());
        if step == "mkfs" {
            commands.fail("mkfs.xfs", 1, "size 256 of data subvolume is too small");
        } else {
            commands.ok_mkfs();
        }
        let syscalls = Arc::new(FakeSyscalls::default());
        syscalls.set_usage(FsUsage {
            total_bytes: 1 << 41,
            available_bytes: 1 << 40,
            ..FsUsage::default()
        });
        let b = backend_with(dir.path(), commands, syscalls);
        b.prepare().await.unwrap();
        if !planted.is_empty() {
            let planted = b.directory().join(&planted);
            std::fs::create_dir(&planted).unwrap();
            std::fs::write(planted.join("keep"), b"not the volume's").unwrap();
        }
        let err = b.create(&spec("pvc-f", 8 << 20)).await.unwrap_err();
        assert!(
            matches!(err, BackendError::Fs(_) | BackendError::Io { .. }),
            "{step}: {err}"
        );
        assert_eq!(leftovers(b.directory(), &planted), Vec::<String>::new(), "{step}");
        assert_eq!(b.get(&token).await.unwrap(), None, "{step}");
        if !planted.is_empty() {
            assert!(
                b.directory().join(&planted).join("keep").exists(),
                "{step}: only its own files go"
            );
        }
    }
}

/// DeleteVolume also removes the temporary files a create killed midway left: a claim
/// deleted then never sees its create retried.
#[tokio::test]
async fn delete_removes_what_a_killed_create_left() {
    let (b, _syscalls, _dir) = prepared_on_fakes().await;
    let token = Token::for_name("pvc-k");
    for name in [format!("{token}.img.tmp"), format!("{token}.json.tmp")] {
        std::fs::write(b.directory().join(name), b"half").unwrap();
    }
    b.delete(&token).await.unwrap();
    let left: Vec<_> = std::fs::read_dir(b.directory())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "snapshots")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
