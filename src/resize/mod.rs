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
pub mod node_resizer;
pub mod quantity;
pub mod report;
pub mod status;

use std::future::Future;
use std::sync::Arc;

use anyhow::bail;
use clap::Args;
use kube::Client;
use tracing::info;

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

/// Command line of the resize features (flattened into `serve`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct ResizeArgs {
    /// Report node expansion in the claim's status as kubelet does
    /// (allocatedResourceStatuses, NodeResizeError condition, capacity) and as events.
    /// Off by default: kubelet 1.32 and newer already reports it, and two reporters only
    /// race each other. Turn on where kubelet does not (RecoverVolumeExpansionFailure
    /// off on the nodes but on in the API server).
    #[arg(long, env = "LOCALVOL_REPORT_RESIZE_STATUS")]
    pub report_resize_status: bool,
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
    /// Whether any resize feature needs the Kubernetes API.
    pub fn needs_api(&self) -> bool {
        self.report_resize_status || self.node_resizer
    }
}

/// The node-side reporter for the CSI node service, as `args` asks.
pub fn reporting(args: &ResizeArgs, client: Option<&Client>, node: &str) -> anyhow::Result<NodeReporting> {
    if !args.report_resize_status {
        return Ok(NodeReporting::Off);
    }
    let Some(client) = client else {
        bail!("--report-resize-status needs the Kubernetes API");
    };
    info!("reporting node expansion in claims' status");
    Ok(NodeReporting::new(
        client.clone(),
        node,
        args.resize_failure_value,
    ))
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
