//! Growing the filesystem of a restore or clone made larger than its source.
//!
//! Such a copy's device has the requested size, but the filesystem in it still has the
//! source's: the backend marks it in its record
//! ([`VolumeRecord::filesystem_grow_pending`]) in the commit that makes the copy a volume, and its first stage grows the filesystem to the device
//! before clearing the mark. ext4 grows unmounted, before the mount (e2fsck, then
//! resize2fs: no CAP_SYS_RESOURCE needed, unlike an online ext4 grow); xfs grows only
//! mounted, after it. The mark is cleared last, so a failure or a kill anywhere leaves
//! it for the retry, and growing a filesystem that already fills its device changes
//! nothing: a repeated grow is harmless.

use std::path::Path;

use tracing::{info, warn};

use super::{VolumeError, Volumes};
use crate::backend::{Backend, VolumeRecord};
use crate::fs;
use crate::model::VolumeId;
use crate::mount::MountEntry;

impl Volumes {
    /// Before the mount of a copy whose ext4 was found on its device (not just made)
    /// and is still its source's size: grows it unmounted, then clears the mark.
    pub(super) async fn grow_ext4_unmounted(
        &self,
        backend: &Backend,
        id: &VolumeId,
        device: &Path,
    ) -> Result<(), VolumeError> {
        info!(volume.id = %id, device = %device.display(), "growing the copied ext4 to its device");
        fs::grow_unmounted_ext4(&self.host, device).await?;
        backend.filesystem_grown(&id.token).await?;
        Ok(())
    }

    /// Grows the pending filesystem of a volume mounted at `mount` (its staging mount)
    /// and clears the mark. Read-only, it cannot grow: the mark stays for a later
    /// read-write stage.
    pub(super) async fn grow_mounted(
        &self,
        backend: &Backend,
        id: &VolumeId,
        device: &Path,
        mount: &MountEntry,
    ) -> Result<(), VolumeError> {
        if mount.is_read_only() {
            warn!(volume.id = %id, path = %mount.mount_point.display(),
                "staged read-only: the copied filesystem keeps its source's size until a read-write stage");
            return Ok(());
        }
        info!(volume.id = %id, path = %mount.mount_point.display(), fs_type = %mount.fs_type,
            "growing the copied filesystem to its device");
        fs::grow(&self.host, &mount.fs_type, device, &mount.mount_point).await?;
        backend.filesystem_grown(&id.token).await?;
        Ok(())
    }

    /// For a volume already staged: finishes a grow that failed, or was killed, after
    /// the mount.
    pub(super) async fn grow_if_pending(
        &self,
        backend: &Backend,
        record: &VolumeRecord,
        mount: &MountEntry,
    ) -> Result<(), VolumeError> {
        if !record.filesystem_grow_pending {
            return Ok(());
        }
        let device = backend.attach(&record.id.token).await?;
        let device = self.through_mapping(backend, &record.id.token, device).await?;
        self.grow_mounted(backend, &record.id, &device, mount).await
    }
}

#[cfg(test)]
mod tests;
