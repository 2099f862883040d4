//! Volume operations: the order of steps and their idempotency for every CSI call.
//!
//! Each operation takes a [`VolumeGuard`] as proof that the caller holds the volume's
//! lock, so neither gRPC handlers nor background work (reclaim, resize) can skip it.
//! Every step first looks at what is already true (records, the mount table, device
//! signatures) and does only what is missing: a repeated or retried call converges.

mod classes;
mod controller;
mod encryption;
mod grow;
mod node;
mod ownership;
mod placed;
mod publish;
mod snapshots;
mod stage_plan;
mod targets;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use classes::{MissingClass, OpenError};
pub use controller::{CreatedVolume, ExpandedVolume};
pub use node::{Usage, VolumeCondition, VolumeStats};

use crate::backend::{Backend, BackendError, Opener, VolumeRecord};
use crate::fs::{FsError, FsType};
use crate::host::{Host, SyscallError, io_is_terminal};
use crate::locks::VolumeGuard;
use crate::model::{AccessType, Capability, ClassName, SnapshotId, Token, VolumeId, VolumeMode};
use crate::model::{Terminal, ValidationError};
use crate::mount::MountError;

/// Topology key localvol reports: volumes are reachable from one node only.
pub const TOPOLOGY_KEY: &str = "topology.localvol.csi.dev/node";

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume {0} does not exist on this node")]
    NotFound(VolumeId),
    #[error("snapshot {0} does not exist on this node")]
    SnapshotNotFound(SnapshotId),
    #[error("device class {0} is not configured on this node")]
    UnknownClass(ClassName),
    #[error("device class {class} cannot take volumes on this node: its storage is missing ({reason})")]
    StorageMissing { class: ClassName, reason: String },
    #[error("a volume named {name:?} already exists and is incompatible: {reason}")]
    AlreadyExists { name: String, reason: String },
    #[error("{path} is already in use: {reason}", path = path.display())]
    PathInUse { path: PathBuf, reason: String },
    #[error("{path} holds {holder}, not this volume; refusing to touch it", path = path.display())]
    Occupied { path: PathBuf, holder: String },
    #[error("volume {id} is not mounted at {path}")]
    NotAtPath { id: VolumeId, path: String },
    #[error("volume {id} is not staged at {path}; NodeStageVolume must succeed first", path = path.display())]
    NotStaged { id: VolumeId, path: PathBuf },
    #[error("volume {id} is published at {path}, and its access mode allows only one", path = path.display())]
    SingleWriter { id: VolumeId, path: PathBuf },
    #[error("volume {id} is still mounted at {path}; unpublish it first", path = path.display())]
    StillPublished { id: VolumeId, path: PathBuf },
    #[error("{path} resolves through a symbolic link to {resolved}; refusing", path = path.display(), resolved = resolved.display())]
    Symlink { path: PathBuf, resolved: PathBuf },
    #[error("volume {id} was created for {created} access and cannot be used for {requested}")]
    AccessMismatch {
        id: VolumeId,
        created: &'static str,
        requested: &'static str,
    },
    #[error("device {device} holds {found}, not the requested {requested}; refusing to format over it", device = device.display())]
    WrongFilesystem {
        device: PathBuf,
        found: String,
        requested: FsType,
    },
    /// A volume made before CreateVolume kept to filesystem minimums (or made without a
    /// type and staged with one) that is smaller than mkfs makes that filesystem on.
    #[error(
        "volume {id} holds {size_bytes} bytes, and mkfs makes {fs_type} on no less than {min_bytes}: \
         expand its claim to at least that, or stage it as another filesystem"
    )]
    TooSmallForFilesystem {
        id: VolumeId,
        size_bytes: u64,
        fs_type: FsType,
        min_bytes: u64,
    },
    #[error(
        "volume {id} is encrypted and its node-stage secret has no {key:?}: set \
         csi.storage.k8s.io/node-stage-secret-name and -namespace in its StorageClass to a Secret with it",
        key = crate::request::SECRET_PASSPHRASE
    )]
    MissingPassphrase { id: VolumeId },
    #[error("device class {class} cannot encrypt volumes: {reason}")]
    EncryptionUnsupported { class: ClassName, reason: &'static str },
    #[error(
        "the source of a copy is {source_state}, and the copy is asked {copy_state}: a copy keeps its source's header, or lack of one"
    )]
    EncryptionMismatch {
        source_state: &'static str,
        copy_state: &'static str,
    },
    #[error(
        "volume {id} is encrypted, and its device {device} holds {found}, not a LUKS header; refusing to format over it",
        device = device.display()
    )]
    NotLuks {
        id: VolumeId,
        device: PathBuf,
        found: String,
    },
    #[error("volume {id}: {source}")]
    Crypt {
        id: VolumeId,
        #[source]
        source: crate::crypt::CryptError,
    },
    #[error(
        "no volume can be provisioned for the requested topology: this node serves only {TOPOLOGY_KEY}={node}"
    )]
    Topology { node: String },
    /// ControllerExpandVolume to a size the class cannot hold. Not NoSpace's
    /// RESOURCE_EXHAUSTED: CSI lists OUT_OF_RANGE for an unsupported expansion size, and
    /// csi-resizer retries RESOURCE_EXHAUSTED forever but ends OUT_OF_RANGE as infeasible.
    #[error("volume {id} cannot grow: {source}")]
    NoRoomToGrow {
        id: VolumeId,
        #[source]
        source: BackendError,
    },
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(transparent)]
    Syscall(#[from] SyscallError),
    #[error("{op} {path}: {source}", path = path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Terminal for VolumeError {
    fn is_terminal(&self) -> bool {
        match self {
            VolumeError::NotFound(_)
            | VolumeError::SnapshotNotFound(_)
            | VolumeError::UnknownClass(_)
            | VolumeError::AlreadyExists { .. }
            | VolumeError::PathInUse { .. }
            | VolumeError::Symlink { .. }
            | VolumeError::AccessMismatch { .. }
            | VolumeError::WrongFilesystem { .. }
            | VolumeError::Topology { .. }
            | VolumeError::NoRoomToGrow { .. }
            | VolumeError::EncryptionUnsupported { .. }
            | VolumeError::EncryptionMismatch { .. }
            | VolumeError::NotLuks { .. } => true,
            // The Secret, or the StorageClass naming it, can be fixed and kubelet retries.
            VolumeError::MissingPassphrase { .. } => false,
            VolumeError::Crypt { source, .. } => source.is_terminal(),
            VolumeError::Invalid(v) => v.is_terminal(),
            // Mount state that changes by itself: kubelet stages the volume again,
            // the other user goes away.
            VolumeError::NotStaged { .. }
            | VolumeError::NotAtPath { .. }
            | VolumeError::Occupied { .. }
            | VolumeError::SingleWriter { .. }
            | VolumeError::StillPublished { .. } => false,
            // An expansion of the claim makes room for the filesystem.
            VolumeError::TooSmallForFilesystem { .. } => false,
            // The storage may still appear (a disk attached late, a VG activated later).
            VolumeError::StorageMissing { .. } => false,
            VolumeError::Backend(b) => b.is_terminal(),
            VolumeError::Mount(m) => m.is_terminal(),
            VolumeError::Fs(f) => f.is_terminal(),
            VolumeError::Syscall(s) => s.is_terminal(),
            VolumeError::Io { source, .. } => io_is_terminal(source),
        }
    }
}

