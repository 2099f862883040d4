//! The scheduler over fakes: next runs, due runs, busy retries, rescheduling when the
//! cluster's view changes, and what is reported back.

use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::model::ClaimRef;
use crate::model::VolumeMode;
use crate::reclaim::testing::Fixture;
use crate::reclaim_policy::SCHEDULE_ANNOTATION;
use crate::reclaim_policy::schedule::stagger_offset;

/// A cluster whose PVC annotations the test sets, recording what is written back.
#[derive(Default)]
struct FakeCluster {
    schedule: Mutex<Option<String>>,
    tracked: Mutex<BTreeSet<ClaimKey>>,
    reports: Mutex<Vec<(ClaimKey, RunReport)>>,
    warnings: Mutex<Vec<String>>,
}

#[async_trait]
impl Cluster for FakeCluster {
    fn track(&self, claims: &BTreeSet<ClaimKey>) {
        *self.tracked.lock().unwrap() = claims.clone();
    }
    fn objects(&self, claim: &ClaimKey) -> ClusterObjects {
        let annotations = self
            .schedule
            .lock()
            .unwrap()
            .clone()
            .map(|s| BTreeMap::from([(SCHEDULE_ANNOTATION.to_string(), s)]));
        ClusterObjects {
            pvc: Some(PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(claim.name.clone()),
                    uid: Some("uid-1".to_string()),
                    annotations,
                    ..ObjectMeta::default()
                },
                ..Default::default()
            }),
            ..ClusterObjects::default()
        }
    }
    fn settings(&self) -> ClusterSettings {
        ClusterSettings::default()
    }
    async fn changed(&self) {
        std::future::pending::<()>().await
    }
    async fn report(&self, claim: &ClaimKey, report: &RunReport) {
        self.reports.lock().unwrap().push((claim.clone(), report.clone()));
    }
    async fn warn_schedule(&self, _: &ClaimKey, warning: &str) {
        self.warnings.lock().unwrap().push(warning.to_string());
    }
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn config(policy: NodePolicy) -> SchedulerConfig {
    SchedulerConfig {
        policy,
        busy_retry: Duration::from_secs(60),
        rescan: Duration::from_secs(60),
    }
}

fn daily() -> NodePolicy {
    NodePolicy {
        default_schedule: Some(Schedule::Daily),
        ..NodePolicy::default()
    }
}

const TWO_HOURS: i64 = 7200;

#[tokio::test]
async fn the_node_default_schedules_every_volume_staggered_by_its_id() {
    let f = Fixture::new(Duration::from_secs(60)).await;
    let id = f.create("pvc-1", VolumeMode::Filesystem).await;
    let mut s = Scheduler::new(f.runner.clone(), Arc::new(NoCluster), config(daily()));
    let now = ts("2024-05-15T10:00:00Z");
    s.refresh(now).await.unwrap();
    let next = s.next_run(&id).unwrap();
    let midnight = ts("2024-05-16T00:00:00Z");
    assert_eq!(
        next.as_second() - midnight.as_second(),
        stagger_offset(&id.to_string(), TWO_HOURS)
    );
    // A refresh later keeps the run that is due.
    s.refresh(ts("2024-05-15T23:00:00Z")).await.unwrap();
    assert_eq!(s.next_run(&id), Some(next));

    // Not yet due: nothing runs.
    assert!(s.run_due(ts("2024-05-15T23:59:00Z")).await.is_empty());
    // Due but not staged: recorded as such, and the next day is scheduled.
    assert_eq!(s.run_due(next).await, vec![(id.clone(), "not_staged")]);
    let tomorrow = s.next_run(&id).unwrap();
    assert_eq!(tomorrow.as_second() - next.as_second(), 86_400);
    f.stage("pvc-1").await;
    assert_eq!(s.run_due(tomorrow).await, vec![(id.clone(), "trimmed")]);
    assert_eq!(f.fitrims().len(), 1);
}

