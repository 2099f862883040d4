//! What a publish binds, and its proof from the whole mount table where the kernel,
//! asked about the two paths alone, could not give one (see `Volumes::publish`).

use std::path::PathBuf;

use tracing::info;

use super::ownership::{Holding, Identity, describe, holding, refuse_mounts_below};
use super::{VolumeError, Volumes};
use crate::backend::Backend;
use crate::model::{AccessMode, AccessType};
use crate::mount::{MountEntry, MountTable};
use crate::request::PublishRequest;

impl Volumes {
    /// What a publish binds at its target: the staging mount, or the volume's own device
    /// node; NOT_STAGED without one.
    pub(super) async fn source_of(
        &self,
        backend: &Backend,
        req: &PublishRequest,
    ) -> Result<PathBuf, VolumeError> {
        match &req.capability.access {
            AccessType::Mount { .. } => Ok(req.staging_path.as_path().to_path_buf()),
            AccessType::Block => backend
                .device(&req.id.token)
                .await?
                .ok_or_else(|| not_staged(req)),
        }
    }

    /// A publish proven from the whole mount table: the source it binds, or `None` when
    /// the target already holds this publication (done).
    pub(super) async fn prove_publish_by_table(
        &self,
        backend: &Backend,
        req: &PublishRequest,
        identity: Option<Identity>,
    ) -> Result<Option<PathBuf>, VolumeError> {
        let target = req.target_path.as_path();
        let staging = req.staging_path.as_path();
        let table = MountTable::read(&self.host).await?;
        // The source must be this volume: its staging mount, or its own device node.
        let source = match &req.capability.access {
            AccessType::Mount { .. } => match holding(&table, staging, identity.as_ref()) {
                Holding::This(e) if identity.as_ref().is_some_and(|i| i.is_filesystem(e)) => {
                    staging.to_path_buf()
                }
                Holding::This(e) | Holding::Other(e) => {
                    return Err(VolumeError::Occupied {
                        path: staging.to_path_buf(),
                        holder: describe(e),
                    });
                }
                Holding::Nothing => return Err(not_staged(req)),
            },
            AccessType::Block => self.source_of(backend, req).await?,
        };
        let identity = identity.ok_or_else(|| not_staged(req))?;
        let is_publication = |e: &MountEntry| match req.capability.access {
            AccessType::Mount { .. } => identity.is_filesystem(e) && e.mount_point != staging,
            AccessType::Block => identity.is_device_bind(e),
        };
        match holding(&table, target, Some(&identity)) {
            Holding::This(existing) if is_publication(existing) => {
                if existing.is_read_only() == req.read_only {
                    info!(volume.id = %req.id, path = %target.display(), "already published");
                    return Ok(None);
                }
                return Err(VolumeError::PathInUse {
                    path: target.to_path_buf(),
                    reason: "this volume is mounted there with a different read-only setting".into(),
                });
            }
            Holding::This(e) | Holding::Other(e) => {
                return Err(VolumeError::Occupied {
                    path: target.to_path_buf(),
                    holder: describe(e),
                });
            }
            Holding::Nothing => {}
        }
        refuse_mounts_below(&table, target)?;
        if req.capability.mode == AccessMode::SingleNodeSingleWriter
            && let Some(other) = table
                .entries()
                .find(|m| is_publication(m) && m.mount_point != target)
        {
            return Err(VolumeError::SingleWriter {
                id: req.id.clone(),
                path: other.mount_point.clone(),
            });
        }
        Ok(Some(source))
    }
}

pub(super) fn not_staged(req: &PublishRequest) -> VolumeError {
    VolumeError::NotStaged {
        id: req.id.clone(),
        path: req.staging_path.as_path().to_path_buf(),
    }
}
