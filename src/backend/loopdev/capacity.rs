//! The loop backend's space accounting: what its volumes and snapshots promise (its
//! ledger, see `ledger`), what the class's limit and its disk leave for more, and the
//! check every create, expand, snapshot and copy makes under the allocation lock before
//! it takes space.

use super::ledger::{Ledger, Totals};
use super::{ALIGNMENT, LoopBackend, files};
use crate::backend::{BackendError, ClassCapacity, StorageHealth, StoreUsage};

impl LoopBackend {
    /// The ledger counted from the storage: every record's size, every image's and
    /// snapshot's blocks on disk. Three trips to the blocking pool whatever the number
    /// of volumes; run when the class opens and at each stats refresh, never per call.
    pub(super) async fn count(&self) -> Result<Ledger, BackendError> {
        let records = self.list().await?;
        let images = records.iter().map(|r| self.image_path(&r.id.token)).collect();
        let used = files::allocated_bytes_of(&self.dir, images).await?;
        let snapshots = self.snapshot_tokens().await?;
        let snapshot_images = snapshots.iter().map(|t| self.snapshot_image(t)).collect();
        let snapshot_bytes = files::allocated_bytes_of(&self.snapshot_dir(), snapshot_images).await?;
        Ok(Ledger::counted(
            records
                .into_iter()
                .zip(used)
                .map(|(r, used)| (r.id.token, r.size_bytes, used)),
            snapshots.into_iter().zip(snapshot_bytes),
        ))
    }

    pub(super) fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What is promised and not yet on disk, from the ledger, with the creates under
    /// way (nothing of theirs is on disk yet that the ledger would count).
    fn totals(&self) -> Totals {
        let mut totals = self.ledger().totals();
        let reserved = *self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        totals.promised += reserved;
        totals.unbacked += reserved;
        totals
    }

    /// The class's capacity: the ledger and one statvfs, whatever the number of volumes.
    pub async fn capacity(&self) -> Result<ClassCapacity, BackendError> {
        let disk = self.host.syscalls.statvfs(&self.dir).await?;
        Ok(self.capacity_of(self.totals(), &disk))
    }

    /// The class's capacity, and the health of the filesystem under its images (see
    /// `health::class_disk_health`), from a count of the storage that it also gives the
    /// ledger: the stats refresh's, so a pod's writes and discards are counted at least
    /// once a refresh.
    pub async fn capacity_and_health(&self) -> Result<(ClassCapacity, StorageHealth), BackendError> {
        let since = self.ledger().generation();
        let fresh = self.count().await?;
        self.ledger().recounted(since, fresh);
        let totals = self.totals();
        let disk = self.host.syscalls.statvfs(&self.dir).await?;
        let health = super::health::class_disk_health(&self.dir, disk.available_bytes, totals.unbacked);
        Ok((self.capacity_of(totals, &disk), health))
    }

    fn capacity_of(&self, totals: Totals, disk: &crate::host::FsUsage) -> ClassCapacity {
        // Every existing volume may still fill up: the disk must hold that first.
        let disk_free = disk.available_bytes.saturating_sub(totals.unbacked);
        let available = self.capacity_limit.saturating_sub(totals.promised).min(disk_free);
        let available = available / ALIGNMENT * ALIGNMENT;
        ClassCapacity {
            available,
            total: self.capacity_limit.min(disk.total_bytes),
            max_volume: available,
        }
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
