//! Backends: where a device class's volumes live. A closed set, dispatched by `match`.
//!
//! Each backend keeps its own record of its volumes in the storage itself (a metadata
//! file beside a loop file, tags on an LV, the name of a namespace), so a node can list
//! its volumes after a restart, or a crash, without any other state.

pub mod loopdev;

use std::path::PathBuf;

use crate::fs::{FormatOptions, FsType};
use crate::host::{CommandError, SyscallError};
use crate::model::{ClassName, Token, VolumeId, VolumeMode};
use crate::request::ClaimRef;

pub use loopdev::LoopBackend;

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
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(transparent)]
    Syscall(#[from] SyscallError),
}

impl BackendError {
    pub fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| BackendError::Io { op, path, source }
    }
}

/// One device class's storage.
#[derive(Debug)]
pub enum Backend {
    Loop(LoopBackend),
}

impl Backend {
    pub fn class(&self) -> &ClassName {
        match self {
            Backend::Loop(b) => b.class(),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Backend::Loop(_) => "loop",
        }
    }

    /// Makes what the class needs on the machine (the loop directory); idempotent.
    pub async fn prepare(&self) -> Result<(), BackendError> {
        match self {
            Backend::Loop(b) => b.prepare().await,
        }
    }

    /// Sizes are rounded up to a multiple of this.
    pub fn alignment(&self) -> u64 {
        match self {
            Backend::Loop(_) => loopdev::ALIGNMENT,
        }
    }

    /// mkfs options for this class's volumes.
    pub fn format_options(&self) -> FormatOptions {
        match self {
            Backend::Loop(_) => FormatOptions::default(),
        }
    }

    /// Filesystem-specific mount options the class always adds (`dax` on PMEM).
    pub fn mount_data(&self) -> &'static [&'static str] {
        match self {
            Backend::Loop(_) => &[],
        }
    }

    pub async fn create(&self, spec: &CreateSpec) -> Result<VolumeRecord, BackendError> {
        match self {
            Backend::Loop(b) => b.create(spec).await,
        }
    }

    pub async fn get(&self, token: &Token) -> Result<Option<VolumeRecord>, BackendError> {
        match self {
            Backend::Loop(b) => b.get(token).await,
        }
    }

    pub async fn list(&self) -> Result<Vec<VolumeRecord>, BackendError> {
        match self {
            Backend::Loop(b) => b.list().await,
        }
    }

    /// Removes the volume; a volume that does not exist is already deleted.
    pub async fn delete(&self, token: &Token) -> Result<(), BackendError> {
        match self {
            Backend::Loop(b) => b.delete(token).await,
        }
    }

    /// Grows the backing store to at least `size_bytes`; never shrinks. Returns the size.
    pub async fn expand(&self, token: &Token, size_bytes: u64) -> Result<u64, BackendError> {
        match self {
            Backend::Loop(b) => b.expand(token, size_bytes).await,
        }
    }

    pub async fn capacity(&self) -> Result<ClassCapacity, BackendError> {
        match self {
            Backend::Loop(b) => b.capacity().await,
        }
    }

    /// Makes the volume's block device available on this node; idempotent.
    pub async fn attach(&self, token: &Token) -> Result<PathBuf, BackendError> {
        match self {
            Backend::Loop(b) => b.attach(token).await,
        }
    }

    /// The volume's block device if it is available now.
    pub async fn device(&self, token: &Token) -> Result<Option<PathBuf>, BackendError> {
        match self {
            Backend::Loop(b) => b.device(token).await,
        }
    }

    /// Undoes [`Backend::attach`]; idempotent.
    pub async fn detach(&self, token: &Token) -> Result<(), BackendError> {
        match self {
            Backend::Loop(b) => b.detach(token).await,
        }
    }

    /// Makes an attached device see a grown backing store.
    pub async fn refresh_device(&self, token: &Token) -> Result<(), BackendError> {
        match self {
            Backend::Loop(b) => b.refresh_device(token).await,
        }
    }

    /// Fails while the class cannot serve volumes (directory gone, VG missing...).
    pub async fn check_health(&self) -> Result<(), BackendError> {
        match self {
            Backend::Loop(b) => b.check_health().await,
        }
    }
}
