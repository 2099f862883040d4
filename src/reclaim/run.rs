//! One ReclaimSpace run on one volume: FITRIM on its mounted filesystem, usage measured
//! before and after.
//!
//! Order matters, so nothing ever waits while holding what others need: first a slot of
//! the node's concurrency limit (waiting here holds no volume), then the volume's lock by
//! try-lock (busy: the caller retries later; a reclaim never makes a stage or unstage
//! wait). The FITRIM ioctl runs on the blocking pool and cannot be interrupted, so the
//! timeout bounds the caller's wait, not the kernel's work: a run that times out keeps
//! the volume's lock and its slot until the ioctl returns, so an unstage cannot race a
//! trim still in progress.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{info, instrument, warn};

use super::ReclaimError;
use crate::backend::Backend;
use crate::host::SyscallError;
use crate::locks::{VolumeGuard, VolumeLocks};
use crate::metrics::Metrics;
use crate::model::{VolumeId, VolumeMode};
use crate::mount::MountTable;
use crate::request::{HostPath, KubeletRoots};
use crate::volume::{VolumeError, Volumes};
use crate::volume_states::{ReclaimResult, VolumeStates};

/// What a usage number measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// The space the volume takes in its device class (a loop image's allocated blocks):
    /// what a discard gives back shows here.
    BackingStore,
    /// The filesystem's used bytes (statvfs), for kinds whose backing store a discard
    /// does not shrink (thick LVs, PMEM). It does not change with a trim.
    Filesystem,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trim {
    pub mount_point: PathBuf,
    /// What the filesystem reported as discarded (free space it trimmed).
    pub trimmed_bytes: u64,
    pub before: u64,
    pub after: u64,
    pub measure: Measure,
}

impl Trim {
    /// Bytes given back to the device class.
    pub fn reclaimed(&self) -> u64 {
        match self.measure {
            Measure::BackingStore => self.before.saturating_sub(self.after),
            Measure::Filesystem => 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReclaimOutcome {
    Trimmed(Trim),
    /// Nothing was discarded, on purpose: why.
    NotDiscarded(Undiscarded),
}

/// Why a volume's unused blocks are not discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undiscarded {
    /// A raw block volume: discarding its unused blocks needs a filesystem to say which
    /// are unused; discarding the device would destroy the data on it.
    RawBlock,
    /// An encrypted volume whose StorageClass did not opt in to discards: they would
    /// show which blocks of the ciphertext are in use (docs/encryption.md).
    EncryptedWithoutDiscards,
}

impl ReclaimOutcome {
    pub fn label(&self) -> &'static str {
        match self {
            ReclaimOutcome::Trimmed(_) => "trimmed",
            ReclaimOutcome::NotDiscarded(_) => "not_discarded",
        }
    }

    /// One line for people (annotations, logs, the CLI).
    pub fn summary(&self) -> String {
        match self {
            ReclaimOutcome::Trimmed(t) => match t.measure {
                Measure::BackingStore => format!(
                    "reclaimed {} bytes (allocated {} -> {}; filesystem trimmed {})",
                    t.reclaimed(),
                    t.before,
                    t.after,
                    t.trimmed_bytes
                ),
                Measure::Filesystem => format!(
                    "filesystem trimmed {} bytes (used {} -> {})",
                    t.trimmed_bytes, t.before, t.after
                ),
            },
            ReclaimOutcome::NotDiscarded(Undiscarded::RawBlock) => {
                "not discarded: raw block volume (discarding it would destroy data)".to_string()
            }
            ReclaimOutcome::NotDiscarded(Undiscarded::EncryptedWithoutDiscards) => {
                "not discarded: encrypted volume whose StorageClass does not set \
                 localvol.csi.dev/encryption-discards: \"true\""
                    .to_string()
            }
        }
    }
}

/// Runs reclaims: shared by the scheduler and the csi-addons service.
#[derive(Debug, Clone)]
pub struct Runner {
    volumes: Arc<Volumes>,
    locks: VolumeLocks,
    metrics: Metrics,
    limit: Arc<Semaphore>,
    timeout: Duration,
    /// Where each volume's last run is kept for `localvol status`.
    states: VolumeStates,
    /// Only mounts below these are trimmed (`--kubelet-root-dir`), as node calls act.
    roots: KubeletRoots,
}

impl Runner {
    /// `concurrency`: runs at once on this node (at least 1).
    pub fn new(
        volumes: Arc<Volumes>,
        locks: VolumeLocks,
        metrics: Metrics,
        concurrency: usize,
        timeout: Duration,
        states: VolumeStates,
        roots: KubeletRoots,
    ) -> Self {
        Self {
            volumes,
            locks,
            metrics,
            limit: Arc::new(Semaphore::new(concurrency.max(1))),
            timeout,
            states,
            roots,
        }
    }

