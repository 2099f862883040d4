//! FIFREEZE around a snapshot of a staged loop volume, on a real loop device with real
//! xfs and ext4 (root; fails as non-root unless SKIP_PRIVILEGED=1).
//!
//! The volumes run on the real host seam except for one wrapper around `copy_file`: it
//! tells the test the copy has begun and waits for the test's word, so the test looks at
//! the filesystem while the copy is under way, with no sleep deciding the outcome:
//! - frozen during the copy: our own FIFREEZE of the mount answers EBUSY (the kernel's
//!   "already frozen"), and a write started then is still not done when the copy is let go;
//! - thawed after it, on success and when the copy fails: FITHAW answers EINVAL ("not
//!   frozen"), that write completes, and no freeze record is left.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use localvol::host::{
    CopyMethod, FilesystemState, FsUsage, Host, LoopDevice, MountCall, MountedAt, SyscallError, Syscalls,
    SystemCommands, SystemSyscalls,
};
use localvol::locks::VolumeLocks;
use localvol::proto::csi::v1 as csi;
use localvol::request::{CreateRequest, KubeletRoots, SnapshotRequest, StageRequest, UnstageRequest};
use localvol::volume::Volumes;
use localvol_testkit::{Cleanup, kubelet_paths, privileged};
use tokio::sync::{mpsc, oneshot};

/// What the test tells a held copy to do.
enum Release {
    Copy,
    Fail,
}

/// The real syscalls, with each `copy_file` held until the test releases it.
struct HeldCopies {
    real: SystemSyscalls,
    started: mpsc::UnboundedSender<oneshot::Sender<Release>>,
}

#[async_trait]
impl Syscalls for HeldCopies {
    async fn mount(&self, call: MountCall) -> Result<(), SyscallError> {
        self.real.mount(call).await
    }
    async fn umount(&self, target: &Path) -> Result<(), SyscallError> {
        self.real.umount(target).await
    }
    async fn mountinfo(&self) -> Result<String, SyscallError> {
        self.real.mountinfo().await
    }
    async fn mount_at(&self, path: &Path) -> Result<Option<MountedAt>, SyscallError> {
        self.real.mount_at(path).await
    }
    async fn statvfs(&self, path: &Path) -> Result<FsUsage, SyscallError> {
        self.real.statvfs(path).await
    }
    async fn block_device_size(&self, device: &Path) -> Result<u64, SyscallError> {
        self.real.block_device_size(device).await
    }
    async fn device_head(&self, device: &Path, len: usize) -> Result<Vec<u8>, SyscallError> {
        self.real.device_head(device, len).await
    }
    async fn device_number(&self, path: &Path) -> Result<Option<u64>, SyscallError> {
        self.real.device_number(path).await
    }
    async fn device_slaves(&self, dev: u64) -> Result<Vec<u64>, SyscallError> {
        self.real.device_slaves(dev).await
    }
    async fn fitrim(&self, path: &Path) -> Result<u64, SyscallError> {
        self.real.fitrim(path).await
    }
    async fn loop_devices(&self) -> Result<Vec<LoopDevice>, SyscallError> {
        self.real.loop_devices().await
    }
    async fn loop_backing_inode(&self, device: &Path) -> Result<Option<(u64, u64)>, SyscallError> {
        self.real.loop_backing_inode(device).await
    }
    async fn loop_backing_file(&self, device: &Path) -> Result<Option<PathBuf>, SyscallError> {
        self.real.loop_backing_file(device).await
    }
    async fn loop_attach(&self, image: &Path) -> Result<PathBuf, SyscallError> {
        self.real.loop_attach(image).await
    }
    async fn loop_detach(&self, device: &Path) -> Result<(), SyscallError> {
        self.real.loop_detach(device).await
    }
    async fn copy_file(&self, source: &Path, target: &Path) -> Result<CopyMethod, SyscallError> {
        let (release, released) = oneshot::channel();
        self.started.send(release).expect("the test waits for copies");
        match released.await.expect("the test releases every copy") {
            Release::Copy => self.real.copy_file(source, target).await,
            Release::Fail => Err(SyscallError {
                call: "copy",
                path: target.to_path_buf(),
                source: std::io::Error::from_raw_os_error(libc::EIO),
            }),
        }
    }
    async fn freeze(&self, path: &Path) -> Result<(), SyscallError> {
        self.real.freeze(path).await
    }
    async fn thaw(&self, path: &Path) -> Result<(), SyscallError> {
        self.real.thaw(path).await
    }
    async fn device_mapper_names(&self) -> Result<Vec<String>, SyscallError> {
        self.real.device_mapper_names().await
    }
    async fn device_mapper_suspended(&self, dev: u64) -> Result<bool, SyscallError> {
        self.real.device_mapper_suspended(dev).await
    }
    async fn bad_sectors(&self, dev: u64) -> Result<u64, SyscallError> {
        self.real.bad_sectors(dev).await
    }
    async fn filesystem_state(&self, mount: &MountedAt) -> FilesystemState {
        self.real.filesystem_state(mount).await
    }
}

