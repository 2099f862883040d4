//! Volume operations against fake host seams: the exact commands and mounts each call
//! makes, and that repeats make none.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::host::fake::{FakeCommands, FakeSyscalls, loop_machine};
use crate::host::{MountCall, Syscalls};
use crate::locks::VolumeLocks;
use crate::model::{AccessMode, AccessType, Capability};
use crate::model::{CapacityRange, ClaimRef};
use crate::request::{
    ControllerExpandRequest, CreateRequest, HostPath, PublishRequest, StageRequest, UnpublishRequest,
    UnstageRequest, VolumeContext,
};

const LOOP_DEV: &str = "/dev/loop-fake7";

/// Create, expand and delete.
mod controller;

/// Encrypted volumes: the LUKS2 header, the mapping, the key.
mod encryption;

/// Stats, publish and unpublish asking the kernel about their paths.
mod kernel_view;

/// The volume condition stats report: the filesystem's own verdicts, and a loop
/// volume's image and disk (an encrypted volume's mapping is in `encryption`).
mod condition;

/// A staging path named as a target and a target named as a staging path (issue 33).
mod stage_or_target;

struct Fixture {
    volumes: Volumes,
    locks: VolumeLocks,
    commands: Arc<FakeCommands>,
    syscalls: FakeSyscalls,
    dir: tempfile::TempDir,
}

