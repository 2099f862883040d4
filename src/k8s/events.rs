//! Kubernetes events (events.k8s.io/v1) for refused volumes, on the pod and the claim so
//! that `kubectl describe` shows why a pod's volume does not come up. Best effort: a
//! failure to record is logged, never returned.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::warn;

use super::owner::{ObjectId, Refusal};
use crate::model::DRIVER_NAME;

/// The `reason` of a refusal event.
pub const REASON_OWNER_MISMATCH: &str = "ClaimOwnerMismatch";
/// The `reason` of the Warning on the Node for a device class whose storage is missing.
pub const REASON_STORAGE_MISSING: &str = "DeviceClassStorageMissing";

#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    timeout: Duration,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
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

impl Events {
    /// Events report `localvol.csi.dev` on `node` as their source.
    pub fn new(client: Client, node: &str, timeout: Duration) -> Self {
        let reporter = Reporter {
            controller: DRIVER_NAME.to_string(),
            instance: Some(node.to_string()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
            timeout,
        }
    }

    /// A Warning on each pod (the claim as related object), then one on the claim.
    pub async fn refused(&self, action: &str, refusal: &Refusal, pods: &[ObjectId]) {
        let pvc = reference("PersistentVolumeClaim", &refusal.pvc);
        let note = refusal.to_string();
        for pod in pods {
            self.publish(
                REASON_OWNER_MISMATCH,
                action,
                &note,
                reference("Pod", pod),
                Some(pvc.clone()),
            )
            .await;
        }
        let related = pods.first().map(|p| reference("Pod", p));
        self.publish(REASON_OWNER_MISMATCH, action, &note, pvc, related)
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
        self.publish(REASON_STORAGE_MISSING, "ServeDeviceClass", &note, regarding, None)
            .await;
    }

    async fn publish(
        &self,
        reason: &str,
        action: &str,
        note: &str,
        regarding: ObjectReference,
        related: Option<ObjectReference>,
    ) {
        let event = Event {
            type_: EventType::Warning,
            reason: reason.to_string(),
            // The API limits a note to 1 kB.
            note: Some(truncate(note, 1024)),
            action: action.to_string(),
            secondary: related,
        };
        let what = format!(
            "{}/{}",
            regarding.namespace.as_deref().unwrap_or_default(),
            regarding.name.as_deref().unwrap_or_default()
        );
        match tokio::time::timeout(self.timeout, self.recorder.publish(&event, &regarding)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(object = %what, error = %e, "could not record event"),
            Err(_) => warn!(object = %what, "could not record event: no answer in time"),
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use http::{Method, StatusCode};
    use serde_json::json;

    use crate::k8s::fixtures::{Exchange, Reply, mock_api};

    #[tokio::test]
    async fn a_missing_class_is_a_warning_on_the_node() {
        let (client, api) = mock_api(vec![Exchange {
            method: Method::POST,
            uri: "/apis/events.k8s.io/v1/namespaces/default/events?".to_string(),
            reply: Reply::Json(StatusCode::CREATED, json!({})),
            check: Some(Box::new(|body| {
                assert_eq!(body["regarding"]["kind"], "Node", "{body}");
                assert_eq!(body["regarding"]["name"], "node-a", "{body}");
                assert_eq!(body["type"], "Warning", "{body}");
                assert_eq!(body["reason"], "DeviceClassStorageMissing", "{body}");
                assert_eq!(body["reportingController"], "localvol.csi.dev", "{body}");
                let note = body["note"].as_str().unwrap_or_default();
                assert!(note.contains("device class ssd is not served"), "{note}");
                assert!(note.contains("volume group vg-late does not exist"), "{note}");
            })),
        }]);
        let missing = vec![(
            "ssd".to_string(),
            "volume group vg-late does not exist on this node".to_string(),
        )];
        crate::k8s::warn_missing_storage(client, "node-a", missing)
            .await
            .unwrap();
        api.await.unwrap();
    }
}
