//! A loop-backend volume set over fake syscalls, shared by the reclaim tests.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nix::mount::MsFlags;

use super::run::Runner;
use crate::backend::CreateSpec;
use crate::fs::FsType;
use crate::host::fake::{FakeCommands, FakeSyscalls};
use crate::host::{FsUsage, Host, MountCall, Syscalls};
use crate::locks::VolumeLocks;
use crate::metrics::Metrics;
use crate::model::ClaimRef;
use crate::model::{Token, VolumeId, VolumeMode};
use crate::volume::Volumes;
use crate::volume_states::VolumeStates;

pub const DEV: &str = "/dev/loop-fake7";
pub const MIB: u64 = 1 << 20;

pub struct Fixture {
    pub runner: Runner,
    pub locks: VolumeLocks,
    pub metrics: Metrics,
    pub states: VolumeStates,
    pub syscalls: FakeSyscalls,
    pub dir: tempfile::TempDir,
}

impl Fixture {
    pub async fn new(timeout: Duration) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let syscalls = FakeSyscalls::default();
        syscalls.set_usage(FsUsage {
            total_bytes: 100 << 30,
            available_bytes: 50 << 30,
            used_bytes: 7 * MIB,
            ..FsUsage::default()
        });
        let commands = Arc::new(FakeCommands::default());
        commands.ok_mkfs();
        let host = Host {
            commands,
            syscalls: Arc::new(syscalls.clone()),
        };
        let volumes = Arc::new(Volumes::one_loop_class(dir.path(), host, "node-a"));
        let locks = VolumeLocks::default();
        let metrics = Metrics::new();
        let states = VolumeStates::new();
        let runner = Runner::new(
            volumes,
            locks.clone(),
            metrics.clone(),
            1,
            timeout,
            states.clone(),
            crate::request::KubeletRoots::new(vec![dir.path().to_path_buf()]),
        );
        Self {
            runner,
            locks,
            metrics,
            states,
            syscalls,
            dir,
        }
    }

    /// A host on the fixture's fake syscalls (and no commands).
    pub fn host(&self) -> Host {
        Host {
            commands: Arc::new(FakeCommands::default()),
            syscalls: Arc::new(self.syscalls.clone()),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn image(&self, name: &str) -> PathBuf {
        self.path(&format!("loop/{name}.img"))
    }

    /// Creates a volume whose image has 4 MiB of data written at its start.
    pub async fn create(&self, name: &str, mode: VolumeMode) -> VolumeId {
        self.create_for(name, mode, ClaimRef::default()).await
    }

    /// Creates a volume for a PVC, as external-provisioner's metadata records it.
    pub async fn create_for(&self, name: &str, mode: VolumeMode, claim: ClaimRef) -> VolumeId {
        self.create_with(name, mode, claim, None).await
    }

    /// Creates an encrypted filesystem volume (its image is attached and mounted as
    /// [`Fixture::stage`] does any, the mapping left out: FITRIM is the kernel's).
    pub async fn create_encrypted(&self, name: &str, allow_discards: bool) -> VolumeId {
        let encryption = crate::model::Encryption { allow_discards };
        self.create_with(
            name,
            VolumeMode::Filesystem,
            ClaimRef::default(),
            Some(encryption),
        )
        .await
    }

    async fn create_with(
        &self,
        name: &str,
        mode: VolumeMode,
        claim: ClaimRef,
        encryption: Option<crate::model::Encryption>,
    ) -> VolumeId {
        let backend = self.runner.volumes().backends().next().unwrap();
        let record = backend
            .create(&CreateSpec {
                token: Token::for_name(name),
                name: name.to_string(),
                size_bytes: 64 * MIB,
                mode,
                fs_type: (mode == VolumeMode::Filesystem).then_some(FsType::Ext4),
                claim,
                encryption,
            })
            .await
            .unwrap();
        let mut image = std::fs::OpenOptions::new()
            .write(true)
            .open(self.image(name))
            .unwrap();
        image.write_all(&vec![0xA5; 4 * MIB as usize]).unwrap();
        image.sync_all().unwrap();
        record.id
    }

    /// Attaches the image to DEV and mounts its filesystem at `stage`.
    pub async fn stage(&self, name: &str) {
        self.syscalls.add_device(DEV, 7, 7, 64 * MIB);
        self.syscalls.attach_loop(DEV, self.image(name));
        self.syscalls
            .mount(MountCall {
                source: DEV.into(),
                target: self.path("stage"),
                fs_type: Some("ext4".to_string()),
                flags: MsFlags::empty(),
                data: None,
            })
            .await
            .unwrap();
    }

    /// FITRIM punches the whole image, as the loop driver does for a filesystem that
    /// discards all of its (here: all) blocks.
    pub fn fitrim_punches(&self, name: &str, delay: Duration) {
        let image = self.image(name);
        self.syscalls.script_fitrim(delay, 60 * MIB, move || {
            let file = std::fs::OpenOptions::new().write(true).open(&image).unwrap();
            file.set_len(0).unwrap();
            file.set_len(64 * MIB).unwrap();
        });
    }

    pub fn runs(&self, result: &str) -> u64 {
        self.metrics
            .reclaim
            .runs
            .with_label_values(&["default", result])
            .get()
    }

    pub fn fitrims(&self) -> Vec<String> {
        self.syscalls
            .calls()
            .into_iter()
            .filter(|c| c.starts_with("FITRIM"))
            .collect()
    }
}