impl Fixture {
    /// A loop class `default` in a temp dir. Loop attach hands out LOOP_DEV in the fake
    /// syscalls; blkid reports whatever mkfs last wrote (nothing at first).
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (commands, syscalls) = loop_machine(Path::new(LOOP_DEV), 0);
        let host = Host {
            commands: commands.clone(),
            syscalls: Arc::new(syscalls.clone()),
        };
        let mut volumes = Volumes::one_loop_class(dir.path(), host, "node-a");
        volumes.keep_placed_paths_in(dir.path().join("placed")).unwrap();
        Self {
            volumes,
            locks: VolumeLocks::default(),
            commands,
            syscalls,
            dir,
        }
    }

    /// The daemon restarted: a new `Volumes` on the same host, data directory and mounts.
    fn restart(&mut self) {
        let host = Host {
            commands: self.commands.clone(),
            syscalls: Arc::new(self.syscalls.clone()),
        };
        self.volumes = Volumes::one_loop_class(self.dir.path(), host, "node-a");
        self.volumes
            .keep_placed_paths_in(self.dir.path().join("placed"))
            .unwrap();
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn host_path(&self, name: &str) -> HostPath {
        HostPath::parse("path", self.path(name).to_str().unwrap()).unwrap()
    }

    async fn create(&self, name: &str, access: AccessType) -> VolumeId {
        let req = create_req(name, access, 64 << 20, None);
        let guard = self.locks.try_lock(&req.token, "create").unwrap();
        self.volumes.create(&guard, &req).await.unwrap().record.id
    }

    /// An ext4 volume `name`, staged and published read-write at `target`.
    async fn published(&self, name: &str, target: &str) -> VolumeId {
        self.published_as(name, target, ext4()).await
    }

    /// A volume `name` of `access`, staged and published read-write at `target`.
    async fn published_as(&self, name: &str, target: &str, access: AccessType) -> VolumeId {
        let id = self.create(name, access.clone()).await;
        self.stage(&self.stage_req(&id, access.clone())).await.unwrap();
        self.publish(&self.publish_req(&id, target, access, false))
            .await
            .unwrap();
        id
    }

    fn unpublish_req(&self, id: &VolumeId, target: &str) -> UnpublishRequest {
        UnpublishRequest {
            id: id.clone(),
            target_path: self.host_path(target),
        }
    }

    async fn unpublish(&self, id: &VolumeId, target: &str) -> Result<(), VolumeError> {
        let guard = self.locks.try_lock(&id.token, "unpublish").unwrap();
        self.volumes
            .unpublish(&guard, &self.unpublish_req(id, target))
            .await
    }

    /// NodeGetVolumeStats of `id` at the path `name`.
    fn stats_req(&self, id: &VolumeId, name: &str) -> crate::request::StatsRequest {
        crate::request::StatsRequest {
            id: id.clone(),
            volume_path: Some(self.host_path(name)),
        }
    }

    /// The condition NodeGetVolumeStats reports for `id` at the path `name`.
    async fn condition(&self, id: &VolumeId, name: &str) -> VolumeCondition {
        self.volumes
            .stats(&self.stats_req(id, name))
            .await
            .unwrap()
            .condition
    }

    fn stage_req(&self, id: &VolumeId, access: AccessType) -> StageRequest {
        std::fs::create_dir_all(self.path("stage")).unwrap();
        StageRequest {
            id: id.clone(),
            staging_path: self.host_path("stage"),
            capability: Capability {
                access,
                mode: AccessMode::SingleNodeSingleWriter,
            },
            context: VolumeContext::default(),
            passphrase: None,
        }
    }

    fn publish_req(
        &self,
        id: &VolumeId,
        target: &str,
        access: AccessType,
        read_only: bool,
    ) -> PublishRequest {
        PublishRequest {
            id: id.clone(),
            staging_path: self.host_path("stage"),
            target_path: self.host_path(target),
            capability: Capability {
                access,
                mode: AccessMode::SingleNodeSingleWriter,
            },
            read_only,
            context: VolumeContext::default(),
        }
    }

    /// The fake syscalls' calls named `call` (LOOP_CONFIGURE, LOOP_CLR_FD).
    fn loop_calls(&self, call: &str) -> Vec<String> {
        let prefix = format!("{call} ");
        self.syscalls
            .calls()
            .into_iter()
            .filter(|c| c.starts_with(&prefix))
            .collect()
    }

    async fn stage(&self, req: &StageRequest) -> Result<(), VolumeError> {
        let guard = self.locks.try_lock(&req.id.token, "stage").unwrap();
        self.volumes.stage(&guard, req).await
    }

    /// Something else, mounted at `name` (in the fake syscalls only).
    async fn mount_tmpfs(&self, name: &str) {
        self.syscalls
            .mount(MountCall {
                source: "tmpfs".into(),
                target: self.path(name),
                fs_type: Some("tmpfs".into()),
                flags: nix::mount::MsFlags::empty(),
                data: None,
            })
            .await
            .unwrap();
    }

    async fn publish(&self, req: &PublishRequest) -> Result<(), VolumeError> {
        let guard = self.locks.try_lock(&req.id.token, "publish").unwrap();
        self.volumes.publish(&guard, req).await
    }
}

/// A create request for `name` in the default class with one single-node-writer
/// capability of `access`.
fn create_req(name: &str, access: AccessType, required: u64, limit: Option<u64>) -> CreateRequest {
    CreateRequest {
        name: name.to_string(),
        token: crate::model::Token::for_name(name),
        capacity: CapacityRange { required, limit },
        capabilities: vec![Capability {
            access,
            mode: AccessMode::SingleNodeWriter,
        }],
        class: None,
        claim: ClaimRef::default(),
        topologies: Vec::new(),
        source: None,
        encryption: None,
    }
}

fn ext4() -> AccessType {
    AccessType::Mount {
        fs_type: Some(crate::fs::FsType::Ext4),
        mount_flags: vec!["noatime".to_string()],
    }
}

#[tokio::test]
async fn stage_formats_once_and_repeats_are_no_ops() {
    let f = Fixture::new();
    let id = f.create("pvc-1", ext4()).await;
    let req = f.stage_req(&id, ext4());
    f.stage(&req).await.unwrap();
    f.stage(&req).await.unwrap();
    assert_eq!(
        f.commands.calls_of("mkfs.ext4").len(),
        1,
        "{:?}",
        f.commands.calls()
    );
    assert_eq!(f.loop_calls("LOOP_CONFIGURE").len(), 1, "attached once");
    assert_eq!(f.syscalls.mount_points(), vec![f.path("stage")]);
}

