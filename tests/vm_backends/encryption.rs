//! Encrypted volumes (`localvol.csi.dev/encryption: luks2`) on real dm-crypt, on every
//! class that holds them (lvm, lvm-thin, pmem in lvm mode, loop), filesystem (ext4, and
//! xfs on thin) and raw block: the plaintext reaches the mapping and never the device
//! below it, a wrong passphrase changes nothing, the data comes back after an unstage
//! and a restage, the mapping grows with the volume, a key rotation done as
//! docs/encryption.md says keeps the data readable, a snapshot's restore and a clone
//! open with the source's passphrase, a suspended mapping and one closed under a staged
//! volume show in the volume's condition (the closed one healthy again once staged
//! again), a suspended mapping holds no other LVM work, and the real daemon finds an
//! open mapping after a SIGKILL.

use std::collections::HashMap;

use super::*;

const KEY: &str = "vm-suite-passphrase-1";
const ROTATED: &str = "vm-suite-passphrase-2";
const MARKER: &[u8] = b"LOCALVOL-PLAINTEXT-MARKER-4e1f9b";

fn mapping(id: &str) -> PathBuf {
    PathBuf::from(format!("/dev/mapper/localvol-crypt-{id}"))
}

/// The device below the volume's open mapping, as cryptsetup reports it.
fn backing(id: &str) -> PathBuf {
    let status = sh("cryptsetup", &["status", &format!("localvol-crypt-{id}")]);
    let line = status
        .lines()
        .find_map(|l| l.trim().strip_prefix("device:"))
        .unwrap_or_else(|| panic!("no device in {status}"));
    PathBuf::from(line.trim())
}

/// Whether `needle` occurs anywhere in the device or file at `path` (grep: a byte
/// loop of this debug build takes half a minute per 64 MiB in the emulated guest).
fn holds(path: &Path, needle: &[u8]) -> bool {
    let needle = std::str::from_utf8(needle).unwrap();
    std::process::Command::new("grep")
        .args(["-q", "-a", "-F", needle])
        .arg(path)
        .status()
        .unwrap()
        .success()
}

/// Writes MARKER into the published volume: a file, or 4 MiB into the raw device.
fn write_marker(target: &Path, block: bool) {
    if block {
        write_at(target, 4 * MIB, MARKER);
    } else {
        std::fs::write(target.join("data"), MARKER).unwrap();
    }
}

fn read_marker(target: &Path, block: bool) -> Vec<u8> {
    if block {
        let mut buf = vec![0u8; MARKER.len()];
        let mut f = std::fs::File::open(target).unwrap();
        f.seek(SeekFrom::Start(4 * MIB)).unwrap();
        f.read_exact(&mut buf).unwrap();
        buf
    } else {
        std::fs::read(target.join("data")).unwrap()
    }
}

async fn create(c: &Csi, class: &str, name: &str, size: u64, cap: &csi::VolumeCapability) -> String {
    let claim = format!("claim-{name}");
    let mut req = NewVolume {
        capability: cap.clone(),
        class: Some(class),
        pvc: Some(("vm-suite", &claim)),
        ..NewVolume::new(name, size as i64)
    }
    .request();
    req.parameters
        .insert("localvol.csi.dev/encryption".into(), "luks2".into());
    c.client.create(req).await.unwrap().volume_id
}

async fn stage(
    c: &Csi,
    id: &str,
    name: &str,
    cap: &csi::VolumeCapability,
    key: Option<&str>,
) -> Result<(), tonic::Status> {
    std::fs::create_dir_all(c.staging(name)).unwrap();
    let mut req = localvol_testkit::csi_client::stage_request(id, &c.staging(name), cap);
    if let Some(key) = key {
        req.secrets = HashMap::from([("passphrase".to_string(), key.to_string())]);
    }
    c.client.node().node_stage_volume(req).await.map(drop)
}

/// Adds `new` beside `old` in the header on `device`, then removes `old`: the rotation
/// docs/encryption.md describes, with the keys in files on a tmpfs.
fn rotate_key(device: &Path, old: &str, new: &str) {
    let dir = Path::new("/run/localvol-vm-keys");
    std::fs::create_dir_all(dir).unwrap();
    let (old_file, new_file) = (dir.join("old"), dir.join("new"));
    std::fs::write(&old_file, old).unwrap();
    std::fs::write(&new_file, new).unwrap();
    let (device, old_file, new_file) = (
        device.to_str().unwrap(),
        old_file.to_str().unwrap(),
        new_file.to_str().unwrap(),
    );
    sh(
        "cryptsetup",
        &[
            "luksAddKey",
            "--batch-mode",
            "--pbkdf-memory",
            "131072",
            "--key-file",
            old_file,
            device,
            new_file,
        ],
    );
    sh("cryptsetup", &["luksRemoveKey", "--batch-mode", device, old_file]);
    std::fs::remove_dir_all(dir).unwrap();
}

