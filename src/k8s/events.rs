//! Kubernetes events (events.k8s.io/v1): the one recorder every module publishes
//! through, and the owner check's own events, for refused volumes (on the pod and the
//! claim, so that `kubectl describe` shows why a pod's volume does not come up) and for
//! device classes without storage (on the Node). Best effort: a failure to record is
//! logged, never returned.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Reporter};
use tracing::warn;

pub use kube::runtime::events::EventType;

use super::api::{call_within, truncate};
use super::owner::{ObjectId, Refusal};
use crate::backend::StorageHealth;
use crate::model::DRIVER_NAME;
use crate::volume_states::ConditionChange;

/// The `reason` of a refusal event.
pub const REASON_OWNER_MISMATCH: &str = "ClaimOwnerMismatch";
/// The `reason` of the Warning on a claim whose encrypted volume did not open at stage
/// (no passphrase, a passphrase that opens no keyslot, no LUKS header on the device).
pub const REASON_ENCRYPTED_NOT_OPENED: &str = "EncryptedVolumeNotOpened";
/// The `reason` of the Warning on the Node for a device class whose storage is missing.
pub const REASON_STORAGE_MISSING: &str = "DeviceClassStorageMissing";

/// The `reason` of the event on the Node when a device class's storage changes health:
/// a Warning for degraded and critical, Normal when it is healthy again.
pub const REASON_STORAGE_DEGRADED: &str = "DeviceClassStorageDegraded";
pub const REASON_STORAGE_CRITICAL: &str = "DeviceClassStorageCritical";
pub const REASON_STORAGE_HEALTHY: &str = "DeviceClassStorageHealthy";

/// The `reason` of the event on a claim when its volume's condition changes: a Warning
/// when NodeGetVolumeStats finds it abnormal, Normal when it is healthy again.
pub const REASON_VOLUME_ABNORMAL: &str = "VolumeConditionAbnormal";
pub const REASON_VOLUME_HEALTHY: &str = "VolumeConditionHealthy";

/// Publishes events as one reporting component on one node, each under a deadline.
#[derive(Clone)]
pub struct Recorder {
    recorder: kube::runtime::events::Recorder,
    timeout: Duration,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").finish_non_exhaustive()
    }
}

pub fn reference(kind: &str, id: &ObjectId) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some(kind.to_string()),
        namespace: Some(id.namespace.clone()),
        name: Some(id.name.clone()),
        uid: (!id.uid.is_empty()).then(|| id.uid.clone()),
        ..ObjectReference::default()
    }
}

impl Recorder {
    /// Events report `controller` on `node` as their source; each may take `timeout`.
    pub fn new(client: Client, controller: &str, node: &str, timeout: Duration) -> Self {
        let reporter = Reporter {
            controller: controller.to_string(),
            instance: Some(node.to_string()),
        };
        Self {
            recorder: kube::runtime::events::Recorder::new(client, reporter),
            timeout,
        }
    }

    /// The owner check's recorder: events report `localvol.csi.dev` on `node`.
    pub fn driver(client: Client, node: &str, timeout: Duration) -> Self {
        Self::new(client, DRIVER_NAME, node, timeout)
    }

    /// A Warning on each pod (the claim as related object), then one on the claim.
    pub async fn refused(&self, action: &str, refusal: &Refusal, pods: &[ObjectId]) {
        let pvc = reference("PersistentVolumeClaim", &refusal.pvc);
        let note = refusal.to_string();
        for pod in pods {
            self.publish(
                EventType::Warning,
                REASON_OWNER_MISMATCH,
                action,
                &note,
                &reference("Pod", pod),
                Some(pvc.clone()),
            )
            .await;
        }
        let related = pods.first().map(|p| reference("Pod", p));
        self.publish(
            EventType::Warning,
            REASON_OWNER_MISMATCH,
            action,
            &note,
            &pvc,
            related,
        )
        .await;
    }

    /// A Warning on the claim `namespace/name` with `reason`, for `action` (a node call).
    pub async fn claim_warning(&self, namespace: &str, name: &str, reason: &str, action: &str, note: &str) {
        let claim = ObjectId {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: String::new(),
        };
        self.publish(
            EventType::Warning,
            reason,
            action,
            note,
            &reference("PersistentVolumeClaim", &claim),
            None,
        )
        .await;
    }

    /// An event on the claim `namespace/name`: its volume `volume`'s condition changed.
    pub async fn volume_condition(
        &self,
        namespace: &str,
        name: &str,
        volume: &str,
        change: &ConditionChange,
    ) {
        let (type_, reason, note) = match change {
            ConditionChange::Abnormal(why) => (
                EventType::Warning,
                REASON_VOLUME_ABNORMAL,
                format!("volume {volume} is abnormal: {why}"),
            ),
            ConditionChange::Healthy => (
                EventType::Normal,
                REASON_VOLUME_HEALTHY,
                format!("volume {volume} is healthy again"),
            ),
        };
        let claim = ObjectId {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: String::new(),
        };
        let regarding = reference("PersistentVolumeClaim", &claim);
        self.publish(type_, reason, "NodeGetVolumeStats", &note, &regarding, None)
            .await;
    }

