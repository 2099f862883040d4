//! Resize status around NodeExpandVolume (`--report-resize-status`), as kubelet reports
//! it: `NodeResizeInProgress` when the node starts, the new `status.capacity` (and no
//! status key, no resize conditions) when it is done, the failure value and a
//! `NodeResizeError` condition when it fails terminally; nothing for a transient
//! failure, which kubelet retries. Events on the claim for each step.
//!
//! Best effort: a failed report is logged and never fails the RPC. The claim is the one
//! recorded with the volume at CreateVolume (NodeExpandVolume carries no volume
//! context); a claim of that name bound to another volume is left alone.

use std::sync::Arc;

use tracing::{info, warn};

use super::claim_status::{ClaimStatus, StatusError, Transition};
use super::classify::{Cause, Failure, classify};
use super::events::{self, ClaimEvents};
use super::{FailureValue, quantity};
use crate::k8s::claim_resize::{Claim, ResizeApi};
use crate::model::VolumeId;
use crate::model::full_message;
use crate::model::{ClaimRef, Terminal};
use crate::volume::Volumes;

/// Reporting as configured: off (kubelet reports, or no API), or against one server.
#[derive(Debug, Clone, Default)]
pub enum NodeReporting {
    #[default]
    Off,
    On(Arc<NodeReporter>),
}

#[derive(Debug)]
pub struct NodeReporter {
    status: ClaimStatus,
    events: ClaimEvents,
}

/// One NodeExpandVolume as reported so far.
#[derive(Debug, Default)]
pub struct Report {
    /// Namespace and name; `None`: nothing to report for this volume.
    claim: Option<(String, String)>,
    pv_name: Option<String>,
    /// The claim as last read or written.
    pvc: Option<Claim>,
    /// The size asked for (0: not given).
    required: u64,
    /// The claim already showed this size and no resize in progress: a repeated call,
    /// reported by nothing but a failure.
    already_done: bool,
}

impl NodeReporting {
    pub fn new(api: ResizeApi, node: &str, failure: FailureValue) -> Self {
        NodeReporting::On(Arc::new(NodeReporter {
            events: ClaimEvents::new(&api, node),
            status: ClaimStatus::new(api, failure),
        }))
    }

    /// Reports the start of a node expansion of `id` to `required` bytes.
    pub async fn started(&self, volumes: &Volumes, id: &VolumeId, required: u64) -> Report {
        let NodeReporting::On(reporter) = self else {
            return Report::default();
        };
        match volumes.get(id).await {
            Ok(record) => reporter.started(&record.claim, required).await,
            // The expansion reports the missing volume itself.
            Err(_) => Report::default(),
        }
    }

    /// Reports how the node expansion ended: any module's error says itself whether it
    /// is terminal (see [`Terminal`]).
    pub async fn finished<E: Terminal + Sync>(&self, report: Report, result: &Result<u64, E>) {
        if let NodeReporting::On(reporter) = self {
            reporter.finished(report, result).await;
        }
    }
}

fn bound_elsewhere(pvc: &Claim, pv_name: Option<&str>) -> bool {
    let bound = pvc.volume_name();
    matches!((bound, pv_name), (Some(bound), Some(ours)) if bound != ours)
}

impl NodeReporter {
    pub async fn started(&self, claim: &ClaimRef, required: u64) -> Report {
        let (Some(namespace), Some(name)) = (&claim.pvc_namespace, &claim.pvc_name) else {
            return Report::default();
        };
        let mut report = Report {
            claim: Some((namespace.clone(), name.clone())),
            pv_name: claim.pv_name.clone(),
            required,
            ..Report::default()
        };
        let pvc = match self.status.get(namespace, name).await {
            Ok(pvc) => pvc,
            Err(e) => {
                warn!(pvc = %format!("{namespace}/{name}"), error = %e, "cannot report the resize start");
                return report;
            }
        };
        if bound_elsewhere(&pvc, claim.pv_name.as_deref()) {
            info!(pvc = %format!("{namespace}/{name}"), "claim is bound to another volume; not reporting");
            report.claim = None;
            return report;
        }
        let at_size = pvc
            .capacity()
            .and_then(quantity::bytes)
            .is_some_and(|have| required > 0 && have >= required);
        if at_size && pvc.resize_status().is_none() {
            report.already_done = true;
            report.pvc = Some(pvc);
            return report;
        }
        let pvc = match self.status.apply(pvc.clone(), &Transition::NodeInProgress).await {
            Ok(updated) => updated,
            Err(e) => {
                warn!(pvc = %format!("{namespace}/{name}"), error = %e, "cannot report the resize start");
                pvc
            }
        };
        self.events
            .normal(
                &pvc,
                events::NODE_EXPANSION_STARTED,
                &format!("growing the volume on its node to {}", quantity::format(required)),
            )
            .await;
        report.pvc = Some(pvc);
        report
    }

    pub async fn finished<E: Terminal + Sync>(&self, report: Report, result: &Result<u64, E>) {
        let Some((namespace, name)) = report.claim.clone() else {
            return;
        };
        let pvc = match report.pvc {
            Some(pvc) => pvc,
            None => match self.status.get(&namespace, &name).await {
                Ok(pvc) if !bound_elsewhere(&pvc, report.pv_name.as_deref()) => pvc,
                Ok(_) => return,
                Err(e) => {
                    warn!(pvc = %format!("{namespace}/{name}"), error = %e, "cannot report the resize result");
                    return;
                }
            },
        };
        // Status first, then the event that tells of it.
        let (outcome, event) = match result {
            Ok(_) if report.already_done => (Ok(()), None),
            Ok(device_bytes) => {
                let bytes = if report.required > 0 {
                    report.required
                } else {
                    *device_bytes
                };
                let capacity = quantity::format(bytes);
                let note = format!("the volume on its node is now {capacity}");
                let written = self
                    .status
                    .apply(pvc.clone(), &Transition::Finished { capacity })
                    .await;
                (
                    written.map(drop),
                    Some((false, events::NODE_EXPANSION_SUCCEEDED, note)),
                )
            }
            Err(error) => {
                let message = full_message(error);
                match classify(Cause::Operation(error)) {
                    Failure::Terminal => {
                        let failed = Transition::NodeFailed {
                            message: format!("failed to expand the volume on its node: {message}"),
                        };
                        let written = self.status.apply(pvc.clone(), &failed).await;
                        (
                            written.map(drop),
                            Some((true, events::NODE_EXPANSION_FAILED, message)),
                        )
                    }
                    Failure::Transient => (
                        Ok(()),
                        Some((
                            true,
                            events::NODE_EXPANSION_RETRYING,
                            format!("will be retried: {message}"),
                        )),
                    ),
                }
            }
        };
        let outcome: Result<(), StatusError> = outcome;
        match event {
            Some((true, reason, note)) => self.events.warning(&pvc, reason, &note).await,
            Some((false, reason, note)) => self.events.normal(&pvc, reason, &note).await,
            None => {}
        }
        if let Err(e) = outcome {
            warn!(pvc = %format!("{namespace}/{name}"), error = %e, "cannot report the resize result");
        }
    }
}
