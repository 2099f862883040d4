//! KubeCluster against the mock API server (`crate::k8s::mock_api`): the exact requests
//! it makes, and that watch events reschedule without a restart.

use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;
use crate::k8s::claim_label::{ClaimLabels, NODE_LABEL};
use crate::k8s::mock_api::{Asked, Exchange, MockApi, ok};
use crate::model::ClaimRef;
use crate::model::VolumeMode;
use crate::reclaim::scheduler::{Scheduler, SchedulerConfig};
use crate::reclaim::testing::Fixture;
use crate::reclaim_policy::NodePolicy;
use crate::reclaim_policy::schedule::Schedule;
use crate::reclaim_policy::{ENABLE_ANNOTATION, SCHEDULE_ANNOTATION};

const UID: &str = "6f1c2a8e-0d4b-4c3e-9a51-2b7d9e0c4f10";
const PVC_PATH: &str = "/api/v1/namespaces/apps/persistentvolumeclaims";
/// Where this node's claims are listed and watched (label-selected, all namespaces).
const ALL_PVCS_PATH: &str = "/api/v1/persistentvolumeclaims";

/// The requests made with `method`, in order.
fn asked(api: &MockApi, method: Method) -> Vec<Asked> {
    api.requests()
        .into_iter()
        .filter(|r| r.method == method)
        .collect()
}

/// A PATCH of the claim, answered with the claim as it was (not written to the store:
/// the claim's watch sees only the changes the test makes).
fn patch_answered() -> Exchange {
    Exchange::new(Method::PATCH, format!("{PVC_PATH}/pvc-1?*"), ok(&pvc(&[])))
}

/// Claim apps/pvc-1 of this node (labelled with it, so its watch selects it).
fn pvc(annotations: &[(&str, &str)]) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("pvc-1".to_string()),
            namespace: Some("apps".to_string()),
            uid: Some(UID.to_string()),
            labels: Some([(NODE_LABEL.to_string(), "node-a".to_string())].into()),
            annotations: crate::reclaim_policy::annotations(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some("local".to_string()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn config_map(data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP_NAME.to_string()),
            namespace: Some("csi-addons-system".to_string()),
            ..ObjectMeta::default()
        },
        data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    }
}

/// The daemon's KubeCluster for node-a, labelling claims without a grace period.
fn cluster_on(client: kube::Client) -> Arc<KubeCluster> {
    KubeCluster::start(
        client.clone(),
        "csi-addons-system",
        "node-a",
        ClaimLabels::new(client.clone(), "node-a").with_grace(std::time::Duration::ZERO),
        NodeClaims::start(client, "node-a"),
    )
}

fn path_of(uri: &str) -> &str {
    uri.split('?').next().unwrap()
}

fn claim() -> ClaimKey {
    ClaimKey {
        namespace: "apps".to_string(),
        name: "pvc-1".to_string(),
    }
}

/// Refreshes whenever the cluster reports a change, until `done` holds.
async fn refresh_until(
    cluster: &KubeCluster,
    scheduler: &mut Scheduler,
    now: Timestamp,
    what: &str,
    done: impl Fn(&Scheduler) -> bool,
) {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            scheduler.refresh(now).await.unwrap();
            if done(scheduler) {
                return;
            }
            cluster.changed().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for: {what}"));
}