/// FIFREEZE (or FITHAW) of the filesystem mounted at `path`, by the test itself: the errno.
fn freeze_ioctl(path: &Path, thaw: bool) -> Option<i32> {
    use std::os::fd::AsRawFd;
    // FIFREEZE = _IOWR('X', 119, int), FITHAW = _IOWR('X', 120, int).
    nix::ioctl_readwrite!(fifreeze, b'X', 119, libc::c_int);
    nix::ioctl_readwrite!(fithaw, b'X', 120, libc::c_int);
    let dir = std::fs::File::open(path).unwrap();
    let mut unused: libc::c_int = 0;
    // SAFETY: the fd is open for the call; the argument is an int the kernel ignores.
    let result = unsafe {
        if thaw {
            fithaw(dir.as_raw_fd(), &mut unused)
        } else {
            fifreeze(dir.as_raw_fd(), &mut unused)
        }
    };
    result.err().map(|e| e as i32)
}

/// Files below `dir` whose name ends in `suffix`.
fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.to_string_lossy().ends_with(suffix) {
                found.push(path);
            }
        }
    }
    found
}

/// A write and fsync into the mounted filesystem, on a thread of its own: it blocks for
/// as long as the filesystem is frozen. `done` is set when it returns.
fn start_write(mount: &Path, name: &str) -> (std::thread::JoinHandle<()>, Arc<Mutex<bool>>) {
    use std::io::Write;
    let done = Arc::new(Mutex::new(false));
    let (path, flag) = (mount.join(name), Arc::clone(&done));
    let writer = std::thread::spawn(move || {
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(b"written while a snapshot was taken").unwrap();
        file.sync_all().unwrap();
        *flag.lock().unwrap() = true;
    });
    (writer, done)
}

struct ThawOnDrop(PathBuf);

impl Drop for ThawOnDrop {
    fn drop(&mut self) {
        if self.0.exists() {
            freeze_ioctl(&self.0, true);
        }
    }
}

const WAIT: Duration = Duration::from_secs(60);

/// The staged volume and what the test drives it with.
struct Staged {
    volumes: Arc<Volumes>,
    locks: VolumeLocks,
    copies: mpsc::UnboundedReceiver<oneshot::Sender<Release>>,
    id: String,
    mount: PathBuf,
    data: PathBuf,
}

/// One snapshot of the staged volume, its copy held: frozen while held, thawed after
/// the copy is let go (`release`). Returns whether the snapshot call succeeded.
async fn snapshot_while_held(staged: &mut Staged, name: &str, release: Release) -> bool {
    let (mount, data) = (staged.mount.clone(), staged.data.clone());
    let (mount, data) = (mount.as_path(), data.as_path());
    let req = SnapshotRequest::try_from(&csi::CreateSnapshotRequest {
        source_volume_id: staged.id.clone(),
        name: name.to_string(),
        ..Default::default()
    })
    .unwrap();
    let guard = staged.locks.try_lock(&req.source.token, "snapshot").unwrap();
    let call = {
        let volumes = Arc::clone(&staged.volumes);
        tokio::spawn(async move { volumes.create_snapshot(&guard, &req).await })
    };
    let copy = tokio::time::timeout(WAIT, staged.copies.recv())
        .await
        .expect("the snapshot reaches its copy")
        .unwrap();

    // The copy is under way: the filesystem is frozen, by the freeze record's mount.
    let records = files_ending(data, ".freeze");
    assert_eq!(records.len(), 1, "one freeze record during the copy: {records:?}");
    assert_eq!(
        std::fs::read_to_string(&records[0]).unwrap(),
        mount.to_str().unwrap()
    );
    let busy = freeze_ioctl(mount, false);
    if busy.is_none() {
        // We froze it ourselves: it was not frozen. Thaw before failing.
        freeze_ioctl(mount, true);
    }
    assert_eq!(
        busy,
        Some(libc::EBUSY),
        "FIFREEZE during the copy: the filesystem is already frozen"
    );
    let (writer, done) = start_write(mount, &format!("{name}.written"));
    // A write to a filesystem that is not frozen finishes in milliseconds; a frozen one
    // holds it until the thaw, however long this waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !*done.lock().unwrap(),
        "a write finished while the filesystem was frozen"
    );

    let _ = copy.send(release);
    let result = tokio::time::timeout(WAIT, call)
        .await
        .expect("the snapshot call returns")
        .unwrap();
    // Thawed: FITHAW finds nothing frozen (and thaws what a bug left frozen, so that
    // the write below cannot hang the test), the held write completes, no record stays.
    assert_eq!(
        freeze_ioctl(mount, true),
        Some(libc::EINVAL),
        "FITHAW after the call: not frozen"
    );
    tokio::task::spawn_blocking(move || writer.join().unwrap())
        .await
        .unwrap();
    assert!(*done.lock().unwrap());
    assert_eq!(files_ending(data, ".freeze"), Vec::<PathBuf>::new());
    assert_eq!(
        files_ending(data, ".tmp"),
        Vec::<PathBuf>::new(),
        "no copy left half-written"
    );
    result.is_ok()
}

