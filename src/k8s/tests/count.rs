//! How many Kubernetes API requests each CSI node call costs. The calls go through the
//! real CSI services (see [`super::node_fixture`]) with the owner check wired as the
//! daemon wires it: the node's pod reflector and the claim cache against the mock API
//! server, which records every request. Targets: with warm caches no request for
//! NodePublishVolume, NodeUnpublishVolume or NodeGetVolumeStats, at most one for
//! NodeStageVolume.

use std::sync::Arc;
use std::time::Duration;

use super::node_fixture::{Node, PodRef};
use crate::k8s::fixtures::{self, NODE, Uses, pod_owner, pv, pvc};
use crate::k8s::mock_api::MockApi;
use crate::k8s::{OwnerCheck, Retry, Timings, start_checker};
use crate::model::DRIVER_NAME;
use crate::proto::csi::v1 as csi;

const A: &str = "uid-a";

pub fn timings(object_ttl: Duration) -> Timings {
    Timings {
        object_ttl,
        api_timeout: Duration::from_millis(500),
        watch_retry: Retry {
            first: Duration::from_millis(20),
            max: Duration::from_millis(100),
        },
    }
}

/// Every request `api` was asked since the last call, as `METHOD /path?query`.
pub fn take_lines(api: &MockApi) -> Vec<String> {
    api.take_requests().iter().map(ToString::to_string).collect()
}

/// The request the node's pod reflector lists with.
pub fn pod_list() -> String {
    format!("GET /api/v1/pods?&fieldSelector=spec.nodeName%3D{NODE}&limit=500")
}

/// The request the node's pod reflector watches with, from `version`.
pub fn pod_watch(version: u64) -> String {
    format!(
        "GET /api/v1/pods?&watch=true&timeoutSeconds=290&fieldSelector=spec.nodeName%3D{NODE}\
         &allowWatchBookmarks=true&resourceVersion={version}"
    )
}

pub fn get_pvc(name: &str) -> String {
    format!("GET {}", fixtures::pvc_uri(name))
}

pub fn get_pod(name: &str) -> String {
    format!("GET {}", fixtures::pod_uri(name))
}

/// A node over `client` whose owner check is the daemon's, with `timings`.
pub fn node(client: kube::Client, timings: Timings) -> Node {
    node_with(client, timings, None, None)
}

/// The same, labelling the claims it reads through `labels` and reading labelled ones
/// from `claims`, as the daemon wires it.
fn node_with(
    client: kube::Client,
    timings: Timings,
    labels: Option<crate::k8s::claim_label::ClaimLabels>,
    claims: Option<crate::k8s::node_claims::NodeClaims>,
) -> Node {
    Node::new(|health| {
        OwnerCheck::On(Arc::new(start_checker(
            client, NODE, health, timings, labels, claims,
        )))
    })
}

/// Waits until readiness says `ready`; returns its last answer.
pub async fn until_ready(node: &Node, ready: bool) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let answer = node.health.readiness().await;
        if answer.is_ok() == ready {
            return answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "readiness never became {ready}: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A mock API server holding pod web-0 (uid A, on this node) with a generic ephemeral
/// volume `data`, and its claim web-0-data owned by it, to be bound to PV `pv-1`.
pub fn ephemeral_world() -> (kube::Client, MockApi) {
    let (client, api) = MockApi::start();
    api.put(fixtures::pod("web-0", A, NODE, &[Uses::Ephemeral("data")]));
    api.put(pvc(
        "web-0-data",
        "pvc-1",
        Some(pod_owner("web-0", A)),
        Some("pv-1"),
    ));
    (client, api)
}

/// A mock API server holding pod web-0 (uid A, on this node) using the StatefulSet's
/// claim data-web-0 (uid pvc-1), to be bound to PV `pv-1`.
pub fn statefulset_world() -> (kube::Client, MockApi) {
    let (client, api) = MockApi::start();
    api.put(fixtures::pod("web-0", A, NODE, &[Uses::Claim("data-web-0")]));
    let owner = fixtures::controller("StatefulSet", "apps/v1", "web", "uid-sts");
    api.put(pvc("data-web-0", "pvc-1", Some(owner), Some("pv-1")));
    (client, api)
}

/// web-0 publishes `volume` once `ttl` has passed: the claim is read again, once.
async fn publish_after(ttl: Duration, node: &mut Node, volume: &csi::Volume, api: &MockApi) {
    tokio::time::sleep(ttl).await;
    node.publish(volume, "target", &WEB0).await.unwrap();
    assert_eq!(
        take_lines(api),
        [get_pvc("data-web-0")],
        "NodePublishVolume, cold"
    );
}

const WEB0: PodRef<'static> = PodRef {
    name: "web-0",
    uid: A,
};

