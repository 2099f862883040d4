//! The loop backend: each volume is a sparse file, attached to a loop device on stage.
//!
//! On disk, in the class directory (mode 0700): `<token>.img`, the data, and
//! `<token>.json`, the record. The record is written last, by rename, so it is the
//! commit point: a volume exists exactly when its record does. A crash before it leaves
//! only an `.img` that the retried create overwrites (a new file, so no old bytes
//! survive); delete removes the record first for the same reason. A filesystem volume
//! whose type CreateVolume names is formatted in `<token>.img.tmp`, which is fsynced and
//! renamed into place before the record says `"formatted": true`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tracing::warn;

use super::files;
use super::{BackendError, CreateSpec, FormatMark, VolumeRecord};
use crate::fs::{self, FormatOptions, FsType};
use crate::host::Host;
use crate::model::ClaimRef;
use crate::model::{ClassName, Encryption, Token, VolumeId, VolumeMode};

use capacity::Reservation;
use ledger::Ledger;

/// Loop volumes are sized in whole MiB.
pub const ALIGNMENT: u64 = 1 << 20;
const LOSETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long unstage waits for a deferred loop detach to complete.
const DETACH_WAIT: Duration = Duration::from_secs(10);

/// The record file's contents. Field names are a stable on-disk format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct RecordFile {
    name: String,
    size_bytes: u64,
    mode: VolumeMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fs_type: Option<FsType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pvc_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pvc_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pv_name: Option<String>,
    /// For filesystem volumes: false from create until mkfs finished, so a stage that
    /// was killed mid-mkfs is told apart from a real filesystem. Absent in records
    /// written before this field existed: blkid alone decides for those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    formatted: Option<bool>,
    /// A restore or clone made larger than its source: its filesystem keeps the
    /// source's size until stage grows it and clears this.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    grow_filesystem: bool,
    /// `luks2` or `luks2+discards` (see [`Encryption::as_str`]) on an encrypted volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    encryption: Option<String>,
}

#[derive(Debug)]
pub struct LoopBackend {
    class: ClassName,
    dir: PathBuf,
    capacity_limit: u64,
    host: Host,
    /// Serialises the space check and the allocation of creates and expands in this
    /// class (milliseconds of work), so two of them cannot both take the last bytes.
    allocation: Mutex<()>,
    /// Bytes promised to creates whose record is not written yet: they format their
    /// image after the allocation lock is released (see [`Reservation`]).
    reserved: std::sync::Mutex<u64>,
    /// The device each volume's image was last found on, and its backing file as sysfs
    /// showed it then (see `devices_on`): one sysfs read confirms it, instead of a walk
    /// over every loop device of the node.
    found: std::sync::Mutex<std::collections::HashMap<Token, (PathBuf, PathBuf)>>,
    /// Whether a lookup has filled `found` for every device listed (once per process).
    warmed: std::sync::atomic::AtomicBool,
    /// What the volumes and snapshots promise and hold on disk (see `ledger`): counted
    /// when the class opens, kept by every change after.
    ledger: std::sync::Mutex<Ledger>,
}

impl LoopBackend {
    pub fn new(class: ClassName, dir: PathBuf, capacity_limit: u64, host: Host) -> Self {
        Self {
            class,
            dir,
            capacity_limit,
            host,
            allocation: Mutex::new(()),
            reserved: std::sync::Mutex::new(0),
            found: std::sync::Mutex::default(),
            warmed: std::sync::atomic::AtomicBool::new(false),
            ledger: std::sync::Mutex::default(),
        }
    }

    pub fn class(&self) -> &ClassName {
        &self.class
    }

    pub fn directory(&self) -> &Path {
        &self.dir
    }

    fn image_path(&self, token: &Token) -> PathBuf {
        self.dir.join(format!("{token}.img"))
    }

    fn record_path(&self, token: &Token) -> PathBuf {
        self.dir.join(format!("{token}.json"))
    }

    /// Every file a volume may have here, finished or half-made: its record, the
    /// temporary file the record is written through, the one the image is made in,
    /// and its image.
    fn paths_of(&self, token: &Token) -> [PathBuf; 4] {
        let (record, image) = (self.record_path(token), self.image_path(token));
        let (record_tmp, image_tmp) = (record.with_extension("json.tmp"), image.with_extension("img.tmp"));
        [record, record_tmp, image_tmp, image]
    }

