//! The resize settings of `serve` (flattened into its command line).

use clap::Args;

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
