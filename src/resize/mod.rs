//! Volume expansion beyond the CSI calls: the claim's resize status
//! (`--report-resize-status`) and, for clusters without a central external-resizer,
//! localvol as the resizer of its own node's claims (`--node-resizer`).
//!
//! The volume work itself is `Volumes::expand` (controller side: grow the backing
//! store) and `Volumes::expand_on_node` (node side: device view and filesystem); this
//! module decides when to call them and tells Kubernetes what happened, with the
//! status values and conditions kubelet and external-resizer use.

pub mod classify;
mod events;
pub mod kubelet;
pub mod node_resizer;
pub mod quantity;
pub mod report;
pub mod status;

use std::future::Future;
use std::sync::Arc;

use anyhow::bail;
use clap::Args;
use kube::Client;
use tracing::{info, warn};

pub use report::NodeReporting;

use crate::locks::VolumeLocks;
use crate::volume::Volumes;

/// The terminal failure value written to `allocatedResourceStatuses`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum FailureValue {
    /// From the API server's version: `NodeResizeFailed` before 1.31, else
    /// `NodeResizeInfeasible`.
    #[default]
    Auto,
    #[value(name = "NodeResizeFailed")]
    NodeResizeFailed,
    #[value(name = "NodeResizeInfeasible")]
    NodeResizeInfeasible,
}

/// `--report-resize-status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportResizeStatus {
    /// On where this node's kubelet does not report node expansion itself.
    #[default]
    Auto,
    #[value(alias = "true")]
    On,
    #[value(alias = "false")]
    Off,
}

/// Command line of the resize features (flattened into `serve`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct ResizeArgs {
    /// Report node expansion in the claim's status as kubelet does
    /// (allocatedResourceStatuses, NodeResizeError condition, capacity) and as events.
    /// auto: only where this node's kubelet does not report it itself (before 1.32, as
    /// the Node object states its version), so that one writer owns each claim's node
    /// step; on: always (a 1.32+ kubelet with RecoverVolumeExpansionFailure off); off:
    /// never. A bare `--report-resize-status` means on.
    #[arg(
        long,
        env = "LOCALVOL_REPORT_RESIZE_STATUS",
        value_enum,
        num_args = 0..=1,
        default_value_t = ReportResizeStatus::Auto,
        default_missing_value = "on"
    )]
    pub report_resize_status: ReportResizeStatus,
    /// Act as the resizer of the claims whose volumes live on this node: grow the
    /// volume when a claim asks for more than it has (and its StorageClass allows
    /// expansion), record the size on the PersistentVolume and drive the claim's
    /// status; kubelet then grows the filesystem through NodeExpandVolume. For clusters
    /// without a central csi-resizer for localvol.csi.dev: never run both.
    #[arg(long, env = "LOCALVOL_NODE_RESIZER")]
    pub node_resizer: bool,
    /// Name of the terminal failure value: auto (from the API server's version),
    /// NodeResizeFailed (servers before 1.31) or NodeResizeInfeasible (1.31 on). The
    /// controller value follows (ControllerResizeFailed / ControllerResizeInfeasible).
    #[arg(long, env = "LOCALVOL_RESIZE_FAILURE_VALUE", value_enum, default_value_t = FailureValue::Auto)]
    pub resize_failure_value: FailureValue,
}

impl ResizeArgs {
    /// Whether any resize feature needs the Kubernetes API (`auto` does without it).
    pub fn needs_api(&self) -> bool {
        self.report_resize_status == ReportResizeStatus::On || self.node_resizer
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
        (ReportResizeStatus::Auto, Some(client)) => auto_reporting(client, node).await.then_some(client),
    };
    let Some(client) = reporting_client else {
        return Ok(NodeReporting::Off);
    };
    info!("reporting node expansion in claims' status");
    Ok(NodeReporting::new(
        client.clone(),
        node,
        args.resize_failure_value,
    ))
}

/// `auto`: on for a kubelet that does not report node expansion itself. A version that
/// cannot be read leaves reporting off (two writers racing on a claim are worse than a
/// status that kubelet may well write) and says so.
async fn auto_reporting(client: &Client, node: &str) -> bool {
    match kubelet::kubelet_version(client, node).await {
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
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let resizer = node_resizer::NodeResizer::new(client, node, args.resize_failure_value, volumes, locks);
    tokio::spawn(node_resizer::run(Arc::new(resizer), shutdown));
}

#[cfg(test)]
mod tests;
