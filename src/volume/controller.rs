//! Controller operations, run on the node that owns the storage: create, delete,
//! expand, capacity, validation.

use super::{VolumeError, Volumes, guard_matches};
use crate::backend::{Backend, BackendError, ClassCapacity, CreateSpec, VolumeRecord};
use crate::crypt;
use crate::fs::FsType;
use crate::locks::VolumeGuard;
use crate::model::ValidationError;
use crate::model::{AccessType, Capability, CapacityRange, ClassName, VolumeId, VolumeMode};
use crate::request::{ControllerExpandRequest, CreateRequest, Segments};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedVolume {
    pub record: VolumeRecord,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpandedVolume {
    pub size_bytes: u64,
    pub node_expansion_required: bool,
}

/// What every capability of a create request agrees on: block or filesystem, and the
/// filesystem type if one is named.
fn volume_mode(capabilities: &[Capability]) -> Result<(VolumeMode, Option<FsType>), ValidationError> {
    let mut mode = None;
    let mut fs = None;
    for cap in capabilities {
        let this = match &cap.access {
            AccessType::Block => VolumeMode::Block,
            AccessType::Mount { fs_type, .. } => {
                if let Some(t) = fs_type {
                    if fs.is_some_and(|f| f != *t) {
                        return Err(ValidationError::Invalid {
                            field: "volume_capabilities",
                            reason: "capabilities name different filesystem types".to_string(),
                        });
                    }
                    fs = Some(*t);
                }
                VolumeMode::Filesystem
            }
        };
        if mode.is_some_and(|m| m != this) {
            return Err(ValidationError::Invalid {
                field: "volume_capabilities",
                reason: "a volume is either raw block or filesystem, not both".to_string(),
            });
        }
        mode = Some(this);
    }
    Ok((mode.unwrap_or(VolumeMode::Filesystem), fs))
}

impl Volumes {
    /// True when one of the CO's acceptable topologies is this node (or it has none).
    fn serves_topology(&self, topologies: &[Segments]) -> bool {
        topologies.is_empty()
            || topologies.iter().any(|segments| {
                segments
                    .iter()
                    .all(|(k, v)| k == super::TOPOLOGY_KEY && *v == self.node_id)
            })
    }

    pub async fn create(
        &self,
        guard: &VolumeGuard,
        req: &CreateRequest,
    ) -> Result<CreatedVolume, VolumeError> {
        debug_assert_eq!(guard.token(), &req.token);
        let class = req.class.clone().unwrap_or_else(|| self.default_class.clone());
        let backend = self.served_backend(&class)?;
        // A long name in a long class could make an id CSI does not allow (128 bytes).
        let id = VolumeId::new(class.clone(), req.token.clone()).to_string();
        if id.len() > crate::request::MAX_STRING_BYTES {
            return Err(VolumeError::Invalid(ValidationError::Invalid {
                field: "name",
                reason: format!(
                    "the volume id {id:?} would be longer than {} bytes; use a shorter name",
                    crate::request::MAX_STRING_BYTES
                ),
            }));
        }
        if !self.serves_topology(&req.topologies) {
            return Err(VolumeError::Topology {
                node: self.node_id.clone(),
            });
        }
        let (mode, fs_type) = volume_mode(&req.capabilities)?;
        if req.encryption.is_some() {
            refuse_encryption_on(backend)?;
        }
        if let Some(existing) = self.find_token(&req.token).await? {
            let incompatible = |reason: String| VolumeError::AlreadyExists {
                name: req.name.clone(),
                reason,
            };
            if existing.name != req.name {
                return Err(incompatible(format!(
                    "its id {} belongs to {:?}",
                    existing.id, existing.name
                )));
            }
            if existing.id.class != class {
                return Err(incompatible(format!(
                    "it is in device class {}",
                    existing.id.class
                )));
            }
            if !req.capacity.contains(existing.size_bytes) {
                return Err(incompatible(format!(
                    "its size {} is outside the requested range",
                    existing.size_bytes
                )));
            }
            if existing.mode != mode {
                return Err(incompatible(format!(
                    "it was created as {mode:?}",
                    mode = existing.mode
                )));
            }
            if fs_type.is_some() && existing.fs_type.is_some() && fs_type != existing.fs_type {
                return Err(incompatible(
                    "it was created for another filesystem type".to_string(),
                ));
            }
            if existing.encryption != req.encryption {
                return Err(incompatible(format!(
                    "it was created with encryption {}",
                    existing.encryption.map_or("none", |e| e.as_str())
                )));
            }
            return Ok(CreatedVolume { record: existing });
        }
        // A new filesystem volume is never smaller than mkfs accepts: the request is
        // raised to the minimum, or refused when its limit is below it, here and not
        // at every stage after. A copy keeps its source's filesystem and size.
        let capacity = match (&req.source, mode) {
            (None, VolumeMode::Filesystem) => {
                let fs = fs_type.unwrap_or_else(|| self.default_fs(&class));
                // An encrypted filesystem is on the mapping, the header's bytes less.
                let header = req.encryption.map_or(0, |_| crypt::HEADER_BYTES);
                req.capacity
                    .at_least(fs.min_bytes() + header, &format!("an {fs} filesystem"))?
            }
            _ => req.capacity,
        };
        let size_bytes = backend.size_for(&capacity)?;
        let spec = CreateSpec {
            token: req.token.clone(),
            name: req.name.clone(),
            size_bytes,
            mode,
            fs_type,
            claim: req.claim.clone(),
            encryption: req.encryption,
        };
        let record = match &req.source {
            Some(source) => self.create_copy(backend, spec, req, source).await?,
            None => backend.create(&spec).await?,
        };
        Ok(CreatedVolume { record })
    }

    /// Deletes the volume; an id that names nothing here is already deleted.
    pub async fn delete(&self, guard: &VolumeGuard, id: &VolumeId) -> Result<(), VolumeError> {
        guard_matches(guard, id);
        match self.backend_of(id) {
            Ok(backend) => backend.delete(&id.token).await?,
            Err(VolumeError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        // Gone: no path is its stage or publication any more.
        self.placed.forget(id).await;
        Ok(())
    }

    pub async fn expand(
        &self,
        guard: &VolumeGuard,
        req: &ControllerExpandRequest,
    ) -> Result<ExpandedVolume, VolumeError> {
        guard_matches(guard, &req.id);
        let (backend, record) = self.record(&req.id).await?;
        refuse_limit_below(&record, &req.capacity)?;
        let wanted = backend.size_for(&req.capacity)?;
        let size_bytes = match backend.expand(&req.id.token, wanted).await {
            Err(source @ BackendError::NoSpace { .. }) => {
                return Err(VolumeError::NoRoomToGrow {
                    id: req.id.clone(),
                    source,
                });
            }
            other => other?,
        };
        // A filesystem must be grown on the node; so must a loop device's view of its file.
        let node_expansion_required = record.mode == VolumeMode::Filesystem || backend.kind() == "loop";
        Ok(ExpandedVolume {
            size_bytes,
            node_expansion_required,
        })
    }

    /// Capacity of the class the parameters select, or zero for a topology that is not
    /// this node's.
    pub async fn capacity(
        &self,
        class: Option<&ClassName>,
        topology: Option<&Segments>,
    ) -> Result<ClassCapacity, VolumeError> {
        if let Some(segments) = topology
            && !self.serves_topology(std::slice::from_ref(segments))
        {
            return Ok(ClassCapacity::default());
        }
        let class = class.unwrap_or(&self.default_class);
        match self.served_backend(class) {
            Ok(backend) => Ok(backend.capacity().await?),
            // No storage, no capacity: the scheduler then places no claim of this class here.
            Err(VolumeError::StorageMissing { .. }) => Ok(ClassCapacity::default()),
            Err(e) => Err(e),
        }
    }

    /// Whether the volume can be used with every one of `capabilities`.
    pub async fn validate(&self, id: &VolumeId, capabilities: &[Capability]) -> Result<bool, VolumeError> {
        let record = self.get(id).await?;
        Ok(volume_mode(capabilities).is_ok_and(|(mode, fs)| {
            mode == record.mode && (fs.is_none() || record.fs_type.is_none() || fs == record.fs_type)
        }))
    }
}

/// Volumes never shrink: an expansion whose limit is below the size a volume has
/// cannot be met, on the controller or on the node.
pub(super) fn refuse_limit_below(record: &VolumeRecord, capacity: &CapacityRange) -> Result<(), VolumeError> {
    match capacity.limit {
        Some(limit) if record.size_bytes > limit => Err(ValidationError::OutOfRange(format!(
            "volume {} has {} bytes, above the limit of {limit}, and volumes never shrink",
            record.id, record.size_bytes
        ))
        .into()),
        _ => Ok(()),
    }
}

/// Encryption needs a class whose volumes can sit under dm-crypt.
fn refuse_encryption_on(backend: &Backend) -> Result<(), VolumeError> {
    match backend {
        Backend::Pmem(_) => Err(VolumeError::EncryptionUnsupported {
            class: backend.class().clone(),
            reason: "its volumes are PMEM namespaces for DAX, which dm-crypt cannot carry; \
                     use a pmem class in lvm mode, whose encrypted volumes are served without DAX",
        }),
        Backend::Loop(_) | Backend::Lvm(_) => Ok(()),
    }
}