/// An encrypted volume's life on `class`. With `rotate`, the passphrase is rotated
/// between two stages; without, the volume is staged again with the same one.
async fn encrypted_lifecycle(c: &Csi, class: &str, kind: &str, rotate: bool) {
    let mut t = Steps::new(class);
    let block = kind == "block";
    let name = format!("{class}-enc-{kind}");
    let cap = if block { block_cap() } else { mount_cap(kind) };
    // xfs needs 300 MiB, and the header 2 more.
    let (size, grown) = if kind == "xfs" {
        (320 * MIB, 384 * MIB)
    } else {
        (32 * MIB, 64 * MIB)
    };
    let id = create(c, class, &name, size, &cap).await;
    t.done(&format!("create encrypted {kind}"));
    // No passphrase: refused, and nothing is attached or formatted.
    let err = stage(c, &id, &name, &cap, None).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(!mapping(&id).exists());
    stage(c, &id, &name, &cap, Some(KEY)).await.unwrap();
    t.done(&format!("stage {kind} (luksFormat+open)"));
    let device = backing(&id);
    let luks = || sh("blkid", &["-o", "value", "-s", "TYPE", device.to_str().unwrap()]);
    assert_eq!(luks().trim(), "crypto_LUKS");
    c.publish(&id, &name, &cap).await.unwrap();
    let target = c.target(&name);
    if !block {
        assert!(
            !mount_options(&c.staging(&name)).contains("dax"),
            "no DAX through dm-crypt"
        );
    }
    write_marker(&target, block);
    sh("sync", &[]);
    sh("sh", &["-c", "echo 3 > /proc/sys/vm/drop_caches"]);
    assert!(holds(&mapping(&id), MARKER), "the plaintext is on the mapping");
    assert!(
        !holds(&device, MARKER),
        "{class}: the plaintext reached {}",
        device.display()
    );
    t.done("write; plaintext only on the mapping");
    c.unpublish(&id, &name).await.unwrap();
    c.unstage(&id, &name).await.unwrap();
    assert!(!mapping(&id).exists(), "unstage closes the mapping");
    // A wrong passphrase: FAILED_PRECONDITION naming the volume, the header untouched.
    let err = stage(c, &id, &name, &cap, Some("not-the-key")).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().contains(&id), "{}", err.message());
    assert!(!mapping(&id).exists());
    // A loop volume's device is detached at unstage; an LV stays.
    if class != "loop" {
        assert_eq!(luks().trim(), "crypto_LUKS");
    }
    t.done("wrong key refused");
    let key = if rotate {
        // The rotation of docs/encryption.md; the old passphrase is then refused.
        rotate_key(&device, KEY, ROTATED);
        let err = stage(c, &id, &name, &cap, Some(KEY)).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
        ROTATED
    } else {
        KEY
    };
    stage(c, &id, &name, &cap, Some(key)).await.unwrap();
    c.publish(&id, &name, &cap).await.unwrap();
    assert_eq!(read_marker(&target, block), MARKER);
    let device = backing(&id);
    t.done(if rotate {
        "rotated key; data read back"
    } else {
        "staged again; data read back"
    });
    if rotate {
        // A suspended mapping holds the volume's I/O: its condition says so, with the
        // command that resumes it, and is healthy again once that ran.
        let dm = format!("localvol-crypt-{id}");
        // An LVM command reads every block device on the node, this mapping among them,
        // whenever lvm's hints are stale (a device came or went since its last full
        // scan): one suspended volume must not hold every class's LVM work, so the
        // daemon's lvm commands skip suspended devices. Without the hints file the
        // next command scans in full, as the first after any new mapping does. The
        // condition, and a create and a delete beside the suspended volume, come back;
        // the mapping is resumed before any of them is judged.
        let stale_hints = || match std::fs::remove_file("/run/lvm/hints") {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("/run/lvm/hints: {e}"),
            _ => {}
        };
        sh("dmsetup", &["suspend", &dm]);
        stale_hints();
        let condition = c.client.stats(&id, &target).await;
        stale_hints();
        let beside = c
            .create(
                class,
                &format!("{class}-beside-suspended"),
                8 * MIB,
                &mount_cap("ext4"),
            )
            .await;
        let beside_deleted = match &beside {
            Ok(v) => c.delete(&v.volume_id).await,
            Err(_) => Ok(()),
        };
        sh("dmsetup", &["resume", &dm]);
        let condition = condition.unwrap().volume_condition.unwrap();
        beside.unwrap();
        beside_deleted.unwrap();
        assert!(condition.abnormal, "{condition:?}");
        assert!(
            condition.message.starts_with(&format!(
                "its dm-crypt mapping {dm} is suspended: its I/O waits until `dmsetup resume {dm}`"
            )),
            "{condition:?}"
        );
        t.done("suspended mapping reported; a create and delete beside it");
    }
    if block && class == "thin" {
        // The mapping closed under the staged, published volume (by hand, or by a tool
        // that cleaned up what it took for its own; nothing holds a raw block volume's
        // mapping open without a reader): its condition says so and what to do, and
        // doing it (unstage, stage again) serves the data again, healthy.
        let dm = format!("localvol-crypt-{id}");
        sh("cryptsetup", &["close", &dm]);
        assert!(!mapping(&id).exists());
        let condition = c
            .client
            .stats(&id, &target)
            .await
            .unwrap()
            .volume_condition
            .unwrap();
        assert!(condition.abnormal, "{condition:?}");
        assert!(
            condition.message.starts_with(&format!(
                "its dm-crypt mapping {dm} is not open, so its data cannot be reached"
            )),
            "{condition:?}"
        );
        c.unpublish(&id, &name).await.unwrap();
        c.unstage(&id, &name).await.unwrap();
        stage(c, &id, &name, &cap, Some(key)).await.unwrap();
        c.publish(&id, &name, &cap).await.unwrap();
        assert_eq!(read_marker(&target, block), MARKER);
        let condition = c
            .client
            .stats(&id, &target)
            .await
            .unwrap()
            .volume_condition
            .unwrap();
        assert!(!condition.abnormal, "{condition:?}");
        t.done("closed mapping reported; staged again, healthy");
    }
    // Growth: the device, then the mapping, then the filesystem.
    let before = if block { 0 } else { c.stats_total(&id, &name).await };
    c.expand_controller(&id, grown).await.unwrap();
    let reported = c.expand_node(&id, &name, grown, &cap).await.unwrap();
    assert_eq!(reported, block_size(&device), "the volume's size is its device's");
    assert_eq!(block_size(&mapping(&id)), block_size(&device) - 2 * MIB);
    assert!(block_size(&device) >= grown);
    if !block {
        let total = c.stats_total(&id, &name).await;
        assert!(
            total > before + (grown - size) / 2,
            "{class} {kind}: the filesystem grew online: {before} -> {total}"
        );
    }
    assert_eq!(read_marker(&target, block), MARKER);
    t.done("expand (device, mapping, fs)");
    c.unpublish(&id, &name).await.unwrap();
    c.unstage(&id, &name).await.unwrap();
    c.delete(&id).await.unwrap();
    assert!(!mapping(&id).exists());
    assert!(!c.listed(&id).await);
    assert!(
        leftovers(class, &name).is_empty(),
        "{:?}",
        leftovers(class, &name)
    );
    t.done("unstage+delete");
}