#[tokio::test]
async fn class_mount_options_come_before_the_request_flags() {
    let mut f = Fixture::new();
    let class = ClassName::parse("default").unwrap();
    f.volumes.set_class_mount_options(
        [(
            class,
            vec![
                "nodiratime".to_string(),
                "atime".to_string(),
                "discard".to_string(),
            ],
        )]
        .into(),
    );
    let id = f.create("pvc-1", ext4()).await;
    f.stage(&f.stage_req(&id, ext4())).await.unwrap();
    let mount = f.syscalls.mounts().pop().unwrap();
    use nix::mount::MsFlags;
    assert!(mount.flags.contains(MsFlags::MS_NODIRATIME), "class option");
    assert!(
        mount.flags.contains(MsFlags::MS_NOATIME),
        "the request's noatime wins over the class's atime"
    );
    assert_eq!(mount.data.as_deref(), Some("discard"));
}

#[tokio::test]
async fn stage_never_formats_over_another_filesystem() {
    let f = Fixture::new();
    // Created without a type: the first stage formats it, with the type it names.
    let untyped = AccessType::Mount {
        fs_type: None,
        mount_flags: vec![],
    };
    let id = f.create("pvc-1", untyped).await;
    f.commands.ok("mkfs.ext4", "");
    let mut req = f.stage_req(&id, ext4());
    f.stage(&req).await.unwrap();
    f.syscalls.umount(&f.path("stage")).await.unwrap();
    // The device holds ext4 now; a stage naming xfs never formats over it.
    f.commands.ok("mkfs.xfs", "");
    req.capability.access = AccessType::Mount {
        fs_type: Some(crate::fs::FsType::Xfs),
        mount_flags: vec![],
    };
    let err = f.stage(&req).await.unwrap_err();
    assert!(matches!(err, VolumeError::WrongFilesystem { .. }), "{err}");
    assert!(f.commands.calls_of("mkfs.xfs").is_empty());
    assert!(
        f.syscalls.mount_points().is_empty(),
        "nothing mounted after a refusal"
    );
}

/// A volume created with a named type is formatted then (see the loop backend's
/// create): a stage naming another type is refused, and formats nothing.
#[tokio::test]
async fn a_stage_naming_another_type_than_the_create_is_refused() {
    let f = Fixture::new();
    f.commands.ok("mkfs.ext4", "");
    let id = f.create("pvc-1", ext4()).await;
    assert_eq!(f.commands.calls_of("mkfs.ext4").len(), 1, "formatted at create");
    f.commands.ok("mkfs.xfs", "");
    let xfs = AccessType::Mount {
        fs_type: Some(crate::fs::FsType::Xfs),
        mount_flags: vec![],
    };
    let err = f.stage(&f.stage_req(&id, xfs)).await.unwrap_err();
    assert!(matches!(err, VolumeError::WrongFilesystem { .. }), "{err}");
    assert!(f.commands.calls_of("mkfs.xfs").is_empty());
    assert!(f.syscalls.mount_points().is_empty());
    // The type it was created with stages without another mkfs.
    f.stage(&f.stage_req(&id, ext4())).await.unwrap();
    assert_eq!(f.commands.calls_of("mkfs.ext4").len(), 1);
}