#[tokio::test]
async fn a_busy_volume_is_retried_later_without_waiting() {
    let f = Fixture::new(Duration::from_secs(60)).await;
    let id = f.create("pvc-1", VolumeMode::Filesystem).await;
    f.stage("pvc-1").await;
    let mut s = Scheduler::new(f.runner.clone(), Arc::new(NoCluster), config(daily()));
    s.refresh(ts("2024-05-15T10:00:00Z")).await.unwrap();
    let due = s.next_run(&id).unwrap();
    let held = f.locks.try_lock(&id.token, "NodePublishVolume").unwrap();
    let started = std::time::Instant::now();
    assert_eq!(s.run_due(due).await, vec![(id.clone(), "busy")]);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "did not wait for the lock"
    );
    let retry = s.next_run(&id).unwrap();
    assert_eq!(retry.as_second() - due.as_second(), 60);
    assert!(f.fitrims().is_empty());
    drop(held);
    assert_eq!(s.run_due(retry).await, vec![(id.clone(), "trimmed")]);
}

#[tokio::test]
async fn cluster_changes_reschedule_and_results_are_reported() {
    let f = Fixture::new(Duration::from_secs(60)).await;
    let claim = ClaimRef {
        pvc_name: Some("pvc-1".to_string()),
        pvc_namespace: Some("apps".to_string()),
        pv_name: None,
    };
    let id = f.create_for("pvc-1", VolumeMode::Filesystem, claim).await;
    let _other = f.create("pvc-2", VolumeMode::Filesystem).await;
    let cluster = Arc::new(FakeCluster::default());
    let mut s = Scheduler::new(
        f.runner.clone(),
        Arc::clone(&cluster) as Arc<dyn Cluster>,
        config(NodePolicy::default()),
    );
    let now = ts("2024-05-15T10:00:00Z");
    s.refresh(now).await.unwrap();
    assert_eq!(
        *cluster.tracked.lock().unwrap(),
        BTreeSet::from([ClaimKey {
            namespace: "apps".to_string(),
            name: "pvc-1".to_string()
        }])
    );
    assert_eq!(s.next_run(&id), None, "no schedule anywhere");

    *cluster.schedule.lock().unwrap() = Some("@hourly".to_string());
    s.refresh(now).await.unwrap();
    let hourly = s.next_run(&id).unwrap();
    assert_eq!(
        hourly.as_second() - ts("2024-05-15T10:00:00Z").as_second(),
        stagger_offset("uid-1", 3600),
        "the 10:00 run, staggered by the PVC's UID within its hour, is still ahead"
    );

    // An invalid schedule: @weekly, one warning however often it is seen.
    *cluster.schedule.lock().unwrap() = Some("0 0 31 2 * *".to_string());
    s.refresh(now).await.unwrap();
    s.refresh(now).await.unwrap();
    assert_eq!(cluster.warnings.lock().unwrap().len(), 1);
    let weekly = s.next_run(&id).unwrap();
    assert_eq!(
        Some(weekly),
        Schedule::Weekly.next_staggered_after(now, "uid-1", Duration::from_secs(7200))
    );

    f.stage("pvc-1").await;
    f.fitrim_punches("pvc-1", Duration::ZERO);
    assert_eq!(s.run_due(weekly).await, vec![(id.clone(), "trimmed")]);
    let reports = cluster.reports.lock().unwrap().clone();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].0.name, "pvc-1");
    assert!(reports[0].1.succeeded);
    assert_eq!(reports[0].1.finished, weekly);
    assert!(reports[0].1.summary.starts_with("reclaimed "), "{:?}", reports[0]);

    // A failure is reported too.
    f.syscalls.fail_next("FITRIM", libc::EIO);
    let next = s.next_run(&id).unwrap();
    assert_eq!(s.run_due(next).await, vec![(id.clone(), "syscall")]);
    let reports = cluster.reports.lock().unwrap().clone();
    assert!(!reports[1].1.succeeded);
    assert!(reports[1].1.summary.contains("FITRIM"), "{:?}", reports[1]);

    // A deleted volume is forgotten.
    f.syscalls
        .detach_loop(std::path::Path::new(crate::reclaim::testing::DEV));
    std::fs::remove_file(f.path("loop/pvc-1.json")).unwrap();
    s.refresh(now).await.unwrap();
    assert_eq!(s.next_run(&id), None);
    assert!(cluster.tracked.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_loop_stops_on_shutdown() {
    let f = Fixture::new(Duration::from_secs(60)).await;
    f.create("pvc-1", VolumeMode::Filesystem).await;
    let s = Scheduler::new(f.runner.clone(), Arc::new(NoCluster), config(daily()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(s.run(async move {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert!(!task.is_finished());
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("stopped")
        .unwrap();
}
