//! The owner check against a scripted mock API server: each test lists the exact
//! requests the check makes, in order, and the server fails on any other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector;
use tonic::Code;

use super::fixtures::{self, *};
use super::mock_api::*;
use super::*;
use crate::model::ClaimRef;
use crate::request::{PodInfo, VolumeContext};

const VOLUME: &str = "default.0123456789abcdef";
const A: &str = "uid-a";
const B: &str = "uid-b";

/// Finding the claim (context, PV, missing, replaced).
mod claims;
/// How many API requests the owner check makes per call, on a node of real CSI services.
mod count;
/// The real CSI services of one node with the owner check wired in, for count and outage.
mod node_fixture;
/// The owner check while the API server is down, failing or silent.
mod outage;

fn checker(client: kube::Client, pods: Vec<Pod>) -> Checker {
    fixtures::checker(client, pods, true)
}

fn context(pvc: &str, pod: Option<(&str, &str)>) -> VolumeContext {
    VolumeContext {
        claim: ClaimRef {
            pvc_name: Some(pvc.to_string()),
            pvc_namespace: Some(NS.to_string()),
            pv_name: None,
        },
        pod: pod.map(|(name, uid)| PodInfo {
            name: name.to_string(),
            namespace: NS.to_string(),
            uid: uid.to_string(),
        }),
    }
}

/// The gRPC answer for a check's error, as the CSI handler would send it.
fn code(result: Result<(), OwnerError>) -> (Code, String) {
    let status = tonic::Status::from(crate::error::Error::from(result.expect_err("allowed")));
    (status.code(), status.message().to_string())
}

async fn finish(checker: Checker, server: MockApi) {
    drop(checker);
    server.finish().await;
}

fn ephemeral_pod(uid: &str, node: &str) -> Pod {
    pod("web-0", uid, node, &[Uses::Ephemeral("data")])
}

#[tokio::test]
async fn owned_by_the_pod_is_staged_and_published() {
    let claim = pvc("web-0-data", "pvc-1", Some(pod_owner("web-0", A)), None);
    // One read of the claim; the pod comes from the cache, the claim the second time
    // from the TTL cache.
    let (client, server) = MockApi::scripted(vec![get(pvc_uri("web-0-data"), ok(&claim))]);
    let checker = checker(client, vec![ephemeral_pod(A, NODE)]);
    let ctx = context("web-0-data", Some(("web-0", A)));
    checker.stage(VOLUME, &ctx).await.unwrap();
    checker.publish(VOLUME, &ctx).await.unwrap();
    finish(checker, server).await;
}

#[tokio::test]
async fn owned_by_another_pod_is_refused() {
    let claim = pvc("web-0-data", "pvc-1", Some(pod_owner("intruder", B)), None);
    let (client, server) = MockApi::scripted(vec![
        // Stage: the owner is not on this node; asked once, it does not exist.
        get(pvc_uri("web-0-data"), ok(&claim)),
        get(pod_uri("intruder"), not_found()),
        event("Pod", "web-0", vec!["web-0-data", "no Pod apps/intruder"]),
        event(
            "PersistentVolumeClaim",
            "web-0-data",
            vec!["no Pod apps/intruder"],
        ),
        // Publish: the cached claim says another pod; read again before refusing.
        get(pvc_uri("web-0-data"), ok(&claim)),
        event("Pod", "web-0", vec!["expected owner Pod apps/web-0 (uid uid-a)"]),
        event(
            "PersistentVolumeClaim",
            "web-0-data",
            vec!["found Pod apps/intruder (uid uid-b)"],
        ),
    ]);
    let checker = checker(client, vec![ephemeral_pod(A, NODE)]);
    let ctx = context("web-0-data", Some(("web-0", A)));

    let (code_, message) = code(checker.stage(VOLUME, &ctx).await);
    assert_eq!(code_, Code::FailedPrecondition, "{message}");
    assert!(
        message.contains("PersistentVolumeClaim apps/web-0-data"),
        "{message}"
    );
    assert!(
        message.contains("expected owner Pod apps/intruder (uid uid-b) on node node-a"),
        "{message}"
    );
    assert!(message.contains("found no Pod apps/intruder"), "{message}");

    let (code_, message) = code(checker.publish(VOLUME, &ctx).await);
    assert_eq!(code_, Code::FailedPrecondition, "{message}");
    assert!(
        message.contains("expected owner Pod apps/web-0 (uid uid-a), found Pod apps/intruder (uid uid-b)"),
        "{message}"
    );
    finish(checker, server).await;
}