/// A volume smaller than mkfs makes the stage's filesystem on (made without a type, or
/// before CreateVolume kept to the minimums) is refused with what to do, before mkfs
/// runs and its usage text becomes the stage's error on every retry.
#[tokio::test]
async fn a_stage_below_the_filesystems_minimum_is_refused_before_mkfs() {
    let f = Fixture::new();
    let unnamed = AccessType::Mount {
        fs_type: None,
        mount_flags: vec![],
    };
    let id = f.create("pvc-1", unnamed).await; // 64 MiB, no filesystem yet
    f.commands.ok("mkfs.xfs", "");
    let xfs = AccessType::Mount {
        fs_type: Some(crate::fs::FsType::Xfs),
        mount_flags: vec![],
    };
    let err = f.stage(&f.stage_req(&id, xfs)).await.unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, VolumeError::TooSmallForFilesystem { .. }),
        "{message}"
    );
    assert!(
        message.contains("holds 67108864 bytes, and mkfs makes xfs on no less than 314572800"),
        "{message}"
    );
    assert_eq!(
        crate::error::Error::from(err).code(),
        tonic::Code::FailedPrecondition
    );
    assert!(f.commands.calls_of("mkfs.xfs").is_empty());
    assert!(f.syscalls.mount_points().is_empty());
    // ext4 fits.
    f.commands.ok("mkfs.ext4", "");
    f.stage(&f.stage_req(&id, ext4())).await.unwrap();
}

/// A filesystem made at create, of the type the stage asks for, is mounted without
/// blkid. If the kernel refuses it, blkid is asked to say why: here it finds another
/// filesystem, which is refused as always, and nothing is formatted over it.
#[tokio::test]
async fn a_filesystem_made_at_create_is_mounted_without_a_probe() {
    let f = Fixture::new();
    f.commands.ok("mkfs.ext4", "");
    let id = f.create("pvc-1", ext4()).await;
    f.stage(&f.stage_req(&id, ext4())).await.unwrap();
    assert!(
        f.commands.calls_of("blkid").is_empty(),
        "{:?}",
        f.commands.calls()
    );
    assert_eq!(f.syscalls.mount_points(), vec![f.path("stage")]);
    let unstage = UnstageRequest {
        id: id.clone(),
        staging_path: f.host_path("stage"),
    };
    let guard = f.locks.try_lock(&id.token, "unstage").unwrap();
    f.volumes.unstage(&guard, &unstage).await.unwrap();
    drop(guard);

    // What the device holds now is xfs (the fake's blkid reports the last mkfs).
    f.commands.ok("mkfs.xfs", "");
    let host = f.volumes.host();
    crate::fs::format(host, FsType::Xfs, Path::new(LOOP_DEV), Default::default())
        .await
        .unwrap();
    f.syscalls.fail_next("mount", libc::EINVAL);
    let err = f.stage(&f.stage_req(&id, ext4())).await.unwrap_err();
    assert!(matches!(err, VolumeError::WrongFilesystem { .. }), "{err}");
    assert_eq!(
        f.commands.calls_of("blkid").len(),
        1,
        "probed once the mount failed"
    );
    assert_eq!(
        f.commands.calls_of("mkfs.ext4").len(),
        1,
        "formatted only at create"
    );
    assert!(f.syscalls.mount_points().is_empty());
}

#[tokio::test]
async fn publish_needs_stage_then_binds_once() {
    let f = Fixture::new();
    let id = f.create("pvc-1", ext4()).await;
    let publish = f.publish_req(&id, "target", ext4(), false);
    let err = f.publish(&publish).await.unwrap_err();
    assert!(matches!(err, VolumeError::NotStaged { .. }), "{err}");
    assert!(!f.path("target").exists(), "a refused publish creates nothing");

    f.stage(&f.stage_req(&id, ext4())).await.unwrap();
    f.publish(&publish).await.unwrap();
    f.publish(&publish).await.unwrap();
    assert_eq!(f.syscalls.mount_points(), vec![f.path("stage"), f.path("target")]);

    // The same target read-only is a different publication.
    let err = f
        .publish(&f.publish_req(&id, "target", ext4(), true))
        .await
        .unwrap_err();
    assert!(matches!(err, VolumeError::PathInUse { .. }), "{err}");
}

#[tokio::test]
async fn single_writer_refuses_a_second_target() {
    let f = Fixture::new();
    let id = f.published("pvc-1", "one").await;
    let err = f
        .publish(&f.publish_req(&id, "two", ext4(), false))
        .await
        .unwrap_err();
    assert!(matches!(err, VolumeError::SingleWriter { .. }), "{err}");
}

