//! The one place errors become gRPC statuses. Every variant of every module's error is
//! matched here, so each code is chosen on purpose and a new variant does not compile
//! until someone decides its code.

use tonic::{Code, Status};

use crate::backend::{BackendError, LvmError, PmemError};
use crate::crypt::CryptError;
use crate::fs::FsError;
use crate::host::{CommandError, SyscallError};
use crate::k8s::OwnerError;
use crate::locks::LockError;
use crate::model::{IdError, Terminal, ValidationError, full_message};
use crate::mount::MountError;
use crate::reclaim::ReclaimError;
use crate::volume::VolumeError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Validation(#[from] ValidationError),
    #[error(transparent)]
    Busy(#[from] LockError),
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error(transparent)]
    Owner(#[from] OwnerError),
    #[error(transparent)]
    Reclaim(#[from] ReclaimError),
}

impl Error {
    pub fn code(&self) -> Code {
        match self {
            Error::Validation(e) => validation_code(e),
            Error::Busy(LockError::Busy { .. }) => Code::Aborted,
            Error::Volume(e) => volume_code(e),
            Error::Owner(e) => owner_code(e),
            Error::Reclaim(e) => reclaim_code(e),
        }
    }

    /// A short, stable label for metrics: the variant, never the message.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Validation(_) => "validation",
            Error::Busy(_) => "busy",
            Error::Volume(e) => match e {
                VolumeError::NotFound(_) => "not_found",
                VolumeError::SnapshotNotFound(_) => "snapshot_not_found",
                VolumeError::UnknownClass(_) => "unknown_class",
                VolumeError::StorageMissing { .. } => "storage_missing",
                VolumeError::AlreadyExists { .. } => "already_exists",
                VolumeError::PathInUse { .. } => "path_in_use",
                VolumeError::Occupied { .. } => "occupied",
                VolumeError::NotAtPath { .. } => "not_at_path",
                VolumeError::NotStaged { .. } => "not_staged",
                VolumeError::SingleWriter { .. } => "single_writer",
                VolumeError::StillPublished { .. } => "still_published",
                VolumeError::Symlink { .. } => "symlink",
                VolumeError::AccessMismatch { .. } => "access_mismatch",
                VolumeError::WrongFilesystem { .. } => "wrong_filesystem",
                VolumeError::TooSmallForFilesystem { .. } => "too_small_for_filesystem",
                VolumeError::Topology { .. } => "topology",
                VolumeError::NoRoomToGrow { .. } => "no_room_to_grow",
                VolumeError::MissingPassphrase { .. } => "missing_passphrase",
                VolumeError::EncryptionUnsupported { .. } => "encryption_unsupported",
                VolumeError::EncryptionMismatch { .. } => "encryption_mismatch",
                VolumeError::NotLuks { .. } => "not_luks",
                VolumeError::Crypt { source, .. } => match source {
                    CryptError::WrongPassphrase { .. } => "wrong_passphrase",
                    CryptError::MappingElsewhere { .. } | CryptError::NotOpen { .. } => "crypt_mapping",
                    CryptError::Command { .. } | CryptError::Syscall(_) => "crypt",
                },
                VolumeError::Invalid(_) => "validation",
                VolumeError::Backend(_) => "backend",
                VolumeError::Mount(_) => "mount",
                VolumeError::Fs(_) => "filesystem",
                VolumeError::Syscall(_) => "syscall",
                VolumeError::Io { .. } => "io",
            },
            Error::Owner(e) => match e {
                OwnerError::Refused(_) => "owner_refused",
                OwnerError::NoPodInfo { .. } => "no_pod_info",
                OwnerError::ClaimNotFound { .. } => "claim_not_found",
                OwnerError::NotSynced => "k8s_not_synced",
                OwnerError::Api(_) => "k8s_api",
            },
            Error::Reclaim(e) => e.label(),
        }
    }
}

impl Terminal for Error {
    fn is_terminal(&self) -> bool {
        match self {
            Error::Validation(e) => e.is_terminal(),
            Error::Busy(e) => e.is_terminal(),
            Error::Volume(e) => e.is_terminal(),
            Error::Owner(e) => e.is_terminal(),
            Error::Reclaim(e) => e.is_terminal(),
        }
    }
}

