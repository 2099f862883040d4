//! Snapshots, restores and clones: which class makes them, where the source is mounted
//! (to freeze it), and idempotency by name.
//!
//! Snapshots and the volumes made from them are independent copies (a reflink or a
//! sparse copy of a loop image): a volume with snapshots can be deleted and its
//! snapshots stay restorable; a snapshot a volume was restored from can be deleted and
//! the volume keeps its data. That is what CSI's "snapshots are independent of their
//! source" and Kubernetes' VolumeSnapshot deletion expect.

use std::path::PathBuf;

use super::{VolumeError, Volumes, guard_matches};
use crate::backend::{
    Backend, BackendError, CopySource, CreateSpec, SnapshotRecord, SnapshotSpec, VolumeRecord,
};
use crate::locks::VolumeGuard;
use crate::model::ValidationError;
use crate::model::{SnapshotId, Token, VolumeId, VolumeMode};
use crate::mount::MountTable;
use crate::request::{ContentSource, CreateRequest, SnapshotFilter, SnapshotRequest};

impl Volumes {
    /// Where the volume's filesystem is mounted on this node (staged), if it is: the
    /// mount to freeze around a copy. Any mount of the filesystem freezes all of them.
    async fn filesystem_mount(
        &self,
        backend: &Backend,
        record: &VolumeRecord,
    ) -> Result<Option<PathBuf>, VolumeError> {
        if record.mode != VolumeMode::Filesystem {
            return Ok(None);
        }
        let Some(device) = backend.device(&record.id.token).await? else {
            return Ok(None);
        };
        let Some(number) = self.host.syscalls.device_number(&device).await? else {
            return Ok(None);
        };
        let table = MountTable::read(&self.host).await?;
        Ok(table
            .entries()
            .find(|e| e.device_number() == number && e.root == std::path::Path::new("/"))
            .map(|e| e.mount_point.clone()))
    }

    /// Looks a CreateSnapshot name up in every class (its token is unique per node).
    async fn find_snapshot(&self, token: &Token) -> Result<Option<SnapshotRecord>, VolumeError> {
        for backend in self.backends() {
            if let Some(record) = backend.get_snapshot(token).await? {
                return Ok(Some(record));
            }
        }
        Ok(None)
    }

    /// Takes a snapshot of `req.source`, under the source volume's lock.
    pub async fn create_snapshot(
        &self,
        source_guard: &VolumeGuard,
        req: &SnapshotRequest,
    ) -> Result<SnapshotRecord, VolumeError> {
        guard_matches(source_guard, &req.source);
        if let Some(existing) = self.find_snapshot(&req.token).await? {
            if existing.name != req.name || existing.source != req.source {
                return Err(VolumeError::AlreadyExists {
                    name: req.name.clone(),
                    reason: format!("snapshot {} is of volume {}", existing.id, existing.source),
                });
            }
            return Ok(existing);
        }
        let (backend, record) = self.record(&req.source).await?;
        let id = SnapshotId::new(req.source.class.clone(), req.token.clone()).to_string();
        if id.len() > crate::request::MAX_STRING_BYTES {
            return Err(ValidationError::Invalid {
                field: "name",
                reason: format!("the snapshot id {id:?} would be too long; use a shorter name"),
            }
            .into());
        }
        let freeze = if backend.snapshots() {
            self.filesystem_mount(backend, &record).await?
        } else {
            None
        };
        let spec = SnapshotSpec {
            token: req.token.clone(),
            name: req.name.clone(),
            source: req.source.token.clone(),
            freeze,
        };
        Ok(backend.create_snapshot(&spec).await?)
    }

