//! What the backends record and are asked for: volume and snapshot records, the specs
//! of a create, a snapshot and a copy, and what a class reports of its capacity.

use std::path::PathBuf;

use crate::fs::FsType;
use crate::fs::superblock::FsUuid;
use crate::model::{ClaimRef, Encryption, SnapshotId, Token, VolumeId, VolumeMode};

/// A volume as its backend records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRecord {
    pub id: VolumeId,
    /// The CreateVolume name.
    pub name: String,
    pub size_bytes: u64,
    pub mode: VolumeMode,
    pub fs_type: Option<FsType>,
    pub claim: ClaimRef,
    /// A copy made larger than its source (a restore or clone) that still holds the
    /// source's smaller filesystem: set with the copy, in the same commit that makes it
    /// a volume, and cleared by [`super::Backend::filesystem_grown`] once stage has grown
    /// the filesystem to the device. Never set on pmem: namespaces are never copies.
    pub filesystem_grow_pending: bool,
    /// LUKS2 under the volume's data: set at create, for the volume's whole life.
    pub encryption: Option<Encryption>,
}

/// What a backend's own mark says of a volume's filesystem. A kill mid-mkfs can leave a
/// half-written signature that blkid reports as a filesystem (or as something else), so
/// a format is marked begun before mkfs and finished after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatMark {
    /// Begun and never finished: the volume never held data and is formatted again.
    Unfinished,
    /// localvol's mkfs finished on it, of the type the record names if it names one.
    Finished,
    /// No mark that tells: only the device can say what it holds.
    Unknown,
    /// Begun with this filesystem UUID chosen for it, and finished exactly when the
    /// device's primary superblock is a finished one of that UUID (see
    /// [`crate::fs::superblock`]): the filesystem is its own mark, so nothing is written
    /// after mkfs. Only for unencrypted filesystem LVs.
    Pending(FsUuid),
}

/// A snapshot as its backend records it: found again after a restart from the storage
/// alone, like a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    pub id: SnapshotId,
    /// The CreateSnapshot name.
    pub name: String,
    /// The volume it was taken of (which may have been deleted since).
    pub source: VolumeId,
    /// The source volume's size when the snapshot was taken: a restore is at least this.
    pub size_bytes: u64,
    pub created: std::time::SystemTime,
    /// The source's mode and filesystem, so a restore knows what it holds.
    pub mode: VolumeMode,
    pub fs_type: Option<FsType>,
}

/// What CreateSnapshot asks a backend for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSpec {
    pub token: Token,
    pub name: String,
    pub source: Token,
    /// Where the source's filesystem is mounted (staged), to freeze around the copy;
    /// `None`: not mounted on this node, nothing writes through a filesystem.
    pub freeze: Option<PathBuf>,
}

/// Where a new volume's contents come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopySource {
    Snapshot(Token),
    /// A clone: the volume's token, and where it is mounted, to freeze as for a snapshot.
    Volume {
        token: Token,
        freeze: Option<PathBuf>,
    },
}

/// What CreateVolume asks a backend for, already sized and aligned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateSpec {
    pub token: Token,
    pub name: String,
    pub size_bytes: u64,
    pub mode: VolumeMode,
    pub fs_type: Option<FsType>,
    pub claim: ClaimRef,
    pub encryption: Option<Encryption>,
}

/// What is wrong under a volume, as its backend sees it without a command of its own
/// (for LVM, the cached report: see `lvm::health`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeHealth {
    Healthy,
    /// Nothing is wrong yet; the storage under it is filling up.
    Warning(String),
    /// The volume's storage has failed, or is about to refuse its writes.
    Abnormal(String),
}

/// The state of the storage under a whole device class (the VG, the thin pool, the
/// filesystem of a loop class's images), as its refresh finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageHealth {
    Healthy,
    /// Still serving, but a part of it failed or it is filling up: said, and the
    /// operator acts before it becomes critical.
    Degraded(String),
    /// Its volumes' writes fail or are about to, and it takes no new volume.
    Critical(String),
}

impl StorageHealth {
    /// The `status` label of `localvol_storage_health`.
    pub const STATUSES: [&'static str; 3] = ["healthy", "degraded", "critical"];

    pub fn status(&self) -> &'static str {
        match self {
            StorageHealth::Healthy => "healthy",
            StorageHealth::Degraded(_) => "degraded",
            StorageHealth::Critical(_) => "critical",
        }
    }

    pub fn reason(&self) -> Option<&str> {
        match self {
            StorageHealth::Healthy => None,
            StorageHealth::Degraded(why) | StorageHealth::Critical(why) => Some(why),
        }
    }
}

/// Space in a device class, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassCapacity {
    /// What a new volume can get now.
    pub available: u64,
    /// The class's whole size (for metrics).
    pub total: u64,
    /// The largest single volume the class can hold now.
    pub max_volume: u64,
}

/// The storage under a device class, as its own tools count it: the VG (kind `lvm`,
/// `pmem` in lvm mode), the thin pool (`lvm-thin`), the region (`pmem` direct), the
/// filesystem holding the loop files (`loop`). Classes sharing a VG report the same VG.
/// For metrics only; [`ClassCapacity`] is what provisioning decides by.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StoreUsage {
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    /// `lvm-thin`: how full the pool's data and metadata are.
    pub thin_pool: Option<ThinPoolFill>,
}

/// A thin pool's fill as lvm reports it, in percent (0-100).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThinPoolFill {
    pub data_percent: f64,
    pub metadata_percent: f64,
}
