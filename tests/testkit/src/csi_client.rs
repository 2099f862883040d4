//! The one CSI client of tests/ and benches/: every request a test or a benchmark sends
//! is built here, and `CsiClient` sends them over one daemon socket.
//!
//! It uses nothing else of the testkit, only the crate and its dependencies.

use std::path::Path;

use localvol::proto::csi::v1 as csi;
use tonic::Status;
use tonic::transport::Channel;

/// The StorageClass parameter that picks a device class.
pub const DEVICE_CLASS: &str = "localvol.csi.dev/device-class";

/// A single-node-writer filesystem capability of `fs` with these mount flags.
pub fn fs_capability(fs: &str, mount_flags: &[&str]) -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            mount_flags: mount_flags.iter().map(|f| f.to_string()).collect(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// ext4, no mount flags: what most tests stage.
pub fn mount_capability() -> csi::VolumeCapability {
    fs_capability("ext4", &[])
}

/// A single-node-writer raw block capability.
pub fn block_capability() -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, BlockVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// A capacity range asking for `required` bytes and setting no limit.
pub fn capacity(required: i64) -> Option<csi::CapacityRange> {
    Some(csi::CapacityRange {
        required_bytes: required,
        limit_bytes: 0,
    })
}

/// What external-provisioner puts in a CreateVolume: the parameters are optional, the
/// rest of the request is built by [`NewVolume::request`].
pub struct NewVolume<'a> {
    pub name: &'a str,
    pub bytes: i64,
    pub capability: csi::VolumeCapability,
    /// The device class parameter; the default class when `None`.
    pub class: Option<&'a str>,
    /// The claim's (namespace, name), as `--extra-create-metadata` passes them.
    pub pvc: Option<(&'a str, &'a str)>,
    pub source: Option<csi::VolumeContentSource>,
}

impl<'a> NewVolume<'a> {
    /// An ext4 volume of `bytes` in the default class, without parameters.
    pub fn new(name: &'a str, bytes: i64) -> Self {
        Self {
            name,
            bytes,
            capability: mount_capability(),
            class: None,
            pvc: None,
            source: None,
        }
    }

    pub fn request(self) -> csi::CreateVolumeRequest {
        let mut parameters = std::collections::HashMap::new();
        if let Some(class) = self.class {
            parameters.insert(DEVICE_CLASS.to_string(), class.to_string());
        }
        if let Some((namespace, name)) = self.pvc {
            parameters.insert(
                "csi.storage.k8s.io/pvc/namespace".to_string(),
                namespace.to_string(),
            );
            parameters.insert("csi.storage.k8s.io/pvc/name".to_string(), name.to_string());
        }
        csi::CreateVolumeRequest {
            name: self.name.into(),
            capacity_range: capacity(self.bytes),
            volume_capabilities: vec![self.capability],
            parameters,
            volume_content_source: self.source,
            ..Default::default()
        }
    }
}

/// An ext4 volume of `bytes` for the claim `pvc` (namespace, name).
pub fn create_request(name: &str, bytes: i64, pvc: (&str, &str)) -> csi::CreateVolumeRequest {
    NewVolume {
        pvc: Some(pvc),
        ..NewVolume::new(name, bytes)
    }
    .request()
}

pub fn stage_request(id: &str, staging: &Path, cap: &csi::VolumeCapability) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    }
}

pub fn publish_request(
    id: &str,
    staging: &Path,
    target: &Path,
    cap: &csi::VolumeCapability,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    }
}

pub fn unpublish_request(id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.display().to_string(),
    }
}

pub fn unstage_request(id: &str, staging: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
    }
}

pub fn delete_request(id: &str) -> csi::DeleteVolumeRequest {
    csi::DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    }
}

pub fn controller_expand_request(id: &str, bytes: i64) -> csi::ControllerExpandVolumeRequest {
    csi::ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: capacity(bytes),
        ..Default::default()
    }
}

pub fn node_expand_request(
    id: &str,
    volume_path: &Path,
    staging: &Path,
    bytes: i64,
    cap: &csi::VolumeCapability,
) -> csi::NodeExpandVolumeRequest {
    csi::NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: volume_path.display().to_string(),
        staging_target_path: staging.display().to_string(),
        capacity_range: capacity(bytes),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    }
}

pub fn stats_request(id: &str, volume_path: &Path) -> csi::NodeGetVolumeStatsRequest {
    csi::NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: volume_path.display().to_string(),
        ..Default::default()
    }
}

pub fn capacity_request(class: Option<&str>) -> csi::GetCapacityRequest {
    csi::GetCapacityRequest {
        parameters: class
            .map(|c| [(DEVICE_CLASS.to_string(), c.to_string())].into())
            .unwrap_or_default(),
        ..Default::default()
    }
}

pub fn snapshot_request(name: &str, source_volume_id: &str) -> csi::CreateSnapshotRequest {
    csi::CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: source_volume_id.into(),
        ..Default::default()
    }
}

pub fn delete_snapshot_request(id: &str) -> csi::DeleteSnapshotRequest {
    csi::DeleteSnapshotRequest {
        snapshot_id: id.into(),
        ..Default::default()
    }
}

/// The byte total of a NodeGetVolumeStats answer.
pub fn bytes_total(stats: &csi::NodeGetVolumeStatsResponse) -> i64 {
    stats
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
        .expect("a bytes usage entry")
        .total
}

/// The Controller, Node and Identity services of one daemon socket. Each call clones
/// its service client (a handle on the one channel), so a `&CsiClient` can be shared.
#[derive(Clone)]
pub struct CsiClient {
    controller: csi::controller_client::ControllerClient<Channel>,
    node: csi::node_client::NodeClient<Channel>,
    identity: csi::identity_client::IdentityClient<Channel>,
}

