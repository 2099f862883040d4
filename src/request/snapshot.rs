//! CreateSnapshot, ListSnapshots and CreateVolume's content source, validated.

use super::*;

/// An id of a source that localvol could not have made names nothing here: CSI's
/// "source does not exist", NOT_FOUND.
pub(super) fn content_source(raw: &csi::VolumeContentSource) -> Result<ContentSource, ValidationError> {
    use csi::volume_content_source::Type;
    match &raw.r#type {
        Some(Type::Snapshot(s)) => Ok(ContentSource::Snapshot(SnapshotId::parse(&s.snapshot_id)?)),
        Some(Type::Volume(v)) => Ok(ContentSource::Volume(VolumeId::parse(&v.volume_id)?)),
        None => Err(invalid(
            "volume_content_source",
            "names neither a snapshot nor a volume",
        )),
    }
}

/// A validated CreateSnapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRequest {
    pub name: String,
    pub token: Token,
    pub source: VolumeId,
}

impl TryFrom<&csi::CreateSnapshotRequest> for SnapshotRequest {
    type Error = ValidationError;

    fn try_from(req: &csi::CreateSnapshotRequest) -> Result<Self, Self::Error> {
        if req.name.is_empty() {
            return Err(ValidationError::Missing { field: "name" });
        }
        check_name("name", &req.name)?;
        if req.source_volume_id.is_empty() {
            return Err(ValidationError::Missing {
                field: "source_volume_id",
            });
        }
        check_map("parameters", &req.parameters)?;
        check_map("secrets", &req.secrets)?;
        if let Some(key) = req
            .parameters
            .keys()
            .find(|k| !k.starts_with("csi.storage.k8s.io/"))
        {
            return Err(invalid(
                "parameters",
                format!("unknown parameter {key:?} (snapshots take none)"),
            ));
        }
        Ok(Self {
            name: req.name.clone(),
            token: Token::for_name(&req.name),
            source: VolumeId::parse(&req.source_volume_id)?,
        })
    }
}

/// A validated ListSnapshots: paging and the two filters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListSnapshotsRequest {
    /// 0: no limit.
    pub max_entries: usize,
    pub starting_token: Option<String>,
    pub filter: SnapshotFilter,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotFilter {
    All,
    Snapshot(SnapshotId),
    Source(VolumeId),
    /// A filter that names no snapshot or volume localvol could have made: the answer is
    /// an empty list, as CSI asks for an unknown id.
    Nothing,
}

impl TryFrom<&csi::ListSnapshotsRequest> for ListSnapshotsRequest {
    type Error = ValidationError;

    fn try_from(req: &csi::ListSnapshotsRequest) -> Result<Self, Self::Error> {
        if req.max_entries < 0 {
            return Err(invalid("max_entries", "cannot be negative"));
        }
        let not_ours = |e: IdError| match e {
            IdError::NotOurs(_) => Ok(SnapshotFilter::Nothing),
            e => Err(ValidationError::Id(e)),
        };
        let filter = if !req.snapshot_id.is_empty() {
            SnapshotId::parse(&req.snapshot_id)
                .map_or_else(not_ours, |id| Ok(SnapshotFilter::Snapshot(id)))?
        } else if !req.source_volume_id.is_empty() {
            VolumeId::parse(&req.source_volume_id)
                .map_or_else(not_ours, |id| Ok(SnapshotFilter::Source(id)))?
        } else {
            SnapshotFilter::All
        };
        Ok(Self {
            max_entries: req.max_entries as usize,
            starting_token: (!req.starting_token.is_empty()).then(|| req.starting_token.clone()),
            filter,
        })
    }
}
