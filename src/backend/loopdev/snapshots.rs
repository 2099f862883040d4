//! Loop snapshots and copies: a snapshot is a copy of a volume's image, a restore or a
//! clone a copy of a snapshot's or a volume's image grown to the requested size. A copy
//! shares blocks with its source where the data directory's filesystem can (FICLONE on
//! xfs with reflink, btrfs), and is a sparse copy of the data extents otherwise.
//!
//! On disk, under `<class dir>/snapshots/` (mode 0700): `<token>.img` and the record
//! `<token>.json`, committed as a volume's are: the copy is written to `<name>.tmp`,
//! fsynced and renamed, and the record written last, so a snapshot (or a volume) exists
//! exactly when its record does; whatever a killed copy left is overwritten by the retry.
//!
//! **Freezing.** When the source is mounted (staged) on this node its filesystem is
//! frozen (FIFREEZE) for the copy, so the snapshot holds what was written before it, as
//! a clean unmount would. Before freezing, `<token>.freeze` records the mount point; the
//! thaw removes it. A thaw runs on every path: after the copy, on an error, and from the
//! guard's `Drop` when the call is cancelled (the caller went away). A daemon killed
//! while the filesystem is frozen leaves the record: [`LoopBackend::thaw_leftovers`],
//! run at start-up before anything is served, thaws each mount point it names, so the
//! pod's writes block only until the daemon is back.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::LoopBackend;
use super::files;
use crate::backend::{BackendError, CopySource, CreateSpec, SnapshotRecord, SnapshotSpec, VolumeRecord};
use crate::fs::FsType;
use crate::host::Host;
use crate::model::{SnapshotId, Token, VolumeId, VolumeMode};

/// A snapshot's record file. Field names are a stable on-disk format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotFile {
    name: String,
    /// The source volume's token, in this class.
    source: String,
    size_bytes: u64,
    created_unix_nanos: u64,
    mode: VolumeMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fs_type: Option<FsType>,
    /// The source record's `formatted` when the snapshot was taken: a restore of a volume
    /// never formatted is formatted at its first stage, as its source would have been.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    formatted: Option<bool>,
}

/// Thaws a frozen filesystem and removes its freeze record when dropped without
/// [`FreezeGuard::thaw`] (a cancelled call), in a task of its own.
struct FreezeGuard {
    host: Host,
    mount: PathBuf,
    record: PathBuf,
    dir: PathBuf,
    armed: bool,
}

impl FreezeGuard {
    async fn thaw(mut self) -> Result<(), BackendError> {
        self.armed = false;
        thaw(&self.host, &self.mount).await?;
        files::remove_durably(&self.dir, &self.record).await
    }
}

impl Drop for FreezeGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (host, mount, record, dir) = (
            self.host.clone(),
            self.mount.clone(),
            self.record.clone(),
            self.dir.clone(),
        );
        tracing::warn!(mount = %mount.display(), "snapshot call ended while the filesystem was frozen: thawing it");
        tokio::spawn(async move {
            match thaw(&host, &mount).await {
                Ok(()) => {
                    let _ = files::remove_durably(&dir, &record).await;
                }
                // The record stays: the next start-up thaws it.
                Err(e) => tracing::error!(error = %e, mount = %mount.display(), "thaw failed"),
            }
        });
    }
}

