//! A claim's resize status, written the way kubelet and external-resizer write it: a
//! strategic merge patch of the `status` subresource that carries the claim's
//! `metadata.resourceVersion`, so the write lands only on the object it was planned
//! from. On 409 Conflict the claim is read again, the patch planned again, and sent
//! again, a bounded number of times.
//!
//! Planning ([`plan`]) is pure: from the claim as read and the wanted transition to the
//! patch, or to nothing when the claim already shows it (a repeated call writes
//! nothing).
//!
//! Not server-side apply: the keys and conditions to remove were set by kubelet or
//! external-resizer under their own field managers, and an apply only removes what its
//! own manager set.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimCondition};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Api, Client};
use serde_json::{Map, Value, json};
use tokio::sync::OnceCell;
use tracing::{info, warn};

use super::FailureValue;
use crate::k8s::api::{ApiError, call, patch_status, truncate};
use crate::model::Terminal;

/// The resource whose status localvol reports.
pub const STORAGE: &str = "storage";

/// `status.allocatedResourceStatuses["storage"]` values (ClaimResourceStatus).
pub const CONTROLLER_RESIZE_IN_PROGRESS: &str = "ControllerResizeInProgress";
pub const NODE_RESIZE_PENDING: &str = "NodeResizePending";
pub const NODE_RESIZE_IN_PROGRESS: &str = "NodeResizeInProgress";
/// The failure values, by the name the API server accepts (see [`FailureNames`]).
pub const NODE_RESIZE_INFEASIBLE: &str = "NodeResizeInfeasible";
pub const NODE_RESIZE_FAILED: &str = "NodeResizeFailed";
pub const CONTROLLER_RESIZE_INFEASIBLE: &str = "ControllerResizeInfeasible";
pub const CONTROLLER_RESIZE_FAILED: &str = "ControllerResizeFailed";

/// Condition types that belong to resizing; any other condition is left alone.
pub const RESIZING: &str = "Resizing";
pub const FILE_SYSTEM_RESIZE_PENDING: &str = "FileSystemResizePending";
pub const CONTROLLER_RESIZE_ERROR: &str = "ControllerResizeError";
pub const NODE_RESIZE_ERROR: &str = "NodeResizeError";
const RESIZE_CONDITIONS: [&str; 4] = [
    RESIZING,
    FILE_SYSTEM_RESIZE_PENDING,
    CONTROLLER_RESIZE_ERROR,
    NODE_RESIZE_ERROR,
];

/// Writes tried per transition before a run of conflicts is reported as an error.
pub const ATTEMPTS: usize = 3;

const FS_RESIZE_PENDING_MESSAGE: &str =
    "The volume has grown; its node grows the filesystem when a pod mounts the claim.";

/// Which names the API server accepts for the terminal failure values. Kubernetes 1.31
/// renamed `NodeResizeFailed`/`ControllerResizeFailed` to `...Infeasible` (PR 126108,
/// listed under the urgent upgrade notes of v1.31.0), and validates the value against
/// the names it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureNames {
    /// Before 1.31: `NodeResizeFailed`, `ControllerResizeFailed`.
    Failed,
    /// 1.31 on: `NodeResizeInfeasible`, `ControllerResizeInfeasible`.
    Infeasible,
}

impl FailureNames {
    pub fn node(self) -> &'static str {
        match self {
            FailureNames::Failed => NODE_RESIZE_FAILED,
            FailureNames::Infeasible => NODE_RESIZE_INFEASIBLE,
        }
    }

    pub fn controller(self) -> &'static str {
        match self {
            FailureNames::Failed => CONTROLLER_RESIZE_FAILED,
            FailureNames::Infeasible => CONTROLLER_RESIZE_INFEASIBLE,
        }
    }

    /// From `/version`'s major and minor, which some distributions suffix (`31+`).
    pub fn for_version(major: &str, minor: &str) -> Option<Self> {
        let number = |s: &str| -> Option<u32> {
            let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        let (major, minor) = (number(major)?, number(minor)?);
        Some(if (major, minor) < (1, 31) {
            FailureNames::Failed
        } else {
            FailureNames::Infeasible
        })
    }

    /// True for either name of a terminal failure value.
    pub fn is_failure(value: &str) -> bool {
        [
            NODE_RESIZE_FAILED,
            NODE_RESIZE_INFEASIBLE,
            CONTROLLER_RESIZE_FAILED,
            CONTROLLER_RESIZE_INFEASIBLE,
        ]
        .contains(&value)
    }
}

