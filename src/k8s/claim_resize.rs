//! The API shapes of resizing a claim, for `resize`: the fields of a claim and of its
//! PersistentVolume that resizing reads, the status patch that moves a claim to the
//! status `resize` decides on, the watch of this node's labelled claims, and every
//! read and write those take. `resize` decides (what a claim should show, whether a
//! failure is terminal, when to grow); this module knows how the API says it.
//!
//! The status patch is the one kubelet and external-resizer write: a strategic merge
//! patch of the `status` subresource that carries the claim's
//! `metadata.resourceVersion`, so the write lands only on the object it was planned
//! from. It holds only what differs from the claim as read; a claim that already shows
//! the wanted status gets no patch.
//!
//! Not server-side apply: the keys and conditions to remove were set by kubelet or
//! external-resizer under their own field managers, and an apply only removes what its
//! own manager set.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::{Map, Value, json};
use tokio_stream::{Stream, StreamExt};

use super::api::{API_TIMEOUT, ApiError, call, patch_status, replace, truncate};
use super::claim_label::{self, ClaimLabels};
use super::events::Recorder;

/// The resource whose status localvol reports.
pub const STORAGE: &str = "storage";

/// A claim as read from the API server.
#[derive(Debug, Clone)]
pub struct Claim(PersistentVolumeClaim);

impl From<PersistentVolumeClaim> for Claim {
    fn from(pvc: PersistentVolumeClaim) -> Self {
        Self(pvc)
    }
}

/// The `storage` entry of a map of quantities, as its text (`2Gi`).
fn storage_of(map: Option<&BTreeMap<String, Quantity>>) -> Option<&str> {
    map?.get(STORAGE).map(|q| q.0.as_str())
}

impl Claim {
    pub fn namespace(&self) -> Option<&str> {
        self.0.metadata.namespace.as_deref()
    }

    pub fn name(&self) -> Option<&str> {
        self.0.metadata.name.as_deref()
    }

    /// `status.phase` is `Bound`.
    pub fn is_bound(&self) -> bool {
        self.0.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
    }

    /// The claim is being deleted (`metadata.deletionTimestamp`).
    pub fn is_deleting(&self) -> bool {
        self.0.metadata.deletion_timestamp.is_some()
    }

    /// `spec.volumeName`: the PersistentVolume it is bound to.
    pub fn volume_name(&self) -> Option<&str> {
        self.0.spec.as_ref()?.volume_name.as_deref()
    }

    /// `spec.storageClassName`.
    pub fn storage_class(&self) -> Option<&str> {
        self.0.spec.as_ref()?.storage_class_name.as_deref()
    }

    /// `spec.resources.requests["storage"]`: the size asked for.
    pub fn requested(&self) -> Option<&str> {
        storage_of(self.0.spec.as_ref()?.resources.as_ref()?.requests.as_ref())
    }

    /// `status.capacity["storage"]`.
    pub fn capacity(&self) -> Option<&str> {
        storage_of(self.0.status.as_ref()?.capacity.as_ref())
    }

    /// `status.allocatedResources["storage"]`.
    pub fn allocated(&self) -> Option<&str> {
        storage_of(self.0.status.as_ref()?.allocated_resources.as_ref())
    }

    /// `status.allocatedResourceStatuses["storage"]`, if set.
    pub fn resize_status(&self) -> Option<&str> {
        self.0
            .status
            .as_ref()?
            .allocated_resource_statuses
            .as_ref()?
            .get(STORAGE)
            .map(String::as_str)
    }

    fn conditions(&self) -> &[PersistentVolumeClaimCondition] {
        self.0
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
    }

    /// The claim as an event's `regarding`.
    pub fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("PersistentVolumeClaim".to_string()),
            namespace: self.0.metadata.namespace.clone(),
            name: self.0.metadata.name.clone(),
            uid: self.0.metadata.uid.clone(),
            ..ObjectReference::default()
        }
    }
}

/// What a claim's resize status is to show, as `resize` decides it for one step.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WantedStatus {
    /// `allocatedResourceStatuses["storage"]`: this value, or none (the key removed).
    pub value: Option<&'static str>,
    /// `allocatedResources["storage"]` to set, if any.
    pub allocated: Option<String>,
    /// `capacity["storage"]` to set, if any.
    pub capacity: Option<String>,
    /// Conditions to hold `True`, by type, with their message.
    pub hold: Vec<(&'static str, Option<String>)>,
    /// Condition types to remove.
    pub remove: Vec<&'static str>,
}

fn time_json(now: &Time) -> Value {
    serde_json::to_value(now).expect("a timestamp serialises")
}

/// The status patch that moves `claim` to `wanted` at `now`, or `None` when it already
/// shows it.
pub fn plan(claim: &Claim, wanted: &WantedStatus, now: &Time) -> Option<Value> {
    let mut status = Map::new();
    if claim.resize_status() != wanted.value {
        status.insert(
            "allocatedResourceStatuses".to_string(),
            json!({ STORAGE: wanted.value }),
        );
    }
    if let Some(target) = &wanted.allocated
        && claim.allocated() != Some(target.as_str())
    {
        status.insert("allocatedResources".to_string(), json!({ STORAGE: target }));
    }
    if let Some(size) = &wanted.capacity
        && claim.capacity() != Some(size.as_str())
    {
        status.insert("capacity".to_string(), json!({ STORAGE: size }));
    }
    let existing = claim.conditions();
    let mut entries = Vec::new();
    for (kind, message) in &wanted.hold {
        let current = existing.iter().find(|c| c.type_ == *kind);
        let message = message.as_deref().map(truncate);
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
    for kind in &wanted.remove {
        if existing.iter().any(|c| c.type_ == *kind) {
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
        "metadata": { "resourceVersion": claim.0.metadata.resource_version },
        "status": status,
    }))
}

