//! The API server goes away and comes back with the cluster changed. Through the real CSI
//! services and the daemon's owner check (pod reflector and claim cache against the mock
//! API server): while the node's pod cache is out of sync, stage and publish answer
//! UNAVAILABLE instead of allowing or refusing on what it last saw, readiness says so,
//! cleanup calls go on; once back, the reflector lists again and the next decisions
//! rest on the new state, not on claims read before the outage.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tonic::{Code, Status};

use super::count::{
    ephemeral_world, get_pod, get_pvc, node, pod_list, pod_watch, synced, take_lines, timings, until_ready,
    web0_volume,
};
use super::node_fixture::{Node, PodRef};
use crate::k8s::fixtures::{self, NODE, NS, Uses, pod_owner, pv, pvc};
use crate::k8s::mock_api::{MockApi, Mode};
use crate::model::DRIVER_NAME;
use crate::proto::csi::v1::Volume;

const A: &str = "uid-a";
const B: &str = "uid-b";
const WEB0_A: PodRef<'static> = PodRef {
    name: "web-0",
    uid: A,
};
const WEB0_B: PodRef<'static> = PodRef {
    name: "web-0",
    uid: B,
};
/// Long enough that only the resync, never the TTL, can drop a claim read before.
const TTL: Duration = Duration::from_secs(60);
const NONE: [&str; 0] = [];

fn post_event() -> String {
    format!("POST /apis/events.k8s.io/v1/namespaces/{NS}/events?")
}

fn assert_code(result: Result<(), Status>, code: Code, message_has: &str) {
    let status = result.expect_err("the call succeeded");
    assert_eq!(status.code(), code, "{}", status.message());
    assert!(
        status.message().contains(message_has),
        "{:?} lacks {message_has:?}",
        status.message()
    );
}

/// uid A's stage reads the claim and web-0 by name, finds web-0 with uid B, and refuses.
async fn stage_finds_web0_with_uid_b(api: &MockApi, node: &mut Node, volume: &Volume) {
    assert_code(
        node.stage(volume).await,
        Code::FailedPrecondition,
        "found Pod apps/web-0 (uid uid-b)",
    );
    assert_eq!(
        take_lines(api),
        [
            get_pvc("web-0-data"),
            get_pod("web-0"),
            post_event(),
            post_event()
        ]
    );
}

/// web-0 (uid A) has its generic ephemeral volume staged and published on this node.
async fn running(api: &MockApi, node: &mut Node) -> Volume {
    synced(node, api).await;
    let volume = web0_volume(node, api).await;
    node.stage(&volume).await.unwrap();
    node.publish(&volume, "target", &WEB0_A).await.unwrap();
    assert_eq!(take_lines(api), [get_pvc("web-0-data")]);
    volume
}

/// After the API server is back: the node listed its pods again (after any number of
/// failed attempts) and watches from the version it listed.
async fn resynced(api: &MockApi, node: &Node) {
    until_ready(node, true).await.unwrap();
    api.until_watching().await;
    let mut requests = take_lines(api);
    assert_eq!(requests.pop(), Some(pod_watch(api.version())), "{requests:#?}");
    assert_eq!(
        requests.pop(),
        Some(pod_list()),
        "the successful list: {requests:#?}"
    );
    assert!(requests.iter().all(|r| *r == pod_list()), "{requests:#?}");
}

async fn pod_recreated_while_away(mode: Mode) {
    let (client, api) = ephemeral_world();
    let mut node = node(client, timings(TTL));
    let volume = running(&api, &mut node).await;

    api.set_mode(mode);
    let reason = until_ready(&node, false).await.unwrap_err();
    assert!(reason.contains("Kubernetes caches"), "{reason}");
    // Meanwhile web-0 is deleted and created again: the node cannot see it.
    api.delete::<Pod>(Some(NS), "web-0");
    api.put(fixtures::pod("web-0", B, NODE, &[Uses::Ephemeral("data")]));

    // The cache still has web-0 with uid A and the claim cached says A: allowing would
    // rest on both, refusing web-0 (uid B) on the claim. Neither is decided.
    assert_code(node.stage(&volume).await, Code::Unavailable, "not synced");
    assert_code(
        node.publish(&volume, "t2", &WEB0_A).await,
        Code::Unavailable,
        "not synced",
    );
    assert_code(
        node.publish(&volume, "t2", &WEB0_B).await,
        Code::Unavailable,
        "not synced",
    );
    // kubelet cleans up the old pod's volume without the API.
    node.stats(&volume, "target").await.unwrap();
    node.unpublish(&volume, "target").await.unwrap();
    node.unstage(&volume).await.unwrap();
    assert!(node.mount_points().is_empty(), "{:?}", node.mount_points());
    // Nothing was asked but the reflector's attempts to list (if its retry came yet).
    let requests = take_lines(&api);
    assert!(requests.iter().all(|r| *r == pod_list()), "{requests:#?}");

    api.set_mode(Mode::Up);
    resynced(&api, &node).await;
    // The claim (still owned by uid A) is read again though its TTL has not run out,
    // and the listed cache lacks uid A: web-0 is read by name and found with uid B.
    // Both reads are fresh, so the refusal needs no second round.
    stage_finds_web0_with_uid_b(&api, &mut node, &volume).await;

    // The garbage collector removes the old claim; web-0 (uid B) gets its own.
    api.put(pvc(
        "web-0-data",
        "pvc-2",
        Some(pod_owner("web-0", B)),
        Some("pv-2"),
    ));
    let fresh = node.create("web-0-data", "pv-2").await;
    api.put(pv(
        "pv-2",
        DRIVER_NAME,
        &fresh.volume_id,
        Some(("web-0-data", "pvc-2")),
    ));
    // The claim cached by the refusal above is bound to pv-1: it is read again, not
    // taken to mean that this volume's claim is elsewhere. The owner, web-0 with uid B,
    // comes from the listed cache.
    node.stage(&fresh).await.unwrap();
    assert_eq!(take_lines(&api), [get_pvc("web-0-data")]);
    node.publish(&fresh, "target", &WEB0_B).await.unwrap();
    assert_eq!(take_lines(&api), NONE);
}