    /// Creates the class directory with owner-only access, and its snapshot directory;
    /// thaws any filesystem a killed snapshot left frozen; counts what the class holds.
    pub async fn prepare(&self) -> Result<(), BackendError> {
        files::create_private_dir(&self.dir).await?;
        self.prepare_snapshots().await?;
        let counted = self.count().await?;
        *self.ledger() = counted;
        Ok(())
    }

    fn to_record(&self, token: Token, file: RecordFile) -> Result<VolumeRecord, BackendError> {
        let encryption = match &file.encryption {
            None => None,
            Some(e) => Some(Encryption::parse(e).ok_or_else(|| BackendError::CorruptRecord {
                token: token.to_string(),
                path: self.record_path(&token),
                reason: format!("unknown encryption {e:?}"),
            })?),
        };
        Ok(VolumeRecord {
            id: VolumeId::new(self.class.clone(), token),
            name: file.name,
            size_bytes: file.size_bytes,
            mode: file.mode,
            fs_type: file.fs_type,
            filesystem_grow_pending: file.grow_filesystem,
            encryption,
            claim: ClaimRef {
                pvc_name: file.pvc_name,
                pvc_namespace: file.pvc_namespace,
                pv_name: file.pv_name,
            },
        })
    }

    /// The record of `token`, which must exist ([`BackendError::NotFound`] otherwise).
    async fn require_record(&self, token: &Token) -> Result<RecordFile, BackendError> {
        self.read_record(token)
            .await?
            .ok_or_else(|| BackendError::NotFound {
                class: self.class.clone(),
                token: token.clone(),
            })
    }

    async fn read_record(&self, token: &Token) -> Result<Option<RecordFile>, BackendError> {
        files::read_json(self.record_path(token), token).await
    }

    async fn write_atomically(&self, path: &Path, contents: Vec<u8>) -> Result<(), BackendError> {
        files::write_atomically(&self.dir, path, contents).await
    }

    pub async fn get(&self, token: &Token) -> Result<Option<VolumeRecord>, BackendError> {
        self.read_record(token)
            .await?
            .map(|f| self.to_record(token.clone(), f))
            .transpose()
    }

    pub async fn list(&self) -> Result<Vec<VolumeRecord>, BackendError> {
        let mut records: Vec<VolumeRecord> = files::read_all_json::<RecordFile>(&self.dir)
            .await?
            .into_iter()
            .map(|(token, file)| self.to_record(token, file))
            .collect::<Result<_, _>>()?;
        records.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(records)
    }

    pub async fn create(&self, spec: &CreateSpec) -> Result<VolumeRecord, BackendError> {
        if let Some(existing) = self.get(&spec.token).await? {
            return Ok(existing);
        }
        // The space is taken under the lock, the work is done outside it: a mkfs takes
        // tens of milliseconds, and a burst of creates would otherwise wait in line.
        let _reservation = {
            let _allocation = self.allocation.lock().await;
            self.ensure_space(spec.size_bytes).await?;
            Reservation::new(&self.reserved, spec.size_bytes)
        };
        let made = self.make(spec).await;
        if let Err(error) = &made {
            // No record was there (checked above, under the volume's lock), so every
            // file of this token is this attempt's: a failed create leaves nothing.
            let paths = self.paths_of(&spec.token);
            let removed = files::blocking(&self.dir, move || remove_files(&paths)).await;
            if let Err(cleanup) = removed {
                warn!(token = %spec.token, %error, %cleanup, "cannot remove a failed create's files");
            }
        }
        made
    }

