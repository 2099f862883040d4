//! The ownership check against the API: find the claim behind a volume, read the pods the
//! rules in [`super::owner`] need, decide, and on a refusal record events.
//!
//! A first attempt reads from caches. A refusal, or a claim not found, that rests on
//! anything cached is only returned after a second attempt from the API alone: a cache
//! "is just a cache, and may be out of date", and a refusal blocks a pod.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Client;
use kube::runtime::reflector::Store;
use tracing::{debug, warn};

use super::api::API_TIMEOUT;
use super::events::Recorder;
use super::lookup::{Lookup, OBJECT_TTL, Read, Source};
use super::owner::OwnerError;
use super::owner::{self, ClaimView, Decision, ObjectId, PodView};
use super::prefetch::Prefetch;
use super::reflect::Synced;
use crate::model::ClaimRef;
use crate::model::DRIVER_NAME;
use crate::request::{PodInfo, PublishRequest, StageRequest, VolumeContext};
use crate::volume_states::ConditionChange;

#[derive(Debug)]
pub struct Checker {
    lookup: Arc<Lookup>,
    events: Recorder,
    synced: Synced,
    node: String,
    /// Reads new volumes' claims as their pods arrive; none in tests that build the
    /// check without its pod watch.
    prefetch: Option<Prefetch>,
}

/// One attempt's decision, whether it rested on a cached read, and the pods to tell.
struct Attempt {
    decision: Decision,
    cached: bool,
    pods: Vec<ObjectId>,
}

impl Checker {
    pub fn new(client: Client, pods: Store<Pod>, synced: Synced, node: String) -> Self {
        Self::with_timings(client, pods, synced, node, OBJECT_TTL, API_TIMEOUT)
    }

    pub fn with_timings(
        client: Client,
        pods: Store<Pod>,
        synced: Synced,
        node: String,
        ttl: Duration,
        timeout: Duration,
    ) -> Self {
        let lookup = Lookup::new(client.clone(), pods, synced.clone(), ttl, timeout);
        Self::over(client, Arc::new(lookup), synced, node, timeout)
    }

    /// The check reading through `lookup`; its events time out after `timeout`.
    pub(super) fn over(
        client: Client,
        lookup: Arc<Lookup>,
        synced: Synced,
        node: String,
        timeout: Duration,
    ) -> Self {
        Self {
            events: Recorder::driver(client, &node, timeout),
            lookup,
            synced,
            node,
            prefetch: None,
        }
    }

    pub(super) fn with_prefetch(mut self, prefetch: Prefetch) -> Self {
        self.prefetch = Some(prefetch);
        self
    }

    /// A volume was created for `claim` (see `prefetch`).
    pub fn expect(&self, claim: &ClaimRef) {
        if let Some((prefetch, namespace, name)) = self.prefetch_of(claim) {
            prefetch.expect(namespace, name);
        }
    }

