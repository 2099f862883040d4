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
//! failures into one error; `events` is the one event recorder.

pub mod api;
mod check;
pub mod claim_label;
pub mod events;
mod lookup;
pub mod node_claims;
pub mod owner;
mod prefetch;
mod reflect;
pub mod snapshot_content;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client};
use tracing::info;

pub use check::Checker;
pub use owner::Refusal;

use self::api::{API_TIMEOUT, ApiError};
use crate::config::{Config, KubeMode};
use crate::health::Health;
use crate::model::{ClaimRef, Terminal};
use crate::request::{PublishRequest, StageRequest};

/// How long a claim or volume read by name is reused.
pub const OBJECT_TTL: Duration = Duration::from_secs(10);

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

    /// CreateVolume made a volume for `claim`: its stage will need the claim, which is
    /// read as soon as the pod using it is bound to this node (see `prefetch`).
    pub fn volume_created(&self, claim: &ClaimRef) {
        if let OwnerCheck::On(checker) = self {
            checker.expect(claim);
        }
    }
}

/// Whether the node's pod cache mirrors the API server now, and how many times it has
/// been listed. It is out of sync until the first list is in, and again from a failed
/// list or watch until the pods have been listed anew.
#[derive(Debug, Clone, Default)]
pub struct Synced(Arc<SyncState>);

#[derive(Debug, Default)]
struct SyncState {
    in_sync: AtomicBool,
    lists: AtomicU64,
}

impl Synced {
    pub fn get(&self) -> bool {
        self.0.in_sync.load(Ordering::SeqCst)
    }

    /// Counts the complete lists so far. Claims and volumes read by name are only reused
    /// within one list generation: one read before an outage may have changed during it.
    pub fn generation(&self) -> u64 {
        self.0.lists.load(Ordering::SeqCst)
    }

    /// A complete list is in. The generation moves first, so that whoever sees the cache
    /// in sync also sees the new generation.
    fn listed(&self) {
        self.0.lists.fetch_add(1, Ordering::SeqCst);
        self.0.in_sync.store(true, Ordering::SeqCst);
    }

    /// The watch failed; returns whether the cache was in sync until now.
    fn lost(&self) -> bool {
        self.0.in_sync.swap(false, Ordering::SeqCst)
    }
}

/// Delays between attempts to list the node's pods again after a list or watch failed:
/// `first`, doubling up to `max`, back to `first` once a list succeeds.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    pub first: Duration,
    pub max: Duration,
}

pub const WATCH_RETRY: Retry = Retry {
    first: Duration::from_millis(800),
    max: Duration::from_secs(30),
};

/// The Kubernetes client `--kube` asks for: none when off, or when auto finds no
/// configuration (said once, here); an error when on and there is none.
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
