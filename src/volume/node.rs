//! Node operations: stage, publish, unpublish, unstage, expand, stats.

use std::path::{Path, PathBuf};

use tracing::{info, warn};

use super::{VolumeError, Volumes, check_no_symlinks, guard_matches, io_error};
use crate::backend::{Backend, VolumeRecord};
use crate::fs::{self, Signature};
use crate::locks::VolumeGuard;
use crate::model::{AccessMode, AccessType, Capability, VolumeId, VolumeMode};
use crate::mount::{self, MountEntry, MountOptions, MountTable};
use crate::request::{
    NodeExpandRequest, PublishRequest, StageRequest, StatsRequest, UnpublishRequest, UnstageRequest,
};

/// Whether a volume is healthy, for NodeGetVolumeStats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeCondition {
    pub abnormal: bool,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeStats {
    Filesystem {
        usage: crate::host::FsUsage,
        condition: VolumeCondition,
    },
    Block {
        size_bytes: u64,
        condition: VolumeCondition,
    },
    /// The path exists but the volume is no longer mounted there.
    Unmounted { condition: VolumeCondition },
}

fn access_name(access: &AccessType) -> &'static str {
    if access.is_block() { "block" } else { "filesystem" }
}

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

/// The device number of a block device path (following /dev/VG/LV-style symlinks).
async fn device_number(volumes: &Volumes, device: &Path) -> Result<u64, VolumeError> {
    volumes
        .host
        .syscalls
        .device_number(device)
        .await?
        .ok_or_else(|| VolumeError::PathInUse {
            path: device.to_path_buf(),
            reason: "not a device node".to_string(),
        })
}

/// Where a raw block volume's device node appears in the mount table when bind-mounted:
/// devtmpfs, with the device's name below /dev as the mount root.
async fn devtmpfs_root(device: &Path) -> Result<PathBuf, VolumeError> {
    let real = match tokio::fs::canonicalize(device).await {
        Ok(real) => real,
        // A device node that vanished can still be named in the mount table as it was.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => device.to_path_buf(),
        Err(e) => return Err(io_error("resolve", device)(e)),
    };
    Ok(Path::new("/").join(real.strip_prefix("/dev").unwrap_or(&real)))
}

impl Volumes {
    pub async fn stage(&self, guard: &VolumeGuard, req: &StageRequest) -> Result<(), VolumeError> {
        guard_matches(guard, &req.id);
        let (backend, record) = self.record(&req.id).await?;
        check_access(&record, &req.capability)?;
        let staging = req.staging_path.as_path();
        check_no_symlinks(staging).await?;
        let device = backend.attach(&req.id.token).await?;
        let AccessType::Mount { fs_type, mount_flags } = &req.capability.access else {
            // Raw block: attaching is all staging means; publish binds the device node.
            return Ok(());
        };
        let wanted_dev = device_number(self, &device).await?;
        let table = MountTable::read(&self.host).await?;
        if let Some(existing) = table.at(staging) {
            if existing.device_number() == wanted_dev {
                info!(volume.id = %req.id, path = %staging.display(), "already staged");
                return Ok(());
            }
            return Err(VolumeError::PathInUse {
                path: staging.to_path_buf(),
                reason: format!("{} is mounted there", existing.source),
            });
        }
        let fs_type = fs_type
            .or(record.fs_type)
            .unwrap_or_else(|| self.default_fs(&req.id.class));
        // A volume whose format mark says no mkfs has finished on it (new, or killed
        // mid-mkfs, which can leave a valid-looking but broken signature) never held
        // data: it is formatted without asking blkid. Any other volume is formatted only
        // if blkid finds no signature at all. The mark is cleared only after mkfs ends,
        // so a kill at any point in between is seen here on the retry.
        let found = if backend.format_unfinished(&req.id.token).await? {
            Signature::Empty
        } else {
            fs::probe(&self.host, &device).await?
        };
        match found {
            Signature::Empty => {
                info!(volume.id = %req.id, device = %device.display(), %fs_type, "formatting");
                backend.begin_format(&req.id.token).await?;
                let options = backend.format_options(&req.id.token).await?;
                fs::format(&self.host, fs_type, &device, options).await?;
                backend.mark_formatted(&req.id.token).await?;
            }
            Signature::Filesystem(found) if found == fs_type.as_str() => {}
            Signature::Filesystem(found) | Signature::Other(found) => {
                return Err(VolumeError::WrongFilesystem {
                    device,
                    found,
                    requested: fs_type,
                });
            }
        }
        create_dir(staging).await?;
        let class_options = self
            .mount_options
            .get(&req.id.class)
            .map_or(&[][..], Vec::as_slice);
        let mut options =
            MountOptions::parse(&[class_options, mount_flags].concat()).map_err(VolumeError::Mount)?;
        for data in backend.mount_data() {
            options = options.with_data(data);
        }
        if req.capability.mode == AccessMode::SingleNodeReaderOnly {
            options = options.with_read_only(true);
        }
        self.host
            .syscalls
            .mount(options.filesystem_call(&device, staging, fs_type.as_str()))
            .await?;
        Ok(())
    }