#[tokio::test]
async fn same_named_pvc_without_owner_is_refused_at_publish() {
    // Someone created web-0-data before the pod: the ephemeral volume controller never
    // made one, and the pod's ephemeral volume resolves to this claim.
    let claim = pvc("web-0-data", "pvc-1", None, None);
    let pod = ephemeral_pod(A, NODE);
    let (client, server) = MockApi::scripted(vec![
        // Stage: no owner, a normal claim as far as staging goes.
        get(pvc_uri("web-0-data"), ok(&claim)),
        // Publish: cached claim and pod say refuse; both are read again first.
        get(pvc_uri("web-0-data"), ok(&claim)),
        get(pod_uri("web-0"), ok(&pod)),
        event("Pod", "web-0", vec!["found no controlling owner"]),
        event(
            "PersistentVolumeClaim",
            "web-0-data",
            vec!["found no controlling owner"],
        ),
    ]);
    let checker = checker(client, vec![pod.clone()]);
    let ctx = context("web-0-data", Some(("web-0", A)));
    checker.stage(VOLUME, &ctx).await.unwrap();
    let (code_, message) = code(checker.publish(VOLUME, &ctx).await);
    assert_eq!(code_, Code::FailedPrecondition, "{message}");
    assert!(
        message.contains(
            "PersistentVolumeClaim apps/web-0-data (uid pvc-1): expected owner Pod apps/web-0 (uid uid-a), \
             found no controlling owner"
        ),
        "{message}"
    );
    finish(checker, server).await;
}

#[tokio::test]
async fn normal_pvc_through_a_claim_volume_is_allowed() {
    let claim = pvc("shared", "pvc-1", None, None);
    let (client, server) = MockApi::scripted(vec![get(pvc_uri("shared"), ok(&claim))]);
    let checker = checker(client, vec![pod("web-0", A, NODE, &[Uses::Claim("shared")])]);
    let ctx = context("shared", Some(("web-0", A)));
    checker.stage(VOLUME, &ctx).await.unwrap();
    checker.publish(VOLUME, &ctx).await.unwrap();
    finish(checker, server).await;
}

#[tokio::test]
async fn owned_by_a_non_pod_is_a_normal_claim() {
    let owner = controller("StatefulSet", "apps/v1", "web", "uid-sts");
    let claim = pvc("data-web-0", "pvc-1", Some(owner), None);
    // The requesting pod is not in the node cache yet: one read from the API.
    let pod = pod("web-0", A, NODE, &[Uses::Claim("data-web-0")]);
    let (client, server) = MockApi::scripted(vec![
        get(pvc_uri("data-web-0"), ok(&claim)),
        get(pod_uri("web-0"), ok(&pod)),
    ]);
    let checker = checker(client, vec![]);
    let ctx = context("data-web-0", Some(("web-0", A)));
    checker.stage(VOLUME, &ctx).await.unwrap();
    checker.publish(VOLUME, &ctx).await.unwrap();
    finish(checker, server).await;
}

#[tokio::test]
async fn uid_mismatch_after_the_pod_was_recreated_is_refused() {
    // web-0 was deleted and created again (uid B) while the old claim, owned by the
    // old pod (uid A), is still there.
    let claim = pvc("web-0-data", "pvc-1", Some(pod_owner("web-0", A)), None);
    let new_pod = ephemeral_pod(B, NODE);
    let (client, server) = MockApi::scripted(vec![
        // Stage: the cached web-0 has another UID, so it counts as a miss.
        get(pvc_uri("web-0-data"), ok(&claim)),
        get(pod_uri("web-0"), ok(&new_pod)),
        event("Pod", "web-0", vec!["found Pod apps/web-0 (uid uid-b)"]),
        event(
            "PersistentVolumeClaim",
            "web-0-data",
            vec!["found Pod apps/web-0 (uid uid-b)"],
        ),
        // Publish for the new pod: refused on the cached claim, so read again.
        get(pvc_uri("web-0-data"), ok(&claim)),
        event("Pod", "web-0", vec!["expected owner Pod apps/web-0 (uid uid-b)"]),
        event(
            "PersistentVolumeClaim",
            "web-0-data",
            vec!["found Pod apps/web-0 (uid uid-a)"],
        ),
    ]);
    let checker = checker(client, vec![new_pod.clone()]);
    let ctx = context("web-0-data", Some(("web-0", B)));
    let (code_, message) = code(checker.stage(VOLUME, &ctx).await);
    assert_eq!(code_, Code::FailedPrecondition, "{message}");
    assert!(
        message.contains("expected owner Pod apps/web-0 (uid uid-a) on node node-a"),
        "{message}"
    );
    let (code_, _) = code(checker.publish(VOLUME, &ctx).await);
    assert_eq!(code_, Code::FailedPrecondition);
    finish(checker, server).await;
}