/// FITHAW; a filesystem that is not frozen (EINVAL) is already thawed.
async fn thaw(host: &Host, mount: &Path) -> Result<(), BackendError> {
    match host.syscalls.thaw(mount).await {
        Ok(()) => Ok(()),
        Err(e) if e.errno() == Some(libc::EINVAL) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64
}

impl LoopBackend {
    pub(super) fn snapshot_dir(&self) -> PathBuf {
        self.dir.join("snapshots")
    }

    pub(super) fn snapshot_image(&self, token: &Token) -> PathBuf {
        self.snapshot_dir().join(format!("{token}.img"))
    }

    fn snapshot_record_path(&self, token: &Token) -> PathBuf {
        self.snapshot_dir().join(format!("{token}.json"))
    }

    fn freeze_record_path(&self, token: &Token) -> PathBuf {
        self.snapshot_dir().join(format!("{token}.freeze"))
    }

    /// The snapshots' tokens; none before the directory exists.
    pub(super) async fn snapshot_tokens(&self) -> Result<Vec<Token>, BackendError> {
        let dir = self.snapshot_dir();
        if !tokio::fs::try_exists(&dir).await.unwrap_or(false) {
            return Ok(Vec::new());
        }
        files::record_tokens(&dir).await
    }

    /// Creates the snapshot directory and thaws what a killed daemon left frozen.
    pub(super) async fn prepare_snapshots(&self) -> Result<(), BackendError> {
        files::create_private_dir(&self.snapshot_dir()).await?;
        self.thaw_leftovers().await
    }

    /// Thaws every mount point a freeze record names: the daemon was killed between
    /// FIFREEZE and FITHAW (nothing else leaves a record behind). Removes the temporary
    /// files of copies that were killed.
    pub async fn thaw_leftovers(&self) -> Result<(), BackendError> {
        let dir = self.snapshot_dir();
        let mut entries = tokio::fs::read_dir(&dir)
            .await
            .map_err(BackendError::io("readdir", &dir))?;
        while let Some(entry) = entries
            .next_entry()
            .await
            .map_err(BackendError::io("readdir", &dir))?
        {
            let path = entry.path();
            // A copy or record a killed call was writing: nothing refers to it.
            if path.extension().is_some_and(|e| e == "tmp") {
                files::remove_durably(&dir, &path).await?;
                continue;
            }
            if path.extension().is_none_or(|e| e != "freeze") {
                continue;
            }
            let mount = tokio::fs::read_to_string(&path)
                .await
                .map_err(BackendError::io("read", &path))?;
            let mount = PathBuf::from(mount);
            tracing::warn!(mount = %mount.display(), "thawing a filesystem frozen by a snapshot that was interrupted");
            match thaw(&self.host, &mount).await {
                Ok(()) => {}
                // Unmounted since: nothing is frozen there any more.
                Err(BackendError::Syscall(e)) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
            files::remove_durably(&dir, &path).await?;
        }
        Ok(())
    }

    /// Records the freeze durably, then freezes; the guard thaws.
    async fn freeze(&self, token: &Token, mount: &Path) -> Result<FreezeGuard, BackendError> {
        let record = self.freeze_record_path(token);
        let dir = self.snapshot_dir();
        let text = mount.as_os_str().as_encoded_bytes().to_vec();
        files::write_atomically(&dir, &record, text).await?;
        let guard = FreezeGuard {
            host: self.host.clone(),
            mount: mount.to_path_buf(),
            record,
            dir,
            armed: true,
        };
        if let Err(e) = self.host.syscalls.freeze(mount).await {
            // Not frozen: only the record to drop (the guard's thaw of an unfrozen
            // filesystem is a no-op).
            guard.thaw().await?;
            return Err(e.into());
        }
        Ok(guard)
    }

    /// Copies `source` to `target` through a temporary name, renamed into place only
    /// when complete and durable.
    async fn copy_image(&self, source: &Path, target: &Path, dir: &Path) -> Result<(), BackendError> {
        let tmp = target.with_extension("img.tmp");
        match tokio::fs::remove_file(&tmp).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(BackendError::io("unlink", &tmp)(e)),
        }
        let started = std::time::Instant::now();
        let method = self.host.syscalls.copy_file(source, &tmp).await?;
        tracing::info!(?method, elapsed = ?started.elapsed(), target = %target.display(), "copied image");
        tokio::fs::rename(&tmp, target)
            .await
            .map_err(BackendError::io("rename", target))?;
        files::sync_dir_async(dir).await
    }

    /// [`LoopBackend::copy_image`], with the filesystem mounted at `freeze` (the
    /// volume `token`'s) frozen around it and thawed whatever the copy's outcome.
    async fn copy_frozen(
        &self,
        token: &Token,
        freeze: Option<&Path>,
        image: &Path,
        target: &Path,
        dir: &Path,
    ) -> Result<(), BackendError> {
        let Some(mount) = freeze else {
            return self.copy_image(image, target, dir).await;
        };
        let frozen = self.freeze(token, mount).await?;
        let copied = self.copy_image(image, target, dir).await;
        let thawed = frozen.thaw().await;
        copied?;
        thawed
    }

    async fn read_snapshot(&self, token: &Token) -> Result<Option<SnapshotFile>, BackendError> {
        files::read_json(self.snapshot_record_path(token), token).await
    }

    fn to_snapshot(&self, token: Token, file: SnapshotFile) -> Result<SnapshotRecord, BackendError> {
        let source = Token::parse(&file.source).ok_or_else(|| BackendError::CorruptRecord {
            token: token.to_string(),
            path: self.snapshot_record_path(&token),
            reason: format!("source {:?} is not a volume token", file.source),
        })?;
        Ok(SnapshotRecord {
            id: SnapshotId::new(self.class.clone(), token),
            name: file.name,
            source: VolumeId::new(self.class.clone(), source),
            size_bytes: file.size_bytes,
            created: UNIX_EPOCH + Duration::from_nanos(file.created_unix_nanos),
            mode: file.mode,
            fs_type: file.fs_type,
        })
    }

    pub async fn get_snapshot(&self, token: &Token) -> Result<Option<SnapshotRecord>, BackendError> {
        self.read_snapshot(token)
            .await?
            .map(|f| self.to_snapshot(token.clone(), f))
            .transpose()
    }

    pub async fn list_snapshots(&self) -> Result<Vec<SnapshotRecord>, BackendError> {
        let mut all = Vec::new();
        for token in self.snapshot_tokens().await? {
            if let Some(record) = self.get_snapshot(&token).await? {
                all.push(record);
            }
        }
        all.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(all)
    }

    pub async fn create_snapshot(&self, spec: &SnapshotSpec) -> Result<SnapshotRecord, BackendError> {
        if let Some(existing) = self.get_snapshot(&spec.token).await? {
            return Ok(existing);
        }
        let source = self.require_record(&spec.source).await?;
        let _allocation = self.allocation.lock().await;
        self.ensure_space(self.allocated_bytes(&spec.source).await?)
            .await?;
        let created = SystemTime::now();
        let image = self.image_path(&spec.source);
        let target = self.snapshot_image(&spec.token);
        let dir = self.snapshot_dir();
        self.copy_frozen(&spec.source, spec.freeze.as_deref(), &image, &target, &dir)
            .await?;
        let file = SnapshotFile {
            name: spec.name.clone(),
            source: spec.source.to_string(),
            size_bytes: source.size_bytes,
            created_unix_nanos: nanos(created),
            mode: source.mode,
            fs_type: source.fs_type,
            formatted: source.formatted,
        };
        let json = serde_json::to_vec_pretty(&file).expect("record serialises");
        files::write_atomically(&dir, &self.snapshot_record_path(&spec.token), json).await?;
        let held = files::allocated_bytes_of(&dir, vec![self.snapshot_image(&spec.token)]).await?;
        self.ledger().put_snapshot(spec.token.clone(), held.iter().sum());
        self.to_snapshot(spec.token.clone(), file)
    }

    /// Record first, image second, as for a volume: a snapshot without its record is gone.
    pub async fn delete_snapshot(&self, token: &Token) -> Result<(), BackendError> {
        let dir = self.snapshot_dir();
        files::remove_durably(&dir, &self.snapshot_record_path(token)).await?;
        self.ledger().remove_snapshot(token);
        files::remove_durably(&dir, &self.snapshot_image(token)).await
    }

    pub async fn create_from(
        &self,
        spec: &CreateSpec,
        source: &CopySource,
    ) -> Result<VolumeRecord, BackendError> {
        if let Some(existing) = self.get(&spec.token).await? {
            return Ok(existing);
        }
        let (image, source_mode, source_formatted, freeze) = match source {
            CopySource::Snapshot(token) => {
                let snapshot =
                    self.read_snapshot(token)
                        .await?
                        .ok_or_else(|| BackendError::SnapshotNotFound {
                            class: self.class.clone(),
                            token: token.clone(),
                        })?;
                (
                    self.snapshot_image(token),
                    snapshot.mode,
                    snapshot.formatted,
                    None,
                )
            }
            CopySource::Volume { token, freeze } => {
                let volume = self.require_record(token).await?;
                (
                    self.image_path(token),
                    volume.mode,
                    volume.formatted,
                    freeze.clone(),
                )
            }
        };
        let _allocation = self.allocation.lock().await;
        self.ensure_space(spec.size_bytes).await?;
        let target = self.image_path(&spec.token);
        let frozen_token = match source {
            CopySource::Volume { token, .. } => token,
            CopySource::Snapshot(token) => token,
        };
        self.copy_frozen(frozen_token, freeze.as_deref(), &image, &target, &self.dir)
            .await?;
        // Grown to the requested size; the filesystem in it grows at its first stage,
        // which the record's `grow_filesystem` asks for. The record is written last, so
        // a kill before it leaves no volume (the retry copies again) and a kill after
        // it leaves a volume that carries the mark.
        let grow = tokio::fs::OpenOptions::new()
            .write(true)
            .open(&target)
            .await
            .map_err(BackendError::io("open", &target))?;
        let grown = grow
            .metadata()
            .await
            .map_err(BackendError::io("stat", &target))?
            .len()
            < spec.size_bytes;
        if grown {
            grow.set_len(spec.size_bytes)
                .await
                .map_err(BackendError::io("truncate", &target))?;
            grow.sync_all()
                .await
                .map_err(BackendError::io("fsync", &target))?;
        }
        // What the copy holds decides how its first stage treats it: a formatted
        // filesystem is kept, a never-formatted one formatted, anything else left to blkid.
        let formatted = if spec.mode == source_mode {
            source_formatted
        } else {
            None
        };
        let grow_filesystem = grown && spec.mode == VolumeMode::Filesystem;
        self.commit_record(spec, formatted, grow_filesystem).await
    }

    /// The volume's [`VolumeRecord::filesystem_grow_pending`](crate::backend::VolumeRecord).
    #[cfg(test)]
    pub async fn filesystem_grow_pending(&self, token: &Token) -> Result<bool, BackendError> {
        Ok(self.get(token).await?.is_some_and(|r| r.filesystem_grow_pending))
    }

    pub async fn filesystem_grown(&self, token: &Token) -> Result<(), BackendError> {
        let mut file = self.require_record(token).await?;
        if !file.grow_filesystem {
            return Ok(());
        }
        file.grow_filesystem = false;
        let json = serde_json::to_vec_pretty(&file).expect("record serialises");
        self.write_atomically(&self.record_path(token), json).await
    }
}

#[cfg(test)]
mod tests;
