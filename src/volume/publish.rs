//! Publish and unpublish: binding a staged volume (or a raw block volume's device node)
//! at a pod's target and taking it away, and the proof from the whole mount table where
//! the kernel, asked about the two paths alone, could not give one.

use std::path::PathBuf;

use tracing::info;

use super::ownership::{Holding, Identity, describe, holding, refuse_mounts_below};
use super::placed::Role;
use super::targets::{create_dir, create_file, remove_target};
use super::{VolumeError, Volumes, check_access, check_no_symlinks, guard_matches};
use crate::backend::{Backend, VolumeRecord};
use crate::locks::VolumeGuard;
use crate::model::{AccessMode, AccessType, ValidationError};
use crate::mount::{self, MountEntry, MountTable};
use crate::request::{PublishRequest, UnpublishRequest};

impl Volumes {
    pub async fn publish(&self, guard: &VolumeGuard, req: &PublishRequest) -> Result<(), VolumeError> {
        guard_matches(guard, &req.id);
        let target = req.target_path.as_path();
        let staging = req.staging_path.as_path();
        let backend = self.backend_of(&req.id)?;
        let is_mount = matches!(req.capability.access, AccessType::Mount { .. });
        // Independent reads, at once; their errors are taken in the order the checks
        // mean. The kernel is asked about the two paths themselves; the whole table is
        // read only where that cannot prove the publish (below).
        let (record, target_links, staging_links, identity, staging_mount, target_clear) = tokio::join!(
            self.record(&req.id),
            check_no_symlinks(target),
            async {
                if is_mount {
                    check_no_symlinks(staging).await
                } else {
                    Ok(())
                }
            },
            self.identity(backend, &req.id.token),
            async {
                if is_mount {
                    self.host.syscalls.mount_at(staging).await.ok().flatten()
                } else {
                    None
                }
            },
            self.clear_at_and_below(target)
        );
        let (_, record) = record?;
        check_access(&record, &req.capability)?;
        if target == staging || target.starts_with(staging) || staging.starts_with(target) {
            return Err(VolumeError::Invalid(ValidationError::Invalid {
                field: "target_path",
                reason: "the target path and the staging path must not contain each other".into(),
            }));
        }
        // Neither path may be the other's role as this daemon made it.
        self.placed
            .refuse_role(&req.id, target, "target_path", Role::Stage)?;
        self.placed
            .refuse_role(&req.id, staging, "staging_target_path", Role::Publication)?;
        self.placed.refuse_inside("target_path", target)?;
        target_links?;
        let identity = identity?;
        staging_links?;
        // The short way: the kernel shows this volume's filesystem at the staging path
        // (or the volume is raw block) and nothing at or below the target. A single
        // writer must also be published nowhere else, which only the table shows.
        let shown_staged = |i: &Identity| match &staging_mount {
            Some(m) => i.is_filesystem_shown_by(m),
            None => !is_mount,
        };
        let source = match &identity {
            Some(i)
                if target_clear
                    && shown_staged(i)
                    && req.capability.mode != AccessMode::SingleNodeSingleWriter =>
            {
                self.source_of(backend, req, &record).await?
            }
            _ => match self
                .prove_publish_by_table(backend, req, &record, identity)
                .await?
            {
                Some(source) => source,
                None => return Ok(()),
            },
        };
        match req.capability.access {
            AccessType::Mount { .. } => create_dir(target).await?,
            AccessType::Block => create_file(target).await?,
        }
        mount::bind(&self.host, &source, target, req.read_only).await?;
        self.placed.place(&req.id, target, Role::Publication).await;
        Ok(())
    }

