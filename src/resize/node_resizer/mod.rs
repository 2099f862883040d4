//! `--node-resizer`: localvol as the resizer of the claims whose volumes live on its
//! node, for clusters where no central external-resizer serves localvol.csi.dev (a
//! DaemonSet alone then supports expansion).
//!
//! For a bound claim that asks for more than its capacity, whose StorageClass allows
//! expansion and whose volume is on this node, it does what external-resizer does:
//! `ControllerResizeInProgress` (with `allocatedResources`), grow the volume
//! (`Volumes::expand`, under the volume lock), record the size on the
//! PersistentVolume, then either `NodeResizePending` with a `FileSystemResizePending`
//! condition (kubelet finishes with NodeExpandVolume when the claim is mounted) or, for
//! a volume that needs nothing on the node, the new capacity. A terminal failure
//! becomes `ControllerResizeInfeasible` and a `ControllerResizeError` condition, and is
//! not retried until the claim asks for another size; a transient one is retried.
//!
//! Finding its claims: each volume records the claim it was created for
//! (`--extra-create-metadata`), so the node knows its claims by name. Every
//! [`LABEL_INTERVAL`] the node labels the claims of its volumes that it has not
//! labelled yet ([`crate::k8s::claim_label`], one PATCH per claim), and one watch of
//! claims with this node's label triggers work: the API server sends this node only its
//! own claims' events, so its traffic does not grow with the cluster's claims. Claims
//! that need something are queued, and each is read fresh from the API before anything
//! is decided, so no claim cache is kept. Every claim of this node is also looked at
//! every [`RESYNC`], in case an event was missed.
//!
//! Concurrency: one claim at a time on this node; the volume lock excludes CSI calls on
//! the same volume; every status write is guarded by the claim's resourceVersion and
//! the PersistentVolume update by the volume's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{debug, info};

use super::claim_status::{self, ATTEMPTS, ClaimStatus, FailureNames, StatusError, Transition};
use super::classify::{Cause, Failure, classify};
use super::events::{self, ClaimEvents};
use super::quantity;
use super::{FailureValue, ResizeError};
use crate::k8s::api::ApiError;
use crate::k8s::claim_label::ClaimLabels;
use crate::k8s::claim_resize::{Claim, ResizeApi, Volume};
use crate::locks::VolumeLocks;
use crate::model::CapacityRange;
use crate::model::DRIVER_NAME;
use crate::model::VolumeId;
use crate::model::full_message;
use crate::request::ControllerExpandRequest;
use crate::volume::{VolumeError, Volumes};

mod run;

pub use run::run;

/// How often every claim of this node is looked at even without an event.
pub const RESYNC: Duration = Duration::from_secs(300);
/// Wait before retrying after a transient failure.
pub const RETRY: Duration = Duration::from_secs(15);
/// Wait before retrying after an API answer that will not change by itself (403, 422).
pub const SLOW_RETRY: Duration = Duration::from_secs(300);
/// How often the node's own volume list is read for claims to label (a new claim is
/// watched from then on). Reads only local records; the API sees one PATCH per new
/// claim.
pub const LABEL_INTERVAL: Duration = Duration::from_secs(10);

/// A claim by namespace and name.
pub type Key = (String, String);

/// What became of one look at a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing (more) to do until the claim changes.
    Done,
    /// Look again after this long.
    RetryAfter(Duration),
}

/// One of this node's volumes, by its claim.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LocalVolume {
    id: VolumeId,
    pv_name: Option<String>,
}

#[derive(Debug, Default)]
struct LocalClaims {
    by_claim: HashMap<Key, LocalVolume>,
}

pub struct NodeResizer {
    api: ResizeApi,
    status: ClaimStatus,
    events: ClaimEvents,
    volumes: Arc<Volumes>,
    locks: VolumeLocks,
    local: Mutex<LocalClaims>,
    labels: ClaimLabels,
    node: String,
}

impl std::fmt::Debug for NodeResizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeResizer").finish_non_exhaustive()
    }
}

fn key_of(pvc: &Claim) -> Key {
    (
        pvc.namespace().unwrap_or_default().to_string(),
        pvc.name().unwrap_or_default().to_string(),
    )
}

fn bytes(q: Option<&str>) -> Option<u64> {
    q.and_then(quantity::bytes)
}

/// Whether a claim may need the resizer: bound, and asking for more than it has or
/// showing a resize state. Cheap, from the object alone.
pub fn wants_attention(pvc: &Claim) -> bool {
    let bound = pvc.is_bound() && pvc.volume_name().is_some();
    let grow = match (bytes(pvc.requested()), bytes(pvc.capacity())) {
        (Some(want), Some(have)) => want > have,
        _ => false,
    };
    bound && !pvc.is_deleting() && (grow || pvc.resize_status().is_some())
}

fn pv_capacity(pv: &Volume) -> Option<u64> {
    bytes(pv.capacity())
}