fn validation_code(e: &ValidationError) -> Code {
    match e {
        ValidationError::Missing { .. } | ValidationError::Invalid { .. } => Code::InvalidArgument,
        ValidationError::OutOfRange(_) => Code::OutOfRange,
        ValidationError::StaleToken(_) => Code::Aborted,
        ValidationError::Id(IdError::NotOurs(_)) => Code::NotFound,
        ValidationError::Id(IdError::Empty | IdError::Malformed { .. }) => Code::InvalidArgument,
    }
}

fn volume_code(e: &VolumeError) -> Code {
    match e {
        VolumeError::NotFound(_) | VolumeError::SnapshotNotFound(_) | VolumeError::NotAtPath { .. } => {
            Code::NotFound
        }
        VolumeError::UnknownClass(_) | VolumeError::Symlink { .. } | VolumeError::AccessMismatch { .. } => {
            Code::InvalidArgument
        }
        // CSI: a path already used by an incompatible volume or mount.
        VolumeError::AlreadyExists { .. } | VolumeError::PathInUse { .. } => Code::AlreadyExists,
        VolumeError::NotStaged { .. }
        | VolumeError::Occupied { .. }
        | VolumeError::SingleWriter { .. }
        | VolumeError::StillPublished { .. }
        | VolumeError::WrongFilesystem { .. }
        | VolumeError::TooSmallForFilesystem { .. } => Code::FailedPrecondition,
        // As for a full class: external-provisioner then lets the scheduler pick another node.
        VolumeError::Topology { .. } | VolumeError::StorageMissing { .. } => Code::ResourceExhausted,
        // CSI's ControllerExpandVolume "unsupported capacity"; external-resizer marks it
        // infeasible instead of retrying.
        VolumeError::NoRoomToGrow { .. } => Code::OutOfRange,
        VolumeError::MissingPassphrase { .. }
        | VolumeError::EncryptionUnsupported { .. }
        | VolumeError::EncryptionMismatch { .. } => Code::InvalidArgument,
        // The device holds what the volume's header or key cannot open: nothing is
        // changed, and only someone acting on the Secret or the device can change that.
        VolumeError::NotLuks { .. } => Code::FailedPrecondition,
        VolumeError::Crypt { source, .. } => crypt_code(source),
        VolumeError::Invalid(v) => validation_code(v),
        VolumeError::Backend(b) => backend_code(b),
        VolumeError::Mount(m) => mount_code(m),
        VolumeError::Fs(f) => fs_code(f),
        VolumeError::Syscall(s) => syscall_code(s),
        VolumeError::Io { .. } => Code::Internal,
    }
}

fn crypt_code(e: &CryptError) -> Code {
    match e {
        CryptError::WrongPassphrase { .. }
        | CryptError::MappingElsewhere { .. }
        | CryptError::NotOpen { .. } => Code::FailedPrecondition,
        CryptError::Command { source, .. } => command_code(source),
        CryptError::Syscall(s) => syscall_code(s),
    }
}

fn owner_code(e: &OwnerError) -> Code {
    match e {
        // Not this pod's claim, or not knowable from the request: asking again with the
        // same objects gives the same answer.
        OwnerError::Refused(_) | OwnerError::NoPodInfo { .. } | OwnerError::ClaimNotFound { .. } => {
            Code::FailedPrecondition
        }
        // kubelet retries; the check may pass once the API answers or the cache syncs.
        OwnerError::NotSynced => Code::Unavailable,
        OwnerError::Api(e) if !e.is_terminal() => Code::Unavailable,
        OwnerError::Api(_) => Code::Internal,
    }
}

fn reclaim_code(e: &ReclaimError) -> Code {
    match e {
        ReclaimError::NotStaged { .. } => Code::FailedPrecondition,
        ReclaimError::Busy(LockError::Busy { .. }) => Code::Aborted,
        ReclaimError::TimedOut { .. } => Code::DeadlineExceeded,
        ReclaimError::Volume(v) => volume_code(v),
        ReclaimError::Backend(b) => backend_code(b),
        ReclaimError::Mount(m) => mount_code(m),
        // EOPNOTSUPP: the filesystem or the device below it cannot discard.
        ReclaimError::Syscall(s) if s.errno() == Some(libc::EOPNOTSUPP) => Code::FailedPrecondition,
        ReclaimError::Syscall(s) => syscall_code(s),
    }
}