#[tokio::test]
async fn owner_pod_on_another_node_is_refused() {
    let claim = pvc("web-0-data", "pvc-1", Some(pod_owner("web-0", A)), None);
    let (client, server) = MockApi::scripted(vec![
        get(pvc_uri("web-0-data"), ok(&claim)),
        get(pod_uri("web-0"), ok(&ephemeral_pod(A, "node-b"))),
        // No pod on this node names the claim: the event goes to the claim only.
        event("PersistentVolumeClaim", "web-0-data", vec!["on node node-b"]),
    ]);
    let checker = checker(client, vec![]);
    let (code_, message) = code(checker.stage(VOLUME, &context("web-0-data", None)).await);
    assert_eq!(code_, Code::FailedPrecondition, "{message}");
    assert!(
        message.contains("found Pod apps/web-0 (uid uid-a) on node node-b"),
        "{message}"
    );
    finish(checker, server).await;
}

#[tokio::test]
async fn api_down_is_unavailable() {
    let (client, server) = MockApi::scripted(vec![
        get(pvc_uri("web-0-data"), Reply::Unreachable),
        get(
            pvc_uri("web-0-data"),
            Reply::Json(
                http::StatusCode::SERVICE_UNAVAILABLE,
                status(503, "ServiceUnavailable"),
            ),
        ),
    ]);
    let checker = checker(client, vec![ephemeral_pod(A, NODE)]);
    let ctx = context("web-0-data", Some(("web-0", A)));
    let (code_, message) = code(checker.stage(VOLUME, &ctx).await);
    assert_eq!(code_, Code::Unavailable, "{message}");
    assert!(
        message.contains("get PersistentVolumeClaim apps/web-0-data"),
        "{message}"
    );
    let (code_, message) = code(checker.publish(VOLUME, &ctx).await);
    assert_eq!(code_, Code::Unavailable, "{message}");
    finish(checker, server).await;
}

#[tokio::test]
async fn api_silent_is_unavailable_after_the_deadline() {
    let (client, server) = MockApi::scripted(vec![]);
    // Takes the request and never answers it.
    server.set_mode(Mode::Silent);
    let (store, synced) = pod_cache(vec![], true);
    let checker = Checker::with_timings(
        client,
        store,
        synced,
        NODE.to_string(),
        Duration::from_secs(60),
        Duration::from_millis(100),
    );
    let (code_, message) = code(checker.stage(VOLUME, &context("web-0-data", None)).await);
    assert_eq!(code_, Code::Unavailable, "{message}");
    assert!(message.contains("no answer within"), "{message}");
    let asked: Vec<String> = server.requests().iter().map(|r| r.to_string()).collect();
    assert_eq!(asked, [format!("GET {}", pvc_uri("web-0-data"))]);
    finish(checker, server).await;
}

#[tokio::test]
async fn api_refusing_access_is_internal() {
    let (client, server) = MockApi::scripted(vec![get(
        pvc_uri("web-0-data"),
        Reply::Json(http::StatusCode::FORBIDDEN, status(403, "Forbidden")),
    )]);
    let checker = checker(client, vec![]);
    let (code_, message) = code(checker.stage(VOLUME, &context("web-0-data", None)).await);
    assert_eq!(code_, Code::Internal, "{message}");
    finish(checker, server).await;
}

#[tokio::test]
async fn cache_not_yet_synced_is_unavailable_without_asking() {
    let (client, server) = MockApi::scripted(vec![]);
    let checker = fixtures::checker(client, vec![ephemeral_pod(A, NODE)], false);
    let ctx = context("web-0-data", Some(("web-0", A)));
    let (code_, message) = code(checker.stage(VOLUME, &ctx).await);
    assert_eq!(code_, Code::Unavailable, "{message}");
    assert!(message.contains("not synced"), "{message}");
    let (code_, _) = code(checker.publish(VOLUME, &ctx).await);
    assert_eq!(code_, Code::Unavailable);
    // A volume with no claim needs no cache.
    checker.stage(VOLUME, &VolumeContext::default()).await.unwrap();
    finish(checker, server).await;
}

