//! The background task: when each volume's next run is due, run it.
//!
//! The scheduler keeps one entry per volume of this node: its resolved schedule and its
//! next (staggered) run time. It recomputes them when the volume set changes (a rescan
//! every minute) and whenever the [`Cluster`] reports a change (an annotation, the
//! csi-addons ConfigMap), so such changes take effect without a restart. A next run is
//! kept while the schedule that produced it stands, so a recompute never skips a run
//! that is due. Runs go through the shared [`Runner`]: a busy volume is retried after
//! `busy_retry`, never waited for; runs beyond the node's concurrency limit queue there.
//!
//! Runs missed while the daemon was down are not made up: the next one follows the
//! schedule from the time the daemon starts.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use super::ReclaimError;
use super::run::{ReclaimOutcome, Runner};
use crate::model::VolumeId;
use crate::reclaim_policy::schedule::Schedule;
use crate::reclaim_policy::{ClaimObjects, ClusterSettings, NodePolicy, Resolution, resolve};
use crate::volume::VolumeError;

/// A PVC by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimKey {
    pub namespace: String,
    pub name: String,
}

/// The cluster objects a claim's schedule depends on, owned.
#[derive(Debug, Clone, Default)]
pub struct ClusterObjects {
    pub pvc: Option<PersistentVolumeClaim>,
    pub namespace: Option<Namespace>,
    pub storage_class: Option<StorageClass>,
}

impl ClusterObjects {
    fn borrowed(&self) -> ClaimObjects<'_> {
        ClaimObjects {
            pvc: self.pvc.as_ref(),
            namespace: self.namespace.as_ref(),
            storage_class: self.storage_class.as_ref(),
        }
    }
}

/// What a finished run reports back to the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    pub finished: Timestamp,
    pub succeeded: bool,
    pub summary: String,
}

/// The cluster as the scheduler sees it: cached objects, change notifications, and
/// where results are written. [`NoCluster`] when there is no Kubernetes.
#[async_trait]
pub trait Cluster: Send + Sync + 'static {
    /// From now on, keep these claims' objects cached and watched (and no others).
    fn track(&self, claims: &BTreeSet<ClaimKey>);
    fn objects(&self, claim: &ClaimKey) -> ClusterObjects;
    fn settings(&self) -> ClusterSettings;
    /// Resolves when something tracked may have changed.
    async fn changed(&self);
    /// Writes a run's result (best effort: failures are logged, never retried).
    async fn report(&self, claim: &ClaimKey, report: &RunReport);
    /// Tells the claim's owner that its schedule is invalid (best effort).
    async fn warn_schedule(&self, claim: &ClaimKey, warning: &str);
}

/// No Kubernetes: only the node's configuration decides.
#[derive(Debug, Default)]
pub struct NoCluster;

#[async_trait]
impl Cluster for NoCluster {
    fn track(&self, _: &BTreeSet<ClaimKey>) {}
    fn objects(&self, _: &ClaimKey) -> ClusterObjects {
        ClusterObjects::default()
    }
    fn settings(&self) -> ClusterSettings {
        ClusterSettings::default()
    }
    async fn changed(&self) {
        std::future::pending::<()>().await
    }
    async fn report(&self, _: &ClaimKey, _: &RunReport) {}
    async fn warn_schedule(&self, _: &ClaimKey, _: &str) {}
}

#[derive(Debug, Clone)]
struct Entry {
    claim: Option<ClaimKey>,
    /// What the stagger hashes: the PVC's UID when known, else the volume id.
    stagger_key: String,
    schedule: Option<Schedule>,
    window: Duration,
    next: Option<Timestamp>,
    running: bool,
    warned: Option<String>,
}

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub policy: NodePolicy,
    /// How soon a busy volume is tried again.
    pub busy_retry: Duration,
    /// How often the volume list is read again.
    pub rescan: Duration,
}

pub struct Scheduler {
    runner: Runner,
    cluster: Arc<dyn Cluster>,
    config: SchedulerConfig,
    entries: BTreeMap<VolumeId, Entry>,
    settings_warnings: Vec<String>,
}