    /// The files of a new volume, in the order that makes it exist: its image, then
    /// its record.
    async fn make(&self, spec: &CreateSpec) -> Result<VolumeRecord, BackendError> {
        let [_, _, tmp, image] = self.paths_of(&spec.token);
        let size = spec.size_bytes;
        {
            let tmp = tmp.clone();
            files::blocking(&self.dir, move || {
                use std::os::unix::fs::OpenOptionsExt;
                // Always a new inode: whatever an interrupted earlier attempt left is gone.
                let _ = std::fs::remove_file(&tmp);
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&tmp)
                    .map_err(BackendError::io("create", &tmp))?;
                file.set_len(size).map_err(BackendError::io("truncate", &tmp))
            })
            .await?;
        }
        // A filesystem volume whose type the request names is formatted now, in its
        // image file before that is in place: CreateVolume runs while the scheduler
        // waits for the claim to be bound (about a second), while stage runs between
        // kubelet's mount checks, where every millisecond can cost the pod 300 (see
        // `crate::k8s::prefetch`). A volume without a named type keeps it for stage,
        // which may name it. The new file reads zeros, so ext4 skips zeroing its tables.
        // An encrypted volume's filesystem is made at stage, on its mapping, which
        // needs the passphrase that only stage is given.
        let format = spec
            .fs_type
            .filter(|_| spec.mode == VolumeMode::Filesystem && spec.encryption.is_none());
        if let Some(fs_type) = format {
            let options = FormatOptions {
                prezeroed: true,
                ..FormatOptions::default()
            };
            fs::format(&self.host, fs_type, &tmp, options).await?;
        }
        // With a filesystem, the image's data must be on disk before the record says it
        // is formatted. Without, it is an empty sparse file: only its name and size
        // matter, and those are metadata that the record's directory fsync below
        // commits, in order, with the record's own rename (ext4 and xfs journal
        // metadata in order).
        {
            let (tmp, image) = (tmp.clone(), image.clone());
            files::blocking(&self.dir, move || {
                if format.is_some() {
                    std::fs::File::open(&tmp)
                        .and_then(|f| f.sync_all())
                        .map_err(BackendError::io("fsync", &tmp))?;
                }
                std::fs::rename(&tmp, &image).map_err(BackendError::io("rename", &image))
            })
            .await?;
        }
        // An encrypted block volume is formatted too: with its LUKS header, at stage.
        let formatted_at_stage = spec.mode == VolumeMode::Filesystem || spec.encryption.is_some();
        self.commit_record(spec, formatted_at_stage.then_some(format.is_some()), false)
            .await
    }

    /// Writes the record of the new volume `spec`, whose image is in place: the last
    /// step of a create, so a volume exists exactly when its record does (and carries
    /// its `grow_filesystem` mark from the start).
    pub(super) async fn commit_record(
        &self,
        spec: &CreateSpec,
        formatted: Option<bool>,
        grow_filesystem: bool,
    ) -> Result<VolumeRecord, BackendError> {
        let file = RecordFile {
            name: spec.name.clone(),
            size_bytes: spec.size_bytes,
            mode: spec.mode,
            fs_type: spec.fs_type,
            pvc_name: spec.claim.pvc_name.clone(),
            pvc_namespace: spec.claim.pvc_namespace.clone(),
            pv_name: spec.claim.pv_name.clone(),
            formatted,
            grow_filesystem,
            encryption: spec.encryption.map(|e| e.as_str().to_string()),
        };
        let json = serde_json::to_vec_pretty(&file).expect("record serialises");
        self.write_atomically(&self.record_path(&spec.token), json)
            .await?;
        // A volume now: in the ledger, with what its image holds (a filesystem, a copy).
        self.ledger().put_volume(spec.token.clone(), spec.size_bytes, 0);
        self.allocated_bytes(&spec.token).await?;
        self.to_record(spec.token.clone(), file)
    }

    pub async fn delete(&self, token: &Token) -> Result<(), BackendError> {
        if let Some(device) = self.device(token).await? {
            return Err(BackendError::InUse {
                token: token.clone(),
                by: format!("attached to {}", device.display()),
            });
        }
        // The temporary files too: a create killed midway leaves them for its retry,
        // and a claim deleted instead never retries.
        let paths = self.paths_of(token);
        files::blocking(&self.dir, move || remove_files(&paths)).await?;
        self.ledger().remove_volume(token);
        files::sync_dir_async(&self.dir).await
    }

    pub async fn expand(&self, token: &Token, size_bytes: u64) -> Result<u64, BackendError> {
        let _allocation = self.allocation.lock().await;
        let mut file = self.require_record(token).await?;
        if size_bytes <= file.size_bytes {
            return Ok(file.size_bytes);
        }
        self.ensure_space(size_bytes - file.size_bytes).await?;
        let image = self.image_path(token);
        files::blocking(&image.clone(), move || {
            let img = std::fs::OpenOptions::new()
                .write(true)
                .open(&image)
                .map_err(BackendError::io("open", &image))?;
            img.set_len(size_bytes)
                .map_err(BackendError::io("truncate", &image))?;
            img.sync_all().map_err(BackendError::io("fsync", &image))
        })
        .await?;
        // The record follows the file: after a crash between the two, the retry finds the
        // file already grown and only rewrites the record.
        file.size_bytes = size_bytes;
        let json = serde_json::to_vec_pretty(&file).expect("record serialises");
        self.write_atomically(&self.record_path(token), json).await?;
        self.ledger().resized(token, size_bytes);
        Ok(size_bytes)
    }

    /// Disk space the image takes now (st_blocks × 512): what FITRIM gives back shows
    /// here. The ledger takes it in, so whoever looks (reclaim after its trim, a volume's
    /// stats) also brings the class's count of that image up to date.
    pub async fn allocated_bytes(&self, token: &Token) -> Result<u64, BackendError> {
        use std::os::unix::fs::MetadataExt;
        let image = self.image_path(token);
        let allocated = files::blocking(&image.clone(), move || {
            let meta = std::fs::metadata(&image).map_err(BackendError::io("stat", &image))?;
            Ok(meta.blocks() * 512)
        })
        .await?;
        self.ledger().allocated(token, allocated);
        Ok(allocated)
    }

    /// What the record's `formatted` says (see `RecordFile`).
    pub async fn format_mark(&self, token: &Token) -> Result<FormatMark, BackendError> {
        Ok(match self.read_record(token).await?.and_then(|r| r.formatted) {
            Some(false) => FormatMark::Unfinished,
            Some(true) => FormatMark::Finished,
            None => FormatMark::Unknown,
        })
    }

    /// Marks the record unformatted before mkfs runs: already so for a volume created
    /// with the mark, written for an older record or a filesystem wiped since.
    pub async fn begin_format(&self, token: &Token) -> Result<(), BackendError> {
        self.set_formatted(token, false).await
    }

    /// Records that mkfs completed, before the volume is first mounted.
    pub async fn mark_formatted(&self, token: &Token) -> Result<(), BackendError> {
        self.set_formatted(token, true).await
    }

    async fn set_formatted(&self, token: &Token, formatted: bool) -> Result<(), BackendError> {
        let Some(mut file) = self.read_record(token).await? else {
            return Err(BackendError::NotFound {
                class: self.class.clone(),
                token: token.clone(),
            });
        };
        if file.formatted == Some(formatted) {
            return Ok(());
        }
        file.formatted = Some(formatted);
        let json = serde_json::to_vec_pretty(&file).expect("record serialises");
        self.write_atomically(&self.record_path(token), json).await
    }

    pub async fn check_health(&self) -> Result<(), BackendError> {
        let meta = tokio::fs::metadata(&self.dir)
            .await
            .map_err(|e| BackendError::Unavailable {
                class: self.class.clone(),
                reason: format!("{}: {e}", self.dir.display()),
            })?;
        if !meta.is_dir() {
            return Err(BackendError::Unavailable {
                class: self.class.clone(),
                reason: format!("{} is not a directory", self.dir.display()),
            });
        }
        Ok(())
    }
}

/// Unlinks a volume's files ([`LoopBackend::paths_of`]): its record first, and the rest
/// only once that is gone (none of them is a volume without it), each tried past any
/// that cannot be; the first failure is the error.
fn remove_files([record, rest @ ..]: &[PathBuf; 4]) -> Result<(), BackendError> {
    let remove = |path: &PathBuf| match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(BackendError::io("unlink", path.clone())(e))
        }
        _ => Ok(()),
    };
    remove(record)?;
    rest.iter().map(remove).fold(Ok(()), Result::and)
}

mod capacity;
mod devices;
mod health;
mod ledger;
mod snapshots;

#[cfg(test)]
mod tests;

/// The image's `(st_dev, st_ino)`, as LOOP_GET_STATUS64 reports a backing file's;
/// `None` when it does not exist.
async fn image_inode(image: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let owned = image.to_path_buf();
    files::blocking(image, move || {
        Ok(std::fs::metadata(owned).ok().map(|m| (m.dev(), m.ino())))
    })
    .await
    .ok()
    .flatten()
}
