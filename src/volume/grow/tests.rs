//! Stage of a restore or clone larger than its source: the exact grow commands, their
//! order around the mount, the mark cleared only after they succeed, and repeats that
//! do nothing.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::backend::{Backend, CopySource, CreateSpec, LoopBackend};
use crate::fs::{FsError, FsType};
use crate::host::fake::{FakeCommands, FakeSyscalls};
use crate::host::{CommandError, CommandOutput, FsUsage, Host};
use crate::locks::VolumeLocks;
use crate::model::{AccessMode, AccessType, Capability, ClaimRef, ClassName, Token, VolumeId, VolumeMode};
use crate::request::{HostPath, StageRequest, VolumeContext};
use crate::volume::{VolumeError, Volumes};

const DEVICE: &str = "/dev/loop-grow3";
const MIB: u64 = 1 << 20;

/// A loop class holding `source`, a formatted 64 MiB volume of `fs_type`, and `copy`,
/// its clone of `copy_size` bytes; blkid finds `fs_type` on every device.
struct Setup {
    volumes: Volumes,
    /// The same class, to look at its records.
    class: LoopBackend,
    commands: Arc<FakeCommands>,
    syscalls: FakeSyscalls,
    dir: tempfile::TempDir,
    /// Failures to answer the next runs of a program with: (program, exit code).
    failures: Arc<Mutex<Vec<(&'static str, i32)>>>,
    /// Each grow command run, and whether the staging path was mounted then.
    grows: Arc<Mutex<Vec<String>>>,
    copy: VolumeId,
}

fn spec(name: &str, size: u64, mode: VolumeMode, fs_type: FsType) -> CreateSpec {
    CreateSpec {
        token: Token::for_name(name),
        name: name.to_string(),
        size_bytes: size,
        mode,
        fs_type: (mode == VolumeMode::Filesystem).then_some(fs_type),
        claim: ClaimRef::default(),
        encryption: None,
    }
}

impl Setup {
    async fn new(fs_type: FsType, copy_size: u64, copy_mode: VolumeMode) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let commands = Arc::new(FakeCommands::default());
        commands.ok_mkfs();
        let syscalls = FakeSyscalls::default();
        syscalls.add_device(DEVICE, 7, 3, copy_size);
        syscalls.set_usage(FsUsage {
            total_bytes: 100 << 30,
            available_bytes: 50 << 30,
            ..FsUsage::default()
        });
        let failures: Arc<Mutex<Vec<(&'static str, i32)>>> = Arc::default();
        syscalls.add_free_loop(DEVICE);
        commands.ok("blkid", &format!("TYPE={fs_type}\nUSAGE=filesystem\n"));
        let grows: Arc<Mutex<Vec<String>>> = Arc::default();
        for program in ["e2fsck", "resize2fs", "xfs_growfs"] {
            let failures = Arc::clone(&failures);
            let (grows, syscalls, staging) = (Arc::clone(&grows), syscalls.clone(), dir.path().join("stage"));
            commands.on(program, move |cmd| {
                let state = if syscalls.mount_points().contains(&staging) {
                    "mounted"
                } else {
                    "unmounted"
                };
                grows
                    .lock()
                    .unwrap()
                    .push(format!("{program} {} ({state})", cmd.args_display()));
                let mut failures = failures.lock().unwrap();
                match failures.iter().position(|(p, _)| *p == program) {
                    Some(i) => Err(CommandError::Failed {
                        program: cmd.program,
                        args: cmd.args_display(),
                        exit_code: Some(failures.remove(i).1),
                        stdout: String::new(),
                        stderr: format!("{program} failed in the test\n"),
                    }),
                    None => Ok(CommandOutput::default()),
                }
            });
        }
        let host = Host {
            commands: commands.clone(),
            syscalls: Arc::new(syscalls.clone()),
        };
        let class_name = ClassName::parse("default").unwrap();
        let backend = || {
            LoopBackend::new(
                class_name.clone(),
                dir.path().join("loop"),
                10 << 30,
                host.clone(),
            )
        };
        let class = backend();
        class.prepare().await.unwrap();
        let source = spec("pvc-src", 64 * MIB, VolumeMode::Filesystem, fs_type);
        class.create(&source).await.unwrap();
        class.begin_format(&source.token).await.unwrap();
        class.mark_formatted(&source.token).await.unwrap();
        let copy = spec("pvc-copy", copy_size, copy_mode, fs_type);
        let from = CopySource::Volume {
            token: source.token.clone(),
            freeze: None,
        };
        let record = class.create_from(&copy, &from).await.unwrap();
        let volumes = Volumes::new(
            vec![Backend::Loop(backend())],
            class_name,
            Default::default(),
            host,
            "node-a".to_string(),
        );
        Self {
            volumes,
            class,
            commands,
            syscalls,
            dir,
            failures,
            grows,
            copy: record.id,
        }
    }

