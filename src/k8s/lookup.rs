//! Reads for the ownership check: pods from the node's watch cache, claims from the
//! watch of this node's labelled claims (`node_claims`) when it has them, claims and
//! volumes by name through a short TTL cache, each with the API as the fallback. Every API read
//! has a deadline, so an unreachable API server becomes an error promptly. A claim or
//! volume read before the pod cache was last listed is not reused after that list: the
//! watch had failed, so the API server may have been away and the object changed.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};

use super::api::call_within;
use super::claim_label::ClaimLabels;
use super::node_claims::NodeClaims;
use super::owner::OwnerError;
use super::reflect::Synced;

/// How long a claim or volume read by name is reused.
pub const OBJECT_TTL: Duration = Duration::from_secs(10);

/// Where a read may come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A cache when it has the object, else the API.
    Cache,
    /// The API only (the result refreshes the cache).
    Api,
}

/// A value and whether it came from a cache (and so may be out of date).
#[derive(Debug, Clone)]
pub struct Read<T> {
    pub value: T,
    pub cached: bool,
}

/// Objects read by key, reused for `ttl` within one generation of the pod cache (see
/// [`Synced::generation`]). Only found objects are kept: a miss always asks.
#[derive(Debug)]
struct TtlCache<T> {
    ttl: Duration,
    entries: Mutex<HashMap<String, Entry<T>>>,
}

#[derive(Debug)]
struct Entry<T> {
    read_at: Instant,
    generation: u64,
    value: Arc<T>,
}

impl<T> TtlCache<T> {
    fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::default(),
        }
    }

    fn get(&self, key: &str, generation: u64) -> Option<Arc<T>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(key)
            .filter(|e| e.read_at.elapsed() < self.ttl && e.generation == generation)
            .map(|e| Arc::clone(&e.value))
    }

    /// Keeps `value` as read in `generation`: the one current when the read started, so
    /// that a read overlapping a relist is not taken for a read after it.
    fn put(&self, key: String, generation: u64, value: Option<Arc<T>>) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|_, e| e.read_at.elapsed() < self.ttl && e.generation == generation);
        match value {
            Some(value) => entries.insert(
                key,
                Entry {
                    read_at: Instant::now(),
                    generation,
                    value,
                },
            ),
            None => entries.remove(&key),
        };
    }
}

