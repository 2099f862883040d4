//! Cluster scenarios in Rust, over kube-rs, against a cluster the harness brought up
//! (tests/cluster/run.sh on the host; the guest's node through tests/vm/cluster.sh) with
//! localvol deployed from an overlay and its kubelet driving it. Each scenario is one
//! `#[ignore]`d test: a plain `cargo test` reports it ignored, and the scenario's shell
//! entry (tests/cluster/scenarios/) runs it by name with `--ignored`, the run's facts in
//! the environment ([`Run::from_env`]).
//!
//! Every scenario of tests/cluster/scenarios is here but scenario 10, a test target of
//! its own (tests/e2e_k8s.rs).

mod api_load;
mod audit;
mod daemon_restart;
mod e2e_storage;
mod encryption;
mod ephemeral;
mod expansion;
mod helm_install;
mod metrics;
mod mixed_node;
mod node;
mod reclaim;
mod registration;
mod run;
mod snapshots;
mod volume_health;
mod volumes;

pub use run::Run;

/// Runs `scenario` on the run the environment describes, in a namespace of its own that
/// goes afterwards whatever the outcome (with the StorageClasses it made), and panics
/// with the scenario's failure.
pub async fn scenario<F, Fut>(name: &str, scenario: F)
where
    F: FnOnce(Run) -> Fut,
    Fut: Future<Output = run::Result>,
{
    let run = Run::from_env(name).await;
    run.create_namespace().await;
    let outcome = scenario(run.clone()).await;
    let cleanup = run.delete_namespace().await;
    let classes = run.delete_test_storage_classes().await;
    outcome.unwrap_or_else(|e| panic!("{name}: {e}"));
    cleanup.unwrap_or_else(|e| panic!("{name}: cleanup: {e}"));
    classes.unwrap_or_else(|e| panic!("{name}: cleanup of its StorageClasses: {e}"));
    run.note(&format!("{name}: PASS"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with localvol deployed: tests/cluster/scenarios/s1_registration.sh runs it"]
async fn s1_registration() {
    scenario("s1_registration", registration::registered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with localvol deployed: tests/cluster/scenarios/s2_volumes.sh runs it"]
async fn s2_volumes() {
    scenario("s2_volumes", volumes::volumes_side_by_side).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with localvol deployed: tests/cluster/scenarios/s3_ephemeral.sh runs it"]
async fn s3_ephemeral() {
    scenario("s3_ephemeral", ephemeral::claim_follows_its_pod).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with localvol deployed: tests/cluster/scenarios/s4_expansion.sh runs it"]
async fn s4_expansion() {
    scenario("s4_expansion", expansion::grows_online).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with localvol deployed: tests/cluster/scenarios/s5_reclaim.sh runs it"]
async fn s5_reclaim() {
    scenario("s5_reclaim", reclaim::freed_blocks_given_back).await;
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
#[ignore = "needs a cluster with localvol deployed and the snapshot-controller: tests/cluster/scenarios/s9_snapshots.sh runs it"]
async fn s9_snapshots() {
    scenario("s9_snapshots", snapshots::copies_hold_their_moment).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with localvol deployed and the kit's e2e.test: tests/cluster/scenarios/s11_e2e_storage.sh runs it"]
async fn s11_e2e_storage() {
    scenario("s11_e2e_storage", e2e_storage::kubernetes_storage_suites).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the guest's mixed configuration: tests/cluster/scenarios/s12_mixed_node.sh runs it"]
async fn s12_mixed_node() {
    scenario("s12_mixed_node", mixed_node::missing_class_reported_then_served).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an LVM class and dm-crypt (the guest's lvm-thin): tests/cluster/scenarios/s13_encryption.sh runs it"]
async fn s13_encryption() {
    scenario("s13_encryption", encryption::encrypted_at_rest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the host's cluster with localvol deployed and helm: tests/cluster/scenarios/s14_helm.sh runs it"]
async fn s14_helm() {
    scenario("s14_helm", helm_install::install_upgrade_rollback_uninstall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with localvol deployed: tests/cluster/scenarios/s15_volume_health.sh runs it"]
async fn s15_volume_health() {
    scenario("s15_volume_health", volume_health::storage_failed).await;
}
