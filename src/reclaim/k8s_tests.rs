//! KubeCluster against a scripted API server (tower-test): the exact requests it makes,
//! and that watch events reschedule without a restart.

use crate::k8s::claim_label::ClaimLabels;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::*;
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
const CM_PATH: &str = "/api/v1/namespaces/csi-addons-system/configmaps";

#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    uri: String,
    content_type: Option<String>,
    body: Value,
}

/// Lists answer with scripted items; a watch of a scripted path answers with the next
/// event sent for it (and waits for one); every other watch stays open and silent.
/// PATCH and POST answer with what the test registered for the path, or their body.
struct MockApi {
    seen: Arc<Mutex<Vec<Seen>>>,
    events: HashMap<&'static str, mpsc::UnboundedSender<Value>>,
}

type Receivers = HashMap<&'static str, Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Value>>>>;

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}

impl MockApi {
    fn start(lists: HashMap<&'static str, Vec<Value>>, patched: Value) -> (Client, Self) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        handle.allow(u64::MAX);
        let client = Client::new(service, "default");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut events = HashMap::new();
        let mut receivers: Receivers = HashMap::new();
        for path in [ALL_PVCS_PATH, CM_PATH] {
            let (tx, rx) = mpsc::unbounded_channel();
            events.insert(path, tx);
            receivers.insert(path, Arc::new(tokio::sync::Mutex::new(rx)));
        }
        let record = Arc::clone(&seen);
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some((request, send)) = handle.next_request().await {
                let (parts, body) = request.into_parts();
                let bytes = body.collect_bytes().await.unwrap();
                let path = parts.uri.path().to_string();
                let watching = parts.uri.query().unwrap_or("").contains("watch=true");
                record.lock().unwrap().push(Seen {
                    method: parts.method.clone(),
                    uri: parts.uri.to_string(),
                    content_type: parts
                        .headers
                        .get("content-type")
                        .map(|v| v.to_str().unwrap().to_string()),
                    body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                });
                match parts.method {
                    Method::GET if watching => match receivers.get(path.as_str()) {
                        Some(rx) => {
                            let rx = Arc::clone(rx);
                            tokio::spawn(async move {
                                if let Some(event) = rx.lock().await.recv().await {
                                    let mut line = serde_json::to_vec(&event).unwrap();
                                    line.push(b'\n');
                                    send.send_response(Response::new(Body::from(line)));
                                }
                            });
                        }
                        None => held.push(send),
                    },
                    Method::GET => {
                        let items = lists.get(path.as_str()).cloned().unwrap_or_default();
                        send.send_response(json_response(
                            StatusCode::OK,
                            &json!({
                                "apiVersion": "v1",
                                "kind": "List",
                                "metadata": {"resourceVersion": "10"},
                                "items": items,
                            }),
                        ));
                    }
                    Method::PATCH => send.send_response(json_response(StatusCode::OK, &patched)),
                    _ => {
                        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                        send.send_response(json_response(StatusCode::CREATED, &body));
                    }
                }
            }
        });
        (client, Self { seen, events })
    }

    fn send(&self, path: &'static str, event_type: &str, object: Value) {
        self.events[path]
            .send(json!({"type": event_type, "object": object}))
            .unwrap();
    }

    fn seen(&self, method: Method) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.method == method)
            .cloned()
            .collect()
    }
}

fn pvc(annotations: &[(&str, &str)], resource_version: &str) -> Value {
    serde_json::to_value(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("pvc-1".to_string()),
            namespace: Some("apps".to_string()),
            uid: Some(UID.to_string()),
            resource_version: Some(resource_version.to_string()),
            annotations: crate::reclaim_policy::annotations(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some("local".to_string()),
            ..Default::default()
        }),
        ..Default::default()
    })
    .unwrap()
}