    pub async fn publish(&self, guard: &VolumeGuard, req: &PublishRequest) -> Result<(), VolumeError> {
        guard_matches(guard, &req.id);
        let (backend, record) = self.record(&req.id).await?;
        check_access(&record, &req.capability)?;
        let target = req.target_path.as_path();
        check_no_symlinks(target).await?;
        let table = MountTable::read(&self.host).await?;
        let (source, identity) = match &req.capability.access {
            AccessType::Mount { .. } => {
                let staging = req.staging_path.as_path();
                let staged = table.at(staging).ok_or_else(|| VolumeError::NotStaged {
                    id: req.id.clone(),
                    path: staging.to_path_buf(),
                })?;
                (
                    staging.to_path_buf(),
                    Publication::Filesystem(staged.device_number(), staging.to_path_buf()),
                )
            }
            AccessType::Block => {
                let device = backend
                    .device(&req.id.token)
                    .await?
                    .ok_or_else(|| VolumeError::NotStaged {
                        id: req.id.clone(),
                        path: req.staging_path.as_path().to_path_buf(),
                    })?;
                let root = devtmpfs_root(&device).await?;
                (device, Publication::Block(root))
            }
        };
        if let Some(existing) = table.at(target) {
            if identity.matches(existing) && existing.is_read_only() == req.read_only {
                info!(volume.id = %req.id, path = %target.display(), "already published");
                return Ok(());
            }
            return Err(VolumeError::PathInUse {
                path: target.to_path_buf(),
                reason: format!(
                    "{} is mounted there{}",
                    existing.source,
                    if identity.matches(existing) {
                        " with a different read-only setting"
                    } else {
                        ""
                    }
                ),
            });
        }
        if req.capability.mode == AccessMode::SingleNodeSingleWriter
            && let Some(other) = identity.publications(&table).find(|m| m.mount_point != target)
        {
            return Err(VolumeError::SingleWriter {
                id: req.id.clone(),
                path: other.mount_point.clone(),
            });
        }
        match identity {
            Publication::Filesystem(..) => create_dir(target).await?,
            Publication::Block(_) => create_file(target).await?,
        }
        mount::bind(&self.host, &source, target, req.read_only).await?;
        Ok(())
    }

    pub async fn unpublish(&self, guard: &VolumeGuard, req: &UnpublishRequest) -> Result<(), VolumeError> {
        guard_matches(guard, &req.id);
        let target = req.target_path.as_path();
        check_no_symlinks(target).await?;
        mount::unmount_all(&self.host, target).await?;
        remove_path(target).await
    }

    pub async fn unstage(&self, guard: &VolumeGuard, req: &UnstageRequest) -> Result<(), VolumeError> {
        guard_matches(guard, &req.id);
        let staging = req.staging_path.as_path();
        check_no_symlinks(staging).await?;
        let backend = self.backend_of(&req.id)?;
        if let Some(device) = backend.device(&req.id.token).await? {
            let table = MountTable::read(&self.host).await?;
            let dev = device_number(self, &device).await?;
            let root = devtmpfs_root(&device).await?;
            let published = table.entries().find(|m| {
                m.mount_point != staging
                    && (Publication::Filesystem(dev, staging.to_path_buf()).matches(m)
                        || Publication::Block(root.clone()).matches(m))
            });
            if let Some(published) = published {
                return Err(VolumeError::StillPublished {
                    id: req.id.clone(),
                    path: published.mount_point.clone(),
                });
            }
        }
        mount::unmount_all(&self.host, staging).await?;
        backend.detach(&req.id.token).await?;
        Ok(())
    }

