//! Percentiles, the tables the run prints, and `target/bench/cluster.json`.

use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile of milliseconds.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One pod start, split at the marks the watches saw (milliseconds).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Start {
    pub total: f64,
    /// Created until the scheduler's first pass chose the node (selected-node; for the
    /// floor, until the pod was bound).
    pub first_pass: f64,
    /// Selected node until the claim was Bound: external-provisioner, CreateVolume, PV
    /// controller.
    pub provision: f64,
    /// Claim Bound until the pod was bound: the scheduler's volume binder noticing.
    pub bind_wait: f64,
    /// Pod bound until Running: kubelet (NodeStage, NodePublish, the container).
    pub node: f64,
}

#[derive(Debug, Default, Serialize)]
pub struct StartSummary {
    pub kind: &'static str,
    pub samples: Vec<Start>,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub first_pass_p50: f64,
    pub provision_p50: f64,
    pub bind_wait_p50: f64,
    pub node_p50: f64,
}

impl StartSummary {
    pub fn new(kind: &'static str, samples: Vec<Start>) -> Self {
        let col = |f: fn(&Start) -> f64| samples.iter().map(f).collect::<Vec<_>>();
        let totals = col(|s| s.total);
        Self {
            kind,
            p50: percentile(&totals, 50.0),
            p90: percentile(&totals, 90.0),
            p99: percentile(&totals, 99.0),
            first_pass_p50: percentile(&col(|s| s.first_pass), 50.0),
            provision_p50: percentile(&col(|s| s.provision), 50.0),
            bind_wait_p50: percentile(&col(|s| s.bind_wait), 50.0),
            node_p50: percentile(&col(|s| s.node), 50.0),
            samples,
        }
    }

    /// The percentiles alone (a burst's report keeps no samples).
    pub fn without_samples(mut self) -> Self {
        self.samples.clear();
        self
    }

    /// The scheduler's share at a percentile: the volume binder's wait.
    pub fn bind_wait(&self, p: f64) -> f64 {
        percentile(&self.samples.iter().map(|s| s.bind_wait).collect::<Vec<_>>(), p)
    }
}

/// Mean milliseconds per call, by source.
#[derive(Debug, Default, Serialize)]
pub struct CallTimes {
    pub kubelet_stage: Option<f64>,
    pub kubelet_publish: Option<f64>,
    pub own_create: Option<f64>,
    pub own_stage: Option<f64>,
    pub own_publish: Option<f64>,
}

#[derive(Debug, Default, Serialize)]
pub struct Burst {
    pub pods: usize,
    pub kind: &'static str,
    pub all_running_ms: f64,
    pub pods_gone_ms: f64,
    pub all_gone_ms: f64,
    pub requests_per_start: f64,
    pub requests_per_delete: f64,
    /// Each pod's time from the burst's start, split as a pod start is (p50s).
    pub phases_p50: StartSummary,
    pub start_requests: Option<crate::audit::Requests>,
    pub delete_requests: Option<crate::audit::Requests>,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub rounds: usize,
    pub starts: Vec<StartSummary>,
    pub calls: Vec<(&'static str, CallTimes)>,
    pub bursts: Vec<Burst>,
    pub restarts: Vec<crate::restart::Restart>,
    pub setup_500_ms: Option<f64>,
}

fn cell(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.1}"))
}

