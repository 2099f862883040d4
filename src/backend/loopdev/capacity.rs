//! The loop backend's space accounting: what its volumes and snapshots promise, what
//! the class's limit and its disk leave for more, and the check every create, expand,
//! snapshot and copy makes under the allocation lock before it takes space.

use super::{ALIGNMENT, LoopBackend, files};
use crate::backend::{BackendError, ClassCapacity, StorageHealth, StoreUsage};

impl LoopBackend {
    /// Bytes promised to volumes, and bytes of those promises not yet backed by disk.
    /// Two trips to the blocking pool whatever the number of volumes: every create
    /// makes this count under the allocation lock.
    async fn allocated(&self) -> Result<(u64, u64), BackendError> {
        let records = self.list().await?;
        let images = records.iter().map(|r| self.image_path(&r.id.token)).collect();
        let used = files::allocated_bytes_of(&self.dir, images).await?;
        let mut promised = 0u64;
        let mut unbacked = 0u64;
        for (record, used) in records.iter().zip(used) {
            promised += record.size_bytes;
            unbacked += record.size_bytes.saturating_sub(used);
        }
        // Snapshots are never written: what they hold on disk is all they will take.
        promised += self.snapshot_bytes().await?;
        // Creates under way: nothing of theirs is on disk yet that a record would count.
        let reserved = *self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        promised += reserved;
        unbacked += reserved;
        Ok((promised, unbacked))
    }

    pub async fn capacity(&self) -> Result<ClassCapacity, BackendError> {
        Ok(self.capacity_and_health().await?.0)
    }

    /// The class's capacity, and the health of the filesystem under its images (see
    /// `health::class_disk_health`), from one count of what the volumes promised and
    /// one statvfs.
    pub async fn capacity_and_health(&self) -> Result<(ClassCapacity, StorageHealth), BackendError> {
        let (promised, unbacked) = self.allocated().await?;
        let disk = self.host.syscalls.statvfs(&self.dir).await?;
        let health = super::health::class_disk_health(&self.dir, disk.available_bytes, unbacked);
        // Every existing volume may still fill up: the disk must hold that first.
        let disk_free = disk.available_bytes.saturating_sub(unbacked);
        let available = self.capacity_limit.saturating_sub(promised).min(disk_free);
        let available = available / ALIGNMENT * ALIGNMENT;
        let capacity = ClassCapacity {
            available,
            total: self.capacity_limit.min(disk.total_bytes),
            max_volume: available,
        };
        Ok((capacity, health))
    }

    /// The filesystem holding the class's directory, as statvfs counts it (the class
    /// shares it with whatever else is on that disk).
    pub async fn store_usage(&self) -> Result<StoreUsage, BackendError> {
        let disk = self.host.syscalls.statvfs(&self.dir).await?;
        Ok(StoreUsage {
            size_bytes: disk.total_bytes,
            used_bytes: disk.used_bytes,
            free_bytes: disk.available_bytes,
            thin_pool: None,
        })
    }

    /// Refuses `bytes` more than the class has available now. Called under the
    /// allocation lock, before the space is taken, by everything that takes space.
    pub(super) async fn ensure_space(&self, bytes: u64) -> Result<(), BackendError> {
        let available = self.capacity().await?.available;
        if bytes > available {
            return Err(BackendError::NoSpace {
                class: self.class.clone(),
                requested: bytes,
                available,
            });
        }
        Ok(())
    }
}

/// Bytes a create has promised itself until its record (which counts them from then on)
/// is written; given back when the create ends, however it ends. Until then they are
/// counted twice, which only errs on the side of refusing.
pub(super) struct Reservation<'a> {
    reserved: &'a std::sync::Mutex<u64>,
    bytes: u64,
}

impl<'a> Reservation<'a> {
    pub(super) fn new(reserved: &'a std::sync::Mutex<u64>, bytes: u64) -> Self {
        *reserved.lock().unwrap_or_else(|p| p.into_inner()) += bytes;
        Self { reserved, bytes }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        *self.reserved.lock().unwrap_or_else(|p| p.into_inner()) -= self.bytes;
    }
}