#[tokio::test]
async fn api_down_then_back_after_the_pod_was_recreated() {
    pod_recreated_while_away(Mode::Down).await;
}

#[tokio::test]
async fn api_failing_then_back_after_the_pod_was_recreated() {
    pod_recreated_while_away(Mode::Failing(503)).await;
}

#[tokio::test]
async fn a_claim_changed_while_the_api_was_away_is_read_again() {
    let (client, api) = ephemeral_world();
    let mut node = node(client, timings(TTL));
    let volume = running(&api, &mut node).await;

    api.set_mode(Mode::Down);
    until_ready(&node, false).await.unwrap_err();
    let intruder = pod_owner("intruder", "uid-x");
    api.put(pvc("web-0-data", "pvc-1", Some(intruder), Some("pv-1")));
    api.set_mode(Mode::Up);
    resynced(&api, &node).await;

    // Within the TTL, but read before the outage: read again, and it is not web-0's now.
    assert_code(
        node.publish(&volume, "t2", &WEB0_A).await,
        Code::FailedPrecondition,
        "found Pod apps/intruder (uid uid-x)",
    );
    assert_eq!(
        take_lines(&api),
        [get_pvc("web-0-data"), post_event(), post_event()]
    );
}

#[tokio::test]
async fn a_silent_api_server_makes_reads_time_out_not_decide() {
    // Long enough that no scheduling delay on a loaded machine expires the claim
    // between the setup's stage and publish, which each expect exactly one read.
    let ttl = Duration::from_secs(2);
    let (client, api) = ephemeral_world();
    let mut node = node(client, timings(ttl));
    let volume = running(&api, &mut node).await;

    api.set_mode(Mode::Silent);
    tokio::time::sleep(ttl).await;
    // The claim's TTL is over: the stage reads it and gets no answer.
    assert_code(node.stage(&volume).await, Code::Unavailable, "no answer within");
    assert_eq!(take_lines(&api), [get_pvc("web-0-data")]);
    // Publishing to web-0 (uid B) would be refused on the claim; it is not refused on a
    // claim that cannot be read again.
    assert_code(
        node.publish(&volume, "t2", &WEB0_B).await,
        Code::Unavailable,
        "no answer within",
    );
    assert_eq!(take_lines(&api), [get_pvc("web-0-data")]);

    api.set_mode(Mode::Up);
    node.stage(&volume).await.unwrap();
    assert_eq!(take_lines(&api), [get_pvc("web-0-data")]);
}

#[tokio::test]
async fn a_watch_that_expired_lists_again_and_sees_what_it_missed() {
    let (client, api) = ephemeral_world();
    let mut node = node(client, timings(TTL));
    let volume = running(&api, &mut node).await;

    // web-0 is recreated; the watch never tells, then ends with 410 Gone.
    api.hold_watch_events();
    api.delete::<Pod>(Some(NS), "web-0");
    api.put(fixtures::pod("web-0", B, NODE, &[Uses::Ephemeral("data")]));
    api.expire_watches();
    api.until_watching().await;
    assert_eq!(take_lines(&api), [pod_list(), pod_watch(api.version())]);
    until_ready(&node, true).await.unwrap();

    // The relisted cache has web-0 with uid B only, so uid A's stage reads the pod.
    stage_finds_web0_with_uid_b(&api, &mut node, &volume).await;
}

#[tokio::test]
async fn a_watch_the_server_closes_is_resumed_without_a_list() {
    let (client, api) = ephemeral_world();
    let node = node(client, timings(TTL));
    synced(&node, &api).await;
    // A change answers the open watch, which then ends as at the server's timeout.
    api.put(fixtures::pod("web-1", B, NODE, &[Uses::Ephemeral("data")]));
    api.until_watching().await;
    assert_eq!(take_lines(&api), [pod_watch(api.version())]);
    until_ready(&node, true).await.unwrap();
}
