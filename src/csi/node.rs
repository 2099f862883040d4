//! CSI Node: stage, publish and the rest, on this node's own volumes.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::Driver;
use crate::error::Error;
use crate::proto::csi::v1::{self as csi, node_server::Node, node_service_capability};
use crate::request::{
    NodeExpandRequest, PublishRequest, StageRequest, StatsRequest, UnpublishRequest, UnstageRequest,
};
use crate::volume::{VolumeCondition, VolumeStats};

#[derive(Debug)]
pub struct NodeService(pub Arc<Driver>);

fn usage(unit: csi::volume_usage::Unit, total: u64, available: u64, used: u64) -> csi::VolumeUsage {
    csi::VolumeUsage {
        available: available as i64,
        total: total as i64,
        used: used as i64,
        unit: unit as i32,
    }
}

fn condition(c: VolumeCondition) -> Option<csi::VolumeCondition> {
    Some(csi::VolumeCondition {
        abnormal: c.abnormal,
        message: c.message,
    })
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe("NodeStageVolume", &raw.volume_id, async {
                let req = StageRequest::try_from(&raw)?;
                let guard = self.0.lock(&req.id.token, "NodeStageVolume")?;
                self.0.volumes.stage(&guard, &req).await?;
                Ok(csi::NodeStageVolumeResponse {})
            })
            .await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe("NodeUnstageVolume", &raw.volume_id, async {
                let req = UnstageRequest::try_from(&raw)?;
                let guard = self.0.lock(&req.id.token, "NodeUnstageVolume")?;
                self.0.volumes.unstage(&guard, &req).await?;
                Ok(csi::NodeUnstageVolumeResponse {})
            })
            .await
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe("NodePublishVolume", &raw.volume_id, async {
                let req = PublishRequest::try_from(&raw)?;
                let guard = self.0.lock(&req.id.token, "NodePublishVolume")?;
                self.0.volumes.publish(&guard, &req).await?;
                Ok(csi::NodePublishVolumeResponse {})
            })
            .await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe("NodeUnpublishVolume", &raw.volume_id, async {
                let req = UnpublishRequest::try_from(&raw)?;
                let guard = self.0.lock(&req.id.token, "NodeUnpublishVolume")?;
                self.0.volumes.unpublish(&guard, &req).await?;
                Ok(csi::NodeUnpublishVolumeResponse {})
            })
            .await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        use csi::volume_usage::Unit;
        let raw = request.into_inner();
        self.0
            .observe("NodeGetVolumeStats", &raw.volume_id, async {
                // Read-only: no lock, so stats never make a stage or publish wait.
                let req = StatsRequest::try_from(&raw)?;
                let (usage, volume_condition) = match self.0.volumes.stats(&req).await? {
                    VolumeStats::Filesystem {
                        usage: u,
                        condition: c,
                    } => (
                        vec![
                            usage(Unit::Bytes, u.total_bytes, u.available_bytes, u.used_bytes),
                            usage(Unit::Inodes, u.total_inodes, u.free_inodes, u.used_inodes),
                        ],
                        c,
                    ),
                    VolumeStats::Block {
                        size_bytes,
                        condition: c,
                    } => (vec![usage(Unit::Bytes, size_bytes, 0, 0)], c),
                    VolumeStats::Unmounted { condition: c } => (Vec::new(), c),
                };
                Ok(csi::NodeGetVolumeStatsResponse {
                    usage,
                    volume_condition: condition(volume_condition),
                })
            })
            .await
    }

    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe("NodeExpandVolume", &raw.volume_id, async {
                let req = NodeExpandRequest::try_from(&raw)?;
                let guard = self.0.lock(&req.id.token, "NodeExpandVolume")?;
                let resize = &self.0.resize;
                let report = resize
                    .started(&self.0.volumes, &req.id, req.capacity.required)
                    .await;
                let result = self
                    .0
                    .volumes
                    .expand_on_node(&guard, &req)
                    .await
                    .map_err(Error::from);
                resize.finished(report, &result).await;
                let size = result?;
                Ok(csi::NodeExpandVolumeResponse {
                    capacity_bytes: size as i64,
                })
            })
            .await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::rpc::Type;
        let capabilities = [
            Type::StageUnstageVolume,
            Type::ExpandVolume,
            Type::GetVolumeStats,
            Type::VolumeCondition,
            Type::SingleNodeMultiWriter,
        ]
        .into_iter()
        .map(|t| csi::NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(node_service_capability::Rpc {
                r#type: t as i32,
            })),
        })
        .collect();
        Ok(Response::new(csi::NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.0.volumes.node_id().to_string(),
            max_volumes_per_node: self.0.max_volumes_per_node,
            accessible_topology: Some(csi::Topology {
                segments: self.0.volumes.topology().into_iter().collect(),
            }),
        }))
    }
}