impl CsiClient {
    pub fn new(channel: Channel) -> Self {
        Self {
            controller: csi::controller_client::ControllerClient::new(channel.clone()),
            node: csi::node_client::NodeClient::new(channel.clone()),
            identity: csi::identity_client::IdentityClient::new(channel),
        }
    }

    /// Connects to the daemon's CSI socket; fails the test if nothing listens there.
    pub async fn connect(socket: &Path) -> Self {
        Self::new(
            localvol::csi::socket::connect(socket)
                .await
                .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display())),
        )
    }

    /// The Controller service, for a request this client has no helper for.
    pub fn controller(&self) -> csi::controller_client::ControllerClient<Channel> {
        self.controller.clone()
    }

    /// The Node service, for a request this client has no helper for.
    pub fn node(&self) -> csi::node_client::NodeClient<Channel> {
        self.node.clone()
    }

    pub fn identity(&self) -> csi::identity_client::IdentityClient<Channel> {
        self.identity.clone()
    }

    pub async fn create(&self, req: csi::CreateVolumeRequest) -> Result<csi::Volume, Status> {
        let volume = self.controller().create_volume(req).await?.into_inner().volume;
        Ok(volume.expect("CreateVolume answers a volume"))
    }

    /// Creates a volume and returns its id; any error fails the test.
    pub async fn create_id(&self, req: csi::CreateVolumeRequest) -> String {
        self.create(req).await.unwrap().volume_id
    }

    pub async fn stage(&self, id: &str, staging: &Path, cap: &csi::VolumeCapability) -> Result<(), Status> {
        self.node()
            .node_stage_volume(stage_request(id, staging, cap))
            .await
            .map(drop)
    }

    pub async fn publish(
        &self,
        id: &str,
        staging: &Path,
        target: &Path,
        cap: &csi::VolumeCapability,
    ) -> Result<(), Status> {
        self.node()
            .node_publish_volume(publish_request(id, staging, target, cap))
            .await
            .map(drop)
    }

    pub async fn unpublish(&self, id: &str, target: &Path) -> Result<(), Status> {
        self.node()
            .node_unpublish_volume(unpublish_request(id, target))
            .await
            .map(drop)
    }

    pub async fn unstage(&self, id: &str, staging: &Path) -> Result<(), Status> {
        self.node()
            .node_unstage_volume(unstage_request(id, staging))
            .await
            .map(drop)
    }

    pub async fn delete(&self, id: &str) -> Result<(), Status> {
        self.controller()
            .delete_volume(delete_request(id))
            .await
            .map(drop)
    }

    pub async fn expand_controller(
        &self,
        id: &str,
        bytes: i64,
    ) -> Result<csi::ControllerExpandVolumeResponse, Status> {
        self.controller()
            .controller_expand_volume(controller_expand_request(id, bytes))
            .await
            .map(|r| r.into_inner())
    }

    /// NodeExpandVolume; returns the capacity it reports.
    pub async fn expand_node(
        &self,
        id: &str,
        volume_path: &Path,
        staging: &Path,
        bytes: i64,
        cap: &csi::VolumeCapability,
    ) -> Result<i64, Status> {
        self.node()
            .node_expand_volume(node_expand_request(id, volume_path, staging, bytes, cap))
            .await
            .map(|r| r.into_inner().capacity_bytes)
    }

    pub async fn stats(
        &self,
        id: &str,
        volume_path: &Path,
    ) -> Result<csi::NodeGetVolumeStatsResponse, Status> {
        self.node()
            .node_get_volume_stats(stats_request(id, volume_path))
            .await
            .map(|r| r.into_inner())
    }

    /// GetCapacity of `class` (the default class if `None`).
    pub async fn capacity(&self, class: Option<&str>) -> Result<csi::GetCapacityResponse, Status> {
        self.controller()
            .get_capacity(capacity_request(class))
            .await
            .map(|r| r.into_inner())
    }

    /// ListVolumes, one page of everything.
    pub async fn list(&self) -> Result<Vec<csi::list_volumes_response::Entry>, Status> {
        self.controller()
            .list_volumes(csi::ListVolumesRequest::default())
            .await
            .map(|r| r.into_inner().entries)
    }

    /// Whether ListVolumes names the volume `id`.
    pub async fn listed(&self, id: &str) -> bool {
        self.list()
            .await
            .unwrap()
            .iter()
            .any(|e| e.volume.as_ref().is_some_and(|v| v.volume_id == id))
    }

    pub async fn snapshot(&self, name: &str, source_volume_id: &str) -> Result<csi::Snapshot, Status> {
        let snapshot = self
            .controller()
            .create_snapshot(snapshot_request(name, source_volume_id))
            .await?
            .into_inner()
            .snapshot;
        Ok(snapshot.expect("CreateSnapshot answers a snapshot"))
    }

    pub async fn delete_snapshot(&self, id: &str) -> Result<(), Status> {
        self.controller()
            .delete_snapshot(delete_snapshot_request(id))
            .await
            .map(drop)
    }

    /// NodeGetCapabilities: a call that does no work, one round trip of the transport.
    pub async fn node_capabilities(&self) -> Result<(), Status> {
        self.node()
            .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
            .await
            .map(drop)
    }

    /// Whether Probe answers ready (the daemon has opened its classes).
    pub async fn ready(&self) -> bool {
        match self.identity().probe(csi::ProbeRequest {}).await {
            Ok(probe) => probe.into_inner().ready == Some(true),
            Err(_) => false,
        }
    }
}
