//! The requests of the hostile node cases, as kubelet would send them but with the
//! paths and ids the case chooses.

use std::path::Path;

use localvol::proto::csi::v1 as csi;
use localvol::proto::reclaimspace as rs;

pub fn block_capability() -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, BlockVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

pub fn s(p: &Path) -> String {
    p.display().to_string()
}

pub fn stage(id: &str, path: &str, cap: csi::VolumeCapability) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: path.into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

pub fn publish(
    id: &str,
    staging: &str,
    target: &str,
    cap: csi::VolumeCapability,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.into(),
        target_path: target.into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

pub fn unpublish_req(id: &str, target: impl Into<String>) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.into(),
    }
}

pub fn unstage_req(id: &str, staging: impl Into<String>) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.into(),
    }
}

pub fn stats_req(id: &str, path: impl Into<String>) -> csi::NodeGetVolumeStatsRequest {
    csi::NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        ..Default::default()
    }
}

pub fn reclaim_req(id: &str, volume_path: &str, staging: &str) -> rs::NodeReclaimSpaceRequest {
    rs::NodeReclaimSpaceRequest {
        volume_id: id.into(),
        volume_path: volume_path.into(),
        staging_target_path: staging.into(),
        ..Default::default()
    }
}
