use super::*;
use crate::crypt::Passphrase;
use crate::host::fake::{failed, succeeded};
use crate::model::Encryption;

const KEY: &[u8] = b"tenant-key-7f3a";

/// cryptsetup as the fake machine plays it: open makes the mapping's node on the
/// device it names, close removes it, and an open with any key but `KEY` is refused
/// as cryptsetup refuses it (exit 2).
fn play_cryptsetup(f: &Fixture) {
    let syscalls = f.syscalls.clone();
    f.commands.on("cryptsetup", move |cmd| {
        let args: Vec<String> = cmd
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let key = cmd.secret_input.as_ref().map(|k| k.to_vec());
        match args[0].as_str() {
            "luksFormat" => succeeded(""),
            "open" if key.as_deref() != Some(KEY) => failed(cmd, 2, "No key available with this passphrase."),
            "open" => {
                let (device, name) = (&args[args.len() - 2], &args[args.len() - 1]);
                syscalls.add_mapping(
                    format!("/dev/mapper/{name}"),
                    253,
                    40,
                    62 << 20,
                    Path::new(device),
                );
                succeeded("")
            }
            "close" => {
                syscalls.remove_device(&Path::new("/dev/mapper").join(&args[1]));
                succeeded("")
            }
            _ => failed(cmd, 1, "unscripted"),
        }
    });
}

async fn encrypted(f: &Fixture, name: &str, access: AccessType) -> VolumeId {
    let mut req = create_req(name, access, 64 << 20, None);
    req.encryption = Some(Encryption {
        allow_discards: false,
    });
    let guard = f.locks.try_lock(&req.token, "create").unwrap();
    f.volumes.create(&guard, &req).await.unwrap().record.id
}

fn with_key(mut req: StageRequest, key: &[u8]) -> StageRequest {
    req.passphrase = Passphrase::new(key);
    req
}

async fn unstage(f: &Fixture, id: &VolumeId) -> Result<(), VolumeError> {
    let req = UnstageRequest {
        id: id.clone(),
        staging_path: f.host_path("stage"),
    };
    let guard = f.locks.try_lock(&id.token, "unstage").unwrap();
    f.volumes.unstage(&guard, &req).await
}

fn mapping(id: &VolumeId) -> PathBuf {
    PathBuf::from(format!("/dev/mapper/localvol-crypt-{id}"))
}

#[tokio::test]
async fn the_first_stage_makes_the_header_then_the_filesystem_on_the_mapping() {
    let f = Fixture::new();
    play_cryptsetup(&f);
    let id = encrypted(&f, "pvc-enc", ext4()).await;
    // Nothing is formatted at create: the filesystem needs the mapping, and the
    // mapping the passphrase that only stage is given.
    assert!(f.commands.calls().is_empty(), "{:?}", f.commands.calls());
    f.stage(&with_key(f.stage_req(&id, ext4()), KEY)).await.unwrap();
    let dm = mapping(&id);
    assert_eq!(
        f.commands.calls(),
        [
            format!(
                "cryptsetup luksFormat --type luks2 --batch-mode --key-file=- --pbkdf argon2id --pbkdf-memory 131072 \
                 --iter-time 2000 --luks2-metadata-size 16k --luks2-keyslots-size 2016k --offset 4096 {LOOP_DEV}"
            ),
            format!(
                "cryptsetup open --type luks2 --key-file=- --disable-keyring {LOOP_DEV} localvol-crypt-{id}"
            ),
            format!(
                "mkfs.ext4 -F -q -E lazy_itable_init=1,lazy_journal_init=1 {}",
                dm.display()
            ),
        ]
    );
    let mounts = f.syscalls.mounts();
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0].source, dm);
    // Staged again: found open and mounted, nothing made again.
    f.stage(&with_key(f.stage_req(&id, ext4()), KEY)).await.unwrap();
    assert_eq!(f.commands.calls().len(), 3, "{:?}", f.commands.calls());
}