#[tokio::test]
async fn the_pod_cache_lists_this_nodes_pods_and_then_reports_synced() {
    let list = serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "100"},
        "items": [serde_json::to_value(ephemeral_pod(A, NODE)).unwrap()],
    });
    let (client, server) = MockApi::scripted(vec![get(
        "/api/v1/pods?&fieldSelector=spec.nodeName%3Dnode-a&limit=500",
        Reply::Json(http::StatusCode::OK, list),
    )]);
    // Never released: held open, as a watch with nothing to tell.
    let watch = server.expect(get("/api/v1/pods?*", ok(&serde_json::json!({}))).held());
    let called = Arc::new(AtomicBool::new(false));
    let (store, synced) = {
        let called = Arc::clone(&called);
        spawn_pod_reflector(
            client,
            NODE,
            WATCH_RETRY,
            move |in_sync| called.store(in_sync, Ordering::SeqCst),
            |_| {},
        )
    };
    assert!(!synced.get());

    // It lists, then watches from the listed version, with the same selector.
    let uri = watch.asked().await.uri;
    assert!(uri.contains("watch=true"), "{uri}");
    assert!(uri.contains("fieldSelector=spec.nodeName%3Dnode-a"), "{uri}");
    assert!(uri.contains("resourceVersion=100"), "{uri}");

    tokio::time::timeout(Duration::from_secs(5), async {
        while !synced.get() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("synced");
    assert!(called.load(Ordering::SeqCst));
    let cached = store.get(&reflector::ObjectRef::new("web-0").within(NS)).unwrap();
    assert_eq!(cached.metadata.uid.as_deref(), Some(A));
    assert!(cached.metadata.managed_fields.is_none());
    // The reflector keeps the client: it cannot be finished.
    server.assert_no_request_within(Duration::from_millis(100)).await;
}

#[test]
fn a_slimmed_pod_still_answers_every_owner_question() {
    let mut pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-0", "namespace": NS, "uid": A, "resourceVersion": "7",
                     "labels": {"app": "web"}, "annotations": {"a": "b"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                          "name": "web", "uid": "s", "controller": true}]},
        "spec": {"nodeName": NODE,
                 "containers": [{"name": "c", "image": "i", "env": [{"name": "X", "value": "1"}]}],
                 "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                             {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}}]},
        "status": {"phase": "Running"}
    }))
    .unwrap();
    let before = owner::PodView::from_pod(&pod);
    super::slim_pod(&mut pod);
    assert_eq!(owner::PodView::from_pod(&pod), before);
    assert_eq!(before.ephemeral_claims, ["web-0-scratch"]);
    assert_eq!(before.claims, ["data-web-0"]);
    let spec = pod.spec.as_ref().unwrap();
    assert!(spec.containers.is_empty() && pod.status.is_none());
    assert!(pod.metadata.labels.is_none() && pod.metadata.owner_references.is_none());
    assert_eq!(pod.metadata.resource_version.as_deref(), Some("7"));
}

/// Reads of one claim take turns: a second read that comes while the first is in flight
/// (a stage during the read ahead of it, see `prefetch`) waits and takes its answer from
/// the cache. One request.
#[tokio::test]
async fn concurrent_reads_of_one_claim_make_one_request() {
    let claim = pvc(
        "web-0-data",
        "pvc-1",
        Some(pod_owner("web-0", "uid-a")),
        Some("pv-1"),
    );
    let (client, server) = MockApi::scripted(vec![]);
    let read_claim = server.expect(get(pvc_uri("web-0-data"), ok(&claim)).held());
    let (store, synced) = pod_cache(vec![], true);
    let lookup = Arc::new(lookup::Lookup::new(
        client,
        store,
        synced,
        Duration::from_secs(60),
        Duration::from_secs(5),
    ));
    let read = |lookup: &Arc<lookup::Lookup>| {
        let lookup = Arc::clone(lookup);
        tokio::spawn(async move { lookup.pvc(NS, "web-0-data", lookup::Source::Cache).await })
    };
    let first = read(&lookup);
    read_claim.asked().await;
    let second = read(&lookup);
    tokio::time::sleep(Duration::from_millis(50)).await;
    read_claim.release();
    let first = first.await.unwrap().unwrap().expect("found");
    let second = second.await.unwrap().unwrap().expect("found");
    assert!(!first.cached);
    assert!(second.cached, "the second read waited for the first");
    // A second request would also be one past the script.
    server.assert_no_request_within(Duration::from_millis(100)).await;
    drop(lookup);
    server.finish().await;
}