/// [`plan`] at the current time.
pub fn plan_now(claim: &Claim, wanted: &WantedStatus) -> Option<Value> {
    plan(claim, wanted, &Time(k8s_openapi::jiff::Timestamp::now()))
}

/// A PersistentVolume as read from the API server.
#[derive(Debug, Clone)]
pub struct Volume(PersistentVolume);

impl Volume {
    pub fn name(&self) -> &str {
        self.0.metadata.name.as_deref().unwrap_or_default()
    }

    /// `spec.capacity["storage"]`.
    pub fn capacity(&self) -> Option<&str> {
        storage_of(self.0.spec.as_ref()?.capacity.as_ref())
    }

    /// `spec.csi`'s driver and volume handle.
    pub fn csi(&self) -> Option<(&str, &str)> {
        let csi = self.0.spec.as_ref()?.csi.as_ref()?;
        Some((csi.driver.as_str(), csi.volume_handle.as_str()))
    }

    /// Sets `spec.capacity["storage"]` to `size` (a quantity's text).
    pub fn set_capacity(&mut self, size: String) {
        let spec = self.0.spec.get_or_insert_with(Default::default);
        spec.capacity
            .get_or_insert_with(Default::default)
            .insert(STORAGE.to_string(), Quantity(size));
    }
}

/// The API server's version, as `/version` states it.
#[derive(Debug, Clone)]
pub struct ServerVersion {
    pub major: String,
    pub minor: String,
    pub git_version: String,
}

/// The one watch of claims of `node`: those with its label (see [`claim_label`]).
pub fn claim_watch(node: &str) -> watcher::Config {
    watcher::Config::default().labels(&claim_label::selector(node))
}

/// The reads and writes of resizing, against one API server; each under the one
/// timeout of [`call`].
#[derive(Clone)]
pub struct ResizeApi {
    client: Client,
}

impl std::fmt::Debug for ResizeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResizeApi").finish_non_exhaustive()
    }
}

impl ResizeApi {
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    fn claims(&self, namespace: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), namespace)
    }

    pub async fn claim(&self, namespace: &str, name: &str) -> Result<Claim, ApiError> {
        call(
            || format!("get PersistentVolumeClaim {namespace}/{name}"),
            self.claims(namespace).get(name),
        )
        .await
        .map(Claim)
    }

    /// Writes `patch` (from [`plan`]) to the claim's `status` subresource.
    pub async fn patch_claim_status(
        &self,
        namespace: &str,
        name: &str,
        patch: Value,
    ) -> Result<Claim, ApiError> {
        patch_status(
            &self.claims(namespace),
            || format!("patch PersistentVolumeClaim {namespace}/{name} status"),
            name,
            patch,
        )
        .await
        .map(Claim)
    }

    pub async fn server_version(&self) -> Result<ServerVersion, ApiError> {
        let info = call(|| "get /version".to_string(), self.client.apiserver_version()).await?;
        Ok(ServerVersion {
            major: info.major,
            minor: info.minor,
            git_version: info.git_version,
        })
    }

    /// The kubelet version of `node` as its Node object states it.
    pub async fn kubelet_version(&self, node: &str) -> Result<String, ApiError> {
        let node = call(
            || format!("get Node {node}"),
            Api::<Node>::all(self.client.clone()).get(node),
        )
        .await?;
        Ok(node
            .status
            .and_then(|s| s.node_info)
            .map(|info| info.kubelet_version)
            .unwrap_or_default())
    }

    pub async fn volume(&self, name: &str) -> Result<Volume, ApiError> {
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        call(|| format!("get PersistentVolume {name}"), volumes.get(name))
            .await
            .map(Volume)
    }

    /// Replaces the volume `name` with `volume`; its `metadata.resourceVersion` makes
    /// the update land only on the version it was read as.
    pub async fn replace_volume(&self, name: &str, volume: &Volume) -> Result<Volume, ApiError> {
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        replace(
            &volumes,
            || format!("update PersistentVolume {name}"),
            name,
            &volume.0,
        )
        .await
        .map(Volume)
    }

    /// Whether the StorageClass `class` allows expansion (`allowVolumeExpansion: true`).
    pub async fn expansion_allowed(&self, class: &str) -> Result<bool, ApiError> {
        let classes: Api<StorageClass> = Api::all(self.client.clone());
        let sc = call(|| format!("get StorageClass {class}"), classes.get(class)).await?;
        Ok(sc.allow_volume_expansion == Some(true))
    }

    /// The event recorder of the driver on `node`.
    pub fn recorder(&self, node: &str) -> Recorder {
        Recorder::driver(self.client.clone(), node, API_TIMEOUT)
    }

    /// The claims of `node` as its one claim watch ([`claim_watch`]) shows them, with
    /// backoff after a failure; each is noted in `labels` as labelled (the watch selects
    /// by the label: whatever it shows is labelled).
    pub fn watch_claims(
        &self,
        node: &str,
        labels: ClaimLabels,
    ) -> impl Stream<Item = Result<Claim, watcher::Error>> + Send + 'static {
        let api: Api<PersistentVolumeClaim> = Api::all(self.client.clone());
        watcher(api, claim_watch(node))
            .default_backoff()
            .applied_objects()
            .map(move |item| {
                if let Ok(pvc) = &item
                    && let (Some(ns), Some(name)) = (&pvc.metadata.namespace, &pvc.metadata.name)
                {
                    labels.mark_labelled(ns, name);
                }
                item.map(Claim)
            })
    }
}