fn config_map(data: &[(&str, &str)], resource_version: &str) -> Value {
    serde_json::to_value(ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP_NAME.to_string()),
            namespace: Some("csi-addons-system".to_string()),
            resource_version: Some(resource_version.to_string()),
            ..ObjectMeta::default()
        },
        data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    })
    .unwrap()
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
    let lists = HashMap::from([(ALL_PVCS_PATH, vec![pvc(&[(SCHEDULE_ANNOTATION, "@daily")], "10")])]);
    let (client, api) = MockApi::start(lists, pvc(&[], "20"));
    let cluster = KubeCluster::start(
        client.clone(),
        "csi-addons-system",
        "node-a",
        ClaimLabels::new(client.clone(), "node-a").with_grace(std::time::Duration::ZERO),
        NodeClaims::start(client, "node-a"),
    );
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
    let claim_reads: Vec<_> = api
        .seen(Method::GET)
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
    api.send(
        ALL_PVCS_PATH,
        "MODIFIED",
        pvc(&[(SCHEDULE_ANNOTATION, "@hourly")], "11"),
    );
    let hourly = Schedule::Hourly.next_staggered_after(now, UID, two_hours);
    assert_ne!(daily, hourly);
    refresh_until(&cluster, &mut scheduler, now, "@hourly after MODIFIED", |s| {
        s.next_run(&id) == hourly
    })
    .await;

    // The ConfigMap turns staggering off.
    api.send(
        CM_PATH,
        "ADDED",
        config_map(&[("cronjob-stagger-window", "0")], "12"),
    );
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
    assert!(api.seen(Method::POST).is_empty(), "no event for a success");

    // An invalid schedule: @weekly, and one warning event (not one per refresh).
    api.send(
        ALL_PVCS_PATH,
        "MODIFIED",
        pvc(&[(SCHEDULE_ANNOTATION, "every day")], "13"),
    );
    let weekly = Schedule::Weekly.next_staggered_after(now, UID, Duration::ZERO);
    refresh_until(&cluster, &mut scheduler, now, "@weekly fallback", |s| {
        s.next_run(&id) == weekly
    })
    .await;
    scheduler.refresh(now).await.unwrap();
    let events = api.seen(Method::POST);
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
    api.send(
        ALL_PVCS_PATH,
        "MODIFIED",
        pvc(
            &[(SCHEDULE_ANNOTATION, "@hourly"), (ENABLE_ANNOTATION, "false")],
            "14",
        ),
    );
    refresh_until(&cluster, &mut scheduler, now, "disabled", |s| {
        s.next_run(&id).is_none()
    })
    .await;
    // Many refreshes later, the claim is still labelled once and watched once.
    assert_eq!(label_patches(&api).len(), 1);
}

/// The merge patches that put this node's label on a claim.
fn label_patches(api: &MockApi) -> Vec<Seen> {
    api.seen(Method::PATCH)
        .into_iter()
        .filter(|p| {
            p.body == json!({"metadata": {"labels": {crate::k8s::claim_label::NODE_LABEL: "node-a"}}})
        })
        .collect()
}

/// The patches that write the reclaim result.
fn annotation_patches(api: &MockApi) -> Vec<Seen> {
    api.seen(Method::PATCH)
        .into_iter()
        .filter(|p| !p.body["metadata"]["annotations"].is_null())
        .collect()
}

#[tokio::test]
async fn a_failure_is_annotated_and_raised_as_an_event() {
    let (client, api) = MockApi::start(HashMap::new(), pvc(&[], "20"));
    let cluster = KubeCluster::start(
        client.clone(),
        "csi-addons-system",
        "node-a",
        ClaimLabels::new(client.clone(), "node-a").with_grace(std::time::Duration::ZERO),
        NodeClaims::start(client, "node-a"),
    );
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
    let patches = api.seen(Method::PATCH);
    assert_eq!(patches.len(), 1);
    assert_eq!(
        patches[0].body,
        json!({"metadata": {"annotations": {
            LAST_RUN_ANNOTATION: "2024-05-16T00:41:07Z",
            LAST_RESULT_ANNOTATION: "failed: FITRIM /stage: Operation not supported",
        }}})
    );
    let events = api.seen(Method::POST);
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
