//! CSI Controller, node-local: external-provisioner runs beside each localvol with
//! `--node-deployment` and provisions from the node's own storage.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{Driver, not_supported};
use crate::backend::{SnapshotRecord, VolumeRecord};
use crate::error::Error;
use crate::model::ValidationError;
use crate::model::{ClassName, IdError, SnapshotId, VolumeId};
use crate::proto::csi::v1::{self as csi, controller_server::Controller, controller_service_capability};
use crate::request::{
    self, ContentSource, ControllerExpandRequest, CreateRequest, ListSnapshotsRequest, PARAM_DEVICE_CLASS,
    SnapshotRequest,
};
use crate::volume_states::{ResizeState, ResizeStep};

#[derive(Debug)]
pub struct ControllerService(pub Arc<Driver>);

/// A volume as CSI shows it: its id, size, context and this node's topology.
fn volume(driver: &Driver, record: &VolumeRecord, source: Option<&ContentSource>) -> csi::Volume {
    let mut context = record.claim.to_context();
    context.insert(PARAM_DEVICE_CLASS.to_string(), record.id.class.to_string());
    csi::Volume {
        capacity_bytes: record.size_bytes as i64,
        volume_id: record.id.to_string(),
        volume_context: context,
        content_source: source.map(content_source),
        accessible_topology: vec![csi::Topology {
            segments: driver.volumes.topology().into_iter().collect(),
        }],
    }
}

fn content_source(source: &ContentSource) -> csi::VolumeContentSource {
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    csi::VolumeContentSource {
        r#type: Some(match source {
            ContentSource::Snapshot(id) => Type::Snapshot(SnapshotSource {
                snapshot_id: id.to_string(),
            }),
            ContentSource::Volume(id) => Type::Volume(VolumeSource {
                volume_id: id.to_string(),
            }),
        }),
    }
}

