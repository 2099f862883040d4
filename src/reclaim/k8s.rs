//! The scheduler's view of Kubernetes: watch caches of what decides each volume's
//! schedule, and the results written back.
//!
//! Watched (each a kube-runtime reflector with the default backoff):
//! - Namespaces and StorageClasses, all of them: few objects, rarely changed.
//! - The `csi-addons-config` ConfigMap, by name, in the csi-addons namespace.
//! - The PVCs of this node's volumes come from [`NodeClaims`], the one watch selected
//!   by the label this node puts on them ([`crate::k8s::claim_label`]), shared with the
//!   owner check: the API server sends this node its own claims only, and the number
//!   of watches stays constant however many claims the node holds (it was one watch
//!   per claim). A cluster-wide PVC watch on every node would not scale.
//!
//! Namespaces and StorageClasses stay cluster-wide: their count is the cluster's
//! tenants and classes, not its claims, and they change rarely; a per-object watch
//! of each would cost more watches for the same bytes.
//!
//! Every change wakes the scheduler, which re-resolves: annotation and ConfigMap edits
//! take effect without a restart. Results go back as a JSON merge patch of the PVC's
//! `last-run`/`last-result` annotations, and failures (and invalid schedules) as
//! Warning events on the PVC, both through [`crate::k8s`] (its timeout, errors and
//! event recorder). Writing never fails a run: errors are logged.
//!
//! The client comes from the caller (the k8s module's, at startup); nothing here builds
//! one.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio_stream::StreamExt;
use tracing::warn;

use super::scheduler::{ClaimKey, Cluster, ClusterObjects, RunReport};
use super::{LAST_RESULT_ANNOTATION, LAST_RUN_ANNOTATION};
use crate::k8s::api::{API_TIMEOUT, merge_patch};
use crate::k8s::claim_label::ClaimLabels;
use crate::k8s::events::{EventType, Recorder};
use crate::k8s::node_claims::NodeClaims;
use crate::reclaim_policy::{CONFIG_MAP_NAME, ClusterSettings, storage_class_name};

/// Events name this controller.
pub const REPORTER: &str = "localvol";

/// A reflector's cache and its task, aborted when dropped.
struct Watched<K: Resource + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    task: AbortHandle,
}

impl<K: Resource + 'static> Drop for Watched<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn watch<K>(api: Api<K>, config: watcher::Config, notify: Arc<Notify>, what: String) -> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff());
    let task = tokio::spawn(async move {
        tokio::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                    notify.notify_one();
                }
                Ok(_) => {}
                Err(e) => warn!(watch = %what, error = %e, "watch failed; retrying with backoff"),
            }
        }
    });
    Watched {
        store,
        task: task.abort_handle(),
    }
}

/// Kubernetes, as the reclaim scheduler needs it.
pub struct KubeCluster {
    client: Client,
    csi_addons_namespace: String,
    notify: Arc<Notify>,
    namespaces: Watched<Namespace>,
    storage_classes: Watched<StorageClass>,
    config_map: Watched<ConfigMap>,
    /// Its changes wake the scheduler as `notify` does (see `changed`).
    claims: NodeClaims,
    labels: Arc<ClaimLabels>,
    recorder: Recorder,
}

impl Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster")
            .field("csi_addons_namespace", &self.csi_addons_namespace)
            .finish_non_exhaustive()
    }
}