impl Report {
    fn start(&self, kind: &str) -> Option<&StartSummary> {
        self.starts.iter().find(|s| s.kind == kind)
    }

    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(
            md,
            "### Pod with a new volume until Running ({} pods each, interleaved; ms)\n",
            self.rounds
        );
        let _ = writeln!(
            md,
            "| | p50 | p90 | p99 | first pass p50 | provisioning p50 | bind wait p50 | node p50 |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
        for s in &self.starts {
            let _ = writeln!(
                md,
                "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
                s.kind, s.p50, s.p90, s.p99, s.first_pass_p50, s.provision_p50, s.bind_wait_p50, s.node_p50
            );
        }
        if let (Some(floor), Some(ours), Some(peer)) =
            (self.start("floor"), self.start("localvol"), self.start("peer"))
        {
            for (p, label, value, peer_value) in [
                (50.0, "p50", ours.p50, peer.p50),
                (90.0, "p90", ours.p90, peer.p90),
            ] {
                let floor_p = if p == 50.0 { floor.p50 } else { floor.p90 };
                let excess = value - (floor_p + ours.bind_wait(p));
                let _ = writeln!(
                    md,
                    "\nlocalvol {label}: {excess:+.0} ms over the floor plus the scheduler's bind wait (goal ≤ 50); {:.2}× the peer",
                    value / peer_value
                );
            }
        }
        let _ = writeln!(md, "\n### Driver time per volume (mean ms per call)\n");
        let _ = writeln!(
            md,
            "| | kubelet: NodeStage | kubelet: NodePublish | own: Create | own: Stage | own: Publish |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|");
        for (kind, c) in &self.calls {
            let _ = writeln!(
                md,
                "| {kind} | {} | {} | {} | {} | {} |",
                cell(c.kubelet_stage),
                cell(c.kubelet_publish),
                cell(c.own_create),
                cell(c.own_stage),
                cell(c.own_publish)
            );
        }
        let _ = writeln!(
            md,
            "\n### Bursts: pods with new volumes created at once (s; API requests per pod by the driver's pods)\n"
        );
        let _ = writeln!(
            md,
            "| pods | | all Running | pods gone | volumes gone | requests per start | per delete |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for b in &self.bursts {
            let _ = writeln!(
                md,
                "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                b.pods,
                b.kind,
                b.all_running_ms / 1000.0,
                b.pods_gone_ms / 1000.0,
                b.all_gone_ms / 1000.0,
                b.requests_per_start,
                b.requests_per_delete
            );
        }
        let _ = writeln!(
            md,
            "\nWhere a burst's pods spend their time, from the burst's start (p50, ms):\n"
        );
        let _ = writeln!(
            md,
            "| pods | | until Running | first pass | provisioning | bind wait | node |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for b in &self.bursts {
            let p = &b.phases_p50;
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
                b.pods, b.kind, p.p50, p.first_pass_p50, p.provision_p50, p.bind_wait_p50, p.node_p50
            );
        }
        for n in self
            .bursts
            .iter()
            .map(|b| b.pods)
            .collect::<std::collections::BTreeSet<_>>()
        {
            let of = |kind| self.bursts.iter().find(|b| b.pods == n && b.kind == kind);
            if let (Some(ours), Some(peer)) = (of("localvol"), of("peer")) {
                let _ = writeln!(
                    md,
                    "\n{n} pods: localvol/peer {:.2}× to all Running, {:.2}× to all gone",
                    ours.all_running_ms / peer.all_running_ms,
                    ours.all_gone_ms / peer.all_gone_ms
                );
            }
        }
        let _ = writeln!(md, "\n### Daemon restart (ms from deleting the daemon pod)\n");
        if let Some(setup) = self.setup_500_ms {
            let _ = writeln!(
                md,
                "(localvol's volumes for its restart with volumes took {:.1} s to create, stage and publish)\n",
                setup / 1000.0
            );
        }
        let _ = writeln!(
            md,
            "| daemon | its volumes | on the node | old pod gone | new Running | Ready | first answer | all stats | serving | RSS MiB |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
        for r in &self.restarts {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} |",
                r.daemon,
                r.volumes,
                r.node_volumes,
                r.old_pod_gone_ms,
                r.new_pod_running_ms,
                r.ready_ms,
                r.first_stats_ms,
                r.all_stats_ms,
                r.serving_ms,
                r.rss_kib as f64 / 1024.0
            );
        }
        md
    }
}