fn after(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

impl Scheduler {
    pub fn new(runner: Runner, cluster: Arc<dyn Cluster>, config: SchedulerConfig) -> Self {
        Self {
            runner,
            cluster,
            config,
            entries: BTreeMap::new(),
            settings_warnings: Vec::new(),
        }
    }

    /// The next run of a volume, if it has a schedule.
    pub fn next_run(&self, id: &VolumeId) -> Option<Timestamp> {
        self.entries.get(id).and_then(|e| e.next)
    }

    /// Reads the volumes and the cluster's objects again and reschedules what changed.
    pub async fn refresh(&mut self, now: Timestamp) -> Result<(), VolumeError> {
        let records = self.runner.volumes().list().await?;
        let claims: BTreeSet<ClaimKey> = records
            .iter()
            .filter_map(|r| {
                Some(ClaimKey {
                    namespace: r.claim.pvc_namespace.clone()?,
                    name: r.claim.pvc_name.clone()?,
                })
            })
            .collect();
        self.cluster.track(&claims);
        let settings = self.cluster.settings();
        if settings.warnings != self.settings_warnings {
            for w in &settings.warnings {
                warn!(warning = %w, "csi-addons configuration");
            }
            self.settings_warnings = settings.warnings.clone();
        }
        let mut seen = BTreeSet::new();
        let mut warnings = Vec::new();
        for record in records {
            let claim = match (&record.claim.pvc_namespace, &record.claim.pvc_name) {
                (Some(namespace), Some(name)) => Some(ClaimKey {
                    namespace: namespace.clone(),
                    name: name.clone(),
                }),
                _ => None,
            };
            let objects = claim
                .as_ref()
                .map(|c| self.cluster.objects(c))
                .unwrap_or_default();
            let resolution = resolve(&objects.borrowed(), &settings, &self.config.policy);
            let stagger_key = objects
                .pvc
                .as_ref()
                .and_then(|p| p.metadata.uid.clone())
                .unwrap_or_else(|| record.id.to_string());
            let (schedule, warning) = match resolution {
                Resolution::Scheduled {
                    schedule, warning, ..
                } => (Some(schedule), warning),
                Resolution::Disabled(_) | Resolution::Unscheduled => (None, None),
            };
            let entry = self.entries.entry(record.id.clone()).or_insert_with(|| Entry {
                claim: claim.clone(),
                stagger_key: stagger_key.clone(),
                schedule: None,
                window: settings.stagger_window,
                next: None,
                running: false,
                warned: None,
            });
            let changed = entry.schedule != schedule
                || entry.stagger_key != stagger_key
                || entry.window != settings.stagger_window
                || (entry.next.is_none() && !entry.running);
            entry.claim = claim.clone();
            entry.stagger_key = stagger_key;
            entry.window = settings.stagger_window;
            if changed {
                entry.next = schedule
                    .as_ref()
                    .and_then(|s| s.next_staggered_after(now, &entry.stagger_key, entry.window));
                if entry.schedule != schedule {
                    info!(
                        volume.id = %record.id,
                        schedule = schedule.as_ref().map(|s| s.to_string()).unwrap_or_default(),
                        next = entry.next.map(|n| n.to_string()).unwrap_or_default(),
                        "reclaim schedule"
                    );
                }
                entry.schedule = schedule;
            }
            if warning != entry.warned {
                if let (Some(w), Some(c)) = (&warning, &claim) {
                    warnings.push((c.clone(), w.clone()));
                }
                entry.warned = warning;
            }
            seen.insert(record.id);
        }
        self.entries.retain(|id, _| seen.contains(id));
        for (claim, warning) in warnings {
            warn!(pvc.namespace = %claim.namespace, pvc.name = %claim.name, %warning, "invalid reclaim schedule");
            self.cluster.warn_schedule(&claim, &warning).await;
        }
        Ok(())
    }

    fn due(&self, now: Timestamp) -> Vec<VolumeId> {
        self.entries
            .iter()
            .filter(|(_, e)| !e.running && e.next.is_some_and(|n| n <= now))
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn start(&mut self, id: &VolumeId, runs: &mut JoinSet<(VolumeId, Result<ReclaimOutcome, ReclaimError>)>) {
        if let Some(entry) = self.entries.get_mut(id) {
            entry.running = true;
        }
        let runner = self.runner.clone();
        let id = id.clone();
        runs.spawn(async move {
            let result = runner.reclaim(&id, &[]).await;
            (id, result)
        });
    }

    async fn finish(&mut self, id: VolumeId, result: Result<ReclaimOutcome, ReclaimError>, now: Timestamp) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        entry.running = false;
        let report = match &result {
            Err(ReclaimError::Busy(_)) => {
                debug!(volume.id = %id, "busy; trying again later");
                entry.next = Some(after(now, self.config.busy_retry));
                return;
            }
            Err(ReclaimError::NotStaged { .. }) => {
                debug!(volume.id = %id, "not staged on this node; nothing to trim");
                None
            }
            Ok(outcome) => Some(RunReport {
                finished: now,
                succeeded: true,
                summary: outcome.summary(),
            }),
            Err(e) => {
                warn!(volume.id = %id, error = %crate::model::full_message(e), "reclaim failed");
                Some(RunReport {
                    finished: now,
                    succeeded: false,
                    summary: format!("failed: {}", crate::model::full_message(e)),
                })
            }
        };
        entry.next = entry
            .schedule
            .as_ref()
            .and_then(|s| s.next_staggered_after(now, &entry.stagger_key, entry.window));
        if let (Some(report), Some(claim)) = (report, entry.claim.clone()) {
            self.cluster.report(&claim, &report).await;
        }
    }

    /// Starts every run due at `now`, waits for them all and records their results.
    /// Returns each volume's result label. (The background loop does the same without
    /// waiting; this is its synchronous form, for tests and one-shot use.)
    pub async fn run_due(&mut self, now: Timestamp) -> Vec<(VolumeId, &'static str)> {
        let mut runs = JoinSet::new();
        for id in self.due(now) {
            self.start(&id, &mut runs);
        }
        let mut labels = Vec::new();
        while let Some(joined) = runs.join_next().await {
            let (id, result) = joined.expect("reclaim runs do not panic");
            labels.push((
                id.clone(),
                match &result {
                    Ok(o) => o.label(),
                    Err(e) => e.label(),
                },
            ));
            self.finish(id, result, now).await;
        }
        labels.sort();
        labels
    }

    /// Runs until `shutdown` resolves. Runs still in flight then are abandoned (a FITRIM
    /// already in the kernel completes on its own).
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut runs = JoinSet::new();
        let mut rescan = tokio::time::interval(self.config.rescan);
        rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let now = Timestamp::now();
            for id in self.due(now) {
                self.start(&id, &mut runs);
            }
            let until_next = self
                .entries
                .values()
                .filter(|e| !e.running)
                .filter_map(|e| e.next)
                .min()
                .map(|n| n.duration_since(now).unsigned_abs())
                .unwrap_or(self.config.rescan)
                .min(self.config.rescan);
            tokio::select! {
                () = &mut shutdown => break,
                () = self.cluster.changed() => self.refresh_logged().await,
                _ = rescan.tick() => self.refresh_logged().await,
                Some(joined) = runs.join_next(), if !runs.is_empty() => {
                    if let Ok((id, result)) = joined {
                        self.finish(id, result, Timestamp::now()).await;
                    }
                }
                () = tokio::time::sleep(until_next) => {}
            }
        }
        info!(in_flight = runs.len(), "reclaim scheduler stopped");
    }

    async fn refresh_logged(&mut self) {
        if let Err(e) = self.refresh(Timestamp::now()).await {
            warn!(error = %crate::model::full_message(&e), "cannot list volumes for reclaim");
        }
    }
}

#[cfg(test)]
mod tests;