impl VolumeError {
    /// An encrypted volume that stage could not open: no passphrase, one that opens no
    /// keyslot, or a device without a LUKS header. The claim's owner must act.
    pub fn is_not_opened(&self) -> bool {
        matches!(
            self,
            VolumeError::MissingPassphrase { .. }
                | VolumeError::NotLuks { .. }
                | VolumeError::Crypt {
                    source: crate::crypt::CryptError::WrongPassphrase { .. },
                    ..
                }
        )
    }
}

fn io_error(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError {
    let path = path.to_path_buf();
    move |source| VolumeError::Io { op, path, source }
}

/// The device classes of this node and the operations on their volumes.
#[derive(Debug)]
pub struct Volumes {
    backends: BTreeMap<ClassName, classes::ClassSlot>,
    /// Opens the missing classes when their storage appears (none: nothing missing).
    opener: tokio::sync::Mutex<Option<Opener>>,
    default_class: ClassName,
    default_fs: BTreeMap<ClassName, FsType>,
    /// Mount options each class adds before the request's own.
    mount_options: BTreeMap<ClassName, Vec<String>>,
    /// The key derivation each class's new LUKS headers get (the default elsewhere).
    pbkdf: BTreeMap<ClassName, crate::crypt::Pbkdf>,
    host: Host,
    node_id: String,
    /// Where this daemon staged and published each volume (`placed::PlacedPaths`).
    placed: placed::PlacedPaths,
}

impl Volumes {
    /// `backends` must contain `default_class`, unless it is added as missing next.
    pub fn new(
        backends: Vec<Backend>,
        default_class: ClassName,
        default_fs: BTreeMap<ClassName, FsType>,
        host: Host,
        node_id: String,
    ) -> Self {
        let backends = backends
            .into_iter()
            .map(|b| (b.class().clone(), classes::ClassSlot::open(b)))
            .collect();
        Self {
            backends,
            opener: tokio::sync::Mutex::new(None),
            default_class,
            default_fs,
            mount_options: BTreeMap::new(),
            pbkdf: BTreeMap::new(),
            host,
            node_id,
            placed: placed::PlacedPaths::default(),
        }
    }

    /// The device classes' `mount-options`, applied before a request's mount flags
    /// (so a request can still override one, `atime` after a class's `noatime`).
    pub fn set_class_mount_options(&mut self, options: BTreeMap<ClassName, Vec<String>>) {
        self.mount_options = options;
    }

    /// The device classes' `luks` key derivation settings, for new LUKS2 headers.
    pub fn set_class_pbkdf(&mut self, pbkdf: BTreeMap<ClassName, crate::crypt::Pbkdf>) {
        self.pbkdf = pbkdf;
    }

    /// Keeps the record of where this daemon staged and published each volume in
    /// `dir`, and takes up the one an earlier daemon left there (`placed::PlacedPaths`).
    /// The daemon's alone: taking it up removes what a killed write left, which
    /// `localvol status`, opening the classes beside a running daemon, must never do.
    pub fn keep_placed_paths_in(&mut self, dir: PathBuf) -> Result<(), VolumeError> {
        self.placed = placed::PlacedPaths::load(dir)?;
        Ok(())
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The classes served now (those whose storage was found).
    pub fn backends(&self) -> impl Iterator<Item = &Backend> {
        self.backends.values().filter_map(classes::ClassSlot::backend)
    }

    pub fn topology(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(TOPOLOGY_KEY.to_string(), self.node_id.clone())])
    }

    /// The backend holding `id`: an id of an unconfigured class names no volume here;
    /// one of a class whose storage is missing may, once the storage is back.
    fn backend_of(&self, id: &VolumeId) -> Result<&Backend, VolumeError> {
        let slot = self
            .backends
            .get(&id.class)
            .ok_or_else(|| VolumeError::NotFound(id.clone()))?;
        slot.backend().ok_or_else(|| {
            VolumeError::Backend(BackendError::Unavailable {
                class: id.class.clone(),
                reason: slot.missing_reason().unwrap_or_default(),
            })
        })
    }

    async fn record(&self, id: &VolumeId) -> Result<(&Backend, VolumeRecord), VolumeError> {
        let backend = self.backend_of(id)?;
        let record = backend
            .get(&id.token)
            .await?
            .ok_or_else(|| VolumeError::NotFound(id.clone()))?;
        Ok((backend, record))
    }

    fn default_fs(&self, class: &ClassName) -> FsType {
        self.default_fs.get(class).copied().unwrap_or(FsType::Ext4)
    }

    /// Every volume of every class, ordered by id.
    pub async fn list(&self) -> Result<Vec<VolumeRecord>, VolumeError> {
        let mut all = Vec::new();
        for backend in self.backends() {
            all.extend(backend.list().await?);
        }
        all.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(all)
    }

    pub async fn get(&self, id: &VolumeId) -> Result<VolumeRecord, VolumeError> {
        Ok(self.record(id).await?.1)
    }

    /// Fails while any served class cannot serve volumes; a class whose storage was
    /// never found is not served, and does not count (see [`Volumes::missing_classes`]).
    pub async fn check_health(&self) -> Result<(), VolumeError> {
        for backend in self.backends() {
            backend.check_health().await?;
        }
        Ok(())
    }

    /// Looks a CreateVolume name up in every class (the token is unique per node).
    async fn find_token(&self, token: &Token) -> Result<Option<VolumeRecord>, VolumeError> {
        for backend in self.backends() {
            if let Some(record) = backend.get(token).await? {
                return Ok(Some(record));
            }
        }
        Ok(None)
    }
}