impl NodeResizer {
    pub fn new(
        api: ResizeApi,
        node: &str,
        failure: FailureValue,
        volumes: Arc<Volumes>,
        locks: VolumeLocks,
        labels: ClaimLabels,
    ) -> Self {
        Self {
            status: ClaimStatus::new(api.clone(), failure),
            events: ClaimEvents::new(&api, node),
            labels,
            node: node.to_string(),
            api,
            volumes,
            locks,
            local: Mutex::default(),
        }
    }

    /// Re-reads this node's volumes (their recorded claims).
    async fn refresh_local(&self) -> Result<(), VolumeError> {
        let records = self.volumes.list().await?;
        let by_claim = records
            .into_iter()
            .filter_map(|r| {
                let key = (r.claim.pvc_namespace?, r.claim.pvc_name?);
                Some((
                    key,
                    LocalVolume {
                        id: r.id,
                        pv_name: r.claim.pv_name,
                    },
                ))
            })
            .collect();
        let mut local = self.local.lock().unwrap_or_else(|p| p.into_inner());
        local.by_claim = by_claim;
        Ok(())
    }

    fn cached(&self, key: &Key) -> Option<LocalVolume> {
        let local = self.local.lock().unwrap_or_else(|p| p.into_inner());
        local.by_claim.get(key).cloned()
    }

    /// This node's volume for the claim, re-reading the volume list (local records) on
    /// a miss. The watch shows only claims labelled for this node, so a miss means the
    /// list is older than the label: the owner check labels a claim at its volume's
    /// first stage, and an event dropped here would wait for the next resync.
    async fn local_volume(&self, key: &Key) -> Result<Option<LocalVolume>, VolumeError> {
        if let Some(found) = self.cached(key) {
            return Ok(Some(found));
        }
        self.refresh_local().await?;
        Ok(self.cached(key))
    }

    /// Every claim this node has a volume for.
    async fn local_keys(&self) -> Result<Vec<Key>, VolumeError> {
        self.refresh_local().await?;
        let local = self.local.lock().unwrap_or_else(|p| p.into_inner());
        Ok(local.by_claim.keys().cloned().collect())
    }

    /// Labels the claims of this node's volumes that are not labelled yet.
    pub(super) async fn label_local(&self) -> Result<(), VolumeError> {
        let keys = self.local_keys().await?;
        self.labels.ensure(keys).await;
        Ok(())
    }

    /// Looks at one claim and does the next steps of its expansion.
    pub async fn reconcile(&self, key: &Key) -> Result<Outcome, ResizeError> {
        let (namespace, name) = key;
        let Some(local) = self.local_volume(key).await? else {
            return Ok(Outcome::Done);
        };
        let pvc = match self.status.get(namespace, name).await {
            Ok(pvc) => pvc,
            Err(StatusError::Api(ApiError::NotFound { .. })) => return Ok(Outcome::Done),
            Err(e) => return Err(e.into()),
        };
        if !wants_attention(&pvc) {
            return Ok(Outcome::Done);
        }
        let pv_name = pvc.volume_name().unwrap_or_default().to_string();
        if local.pv_name.as_ref().is_some_and(|ours| *ours != pv_name) {
            debug!(pvc = %format!("{namespace}/{name}"), "claim is bound to another volume than this node's");
            return Ok(Outcome::Done);
        }
        let (Some(want), Some(have)) = (bytes(pvc.requested()), bytes(pvc.capacity())) else {
            return Ok(Outcome::Done);
        };
        let current = pvc.resize_status().map(str::to_string);
        // A terminal failure at this size waits for the claim to ask for another one.
        if current.as_deref().is_some_and(FailureNames::is_failure) && bytes(pvc.allocated()) == Some(want) {
            return Ok(Outcome::Done);
        }
        let pv = self.api.volume(&pv_name).await.map_err(StatusError::from)?;
        if !pv
            .csi()
            .is_some_and(|(driver, handle)| driver == DRIVER_NAME && handle == local.id.to_string())
        {
            debug!(pv = %pv_name, "volume is not this node's localvol volume");
            return Ok(Outcome::Done);
        }
        let pv_size = pv_capacity(&pv).unwrap_or(0);
        if want <= have {
            // Nothing to grow. A controller state left from an attempt the claim no
            // longer asks for is cleared; node states are kubelet's to finish.
            let stale = current.as_deref().is_some_and(|v| {
                v == claim_status::CONTROLLER_RESIZE_IN_PROGRESS
                    || v == claim_status::CONTROLLER_RESIZE_FAILED
                    || v == claim_status::CONTROLLER_RESIZE_INFEASIBLE
            });
            if stale && pv_size <= have {
                let capacity = pvc.capacity().map(str::to_string).expect("checked above");
                self.status.apply(pvc, &Transition::Finished { capacity }).await?;
            }
            return Ok(Outcome::Done);
        }
        if matches!(
            current.as_deref(),
            Some(claim_status::NODE_RESIZE_PENDING | claim_status::NODE_RESIZE_IN_PROGRESS)
        ) && pv_size >= want
        {
            // The volume has grown; kubelet finishes on the node.
            return Ok(Outcome::Done);
        }
        if !self.expansion_allowed(&pvc).await? {
            info!(pvc = %format!("{namespace}/{name}"), "StorageClass does not allow expansion; not resizing");
            return Ok(Outcome::Done);
        }
        self.grow(pvc, &local, want, pv).await
    }