/// Waits until `node`'s pod reflector has synced with `api`, and checks that this took
/// exactly one list and one watch from the listed version.
/// web-0's generic ephemeral volume web-0-data (uid pvc-1), created and bound to PV pv-1.
pub async fn web0_volume(node: &mut Node, api: &MockApi) -> csi::Volume {
    let volume = node.create("web-0-data", "pv-1").await;
    api.put(pv(
        "pv-1",
        DRIVER_NAME,
        &volume.volume_id,
        Some(("web-0-data", "pvc-1")),
    ));
    volume
}

pub async fn synced(node: &Node, api: &MockApi) {
    until_ready(node, true).await.unwrap();
    api.until_watching().await;
    assert_eq!(take_lines(api), [pod_list(), pod_watch(api.version())]);
}

const NONE: [&str; 0] = [];

#[tokio::test]
async fn a_generic_ephemeral_volume_costs_one_read_at_stage_and_none_after() {
    let (client, api) = ephemeral_world();
    let mut node = node(client, timings(Duration::from_secs(30)));
    synced(&node, &api).await;
    let volume = web0_volume(&mut node, &api).await;
    assert_eq!(take_lines(&api), NONE, "CreateVolume");
    let web0 = WEB0;

    node.stage(&volume).await.unwrap();
    // The claim, once; the owner pod comes from the node's pod cache.
    assert_eq!(take_lines(&api), [get_pvc("web-0-data")], "NodeStageVolume");
    node.publish(&volume, "target", &web0).await.unwrap();
    assert_eq!(take_lines(&api), NONE, "NodePublishVolume");
    assert_eq!(node.stats(&volume, "target").await.unwrap(), 4 << 20);
    assert_eq!(take_lines(&api), NONE, "NodeGetVolumeStats");
    // kubelet repeats both after a restart: still nothing asked.
    node.stage(&volume).await.unwrap();
    assert_eq!(take_lines(&api), NONE, "NodeStageVolume again");
    node.publish(&volume, "target", &web0).await.unwrap();
    assert_eq!(take_lines(&api), NONE, "NodePublishVolume again");
    node.unpublish(&volume, "target").await.unwrap();
    assert_eq!(take_lines(&api), NONE, "NodeUnpublishVolume");
    node.unstage(&volume).await.unwrap();
    assert_eq!(take_lines(&api), NONE, "NodeUnstageVolume");
    assert!(node.mount_points().is_empty(), "{:?}", node.mount_points());
}

#[tokio::test]
async fn a_normal_claim_costs_one_read_at_stage_and_none_after() {
    // A StatefulSet's claim, used through a persistentVolumeClaim volume: publish needs
    // the requesting pod's spec, which the node's pod cache has.
    let (client, api) = statefulset_world();
    let mut node = node(client, timings(Duration::from_secs(30)));
    synced(&node, &api).await;
    let volume = node.create("data-web-0", "pv-1").await;
    let web0 = WEB0;

    node.stage(&volume).await.unwrap();
    assert_eq!(take_lines(&api), [get_pvc("data-web-0")], "NodeStageVolume");
    node.publish(&volume, "target", &web0).await.unwrap();
    assert_eq!(take_lines(&api), NONE, "NodePublishVolume");
    node.stats(&volume, "target").await.unwrap();
    assert_eq!(take_lines(&api), NONE, "NodeGetVolumeStats");
    node.unpublish(&volume, "target").await.unwrap();
    assert_eq!(take_lines(&api), NONE, "NodeUnpublishVolume");
}

#[tokio::test]
async fn publish_after_the_claim_expired_reads_it_once() {
    let (client, api) = statefulset_world();
    // Long enough that the two publishes below (cold, then warm) fall within it on a
    // loaded machine.
    let ttl = Duration::from_secs(2);
    let mut node = node(client, timings(ttl));
    synced(&node, &api).await;
    let volume = node.create("data-web-0", "pv-1").await;
    node.stage(&volume).await.unwrap();
    assert_eq!(take_lines(&api), [get_pvc("data-web-0")], "NodeStageVolume");

    // A second pod, or the same one after kubelet restarted, long after the stage.
    publish_after(ttl, &mut node, &volume, &api).await;
    node.publish(&volume, "target", &WEB0).await.unwrap();
    assert_eq!(take_lines(&api), NONE, "NodePublishVolume, warm again");
}