    /// A Warning on the Node `node`: a configured device class has no storage there and
    /// is not served (the API server keeps a Node's events in `default`).
    pub async fn storage_missing(&self, node: &str, class: &str, reason: &str) {
        let regarding = ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("Node".to_string()),
            name: Some(node.to_string()),
            ..ObjectReference::default()
        };
        let note = format!(
            "device class {class} is not served on this node: {reason}; localvol looks for it again on every stats refresh"
        );
        self.publish(
            EventType::Warning,
            REASON_STORAGE_MISSING,
            "ServeDeviceClass",
            &note,
            &regarding,
            None,
        )
        .await;
    }

    /// An event on the Node `node`: device class `class`'s storage is now `health`.
    pub async fn storage_health(&self, node: &str, class: &str, health: &StorageHealth) {
        let (type_, event_reason, note) = match health {
            StorageHealth::Critical(why) => (
                EventType::Warning,
                REASON_STORAGE_CRITICAL,
                format!("device class {class}'s storage is critical: {why}"),
            ),
            StorageHealth::Degraded(why) => (
                EventType::Warning,
                REASON_STORAGE_DEGRADED,
                format!("device class {class}'s storage is degraded: {why}"),
            ),
            StorageHealth::Healthy => (
                EventType::Normal,
                REASON_STORAGE_HEALTHY,
                format!("device class {class}'s storage is healthy again"),
            ),
        };
        let regarding = ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("Node".to_string()),
            name: Some(node.to_string()),
            ..ObjectReference::default()
        };
        self.publish(type_, event_reason, "CheckStorageHealth", &note, &regarding, None)
            .await;
    }

    /// Records one event about `regarding` (`related`: a second object it concerns),
    /// its note cut to the API's limit.
    pub async fn publish(
        &self,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(truncate(note)),
            action: action.to_string(),
            secondary: related,
        };
        let object = format!(
            "{}/{}",
            regarding.namespace.as_deref().unwrap_or_default(),
            regarding.name.as_deref().unwrap_or_default()
        );
        let kind = regarding.kind.as_deref().unwrap_or_default();
        let published = call_within(
            self.timeout,
            || format!("create Event {reason} on {kind} {object}"),
            self.recorder.publish(&event, regarding),
        )
        .await;
        if let Err(e) = published {
            warn!(object = %object, reason, error = %e, "could not record event");
        }
    }
}

#[cfg(test)]
mod tests {
    use http::{Method, StatusCode};
    use serde_json::json;

    use crate::backend::StorageHealth;
    use crate::k8s::mock_api::{Exchange, MockApi, Reply};

    #[tokio::test]
    async fn a_missing_class_is_a_warning_on_the_node() {
        let (client, api) = MockApi::scripted(vec![
            Exchange::new(
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/default/events?",
                Reply::Json(StatusCode::CREATED, json!({})),
            )
            .check(|body| {
                assert_eq!(body["regarding"]["kind"], "Node", "{body}");
                assert_eq!(body["regarding"]["name"], "node-a", "{body}");
                assert_eq!(body["type"], "Warning", "{body}");
                assert_eq!(body["reason"], "DeviceClassStorageMissing", "{body}");
                assert_eq!(body["reportingController"], "localvol.csi.dev", "{body}");
                let note = body["note"].as_str().unwrap_or_default();
                assert!(note.contains("device class ssd is not served"), "{note}");
                assert!(note.contains("volume group vg-late does not exist"), "{note}");
            }),
        ]);
        let missing = vec![(
            "ssd".to_string(),
            "volume group vg-late does not exist on this node".to_string(),
        )];
        crate::k8s::warn_missing_storage(client, "node-a", missing)
            .await
            .unwrap();
        api.finish().await;
    }

    #[tokio::test]
    async fn a_change_of_storage_health_is_an_event_on_the_node() {
        let event = |type_: &'static str, reason: &'static str, note: &'static str| {
            Exchange::new(
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/default/events?",
                Reply::Json(StatusCode::CREATED, json!({})),
            )
            .check(move |body| {
                assert_eq!(body["regarding"]["kind"], "Node", "{body}");
                assert_eq!(body["regarding"]["name"], "node-a", "{body}");
                assert_eq!(body["type"], type_, "{body}");
                assert_eq!(body["reason"], reason, "{body}");
                assert_eq!(body["action"], "CheckStorageHealth", "{body}");
                assert_eq!(body["note"], note, "{body}");
            })
        };
        let (client, api) = MockApi::scripted(vec![
            event(
                "Warning",
                "DeviceClassStorageCritical",
                "device class thin's storage is critical: thin pool vg1/pool0 is out of data space",
            ),
            event(
                "Warning",
                "DeviceClassStorageDegraded",
                "device class thin's storage is degraded: thin pool vg1/pool0: data 81.0% full (warning at 80%)",
            ),
            event(
                "Normal",
                "DeviceClassStorageHealthy",
                "device class thin's storage is healthy again",
            ),
        ]);
        let events = super::Recorder::driver(client, "node-a", std::time::Duration::from_secs(5));
        for health in [
            StorageHealth::Critical("thin pool vg1/pool0 is out of data space".to_string()),
            StorageHealth::Degraded("thin pool vg1/pool0: data 81.0% full (warning at 80%)".to_string()),
            StorageHealth::Healthy,
        ] {
            events.storage_health("node-a", "thin", &health).await;
        }
        drop(events);
        api.finish().await;
    }
}
