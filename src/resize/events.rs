//! Events (events.k8s.io/v1) on claims, so `kubectl describe pvc` shows each step of an
//! expansion. Best effort: a failure to record is logged, never returned (see
//! [`crate::k8s::events`], which publishes them).

use crate::k8s::claim_resize::{Claim, ResizeApi};
use crate::k8s::events::{EventType, Recorder};

/// Node side: NodeExpandVolume.
pub const NODE_EXPANSION_STARTED: &str = "NodeExpansionStarted";
pub const NODE_EXPANSION_SUCCEEDED: &str = "NodeExpansionSucceeded";
/// Terminal: the claim shows the failure value and a NodeResizeError condition.
pub const NODE_EXPANSION_FAILED: &str = "NodeExpansionFailed";
/// Transient: retried; the claim's status is not touched.
pub const NODE_EXPANSION_RETRYING: &str = "NodeExpansionRetrying";
/// Controller side (--node-resizer): external-resizer's reasons, so tools that watch
/// for them see localvol's resizes too.
pub const RESIZING: &str = "Resizing";
pub const VOLUME_RESIZE_SUCCESSFUL: &str = "VolumeResizeSuccessful";
pub const VOLUME_RESIZE_FAILED: &str = "VolumeResizeFailed";
pub const FILE_SYSTEM_RESIZE_REQUIRED: &str = "FileSystemResizeRequired";
/// Controller side, transient: retried with backoff.
pub const VOLUME_RESIZE_RETRYING: &str = "VolumeResizeRetrying";

#[derive(Clone)]
pub struct ClaimEvents {
    recorder: Recorder,
}

impl std::fmt::Debug for ClaimEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimEvents").finish_non_exhaustive()
    }
}

impl ClaimEvents {
    /// Events name `localvol.csi.dev` on `node` as their source.
    pub fn new(api: &ResizeApi, node: &str) -> Self {
        Self {
            recorder: api.recorder(node),
        }
    }

    pub async fn normal(&self, pvc: &Claim, reason: &str, note: &str) {
        self.publish(pvc, EventType::Normal, reason, note).await;
    }

    pub async fn warning(&self, pvc: &Claim, reason: &str, note: &str) {
        self.publish(pvc, EventType::Warning, reason, note).await;
    }

    async fn publish(&self, pvc: &Claim, type_: EventType, reason: &str, note: &str) {
        self.recorder
            .publish(type_, reason, "Resize", note, &pvc.reference(), None)
            .await;
    }
}