#[tokio::test]
async fn unstage_closes_the_mapping_and_a_restage_after_a_restart_opens_without_formatting() {
    let mut f = Fixture::new();
    play_cryptsetup(&f);
    let id = encrypted(&f, "pvc-enc", ext4()).await;
    f.stage(&with_key(f.stage_req(&id, ext4()), KEY)).await.unwrap();
    unstage(&f, &id).await.unwrap();
    assert_eq!(
        f.commands.calls().last().unwrap(),
        &format!("cryptsetup close localvol-crypt-{id}")
    );
    assert!(f.syscalls.mounts().is_empty());
    f.restart();
    f.stage(&with_key(f.stage_req(&id, ext4()), KEY)).await.unwrap();
    let calls = f.commands.calls();
    let after: Vec<&String> = calls.iter().skip(4).collect();
    assert_eq!(
        after,
        [&format!(
            "cryptsetup open --type luks2 --key-file=- --disable-keyring {LOOP_DEV} localvol-crypt-{id}"
        )]
    );
    assert_eq!(f.syscalls.mounts()[0].source, mapping(&id));
}

#[tokio::test]
async fn without_a_passphrase_nothing_is_touched() {
    let f = Fixture::new();
    play_cryptsetup(&f);
    let id = encrypted(&f, "pvc-enc", ext4()).await;
    let err = f.stage(&f.stage_req(&id, ext4())).await.unwrap_err();
    assert!(matches!(err, VolumeError::MissingPassphrase { .. }), "{err:?}");
    assert!(err.to_string().contains("node-stage-secret-name"), "{err}");
    assert!(f.commands.calls().is_empty(), "{:?}", f.commands.calls());
    assert!(f.loop_calls("LOOP_CONFIGURE").is_empty());
}

#[tokio::test]
async fn a_wrong_passphrase_formats_nothing_and_names_the_volume() {
    let f = Fixture::new();
    play_cryptsetup(&f);
    let id = encrypted(&f, "pvc-enc", ext4()).await;
    f.stage(&with_key(f.stage_req(&id, ext4()), KEY)).await.unwrap();
    unstage(&f, &id).await.unwrap();
    let before = f.commands.calls().len();
    let err = f
        .stage(&with_key(f.stage_req(&id, ext4()), b"guess"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            VolumeError::Crypt {
                source: crate::crypt::CryptError::WrongPassphrase { .. },
                ..
            }
        ),
        "{err:?}"
    );
    let status = tonic::Status::from(crate::error::Error::from(err));
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(status.message().contains(&id.to_string()), "{}", status.message());
    let calls = f.commands.calls();
    assert_eq!(calls.len(), before + 1, "{calls:?}");
    assert!(calls[before].starts_with("cryptsetup open"), "{calls:?}");
    assert!(f.syscalls.mounts().is_empty());
}

#[tokio::test]
async fn an_encrypted_raw_block_volume_is_published_from_its_mapping() {
    let f = Fixture::new();
    play_cryptsetup(&f);
    let id = encrypted(&f, "pvc-blk", AccessType::Block).await;
    f.stage(&with_key(f.stage_req(&id, AccessType::Block), KEY))
        .await
        .unwrap();
    f.publish(&f.publish_req(&id, "target", AccessType::Block, false))
        .await
        .unwrap();
    let binds = f.syscalls.mounts();
    assert_eq!(binds.len(), 1);
    assert_eq!(binds[0].source, mapping(&id));
    assert!(f.commands.calls_of("mkfs.ext4").is_empty());
}

#[tokio::test]
async fn the_key_shows_in_no_argv_or_error() {
    let f = Fixture::new();
    play_cryptsetup(&f);
    let id = encrypted(&f, "pvc-enc", ext4()).await;
    f.stage(&with_key(f.stage_req(&id, ext4()), KEY)).await.unwrap();
    unstage(&f, &id).await.unwrap();
    let err = f
        .stage(&with_key(f.stage_req(&id, ext4()), b"wrong-key-9c1d"))
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?} {}", crate::model::full_message(&err));
    for key in ["tenant-key-7f3a", "wrong-key-9c1d"] {
        assert!(
            f.commands.calls().iter().all(|c| !c.contains(key)),
            "{key} in argv"
        );
        assert!(!shown.contains(key), "{key} in the error: {shown}");
    }
}

