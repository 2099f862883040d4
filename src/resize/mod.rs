//! Volume expansion beyond the CSI calls: the claim's resize status
//! (`--report-resize-status`) and, for clusters without a central external-resizer,
//! localvol as the resizer of its own node's claims (`--node-resizer`).
//!
//! The volume work itself is `Volumes::expand` (controller side: grow the backing
//! store) and `Volumes::expand_on_node` (node side: device view and filesystem); this
//! module decides when to call them and tells Kubernetes what happened, with the
//! status values and conditions kubelet and external-resizer use.
//!
//! How the API says it (a claim's fields, the status patch, the watch of this node's
//! claims, every read and write) is [`crate::k8s::claim_resize`]'s: below this file's
//! wiring, which takes the daemon's client, no code here names kube or k8s-openapi
//! (`tests/layers.rs` checks it).

pub mod claim_status;
pub mod classify;
mod events;
pub mod kubelet;
pub mod node_resizer;
pub mod quantity;
pub mod report;

use std::future::Future;
use std::sync::Arc;

use anyhow::bail;
use kube::Client;
use tracing::{info, warn};

pub use report::NodeReporting;

use crate::config::{FailureValue, ReportResizeStatus, ResizeArgs};
use crate::k8s::claim_label::ClaimLabels;
use crate::k8s::claim_resize::ResizeApi;
use crate::locks::{LockError, VolumeLocks};
use crate::model::Terminal;
use crate::volume::{VolumeError, Volumes};

/// A failed step of the node resizer: a claim or volume status the API would not take,
/// a volume busy with another call, or the expansion itself.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    #[error(transparent)]
    Status(#[from] claim_status::StatusError),
    #[error(transparent)]
    Busy(#[from] LockError),
    #[error(transparent)]
    Volume(#[from] VolumeError),
}

impl Terminal for ResizeError {
    fn is_terminal(&self) -> bool {
        match self {
            ResizeError::Status(e) => e.is_terminal(),
            ResizeError::Busy(e) => e.is_terminal(),
            ResizeError::Volume(e) => e.is_terminal(),
        }
    }
}

/// The node-side reporter for the CSI node service, as `args` asks. `auto` reads this
/// node's kubelet version once, at start-up, and logs which way it went.
pub async fn reporting(
    args: &ResizeArgs,
    client: Option<&Client>,
    node: &str,
) -> anyhow::Result<NodeReporting> {
    let reporting_client = match (args.report_resize_status, client) {
        (ReportResizeStatus::Off, _) => None,
        (ReportResizeStatus::On, None) => bail!("--report-resize-status on needs the Kubernetes API"),
        (ReportResizeStatus::On, Some(client)) => Some(client),
        (ReportResizeStatus::Auto, None) => {
            info!("resize status: auto and no Kubernetes API, not reporting");
            None
        }
        (ReportResizeStatus::Auto, Some(client)) => auto_reporting(&ResizeApi::new(client.clone()), node)
            .await
            .then_some(client),
    };
    let Some(client) = reporting_client else {
        return Ok(NodeReporting::Off);
    };
    info!("reporting node expansion in claims' status");
    Ok(NodeReporting::new(
        ResizeApi::new(client.clone()),
        node,
        args.resize_failure_value,
    ))
}

/// `auto`: on for a kubelet that does not report node expansion itself. A version that
/// cannot be read leaves reporting off (two writers racing on a claim are worse than a
/// status that kubelet may well write) and says so.
async fn auto_reporting(api: &ResizeApi, node: &str) -> bool {
    match api.kubelet_version(node).await {
        Ok(version) => match kubelet::reports_node_expansion(&version) {
            Some(true) => {
                info!(node, kubelet = %version, "resize status: auto, kubelet reports node expansion itself; localvol does not");
                false
            }
            Some(false) => {
                info!(node, kubelet = %version, "resize status: auto, kubelet does not report node expansion; localvol does");
                true
            }
            None => {
                warn!(node, kubelet = %version, "resize status: auto, unknown kubelet version; not reporting (--report-resize-status on forces it)");
                false
            }
        },
        Err(e) => {
            warn!(node, error = %e, "resize status: auto, cannot read this node's kubelet version; not reporting (--report-resize-status on forces it)");
            false
        }
    }
}

/// Runs the node resizer (`--node-resizer`) in the background until `shutdown`.
pub fn spawn_node_resizer(
    args: &ResizeArgs,
    client: Client,
    node: &str,
    volumes: Arc<Volumes>,
    locks: VolumeLocks,
    labels: ClaimLabels,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let resizer = node_resizer::NodeResizer::new(
        ResizeApi::new(client),
        node,
        args.resize_failure_value,
        volumes,
        locks,
        labels,
    );
    tokio::spawn(node_resizer::run(Arc::new(resizer), shutdown));
}

#[cfg(test)]
mod tests;