/// The code a backend error gets, for backend tests that assert it without a volume around it.
#[cfg(test)]
pub(crate) fn code_of(e: &BackendError) -> Code {
    backend_code(e)
}

fn backend_code(e: &BackendError) -> Code {
    match e {
        BackendError::NoSpace { .. } => Code::ResourceExhausted,
        BackendError::NotFound { .. } | BackendError::SnapshotNotFound { .. } => Code::NotFound,
        // CSI's CreateVolume "source incompatible or not supported", and the same for a
        // snapshot of a volume its class cannot snapshot: final, not retried.
        BackendError::SnapshotsUnsupported { .. } => Code::InvalidArgument,
        BackendError::InUse { .. } => Code::FailedPrecondition,
        BackendError::Unavailable { .. } => Code::Unavailable,
        BackendError::CorruptRecord { .. } | BackendError::Io { .. } => Code::Internal,
        BackendError::Lvm(l) => lvm_code(l),
        BackendError::Pmem(p) => pmem_code(p),
        BackendError::Command(c) => command_code(c),
        BackendError::Fs(f) => fs_code(f),
        BackendError::Syscall(s) => syscall_code(s),
    }
}

fn lvm_code(e: &LvmError) -> Code {
    match e {
        // The class cannot serve until an administrator acts (or lvm answers again).
        LvmError::VgNotFound { .. }
        | LvmError::PoolNotFound { .. }
        | LvmError::ReportUnavailable { .. }
        | LvmError::Locked { .. } => Code::Unavailable,
        // CSI's "out of capacity" for CreateVolume: the provisioner sends the claim to
        // another node, and retries here once the pool has room again.
        LvmError::PoolUnusable { .. } | LvmError::VgPartial { .. } => Code::ResourceExhausted,
        LvmError::PoolNotZeroing { .. } => Code::FailedPrecondition,
        LvmError::NameTaken { .. } => Code::AlreadyExists,
        LvmError::Report { .. } | LvmError::Extension { .. } | LvmError::Random(_) => Code::Internal,
        LvmError::Command { source, .. } => command_code(source),
    }
}

fn pmem_code(e: &PmemError) -> Code {
    match e {
        PmemError::RegionNotFound { .. }
        | PmemError::RegionUnreachable { .. }
        | PmemError::ReportUnavailable { .. } => Code::Unavailable,
        // As for a full thin pool: no space to give, which makes external-provisioner
        // try another node for a claim that waits for its first consumer.
        PmemError::RegionDisabled { .. } => Code::ResourceExhausted,
        // CSI: a capacity range the plugin cannot honour.
        PmemError::FixedSize { .. } => Code::OutOfRange,
        PmemError::NameTaken { .. } => Code::AlreadyExists,
        PmemError::Duplicate { .. } | PmemError::TooSmall { .. } | PmemError::Report { .. } => Code::Internal,
        PmemError::Command { source, .. } => command_code(source),
    }
}

fn command_code(e: &CommandError) -> Code {
    match e {
        // The tool may finish if asked again; the CO retries.
        CommandError::TimedOut { .. } => Code::DeadlineExceeded,
        CommandError::Spawn { .. } | CommandError::Failed { .. } => Code::Internal,
    }
}

fn syscall_code(e: &SyscallError) -> Code {
    match e.errno() {
        Some(libc::EBUSY) => Code::Unavailable,
        _ => Code::Internal,
    }
}

fn mount_code(e: &MountError) -> Code {
    match e {
        MountError::InvalidOption { .. } => Code::InvalidArgument,
        MountError::Parse { .. } => Code::Internal,
        MountError::Syscall(s) => syscall_code(s),
    }
}