#[tokio::test]
async fn read_only_publish_remounts_read_only() {
    let f = Fixture::new();
    let id = f.create("pvc-1", ext4()).await;
    f.stage(&f.stage_req(&id, ext4())).await.unwrap();
    f.publish(&f.publish_req(&id, "target", ext4(), true))
        .await
        .unwrap();
    let info = f.syscalls.mountinfo().await.unwrap();
    let line = info.lines().find(|l| l.contains("/target")).unwrap();
    assert!(line.contains(" ro,"), "{line}");
    assert_eq!(
        f.syscalls
            .calls()
            .iter()
            .filter(|c| c.starts_with("mount"))
            .count(),
        3,
        "stage, bind, remount read-only"
    );
}

#[tokio::test]
async fn unstage_waits_for_unpublish_then_detaches() {
    let f = Fixture::new();
    let id = f.published("pvc-1", "target").await;
    let unstage = UnstageRequest {
        id: id.clone(),
        staging_path: f.host_path("stage"),
    };
    let guard = f.locks.try_lock(&id.token, "unstage").unwrap();
    let err = f.volumes.unstage(&guard, &unstage).await.unwrap_err();
    assert!(matches!(err, VolumeError::StillPublished { .. }), "{err}");

    let unpublish = UnpublishRequest {
        id: id.clone(),
        target_path: f.host_path("target"),
    };
    f.volumes.unpublish(&guard, &unpublish).await.unwrap();
    f.volumes.unpublish(&guard, &unpublish).await.unwrap();
    assert!(!f.path("target").exists(), "unpublish removes the target");
    f.volumes.unstage(&guard, &unstage).await.unwrap();
    f.volumes.unstage(&guard, &unstage).await.unwrap();
    assert!(f.syscalls.mount_points().is_empty());
    assert_eq!(
        f.loop_calls("LOOP_CONFIGURE").len(),
        1,
        "{:?}",
        f.syscalls.calls()
    );
    assert_eq!(
        f.loop_calls("LOOP_CLR_FD"),
        vec![format!("LOOP_CLR_FD {LOOP_DEV}")]
    );
}

#[tokio::test]
async fn block_volumes_bind_the_device_node() {
    let f = Fixture::new();
    let id = f.create("pvc-b", AccessType::Block).await;
    f.stage(&f.stage_req(&id, AccessType::Block)).await.unwrap();
    assert!(
        f.syscalls.mount_points().is_empty(),
        "block staging mounts nothing"
    );
    assert!(
        f.commands.calls_of("mkfs.ext4").is_empty(),
        "block volumes are never formatted"
    );
    f.publish(&f.publish_req(&id, "dev", AccessType::Block, false))
        .await
        .unwrap();
    assert!(
        f.path("dev").is_file(),
        "the target is a file to bind the node onto"
    );
    assert_eq!(f.syscalls.mount_points(), vec![f.path("dev")]);
    // A block volume cannot be staged as a filesystem.
    let err = f.stage(&f.stage_req(&id, ext4())).await.unwrap_err();
    assert!(matches!(err, VolumeError::AccessMismatch { .. }), "{err}");
}

#[tokio::test]
async fn symlinked_targets_are_refused() {
    let f = Fixture::new();
    let id = f.create("pvc-1", ext4()).await;
    f.stage(&f.stage_req(&id, ext4())).await.unwrap();
    std::fs::create_dir(f.path("elsewhere")).unwrap();
    std::os::unix::fs::symlink(f.path("elsewhere"), f.path("link")).unwrap();
    let mut publish = f.publish_req(&id, "link", ext4(), false);
    publish.target_path = HostPath::parse("t", f.path("link").join("target").to_str().unwrap()).unwrap();
    let err = f.publish(&publish).await.unwrap_err();
    assert!(matches!(err, VolumeError::Symlink { .. }), "{err}");
    assert_eq!(f.syscalls.mount_points(), vec![f.path("stage")]);
}