pub async fn encrypted_volumes_on_lvm_classes() {
    let d = daemon().await;
    let c = Csi::of(&d).await;
    for (class, kind, rotate) in [
        ("thick", "ext4", true),
        ("thick", "block", false),
        ("thin", "xfs", false),
        ("thin", "block", false),
        ("pmem-lvm", "ext4", false),
        ("pmem-lvm", "block", false),
        ("loop", "ext4", false),
        ("loop", "block", false),
    ] {
        encrypted_lifecycle(&c, class, kind, rotate).await;
    }
    encrypted_copies(&c).await;
    // PMEM direct refuses at create, before anything is made.
    let claim = "claim-pmem-enc".to_string();
    let mut req = NewVolume {
        capability: mount_cap("ext4"),
        class: Some("pmem"),
        pvc: Some(("vm-suite", &claim)),
        ..NewVolume::new("pmem-enc", 64 * MIB as i64)
    }
    .request();
    req.parameters
        .insert("localvol.csi.dev/encryption".into(), "luks2".into());
    let err = c.client.create(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(err.message().contains("DAX"), "{}", err.message());
}

/// A snapshot and a clone of an encrypted thin volume keep its header: they open with
/// the source's passphrase and hold its data. A copy asked without encryption is
/// refused, before anything is made.
async fn encrypted_copies(c: &Csi) {
    let mut t = Steps::new("thin");
    let cap = mount_cap("ext4");
    let id = create(c, "thin", "thin-enc-origin", 32 * MIB, &cap).await;
    stage(c, &id, "thin-enc-origin", &cap, Some(KEY)).await.unwrap();
    c.publish(&id, "thin-enc-origin", &cap).await.unwrap();
    write_marker(&c.target("thin-enc-origin"), false);
    sh("sync", &[]);
    let snapshot = c.client.snapshot("thin-enc-snap", &id).await.unwrap().snapshot_id;
    t.done("origin staged, written, snapshot taken");
    let copy_request = |name: &'static str, content: csi::volume_content_source::Type, encrypted: bool| {
        let mut req = NewVolume {
            capability: cap.clone(),
            class: Some("thin"),
            ..NewVolume::new(name, 32 * MIB as i64)
        }
        .request();
        req.volume_content_source = Some(csi::VolumeContentSource {
            r#type: Some(content),
        });
        if encrypted {
            req.parameters
                .insert("localvol.csi.dev/encryption".into(), "luks2".into());
        }
        req
    };
    let from_snapshot = || {
        csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource {
            snapshot_id: snapshot.clone(),
        })
    };
    let from_volume = || {
        csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource {
            volume_id: id.clone(),
        })
    };
    let err = c
        .client
        .create(copy_request("thin-plain-restore", from_snapshot(), false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(err.message().contains("encrypted"), "{}", err.message());
    for (name, content) in [
        ("thin-enc-restore", from_snapshot()),
        ("thin-enc-clone", from_volume()),
    ] {
        let copy = c
            .client
            .create(copy_request(name, content, true))
            .await
            .unwrap()
            .volume_id;
        stage(c, &copy, name, &cap, Some(KEY)).await.unwrap();
        c.publish(&copy, name, &cap).await.unwrap();
        assert_eq!(read_marker(&c.target(name), false), MARKER, "{name}");
        c.unpublish(&copy, name).await.unwrap();
        c.unstage(&copy, name).await.unwrap();
        c.delete(&copy).await.unwrap();
    }
    t.done("restore and clone opened with the source's key");
    c.client.delete_snapshot(&snapshot).await.unwrap();
    c.unpublish(&id, "thin-enc-origin").await.unwrap();
    c.unstage(&id, "thin-enc-origin").await.unwrap();
    c.delete(&id).await.unwrap();
    assert!(leftovers("thin", "thin-enc-origin").is_empty());
}

/// The real daemon, logging at debug, SIGKILLed with an encrypted volume published:
/// the new one finds the open mapping in the kernel, the pod's data is intact, and
/// unstage closes the mapping. Neither passphrase ever shows in its log (which holds
/// every command line it runs), nor in the error a wrong one gets.
pub async fn encrypted_volumes_survive_a_daemon_kill() {
    let dir = tempfile::Builder::new()
        .prefix("localvol-vm-enc-")
        .tempdir()
        .unwrap();
    let config = restarts::single_class_config("thin");
    let log = dir.path().join("daemon.log");
    let name = "thin-enc-kill";
    let cap = mount_cap("ext4");
    let mut t = Steps::new("thin");
    let p = restarts::Process::start_logging(dir.path(), &config, &log).await;
    let id = create(&p.csi, "thin", name, 32 * MIB, &cap).await;
    stage(&p.csi, &id, name, &cap, Some(KEY)).await.unwrap();
    p.csi.unstage(&id, name).await.unwrap();
    let err = stage(&p.csi, &id, name, &cap, Some("wrong-passphrase-in-log-check"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        !err.message().contains("wrong-passphrase-in-log-check"),
        "{}",
        err.message()
    );
    stage(&p.csi, &id, name, &cap, Some(KEY)).await.unwrap();
    p.csi.publish(&id, name, &cap).await.unwrap();
    write_marker(&p.csi.target(name), false);
    p.kill().await;
    t.done("create, stage, publish, write; SIGKILL");
    let p = restarts::Process::start_logging(dir.path(), &config, &log).await;
    // kubelet repeats the stage and publish after a restart: both find them done.
    stage(&p.csi, &id, name, &cap, Some(KEY)).await.unwrap();
    p.csi.publish(&id, name, &cap).await.unwrap();
    assert_eq!(read_marker(&p.csi.target(name), false), MARKER);
    p.csi.unpublish(&id, name).await.unwrap();
    p.csi.unstage(&id, name).await.unwrap();
    assert!(!mapping(&id).exists(), "the new daemon closed the mapping");
    p.csi.delete(&id).await.unwrap();
    p.kill().await;
    t.done("restart: stage, publish, read back, unstage, delete");
    // The debug log holds every command's argv ("running" lines) and every error.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("cryptsetup open"),
        "the debug log shows the commands"
    );
    for secret in [KEY, "wrong-passphrase-in-log-check"] {
        assert!(!text.contains(secret), "{secret} in the daemon's log");
    }
}