    /// Where the paths of a NodeReclaimSpace request may lie.
    pub fn roots(&self) -> &KubeletRoots {
        &self.roots
    }

    pub fn volumes(&self) -> &Arc<Volumes> {
        &self.volumes
    }

    /// Reclaims `id`'s free space. `paths`: where the caller says the volume is mounted
    /// (kubelet's target or staging path); each must hold the volume's filesystem
    /// (NOT_FOUND otherwise, as for NodeGetVolumeStats) and the first is trimmed.
    /// Without paths, a mount of the filesystem below a kubelet root is. A busy volume
    /// is [`ReclaimError::Busy`].
    #[instrument(skip_all, fields(volume.id = %id))]
    pub async fn reclaim(&self, id: &VolumeId, paths: &[HostPath]) -> Result<ReclaimOutcome, ReclaimError> {
        let permit = Arc::clone(&self.limit)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let started = Instant::now();
        let result = match self.locks.try_lock(&id.token, "ReclaimSpace") {
            Err(busy) => Err(ReclaimError::Busy(busy)),
            Ok(guard) => self.locked(guard, permit, id, paths).await,
        };
        self.record(id, &result, started);
        result
    }

    fn record(&self, id: &VolumeId, result: &Result<ReclaimOutcome, ReclaimError>, started: Instant) {
        let m = &self.metrics.reclaim;
        let class = id.class.as_str();
        let label = match result {
            Ok(outcome) => outcome.label(),
            Err(e) => e.label(),
        };
        m.runs.with_label_values(&[class, label]).inc();
        // A run skipped because the volume was busy did not happen: the last real one
        // stays shown.
        let last = match result {
            Ok(ReclaimOutcome::Trimmed(t)) => Some(ReclaimResult::Trimmed {
                reclaimed_bytes: t.reclaimed(),
                trimmed_bytes: t.trimmed_bytes,
            }),
            Ok(ReclaimOutcome::NotDiscarded(_)) => Some(ReclaimResult::NotDiscarded),
            Err(ReclaimError::Busy(_)) => None,
            Err(e) => Some(ReclaimResult::Failed {
                error: crate::model::full_message(e),
            }),
        };
        if let Some(last) = last {
            self.states.reclaimed(id, last);
        }
        if let Ok(ReclaimOutcome::Trimmed(t)) = result {
            m.reclaimed_bytes
                .with_label_values(&[class])
                .inc_by(t.reclaimed());
            m.trimmed_bytes
                .with_label_values(&[class])
                .inc_by(t.trimmed_bytes);
            m.duration
                .with_label_values(&[class])
                .observe(started.elapsed().as_secs_f64());
        }
    }