#[tokio::test]
async fn annotation_and_config_map_changes_reschedule_and_runs_annotate_the_pvc() {
    let f = Fixture::new(Duration::from_secs(60)).await;
    let id = f
        .create_for(
            "pvc-1",
            VolumeMode::Filesystem,
            ClaimRef {
                pvc_name: Some("pvc-1".to_string()),
                pvc_namespace: Some("apps".to_string()),
                pv_name: None,
            },
        )
        .await;
    let (client, api) = MockApi::start();
    api.put(pvc(&[(SCHEDULE_ANNOTATION, "@daily")]));
    // The label, then the result of the run.
    api.expect(patch_answered());
    api.expect(patch_answered());
    let cluster = cluster_on(client);
    let config = SchedulerConfig {
        policy: NodePolicy::default(),
        busy_retry: Duration::from_secs(60),
        rescan: Duration::from_secs(60),
    };
    let mut scheduler = Scheduler::new(f.runner.clone(), Arc::clone(&cluster) as Arc<dyn Cluster>, config);
    let now: Timestamp = "2024-05-15T10:00:00Z".parse().unwrap();
    let two_hours = Duration::from_secs(7200);

    // The PVC's annotation, once its watch has listed it; staggered by the PVC's UID.
    let daily = Schedule::Daily.next_staggered_after(now, UID, two_hours);
    refresh_until(&cluster, &mut scheduler, now, "@daily from the PVC", |s| {
        s.next_run(&id) == daily
    })
    .await;
    // This node's claims: listed and watched once, by this node's label, never by
    // name or namespace; the claim of the volume is labelled with one merge patch.
    let claim_reads: Vec<_> = asked(&api, Method::GET)
        .into_iter()
        .filter(|s| s.uri.contains("persistentvolumeclaims"))
        .collect();
    assert!(!claim_reads.is_empty());
    assert!(
        claim_reads.iter().all(|s| path_of(&s.uri) == ALL_PVCS_PATH
            && s.uri.contains("labelSelector=localvol.csi.dev%2Fnode%3Dnode-a")),
        "{claim_reads:?}"
    );
    assert_eq!(
        claim_reads
            .iter()
            .filter(|s| s.uri.contains("watch=true"))
            .count(),
        1,
        "one claim watch: {claim_reads:?}"
    );
    // The label is written in the background.
    tokio::time::timeout(Duration::from_secs(10), async {
        while label_patches(&api).is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the claim is labelled");
    let labels = label_patches(&api);
    assert_eq!(labels.len(), 1, "{labels:?}");
    assert_eq!(path_of(&labels[0].uri), format!("{PVC_PATH}/pvc-1"));
    assert_eq!(
        labels[0].content_type.as_deref(),
        Some("application/merge-patch+json")
    );

    // The annotation changes: the next run follows without a restart.
    api.put(pvc(&[(SCHEDULE_ANNOTATION, "@hourly")]));
    let hourly = Schedule::Hourly.next_staggered_after(now, UID, two_hours);
    assert_ne!(daily, hourly);
    refresh_until(&cluster, &mut scheduler, now, "@hourly after MODIFIED", |s| {
        s.next_run(&id) == hourly
    })
    .await;

    // The ConfigMap turns staggering off.
    api.put(config_map(&[("cronjob-stagger-window", "0")]));
    let due: Timestamp = "2024-05-15T11:00:00Z".parse().unwrap();
    refresh_until(
        &cluster,
        &mut scheduler,
        now,
        "no stagger from the ConfigMap",
        |s| s.next_run(&id) == Some(due),
    )
    .await;

    // A run at that time annotates the PVC with a merge patch.
    f.stage("pvc-1").await;
    assert_eq!(scheduler.run_due(due).await, vec![(id.clone(), "trimmed")]);
    let patches = annotation_patches(&api);
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert_eq!(path_of(&patches[0].uri), format!("{PVC_PATH}/pvc-1"));
    assert_eq!(
        patches[0].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    let annotations = &patches[0].body["metadata"]["annotations"];
    assert_eq!(annotations[LAST_RUN_ANNOTATION], json!("2024-05-15T11:00:00Z"));
    assert!(
        annotations[LAST_RESULT_ANNOTATION]
            .as_str()
            .unwrap()
            .starts_with("reclaimed "),
        "{annotations}"
    );
    assert!(asked(&api, Method::POST).is_empty(), "no event for a success");

    // An invalid schedule: @weekly, and one warning event (not one per refresh).
    api.put(pvc(&[(SCHEDULE_ANNOTATION, "every day")]));
    let weekly = Schedule::Weekly.next_staggered_after(now, UID, Duration::ZERO);
    refresh_until(&cluster, &mut scheduler, now, "@weekly fallback", |s| {
        s.next_run(&id) == weekly
    })
    .await;
    scheduler.refresh(now).await.unwrap();
    let events = asked(&api, Method::POST);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        path_of(&events[0].uri),
        "/apis/events.k8s.io/v1/namespaces/apps/events"
    );
    let event = &events[0].body;
    assert_eq!(event["type"], json!("Warning"));
    assert_eq!(event["reason"], json!("InvalidReclaimSchedule"));
    assert_eq!(event["regarding"]["name"], json!("pvc-1"));
    assert_eq!(event["regarding"]["uid"], json!(UID));
    assert_eq!(event["reportingController"], json!("localvol"));
    assert_eq!(event["reportingInstance"], json!("node-a"));
    assert!(event["note"].as_str().unwrap().contains("every day"), "{event}");

    // enable: "false" on the PVC turns it off.
    api.put(pvc(&[
        (SCHEDULE_ANNOTATION, "@hourly"),
        (ENABLE_ANNOTATION, "false"),
    ]));
    refresh_until(&cluster, &mut scheduler, now, "disabled", |s| {
        s.next_run(&id).is_none()
    })
    .await;
    // Many refreshes later, the claim is still labelled once and watched once.
    assert_eq!(label_patches(&api).len(), 1);
}

/// The merge patches that put this node's label on a claim.
fn label_patches(api: &MockApi) -> Vec<Asked> {
    asked(api, Method::PATCH)
        .into_iter()
        .filter(|p| {
            p.body == json!({"metadata": {"labels": {crate::k8s::claim_label::NODE_LABEL: "node-a"}}})
        })
        .collect()
}

/// The patches that write the reclaim result.
fn annotation_patches(api: &MockApi) -> Vec<Asked> {
    asked(api, Method::PATCH)
        .into_iter()
        .filter(|p| !p.body["metadata"]["annotations"].is_null())
        .collect()
}

#[tokio::test]
async fn a_failure_is_annotated_and_raised_as_an_event() {
    let (client, api) = MockApi::start();
    api.expect(patch_answered());
    let cluster = cluster_on(client);
    let finished: Timestamp = "2024-05-16T00:41:07Z".parse().unwrap();
    cluster
        .report(
            &claim(),
            &RunReport {
                finished,
                succeeded: false,
                summary: "failed: FITRIM /stage: Operation not supported".to_string(),
            },
        )
        .await;
    let patches = asked(&api, Method::PATCH);
    assert_eq!(patches.len(), 1);
    assert_eq!(
        patches[0].body,
        json!({"metadata": {"annotations": {
            LAST_RUN_ANNOTATION: "2024-05-16T00:41:07Z",
            LAST_RESULT_ANNOTATION: "failed: FITRIM /stage: Operation not supported",
        }}})
    );
    let events = asked(&api, Method::POST);
    assert_eq!(events.len(), 1, "{events:?}");
    let event = &events[0].body;
    assert_eq!(event["reason"], json!("ReclaimSpaceFailed"));
    assert_eq!(event["action"], json!("ReclaimSpace"));
    assert_eq!(event["type"], json!("Warning"));
    assert_eq!(event["regarding"]["kind"], json!("PersistentVolumeClaim"));
    assert_eq!(event["regarding"]["namespace"], json!("apps"));
    assert_eq!(
        event["note"],
        json!("failed: FITRIM /stage: Operation not supported")
    );
}
