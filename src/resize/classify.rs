//! Whether a failed expansion step is terminal (asking again with the same size cannot
//! succeed until someone changes something: the claim's size, the node's storage) or
//! transient (the same request may succeed later: a busy volume, a lock, a timeout, an
//! API conflict).
//!
//! Terminal failures are written to the claim (`NodeResizeInfeasible` and a
//! `NodeResizeError` condition, or their controller counterparts); transient ones never
//! are: they only produce a Warning event and a retry. An error nobody has classified is
//! transient: marking a claim as infeasible stops Kubernetes from retrying, which is
//! worse for a failure that would have cleared than a few more retries are for one that
//! will not.

use std::io;

use crate::backend::BackendError;
use crate::backend::lvm::LvmError;
use crate::backend::pmem::PmemError;
use crate::error::Error;
use crate::fs::FsError;
use crate::host::{CommandError, SyscallError};
use crate::k8s::OwnerError;
use crate::locks::LockError;
use crate::mount::MountError;
use crate::reclaim::ReclaimError;
use crate::volume::VolumeError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Terminal,
    Transient,
}

/// What failed: a volume operation (through the same error the CSI handlers return), or
/// a Kubernetes API call made while resizing.
#[derive(Debug, Clone, Copy)]
pub enum Cause<'a> {
    Operation(&'a Error),
    Api(&'a kube::Error),
    /// An API call that did not answer within its deadline.
    ApiTimeout,
}

/// The one classification of resize failures. Every variant of every error is matched,
/// so a new variant does not compile until someone decides what it means here.
pub fn classify(cause: Cause<'_>) -> Failure {
    use Failure::{Terminal, Transient};
    match cause {
        Cause::ApiTimeout => Transient,
        Cause::Api(e) => api(e),
        Cause::Operation(e) => match e {
            // The request itself is wrong: the same request fails the same way.
            Error::Validation(_) => Terminal,
            Error::Busy(LockError::Busy { .. }) => Transient,
            // The owner check runs before stage and publish, not expansion; decided
            // all the same, as its codes are.
            Error::Owner(o) => match o {
                OwnerError::Refused(_) | OwnerError::NoPodInfo { .. } | OwnerError::ClaimNotFound { .. } => {
                    Terminal
                }
                OwnerError::NotSynced | OwnerError::Timeout { .. } => Transient,
                OwnerError::Api { source, .. } => api(source),
            },
            Error::Volume(v) => volume(v),
            // Reclaim runs FITRIM, never an expansion step; decided all the same, as its
            // codes are.
            Error::Reclaim(r) => match r {
                ReclaimError::NotStaged { .. } | ReclaimError::TimedOut { .. } => Transient,
                ReclaimError::Busy(LockError::Busy { .. }) => Transient,
                ReclaimError::Volume(v) => volume(v),
                ReclaimError::Backend(b) => backend(b),
                ReclaimError::Mount(m) => mount(m),
                ReclaimError::Syscall(s) => syscall(s),
            },
        },
    }
}

fn volume(v: &VolumeError) -> Failure {
    use Failure::{Terminal, Transient};
    match v {
        VolumeError::NotFound(_)
        | VolumeError::SnapshotNotFound(_)
        | VolumeError::UnknownClass(_)
        | VolumeError::AlreadyExists { .. }
        | VolumeError::PathInUse { .. }
        | VolumeError::Symlink { .. }
        | VolumeError::AccessMismatch { .. }
        | VolumeError::WrongFilesystem { .. }
        | VolumeError::Topology { .. }
        | VolumeError::NoRoomToGrow { .. }
        | VolumeError::Invalid(_) => Terminal,
        // Mount state that changes by itself: kubelet stages the volume again,
        // the other user goes away.
        VolumeError::NotStaged { .. }
        | VolumeError::NotAtPath { .. }
        | VolumeError::Occupied { .. }
        | VolumeError::SingleWriter { .. }
        | VolumeError::StillPublished { .. } => Transient,
        // The storage may still appear (a disk attached late, a VG activated later).
        VolumeError::StorageMissing { .. } => Transient,
        VolumeError::Backend(b) => backend(b),
        VolumeError::Mount(m) => mount(m),
        VolumeError::Fs(f) => match f {
            FsError::UnsupportedGrow { .. } => Terminal,
            FsError::Probe { source, .. } | FsError::Format { source, .. } | FsError::Grow { source, .. } => {
                command(source)
            }
        },
        VolumeError::Syscall(s) => syscall(s),
        VolumeError::Io { source, .. } => io_error(source),
    }
}

fn mount(m: &MountError) -> Failure {
    match m {
        MountError::InvalidOption { .. } | MountError::Parse { .. } => Failure::Terminal,
        MountError::Syscall(s) => syscall(s),
    }
}

fn backend(e: &BackendError) -> Failure {
    match e {
        BackendError::NoSpace { .. }
        | BackendError::NotFound { .. }
        | BackendError::CorruptRecord { .. }
        | BackendError::SnapshotsUnsupported { .. }
        | BackendError::SnapshotNotFound { .. } => Failure::Terminal,
        // In use by someone else, or the class (VG, directory, region) is missing now:
        // both can change without the claim changing.
        BackendError::InUse { .. } | BackendError::Unavailable { .. } => Failure::Transient,
        BackendError::Io { source, .. } => io_error(source),
        BackendError::Command(c) => command(c),
        BackendError::Syscall(s) => syscall(s),
        BackendError::Lvm(l) => match l {
            // The VG, pool or lvm itself may come back (an administrator, a lock holder).
            LvmError::VgNotFound { .. }
            | LvmError::PoolNotFound { .. }
            | LvmError::ReportUnavailable { .. }
            | LvmError::Locked { .. } => Failure::Transient,
            LvmError::PoolNotZeroing { .. } | LvmError::NameTaken { .. } => Failure::Terminal,
            // Unexpected report or extension state: unrecognised, so retried.
            LvmError::Report { .. } | LvmError::Extension { .. } => Failure::Transient,
            LvmError::Command { source, .. } => command(source),
        },
        BackendError::Pmem(p) => match p {
            PmemError::RegionNotFound { .. } | PmemError::ReportUnavailable { .. } => Failure::Transient,
            // fsdax namespaces cannot grow in place; the same size asked again fails again.
            PmemError::FixedSize { .. } | PmemError::TooSmall { .. } => Failure::Terminal,
            PmemError::NameTaken { .. } | PmemError::Duplicate { .. } => Failure::Terminal,
            PmemError::Report { .. } => Failure::Transient,
            PmemError::Command { source, .. } => command(source),
        },
    }
}

/// stderr of LVM, ndctl, losetup, resize2fs and xfs_growfs (run with LC_ALL=C) that
/// means the request cannot be met as it is.
const TERMINAL_STDERR: &[&str] = &[
    // lvextend/lvcreate on a full VG or thin pool (tests/fixtures/lvm).
    "insufficient free space",
    "insufficient suitable allocatable extents",
    // ndctl create-namespace, resize2fs and any tool writing to a full filesystem.
    "no space left on device",
    // ext4 online resize without CAP_SYS_RESOURCE, or on a read-only mount.
    "permission denied",
    "read-only file system",
    // resize2fs on a filesystem that cannot address the new size, or told to shrink.
    "too large to be expressed in 32 bits",
    "on-line shrinking not supported",
    "requested size larger than",
    "filesystem has unsupported feature",
    "is misaligned",
];

/// stderr that means someone else holds what the command needs, or it gave up waiting.
const TRANSIENT_STDERR: &[&str] = &[
    "device or resource busy",
    "resource temporarily unavailable",
    "lock",
    "timed out",
    "timeout",
    "interrupted system call",
];

fn command(e: &CommandError) -> Failure {
    match e {
        CommandError::TimedOut { .. } => Failure::Transient,
        // The tool is missing from the image or not executable: no retry brings it.
        CommandError::Spawn { source, .. } => match source.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => Failure::Terminal,
            _ => Failure::Transient,
        },
        CommandError::Failed { stderr, stdout, .. } => {
            let text = format!("{stderr}\n{stdout}").to_ascii_lowercase();
            // Busy and lock messages win: "cannot lock" after "no space" on a full VG is
            // still worth one more try once the lock is free.
            if TRANSIENT_STDERR.iter().any(|p| text.contains(p)) {
                Failure::Transient
            } else if TERMINAL_STDERR.iter().any(|p| text.contains(p)) {
                Failure::Terminal
            } else {
                Failure::Transient
            }
        }
    }
}

fn syscall(e: &SyscallError) -> Failure {
    io_error(&e.source)
}

fn io_error(e: &io::Error) -> Failure {
    match e.raw_os_error() {
        Some(
            libc::ENOSPC
            | libc::EDQUOT
            | libc::EFBIG
            | libc::EROFS
            | libc::EPERM
            | libc::EACCES
            | libc::ENODEV
            | libc::ENXIO
            | libc::ENOTTY
            | libc::EINVAL,
        ) => Failure::Terminal,
        _ => Failure::Transient,
    }
}

fn api(e: &kube::Error) -> Failure {
    match e {
        kube::Error::Api(status) => match status.code {
            // Conflict (someone wrote first), rate limits and server trouble pass.
            409 | 429 => Failure::Transient,
            code if code >= 500 => Failure::Transient,
            // Gone, forbidden by RBAC, or refused by validation: asking again gives the
            // same answer until an administrator or the user acts.
            _ => Failure::Terminal,
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            Failure::Transient
        }
        _ => Failure::Terminal,
    }
}

#[cfg(test)]
#[path = "classify_tests.rs"]
mod tests;
