//! The gRPC edge: raw CSI requests become typed requests here, once. Everything below
//! this module works with values that are valid by construction.

use std::collections::{BTreeMap, HashMap};

use crate::crypt::Passphrase;
use crate::fs::FsType;
use crate::model::{
    AccessMode, AccessType, Capability, CapacityRange, ClaimRef, ClassName, Encryption, IdError,
    MAX_VOLUME_BYTES, SnapshotId, Token, ValidationError, VolumeId,
};
use crate::proto::csi::v1 as csi;

mod confine;
pub mod fuzz;
mod limits;
mod snapshot;

pub use confine::{HostPath, KubeletRoots};
pub use limits::{MAX_MAP_BYTES, MAX_STRING_BYTES};
use limits::{check_context, check_map, check_name};
use snapshot::content_source;
pub use snapshot::{ListSnapshotsRequest, SnapshotFilter, SnapshotRequest};

/// StorageClass parameter that selects a device class.
pub const PARAM_DEVICE_CLASS: &str = "localvol.csi.dev/device-class";
/// StorageClass parameter that asks for encryption at rest: `luks2`, the only value.
pub const PARAM_ENCRYPTION: &str = "localvol.csi.dev/encryption";
/// StorageClass parameter that lets discards through an encrypted volume's dm-crypt
/// mapping: `"true"` or `"false"` (the default), with [`PARAM_ENCRYPTION`] only.
pub const PARAM_ENCRYPTION_DISCARDS: &str = "localvol.csi.dev/encryption-discards";
/// The key of the node-stage Secret that holds an encrypted volume's passphrase.
pub const SECRET_PASSPHRASE: &str = "passphrase";
const MAX_PATH_LEN: usize = 4096;

fn invalid(field: &'static str, reason: impl Into<String>) -> ValidationError {
    ValidationError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// Converts a CSI capability. `Err` carries why it is unsupported.
pub fn capability(cap: &csi::VolumeCapability) -> Result<Capability, ValidationError> {
    use csi::volume_capability::AccessType as Raw;
    use csi::volume_capability::access_mode::Mode;
    let access = match &cap.access_type {
        Some(Raw::Block(_)) => AccessType::Block,
        Some(Raw::Mount(m)) => {
            let fs_type = match m.fs_type.as_str() {
                "" => None,
                name => Some(FsType::parse(name).ok_or_else(|| {
                    invalid(
                        "volume_capability.mount.fs_type",
                        format!("{name:?} is not supported (ext4, xfs)"),
                    )
                })?),
            };
            if !m.volume_mount_group.is_empty() {
                return Err(invalid(
                    "volume_capability.mount.volume_mount_group",
                    "not supported (no VOLUME_MOUNT_GROUP capability)",
                ));
            }
            crate::mount::MountOptions::parse(&m.mount_flags)
                .map_err(|e| invalid("volume_capability.mount.mount_flags", e.to_string()))?;
            AccessType::Mount {
                fs_type,
                mount_flags: m.mount_flags.clone(),
            }
        }
        None => {
            return Err(ValidationError::Missing {
                field: "volume_capability.access_type",
            });
        }
    };
    let mode = match cap.access_mode.as_ref().map(|m| m.mode()) {
        None | Some(Mode::Unknown) => {
            return Err(ValidationError::Missing {
                field: "volume_capability.access_mode",
            });
        }
        Some(Mode::SingleNodeWriter) => AccessMode::SingleNodeWriter,
        Some(Mode::SingleNodeReaderOnly) => AccessMode::SingleNodeReaderOnly,
        Some(Mode::SingleNodeSingleWriter) => AccessMode::SingleNodeSingleWriter,
        Some(Mode::SingleNodeMultiWriter) => AccessMode::SingleNodeMultiWriter,
        Some(other) => {
            return Err(invalid(
                "volume_capability.access_mode",
                format!(
                    "{} is not supported: localvol volumes live on one node",
                    other.as_str_name()
                ),
            ));
        }
    };
    Ok(Capability { access, mode })
}

fn required_capability(cap: Option<&csi::VolumeCapability>) -> Result<Capability, ValidationError> {
    capability(cap.ok_or(ValidationError::Missing {
        field: "volume_capability",
    })?)
}

fn volume_id(raw: &str) -> Result<VolumeId, ValidationError> {
    VolumeId::parse(raw).map_err(|e| match e {
        IdError::Empty => ValidationError::Missing { field: "volume_id" },
        other => ValidationError::Id(other),
    })
}

/// Converts a CSI capacity range into bytes, refusing negative, inverted and absurd ones.
pub fn capacity_range(range: Option<&csi::CapacityRange>) -> Result<CapacityRange, ValidationError> {
    let Some(range) = range else {
        return Ok(CapacityRange {
            required: 0,
            limit: None,
        });
    };
    let field = "capacity_range";
    if range.required_bytes < 0 || range.limit_bytes < 0 {
        return Err(invalid(field, "bytes cannot be negative"));
    }
    let required = range.required_bytes as u64;
    let limit = (range.limit_bytes > 0).then_some(range.limit_bytes as u64);
    if let Some(limit) = limit
        && limit < required
    {
        return Err(invalid(
            field,
            format!("limit {limit} is below required {required}"),
        ));
    }
    if required > MAX_VOLUME_BYTES {
        return Err(ValidationError::OutOfRange(format!(
            "{required} bytes is more than localvol's maximum of {MAX_VOLUME_BYTES}"
        )));
    }
    Ok(CapacityRange { required, limit })
}

/// Topology segments as the CO sends them.
pub type Segments = BTreeMap<String, String>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRequest {
    pub name: String,
    pub token: Token,
    pub capacity: CapacityRange,
    pub capabilities: Vec<Capability>,
    pub class: Option<ClassName>,
    pub claim: ClaimRef,
    /// Every topology the CO would accept (requisite, else preferred); empty: any.
    pub topologies: Vec<Segments>,
    /// What the new volume starts as: a snapshot's or another volume's contents.
    pub source: Option<ContentSource>,
    pub encryption: Option<Encryption>,
}

/// A CreateVolume `volume_content_source`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentSource {
    Snapshot(SnapshotId),
    Volume(VolumeId),
}