async fn freeze_around_snapshots(fs: &str) {
    if !privileged() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("localvol-freeze-")
        .tempdir()
        .unwrap();
    let data = dir.path().join("data");
    let (staging, _) = kubelet_paths(dir.path(), "pv-freeze", "pod-uid-1");
    let _cleanup = Cleanup {
        mounts: vec![staging.clone()],
        data: data.clone(),
    };
    // Dropped first on a failure: a filesystem left frozen would hang whatever touches it.
    let _thaw = ThawOnDrop(staging.clone());
    let (started, copies) = mpsc::unbounded_channel();
    let host = Host {
        commands: Arc::new(SystemCommands),
        syscalls: Arc::new(HeldCopies {
            real: SystemSyscalls,
            started,
        }),
    };
    let classes = localvol::config::load_classes(None, &data, 1 << 30).unwrap();
    let volumes = Arc::new(Volumes::open(&classes, &data, "test-node", host).await.unwrap());
    let locks = VolumeLocks::default();
    let capability = csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: fs.to_string(),
                ..Default::default()
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    };
    let create = CreateRequest::try_from(&csi::CreateVolumeRequest {
        name: format!("pvc-freeze-{fs}"),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 320 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability.clone()],
        ..Default::default()
    })
    .unwrap();
    let id = {
        let guard = locks.try_lock(&create.token, "create").unwrap();
        volumes
            .create(&guard, &create)
            .await
            .unwrap()
            .record
            .id
            .to_string()
    };
    let roots = KubeletRoots::new(vec![dir.path().to_path_buf()]);
    let stage = StageRequest::parse(
        &csi::NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability),
            ..Default::default()
        },
        &roots,
    )
    .unwrap();
    {
        let guard = locks.try_lock(&stage.id.token, "stage").unwrap();
        volumes.stage(&guard, &stage).await.unwrap();
    }
    let fstype = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(staging.to_str().unwrap()))
        .and_then(|l| l.split(" - ").nth(1)?.split(' ').next().map(str::to_string));
    assert_eq!(fstype.as_deref(), Some(fs), "staged as {fs}");
    std::fs::write(staging.join("before"), b"before the snapshot").unwrap();

    let mut staged = Staged {
        volumes,
        locks,
        copies,
        id,
        mount: staging.clone(),
        data: data.clone(),
    };
    assert!(
        snapshot_while_held(&mut staged, "snapshot-freeze-ok", Release::Copy).await,
        "the snapshot whose copy went through succeeds"
    );
    assert_eq!(
        files_ending(&data, "snapshot-freeze-ok.json").len(),
        1,
        "its record is written"
    );
    assert!(
        !snapshot_while_held(&mut staged, "snapshot-freeze-fails", Release::Fail).await,
        "the snapshot whose copy failed fails"
    );
    assert_eq!(
        files_ending(&data, "snapshot-freeze-fails.json"),
        Vec::<PathBuf>::new()
    );
    assert_eq!(
        std::fs::read(staging.join("before")).unwrap(),
        b"before the snapshot"
    );
    let Staged {
        volumes, locks, id, ..
    } = staged;

    let unstage = UnstageRequest::parse(
        &csi::NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        },
        &roots,
    )
    .unwrap();
    let guard = locks.try_lock(&unstage.id.token, "unstage").unwrap();
    volumes.unstage(&guard, &unstage).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xfs_is_frozen_during_a_snapshot_copy_and_thawed_after_success_and_failure() {
    freeze_around_snapshots("xfs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext4_is_frozen_during_a_snapshot_copy_and_thawed_after_success_and_failure() {
    freeze_around_snapshots("ext4").await;
}