    /// Unmounts this volume from the target, then removes the target if it is what
    /// publish made (an empty directory or file). A target holding nothing is done
    /// already; one holding anything else is refused, and so are the volume's staging
    /// path (which holds the same mount as a target) and paths inside a volume, before
    /// anything is touched.
    pub async fn unpublish(&self, guard: &VolumeGuard, req: &UnpublishRequest) -> Result<(), VolumeError> {
        guard_matches(guard, &req.id);
        let target = req.target_path.as_path();
        self.placed
            .refuse_role(&req.id, target, "target_path", Role::Stage)?;
        self.placed.refuse_inside("target_path", target)?;
        self.unbind(req).await?;
        self.placed.unplace(&req.id, target, Role::Publication).await;
        Ok(())
    }

    async fn unbind(&self, req: &UnpublishRequest) -> Result<(), VolumeError> {
        let target = req.target_path.as_path();
        let backend = self.backend_of(&req.id)?;
        let (links, identity, mut shown) = tokio::join!(
            check_no_symlinks(target),
            self.identity(backend, &req.id.token),
            self.host.syscalls.mount_at(target)
        );
        links?;
        let identity = identity?;
        let placed = self.placed.is(&req.id, target, Role::Publication);
        // A path inside the volume's own filesystem is never a target of it.
        let inside = identity.as_ref().map(|i| (&req.id, i.dev));
        // Bounded: a path with more stacked mounts than this is not ours to untangle.
        let mut budget = 16;
        // The short way: the kernel, asked about the target itself, shows this volume
        // there or nothing. Anything else (another mount, a kernel without statmount)
        // is for the table to show and name.
        while budget > 0 {
            match shown {
                Ok(None) => return remove_target(target, inside).await,
                Err(e) if e.is_not_found() => return remove_target(target, inside).await,
                Ok(Some(m)) if identity.as_ref().is_some_and(|i| i.is_shown_by(&m)) => {
                    mount::unmount(&self.host, target).await?;
                    budget -= 1;
                    shown = self.host.syscalls.mount_at(target).await;
                }
                // The volume's own bind of a device node removed under it (ownership.rs,
                // lost_bind_at): what the condition tells kubelet to unpublish.
                Ok(Some(m)) if placed && self.is_lost_bind(&m, identity.as_ref()).await => {
                    mount::unmount(&self.host, target).await?;
                    budget -= 1;
                    shown = self.host.syscalls.mount_at(target).await;
                }
                Ok(Some(_)) | Err(_) => break,
            }
        }
        while budget > 0 {
            let table = MountTable::read(&self.host).await?;
            match holding(&table, target, identity.as_ref()) {
                Holding::Nothing => return remove_target(target, inside).await,
                Holding::This(_) => {
                    mount::unmount(&self.host, target).await?;
                    budget -= 1;
                    // It was the only mount there: nothing is left to look at.
                    if table.count_at(target) == 1 {
                        return remove_target(target, inside).await;
                    }
                }
                Holding::Other(e)
                    if placed && self.is_lost_bind(&e.mounted_at(), identity.as_ref()).await =>
                {
                    mount::unmount(&self.host, target).await?;
                    budget -= 1;
                    if table.count_at(target) == 1 {
                        return remove_target(target, inside).await;
                    }
                }
                Holding::Other(e) => {
                    return Err(VolumeError::Occupied {
                        path: target.to_path_buf(),
                        holder: describe(e),
                    });
                }
            }
        }
        Err(VolumeError::Occupied {
            path: target.to_path_buf(),
            holder: "more than 16 stacked mounts of this volume".into(),
        })
    }

    /// What a publish binds at its target: the staging mount, or the volume's own device
    /// node (`record` is the volume's, as the publish read it); NOT_STAGED without one.
    pub(super) async fn source_of(
        &self,
        backend: &Backend,
        req: &PublishRequest,
        record: &VolumeRecord,
    ) -> Result<PathBuf, VolumeError> {
        match &req.capability.access {
            AccessType::Mount { .. } => Ok(req.staging_path.as_path().to_path_buf()),
            AccessType::Block => self
                .data_device(backend, record)
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
        record: &VolumeRecord,
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
            AccessType::Block => self.source_of(backend, req, record).await?,
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
