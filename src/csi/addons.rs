//! The csi-addons gRPC API on its own socket: Identity (who we are, ReclaimSpace ONLINE)
//! and ReclaimSpaceNode.NodeReclaimSpace, which runs one reclaim through the shared
//! [`Runner`] (same lock, same concurrency limit as scheduled runs).
//!
//! NodeReclaimSpace answers OK for a raw block volume without touching it and without
//! usage figures; the `localvol-reclaim` response header says what happened in every
//! case (the message has no field for it).

use std::sync::Arc;
use std::time::Instant;

use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};
use tracing::{Instrument, info_span, warn};

use crate::error::Error;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::model::DRIVER_NAME;
use crate::model::ValidationError;
use crate::model::VolumeId;
use crate::proto::identity::{self as id, capability, identity_server};
use crate::proto::reclaimspace::{self as rs, reclaim_space_node_server};
use crate::reclaim::{ReclaimOutcome, Runner};
use crate::request::{HostPath, KubeletRoots};

/// Response header carrying the run's outcome in words.
pub const OUTCOME_HEADER: &str = "localvol-reclaim";

/// State shared by the two services.
#[derive(Debug)]
pub struct Addons {
    pub runner: Runner,
    pub health: Arc<Health>,
    pub metrics: Metrics,
}

/// A NodeReclaimSpace request, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimRequest {
    pub id: VolumeId,
    /// The paths the caller named (volume path first), confined like a node call's:
    /// each must hold this volume's filesystem, and the first is trimmed.
    pub paths: Vec<HostPath>,
}

impl ReclaimRequest {
    pub fn parse(req: &rs::NodeReclaimSpaceRequest, roots: &KubeletRoots) -> Result<Self, ValidationError> {
        if req.volume_id.is_empty() {
            return Err(ValidationError::Missing { field: "volume_id" });
        }
        let mut paths = Vec::new();
        for (field, raw) in [
            ("volume_path", &req.volume_path),
            ("staging_target_path", &req.staging_target_path),
        ] {
            if !raw.is_empty() {
                paths.push(HostPath::confined(field, raw, roots)?);
            }
        }
        Ok(Self {
            id: VolumeId::parse(&req.volume_id)?,
            paths,
        })
    }
}

#[derive(Debug)]
pub struct IdentityService(pub Arc<Addons>);

#[derive(Debug)]
pub struct ReclaimSpaceService(pub Arc<Addons>);

/// The two services, ready to add to a server.
pub fn services(
    addons: Arc<Addons>,
) -> (
    identity_server::IdentityServer<IdentityService>,
    reclaim_space_node_server::ReclaimSpaceNodeServer<ReclaimSpaceService>,
) {
    (
        identity_server::IdentityServer::new(IdentityService(Arc::clone(&addons))),
        reclaim_space_node_server::ReclaimSpaceNodeServer::new(ReclaimSpaceService(addons)),
    )
}

