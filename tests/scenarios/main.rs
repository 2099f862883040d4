//! Cluster scenarios in Rust, over kube-rs, against a cluster the harness brought up
//! (tests/cluster/run.sh on the host; the guest's node through tests/vm/cluster.sh) with
//! localvol deployed from an overlay and its kubelet driving it. Each scenario is one
//! `#[ignore]`d test: a plain `cargo test` reports it ignored, and the scenario's shell
//! entry (tests/cluster/scenarios/) runs it by name with `--ignored`, the run's facts in
//! the environment ([`Run::from_env`]).
//!
//! The shell ones move here one by one (issue 45).

mod api_load;
mod audit;
mod daemon_restart;
mod metrics;
mod node;
mod registration;
mod run;
mod volume_health;

pub use run::Run;

/// Runs `scenario` on the run the environment describes, in a namespace of its own that
/// goes afterwards whatever the outcome, and panics with the scenario's failure.
pub async fn scenario<F, Fut>(name: &str, scenario: F)
where
    F: FnOnce(Run) -> Fut,
    Fut: Future<Output = run::Result>,
{
    let run = Run::from_env(name).await;
    run.create_namespace().await;
    let outcome = scenario(run.clone()).await;
    let cleanup = run.delete_namespace().await;
    outcome.unwrap_or_else(|e| panic!("{name}: {e}"));
    cleanup.unwrap_or_else(|e| panic!("{name}: cleanup: {e}"));
    run.note(&format!("{name}: PASS"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with localvol deployed: tests/cluster/scenarios/s1_registration.sh runs it"]
async fn s1_registration() {
    scenario("s1_registration", registration::registered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with localvol deployed: tests/cluster/scenarios/s6_daemon_restart.sh runs it"]
async fn s6_daemon_restart() {
    scenario(
        "s6_daemon_restart",
        daemon_restart::workload_outlives_a_killed_daemon,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with localvol deployed: tests/cluster/scenarios/s7_metrics.sh runs it"]
async fn s7_metrics() {
    scenario("s7_metrics", metrics::volume_calls_counted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with localvol deployed and an audit log: tests/cluster/scenarios/s8_api_load.sh runs it"]
async fn s8_api_load() {
    scenario("s8_api_load", api_load::footprint_follows_own_claims).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with localvol deployed: tests/cluster/scenarios/s15_volume_health.sh runs it"]
async fn s15_volume_health() {
    scenario("s15_volume_health", volume_health::loop_image_deleted).await;
}
