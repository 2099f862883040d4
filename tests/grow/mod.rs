//! The scenario of a restore and a clone larger than their source, through the
//! daemon's gRPC API, shared by tests/grow_privileged.rs (loop) and tests/vm_grow.rs
//! (lvm-thin): after NodeStageVolume the filesystem has the size asked for, not the
//! source's, and holds the source's data.

use std::path::{Path, PathBuf};

use localvol::proto::csi::v1 as csi;

use localvol_testkit::csi_client::CsiClient;
use localvol_testkit::{Cleanup, InProcessDaemon, kubelet_paths, mount_capability};

const MIB: u64 = 1 << 20;
/// xfs needs 300 MB at least.
const SOURCE: u64 = 320 * MIB;
const LARGER: u64 = 2 * SOURCE;

/// The suite's single-writer mount capability, with filesystem `fs`.
fn capability(fs: &str) -> csi::VolumeCapability {
    use csi::volume_capability::AccessType;
    let mut capability = mount_capability();
    if let Some(AccessType::Mount(mount)) = capability.access_type.as_mut() {
        mount.fs_type = fs.into();
    }
    capability
}

fn create(
    name: &str,
    fs: &str,
    bytes: u64,
    source: Option<csi::volume_content_source::Type>,
) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability(fs)],
        volume_content_source: source.map(|t| csi::VolumeContentSource { r#type: Some(t) }),
        ..Default::default()
    }
}

/// The filesystem's size as `df` shows it (blocks × fragment size), and its type.
fn filesystem(path: &Path) -> (u64, String) {
    let stat = nix::sys::statvfs::statvfs(path).unwrap();
    let size = stat.blocks() as u64 * stat.fragment_size() as u64;
    let fs_type = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(path.to_str().unwrap()))
        .and_then(|l| l.split(" - ").nth(1)?.split(' ').next().map(str::to_string))
        .unwrap_or_default();
    (size, fs_type)
}

async fn stage(csi: &CsiClient, id: &str, staging: &Path, fs: &str) {
    csi.stage(id, staging, &capability(fs))
        .await
        .unwrap_or_else(|e| panic!("stage {id}: {e}"));
}

/// Whether the class's storage marks the volume named so as waiting for its
/// filesystem to grow (the loop record's field, the LV's tag).
pub type MarkProbe<'a> = &'a dyn Fn(&str) -> bool;

/// Source, snapshot, restore and clone at twice the size, in the daemon's default
/// class; stage each copy and check the filesystem's size, the data, the mark.
pub async fn restore_and_clone_grow(daemon: &InProcessDaemon, fs: &str, marked: MarkProbe<'_>) {
    let root = daemon.dir.path().to_path_buf();
    let paths: Vec<PathBuf> = ["pv-src", "pv-restore", "pv-clone"]
        .iter()
        .map(|pv| kubelet_paths(&root, pv, "pod").0)
        .collect();
    let _cleanup = Cleanup {
        mounts: paths.clone(),
        data: daemon.data_dir(),
    };
    let csi = daemon.client().await;
    let source = csi
        .create_id(create(&format!("src-{fs}"), fs, SOURCE, None))
        .await;
    stage(&csi, &source, &paths[0], fs).await;
    let (source_size, source_fs) = filesystem(&paths[0]);
    assert_eq!(source_fs, fs);
    assert!(source_size <= SOURCE, "{source_size}");
    let data: Vec<u8> = (0..(4 * MIB) as usize).map(|i| (i % 251) as u8).collect();
    std::fs::write(paths[0].join("data"), &data).unwrap();
    std::fs::File::open(paths[0].join("data"))
        .unwrap()
        .sync_all()
        .unwrap();

    let snapshot = csi
        .snapshot(&format!("snap-{fs}"), &source)
        .await
        .unwrap()
        .snapshot_id;
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let restore = csi
        .create_id(create(
            &format!("restore-{fs}"),
            fs,
            LARGER,
            Some(Type::Snapshot(SnapshotSource {
                snapshot_id: snapshot.clone(),
            })),
        ))
        .await;
    // A clone of the staged source (frozen around its copy).
    let clone = csi
        .create_id(create(
            &format!("clone-{fs}"),
            fs,
            LARGER,
            Some(Type::Volume(VolumeSource {
                volume_id: source.clone(),
            })),
        ))
        .await;
    let copies = [format!("restore-{fs}"), format!("clone-{fs}")];
    for name in &copies {
        assert!(
            marked(name),
            "{name}: created larger than its source, marked for a grow"
        );
    }
    assert!(!marked(&format!("src-{fs}")));

    for ((id, staging), name) in [(&restore, &paths[1]), (&clone, &paths[2])]
        .into_iter()
        .zip(&copies)
    {
        stage(&csi, id, staging, fs).await;
        assert!(!marked(name), "{name}: the mark is cleared once grown");
        let (size, found_fs) = filesystem(staging);
        eprintln!("{fs}: source filesystem {source_size} bytes, {id} after stage {size} bytes");
        assert_eq!(found_fs, fs);
        // The metadata (journal, log, inode tables) takes its share; the rest is the
        // device's, twice the source's.
        assert!(
            size > source_size + SOURCE * 9 / 10,
            "{id}: the filesystem is {size} bytes after stage, the source's {source_size}: not grown"
        );
        assert!(size <= LARGER);
        assert!(
            std::fs::read(staging.join("data")).unwrap() == data,
            "{id}: data intact"
        );
        // Written past the source's size: the new space is usable.
        // Allocated, not written: as proving, and fast in an emulated guest.
        let big = std::fs::File::create(staging.join("big")).unwrap();
        nix::fcntl::posix_fallocate(&big, 0, (SOURCE + 64 * MIB) as i64)
            .unwrap_or_else(|e| panic!("{id}: allocating past the source's size: {e}"));
        drop(big);
        std::fs::remove_file(staging.join("big")).unwrap();
        // A repeated stage changes nothing.
        stage(&csi, id, staging, fs).await;
        assert_eq!(filesystem(staging).0, size);
    }
    // A second stage after an unstage finds nothing to grow and keeps the data.
    csi.unstage(&restore, &paths[1]).await.unwrap();
    stage(&csi, &restore, &paths[1], fs).await;
    assert!(std::fs::read(paths[1].join("data")).unwrap() == data);

    csi.delete_snapshot(&snapshot).await.unwrap();
    for (id, staging) in [(&source, &paths[0]), (&restore, &paths[1]), (&clone, &paths[2])] {
        csi.unstage(id, staging).await.unwrap();
        csi.delete(id).await.unwrap();
    }
}
