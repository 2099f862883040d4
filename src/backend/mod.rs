//! Backends: where a device class's volumes live. A closed set, dispatched by `match`.
//!
//! Each backend keeps its own record of its volumes in the storage itself (a metadata
//! file beside a loop file, tags on an LV, the name of a namespace), so a node can list
//! its volumes after a restart, or a crash, without any other state.

pub mod cache;
mod files;
pub mod loopdev;
pub mod lvm;
mod open;
pub mod pmem;
mod records;
mod terminal;

use std::path::{Path, PathBuf};

use crate::fs::FormatOptions;
use crate::host::{CommandError, SyscallError};
use crate::model::{CapacityRange, ValidationError};
use crate::model::{ClassName, Token};

pub use loopdev::LoopBackend;
pub use lvm::{LvmBackend, LvmError};
pub use open::Opener;
pub use pmem::{PmemBackend, PmemError};
pub use records::{
    ClassCapacity, CopySource, CreateSpec, FormatMark, SnapshotRecord, SnapshotSpec, StorageHealth,
    StoreUsage, ThinPoolFill, VolumeHealth, VolumeRecord,
};

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("device class {class} has {available} bytes free, {requested} requested")]
    NoSpace {
        class: ClassName,
        requested: u64,
        available: u64,
    },
    #[error("volume {token} does not exist in device class {class}")]
    NotFound { class: ClassName, token: Token },
    #[error("volume {token} is in use ({by}); unstage it first")]
    InUse { token: Token, by: String },
    #[error("device class {class} is unusable: {reason}")]
    Unavailable { class: ClassName, reason: String },
    #[error("volume {token}: record {path} is unreadable: {reason}", path = path.display())]
    CorruptRecord {
        token: String,
        path: PathBuf,
        reason: String,
    },
    #[error("{op} {path}: {source}", path = path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Snapshots and clones on a kind that does not make them, by design (see
    /// docs/backends.md): never a silent full copy.
    #[error("device class {class} (kind {kind}) does not make snapshots or clones: {reason}")]
    SnapshotsUnsupported {
        class: ClassName,
        kind: &'static str,
        reason: &'static str,
    },
    #[error("snapshot {token} does not exist in device class {class}")]
    SnapshotNotFound { class: ClassName, token: Token },
    #[error(transparent)]
    Lvm(#[from] LvmError),
    #[error(transparent)]
    Pmem(#[from] PmemError),
    #[error(transparent)]
    Command(#[from] CommandError),
    /// mkfs at create (a loop volume whose filesystem type the request names).
    #[error(transparent)]
    Fs(#[from] crate::fs::FsError),
    #[error(transparent)]
    Syscall(#[from] SyscallError),
}

impl BackendError {
    /// The class's storage is not on this node (volume group, thin pool, PMEM region):
    /// a fact of this node, not a fault of the daemon's.
    pub fn is_storage_missing(&self) -> bool {
        matches!(
            self,
            BackendError::Lvm(LvmError::VgNotFound { .. } | LvmError::PoolNotFound { .. })
                | BackendError::Pmem(PmemError::RegionNotFound { .. })
        )
    }

    pub fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| BackendError::Io { op, path, source }
    }
}

/// One device class's storage.
#[derive(Debug)]
pub enum Backend {
    Loop(LoopBackend),
    /// Kinds `lvm`, `lvm-thin`, and `pmem` in lvm mode.
    Lvm(LvmBackend),
    /// Kind `pmem` in direct mode.
    Pmem(PmemBackend),
}

/// Filesystem mount data every DAX-capable class adds.
const DAX: &[&str] = &["dax"];

impl Backend {
    pub fn class(&self) -> &ClassName {
        match self {
            Backend::Loop(b) => b.class(),
            Backend::Lvm(b) => b.class(),
            Backend::Pmem(b) => b.class(),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Backend::Loop(_) => "loop",
            Backend::Lvm(b) => b.kind(),
            Backend::Pmem(_) => "pmem",
        }
    }

    /// Sizes are rounded up to a multiple of this.
    pub fn alignment(&self) -> u64 {
        match self {
            Backend::Loop(_) => loopdev::ALIGNMENT,
            Backend::Lvm(b) => b.alignment(),
            Backend::Pmem(b) => b.alignment(),
        }
    }

    /// The size a volume gets for `capacity`: at least `required`, within the limit.
    pub fn size_for(&self, capacity: &CapacityRange) -> Result<u64, ValidationError> {
        match self {
            // A namespace loses a metadata reserve: sized by its usable bytes.
            Backend::Pmem(b) => b.size_for(capacity),
            Backend::Loop(_) | Backend::Lvm(_) => capacity.size_for(self.alignment()),
        }
    }

    /// mkfs options for `token`'s volume, as its device is now.
    pub async fn format_options(&self, token: &Token) -> Result<FormatOptions, BackendError> {
        Ok(match self {
            Backend::Loop(_) => FormatOptions::default(),
            Backend::Lvm(b) => b.format_options(token).await?,
            Backend::Pmem(_) => FormatOptions {
                dax: true,
                ..Default::default()
            },
        })
    }

    /// Filesystem-specific mount options the class always adds (`dax` on PMEM).
    pub fn mount_data(&self) -> &'static [&'static str] {
        match self {
            Backend::Loop(_) => &[],
            Backend::Lvm(b) if b.dax() => DAX,
            Backend::Lvm(_) => &[],
            Backend::Pmem(_) => DAX,
        }
    }

    pub async fn create(&self, spec: &CreateSpec) -> Result<VolumeRecord, BackendError> {
        match self {
            Backend::Loop(b) => b.create(spec).await,
            Backend::Lvm(b) => b.create(spec).await,
            Backend::Pmem(b) => b.create(spec).await,
        }
    }

    pub async fn get(&self, token: &Token) -> Result<Option<VolumeRecord>, BackendError> {
        match self {
            Backend::Loop(b) => b.get(token).await,
            Backend::Lvm(b) => b.get(token).await,
            Backend::Pmem(b) => b.get(token).await,
        }
    }

    pub async fn list(&self) -> Result<Vec<VolumeRecord>, BackendError> {
        match self {
            Backend::Loop(b) => b.list().await,
            Backend::Lvm(b) => b.list().await,
            Backend::Pmem(b) => b.list().await,
        }
    }

    /// Removes the volume; a volume that does not exist is already deleted.
    pub async fn delete(&self, token: &Token) -> Result<(), BackendError> {
        match self {
            Backend::Loop(b) => b.delete(token).await,
            Backend::Lvm(b) => b.delete(token).await,
            Backend::Pmem(b) => b.delete(token).await,
        }
    }

    /// Grows the backing store to at least `size_bytes`; never shrinks. Returns the size.
    pub async fn expand(&self, token: &Token, size_bytes: u64) -> Result<u64, BackendError> {
        match self {
            Backend::Loop(b) => b.expand(token, size_bytes).await,
            Backend::Lvm(b) => b.expand(token, size_bytes).await,
            Backend::Pmem(b) => b.expand(token, size_bytes).await,
        }
    }

    pub async fn capacity(&self) -> Result<ClassCapacity, BackendError> {
        match self {
            Backend::Loop(b) => b.capacity().await,
            Backend::Lvm(b) => b.capacity().await,
            Backend::Pmem(b) => b.capacity().await,
        }
    }

    /// The class's capacity and the state of its storage as a whole, from one look at
    /// it (a loop class counts its images once for both).
    pub async fn capacity_and_health(&self) -> Result<(ClassCapacity, StorageHealth), BackendError> {
        match self {
            Backend::Loop(b) => b.capacity_and_health().await,
            Backend::Lvm(b) => Ok((b.capacity().await?, b.storage_health().await?)),
            Backend::Pmem(b) => Ok((b.capacity().await?, b.storage_health().await?)),
        }
    }

    /// What the class's storage holds now (see [`StoreUsage`]); `None` when its tools do
    /// not say (an inactive thin pool reports no fill).
    pub async fn store_usage(&self) -> Result<Option<StoreUsage>, BackendError> {
        match self {
            Backend::Loop(b) => b.store_usage().await.map(Some),
            Backend::Lvm(b) => b.store_usage().await,
            // The region as the capacity reports it: its size, and what new namespaces
            // could still take (after ndctl's per-namespace metadata reserve).
            Backend::Pmem(b) => {
                let capacity = b.capacity().await?;
                Ok(Some(StoreUsage {
                    size_bytes: capacity.total,
                    used_bytes: capacity.total.saturating_sub(capacity.available),
                    free_bytes: capacity.available,
                    thin_pool: None,
                }))
            }
        }
    }

    /// Makes the volume's block device available on this node; idempotent.
    pub async fn attach(&self, token: &Token) -> Result<PathBuf, BackendError> {
        match self {
            Backend::Loop(b) => b.attach(token).await,
            Backend::Lvm(b) => b.attach(token).await,
            Backend::Pmem(b) => b.attach(token).await,
        }
    }

    /// [`Backend::attach`] for a volume whose record exists and which its caller, holding
    /// the volume's lock, has just found on no device ([`Backend::holding_device`] was
    /// `None`): the loop backend does not look for its device again (a list of every
    /// loop device of the node). The others are [`Backend::attach`], which is one call
    /// to the tool either way.
    pub async fn attach_unheld(&self, token: &Token) -> Result<PathBuf, BackendError> {
        match self {
            Backend::Loop(b) => b.attach_unheld(token).await,
            Backend::Lvm(b) => b.attach(token).await,
            Backend::Pmem(b) => b.attach(token).await,
        }
    }

    /// What is wrong under a staged volume whose device [`Backend::device`] found just
    /// now (`device`: its node and device number), or found gone (`None`): for LVM, the
    /// LV and its thin pool in the cached report; for a loop file, its image on its
    /// device and the disk under it, or why no device holds it; for a PMEM namespace,
    /// the media errors the kernel knows of.
    pub async fn volume_health(
        &self,
        record: &VolumeRecord,
        device: Option<(&Path, u64)>,
    ) -> Result<VolumeHealth, BackendError> {
        match self {
            Backend::Lvm(b) => b.volume_health(&record.id.token).await,
            Backend::Loop(b) => b.volume_health(record, device.is_some()).await,
            Backend::Pmem(b) => {
                b.volume_health(&record.id.token, device.map(|(_, dev)| dev))
                    .await
            }
        }
    }

    /// The volume's block device if it is available now.
    pub async fn device(&self, token: &Token) -> Result<Option<PathBuf>, BackendError> {
        match self {
            Backend::Loop(b) => b.device(token).await,
            Backend::Lvm(b) => b.device(token).await,
            Backend::Pmem(b) => b.device(token).await,
        }
    }

    /// The device that holds the volume's data, to recognise its mounts: as
    /// [`Backend::device`], and for loop files also a device whose image was deleted under
    /// it (its mounts are still this volume's and must still be cleaned up).
    pub async fn holding_device(&self, token: &Token) -> Result<Option<PathBuf>, BackendError> {
        match self {
            Backend::Loop(b) => b.holding_device(token).await,
            Backend::Lvm(b) => b.device(token).await,
            Backend::Pmem(b) => b.device(token).await,
        }
    }

    /// Undoes [`Backend::attach`]; idempotent.
    pub async fn detach(&self, token: &Token) -> Result<(), BackendError> {
        match self {
            Backend::Loop(b) => b.detach(token).await,
            Backend::Lvm(b) => b.detach(token).await,
            Backend::Pmem(b) => b.detach(token).await,
        }
    }

    /// Makes an attached device see a grown backing store.
    pub async fn refresh_device(&self, token: &Token) -> Result<(), BackendError> {
        match self {
            Backend::Loop(b) => b.refresh_device(token).await,
            Backend::Lvm(b) => b.refresh_device(token).await,
            Backend::Pmem(b) => b.refresh_device(token).await,
        }
    }

    /// Bytes the volume takes from the device class's storage now, where the backend can
    /// tell (a loop image's allocated blocks). `None` where that does not shrink when the
    /// filesystem discards (thick LVs, PMEM namespaces): reclaim then reports the
    /// filesystem's own usage instead. For a thin LV: what it has mapped in its pool.
    pub async fn allocated_bytes(&self, token: &Token) -> Result<Option<u64>, BackendError> {
        match self {
            Backend::Loop(b) => b.allocated_bytes(token).await.map(Some),
            Backend::Lvm(b) => b.allocated_bytes(token).await,
            Backend::Pmem(_) => Ok(None),
        }
    }

    /// What the backend's own mark says of the volume's filesystem (see [`FormatMark`]).
    /// Loop records tell a finished format apart; an LV's mark leaves that to the
    /// superblock ([`FormatMark::Pending`]); a namespace's says only whether one was
    /// left unfinished.
    pub async fn format_mark(&self, token: &Token) -> Result<FormatMark, BackendError> {
        match self {
            Backend::Loop(b) => b.format_mark(token).await,
            Backend::Lvm(b) => b.format_mark(token).await,
            Backend::Pmem(b) => b.format_unfinished(token).await.map(|unfinished| {
                if unfinished {
                    FormatMark::Unfinished
                } else {
                    FormatMark::Unknown
                }
            }),
        }
    }

    /// Records, durably, that a format of the volume is about to begin; called before
    /// mkfs, so that a kill anywhere in mkfs leaves [`Backend::format_unfinished`] true.
    pub async fn begin_format(&self, token: &Token) -> Result<(), BackendError> {
        match self {
            Backend::Loop(b) => b.begin_format(token).await,
            Backend::Lvm(b) => b.begin_format(token).await,
            Backend::Pmem(b) => b.begin_format(token).await,
        }
    }

    /// Records that the volume's filesystem was made completely.
    pub async fn mark_formatted(&self, token: &Token) -> Result<(), BackendError> {
        match self {
            Backend::Loop(b) => b.mark_formatted(token).await,
            Backend::Lvm(b) => b.mark_formatted(token).await,
            Backend::Pmem(b) => b.mark_formatted(token).await,
        }
    }

    /// Clears [`VolumeRecord::filesystem_grow_pending`]; idempotent.
    pub async fn filesystem_grown(&self, token: &Token) -> Result<(), BackendError> {
        match self {
            Backend::Loop(b) => b.filesystem_grown(token).await,
            Backend::Lvm(b) => b.filesystem_grown(token).await,
            Backend::Pmem(_) => Ok(()),
        }
    }

    fn snapshots_unsupported(&self) -> BackendError {
        let reason = match self {
            Backend::Loop(_) => "",
            Backend::Lvm(b) if b.snapshots() => "",
            Backend::Lvm(_) => "a thick LV can only be copied in full; use an lvm-thin class",
            Backend::Pmem(_) => "a namespace can only be copied in full; no snapshot shares its blocks",
        };
        BackendError::SnapshotsUnsupported {
            class: self.class().clone(),
            kind: self.kind(),
            reason,
        }
    }

    /// Whether the class makes snapshots and clones.
    pub fn snapshots(&self) -> bool {
        match self {
            Backend::Loop(_) => true,
            Backend::Lvm(b) => b.snapshots(),
            Backend::Pmem(_) => false,
        }
    }

    /// Takes a snapshot of a volume; an existing snapshot of that token is returned as is.
    pub async fn create_snapshot(&self, spec: &SnapshotSpec) -> Result<SnapshotRecord, BackendError> {
        match self {
            Backend::Loop(b) => b.create_snapshot(spec).await,
            Backend::Lvm(b) if b.snapshots() => b.create_snapshot(spec).await,
            Backend::Lvm(_) | Backend::Pmem(_) => Err(self.snapshots_unsupported()),
        }
    }

    pub async fn get_snapshot(&self, token: &Token) -> Result<Option<SnapshotRecord>, BackendError> {
        match self {
            Backend::Loop(b) => b.get_snapshot(token).await,
            Backend::Lvm(b) if b.snapshots() => b.get_snapshot(token).await,
            Backend::Lvm(_) | Backend::Pmem(_) => Ok(None),
        }
    }

    pub async fn list_snapshots(&self) -> Result<Vec<SnapshotRecord>, BackendError> {
        match self {
            Backend::Loop(b) => b.list_snapshots().await,
            Backend::Lvm(b) if b.snapshots() => b.list_snapshots().await,
            Backend::Lvm(_) | Backend::Pmem(_) => Ok(Vec::new()),
        }
    }

    /// Removes the snapshot; one that does not exist is already deleted.
    pub async fn delete_snapshot(&self, token: &Token) -> Result<(), BackendError> {
        match self {
            Backend::Loop(b) => b.delete_snapshot(token).await,
            Backend::Lvm(b) if b.snapshots() => b.delete_snapshot(token).await,
            Backend::Lvm(_) | Backend::Pmem(_) => Ok(()),
        }
    }

    /// Creates a volume holding a copy of a snapshot or a volume, grown to the spec's
    /// size. A filesystem copy made larger than its source is marked
    /// [`VolumeRecord::filesystem_grow_pending`] in the same commit.
    pub async fn create_from(
        &self,
        spec: &CreateSpec,
        source: &CopySource,
    ) -> Result<VolumeRecord, BackendError> {
        match self {
            Backend::Loop(b) => b.create_from(spec, source).await,
            Backend::Lvm(b) if b.snapshots() => b.create_from(spec, source).await,
            Backend::Lvm(_) | Backend::Pmem(_) => Err(self.snapshots_unsupported()),
        }
    }

    /// Fails while the class cannot serve volumes (directory gone, VG missing...).
    pub async fn check_health(&self) -> Result<(), BackendError> {
        match self {
            Backend::Loop(b) => b.check_health().await,
            Backend::Lvm(b) => b.check_health().await,
            Backend::Pmem(b) => b.check_health().await,
        }
    }
}
