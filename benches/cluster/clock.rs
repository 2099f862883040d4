//! When things happened, as the API server's watches report them to this process: a
//! claim gets its selected node, a claim is Bound, a pod is bound to the node, a pod
//! is Running. Every mark is the first moment this process saw it, on its monotonic
//! clock, so phases are differences of marks taken by one observer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::Notify;
use tokio_stream::StreamExt;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Mark {
    /// The scheduler's first pass picked the node: the claim's selected-node annotation.
    ClaimSelected,
    /// The claim is Bound to its new PV (provisioned, then bound by the PV controller).
    ClaimBound,
    /// The pod has a node (the scheduler's binding).
    PodBound,
    /// The pod is Running (kubelet mounted its volumes and started the container).
    PodRunning,
}

#[derive(Default)]
pub struct Clock {
    marks: Mutex<HashMap<(Mark, String), Instant>>,
    changed: Notify,
}

impl Clock {
    fn record(&self, mark: Mark, name: &str) {
        let now = Instant::now();
        let mut marks = self.marks.lock().unwrap();
        if let std::collections::hash_map::Entry::Vacant(entry) = marks.entry((mark, name.to_string())) {
            entry.insert(now);
            drop(marks);
            self.changed.notify_waiters();
        }
    }

    pub fn get(&self, mark: Mark, name: &str) -> Option<Instant> {
        self.marks.lock().unwrap().get(&(mark, name.to_string())).copied()
    }

    /// The moment `mark` was seen for every name (the latest of them).
    pub async fn all(&self, mark: Mark, names: &[String], limit: Duration) -> Result<Instant, String> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.changed.notified();
            let seen: Vec<Instant> = names.iter().filter_map(|n| self.get(mark, n)).collect();
            if seen.len() == names.len() {
                return Ok(seen.into_iter().max().unwrap_or_else(Instant::now));
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let missing: Vec<&String> = names
                    .iter()
                    .filter(|n| self.get(mark, n).is_none())
                    .take(5)
                    .collect();
                return Err(format!(
                    "{mark:?} not seen within {limit:?} for {} of {} (first: {missing:?})",
                    names.len() - seen.len(),
                    names.len()
                ));
            }
        }
    }

    /// Watches the pods and claims of `namespace` carrying `label`, recording marks
    /// until the process ends.
    pub fn watch(self: &Arc<Self>, client: &Client, namespace: &str, label: &str) {
        let config = watcher::Config::default().labels(label);
        self.follow(
            Api::<Pod>::namespaced(client.clone(), namespace),
            config.clone(),
            Self::pod,
        );
        self.follow(
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace),
            config,
            Self::claim,
        );
    }

    /// Records what `seen` finds in every object the watch of `api` shows.
    fn follow<K>(self: &Arc<Self>, api: Api<K>, config: watcher::Config, seen: fn(&Self, &K))
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    {
        let clock = self.clone();
        tokio::spawn(async move {
            let mut events = Box::pin(watcher::watcher(api, config));
            while let Some(event) = events.next().await {
                if let Ok(Event::Apply(object) | Event::InitApply(object)) = event {
                    seen(&clock, &object);
                }
            }
        });
    }

    fn pod(&self, pod: &Pod) {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        if pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
            self.record(Mark::PodBound, name);
        }
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            self.record(Mark::PodRunning, name);
        }
    }

    fn claim(&self, claim: &PersistentVolumeClaim) {
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let annotations = claim.metadata.annotations.as_ref();
        if annotations.is_some_and(|a| a.contains_key("volume.kubernetes.io/selected-node")) {
            self.record(Mark::ClaimSelected, name);
        }
        if claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") {
            self.record(Mark::ClaimBound, name);
        }
    }
}