impl KubeCluster {
    /// Starts the cluster-wide watches. `node` names this instance in events; claims
    /// are labelled through `labels` and read from `claims`, both shared with the
    /// daemon's other users of the label.
    pub fn start(
        client: Client,
        csi_addons_namespace: &str,
        node: &str,
        labels: ClaimLabels,
        claims: NodeClaims,
    ) -> Arc<Self> {
        let notify = Arc::new(Notify::new());
        let namespaces = watch(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default(),
            Arc::clone(&notify),
            "namespaces".to_string(),
        );
        let storage_classes = watch(
            Api::<StorageClass>::all(client.clone()),
            watcher::Config::default(),
            Arc::clone(&notify),
            "storageclasses".to_string(),
        );
        let config_map = watch(
            Api::<ConfigMap>::namespaced(client.clone(), csi_addons_namespace),
            watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP_NAME}")),
            Arc::clone(&notify),
            format!("configmap {csi_addons_namespace}/{CONFIG_MAP_NAME}"),
        );
        let recorder = Recorder::new(client.clone(), REPORTER, node, API_TIMEOUT);
        Arc::new(Self {
            labels: Arc::new(labels),
            client,
            csi_addons_namespace: csi_addons_namespace.to_string(),
            notify,
            namespaces,
            storage_classes,
            config_map,
            claims,
            recorder,
        })
    }

    fn pvc(&self, claim: &ClaimKey) -> Option<PersistentVolumeClaim> {
        // The last state seen, as for every other object here: a schedule does not
        // stop while the API server is away.
        self.claims
            .last_seen(&claim.namespace, &claim.name)
            .map(|p| (*p).clone())
    }

    /// The PVC as an event's subject: from the cache (with its UID) when there.
    fn reference(&self, claim: &ClaimKey) -> ObjectReference {
        match self.pvc(claim) {
            Some(pvc) => pvc.object_ref(&()),
            None => ObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some("PersistentVolumeClaim".to_string()),
                name: Some(claim.name.clone()),
                namespace: Some(claim.namespace.clone()),
                ..ObjectReference::default()
            },
        }
    }

    async fn event(&self, claim: &ClaimKey, reason: &str, note: &str) {
        self.recorder
            .publish(
                EventType::Warning,
                reason,
                "ReclaimSpace",
                note,
                &self.reference(claim),
                None,
            )
            .await;
    }
}

#[async_trait]
impl Cluster for KubeCluster {
    fn track(&self, claims: &BTreeSet<ClaimKey>) {
        // Labelled in the background: one PATCH per claim this process has not labelled
        // yet (none for the others, so a failed one is retried at the next refresh).
        // The label brings the claim into the watch, whose event wakes the scheduler.
        let labels = Arc::clone(&self.labels);
        let keys: Vec<(String, String)> = claims
            .iter()
            .map(|c| (c.namespace.clone(), c.name.clone()))
            .collect();
        tokio::spawn(async move { labels.ensure(keys).await });
    }

    fn objects(&self, claim: &ClaimKey) -> ClusterObjects {
        let pvc = self.pvc(claim);
        let namespace = self
            .namespaces
            .store
            .get(&ObjectRef::new(&claim.namespace))
            .map(|n| (*n).clone());
        let storage_class = pvc
            .as_ref()
            .and_then(storage_class_name)
            .and_then(|name| self.storage_classes.store.get(&ObjectRef::new(name)))
            .map(|s| (*s).clone());
        ClusterObjects {
            pvc,
            namespace,
            storage_class,
        }
    }

    fn settings(&self) -> ClusterSettings {
        let cm = self
            .config_map
            .store
            .get(&ObjectRef::new(CONFIG_MAP_NAME).within(&self.csi_addons_namespace));
        ClusterSettings::from_config_map(cm.as_deref())
    }

    async fn changed(&self) {
        // The watches started here wake `notify`; the shared claims' watch has its own.
        tokio::select! {
            () = self.notify.notified() => {}
            () = self.claims.changed() => {}
        }
    }

    async fn report(&self, claim: &ClaimKey, report: &RunReport) {
        let patch = serde_json::json!({
            "metadata": {
                "annotations": {
                    LAST_RUN_ANNOTATION: report.finished.to_string(),
                    LAST_RESULT_ANNOTATION: report.summary,
                }
            }
        });
        let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &claim.namespace);
        let what = || {
            format!(
                "annotate PersistentVolumeClaim {}/{}",
                claim.namespace, claim.name
            )
        };
        if let Err(e) = merge_patch(&api, what, &claim.name, &patch).await {
            warn!(pvc.namespace = %claim.namespace, pvc.name = %claim.name, error = %e, "cannot annotate the reclaim result");
        }
        if !report.succeeded {
            self.event(claim, "ReclaimSpaceFailed", &report.summary).await;
        }
    }

    async fn warn_schedule(&self, claim: &ClaimKey, warning: &str) {
        self.event(claim, "InvalidReclaimSchedule", warning).await;
    }
}

#[cfg(test)]
mod tests;