    fn staging(&self) -> PathBuf {
        self.dir.path().join("stage")
    }

    fn stage_req(&self, fs_type: FsType, mode: AccessMode) -> StageRequest {
        std::fs::create_dir_all(self.staging()).unwrap();
        StageRequest {
            id: self.copy.clone(),
            staging_path: HostPath::parse("path", self.staging().to_str().unwrap()).unwrap(),
            capability: Capability {
                access: AccessType::Mount {
                    fs_type: Some(fs_type),
                    mount_flags: Vec::new(),
                },
                mode,
            },
            context: VolumeContext::default(),
            passphrase: None,
        }
    }

    async fn stage(&self, req: &StageRequest) -> Result<(), VolumeError> {
        let locks = VolumeLocks::default();
        let guard = locks.try_lock(&req.id.token, "stage").unwrap();
        self.volumes.stage(&guard, req).await
    }

    fn fail_next(&self, program: &'static str, code: i32) {
        self.failures.lock().unwrap().push((program, code));
    }

    async fn pending(&self) -> bool {
        self.class
            .filesystem_grow_pending(&self.copy.token)
            .await
            .unwrap()
    }

    /// The grow commands run so far, each with the staging path's state then.
    fn grows(&self) -> Vec<String> {
        self.grows.lock().unwrap().clone()
    }

