//! What a stage does to a volume, decided from the facts stage has gathered: pure
//! functions, no I/O. `node.rs`'s `stage_at` reads each fact, asks the plan, and does
//! what it says, in the plan's order.
//!
//! Some facts are learned only part-way through a stage, by its own steps: the format
//! mark is read after the attach (and, encrypted, the unlock), blkid is asked only when
//! the mark cannot tell, and a mount of the filesystem made at create can fail and send
//! stage to blkid after all. So the plan comes in three steps, each taking what the
//! steps before it found:
//!
//! 1. [`before_attach`], from the record and the request, before anything changes: the
//!    stage is refused, or the volume is staged as a raw block device or as a
//!    filesystem (of which type, through its device or its mapping), opened with a
//!    passphrase or not.
//! 2. [`after_mark`], for a filesystem, from the format mark: mount the filesystem
//!    localvol made, take the device as empty without asking blkid, or ask blkid.
//! 3. [`for_signature`], from what blkid found (or the mark said): the stage is
//!    refused, or the device is formatted (with which options), or its filesystem is
//!    mounted as it is, grown before the mount or after it.
//!
//! Whether the staging path holds the volume already is not planned here: only the
//! whole mount table shows it (`Volumes::staged_by_table`).

use std::path::Path;

use super::encryption::DataPath;
use super::{VolumeError, check_access};
use crate::backend::{FormatMark, VolumeRecord};
use crate::crypt::Passphrase;
use crate::fs::{FsType, Signature};
use crate::model::{AccessType, Capability, Encryption};

/// What opens an encrypted volume's mapping.
#[derive(Debug, Clone, Copy)]
pub(super) struct Unlock<'a> {
    pub encryption: Encryption,
    pub passphrase: &'a Passphrase,
}

/// How a volume is staged, as its record and the request say.
#[derive(Debug, Clone, Copy)]
pub(super) struct Staging<'a> {
    /// An encrypted volume's: its mapping is opened (made first if need be) on the
    /// attached device. `None`: the volume is not encrypted.
    pub unlock: Option<Unlock<'a>>,
    pub access: StagedAs<'a>,
}

/// What staging means for the access type the volume was created for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StagedAs<'a> {
    /// Raw block: attaching (and for an encrypted volume, opening its mapping) is all
    /// staging means; publish binds the device node.
    Block,
    /// A filesystem, mounted at the staging path.
    Filesystem(FilesystemStage<'a>),
}

/// The filesystem a filesystem volume is staged with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FilesystemStage<'a> {
    /// The request's, else the record's, else the class's default.
    pub fs_type: FsType,
    /// The request's, mounted after the class's own.
    pub mount_flags: &'a [String],
    /// Where the filesystem is: on the device, or on an encrypted volume's mapping.
    pub data_path: DataPath,
}

/// How a filesystem volume goes on once its format mark is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterMark {
    /// Mount the filesystem localvol made without asking blkid; if the kernel refuses
    /// it, ask blkid after all ([`for_signature`]).
    MountMade,
    /// No mkfs has finished on the volume: the device is taken as empty
    /// ([`Signature::Empty`]) without asking blkid.
    NeverFormatted,
    /// Ask blkid what the device holds ([`for_signature`]).
    Probe,
}

/// What is done to the device's filesystem around its mount at the staging path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MountPlan {
    /// mkfs first: its start is marked before it, its end after it, then the mount.
    Format {
        options: FormatOptionsFrom,
        /// The record's grow mark, cleared after the format.
        clear_grow_pending: bool,
    },
    /// The filesystem found, mounted as it is.
    AsFound,
    /// A copy's ext4, grown to its device before the mount (`grow.rs`).
    GrowBeforeMount,
    /// A copy's xfs, grown to its device through the staging mount (`grow.rs`).
    GrowAfterMount,
}

/// Where mkfs's options come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FormatOptionsFrom {
    /// The backend's, for its device (DAX, a device that reads zeros).
    Backend,
    /// mkfs's defaults.
    Defaults,
}

