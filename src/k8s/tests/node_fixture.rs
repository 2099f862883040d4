//! The CSI services as kubelet and external-provisioner reach them, in memory: the real
//! tonic servers behind in-process clients, over a loop device class on the fake host
//! seams, with the owner check a test gives. Calls go through request conversion, the
//! owner check, the volume lock and the volume layer exactly as on a node.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;

use tonic::Status;
use tower::util::BoxCloneService;

use crate::csi::Driver;
use crate::health::Health;
use crate::host::Host;
use crate::host::fake::{FakeSyscalls, loop_machine};
use crate::k8s::OwnerCheck;
use crate::k8s::fixtures::{NODE, NS};
use crate::locks::VolumeLocks;
use crate::metrics::Metrics;
use crate::proto::csi::v1::{self as csi, controller_client::ControllerClient, node_client::NodeClient};
use crate::volume::Volumes;

type Service =
    BoxCloneService<http::Request<tonic::body::Body>, http::Response<tonic::body::Body>, Infallible>;

pub struct Node {
    pub controller: ControllerClient<Service>,
    pub node: NodeClient<Service>,
    pub health: Arc<Health>,
    pub syscalls: FakeSyscalls,
    dir: tempfile::TempDir,
}

/// A pod as kubelet names it in a publish (`podInfoOnMount: true`).
pub struct PodRef<'a> {
    pub name: &'a str,
    pub uid: &'a str,
}

impl Node {
    /// A node whose owner check `check` makes from the node's health.
    pub fn new(check: impl FnOnce(Arc<Health>) -> OwnerCheck) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // A real file stands for the loop device: stats look at it to judge the volume.
        let device = dir.path().join("loop-fake7");
        std::fs::write(&device, b"").unwrap();
        let (commands, syscalls) = loop_machine(&device, 4 << 20);
        let host = Host {
            commands,
            syscalls: Arc::new(syscalls.clone()),
        };
        let volumes = Arc::new(Volumes::one_loop_class(dir.path(), host, NODE));
        let health = Arc::new(Health::new(Arc::clone(&volumes)));
        let driver = Arc::new(Driver {
            volumes,
            locks: VolumeLocks::default(),
            resize: Default::default(),
            metrics: Metrics::new(),
            health: Arc::clone(&health),
            owner_check: check(Arc::clone(&health)),
            max_volumes_per_node: 0,
            volume_states: Default::default(),
            roots: crate::request::KubeletRoots::new(vec![dir.path().to_path_buf()]),
        });
        let (_, controller, node, _) = crate::csi::services(driver);
        Self {
            controller: ControllerClient::new(BoxCloneService::new(controller)),
            node: NodeClient::new(BoxCloneService::new(node)),
            health,
            syscalls,
            dir,
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn path_string(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    /// CreateVolume as external-provisioner sends it for claim `pvc` (`--extra-create-metadata`),
    /// to become PersistentVolume `pv`; returns the volume (its id and context).
    pub async fn create(&mut self, pvc: &str, pv: &str) -> csi::Volume {
        let parameters = [
            ("csi.storage.k8s.io/pvc/name", pvc),
            ("csi.storage.k8s.io/pvc/namespace", NS),
            ("csi.storage.k8s.io/pv/name", pv),
        ];
        let response = self
            .controller
            .create_volume(csi::CreateVolumeRequest {
                name: pv.to_string(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: 64 << 20,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![capability()],
                parameters: strings(&parameters),
                ..Default::default()
            })
            .await
            .expect("CreateVolume");
        response.into_inner().volume.unwrap()
    }

    /// NodeStageVolume as kubelet sends it: the PV's volume attributes as the context.
    pub async fn stage(&mut self, volume: &csi::Volume) -> Result<(), Status> {
        let staging = self.path(&format!("stage-{}", volume.volume_id));
        std::fs::create_dir_all(&staging).unwrap();
        self.node
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: volume.volume_id.clone(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(capability()),
                volume_context: volume.volume_context.clone(),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    /// NodePublishVolume as kubelet sends it for `pod` with `podInfoOnMount: true`: the
    /// volume attributes plus the pod's identity, its service account and `ephemeral`
    /// (false: a PV, generic ephemeral or not). The target is `target`.
    pub async fn publish(
        &mut self,
        volume: &csi::Volume,
        target: &str,
        pod: &PodRef<'_>,
    ) -> Result<(), Status> {
        let mut context = volume.volume_context.clone();
        context.extend(strings(&[
            ("csi.storage.k8s.io/pod.name", pod.name),
            ("csi.storage.k8s.io/pod.namespace", NS),
            ("csi.storage.k8s.io/pod.uid", pod.uid),
            ("csi.storage.k8s.io/serviceAccount.name", "default"),
            ("csi.storage.k8s.io/ephemeral", "false"),
        ]));
        self.node
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: volume.volume_id.clone(),
                staging_target_path: self.path_string(&format!("stage-{}", volume.volume_id)),
                target_path: self.path_string(target),
                volume_capability: Some(capability()),
                volume_context: context,
                ..Default::default()
            })
            .await
            .map(drop)
    }

    pub async fn unpublish(&mut self, volume: &csi::Volume, target: &str) -> Result<(), Status> {
        self.node
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: volume.volume_id.clone(),
                target_path: self.path_string(target),
            })
            .await
            .map(drop)
    }

    /// NodeGetVolumeStats on `target`; returns the bytes used.
    pub async fn stats(&mut self, volume: &csi::Volume, target: &str) -> Result<i64, Status> {
        let response = self
            .node
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: volume.volume_id.clone(),
                volume_path: self.path_string(target),
                staging_target_path: self.path_string(&format!("stage-{}", volume.volume_id)),
            })
            .await?
            .into_inner();
        let condition = response.volume_condition.unwrap_or_default();
        assert!(!condition.abnormal, "{}", condition.message);
        Ok(response.usage.first().map(|u| u.used).unwrap_or_default())
    }

    pub async fn unstage(&mut self, volume: &csi::Volume) -> Result<(), Status> {
        self.node
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: volume.volume_id.clone(),
                staging_target_path: self.path_string(&format!("stage-{}", volume.volume_id)),
            })
            .await
            .map(drop)
    }

    /// Where the fake host has a filesystem mounted now.
    pub fn mount_points(&self) -> Vec<PathBuf> {
        self.syscalls.mount_points()
    }
}

fn strings(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn capability() -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".to_string(),
            ..MountVolume::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}
