//! CSI Controller, node-local: external-provisioner runs beside each localvol with
//! `--node-deployment` and provisions from the node's own storage.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{Driver, not_supported};
use crate::backend::VolumeRecord;
use crate::error::Error;
use crate::model::{ClassName, VolumeId};
use crate::proto::csi::v1::{self as csi, controller_server::Controller, controller_service_capability};
use crate::request::{self, ControllerExpandRequest, CreateRequest, PARAM_DEVICE_CLASS, ValidationError};
use crate::status_registry::{ResizeState, ResizeStep};

#[derive(Debug)]
pub struct ControllerService(pub Arc<Driver>);

impl ControllerService {
    fn volume(&self, record: &VolumeRecord) -> csi::Volume {
        let mut context = record.claim.to_context();
        context.insert(PARAM_DEVICE_CLASS.to_string(), record.id.class.to_string());
        csi::Volume {
            capacity_bytes: record.size_bytes as i64,
            volume_id: record.id.to_string(),
            volume_context: context,
            content_source: None,
            accessible_topology: vec![csi::Topology {
                segments: self.0.volumes.topology().into_iter().collect(),
            }],
        }
    }
}

fn class_parameter(
    parameters: &std::collections::HashMap<String, String>,
) -> Result<Option<ClassName>, Error> {
    parameters
        .get(PARAM_DEVICE_CLASS)
        .map(|c| {
            ClassName::parse(c).map_err(|reason| {
                Error::from(ValidationError::Invalid {
                    field: "parameters",
                    reason,
                })
            })
        })
        .transpose()
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe("CreateVolume", &raw.name, async {
                let req = CreateRequest::try_from(&raw)?;
                let guard = self.0.lock(&req.token, "CreateVolume")?;
                let created = self.0.volumes.create(&guard, &req).await?;
                Ok(csi::CreateVolumeResponse {
                    volume: Some(self.volume(&created.record)),
                })
            })
            .await
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe("DeleteVolume", &raw.volume_id, async {
                let id = match VolumeId::parse(&raw.volume_id) {
                    Ok(id) => id,
                    Err(crate::model::IdError::NotOurs(_)) => {
                        tracing::info!("not an id of this driver: nothing to delete");
                        return Ok(csi::DeleteVolumeResponse {});
                    }
                    Err(crate::model::IdError::Empty) => {
                        return Err(ValidationError::Missing { field: "volume_id" }.into());
                    }
                    Err(e) => return Err(ValidationError::Id(e).into()),
                };
                let guard = self.0.lock(&id.token, "DeleteVolume")?;
                self.0.volumes.delete(&guard, &id).await?;
                self.0.states.forget(&id);
                Ok(csi::DeleteVolumeResponse {})
            })
            .await
    }

    async fn controller_publish_volume(
        &self,
        _: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        Err(not_supported(
            "ControllerPublishVolume",
            "volumes are node-local and need no attach",
        ))
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        Err(not_supported(
            "ControllerUnpublishVolume",
            "volumes are node-local and need no attach",
        ))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe("ValidateVolumeCapabilities", &raw.volume_id, async {
                if raw.volume_id.is_empty() {
                    return Err(ValidationError::Missing { field: "volume_id" }.into());
                }
                if raw.volume_capabilities.is_empty() {
                    return Err(ValidationError::Missing {
                        field: "volume_capabilities",
                    }
                    .into());
                }
                let id = VolumeId::parse(&raw.volume_id).map_err(ValidationError::Id)?;
                let parsed: Result<Vec<_>, _> =
                    raw.volume_capabilities.iter().map(request::capability).collect();
                let (confirmed, message) = match parsed {
                    Ok(caps) => {
                        let ok = self.0.volumes.validate(&id, &caps).await?;
                        (
                            ok,
                            if ok {
                                String::new()
                            } else {
                                "capabilities do not match the volume".to_string()
                            },
                        )
                    }
                    Err(e) => {
                        self.0.volumes.get(&id).await?;
                        (false, e.to_string())
                    }
                };
                Ok(csi::ValidateVolumeCapabilitiesResponse {
                    confirmed: confirmed.then(|| csi::validate_volume_capabilities_response::Confirmed {
                        volume_context: raw.volume_context.clone(),
                        volume_capabilities: raw.volume_capabilities.clone(),
                        parameters: raw.parameters.clone(),
                        mutable_parameters: raw.mutable_parameters.clone(),
                    }),
                    message,
                })
            })
            .await
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe("ListVolumes", "", async {
                if raw.max_entries < 0 {
                    return Err(ValidationError::Invalid {
                        field: "max_entries",
                        reason: "cannot be negative".to_string(),
                    }
                    .into());
                }
                let all = self.0.volumes.list().await?;
                // The token is the id to resume after: stable when volumes come and go.
                let start = if raw.starting_token.is_empty() {
                    0
                } else {
                    match all.iter().position(|r| r.id.to_string() == raw.starting_token) {
                        Some(i) => i + 1,
                        None => return Err(ValidationError::StaleToken(raw.starting_token.clone()).into()),
                    }
                };
                let take = if raw.max_entries == 0 {
                    usize::MAX
                } else {
                    raw.max_entries as usize
                };
                let page: Vec<_> = all.iter().skip(start).take(take).collect();
                let next_token = if start + page.len() < all.len() {
                    page.last().map(|r| r.id.to_string()).unwrap_or_default()
                } else {
                    String::new()
                };
                Ok(csi::ListVolumesResponse {
                    entries: page
                        .into_iter()
                        .map(|r| csi::list_volumes_response::Entry {
                            volume: Some(self.volume(r)),
                            status: None,
                        })
                        .collect(),
                    next_token,
                })
            })
            .await
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe("GetCapacity", "", async {
                let class = class_parameter(&raw.parameters)?;
                let unsupported = raw
                    .volume_capabilities
                    .iter()
                    .any(|c| request::capability(c).is_err());
                let topology = raw
                    .accessible_topology
                    .as_ref()
                    .map(|t| t.segments.clone().into_iter().collect());
                let capacity = self.0.volumes.capacity(class.as_ref(), topology.as_ref()).await?;
                let (available, max) = if unsupported {
                    (0, 0)
                } else {
                    (capacity.available, capacity.max_volume)
                };
                Ok(csi::GetCapacityResponse {
                    available_capacity: available as i64,
                    maximum_volume_size: Some(max as i64),
                    minimum_volume_size: None,
                })
            })
            .await
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use controller_service_capability::rpc::Type;
        let capabilities = [
            Type::CreateDeleteVolume,
            Type::ListVolumes,
            Type::GetCapacity,
            Type::ExpandVolume,
        ]
        .into_iter()
        .map(|t| csi::ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc { r#type: t as i32 },
            )),
        })
        .collect();
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn create_snapshot(
        &self,
        _: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        Err(not_supported("CreateSnapshot", "snapshots are not offered"))
    }

    async fn delete_snapshot(
        &self,
        _: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        Err(not_supported("DeleteSnapshot", "snapshots are not offered"))
    }

    async fn list_snapshots(
        &self,
        _: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        Err(not_supported("ListSnapshots", "snapshots are not offered"))
    }

    async fn get_snapshot(
        &self,
        _: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        Err(not_supported("GetSnapshot", "snapshots are not offered"))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe("ControllerExpandVolume", &raw.volume_id, async {
                let req = ControllerExpandRequest::try_from(&raw)?;
                let guard = self.0.lock(&req.id.token, "ControllerExpandVolume")?;
                let (states, step) = (&self.0.states, ResizeStep::Controller);
                let target_bytes = req.capacity.required;
                states.resized(&req.id, step, ResizeState::InProgress { target_bytes });
                let expanded = match self.0.volumes.expand(&guard, &req).await {
                    Ok(expanded) => expanded,
                    Err(e) => {
                        let reason = crate::error::full_message(&e);
                        states.resized(&req.id, step, ResizeState::Failed { target_bytes, reason });
                        return Err(e.into());
                    }
                };
                let size_bytes = expanded.size_bytes;
                states.resized(
                    &req.id,
                    step,
                    if expanded.node_expansion_required {
                        ResizeState::NodeExpansionPending { size_bytes }
                    } else {
                        ResizeState::Done { size_bytes }
                    },
                );
                Ok(csi::ControllerExpandVolumeResponse {
                    capacity_bytes: expanded.size_bytes as i64,
                    node_expansion_required: expanded.node_expansion_required,
                })
            })
            .await
    }

    async fn controller_get_volume(
        &self,
        _: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        Err(not_supported(
            "ControllerGetVolume",
            "the GET_VOLUME capability is not offered",
        ))
    }

    async fn controller_modify_volume(
        &self,
        _: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        Err(not_supported(
            "ControllerModifyVolume",
            "volumes have no mutable parameters",
        ))
    }
}
