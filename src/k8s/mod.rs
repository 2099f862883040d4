//! Kubernetes integration: the API client, a watch cache of the pods on this node, and
//! the ownership check run before NodeStageVolume and NodePublishVolume.
//!
//! Reads come from caches (the node's pods from a reflector; claims and volumes by name
//! with a short TTL), with one API read on a miss and fresh reads before any refusal.
//! Only stage and publish call into this module: unstage, unpublish and stats work
//! without the API server.
//!
//! It is also the one Kubernetes layer for the modules above: `api` runs every API call
//! under the one timeout, makes the writes under localvol's field manager and reads
//! failures into one error; `events` is the one event recorder; `claim_resize` holds
//! the API shapes of resizing a claim (its fields, the status patch, the claim watch)
//! for `resize`, which decides.
//!
//! This file only declares the children, re-exports what the modules above use, and
//! wires the children together (the client, the owner check and its pod reflector); it
//! defines nothing a child imports. Every import inside `k8s/` points down: a child
//! takes what it shares from the sibling that owns it (`OwnerError` from `owner`,
//! `Synced` and `Retry` from `reflect`, `OBJECT_TTL` from `lookup`, `OwnerCheck` from
//! `check`), never from here (`tests/layers.rs` checks it).

pub mod api;
mod check;
pub mod claim_label;
pub mod claim_resize;
pub mod events;
mod lookup;
pub mod node_claims;
pub mod owner;
mod prefetch;
mod reflect;
pub mod snapshot_content;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client};
use tracing::info;

pub use check::{Checker, OwnerCheck};
pub use lookup::OBJECT_TTL;
pub use owner::{OwnerError, Refusal};
pub use reflect::{Retry, Synced, WATCH_RETRY};

use self::api::API_TIMEOUT;
use crate::backend::StorageHealth;
use crate::config::{Config, KubeMode};
use crate::health::Health;
use crate::model::ClassName;

/// A Warning on this node's Node object for each `(device class, reason)` not served
/// for lack of storage, in the background; best effort, as every event.
pub fn warn_missing_storage(
    client: Client,
    node: &str,
    missing: Vec<(String, String)>,
) -> tokio::task::JoinHandle<()> {
    let events = events::Recorder::driver(client, node, API_TIMEOUT);
    let node = node.to_string();
    tokio::spawn(async move {
        for (class, reason) in missing {
            events.storage_missing(&node, &class, &reason).await;
        }
    })
}

/// Publishes each change of a device class's storage health as an event on this
/// node's Node object, in the background (the stats refresh does not wait for the API).
#[derive(Clone, Debug)]
pub struct StorageHealthEvents {
    events: events::Recorder,
    node: String,
}

impl StorageHealthEvents {
    pub fn new(client: Client, node: &str) -> Self {
        Self {
            events: events::Recorder::driver(client, node, API_TIMEOUT),
            node: node.to_string(),
        }
    }

    /// Publishes `class`'s new `health` in the background.
    pub fn publish(&self, class: &ClassName, health: &StorageHealth) -> tokio::task::JoinHandle<()> {
        let (this, class, health) = (self.clone(), class.to_string(), health.clone());
        tokio::spawn(async move { this.events.storage_health(&this.node, &class, &health).await })
    }
}

impl crate::gauges::HealthChanges for StorageHealthEvents {
    fn changed(&self, class: &ClassName, health: &StorageHealth) {
        drop(self.publish(class, health));
    }
}

/// The in-cluster (or KUBECONFIG) client, named `localvol/<version>` in its requests,
/// so that the API server's audit log and metrics tell the daemon's requests apart
/// from its sidecars' under the one service account.
async fn client() -> anyhow::Result<Client> {
    let mut config = kube::Config::infer().await?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("localvol/", env!("CARGO_PKG_VERSION"))),
    ));
    Ok(Client::try_from(config)?)
}

/// The Kubernetes client `--kube` asks for: none when off, or when auto finds no
/// configuration (said once, here); an error when on and there is none.
pub async fn connect(config: &Config) -> anyhow::Result<Option<Client>> {
    match config.kube {
        KubeMode::Off => {
            info!("--kube=off: standalone, no Kubernetes checks, annotations or status reports");
            Ok(None)
        }
        KubeMode::On => client()
            .await
            .map(Some)
            .context("--kube=on: no Kubernetes client (in-cluster or KUBECONFIG)"),
        KubeMode::Auto => match client().await {
            Ok(client) => Ok(Some(client)),
            Err(e) => {
                info!(
                    error = %e,
                    "--kube=auto: no Kubernetes configuration; standalone, no Kubernetes \
                     checks, annotations or status reports"
                );
                Ok(None)
            }
        },
    }
}