/// As the daemon wires it, the owner check labels the claims it reads with this node
/// (shared with the node resizer and the reclaim scheduler): the first read of a claim
/// is the label's PATCH, whose answer is the claim, so a stage still costs one request,
/// and the label costs none of its own. A later cold read is a plain GET.
#[tokio::test]
async fn the_first_read_of_a_claim_is_the_node_label_patch() {
    let (client, api) = statefulset_world();
    let ttl = Duration::from_secs(2);
    let labels = crate::k8s::claim_label::ClaimLabels::new(client.clone(), NODE);
    let mut node = node_with(client, timings(ttl), Some(labels.clone()), None);
    synced(&node, &api).await;
    let volume = node.create("data-web-0", "pv-1").await;

    node.stage(&volume).await.unwrap();
    let requests = take_lines(&api);
    assert_eq!(requests.len(), 1, "NodeStageVolume: {requests:?}");
    assert!(
        requests[0].starts_with(&format!("PATCH {}", fixtures::pvc_uri("data-web-0"))),
        "{requests:?}"
    );
    // The other users of the label find it done.
    labels
        .ensure([(fixtures::NS.to_string(), "data-web-0".to_string())])
        .await;
    assert_eq!(take_lines(&api), NONE, "labelled once");

    publish_after(ttl, &mut node, &volume, &api).await;
}

/// Claims this node has labelled are read from their watch while it is in sync: a
/// stage and a publish long after the claim's TTL (kubelet works through a burst of
/// pods for many seconds) ask nothing. Out of sync, the claim is read from the API.
#[tokio::test]
async fn a_labelled_claim_is_read_from_the_watch_of_the_nodes_claims() {
    let (client, api) = statefulset_world();
    let ttl = Duration::from_millis(100);
    let (claims, mut writer) = crate::k8s::node_claims::NodeClaims::by_hand();
    let mut node = node_with(client, timings(ttl), None, Some(claims.clone()));
    synced(&node, &api).await;
    let volume = node.create("data-web-0", "pv-1").await;
    let owner = fixtures::controller("StatefulSet", "apps/v1", "web", "uid-sts");
    let claim = pvc("data-web-0", "pvc-1", Some(owner), Some("pv-1"));
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(claim));

    tokio::time::sleep(ttl).await;
    node.stage(&volume).await.unwrap();
    assert_eq!(take_lines(&api), NONE, "NodeStageVolume");
    tokio::time::sleep(ttl).await;
    node.publish(&volume, "target", &WEB0).await.unwrap();
    assert_eq!(take_lines(&api), NONE, "NodePublishVolume");

    claims.lose_sync();
    publish_after(ttl, &mut node, &volume, &api).await;
}

/// What the mock API was asked, but for the pod watch, which the mock server ends after
/// each event it sends (so the reflector watches again).
fn asked(api: &MockApi) -> Vec<String> {
    let watch = pod_watch(0);
    let watch = &watch[..watch.len() - 1];
    let mut requests = take_lines(api);
    requests.retain(|r| !r.starts_with(watch));
    requests
}

/// Waits until the mock API has been asked something besides the pod watch; returns what.
async fn until_asked(api: &MockApi) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let requests = asked(api);
        if !requests.is_empty() {
            return requests;
        }
        assert!(tokio::time::Instant::now() < deadline, "nothing was asked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// As on a real node: the volume is created before its pod is bound here. The claim is
/// read when the pod arrives (its one request, as before), so the stage kubelet sends a
/// moment later asks nothing. A pod using a claim this daemon made no volume for costs
/// no request.
#[tokio::test]
async fn a_new_volume_claim_is_read_when_its_pod_arrives_not_at_stage() {
    let (client, api) = MockApi::start();
    api.put(pvc(
        "web-0-data",
        "pvc-1",
        Some(pod_owner("web-0", A)),
        Some("pv-1"),
    ));
    let mut node = node(client, timings(Duration::from_secs(30)));
    synced(&node, &api).await;
    let volume = web0_volume(&mut node, &api).await;
    assert_eq!(take_lines(&api), NONE, "CreateVolume");

    api.put(fixtures::pod("other", "uid-o", NODE, &[Uses::Claim("not-ours")]));
    api.put(fixtures::pod("web-0", A, NODE, &[Uses::Ephemeral("data")]));
    assert_eq!(until_asked(&api).await, [get_pvc("web-0-data")], "web-0 arrived");
    // Anything queued for the other pod would have been asked by now.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(asked(&api), NONE, "only web-0's claim is read");

    node.stage(&volume).await.unwrap();
    assert_eq!(take_lines(&api), NONE, "NodeStageVolume");
    node.publish(&volume, "target", &WEB0).await.unwrap();
    assert_eq!(take_lines(&api), NONE, "NodePublishVolume");
    // The pod changing later (its status, say) reads nothing again.
    api.put(fixtures::pod("web-0", A, NODE, &[Uses::Ephemeral("data")]));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(asked(&api), NONE, "web-0 changed");
}
