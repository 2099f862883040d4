//! Kubernetes events (events.k8s.io/v1) for refused volumes, on the pod and the claim so
//! that `kubectl describe` shows why a pod's volume does not come up. Best effort: a
//! failure to record is logged, never returned.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::warn;

use super::owner::{ObjectId, Refusal};
use crate::csi::DRIVER_NAME;

/// The `reason` of a refusal event.
pub const REASON_OWNER_MISMATCH: &str = "ClaimOwnerMismatch";

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
            self.publish(action, &note, reference("Pod", pod), Some(pvc.clone()))
                .await;
        }
        let related = pods.first().map(|p| reference("Pod", p));
        self.publish(action, &note, pvc, related).await;
    }

    async fn publish(
        &self,
        action: &str,
        note: &str,
        regarding: ObjectReference,
        related: Option<ObjectReference>,
    ) {
        let event = Event {
            type_: EventType::Warning,
            reason: REASON_OWNER_MISMATCH.to_string(),
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