    async fn expansion_allowed(&self, pvc: &Claim) -> Result<bool, StatusError> {
        let Some(class) = pvc.storage_class().filter(|c| !c.is_empty()) else {
            return Ok(false);
        };
        Ok(self.api.expansion_allowed(class).await?)
    }

    /// The controller step and what follows it.
    async fn grow(
        &self,
        pvc: Claim,
        local: &LocalVolume,
        want: u64,
        pv: Volume,
    ) -> Result<Outcome, ResizeError> {
        let target = pvc
            .requested()
            .map(str::to_string)
            .expect("wants_attention checked the request");
        let starting = pvc.resize_status() != Some(claim_status::CONTROLLER_RESIZE_IN_PROGRESS);
        let pvc = self
            .status
            .apply(
                pvc,
                &Transition::ControllerInProgress {
                    target: target.clone(),
                },
            )
            .await?;
        if starting {
            self.events
                .normal(
                    &pvc,
                    events::RESIZING,
                    &format!("localvol is growing volume {} to {target}", local.id),
                )
                .await;
        }
        let expanded = {
            let guard = self
                .locks
                .try_lock(&local.id.token, "NodeResizer")
                .map_err(ResizeError::from);
            match guard {
                Ok(guard) => {
                    let req = ControllerExpandRequest {
                        id: local.id.clone(),
                        capacity: CapacityRange {
                            required: want,
                            limit: None,
                        },
                        capability: None,
                    };
                    self.volumes.expand(&guard, &req).await.map_err(ResizeError::from)
                }
                Err(busy) => Err(busy),
            }
        };
        let expanded = match expanded {
            Ok(expanded) => expanded,
            Err(error) => {
                let message = full_message(&error);
                return match classify(Cause::Operation(&error)) {
                    Failure::Terminal => {
                        let failed = Transition::ControllerFailed {
                            message: format!("failed to expand the volume: {message}"),
                        };
                        let pvc = self.status.apply(pvc, &failed).await?;
                        self.events
                            .warning(&pvc, events::VOLUME_RESIZE_FAILED, &message)
                            .await;
                        Ok(Outcome::Done)
                    }
                    Failure::Transient => {
                        self.events
                            .warning(
                                &pvc,
                                events::VOLUME_RESIZE_RETRYING,
                                &format!("will be retried: {message}"),
                            )
                            .await;
                        Ok(Outcome::RetryAfter(RETRY))
                    }
                };
            }
        };
        self.record_pv_size(pv, expanded.size_bytes).await?;
        let size = quantity::format(expanded.size_bytes);
        if expanded.node_expansion_required {
            let pvc = self.status.apply(pvc, &Transition::NodePending).await?;
            self.events
                .normal(
                    &pvc,
                    events::FILE_SYSTEM_RESIZE_REQUIRED,
                    &format!(
                        "volume {} is now {}; its node finishes growing it when the claim is mounted",
                        local.id, size
                    ),
                )
                .await;
        } else {
            let pvc = self
                .status
                .apply(
                    pvc,
                    &Transition::Finished {
                        capacity: size.clone(),
                    },
                )
                .await?;
            self.events
                .normal(
                    &pvc,
                    events::VOLUME_RESIZE_SUCCESSFUL,
                    &format!("volume {} is now {size}", local.id),
                )
                .await;
        }
        Ok(Outcome::Done)
    }

    /// Sets the PersistentVolume's capacity to `size` (never lowers it), replacing the
    /// object read so the update lands only on that version; re-reads after a conflict.
    async fn record_pv_size(&self, mut pv: Volume, size: u64) -> Result<(), StatusError> {
        let name = pv.name().to_string();
        for attempt in 1..=ATTEMPTS {
            if pv_capacity(&pv).is_some_and(|have| have >= size) {
                return Ok(());
            }
            pv.set_capacity(quantity::format(size));
            let result = self.api.replace_volume(&name, &pv).await;
            match result {
                Ok(_) => return Ok(()),
                Err(ApiError::Conflict { .. }) if attempt < ATTEMPTS => {
                    pv = self.api.volume(&name).await?;
                }
                Err(ApiError::Conflict { .. }) => return Err(StatusError::Conflict { claim: name }),
                Err(e) => return Err(e.into()),
            }
        }
        unreachable!("the last attempt returns")
    }
}
