//! An encrypted volume's dm-crypt mapping: made and opened at stage, closed at unstage,
//! grown with the device, and the device every other operation sees while it is open.
//!
//! The backend's device holds the LUKS2 header and ciphertext only. Everything that
//! reads or writes the volume's data (mkfs, mount, a raw block bind, stats, growth)
//! goes through the mapping, `crate::crypt::Mapping::for_volume(<volume id>)`, which
//! is found again from the kernel after a restart.

use std::path::{Path, PathBuf};

use tracing::info;

use super::{VolumeError, Volumes};
use crate::backend::{Backend, FormatMark, VolumeRecord};
use crate::crypt::{self, CryptError, Mapping, MappingState, Passphrase};
use crate::fs::{self, Signature};
use crate::host::Host;
use crate::model::{Encryption, Token, VolumeId};

/// What stage does next on an opened mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unlocked {
    /// The LUKS header was made just now: the mapping holds nothing yet, and a
    /// filesystem volume is formatted without asking blkid.
    New,
    /// An existing header was opened (or found open): the mapping holds what the
    /// volume held, and the format mark says what that is.
    Existing,
}

/// What a volume's data is read and written through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DataPath {
    /// The backend's device itself: a volume that is not encrypted.
    Device,
    /// The dm-crypt mapping open on the backend's device: an encrypted volume. It reads
    /// ciphertext decrypted (never zeros) and carries no DAX.
    Mapping,
}

impl DataPath {
    /// As the volume's record says: encrypted or not.
    pub fn of(record: &VolumeRecord) -> Self {
        match record.encryption {
            Some(_) => DataPath::Mapping,
            None => DataPath::Device,
        }
    }
}

pub(super) fn mapping_of(id: &VolumeId) -> Mapping {
    Mapping::for_volume(&id.to_string())
}

/// What is wrong with the mapping of encrypted volume `id` staged on `device`, if
/// anything, as its condition says it.
pub(super) async fn mapping_problem(host: &Host, id: &VolumeId, device: &Path) -> Option<String> {
    let mapping = mapping_of(id);
    match crypt::state(host, &mapping, device).await {
        Ok(MappingState::Open) => None,
        Ok(MappingState::Suspended) => Some(format!(
            "its dm-crypt mapping {mapping} is suspended: its I/O waits until `dmsetup resume {mapping}`"
        )),
        Ok(MappingState::NotOpen) => Some(format!(
            "its dm-crypt mapping {mapping} is not open, so its data cannot be reached: unpublish and \
             unstage the volume, and stage it again"
        )),
        Err(e) => Some(format!("cannot check its dm-crypt mapping: {e}")),
    }
}

/// A cryptsetup failure as the volume's error.
fn crypt_error(id: &VolumeId) -> impl Fn(CryptError) -> VolumeError + '_ {
    move |source| VolumeError::Crypt {
        id: id.clone(),
        source,
    }
}

