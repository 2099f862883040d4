//! "May this volume be staged, or published to this pod?" as pure functions of the
//! objects involved. No I/O: the caller reads the claim and pods (cache or API) and
//! hands them in, so every rule is table-tested here.
//!
//! The rules follow kubelet's own check for generic ephemeral volumes (KEP-1698): a
//! claim made for a pod's ephemeral volume carries that pod as its controlling owner,
//! and only that pod may use it. A same-named claim created by anyone else is refused.

use std::fmt;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use super::api::ApiError;
use crate::model::Terminal;
use crate::request::PodInfo;

/// Why the owner check (`check`) lets a stage or publish not go on: a refusal by the
/// rules below, or what it could not read. Here, at the bottom of `k8s/`, because the
/// check and its reads (`lookup`) both answer with it.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error("refusing: {0}")]
    Refused(Refusal),
    #[error(
        "volume {volume} belongs to PersistentVolumeClaim {pvc} but the request names no pod; \
         the CSIDriver object must set podInfoOnMount: true"
    )]
    NoPodInfo { volume: String, pvc: String },
    #[error("cannot find the PersistentVolumeClaim behind volume {volume}: {reason}")]
    ClaimNotFound {
        volume: String,
        reason: String,
        /// Whether this rests on a cached read (the check then reads again before it
        /// answers so).
        cached: bool,
    },
    #[error(
        "the Kubernetes pod cache is not synced (its first list, or a new list after its watch \
         failed, is not in yet); try again"
    )]
    NotSynced,
    #[error(transparent)]
    Api(#[from] ApiError),
}

impl Terminal for OwnerError {
    fn is_terminal(&self) -> bool {
        match self {
            // Not this pod's claim, or not knowable from the request: asking again with
            // the same objects gives the same answer.
            OwnerError::Refused(_) | OwnerError::NoPodInfo { .. } | OwnerError::ClaimNotFound { .. } => true,
            // The check may pass once the API answers or the cache syncs.
            OwnerError::NotSynced => false,
            OwnerError::Api(e) => e.is_terminal(),
        }
    }
}

/// A namespaced object as people read it: `namespace/name (uid U)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectId {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// The first owner reference with `controller: true`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controller {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl Controller {
    pub fn is_pod(&self) -> bool {
        self.kind == "Pod" && self.api_version == "v1"
    }
}

/// What the checks need of a PersistentVolumeClaim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimView {
    pub id: ObjectId,
    /// `spec.volumeName`: the PV the claim is bound to, once bound.
    pub volume_name: Option<String>,
    pub controller: Option<Controller>,
}

impl ClaimView {
    pub fn from_pvc(pvc: &PersistentVolumeClaim) -> Self {
        let meta = &pvc.metadata;
        let controller = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| Controller {
                api_version: o.api_version.clone(),
                kind: o.kind.clone(),
                name: o.name.clone(),
                uid: o.uid.clone(),
            });
        Self {
            id: ObjectId {
                namespace: meta.namespace.clone().unwrap_or_default(),
                name: meta.name.clone().unwrap_or_default(),
                uid: meta.uid.clone().unwrap_or_default(),
            },
            volume_name: pvc.spec.as_ref().and_then(|s| s.volume_name.clone()),
            controller,
        }
    }

    /// The controlling pod, if a pod controls this claim.
    pub fn pod_controller(&self) -> Option<&Controller> {
        self.controller.as_ref().filter(|c| c.is_pod())
    }
}

/// What the checks need of a Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub id: ObjectId,
    pub node: Option<String>,
    /// Claims the pod's ephemeral volumes resolve to (see [`ephemeral_claim_names`]).
    pub ephemeral_claims: Vec<String>,
    /// Claims named by `persistentVolumeClaim` volumes.
    pub claims: Vec<String>,
}

impl PodView {
    pub fn from_pod(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        Self {
            id: ObjectId {
                namespace: meta.namespace.clone().unwrap_or_default(),
                name: meta.name.clone().unwrap_or_default(),
                uid: meta.uid.clone().unwrap_or_default(),
            },
            node: spec.and_then(|s| s.node_name.clone()),
            ephemeral_claims: ephemeral_claim_names(pod),
            claims: spec
                .and_then(|s| s.volumes.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| c.claim_name.clone()))
                .collect(),
        }
    }

    /// Whether the pod names the claim in any of its volumes.
    pub fn uses(&self, claim: &ObjectId) -> bool {
        self.id.namespace == claim.namespace
            && (self.ephemeral_claims.contains(&claim.name) || self.claims.contains(&claim.name))
    }

    fn uses_through_ephemeral(&self, claim: &ObjectId) -> bool {
        self.id.namespace == claim.namespace && self.ephemeral_claims.contains(&claim.name)
    }
}