#[tonic::async_trait]
impl identity_server::Identity for IdentityService {
    async fn get_identity(
        &self,
        _: Request<id::GetIdentityRequest>,
    ) -> Result<Response<id::GetIdentityResponse>, Status> {
        Ok(Response::new(id::GetIdentityResponse {
            name: DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_capabilities(
        &self,
        _: Request<id::GetCapabilitiesRequest>,
    ) -> Result<Response<id::GetCapabilitiesResponse>, Status> {
        let node = capability::Type::Service(capability::Service {
            r#type: capability::service::Type::NodeService as i32,
        });
        let online = capability::Type::ReclaimSpace(capability::ReclaimSpace {
            r#type: capability::reclaim_space::Type::Online as i32,
        });
        Ok(Response::new(id::GetCapabilitiesResponse {
            capabilities: [node, online]
                .into_iter()
                .map(|t| id::Capability { r#type: Some(t) })
                .collect(),
        }))
    }

    async fn probe(&self, _: Request<id::ProbeRequest>) -> Result<Response<id::ProbeResponse>, Status> {
        let ready = self.0.health.readiness().await;
        if let Err(reason) = &ready {
            tracing::info!(%reason, "csi-addons probe: not ready");
        }
        Ok(Response::new(id::ProbeResponse {
            ready: Some(ready.is_ok()),
        }))
    }
}

fn usage(bytes: u64) -> Option<rs::StorageConsumption> {
    Some(rs::StorageConsumption {
        usage_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
    })
}

#[tonic::async_trait]
impl reclaim_space_node_server::ReclaimSpaceNode for ReclaimSpaceService {
    async fn node_reclaim_space(
        &self,
        request: Request<rs::NodeReclaimSpaceRequest>,
    ) -> Result<Response<rs::NodeReclaimSpaceResponse>, Status> {
        const METHOD: &str = "NodeReclaimSpace";
        let raw = request.into_inner();
        let started = Instant::now();
        let span = info_span!("rpc", rpc.method = METHOD, volume.id = %raw.volume_id);
        let result: Result<ReclaimOutcome, Error> = async {
            let req = ReclaimRequest::parse(&raw, self.0.runner.roots())?;
            Ok(self.0.runner.reclaim(&req.id, &req.paths).await?)
        }
        .instrument(span.clone())
        .await;
        match result {
            Ok(outcome) => {
                self.0
                    .metrics
                    .observe_rpc(METHOD, &super::code_label(tonic::Code::Ok), started);
                let reply = match &outcome {
                    // The backing store's usage where the backend can tell, else the
                    // filesystem's (which a trim does not change; the header says which).
                    ReclaimOutcome::Trimmed(t) => rs::NodeReclaimSpaceResponse {
                        pre_usage: usage(t.before),
                        post_usage: usage(t.after),
                    },
                    ReclaimOutcome::NotDiscarded(_) => rs::NodeReclaimSpaceResponse::default(),
                };
                let mut response = Response::new(reply);
                if let Ok(value) = MetadataValue::try_from(outcome.summary()) {
                    response.metadata_mut().insert(OUTCOME_HEADER, value);
                }
                Ok(response)
            }
            Err(error) => {
                let status = Status::from(error);
                span.in_scope(|| warn!(code = ?status.code(), error = status.message(), "call failed"));
                self.0
                    .metrics
                    .observe_rpc(METHOD, &super::code_label(status.code()), started);
                Err(status)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::IdError;

    fn req(id: &str, volume_path: &str, staging: &str) -> rs::NodeReclaimSpaceRequest {
        rs::NodeReclaimSpaceRequest {
            volume_id: id.to_string(),
            volume_path: volume_path.to_string(),
            staging_target_path: staging.to_string(),
            ..Default::default()
        }
    }

    fn parse(r: &rs::NodeReclaimSpaceRequest) -> Result<ReclaimRequest, ValidationError> {
        ReclaimRequest::parse(r, &KubeletRoots::new(vec!["/k".into()]))
    }

    #[test]
    fn requests_validate_like_the_csi_handlers() {
        let paths = |r: ReclaimRequest| -> Vec<std::path::PathBuf> {
            r.paths.iter().map(|p| p.as_path().to_path_buf()).collect()
        };
        let ok = parse(&req("default.pvc-1", "/k/pods/x/mount", "")).unwrap();
        assert_eq!(ok.id.to_string(), "default.pvc-1");
        assert_eq!(paths(ok), ["/k/pods/x/mount"].map(std::path::PathBuf::from));
        let both = parse(&req("default.pvc-1", "/k/a", "/k/b/")).unwrap();
        assert_eq!(paths(both), ["/k/a", "/k/b"].map(std::path::PathBuf::from));
        assert!(parse(&req("default.pvc-1", "", "")).unwrap().paths.is_empty());

        let code = |r: rs::NodeReclaimSpaceRequest| Status::from(Error::from(parse(&r).unwrap_err())).code();
        // Confined as node calls are: outside the roots, a root itself, `..`, relative.
        for (volume_path, staging) in [
            ("/etc", ""),
            ("", "/proc"),
            ("/k", ""),
            ("/k/pods/../../etc", ""),
            ("/k/a", "/var/lib/kubelet/b"),
        ] {
            assert_eq!(
                code(req("default.pvc-1", volume_path, staging)),
                tonic::Code::InvalidArgument,
                "{volume_path:?} {staging:?}"
            );
        }
        assert_eq!(code(req("", "/k/a", "")), tonic::Code::InvalidArgument);
        assert_eq!(
            code(req("default.pvc-1", "relative", "")),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            code(req("default.pvc-1", "/a/../etc", "")),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            code(req("default.pvc-1", "/k/a", "x")),
            tonic::Code::InvalidArgument
        );
        assert_eq!(code(req("a/b", "/k/a", "")), tonic::Code::InvalidArgument);
        assert_eq!(code(req("fake-vol-id", "/k/a", "")), tonic::Code::NotFound);
        assert!(matches!(
            parse(&req("fake-vol-id", "", "")),
            Err(ValidationError::Id(IdError::NotOurs(_)))
        ));
    }
}