/// Step 1: how the volume is staged, or why it is not. `default_fs` is the class's
/// filesystem type, for a request and a record that name none.
pub(super) fn before_attach<'a>(
    record: &VolumeRecord,
    capability: &'a Capability,
    passphrase: Option<&'a Passphrase>,
    default_fs: FsType,
) -> Result<Staging<'a>, VolumeError> {
    check_access(record, capability)?;
    // An encrypted volume without its passphrase: refused before anything changes.
    let unlock = match (record.encryption, passphrase) {
        (None, _) => None,
        (Some(encryption), Some(passphrase)) => Some(Unlock {
            encryption,
            passphrase,
        }),
        (Some(_), None) => {
            return Err(VolumeError::MissingPassphrase {
                id: record.id.clone(),
            });
        }
    };
    let access = match &capability.access {
        AccessType::Block => StagedAs::Block,
        AccessType::Mount { fs_type, mount_flags } => StagedAs::Filesystem(FilesystemStage {
            fs_type: fs_type.or(record.fs_type).unwrap_or(default_fs),
            mount_flags,
            data_path: DataPath::of(record),
        }),
    };
    Ok(Staging { unlock, access })
}

/// Step 2: from the volume's format mark, read once it is attached (and an encrypted
/// one's mapping is open: the mark then tells of the filesystem on the mapping, as it
/// does on any volume, a new header leaving it unfinished).
pub(super) fn after_mark(record: &VolumeRecord, fs_type: FsType, mark: FormatMark) -> AfterMark {
    // A filesystem localvol made of the type the record names, with nothing left to
    // grow, is mounted without asking blkid first (a fork and a read of the device,
    // a third of a stage). The kernel checks the superblock itself; if it refuses,
    // blkid is asked after all, to say why or to find what must be done.
    if mark == FormatMark::Finished && record.fs_type == Some(fs_type) && !record.filesystem_grow_pending {
        return AfterMark::MountMade;
    }
    // A volume whose format mark says no mkfs has finished on it (new, or killed
    // mid-mkfs, which can leave a valid-looking but broken signature) never held
    // data: it is formatted without asking blkid. Any other volume is formatted only
    // if blkid finds no signature at all. The mark is cleared only after mkfs ends,
    // so a kill at any point in between is seen here on the retry.
    if mark == FormatMark::Unfinished {
        AfterMark::NeverFormatted
    } else {
        AfterMark::Probe
    }
}

/// Step 3: from what is on `device` (what data is read and written through: the
/// backend's device or the mapping), as blkid found it or as the mark said
/// ([`AfterMark::NeverFormatted`]: empty).
pub(super) fn for_signature(
    record: &VolumeRecord,
    fs_type: FsType,
    data_path: DataPath,
    device: &Path,
    found: Signature,
) -> Result<MountPlan, VolumeError> {
    match found {
        Signature::Empty if record.size_bytes < fs_type.min_bytes() => {
            Err(VolumeError::TooSmallForFilesystem {
                id: record.id.clone(),
                size_bytes: record.size_bytes,
                fs_type,
                min_bytes: fs_type.min_bytes(),
            })
        }
        Signature::Empty => Ok(MountPlan::Format {
            // A mapping reads ciphertext decrypted, never zeros, and carries no DAX.
            options: match data_path {
                DataPath::Mapping => FormatOptionsFrom::Defaults,
                DataPath::Device => FormatOptionsFrom::Backend,
            },
            // A new filesystem fills its device: nothing left to grow.
            clear_grow_pending: record.filesystem_grow_pending,
        }),
        // The volume's own filesystem; a copy's still has its source's size
        // (`grow.rs`): ext4 grows unmounted, xfs only mounted.
        Signature::Filesystem(found) if found == fs_type.as_str() => {
            Ok(match (record.filesystem_grow_pending, fs_type) {
                (false, _) => MountPlan::AsFound,
                (true, FsType::Ext4) => MountPlan::GrowBeforeMount,
                (true, FsType::Xfs) => MountPlan::GrowAfterMount,
            })
        }
        Signature::Luks => Err(VolumeError::WrongFilesystem {
            device: device.to_path_buf(),
            found: "a LUKS header (the volume is not encrypted by localvol)".to_string(),
            requested: fs_type,
        }),
        Signature::Filesystem(found) | Signature::Other(found) => Err(VolumeError::WrongFilesystem {
            device: device.to_path_buf(),
            found,
            requested: fs_type,
        }),
    }
}

#[cfg(test)]
mod tests;