/// The claim names of a pod's generic ephemeral volumes: `<pod name>-<volume name>`, in
/// the pod's namespace (KEP-1698). This is the only place that knows the naming rule;
/// ownership, not the name, decides. Should Kubernetes move to generated names (the
/// name then recorded in the pod's status), only this lookup changes.
pub fn ephemeral_claim_names(pod: &Pod) -> Vec<String> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter(|v| v.ephemeral.is_some())
        .map(|v| format!("{pod_name}-{}", v.name))
        .collect()
}

/// Why a claim is not for the pod at hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The PersistentVolumeClaim, `namespace/name (uid U)`.
    pub pvc: ObjectId,
    pub expected: String,
    pub found: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PersistentVolumeClaim {}: expected owner {}, found {}",
            self.pvc, self.expected, self.found
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    Refused(Refusal),
}

fn pod_ref(namespace: &str, name: &str, uid: &str) -> String {
    format!("Pod {namespace}/{name} (uid {uid})")
}

fn refused(claim: &ClaimView, expected: String, found: String) -> Decision {
    Decision::Refused(Refusal {
        pvc: claim.id.clone(),
        expected,
        found,
    })
}

/// NodeStageVolume: a claim controlled by a pod is staged only if that pod exists with
/// that UID in the claim's namespace, runs on this node, and has an ephemeral volume
/// whose claim is this one. `owner` is the pod named by the controller reference, as
/// read from the claim's namespace (None: no such pod). Other claims are normal claims.
pub fn decide_stage(claim: &ClaimView, node: &str, owner: Option<&PodView>) -> Decision {
    let Some(controller) = claim.pod_controller() else {
        return Decision::Allowed;
    };
    let expected = format!(
        "{} on node {node}, with an ephemeral volume for this claim",
        pod_ref(&claim.id.namespace, &controller.name, &controller.uid)
    );
    let found = match owner {
        None => format!("no Pod {}/{}", claim.id.namespace, controller.name),
        Some(pod) if pod.id.uid != controller.uid || pod.id.namespace != claim.id.namespace => {
            format!("Pod {}", pod.id)
        }
        Some(pod) if pod.node.as_deref() != Some(node) => format!(
            "Pod {} on node {}",
            pod.id,
            pod.node.as_deref().unwrap_or("<none>")
        ),
        Some(pod) if !pod.uses_through_ephemeral(&claim.id) => {
            format!("Pod {} without an ephemeral volume for this claim", pod.id)
        }
        Some(_) => return Decision::Allowed,
    };
    refused(claim, expected, found)
}

/// NodePublishVolume for the pod in the request. A claim controlled by a pod is
/// published only to exactly that pod (UID and namespace), whether the pod uses it
/// through an ephemeral volume or a `persistentVolumeClaim` volume: it is never handed
/// to any other pod. A claim not controlled by a pod is a normal claim, unless the pod
/// uses it through an ephemeral volume: then it must have been made for this pod.
///
/// `pod` is the requesting pod as read by name and UID (None: no such pod); it is only
/// looked at when [`publish_needs_pod`] says so.
pub fn decide_publish(claim: &ClaimView, requester: &PodInfo, pod: Option<&PodView>) -> Decision {
    let expected = pod_ref(&requester.namespace, &requester.name, &requester.uid);
    if let Some(controller) = claim.pod_controller() {
        if controller.uid == requester.uid && claim.id.namespace == requester.namespace {
            return Decision::Allowed;
        }
        return refused(
            claim,
            expected,
            pod_ref(&claim.id.namespace, &controller.name, &controller.uid),
        );
    }
    let Some(pod) = pod else {
        return refused(
            claim,
            expected,
            format!(
                "no Pod {}/{} with uid {} to check how it uses the claim",
                requester.namespace, requester.name, requester.uid
            ),
        );
    };
    if !pod.uses_through_ephemeral(&claim.id) {
        return Decision::Allowed;
    }
    let found = match &claim.controller {
        None => "no controlling owner".to_string(),
        Some(c) => format!("{} {}/{} (uid {})", c.kind, claim.id.namespace, c.name, c.uid),
    };
    refused(claim, expected, found)
}

/// Whether [`decide_publish`] needs the requesting pod's spec for this claim.
pub fn publish_needs_pod(claim: &ClaimView) -> bool {
    claim.pod_controller().is_none()
}

#[cfg(test)]
mod tests;