impl Volumes {
    /// Opens the encrypted volume `record` on `device` (its backend's device, attached)
    /// with `passphrase`, making its LUKS2 header first when it has never had one:
    /// when its format mark says a format never finished, or when blkid finds nothing
    /// on it. Anything else on the device is refused and left as it is; so is a header
    /// the passphrase does not open.
    pub(super) async fn unlock(
        &self,
        backend: &Backend,
        record: &VolumeRecord,
        encryption: Encryption,
        device: &Path,
        passphrase: &Passphrase,
    ) -> Result<(PathBuf, Unlocked), VolumeError> {
        let id = &record.id;
        let mapping = mapping_of(id);
        let crypt_error = crypt_error(id);
        let mark = backend.format_mark(&id.token).await?;
        let open = crypt::find(&self.host, &mapping, device)
            .await
            .map_err(&crypt_error)?;
        let must_format = match (mark, open) {
            // A header being made is never trusted: whatever opened, it is made again.
            (FormatMark::Unfinished, Some(_)) => {
                crypt::close(&self.host, &mapping).await.map_err(&crypt_error)?;
                true
            }
            (FormatMark::Unfinished, None) => true,
            (_, Some(path)) => return Ok((path, Unlocked::Existing)),
            // The header was made and the format after it finished.
            (FormatMark::Finished, None) => false,
            // (An encrypted LV's mark is never pending: see `tags::FS_UUID`.)
            (FormatMark::Unknown | FormatMark::Pending(_), None) => {
                match fs::probe(&self.host, device).await? {
                    Signature::Luks => false,
                    Signature::Empty => {
                        backend.begin_format(&id.token).await?;
                        true
                    }
                    Signature::Filesystem(found) | Signature::Other(found) => {
                        return Err(VolumeError::NotLuks {
                            id: id.clone(),
                            device: device.to_path_buf(),
                            found,
                        });
                    }
                }
            }
        };
        if must_format {
            info!(volume.id = %id, device = %device.display(), "making the LUKS2 header");
            let pbkdf = self.pbkdf.get(&id.class).copied().unwrap_or_default();
            crypt::format(&self.host, device, passphrase, pbkdf)
                .await
                .map_err(&crypt_error)?;
        }
        let path = crypt::open(
            &self.host,
            device,
            &mapping,
            passphrase,
            encryption.allow_discards,
        )
        .await
        .map_err(&crypt_error)?;
        info!(volume.id = %id, mapping = %path.display(), "opened");
        Ok((
            path,
            if must_format {
                Unlocked::New
            } else {
                Unlocked::Existing
            },
        ))
    }

    /// Closes the volume's mapping when it is open on `device`; a mapping of its name on
    /// anything else is refused and left open.
    pub(super) async fn lock(&self, id: &VolumeId, device: &Path) -> Result<(), VolumeError> {
        let mapping = mapping_of(id);
        let crypt_error = crypt_error(id);
        if crypt::find(&self.host, &mapping, device)
            .await
            .map_err(&crypt_error)?
            .is_some()
        {
            crypt::close(&self.host, &mapping).await.map_err(&crypt_error)?;
            info!(volume.id = %id, %mapping, "closed");
        }
        Ok(())
    }

    /// The volume's mapping when it is open on `device`, else `device`: what the
    /// volume's mounts and binds are made of.
    pub(super) async fn through_mapping(
        &self,
        backend: &Backend,
        token: &Token,
        device: PathBuf,
    ) -> Result<PathBuf, VolumeError> {
        let id = VolumeId::new(backend.class().clone(), token.clone());
        match crypt::find(&self.host, &mapping_of(&id), &device).await {
            Ok(Some(mapping)) => Ok(mapping),
            Ok(None) => Ok(device),
            Err(source) => Err(VolumeError::Crypt { id, source }),
        }
    }

    /// The device the volume's data is read and written through, while it has one:
    /// the backend's device, or, for an encrypted volume, the mapping open on it.
    /// An encrypted volume whose mapping is closed has none: its ciphertext is never
    /// bound for a pod.
    pub(super) async fn data_device(
        &self,
        backend: &Backend,
        record: &VolumeRecord,
    ) -> Result<Option<PathBuf>, VolumeError> {
        let Some(device) = backend.device(&record.id.token).await? else {
            return Ok(None);
        };
        if record.encryption.is_none() {
            return Ok(Some(device));
        }
        crypt::find(&self.host, &mapping_of(&record.id), &device)
            .await
            .map_err(crypt_error(&record.id))
    }

    /// Grows the volume's open mapping to its device (after the device grew).
    pub(super) async fn grow_mapping(&self, id: &VolumeId, device: &Path) -> Result<PathBuf, VolumeError> {
        let mapping = mapping_of(id);
        let crypt_error = crypt_error(id);
        match crypt::find(&self.host, &mapping, device)
            .await
            .map_err(&crypt_error)?
        {
            Some(path) => {
                crypt::resize(&self.host, &mapping).await.map_err(&crypt_error)?;
                Ok(path)
            }
            None => Err(crypt_error(CryptError::NotOpen { mapping })),
        }
    }
}