/// A step of an expansion, as the claim's status shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// The resizer starts growing the volume to `target` (`allocatedResources`).
    ControllerInProgress { target: Quantity },
    /// Growing the volume failed terminally.
    ControllerFailed { message: String },
    /// The volume has grown; its node still has to grow the device view or filesystem.
    NodePending,
    /// The node starts growing the volume.
    NodeInProgress,
    /// Growing on the node failed terminally.
    NodeFailed { message: String },
    /// Done: the claim's capacity is `capacity`.
    Finished { capacity: Quantity },
}

impl Transition {
    fn is_failure(&self) -> bool {
        matches!(
            self,
            Transition::ControllerFailed { .. } | Transition::NodeFailed { .. }
        )
    }
}

fn status_value(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.status
        .as_ref()?
        .allocated_resource_statuses
        .as_ref()?
        .get(STORAGE)
        .map(String::as_str)
}

fn conditions(pvc: &PersistentVolumeClaim) -> &[PersistentVolumeClaimCondition] {
    pvc.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
}

fn storage_of(map: Option<&std::collections::BTreeMap<String, Quantity>>) -> Option<&Quantity> {
    map?.get(STORAGE)
}

pub fn capacity(pvc: &PersistentVolumeClaim) -> Option<&Quantity> {
    storage_of(pvc.status.as_ref()?.capacity.as_ref())
}

pub fn allocated(pvc: &PersistentVolumeClaim) -> Option<&Quantity> {
    storage_of(pvc.status.as_ref()?.allocated_resources.as_ref())
}

/// `status.allocatedResourceStatuses["storage"]`, if set.
pub fn resize_status(pvc: &PersistentVolumeClaim) -> Option<&str> {
    status_value(pvc)
}

fn time_json(now: &Time) -> Value {
    serde_json::to_value(now).expect("a timestamp serialises")
}

/// The patch that moves `pvc` to `transition`, or `None` when it already shows it.
pub fn plan(
    pvc: &PersistentVolumeClaim,
    transition: &Transition,
    names: FailureNames,
    now: &Time,
) -> Option<Value> {
    let mut status = Map::new();
    let mut set_value = |value: Option<&str>| {
        if status_value(pvc) != value {
            status.insert("allocatedResourceStatuses".to_string(), json!({ STORAGE: value }));
        }
    };
    // (type, message) conditions to hold True, and types to remove.
    let (upsert, remove): (Vec<(&str, Option<&str>)>, Vec<&str>) = match transition {
        Transition::ControllerInProgress { target } => {
            set_value(Some(CONTROLLER_RESIZE_IN_PROGRESS));
            if allocated(pvc) != Some(target) {
                status.insert("allocatedResources".to_string(), json!({ STORAGE: target }));
            }
            (
                vec![(RESIZING, None)],
                vec![
                    FILE_SYSTEM_RESIZE_PENDING,
                    CONTROLLER_RESIZE_ERROR,
                    NODE_RESIZE_ERROR,
                ],
            )
        }
        Transition::ControllerFailed { message } => {
            set_value(Some(names.controller()));
            (vec![(CONTROLLER_RESIZE_ERROR, Some(message.as_str()))], vec![])
        }
        Transition::NodePending => {
            set_value(Some(NODE_RESIZE_PENDING));
            (
                vec![(FILE_SYSTEM_RESIZE_PENDING, Some(FS_RESIZE_PENDING_MESSAGE))],
                vec![RESIZING, CONTROLLER_RESIZE_ERROR],
            )
        }
        Transition::NodeInProgress => {
            set_value(Some(NODE_RESIZE_IN_PROGRESS));
            (vec![], vec![])
        }
        Transition::NodeFailed { message } => {
            set_value(Some(names.node()));
            (vec![(NODE_RESIZE_ERROR, Some(message.as_str()))], vec![])
        }
        Transition::Finished { capacity: size } => {
            set_value(None);
            if capacity(pvc) != Some(size) {
                status.insert("capacity".to_string(), json!({ STORAGE: size }));
            }
            (vec![], RESIZE_CONDITIONS.to_vec())
        }
    };
    let existing = conditions(pvc);
    let mut entries = Vec::new();
    for (kind, message) in upsert {
        let current = existing.iter().find(|c| c.type_ == kind);
        let message = message.map(truncate);
        if current.is_some_and(|c| c.status == "True" && c.message == message) {
            continue;
        }
        // A condition that stays True keeps the time it became True.
        let since = match current {
            Some(c) if c.status == "True" => c
                .last_transition_time
                .as_ref()
                .map_or_else(|| time_json(now), time_json),
            _ => time_json(now),
        };
        let mut entry = json!({ "type": kind, "status": "True", "lastTransitionTime": since });
        if let Some(message) = message {
            entry["message"] = Value::String(message);
        }
        entries.push(entry);
    }
    for kind in remove {
        if existing.iter().any(|c| c.type_ == kind) {
            entries.push(json!({ "$patch": "delete", "type": kind }));
        }
    }
    if !entries.is_empty() {
        status.insert("conditions".to_string(), Value::Array(entries));
    }
    if status.is_empty() {
        return None;
    }
    Some(json!({
        "metadata": { "resourceVersion": pvc.metadata.resource_version },
        "status": status,
    }))
}

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error(
        "PersistentVolumeClaim {claim} changed during each of {ATTEMPTS} attempts to write its resize status"
    )]
    Conflict { claim: String },
}