    /// Grows the backing store when it is smaller than asked, makes the device see it,
    /// then grows the filesystem online. Returns the device's size.
    pub async fn expand_on_node(
        &self,
        guard: &VolumeGuard,
        req: &NodeExpandRequest,
    ) -> Result<u64, VolumeError> {
        guard_matches(guard, &req.id);
        let (backend, record) = self.record(&req.id).await?;
        let path = req.volume_path.as_path();
        let table = MountTable::read(&self.host).await?;
        let mounted = table.at(path).ok_or_else(|| VolumeError::NotStaged {
            id: req.id.clone(),
            path: path.to_path_buf(),
        })?;
        if req.capacity.required > record.size_bytes {
            let size = backend.size_for(&req.capacity)?;
            backend.expand(&req.id.token, size).await?;
        }
        let device = backend.attach(&req.id.token).await?;
        backend.refresh_device(&req.id.token).await?;
        if record.mode == VolumeMode::Filesystem {
            // Grow through the filesystem's own mount (the staging path when kubelet names it).
            let fs_mount = req
                .staging_path
                .as_ref()
                .and_then(|s| table.at(s.as_path()))
                .unwrap_or(mounted);
            fs::grow(&self.host, &fs_mount.fs_type, &device, &fs_mount.mount_point).await?;
        }
        Ok(self.host.syscalls.block_device_size(&device).await?)
    }

    pub async fn stats(&self, req: &StatsRequest) -> Result<VolumeStats, VolumeError> {
        let (backend, record) = self.record(&req.id).await?;
        let path = req.volume_path.as_path();
        let not_found = || VolumeError::NotFound(req.id.clone());
        if !path.is_absolute() || tokio::fs::symlink_metadata(path).await.is_err() {
            return Err(not_found());
        }
        let condition = condition_of(backend, &req.id).await?;
        let table = MountTable::read(&self.host).await?;
        if table.at(path).is_none() {
            return Ok(VolumeStats::Unmounted {
                condition: VolumeCondition {
                    abnormal: true,
                    message: format!("volume is not mounted at {}", path.display()),
                },
            });
        }
        Ok(match record.mode {
            VolumeMode::Block => VolumeStats::Block {
                size_bytes: self.host.syscalls.block_device_size(path).await?,
                condition,
            },
            VolumeMode::Filesystem => VolumeStats::Filesystem {
                usage: self.host.syscalls.statvfs(path).await?,
                condition,
            },
        })
    }
}

/// Healthy when the backend still provides the device behind the volume.
async fn condition_of(backend: &Backend, id: &VolumeId) -> Result<VolumeCondition, VolumeError> {
    Ok(match backend.device(&id.token).await {
        Ok(Some(device)) if tokio::fs::metadata(&device).await.is_ok() => VolumeCondition {
            abnormal: false,
            message: format!("healthy on {}", device.display()),
        },
        Ok(_) => VolumeCondition {
            abnormal: true,
            message: "the volume's block device is gone".to_string(),
        },
        Err(e) => {
            warn!(volume.id = %id, error = %e, "cannot check the volume's device");
            VolumeCondition {
                abnormal: true,
                message: format!("cannot check the volume's device: {e}"),
            }
        }
    })
}

/// How a publication of this volume shows in the mount table.
enum Publication {
    /// The staged filesystem's device number, and its staging path.
    Filesystem(u64, PathBuf),
    /// The device node's path below devtmpfs.
    Block(PathBuf),
}

impl Publication {
    fn matches(&self, entry: &MountEntry) -> bool {
        match self {
            Publication::Filesystem(dev, _) => entry.device_number() == *dev,
            Publication::Block(root) => entry.fs_type == "devtmpfs" && entry.root == *root,
        }
    }

    fn publications<'a>(&'a self, table: &'a MountTable) -> impl Iterator<Item = &'a MountEntry> + 'a {
        table.entries().filter(move |m| {
            self.matches(m)
                && match self {
                    Publication::Filesystem(_, staging) => m.mount_point != *staging,
                    Publication::Block(_) => true,
                }
        })
    }
}

async fn create_dir(path: &Path) -> Result<(), VolumeError> {
    use std::os::unix::fs::DirBuilderExt;
    let owned = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&owned)
    })
    .await
    .map_err(|e| io_error("mkdir", path)(std::io::Error::other(e)))?
    .map_err(io_error("mkdir", path))
}

async fn create_file(path: &Path) -> Result<(), VolumeError> {
    let result = tokio::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .await;
    match result {
        Ok(_) => Ok(()),
        Err(e) => Err(io_error("create", path)(e)),
    }
}

/// Removes an unmounted target (directory or device-node placeholder); gone is fine.
async fn remove_path(path: &Path) -> Result<(), VolumeError> {
    let meta = match tokio::fs::symlink_metadata(path).await {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error("stat", path)(e)),
    };
    let result = if meta.is_dir() {
        tokio::fs::remove_dir(path).await
    } else {
        tokio::fs::remove_file(path).await
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error("remove", path)(e)),
    }
}
