//! A claim's resize status, written the way kubelet and external-resizer write it, and
//! guarded by the claim's resourceVersion: on 409 Conflict the claim is read again, the
//! patch planned again, and sent again, a bounded number of times.
//!
//! This decides what each step of an expansion shows ([`wanted`]: the status value and
//! the conditions kubelet and external-resizer use); the patch that says it, and the
//! reads and writes, are [`crate::k8s::claim_resize`]'s. Planning is pure: from the
//! claim as read and the wanted transition to the patch, or to nothing when the claim
//! already shows it (a repeated call writes nothing).

use tokio::sync::OnceCell;
use tracing::{info, warn};

use super::FailureValue;
use crate::k8s::api::ApiError;
use crate::k8s::claim_resize::{self, Claim, ResizeApi, WantedStatus};
use crate::model::Terminal;

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
    ControllerInProgress { target: String },
    /// Growing the volume failed terminally.
    ControllerFailed { message: String },
    /// The volume has grown; its node still has to grow the device view or filesystem.
    NodePending,
    /// The node starts growing the volume.
    NodeInProgress,
    /// Growing on the node failed terminally.
    NodeFailed { message: String },
    /// Done: the claim's capacity is `capacity`.
    Finished { capacity: String },
}

impl Transition {
    fn is_failure(&self) -> bool {
        matches!(
            self,
            Transition::ControllerFailed { .. } | Transition::NodeFailed { .. }
        )
    }
}

/// What the claim is to show after `transition`: the status value (a failure by the
/// name the server knows, `names`), the sizes, and the resize conditions to hold or to
/// remove. Conditions of other types are left alone.
pub fn wanted(transition: &Transition, names: FailureNames) -> WantedStatus {
    let hold = |kind: &'static str, message: Option<&str>| vec![(kind, message.map(str::to_string))];
    match transition {
        Transition::ControllerInProgress { target } => WantedStatus {
            value: Some(CONTROLLER_RESIZE_IN_PROGRESS),
            allocated: Some(target.clone()),
            hold: hold(RESIZING, None),
            remove: vec![
                FILE_SYSTEM_RESIZE_PENDING,
                CONTROLLER_RESIZE_ERROR,
                NODE_RESIZE_ERROR,
            ],
            ..WantedStatus::default()
        },
        Transition::ControllerFailed { message } => WantedStatus {
            value: Some(names.controller()),
            hold: hold(CONTROLLER_RESIZE_ERROR, Some(message.as_str())),
            ..WantedStatus::default()
        },
        Transition::NodePending => WantedStatus {
            value: Some(NODE_RESIZE_PENDING),
            hold: hold(FILE_SYSTEM_RESIZE_PENDING, Some(FS_RESIZE_PENDING_MESSAGE)),
            remove: vec![RESIZING, CONTROLLER_RESIZE_ERROR],
            ..WantedStatus::default()
        },
        Transition::NodeInProgress => WantedStatus {
            value: Some(NODE_RESIZE_IN_PROGRESS),
            ..WantedStatus::default()
        },
        Transition::NodeFailed { message } => WantedStatus {
            value: Some(names.node()),
            hold: hold(NODE_RESIZE_ERROR, Some(message.as_str())),
            ..WantedStatus::default()
        },
        Transition::Finished { capacity } => WantedStatus {
            value: None,
            capacity: Some(capacity.clone()),
            remove: RESIZE_CONDITIONS.to_vec(),
            ..WantedStatus::default()
        },
    }
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
    api: ResizeApi,
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
    pub fn new(api: ResizeApi, failure: FailureValue) -> Self {
        Self {
            api,
            failure,
            detected: OnceCell::new(),
        }
    }

    pub async fn get(&self, namespace: &str, name: &str) -> Result<Claim, StatusError> {
        Ok(self.api.claim(namespace, name).await?)
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
                        let info = self.api.server_version().await?;
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
    pub async fn apply(&self, mut pvc: Claim, transition: &Transition) -> Result<Claim, StatusError> {
        let namespace = pvc.namespace().unwrap_or_default().to_string();
        let name = pvc.name().unwrap_or_default().to_string();
        let names = if transition.is_failure() {
            self.names().await
        } else {
            FailureNames::Infeasible
        };
        let wanted = wanted(transition, names);
        for attempt in 1..=ATTEMPTS {
            let Some(patch) = claim_resize::plan_now(&pvc, &wanted) else {
                return Ok(pvc);
            };
            let result = self.api.patch_claim_status(&namespace, &name, patch).await;
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