    /// Deletes a snapshot; one that names nothing here is already deleted.
    pub async fn delete_snapshot(&self, id: &SnapshotId) -> Result<(), VolumeError> {
        match self.backend_of(&VolumeId::new(id.class.clone(), id.token.clone())) {
            Ok(backend) => Ok(backend.delete_snapshot(&id.token).await?),
            Err(VolumeError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The snapshots `filter` selects, ordered by id.
    pub async fn list_snapshots(&self, filter: &SnapshotFilter) -> Result<Vec<SnapshotRecord>, VolumeError> {
        let mut all = Vec::new();
        match filter {
            SnapshotFilter::Nothing => {}
            SnapshotFilter::Snapshot(id) => {
                if let Ok(backend) = self.backend_of(&VolumeId::new(id.class.clone(), id.token.clone()))
                    && let Some(record) = backend.get_snapshot(&id.token).await?
                {
                    all.push(record);
                }
            }
            SnapshotFilter::Source(source) => {
                if let Ok(backend) = self.backend_of(source) {
                    all.extend(
                        backend
                            .list_snapshots()
                            .await?
                            .into_iter()
                            .filter(|s| &s.source == source),
                    );
                }
            }
            SnapshotFilter::All => {
                for backend in self.backends() {
                    all.extend(backend.list_snapshots().await?);
                }
            }
        }
        all.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(all)
    }

    /// CreateVolume from a snapshot or a volume: a copy in the source's class, at least
    /// the source's size. The caller holds the source volume's lock for a clone.
    pub(super) async fn create_copy(
        &self,
        backend: &Backend,
        spec: CreateSpec,
        req: &CreateRequest,
        source: &ContentSource,
    ) -> Result<VolumeRecord, VolumeError> {
        let class = backend.class();
        // Whether the source holds a LUKS header: known for a clone, and for a snapshot
        // whose volume is still here (else its first stage says what it holds).
        let (source_class, source_size, copy, source_encrypted) = match source {
            ContentSource::Snapshot(id) => {
                let snapshot = match self.find_snapshot(&id.token).await? {
                    Some(s) if &s.id == id => s,
                    _ => return Err(VolumeError::SnapshotNotFound(id.clone())),
                };
                let origin = match self.record(&snapshot.source).await {
                    Ok((_, origin)) => Some(origin.encryption.is_some()),
                    Err(_) => None,
                };
                (
                    id.class.clone(),
                    snapshot.size_bytes,
                    CopySource::Snapshot(id.token.clone()),
                    origin,
                )
            }
            ContentSource::Volume(id) => {
                let (source_backend, record) = self.record(id).await?;
                let freeze = if source_backend.snapshots() {
                    self.filesystem_mount(source_backend, &record).await?
                } else {
                    None
                };
                let copy = CopySource::Volume {
                    token: id.token.clone(),
                    freeze,
                };
                (
                    id.class.clone(),
                    record.size_bytes,
                    copy,
                    Some(record.encryption.is_some()),
                )
            }
        };
        let state = |encrypted: bool| if encrypted { "encrypted" } else { "not encrypted" };
        if let Some(source_encrypted) = source_encrypted
            && source_encrypted != spec.encryption.is_some()
        {
            return Err(VolumeError::EncryptionMismatch {
                source_state: state(source_encrypted),
                copy_state: state(spec.encryption.is_some()),
            });
        }
        if &source_class != class {
            return Err(ValidationError::Invalid {
                field: "volume_content_source",
                reason: format!(
                    "the source is in device class {source_class}: a copy is made in its source's class, not {class}"
                ),
            }
            .into());
        }
        if let Some(limit) = req.capacity.limit
            && source_size > limit
        {
            return Err(ValidationError::OutOfRange(format!(
                "the source holds {source_size} bytes, above the limit of {limit}, and volumes never shrink"
            ))
            .into());
        }
        let spec = CreateSpec {
            size_bytes: spec.size_bytes.max(source_size),
            ..spec
        };
        match backend.create_from(&spec, &copy).await {
            Err(BackendError::SnapshotNotFound { .. }) => match source {
                ContentSource::Snapshot(id) => Err(VolumeError::SnapshotNotFound(id.clone())),
                ContentSource::Volume(id) => Err(VolumeError::NotFound(id.clone())),
            },
            other => Ok(other?),
        }
    }
}
