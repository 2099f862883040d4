//! Terminal or transient (see [`Terminal`]) for the backends' errors, decided once here.

use super::{BackendError, LvmError, PmemError};
use crate::host::io_is_terminal;
use crate::model::Terminal;

impl Terminal for BackendError {
    fn is_terminal(&self) -> bool {
        match self {
            BackendError::NoSpace { .. }
            | BackendError::NotFound { .. }
            | BackendError::CorruptRecord { .. }
            | BackendError::SnapshotsUnsupported { .. }
            | BackendError::SnapshotNotFound { .. } => true,
            // In use by someone else, or the class (VG, directory, region) is missing now:
            // both can change without the claim changing.
            BackendError::InUse { .. } | BackendError::Unavailable { .. } => false,
            BackendError::Io { source, .. } => io_is_terminal(source),
            BackendError::Command(c) => c.is_terminal(),
            BackendError::Fs(f) => f.is_terminal(),
            BackendError::Syscall(s) => s.is_terminal(),
            BackendError::Lvm(l) => l.is_terminal(),
            BackendError::Pmem(p) => p.is_terminal(),
        }
    }
}

impl Terminal for LvmError {
    fn is_terminal(&self) -> bool {
        match self {
            // The VG, pool or lvm itself may come back (an administrator, a lock holder).
            LvmError::VgNotFound { .. }
            | LvmError::PoolNotFound { .. }
            | LvmError::PoolUnusable { .. }
            | LvmError::VgPartial { .. }
            | LvmError::ReportUnavailable { .. }
            | LvmError::Locked { .. } => false,
            LvmError::PoolNotZeroing { .. } | LvmError::NameTaken { .. } => true,
            // Unexpected report or extension state: unrecognised, so retried.
            LvmError::Report { .. } | LvmError::Extension { .. } | LvmError::Random(_) => false,
            LvmError::Command { source, .. } => source.is_terminal(),
        }
    }
}

impl Terminal for PmemError {
    fn is_terminal(&self) -> bool {
        match self {
            // A region comes back when it is enabled again or its report can be read.
            PmemError::RegionNotFound { .. }
            | PmemError::RegionDisabled { .. }
            | PmemError::RegionUnreachable { .. }
            | PmemError::ReportUnavailable { .. } => false,
            // fsdax namespaces cannot grow in place; the same size asked again fails again.
            PmemError::FixedSize { .. } | PmemError::TooSmall { .. } => true,
            PmemError::NameTaken { .. } | PmemError::Duplicate { .. } => true,
            PmemError::Report { .. } => false,
            PmemError::Command { source, .. } => source.is_terminal(),
        }
    }
}