    fn mounts(&self) -> usize {
        self.syscalls
            .calls()
            .iter()
            .filter(|c| c.starts_with("mount"))
            .count()
    }
}

fn ext4_grow() -> Vec<String> {
    vec![
        format!("e2fsck -f -p {DEVICE} (unmounted)"),
        format!("resize2fs {DEVICE} (unmounted)"),
    ]
}

fn xfs_grow(s: &Setup) -> String {
    format!("xfs_growfs {} (mounted)", s.staging().display())
}

#[tokio::test]
async fn a_larger_ext4_copy_is_checked_and_grown_unmounted_then_mounted() {
    let s = Setup::new(FsType::Ext4, 128 * MIB, VolumeMode::Filesystem).await;
    assert!(s.pending().await, "create_from marks the larger copy");
    let req = s.stage_req(FsType::Ext4, AccessMode::SingleNodeWriter);
    s.stage(&req).await.unwrap();
    assert_eq!(s.grows(), ext4_grow());
    assert!(!s.pending().await);
    assert_eq!(s.syscalls.mount_points(), vec![s.staging()]);
    // Repeats grow nothing and mount nothing.
    s.stage(&req).await.unwrap();
    assert_eq!(s.grows(), ext4_grow());
    assert_eq!(s.mounts(), 1);
}

#[tokio::test]
async fn a_larger_xfs_copy_is_grown_through_its_mount() {
    let s = Setup::new(FsType::Xfs, 512 * MIB, VolumeMode::Filesystem).await;
    assert!(s.pending().await);
    let req = s.stage_req(FsType::Xfs, AccessMode::SingleNodeWriter);
    s.stage(&req).await.unwrap();
    assert_eq!(s.grows(), [xfs_grow(&s)]);
    assert!(!s.pending().await);
    let mounts = s.syscalls.mounts();
    assert_eq!(
        mounts[0].data.as_deref(),
        Some("nouuid"),
        "a copy keeps its source's xfs UUID: mounted beside it only with nouuid"
    );
    s.stage(&req).await.unwrap();
    assert_eq!(s.grows(), [xfs_grow(&s)]);
    assert_eq!(s.mounts(), 1);
}

#[tokio::test]
async fn copies_of_the_same_size_and_block_copies_grow_nothing() {
    let same = Setup::new(FsType::Ext4, 64 * MIB, VolumeMode::Filesystem).await;
    assert!(!same.pending().await);
    let req = same.stage_req(FsType::Ext4, AccessMode::SingleNodeWriter);
    same.stage(&req).await.unwrap();
    assert_eq!(same.grows(), Vec::<String>::new());

    let block = Setup::new(FsType::Ext4, 128 * MIB, VolumeMode::Block).await;
    assert!(
        !block.pending().await,
        "a raw block device is already the size asked"
    );
}

#[tokio::test]
async fn a_failed_ext4_grow_is_an_error_before_the_mount_and_the_retry_grows() {
    let s = Setup::new(FsType::Ext4, 128 * MIB, VolumeMode::Filesystem).await;
    let req = s.stage_req(FsType::Ext4, AccessMode::SingleNodeWriter);
    s.fail_next("resize2fs", 1);
    let e = s.stage(&req).await.unwrap_err();
    assert!(matches!(e, VolumeError::Fs(FsError::Grow { .. })), "{e}");
    assert!(e.to_string().contains("resize2fs"), "{e}");
    assert!(s.pending().await, "the mark stays for the retry");
    assert_eq!(s.mounts(), 0, "nothing mounted with the old size");

    // e2fsck's 4: errors left uncorrected. Nothing grows over them.
    s.fail_next("e2fsck", 4);
    let e = s.stage(&req).await.unwrap_err();
    assert!(matches!(e, VolumeError::Fs(FsError::Check { .. })), "{e}");
    assert!(s.pending().await);

    // e2fsck's 1: errors corrected, the filesystem is consistent: it grows.
    s.fail_next("e2fsck", 1);
    s.stage(&req).await.unwrap();
    assert!(!s.pending().await);
    assert_eq!(
        s.grows(),
        [
            ext4_grow(),
            vec![format!("e2fsck -f -p {DEVICE} (unmounted)")],
            ext4_grow()
        ]
        .concat()
    );
    assert_eq!(s.mounts(), 1);
}

#[tokio::test]
async fn a_failed_xfs_grow_after_the_mount_is_finished_by_the_next_stage() {
    let s = Setup::new(FsType::Xfs, 512 * MIB, VolumeMode::Filesystem).await;
    let req = s.stage_req(FsType::Xfs, AccessMode::SingleNodeWriter);
    s.fail_next("xfs_growfs", 1);
    let e = s.stage(&req).await.unwrap_err();
    assert!(matches!(e, VolumeError::Fs(FsError::Grow { .. })), "{e}");
    assert!(s.pending().await);
    // The retry finds the volume staged (as after a kill between the mount and the
    // grow, or between the grow and the mark) and grows through that mount.
    s.stage(&req).await.unwrap();
    assert!(!s.pending().await);
    assert_eq!(s.grows(), [xfs_grow(&s), xfs_grow(&s)]);
    assert_eq!(s.mounts(), 1, "the retry does not mount again");
    s.stage(&req).await.unwrap();
    assert_eq!(s.grows().len(), 2);
}

#[tokio::test]
async fn a_read_only_xfs_stage_leaves_the_mark_for_a_read_write_one() {
    let s = Setup::new(FsType::Xfs, 512 * MIB, VolumeMode::Filesystem).await;
    let req = s.stage_req(FsType::Xfs, AccessMode::SingleNodeReaderOnly);
    s.stage(&req).await.unwrap();
    assert_eq!(
        s.grows(),
        Vec::<String>::new(),
        "xfs_growfs cannot write a read-only mount"
    );
    assert!(s.pending().await);
}

#[tokio::test]
async fn a_copy_formatted_at_its_first_stage_needs_no_grow() {
    let s = Setup::new(FsType::Ext4, 128 * MIB, VolumeMode::Filesystem).await;
    // As a copy of a source never formatted: the first stage formats it.
    s.class.begin_format(&s.copy.token).await.unwrap();
    let at_create = s.commands.calls_of("mkfs.ext4").len();
    let req = s.stage_req(FsType::Ext4, AccessMode::SingleNodeWriter);
    s.stage(&req).await.unwrap();
    assert_eq!(s.commands.calls_of("mkfs.ext4").len(), at_create + 1);
    assert_eq!(s.grows(), Vec::<String>::new());
    assert!(!s.pending().await, "a new filesystem fills its device");
}