impl Terminal for StatusError {
    fn is_terminal(&self) -> bool {
        match self {
            StatusError::Api(e) => e.is_terminal(),
            // Someone else wrote first each time: asking again may work.
            StatusError::Conflict { .. } => false,
        }
    }
}

/// Writes claims' resize status for one API server.
pub struct ClaimStatus {
    client: Client,
    failure: FailureValue,
    detected: OnceCell<FailureNames>,
}

impl std::fmt::Debug for ClaimStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimStatus")
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

impl ClaimStatus {
    pub fn new(client: Client, failure: FailureValue) -> Self {
        Self {
            client,
            failure,
            detected: OnceCell::new(),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    fn api(&self, namespace: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), namespace)
    }

    pub async fn get(&self, namespace: &str, name: &str) -> Result<PersistentVolumeClaim, StatusError> {
        Ok(call(
            || format!("get PersistentVolumeClaim {namespace}/{name}"),
            self.api(namespace).get(name),
        )
        .await?)
    }

    /// The failure value names: as forced by the flag, else from the server's version
    /// (asked once; a failed ask is retried at the next failure, and this one uses the
    /// current names).
    pub async fn names(&self) -> FailureNames {
        match self.failure {
            FailureValue::NodeResizeFailed => FailureNames::Failed,
            FailureValue::NodeResizeInfeasible => FailureNames::Infeasible,
            FailureValue::Auto => {
                let detected = self
                    .detected
                    .get_or_try_init(|| async {
                        let info =
                            call(|| "get /version".to_string(), self.client.apiserver_version()).await?;
                        let names = FailureNames::for_version(&info.major, &info.minor);
                        info!(
                            server.version = %info.git_version,
                            names = ?names,
                            "resize failure value chosen from the API server's version"
                        );
                        Ok::<_, StatusError>(names.unwrap_or(FailureNames::Infeasible))
                    })
                    .await;
                match detected {
                    Ok(names) => *names,
                    Err(e) => {
                        warn!(error = %e, "cannot read the API server's version; using NodeResizeInfeasible");
                        FailureNames::Infeasible
                    }
                }
            }
        }
    }

    /// Moves the claim to `transition`, planned from `pvc` and guarded by its
    /// resourceVersion; re-reads and re-plans after a conflict. Returns the claim as
    /// last seen (unchanged when it already showed the transition).
    pub async fn apply(
        &self,
        mut pvc: PersistentVolumeClaim,
        transition: &Transition,
    ) -> Result<PersistentVolumeClaim, StatusError> {
        let namespace = pvc.metadata.namespace.clone().unwrap_or_default();
        let name = pvc.metadata.name.clone().unwrap_or_default();
        let names = if transition.is_failure() {
            self.names().await
        } else {
            FailureNames::Infeasible
        };
        for attempt in 1..=ATTEMPTS {
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            let Some(patch) = plan(&pvc, transition, names, &now) else {
                return Ok(pvc);
            };
            let result = patch_status(
                &self.api(&namespace),
                || format!("patch PersistentVolumeClaim {namespace}/{name} status"),
                &name,
                patch,
            )
            .await;
            match result {
                Ok(updated) => return Ok(updated),
                Err(ApiError::Conflict { .. }) if attempt < ATTEMPTS => {
                    info!(pvc = %format!("{namespace}/{name}"), attempt, "claim changed meanwhile; reading it again");
                    pvc = self.get(&namespace, &name).await?;
                }
                Err(ApiError::Conflict { .. }) => {
                    return Err(StatusError::Conflict {
                        claim: format!("{namespace}/{name}"),
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        unreachable!("the last attempt returns")
    }
}

#[cfg(test)]
mod tests;