    async fn locked(
        &self,
        guard: VolumeGuard,
        permit: OwnedSemaphorePermit,
        id: &VolumeId,
        paths: &[HostPath],
    ) -> Result<ReclaimOutcome, ReclaimError> {
        debug_assert_eq!(guard.token(), &id.token);
        let record = self.volumes.get(id).await?;
        let backend = self
            .volumes
            .backends()
            .find(|b| b.class() == &id.class)
            .ok_or_else(|| VolumeError::NotFound(id.clone()))?;
        // Every path the caller names must hold this volume, whatever its mode.
        let mut named = Vec::with_capacity(paths.len());
        for path in paths {
            named.push(self.volumes.mount_at(backend, id, path).await?);
        }
        if record.mode == VolumeMode::Block {
            info!("raw block volume: not discarded");
            return Ok(ReclaimOutcome::NotDiscarded(Undiscarded::RawBlock));
        }
        // Its mapping refuses FITRIM (EOPNOTSUPP); the outcome says why instead.
        if record.encryption.is_some_and(|e| !e.allow_discards) {
            info!("encrypted without discards: not discarded");
            return Ok(ReclaimOutcome::NotDiscarded(
                Undiscarded::EncryptedWithoutDiscards,
            ));
        }
        let mount_point = match named.first() {
            Some(mount) if mount.fs_type != "devtmpfs" => mount.mount_point.clone(),
            Some(mount) => {
                return Err(VolumeError::NotAtPath {
                    id: id.clone(),
                    path: mount.mount_point.display().to_string(),
                }
                .into());
            }
            None => self.staged_mount(backend, id).await?,
        };
        let (before, measure) = self.usage(backend, id, &mount_point).await?;

        let syscalls = Arc::clone(&self.volumes.host().syscalls);
        let path = mount_point.clone();
        let mut fitrim = tokio::spawn(async move { syscalls.fitrim(&path).await });
        let trimmed_bytes = match tokio::time::timeout(self.timeout, &mut fitrim).await {
            Ok(joined) => joined.map_err(|e| SyscallError {
                call: "FITRIM",
                path: mount_point.clone(),
                source: std::io::Error::other(e),
            })??,
            Err(_) => {
                let volume = id.clone();
                tokio::spawn(async move {
                    let finished = fitrim.await;
                    warn!(volume.id = %volume, ?finished, "FITRIM finished after its timeout; releasing the volume");
                    drop((guard, permit));
                });
                return Err(ReclaimError::TimedOut {
                    id: id.clone(),
                    path: mount_point,
                    timeout: self.timeout,
                });
            }
        };
        let (after, _) = self.usage(backend, id, &mount_point).await?;
        let trim = Trim {
            mount_point,
            trimmed_bytes,
            before,
            after,
            measure,
        };
        info!(
            volume.path = %trim.mount_point.display(),
            trimmed = trimmed_bytes,
            before,
            after,
            "reclaimed"
        );
        Ok(ReclaimOutcome::Trimmed(trim))
    }

    /// A mount of the volume's filesystem (same device, the filesystem's root) below a
    /// kubelet root: normally its staging mount.
    async fn staged_mount(&self, backend: &Backend, id: &VolumeId) -> Result<PathBuf, ReclaimError> {
        let not_staged = || ReclaimError::NotStaged { id: id.clone() };
        let device = backend.device(&id.token).await?.ok_or_else(not_staged)?;
        let host = self.volumes.host();
        let dev = host
            .syscalls
            .device_number(&device)
            .await?
            .ok_or_else(not_staged)?;
        let table = MountTable::read(host).await?;
        table
            .entries()
            .find(|e| {
                e.device_number() == dev
                    && e.root == Path::new("/")
                    && e.fs_type != "devtmpfs"
                    && self.roots.root_of(&e.mount_point).is_some()
            })
            .map(|e| e.mount_point.clone())
            .ok_or_else(not_staged)
    }

    async fn usage(
        &self,
        backend: &Backend,
        id: &VolumeId,
        mount_point: &Path,
    ) -> Result<(u64, Measure), ReclaimError> {
        if let Some(bytes) = backend.allocated_bytes(&id.token).await? {
            return Ok((bytes, Measure::BackingStore));
        }
        let fs = self.volumes.host().syscalls.statvfs(mount_point).await?;
        Ok((fs.used_bytes, Measure::Filesystem))
    }
}

#[cfg(test)]
mod tests;