/// The owner check for `client`: see [`start_checker`]. Without a client it is off.
/// It labels the claims it reads with this node through `labels`, and reads labelled
/// ones from `claims` (both shared with the daemon's other users of the label).
pub fn owner_check(
    client: Option<Client>,
    config: &Config,
    health: Arc<Health>,
    labels: Option<claim_label::ClaimLabels>,
    claims: Option<node_claims::NodeClaims>,
) -> OwnerCheck {
    let Some(client) = client else {
        return OwnerCheck::Off;
    };
    info!(node.id = %config.node_id, "Kubernetes API on: checking generic ephemeral volume owners");
    OwnerCheck::On(Arc::new(start_checker(
        client,
        &config.node_id,
        health,
        Timings::default(),
        labels,
        claims,
    )))
}

/// The owner check's timings; tests shorten them.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// How long a claim or volume read by name is reused.
    pub object_ttl: Duration,
    /// How long one API read may take.
    pub api_timeout: Duration,
    /// Delays between lists of the node's pods after a failure.
    pub watch_retry: Retry,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            object_ttl: OBJECT_TTL,
            api_timeout: API_TIMEOUT,
            watch_retry: WATCH_RETRY,
        }
    }
}

/// Marks the caches unsynced in `health`, starts the node's pod reflector (which marks
/// them synced whenever it has listed, and unsynced when its watch fails) and the reads
/// of new volumes' claims as their pods arrive (`prefetch`), and returns the check over
/// them. With `labels`, the check labels the claims it reads with this node; with
/// `claims`, it reads labelled claims from their watch (both shared with the daemon's
/// other users of the label).
pub fn start_checker(
    client: Client,
    node: &str,
    health: Arc<Health>,
    timings: Timings,
    labels: Option<claim_label::ClaimLabels>,
    claims: Option<node_claims::NodeClaims>,
) -> Checker {
    health.set_caches_synced(false);
    let (prefetch, queue) = prefetch::Prefetch::new();
    let seen = prefetch.clone();
    let (pods, synced) = spawn_pod_reflector(
        client.clone(),
        node,
        timings.watch_retry,
        move |in_sync| health.set_caches_synced(in_sync),
        move |pod| seen.pod_seen(pod),
    );
    let mut lookup = lookup::Lookup::new(
        client.clone(),
        pods,
        synced.clone(),
        timings.object_ttl,
        timings.api_timeout,
    );
    if let Some(labels) = labels {
        lookup.set_labels(labels);
    }
    if let Some(claims) = claims {
        lookup.set_claims(claims);
    }
    let lookup = Arc::new(lookup);
    tokio::spawn(prefetch::run(Arc::clone(&lookup), queue));
    Checker::over(client, lookup, synced, node.to_string(), timings.api_timeout).with_prefetch(prefetch)
}

/// Keeps of a cached pod only what the owner check reads (see `owner::PodView`): its
/// identity, node and volumes. Containers, labels, annotations and status are most of
/// a pod, and a node caches up to kubelet's 110 (measured by `cargo bench`).
fn slim_pod(pod: &mut Pod) {
    let meta = std::mem::take(&mut pod.metadata);
    pod.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        ..ObjectMeta::default()
    };
    pod.spec = pod.spec.take().map(|spec| PodSpec {
        node_name: spec.node_name,
        volumes: spec.volumes,
        ..PodSpec::default()
    });
    pod.status = None;
}

/// The pods bound to `node`, kept current by a background watch (see `reflect`).
/// `on_change` runs with true each time a complete list is in, and with false when the
/// cache falls out of sync (the owner check then answers UNAVAILABLE); `on_pod` with
/// each pod listed, added or changed.
pub fn spawn_pod_reflector(
    client: Client,
    node: &str,
    retry: Retry,
    on_change: impl Fn(bool) + Send + 'static,
    on_pod: impl Fn(&Pod) + Send + 'static,
) -> (Store<Pod>, Synced) {
    reflect::spawn(
        Api::all(client),
        watcher::Config::default().fields(&format!("spec.nodeName={node}")),
        "this node's pods",
        retry,
        slim_pod,
        on_change,
        move |event| {
            if let watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) = event {
                on_pod(pod);
            }
        },
    )
}

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
pub(crate) mod mock_api;
#[cfg(test)]
mod tests;