fn access_name(access: &AccessType) -> &'static str {
    if access.is_block() { "block" } else { "filesystem" }
}

/// The access a call asks for is the one the volume was created with (stage and publish).
fn check_access(record: &VolumeRecord, capability: &Capability) -> Result<(), VolumeError> {
    let created = match record.mode {
        VolumeMode::Block => "block",
        VolumeMode::Filesystem => "filesystem",
    };
    let requested = access_name(&capability.access);
    if created != requested {
        return Err(VolumeError::AccessMismatch {
            id: record.id.clone(),
            created,
            requested,
        });
    }
    Ok(())
}

/// Refuses a path that does not resolve to itself: a symlink anywhere along it could
/// redirect a mount or an unlink to a place kubelet never named.
async fn check_no_symlinks(path: &Path) -> Result<(), VolumeError> {
    let owned = path.to_path_buf();
    // One blocking step for the whole walk up (off a node call's thread, each is a
    // thread hand-off).
    crate::host::blocking::run(move || {
        let path = owned.as_path();
        let mut existing = path;
        loop {
            match std::fs::canonicalize(existing) {
                Ok(resolved) if resolved == existing => return Ok(()),
                Ok(resolved) => {
                    return Err(VolumeError::Symlink {
                        path: path.to_path_buf(),
                        resolved,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => match existing.parent() {
                    Some(parent) => existing = parent,
                    None => return Ok(()),
                },
                Err(e) => return Err(io_error("resolve", existing)(e)),
            }
        }
    })
    .await
    .map_err(|e| io_error("resolve", path)(std::io::Error::other(e)))?
}

/// The locked unit of work: ties a guard to the volume it proves.
fn guard_matches(guard: &VolumeGuard, id: &VolumeId) {
    debug_assert_eq!(
        guard.token(),
        &id.token,
        "operation runs under its own volume's lock"
    );
}

#[cfg(test)]
impl Volumes {
    /// The unit tests' usual node: one loop class `default` of 10 GiB in
    /// `dir/loop` (made here), on `host`, as node `node`.
    pub(crate) fn one_loop_class(dir: &Path, host: Host, node: &str) -> Self {
        let class = ClassName::parse("default").unwrap();
        let loop_dir = dir.join("loop");
        std::fs::create_dir_all(&loop_dir).unwrap();
        let backend = crate::backend::LoopBackend::new(class.clone(), loop_dir, 10 << 30, host.clone());
        Volumes::new(
            vec![Backend::Loop(backend)],
            class,
            BTreeMap::new(),
            host,
            node.to_string(),
        )
    }
}

#[cfg(test)]
mod tests;