/// A staged encrypted volume's condition says when its mapping stops carrying its I/O:
/// suspended, until it is resumed; closed by hand under a published block device, until
/// the volume is staged again. The bind the close left is no longer proven the volume's,
/// but the stats still answer, with the condition and the size CreateVolume gave.
#[tokio::test]
async fn a_suspended_or_closed_mapping_makes_the_volume_abnormal() {
    let f = Fixture::new();
    play_cryptsetup(&f);
    let id = encrypted(&f, "pvc-blk", AccessType::Block).await;
    f.stage(&with_key(f.stage_req(&id, AccessType::Block), KEY))
        .await
        .unwrap();
    f.publish(&f.publish_req(&id, "target", AccessType::Block, false))
        .await
        .unwrap();
    let condition = || f.condition(&id, "target");
    let healthy = condition().await;
    assert!(!healthy.abnormal, "{healthy:?}");

    f.syscalls.set_device_mapper_suspended((253, 40), true);
    let c = condition().await;
    assert!(c.abnormal, "{c:?}");
    assert_eq!(
        c.message,
        format!(
            "its dm-crypt mapping localvol-crypt-{id} is suspended: its I/O waits until \
             `dmsetup resume localvol-crypt-{id}` (on {LOOP_DEV})"
        )
    );
    f.syscalls.set_device_mapper_suspended((253, 40), false);
    assert_eq!(condition().await, healthy);

    f.syscalls.remove_device(&mapping(&id));
    let stats = f.volumes.stats(&f.stats_req(&id, "target")).await.unwrap();
    assert_eq!(stats.usage, Usage::Block { size_bytes: 64 << 20 });
    assert!(stats.condition.abnormal, "{:?}", stats.condition);
    assert_eq!(
        stats.condition.message,
        format!(
            "its dm-crypt mapping localvol-crypt-{id} is not open, so its data cannot be reached: \
             unpublish and unstage the volume, and stage it again (on {LOOP_DEV})"
        )
    );
    // At any path but the publication the proof decides as ever.
    let elsewhere = f.volumes.stats(&f.stats_req(&id, "stage")).await.unwrap_err();
    assert!(
        matches!(elsewhere, VolumeError::NotAtPath { .. }),
        "{elsewhere:?}"
    );

    // What the condition says to do serves the volume again: the bind the close left is
    // the volume's to unpublish, and a new stage opens the mapping.
    f.unpublish(&id, "target").await.unwrap();
    assert!(f.syscalls.mounts().is_empty(), "{:?}", f.syscalls.mounts());
    assert!(!f.path("target").exists());
    unstage(&f, &id).await.unwrap();
    f.stage(&with_key(f.stage_req(&id, AccessType::Block), KEY))
        .await
        .unwrap();
    f.publish(&f.publish_req(&id, "target", AccessType::Block, false))
        .await
        .unwrap();
    assert_eq!(condition().await, healthy);
}

/// A bind the daemon did not make is never taken for a lost one: a device node gone
/// under a target this daemon never published the volume at is not the volume's, and
/// unpublish there unmounts nothing.
#[tokio::test]
async fn a_lost_device_bind_the_daemon_did_not_make_is_left_alone() {
    let f = Fixture::new();
    play_cryptsetup(&f);
    let id = encrypted(&f, "pvc-blk", AccessType::Block).await;
    f.stage(&with_key(f.stage_req(&id, AccessType::Block), KEY))
        .await
        .unwrap();
    // Someone else's bind of the mapping at a path kubelet could name.
    std::fs::write(f.path("other"), b"").unwrap();
    f.syscalls.add_device("/dev/mapper/theirs", 253, 41, 62 << 20);
    f.syscalls
        .mount(MountCall {
            source: "/dev/mapper/theirs".into(),
            target: f.path("other"),
            fs_type: None,
            flags: nix::mount::MsFlags::MS_BIND,
            data: None,
        })
        .await
        .unwrap();
    f.syscalls.remove_device(Path::new("/dev/mapper/theirs"));
    let err = f.volumes.stats(&f.stats_req(&id, "other")).await.unwrap_err();
    assert!(matches!(err, VolumeError::NotAtPath { .. }), "{err:?}");
    let err = f.unpublish(&id, "other").await.unwrap_err();
    assert!(matches!(err, VolumeError::Occupied { .. }), "{err:?}");
    assert_eq!(f.syscalls.mounts().len(), 1);
}
