//! ReclaimSpace: giving the space of deleted files back to the device class, by FITRIM
//! on each volume's filesystem, on a schedule configured the way csi-addons configures
//! it, and on demand over the csi-addons API.
//!
//! - [`run`]: one run on one volume, under its lock and the node's concurrency limit.
//! - [`scheduler`]: the background task that starts runs when they are due.
//! - [`k8s`]: watches that reschedule on annotation and ConfigMap changes, and the
//!   `last-run`/`last-result` annotations and failure events written back.
//!
//! Elsewhere: which schedule applies to a volume, and the schedules themselves (cron,
//! `@weekly`, the UID-based stagger), are `crate::reclaim_policy`, pure and low in the
//! layers because `config` validates the node's reclaim settings with it; the
//! csi-addons gRPC services are the edge's, `csi::addons`.

pub mod k8s;
pub mod run;
pub mod scheduler;
#[cfg(test)]
mod testing;

use std::path::PathBuf;
use std::time::Duration;

use crate::backend::BackendError;
use crate::host::SyscallError;
use crate::locks::LockError;
use crate::model::{Terminal, VolumeId};
use crate::mount::MountError;
use crate::volume::VolumeError;

pub use run::{Measure, ReclaimOutcome, Runner, Trim, Undiscarded};

/// When the last scheduled run on this volume finished (RFC 3339), written by localvol.
pub const LAST_RUN_ANNOTATION: &str = "reclaimspace.csiaddons.openshift.io/last-run";
/// What the last scheduled run did, written by localvol.
pub const LAST_RESULT_ANNOTATION: &str = "reclaimspace.csiaddons.openshift.io/last-result";

#[derive(Debug, thiserror::Error)]
pub enum ReclaimError {
    #[error("volume {id} has no mounted filesystem on this node; stage it first")]
    NotStaged { id: VolumeId },
    #[error("FITRIM on volume {id} at {path} did not finish within {timeout:?}; the volume stays locked until the kernel returns", path = path.display())]
    TimedOut {
        id: VolumeId,
        path: PathBuf,
        timeout: Duration,
    },
    /// Another operation holds the volume's lock; the run did not start.
    #[error(transparent)]
    Busy(#[from] LockError),
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Syscall(#[from] SyscallError),
}

impl Terminal for ReclaimError {
    fn is_terminal(&self) -> bool {
        match self {
            // The volume is staged again, the kernel returns, the other operation ends.
            ReclaimError::NotStaged { .. } | ReclaimError::TimedOut { .. } => false,
            ReclaimError::Busy(b) => b.is_terminal(),
            ReclaimError::Volume(v) => v.is_terminal(),
            ReclaimError::Backend(b) => b.is_terminal(),
            ReclaimError::Mount(m) => m.is_terminal(),
            ReclaimError::Syscall(s) => s.is_terminal(),
        }
    }
}

impl ReclaimError {
    /// A short, stable label for metrics and annotations.
    pub fn label(&self) -> &'static str {
        match self {
            ReclaimError::NotStaged { .. } => "not_staged",
            ReclaimError::Busy(_) => "busy",
            ReclaimError::TimedOut { .. } => "timeout",
            ReclaimError::Volume(VolumeError::NotFound(_)) => "not_found",
            ReclaimError::Volume(_) => "volume",
            ReclaimError::Backend(_) => "backend",
            ReclaimError::Mount(_) => "mount",
            ReclaimError::Syscall(_) => "syscall",
        }
    }
}