fn snapshot(record: &SnapshotRecord) -> csi::Snapshot {
    let since = record
        .created
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    csi::Snapshot {
        size_bytes: record.size_bytes as i64,
        snapshot_id: record.id.to_string(),
        source_volume_id: record.source.to_string(),
        creation_time: Some(prost_types::Timestamp {
            seconds: since.as_secs() as i64,
            nanos: since.subsec_nanos() as i32,
        }),
        // A snapshot is a complete copy by the time its record exists.
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}

/// The id a Delete call names; `None` for an id that is not this driver's (or not of
/// this kind): nothing of ours to delete, which CSI counts as done.
fn id_to_delete<T>(
    raw: &str,
    field: &'static str,
    parse: fn(&str) -> Result<T, IdError>,
) -> Result<Option<T>, ValidationError> {
    match parse(raw) {
        Ok(id) => Ok(Some(id)),
        Err(IdError::NotOurs(_)) => Ok(None),
        Err(IdError::Empty) => Err(ValidationError::Missing { field }),
        Err(e) => Err(ValidationError::Id(e)),
    }
}

/// One page of `all` (ordered by id): after the entry whose id is `starting` (stable
/// while entries come and go), at most `max` (0: all). The token is the last id given.
fn paginate<'a, T>(
    all: &'a [T],
    id: impl Fn(&T) -> String,
    starting: Option<&str>,
    max: usize,
) -> Result<(Vec<&'a T>, String), ValidationError> {
    let start = match starting {
        None => 0,
        Some(token) => match all.iter().position(|e| id(e) == token) {
            Some(i) => i + 1,
            None => return Err(ValidationError::StaleToken(token.to_string())),
        },
    };
    let take = if max == 0 { usize::MAX } else { max };
    let page: Vec<_> = all.iter().skip(start).take(take).collect();
    let next_token = if start + page.len() < all.len() {
        page.last().map(|e| id(e)).unwrap_or_default()
    } else {
        String::new()
    };
    Ok((page, next_token))
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
            .observe_on_one_thread("CreateVolume", raw.name.clone(), |driver| async move {
                let req = CreateRequest::try_from(&raw)?;
                let guard = driver.lock(&req.token, "CreateVolume")?;
                // A clone reads its source: nothing may change or delete it meanwhile.
                let _source_guard = match &req.source {
                    Some(ContentSource::Volume(id)) => Some(driver.lock(&id.token, "CreateVolume")?),
                    _ => None,
                };
                let created = driver.volumes.create(&guard, &req).await?;
                driver.owner_check.volume_created(&req.claim);
                Ok(csi::CreateVolumeResponse {
                    volume: Some(volume(&driver, &created.record, req.source.as_ref())),
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
            .observe_on_one_thread("DeleteVolume", raw.volume_id.clone(), |driver| async move {
                let Some(id) = id_to_delete(&raw.volume_id, "volume_id", VolumeId::parse)? else {
                    tracing::info!("not an id of this driver: nothing to delete");
                    return Ok(csi::DeleteVolumeResponse {});
                };
                let guard = driver.lock(&id.token, "DeleteVolume")?;
                driver.volumes.delete(&guard, &id).await?;
                driver.volume_states.forget(&id);
                driver.metrics.forget_volume(&id);
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
                let starting = (!raw.starting_token.is_empty()).then_some(raw.starting_token.as_str());
                let (page, next_token) =
                    paginate(&all, |r| r.id.to_string(), starting, raw.max_entries as usize)?;
                Ok(csi::ListVolumesResponse {
                    entries: page
                        .into_iter()
                        .map(|r| csi::list_volumes_response::Entry {
                            volume: Some(volume(&self.0, r, None)),
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
            .observe_on_one_thread("GetCapacity", String::new(), |driver| async move {
                let class = class_parameter(&raw.parameters)?;
                let unsupported = raw
                    .volume_capabilities
                    .iter()
                    .any(|c| request::capability(c).is_err());
                let topology = raw
                    .accessible_topology
                    .as_ref()
                    .map(|t| t.segments.clone().into_iter().collect());
                let capacity = driver.volumes.capacity(class.as_ref(), topology.as_ref()).await?;
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
            Type::CreateDeleteSnapshot,
            Type::ListSnapshots,
            Type::CloneVolume,
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
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe("CreateSnapshot", &raw.source_volume_id, async {
                let req = SnapshotRequest::try_from(&raw)?;
                let _guard = self
                    .0
                    .lock(&SnapshotId::lock_token(&req.token), "CreateSnapshot")?;
                let source_guard = self.0.lock(&req.source.token, "CreateSnapshot")?;
                let record = self.0.volumes.create_snapshot(&source_guard, &req).await?;
                Ok(csi::CreateSnapshotResponse {
                    snapshot: Some(snapshot(&record)),
                })
            })
            .await
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe("DeleteSnapshot", &raw.snapshot_id, async {
                let Some(id) = id_to_delete(&raw.snapshot_id, "snapshot_id", SnapshotId::parse)? else {
                    tracing::info!("not a snapshot id of this driver: nothing to delete");
                    return Ok(csi::DeleteSnapshotResponse {});
                };
                let _guard = self
                    .0
                    .lock(&SnapshotId::lock_token(&id.token), "DeleteSnapshot")?;
                self.0.volumes.delete_snapshot(&id).await?;
                Ok(csi::DeleteSnapshotResponse {})
            })
            .await
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe("ListSnapshots", "", async {
                let req = ListSnapshotsRequest::try_from(&raw)?;
                let all = self.0.volumes.list_snapshots(&req.filter).await?;
                let (page, next_token) = paginate(
                    &all,
                    |s| s.id.to_string(),
                    req.starting_token.as_deref(),
                    req.max_entries,
                )?;
                Ok(csi::ListSnapshotsResponse {
                    entries: page
                        .into_iter()
                        .map(|s| csi::list_snapshots_response::Entry {
                            snapshot: Some(snapshot(s)),
                        })
                        .collect(),
                    next_token,
                })
            })
            .await
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
                let (states, step) = (&self.0.volume_states, ResizeStep::Controller);
                let target_bytes = req.capacity.required;
                states.resized(&req.id, step, ResizeState::InProgress { target_bytes });
                let expanded = match self.0.volumes.expand(&guard, &req).await {
                    Ok(expanded) => expanded,
                    Err(e) => {
                        let reason = crate::model::full_message(&e);
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
