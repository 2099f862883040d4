//! Events (events.k8s.io/v1) on claims, so `kubectl describe pvc` shows each step of an
//! expansion. Best effort: a failure to record is logged, never returned (see
//! [`crate::k8s::events`], which publishes them).

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use kube::Client;

use crate::k8s::api::API_TIMEOUT;
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

fn reference(pvc: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("PersistentVolumeClaim".to_string()),
        namespace: pvc.metadata.namespace.clone(),
        name: pvc.metadata.name.clone(),
        uid: pvc.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

impl ClaimEvents {
    /// Events name `localvol.csi.dev` on `node` as their source.
    pub fn new(client: Client, node: &str) -> Self {
        Self {
            recorder: Recorder::driver(client, node, API_TIMEOUT),
        }
    }

    pub async fn normal(&self, pvc: &PersistentVolumeClaim, reason: &str, note: &str) {
        self.publish(pvc, EventType::Normal, reason, note).await;
    }

    pub async fn warning(&self, pvc: &PersistentVolumeClaim, reason: &str, note: &str) {
        self.publish(pvc, EventType::Warning, reason, note).await;
    }

    async fn publish(&self, pvc: &PersistentVolumeClaim, type_: EventType, reason: &str, note: &str) {
        self.recorder
            .publish(type_, reason, "Resize", note, &reference(pvc), None)
            .await;
    }
}