    /// The claim read ahead, by namespace and name, when there is a prefetch and the
    /// claim is named.
    fn prefetch_of<'a>(&'a self, claim: &'a ClaimRef) -> Option<(&'a Prefetch, &'a str, &'a str)> {
        Some((
            self.prefetch.as_ref()?,
            claim.pvc_namespace.as_deref()?,
            claim.pvc_name.as_deref()?,
        ))
    }

    /// A Warning on `claim`, when it is named, as [`Recorder::claim_warning`] makes it.
    pub async fn claim_warning(&self, claim: &ClaimRef, reason: &str, action: &str, note: &str) {
        if let (Some(namespace), Some(name)) = (&claim.pvc_namespace, &claim.pvc_name) {
            self.events
                .claim_warning(namespace, name, reason, action, note)
                .await;
        }
    }

    pub async fn stage(&self, volume: &str, context: &VolumeContext) -> Result<(), OwnerError> {
        self.run("NodeStageVolume", volume, context, |source| {
            self.stage_attempt(volume, &context.claim, source)
        })
        .await
    }

    pub async fn publish(&self, volume: &str, context: &VolumeContext) -> Result<(), OwnerError> {
        self.run("NodePublishVolume", volume, context, |source| {
            self.publish_attempt(volume, context, source)
        })
        .await
    }

    async fn run<'a, F, Fut>(
        &'a self,
        action: &str,
        volume: &str,
        context: &VolumeContext,
        attempt: F,
    ) -> Result<(), OwnerError>
    where
        F: Fn(Source) -> Fut,
        Fut: Future<Output = Result<Option<Attempt>, OwnerError>> + 'a,
    {
        // Without a claim (standalone use, csi-sanity) there is nothing to check, and no
        // cache is needed to know that.
        if context.claim == ClaimRef::default() {
            debug!("no Kubernetes claim in the volume context: no owner check");
            return Ok(());
        }
        if !self.synced.get() {
            return Err(OwnerError::NotSynced);
        }
        // Read now: no longer to be read ahead when a pod using it appears.
        if let Some((prefetch, namespace, name)) = self.prefetch_of(&context.claim) {
            prefetch.settled(namespace, name);
        }
        let first = match attempt(Source::Cache).await {
            Err(OwnerError::ClaimNotFound { cached: true, .. }) => {
                debug!("no claim found on cached reads; reading again from the API");
                attempt(Source::Api).await?
            }
            other => other?,
        };
        let Some(mut result) = first else {
            return Ok(());
        };
        if matches!(result.decision, Decision::Refused(_)) && result.cached {
            debug!("refusal rests on cached reads; reading again from the API");
            match attempt(Source::Api).await? {
                Some(fresh) => result = fresh,
                None => return Ok(()),
            }
        }
        match result.decision {
            Decision::Allowed => Ok(()),
            Decision::Refused(refusal) => {
                warn!(volume.id = volume, %refusal, "{action} refused");
                self.events.refused(action, &refusal, &result.pods).await;
                Err(OwnerError::Refused(refusal))
            }
        }
    }

    /// The claim behind the volume: named in the volume context, else found through the
    /// PV (its `claimRef`). A context naming a claim bound to another PV is stale (the PV
    /// was re-bound); the PV then decides. None: no claim is known at all.
    async fn claim(
        &self,
        volume: &str,
        claim: &ClaimRef,
        source: Source,
    ) -> Result<Option<Read<ClaimView>>, OwnerError> {
        if let (Some(namespace), Some(name)) = (&claim.pvc_namespace, &claim.pvc_name) {
            // The claim of that name is this volume's only while it is bound to the
            // volume's PV: it may have been deleted and made again since (a pod
            // recreated with its ephemeral volume: the garbage collector deletes the old
            // claim and the ephemeral volume controller makes a new one for the new
            // pod, unbound or bound to a new volume). Kubelet stages a volume only once
            // its claim is bound, so a claim not bound here is another claim.
            let not_bound_here = |pvc: &PersistentVolumeClaim| {
                let bound = pvc.spec.as_ref().and_then(|s| s.volume_name.as_ref());
                claim.pv_name.as_ref().is_some_and(|pv| bound != Some(pv))
            };
            // One cached before it was bound or made again: read it again rather than go
            // looking through the PV.
            let found = match self.lookup.pvc(namespace, name, source).await? {
                Some(read) if read.cached && not_bound_here(&read.value) => {
                    self.lookup.pvc(namespace, name, Source::Api).await?
                }
                found => found,
            };
            match found {
                Some(read) => {
                    let view = ClaimView::from_pvc(&read.value);
                    match (&claim.pv_name, &view.volume_name) {
                        (Some(pv), bound) if bound.as_ref() != Some(pv) => {
                            debug!(pvc = %view.id, pv, bound = bound.as_deref().unwrap_or("<none>"),
                                "the claim in the volume context is not bound to this volume's PV");
                        }
                        _ => {
                            return Ok(Some(Read {
                                value: view,
                                cached: read.cached,
                            }));
                        }
                    }
                }
                None if claim.pv_name.is_none() => {
                    return Err(OwnerError::ClaimNotFound {
                        volume: volume.to_string(),
                        reason: format!("PersistentVolumeClaim {namespace}/{name} does not exist"),
                        // Only found objects are cached: a miss was asked.
                        cached: false,
                    });
                }
                None => {}
            }
        }
        let Some(pv_name) = &claim.pv_name else {
            return Ok(None);
        };
        self.claim_from_pv(volume, pv_name, source).await.map(Some)
    }

    async fn claim_from_pv(
        &self,
        volume: &str,
        pv_name: &str,
        source: Source,
    ) -> Result<Read<ClaimView>, OwnerError> {
        let not_found = |reason: String, cached: bool| OwnerError::ClaimNotFound {
            volume: volume.to_string(),
            reason,
            cached,
        };
        let pv = self
            .lookup
            .pv(pv_name, source)
            .await?
            .ok_or_else(|| not_found(format!("PersistentVolume {pv_name} does not exist"), false))?;
        let spec = pv.value.spec.as_ref();
        let csi = spec.and_then(|s| s.csi.as_ref());
        if csi.is_none_or(|c| c.driver != DRIVER_NAME || c.volume_handle != volume) {
            return Err(not_found(
                format!("PersistentVolume {pv_name} is not this volume of {DRIVER_NAME}"),
                pv.cached,
            ));
        }
        let claim_ref = spec
            .and_then(|s| s.claim_ref.as_ref())
            .ok_or_else(|| not_found(format!("PersistentVolume {pv_name} is not bound"), pv.cached))?;
        let (Some(namespace), Some(name)) = (&claim_ref.namespace, &claim_ref.name) else {
            return Err(not_found(
                format!("PersistentVolume {pv_name} has an incomplete claimRef"),
                pv.cached,
            ));
        };
        let pvc = self.lookup.pvc(namespace, name, source).await?.ok_or_else(|| {
            not_found(
                format!("PersistentVolume {pv_name} is bound to {namespace}/{name}, which does not exist"),
                pv.cached,
            )
        })?;
        let view = ClaimView::from_pvc(&pvc.value);
        if claim_ref.uid.as_ref().is_some_and(|uid| *uid != view.id.uid) {
            return Err(not_found(
                format!(
                    "PersistentVolume {pv_name} is bound to {namespace}/{name} with another uid than {}",
                    view.id.uid
                ),
                pv.cached || pvc.cached,
            ));
        }
        Ok(Read {
            value: view,
            cached: pv.cached || pvc.cached,
        })
    }

    async fn stage_attempt(
        &self,
        volume: &str,
        claim: &ClaimRef,
        source: Source,
    ) -> Result<Option<Attempt>, OwnerError> {
        let Some(claim) = self.claim(volume, claim, source).await? else {
            return Ok(None);
        };
        let mut cached = claim.cached;
        let claim = claim.value;
        let owner = match claim.pod_controller() {
            None => None,
            Some(controller) => {
                let pod = self
                    .lookup
                    .pod(&claim.id.namespace, &controller.name, source, |p| {
                        p.metadata.uid.as_deref() == Some(controller.uid.as_str())
                    })
                    .await?;
                cached |= pod.as_ref().is_some_and(|p| p.cached);
                pod.map(|p| PodView::from_pod(&p.value))
            }
        };
        let decision = owner::decide_stage(&claim, &self.node, owner.as_ref());
        // The pods waiting for this volume are the ones on this node that name the claim.
        let pods = match decision {
            Decision::Allowed => Vec::new(),
            Decision::Refused(_) => self
                .lookup
                .cached_pods(|p| PodView::from_pod(p).uses(&claim.id))
                .iter()
                .map(|p| PodView::from_pod(p).id)
                .collect(),
        };
        Ok(Some(Attempt {
            decision,
            cached,
            pods,
        }))
    }

    async fn publish_attempt(
        &self,
        volume: &str,
        context: &VolumeContext,
        source: Source,
    ) -> Result<Option<Attempt>, OwnerError> {
        let Some(claim) = self.claim(volume, &context.claim, source).await? else {
            return Ok(None);
        };
        let mut cached = claim.cached;
        let claim = claim.value;
        let Some(requester) = &context.pod else {
            return Err(OwnerError::NoPodInfo {
                volume: volume.to_string(),
                pvc: claim.id.to_string(),
            });
        };
        let pod = if owner::publish_needs_pod(&claim) {
            let pod = self.requester(requester, source).await?;
            cached |= pod.as_ref().is_some_and(|p| p.cached);
            pod.map(|p| PodView::from_pod(&p.value))
        } else {
            None
        };
        Ok(Some(Attempt {
            decision: owner::decide_publish(&claim, requester, pod.as_ref()),
            cached,
            pods: vec![ObjectId {
                namespace: requester.namespace.clone(),
                name: requester.name.clone(),
                uid: requester.uid.clone(),
            }],
        }))
    }

    /// The pod a publish is for, by name and with the UID kubelet gave.
    async fn requester(&self, pod: &PodInfo, source: Source) -> Result<Option<Read<Arc<Pod>>>, OwnerError> {
        let same_uid = |p: &Pod| p.metadata.uid.as_deref() == Some(pod.uid.as_str());
        let found = self
            .lookup
            .pod(&pod.namespace, &pod.name, source, same_uid)
            .await?;
        Ok(found.filter(|p| same_uid(&p.value)))
    }
}