impl TryFrom<&csi::CreateVolumeRequest> for CreateRequest {
    type Error = ValidationError;

    fn try_from(req: &csi::CreateVolumeRequest) -> Result<Self, Self::Error> {
        if req.name.is_empty() {
            return Err(ValidationError::Missing { field: "name" });
        }
        check_name("name", &req.name)?;
        check_map("parameters", &req.parameters)?;
        check_map("secrets", &req.secrets)?;
        if req.volume_capabilities.is_empty() {
            return Err(ValidationError::Missing {
                field: "volume_capabilities",
            });
        }
        let capabilities = req
            .volume_capabilities
            .iter()
            .map(capability)
            .collect::<Result<Vec<_>, _>>()?;
        let source = req
            .volume_content_source
            .as_ref()
            .map(content_source)
            .transpose()?;
        let mut class = None;
        let (mut luks2, mut discards) = (false, None);
        for (key, value) in &req.parameters {
            match key.as_str() {
                PARAM_DEVICE_CLASS => {
                    class = Some(ClassName::parse(value).map_err(|r| invalid("parameters", r))?);
                }
                PARAM_ENCRYPTION if value == Encryption::LUKS2 => luks2 = true,
                PARAM_ENCRYPTION => {
                    return Err(invalid(
                        "parameters",
                        format!("{PARAM_ENCRYPTION} is {value:?}: the only encryption is \"luks2\""),
                    ));
                }
                PARAM_ENCRYPTION_DISCARDS => {
                    discards = Some(match value.as_str() {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(invalid(
                                "parameters",
                                format!(
                                    "{PARAM_ENCRYPTION_DISCARDS} is {value:?}, not \"true\" or \"false\""
                                ),
                            ));
                        }
                    });
                }
                k if k.starts_with("csi.storage.k8s.io/") => {}
                other => {
                    return Err(invalid(
                        "parameters",
                        format!(
                            "unknown parameter {other:?} (localvol knows {PARAM_DEVICE_CLASS}, \
                             {PARAM_ENCRYPTION} and {PARAM_ENCRYPTION_DISCARDS})"
                        ),
                    ));
                }
            }
        }
        let encryption = match (luks2, discards) {
            (true, discards) => Some(Encryption {
                allow_discards: discards.unwrap_or(false),
            }),
            (false, None) => None,
            (false, Some(_)) => {
                return Err(invalid(
                    "parameters",
                    format!("{PARAM_ENCRYPTION_DISCARDS} is set without {PARAM_ENCRYPTION}: luks2"),
                ));
            }
        };
        let topologies = req
            .accessibility_requirements
            .as_ref()
            .map(|t| {
                let list = if t.requisite.is_empty() {
                    &t.preferred
                } else {
                    &t.requisite
                };
                list.iter()
                    .map(|t| t.segments.clone().into_iter().collect())
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            name: req.name.clone(),
            token: Token::for_name(&req.name),
            capacity: capacity_range(req.capacity_range.as_ref())?,
            capabilities,
            class,
            claim: ClaimRef::from_context(&req.parameters),
            topologies,
            source,
            encryption,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerExpandRequest {
    pub id: VolumeId,
    pub capacity: CapacityRange,
    pub capability: Option<Capability>,
}

impl TryFrom<&csi::ControllerExpandVolumeRequest> for ControllerExpandRequest {
    type Error = ValidationError;

    fn try_from(req: &csi::ControllerExpandVolumeRequest) -> Result<Self, Self::Error> {
        let id = volume_id(&req.volume_id)?;
        let capacity = capacity_range(req.capacity_range.as_ref())?;
        if req.capacity_range.is_none() {
            return Err(ValidationError::Missing {
                field: "capacity_range",
            });
        }
        Ok(Self {
            id,
            capacity,
            capability: req.volume_capability.as_ref().map(capability).transpose()?,
        })
    }
}

/// What kubelet tells about the pod a volume is published for (`podInfoOnMount`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeContext {
    pub claim: ClaimRef,
    pub pod: Option<PodInfo>,
}

impl VolumeContext {
    pub fn parse(map: &HashMap<String, String>) -> Result<Self, ValidationError> {
        check_context(map)?;
        if map
            .get("csi.storage.k8s.io/ephemeral")
            .is_some_and(|v| v == "true")
        {
            return Err(invalid(
                "volume_context",
                "CSI inline ephemeral volumes are not supported; use a generic ephemeral volume",
            ));
        }
        let get = |k: &str| map.get(k).filter(|v| !v.is_empty()).cloned();
        let pod = match (
            get("csi.storage.k8s.io/pod.name"),
            get("csi.storage.k8s.io/pod.namespace"),
            get("csi.storage.k8s.io/pod.uid"),
        ) {
            (Some(name), Some(namespace), Some(uid)) => Some(PodInfo { name, namespace, uid }),
            _ => None,
        };
        Ok(Self {
            claim: ClaimRef::from_context(map),
            pod,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageRequest {
    pub id: VolumeId,
    pub staging_path: HostPath,
    pub capability: Capability,
    pub context: VolumeContext,
    /// The node-stage Secret's [`SECRET_PASSPHRASE`], when it has one: an encrypted
    /// volume is refused without it, any other volume ignores it.
    pub passphrase: Option<Passphrase>,
}

impl StageRequest {
    pub fn parse(req: &csi::NodeStageVolumeRequest, roots: &KubeletRoots) -> Result<Self, ValidationError> {
        // Arguments first, existence second: a missing argument is INVALID_ARGUMENT even
        // for an id that is not ours.
        let staging_path = HostPath::confined("staging_target_path", &req.staging_target_path, roots)?;
        let capability = required_capability(req.volume_capability.as_ref())?;
        let context = VolumeContext::parse(&req.volume_context)?;
        check_map("publish_context", &req.publish_context)?;
        check_map("secrets", &req.secrets)?;
        Ok(Self {
            id: volume_id(&req.volume_id)?,
            staging_path,
            capability,
            context,
            passphrase: req
                .secrets
                .get(SECRET_PASSPHRASE)
                .and_then(|p| Passphrase::new(p.as_bytes())),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnstageRequest {
    pub id: VolumeId,
    pub staging_path: HostPath,
}

impl UnstageRequest {
    pub fn parse(req: &csi::NodeUnstageVolumeRequest, roots: &KubeletRoots) -> Result<Self, ValidationError> {
        let staging_path = HostPath::confined("staging_target_path", &req.staging_target_path, roots)?;
        Ok(Self {
            id: volume_id(&req.volume_id)?,
            staging_path,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishRequest {
    pub id: VolumeId,
    pub staging_path: HostPath,
    pub target_path: HostPath,
    pub capability: Capability,
    pub read_only: bool,
    pub context: VolumeContext,
}

impl PublishRequest {
    pub fn parse(req: &csi::NodePublishVolumeRequest, roots: &KubeletRoots) -> Result<Self, ValidationError> {
        let target_path = HostPath::confined("target_path", &req.target_path, roots)?;
        let staging_path = HostPath::confined("staging_target_path", &req.staging_target_path, roots)?;
        let capability = required_capability(req.volume_capability.as_ref())?;
        let context = VolumeContext::parse(&req.volume_context)?;
        check_map("publish_context", &req.publish_context)?;
        check_map("secrets", &req.secrets)?;
        Ok(Self {
            id: volume_id(&req.volume_id)?,
            target_path,
            staging_path,
            read_only: req.readonly || capability.mode.is_read_only(),
            capability,
            context,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnpublishRequest {
    pub id: VolumeId,
    pub target_path: HostPath,
}

impl UnpublishRequest {
    pub fn parse(
        req: &csi::NodeUnpublishVolumeRequest,
        roots: &KubeletRoots,
    ) -> Result<Self, ValidationError> {
        let target_path = HostPath::confined("target_path", &req.target_path, roots)?;
        Ok(Self {
            id: volume_id(&req.volume_id)?,
            target_path,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsRequest {
    pub id: VolumeId,
    /// `None` for a path that cannot hold the volume (relative, malformed, outside the
    /// roots): the volume is not found there, as CSI asks, rather than an argument error.
    pub volume_path: Option<HostPath>,
}

impl StatsRequest {
    pub fn parse(
        req: &csi::NodeGetVolumeStatsRequest,
        roots: &KubeletRoots,
    ) -> Result<Self, ValidationError> {
        // A missing argument is reported before whether the volume exists.
        if req.volume_id.is_empty() {
            return Err(ValidationError::Missing { field: "volume_id" });
        }
        if req.volume_path.is_empty() {
            return Err(ValidationError::Missing { field: "volume_path" });
        }
        Ok(Self {
            id: volume_id(&req.volume_id)?,
            volume_path: HostPath::confined("volume_path", &req.volume_path, roots).ok(),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeExpandRequest {
    pub id: VolumeId,
    /// `None` outside the roots: the volume is not found there (lexically malformed
    /// paths are still argument errors).
    pub volume_path: Option<HostPath>,
    pub staging_path: Option<HostPath>,
    pub capacity: CapacityRange,
    pub capability: Option<Capability>,
}

impl NodeExpandRequest {
    pub fn parse(req: &csi::NodeExpandVolumeRequest, roots: &KubeletRoots) -> Result<Self, ValidationError> {
        let id = volume_id(&req.volume_id)?;
        check_map("secrets", &req.secrets)?;
        Ok(Self {
            id,
            volume_path: Some(HostPath::parse("volume_path", &req.volume_path)?)
                .filter(|p| roots.root_of(p.as_path()).is_some()),
            staging_path: match req.staging_target_path.as_str() {
                "" => None,
                raw => Some(HostPath::confined("staging_target_path", raw, roots)?),
            },

            capacity: capacity_range(req.capacity_range.as_ref())?,
            capability: req.volume_capability.as_ref().map(capability).transpose()?,
        })
    }
}

#[cfg(test)]
mod tests;