fn fs_code(e: &FsError) -> Code {
    match e {
        FsError::UnsupportedGrow { .. } => Code::FailedPrecondition,
        FsError::Probe { source, .. }
        | FsError::Format { source, .. }
        | FsError::Grow { source, .. }
        | FsError::Check { source, .. } => command_code(source),
        FsError::ReadSuperblock { source, .. } => syscall_code(source),
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        Status::new(e.code(), full_message(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClassName, Token, VolumeId};

    fn id() -> VolumeId {
        VolumeId::new(ClassName::parse("default").unwrap(), Token::for_name("pvc-1"))
    }

    #[test]
    fn codes_are_chosen_per_variant() {
        let cases: Vec<(Error, Code)> = vec![
            (
                ValidationError::Missing { field: "volume_id" }.into(),
                Code::InvalidArgument,
            ),
            (ValidationError::OutOfRange("x".into()).into(), Code::OutOfRange),
            (
                ValidationError::Id(IdError::NotOurs("x".into())).into(),
                Code::NotFound,
            ),
            (
                LockError::Busy {
                    volume: "v".into(),
                    operation: "stage",
                }
                .into(),
                Code::Aborted,
            ),
            (VolumeError::NotFound(id()).into(), Code::NotFound),
            (
                VolumeError::SnapshotNotFound(crate::model::SnapshotId::new(
                    ClassName::parse("default").unwrap(),
                    crate::model::Token::for_name("s"),
                ))
                .into(),
                Code::NotFound,
            ),
            // CSI: a source the plugin cannot copy or snapshot is INVALID_ARGUMENT.
            (
                VolumeError::Backend(BackendError::SnapshotsUnsupported {
                    class: ClassName::parse("thick").unwrap(),
                    kind: "lvm",
                    reason: "full copies only",
                })
                .into(),
                Code::InvalidArgument,
            ),
            (
                VolumeError::Backend(BackendError::NoSpace {
                    class: ClassName::parse("default").unwrap(),
                    requested: 2,
                    available: 1,
                })
                .into(),
                Code::ResourceExhausted,
            ),
            // A thin pool past its critical fill, or out of space: the provisioner sends
            // the claim to another node.
            (
                VolumeError::Backend(BackendError::Lvm(LvmError::PoolUnusable {
                    vg: "vg".into(),
                    pool: "pool0".into(),
                    reason: "thin pool vg/pool0 is out of data space".into(),
                }))
                .into(),
                Code::ResourceExhausted,
            ),
            (
                VolumeError::NoRoomToGrow {
                    id: id(),
                    source: BackendError::NoSpace {
                        class: ClassName::parse("default").unwrap(),
                        requested: 2,
                        available: 1,
                    },
                }
                .into(),
                Code::OutOfRange,
            ),
            (
                VolumeError::NotStaged {
                    id: id(),
                    path: "/s".into(),
                }
                .into(),
                Code::FailedPrecondition,
            ),
            (
                VolumeError::Backend(
                    LvmError::VgNotFound {
                        vg: "vg1".into(),
                        active_lvs: 0,
                    }
                    .into(),
                )
                .into(),
                Code::Unavailable,
            ),
            (
                VolumeError::Backend(
                    LvmError::PoolNotZeroing {
                        vg: "vg1".into(),
                        pool: "pool0".into(),
                    }
                    .into(),
                )
                .into(),
                Code::FailedPrecondition,
            ),
            (
                VolumeError::Backend(
                    PmemError::FixedSize {
                        token: Token::for_name("pvc-1"),
                        size: 1,
                        requested: 2,
                    }
                    .into(),
                )
                .into(),
                Code::OutOfRange,
            ),
            (
                VolumeError::PathInUse {
                    path: "/t".into(),
                    reason: "x".into(),
                }
                .into(),
                Code::AlreadyExists,
            ),
            (
                VolumeError::Backend(BackendError::Command(CommandError::TimedOut {
                    program: "lvs",
                    args: String::new(),
                    timeout: std::time::Duration::from_secs(1),
                }))
                .into(),
                Code::DeadlineExceeded,
            ),
            (crate::k8s::OwnerError::NotSynced.into(), Code::Unavailable),
        ];
        for (error, code) in cases {
            assert_eq!(Status::from(error).code(), code);
        }
    }

    #[test]
    fn messages_carry_the_cause_chain() {
        let e: Error = VolumeError::Syscall(SyscallError {
            call: "mount",
            path: "/t".into(),
            source: std::io::Error::from_raw_os_error(libc::EPERM),
        })
        .into();
        let status = Status::from(e);
        assert!(status.message().contains("mount /t"), "{}", status.message());
        assert!(status.message().contains("not permitted"), "{}", status.message());
    }
}