/// The check held by the CSI driver: off (standalone) or against the API server.
#[derive(Debug, Clone)]
pub enum OwnerCheck {
    Off,
    On(Arc<Checker>),
}

impl OwnerCheck {
    pub async fn before_stage(&self, req: &StageRequest) -> Result<(), OwnerError> {
        match self {
            OwnerCheck::Off => Ok(()),
            OwnerCheck::On(checker) => checker.stage(&req.id.to_string(), &req.context).await,
        }
    }

    pub async fn before_publish(&self, req: &PublishRequest) -> Result<(), OwnerError> {
        match self {
            OwnerCheck::Off => Ok(()),
            OwnerCheck::On(checker) => checker.publish(&req.id.to_string(), &req.context).await,
        }
    }

    /// A stage failed on the volume itself in a way only someone acting on the claim's
    /// objects can fix (an encrypted volume that did not open): a Warning on the claim,
    /// so that `kubectl describe pvc` says why. Nothing without the API.
    pub async fn stage_failed(&self, req: &StageRequest, reason: &str, note: &str) {
        if let OwnerCheck::On(checker) = self {
            checker
                .claim_warning(&req.context.claim, reason, "NodeStageVolume", note)
                .await;
        }
    }

    /// NodeGetVolumeStats found volume `volume`'s condition changed: an event on its
    /// claim when it is named, in the background (stats do not wait for the API).
    /// Nothing without the API.
    pub fn condition_changed(&self, claim: &ClaimRef, volume: &str, change: ConditionChange) {
        let OwnerCheck::On(checker) = self else {
            return;
        };
        let (Some(namespace), Some(name)) = (claim.pvc_namespace.clone(), claim.pvc_name.clone()) else {
            return;
        };
        let (checker, volume) = (checker.clone(), volume.to_string());
        drop(tokio::spawn(async move {
            checker
                .events
                .volume_condition(&namespace, &name, &volume, &change)
                .await
        }));
    }

    /// CreateVolume made a volume for `claim`: its stage will need the claim, which is
    /// read as soon as the pod using it is bound to this node (see `prefetch`).
    pub fn volume_created(&self, claim: &ClaimRef) {
        if let OwnerCheck::On(checker) = self {
            checker.expect(claim);
        }
    }
}
