//! Kubernetes integration: the API client, a watch cache of the pods on this node, and
//! the ownership check run before NodeStageVolume and NodePublishVolume.
//!
//! Reads come from caches (the node's pods from a reflector; claims and volumes by name
//! with a short TTL), with one API read on a miss and fresh reads before any refusal.
//! Only stage and publish call into this module: unstage, unpublish and stats work
//! without the API server.

mod check;
mod events;
mod lookup;
pub mod owner;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio_stream::StreamExt;
use tracing::{info, warn};

pub use check::Checker;
pub use owner::Refusal;

use crate::config::{Config, KubeMode};
use crate::health::Health;
use crate::request::{PublishRequest, StageRequest};

/// How long one API read may take before the check answers UNAVAILABLE (kubelet retries).
pub const API_TIMEOUT: Duration = Duration::from_secs(10);
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
    ClaimNotFound { volume: String, reason: String },
    #[error("the Kubernetes pod cache has not synced yet; try again")]
    NotSynced,
    #[error("Kubernetes API: {what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("Kubernetes API: {what}: no answer within {timeout:?}")]
    Timeout { what: String, timeout: Duration },
}

/// Whether an API error means the server could not be reached or could not answer for
/// now (asking again may work), as opposed to an answer that will not change (403).
pub fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => true,
        _ => false,
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
}

/// Set once the node's pod cache has listed everything.
#[derive(Debug, Clone, Default)]
pub struct Synced(Arc<AtomicBool>);

impl Synced {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    fn set(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Starts the Kubernetes side as `--kube` asks. With a client: marks the caches unsynced,
/// starts the node's pod reflector (which marks them synced once listed) and returns the
/// check. Without one: says so once and returns [`OwnerCheck::Off`].
pub async fn start(config: &Config, health: Arc<Health>) -> anyhow::Result<OwnerCheck> {
    let client = match config.kube {
        KubeMode::Off => {
            info!("--kube=off: standalone, generic ephemeral volume owners are not checked");
            return Ok(OwnerCheck::Off);
        }
        KubeMode::On => Client::try_default()
            .await
            .context("--kube=on: no Kubernetes client (in-cluster or KUBECONFIG)")?,
        KubeMode::Auto => match Client::try_default().await {
            Ok(client) => client,
            Err(e) => {
                info!(
                    error = %e,
                    "--kube=auto: no Kubernetes configuration; standalone, \
                     generic ephemeral volume owners are not checked"
                );
                return Ok(OwnerCheck::Off);
            }
        },
    };
    health.set_caches_synced(false);
    let (pods, synced) = spawn_pod_reflector(client.clone(), &config.node_id, move || {
        health.set_caches_synced(true)
    });
    info!(node.id = %config.node_id, "Kubernetes API on: checking generic ephemeral volume owners");
    Ok(OwnerCheck::On(Arc::new(Checker::new(
        client,
        pods,
        synced,
        config.node_id.clone(),
    ))))
}

/// The pods bound to `node`, kept current by a background watch. `on_synced` runs once
/// the first full list is in.
pub fn spawn_pod_reflector(
    client: Client,
    node: &str,
    on_synced: impl FnOnce() + Send + 'static,
) -> (Store<Pod>, Synced) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        // Only metadata and spec.volumes/nodeName are read; drop the bulk.
        .modify(|pod: &mut Pod| {
            pod.metadata.managed_fields = None;
            pod.metadata.annotations = None;
            pod.status = None;
        })
        .reflect(writer)
        .applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Err(e) = event {
                warn!(error = %e, "pod watch failed; retrying with backoff");
            }
        }
    });
    let synced = Synced::default();
    {
        let reader = reader.clone();
        let synced = synced.clone();
        tokio::spawn(async move {
            if reader.wait_until_ready().await.is_ok() {
                info!(pods = reader.len(), "pod cache synced");
                synced.set();
                on_synced();
            }
        });
    }
    (reader, synced)
}

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;