pub struct Lookup {
    client: Client,
    pods: Store<Pod>,
    pvcs: TtlCache<PersistentVolumeClaim>,
    pvs: TtlCache<PersistentVolume>,
    synced: Synced,
    timeout: Duration,
    /// When set, the first read of a claim this process has not labelled yet is the
    /// label's PATCH, whose answer is the claim (see `claim_label`).
    labels: Option<ClaimLabels>,
    /// When set, claims this node has labelled are read from their watch while it is
    /// in sync: a claim staged long after it was read ahead (kubelet works through a
    /// burst of pods for many seconds) costs no second request.
    claims: Option<NodeClaims>,
    /// One read of a claim at a time (see [`Lookup::pvc`]), by `namespace/name`.
    claim_reads: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lookup")
            .field("pods", &self.pods.len())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Lookup {
    pub fn new(client: Client, pods: Store<Pod>, synced: Synced, ttl: Duration, timeout: Duration) -> Self {
        Self {
            client,
            pods,
            pvcs: TtlCache::new(ttl),
            pvs: TtlCache::new(ttl),
            synced,
            timeout,
            labels: None,
            claims: None,
            claim_reads: Mutex::default(),
        }
    }

    pub fn set_labels(&mut self, labels: ClaimLabels) {
        self.labels = Some(labels);
    }

    pub fn set_claims(&mut self, claims: NodeClaims) {
        self.claims = Some(claims);
    }

    async fn call<T>(
        &self,
        what: impl FnOnce() -> String,
        fut: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, OwnerError> {
        Ok(call_within(self.timeout, what, fut).await?)
    }

    /// A claim by name. Reads of one claim take turns: a stage that comes while the
    /// claim is being read ahead of it (see `prefetch`), or a publish while its stage
    /// reads, waits for that read and takes its answer from the cache, rather than make
    /// a second request.
    pub async fn pvc(
        &self,
        namespace: &str,
        name: &str,
        source: Source,
    ) -> Result<Option<Read<Arc<PersistentVolumeClaim>>>, OwnerError> {
        if source == Source::Cache
            && let Some(value) = self.claims.as_ref().and_then(|c| c.get(namespace, name))
        {
            return Ok(Some(Read { value, cached: true }));
        }
        let key = format!("{namespace}/{name}");
        let turn = Turn::take(&self.claim_reads, &key);
        let _turn = turn.gate.lock().await;
        let generation = self.synced.generation();
        if source == Source::Cache
            && let Some(value) = self.pvcs.get(&key, generation)
        {
            return Ok(Some(Read { value, cached: true }));
        }
        let found = match &self.labels {
            Some(labels) if labels.take(namespace, name) => {
                let labelled = self
                    .call(
                        || format!("label PersistentVolumeClaim {key}"),
                        labels.label(namespace, name),
                    )
                    .await;
                if labelled.is_err() {
                    labels.give_back(namespace, name);
                }
                labelled?
            }
            _ => {
                let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
                self.call(|| format!("get PersistentVolumeClaim {key}"), api.get_opt(name))
                    .await?
            }
        }
        .map(Arc::new);
        self.pvcs.put(key.clone(), generation, found.clone());
        Ok(found.map(|value| Read { value, cached: false }))
    }

    pub async fn pv(
        &self,
        name: &str,
        source: Source,
    ) -> Result<Option<Read<Arc<PersistentVolume>>>, OwnerError> {
        let generation = self.synced.generation();
        if source == Source::Cache
            && let Some(value) = self.pvs.get(name, generation)
        {
            return Ok(Some(Read { value, cached: true }));
        }
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let found = self
            .call(|| format!("get PersistentVolume {name}"), api.get_opt(name))
            .await?
            .map(Arc::new);
        self.pvs.put(name.to_string(), generation, found.clone());
        Ok(found.map(|value| Read { value, cached: false }))
    }

    /// A pod by name: from the node's pod cache when `source` allows and it has one that
    /// `accept`s, else (one read) from the API. Pods on other nodes are only in the API.
    pub async fn pod(
        &self,
        namespace: &str,
        name: &str,
        source: Source,
        accept: impl Fn(&Pod) -> bool,
    ) -> Result<Option<Read<Arc<Pod>>>, OwnerError> {
        if source == Source::Cache
            && let Some(value) = self.pods.get(&ObjectRef::new(name).within(namespace))
            && accept(&value)
        {
            return Ok(Some(Read { value, cached: true }));
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let found = self
            .call(|| format!("get Pod {namespace}/{name}"), api.get_opt(name))
            .await?;
        Ok(found.map(|pod| Read {
            value: Arc::new(pod),
            cached: false,
        }))
    }

    /// Pods on this node (from the cache) that `matches`.
    pub fn cached_pods(&self, matches: impl Fn(&Pod) -> bool) -> Vec<Arc<Pod>> {
        self.pods.state_filter(|p| matches(p))
    }
}

/// A caller's place in the queue of one key's reads; leaving it (even by cancellation)
/// forgets the key once no one else waits on it.
struct Turn<'a> {
    reads: &'a Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    key: &'a str,
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl<'a> Turn<'a> {
    fn take(reads: &'a Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>, key: &'a str) -> Self {
        let mut map = reads.lock().unwrap_or_else(|p| p.into_inner());
        let gate = Arc::clone(map.entry(key.to_string()).or_default());
        Self { reads, key, gate }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut map = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        // The map's and this one: no one else waits.
        if Arc::strong_count(&self.gate) == 2 {
            map.remove(self.key);
        }
    }
}
