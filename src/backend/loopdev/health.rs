//! What can go wrong under a staged loop volume, found with a sysfs read and two stats
//! (no walk over the class's volumes): its image deleted while a device still holds it,
//! no device on it at all (detached by hand), and the filesystem under the class's
//! images running out of the space the sparse image still needs for its writes.

use std::path::Path;

use super::{ALIGNMENT, LoopBackend};
use crate::backend::{BackendError, StorageHealth, VolumeHealth, VolumeRecord};

impl LoopBackend {
    /// The health of a staged volume: room on the disk for the part of it not written
    /// yet while a device holds its image (`attached`, as [`LoopBackend::device`] just
    /// found), else why none does.
    pub async fn volume_health(
        &self,
        record: &VolumeRecord,
        attached: bool,
    ) -> Result<VolumeHealth, BackendError> {
        let token = &record.id.token;
        let image = self.image_path(token);
        if !attached {
            return Ok(VolumeHealth::Abnormal(match self.holding_device(token).await? {
                Some(device) => format!(
                    "its image {} was deleted while {} still holds it: the data is lost once the \
                     device is detached; copy it off the device before unstaging the volume",
                    image.display(),
                    device.display()
                ),
                None => format!(
                    "no loop device holds its image {} (detached outside localvol): unpublish and \
                     unstage the volume, and stage it again",
                    image.display()
                ),
            }));
        }
        let (disk, used) = tokio::join!(self.host.syscalls.statvfs(&self.dir), self.allocated_bytes(token));
        let unbacked = record.size_bytes.saturating_sub(used?);
        Ok(disk_health(
            &self.dir,
            disk?.available_bytes,
            unbacked,
            Whose::Volume,
        ))
    }
}

/// Whether the filesystem under a class's images (`dir`, `free` bytes available) holds
/// the `unbacked` bytes all its volumes may still write: the count capacity makes.
pub(super) fn class_disk_health(dir: &Path, free: u64, unbacked: u64) -> StorageHealth {
    match disk_health(dir, free, unbacked, Whose::Class) {
        VolumeHealth::Healthy => StorageHealth::Healthy,
        VolumeHealth::Warning(why) => StorageHealth::Degraded(why),
        VolumeHealth::Abnormal(why) => StorageHealth::Critical(why),
    }
}

/// Whose writes [`disk_health`] speaks of.
#[derive(Debug, Clone, Copy)]
pub(super) enum Whose {
    /// One volume's: the condition of its stats.
    Volume,
    /// All the class's volumes': its storage health.
    Class,
}

/// Whether the filesystem holding the images (`dir`, with `free` bytes available) can
/// take the `unbacked` bytes not yet on disk (one volume's, or the class's). A sparse
/// image needs space for every first write to a block: without it the loop device
/// answers the write with an I/O error. Capacity keeps room for every volume's unbacked
/// bytes, so a shortfall means something else filled the disk.
pub(super) fn disk_health(dir: &Path, free: u64, unbacked: u64, whose: Whose) -> VolumeHealth {
    let (images, volumes) = match whose {
        Whose::Volume => ("its image", "the volume"),
        Whose::Class => ("the class's images", "its volumes"),
    };
    if unbacked == 0 || free >= unbacked {
        VolumeHealth::Healthy
    } else if free < ALIGNMENT {
        VolumeHealth::Abnormal(format!(
            "the filesystem holding {images} ({}) is full ({} free): writes to the {} of \
             {volumes} not yet on disk fail with I/O errors; free space there",
            dir.display(),
            mib(free),
            mib(unbacked)
        ))
    } else {
        VolumeHealth::Warning(format!(
            "the filesystem holding {images} ({}) has {} free, less than the {} of {volumes} \
             not yet on disk: their writes fail once that is full",
            dir.display(),
            mib(free),
            mib(unbacked)
        ))
    }
}

/// A size as a reader takes it in: KiB below a MiB, else MiB to a tenth.
fn mib(bytes: u64) -> String {
    if bytes < ALIGNMENT {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{:.1} MiB", bytes as f64 / ALIGNMENT as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_disk_that_holds_what_the_image_may_still_write_is_healthy() {
        let dir = Path::new("/var/lib/localvol/loop/fast");
        let volume = |free, unbacked| disk_health(dir, free, unbacked, Whose::Volume);
        assert_eq!(volume(0, 0), VolumeHealth::Healthy, "fully written");
        assert_eq!(volume(64 * MIB, 64 * MIB), VolumeHealth::Healthy);
        assert_eq!(
            volume(8 * MIB, 64 * MIB),
            VolumeHealth::Warning(
                "the filesystem holding its image (/var/lib/localvol/loop/fast) has 8.0 MiB free, \
                 less than the 64.0 MiB of the volume not yet on disk: their writes fail once \
                 that is full"
                    .to_string()
            )
        );
        assert_eq!(
            volume(4096, 64 * MIB),
            VolumeHealth::Abnormal(
                "the filesystem holding its image (/var/lib/localvol/loop/fast) is full (4 KiB \
                 free): writes to the 64.0 MiB of the volume not yet on disk fail with I/O \
                 errors; free space there"
                    .to_string()
            )
        );
        assert_eq!(
            disk_health(dir, 4096, 640 * MIB, Whose::Class),
            VolumeHealth::Abnormal(
                "the filesystem holding the class's images (/var/lib/localvol/loop/fast) is full \
                 (4 KiB free): writes to the 640.0 MiB of its volumes not yet on disk fail with \
                 I/O errors; free space there"
                    .to_string()
            )
        );
    }
}
