//! The labeller against a mock API server that sees every request (method, path, query,
//! content type and body), over a loop class on the fake host that holds one real
//! snapshot record.

use std::path::Path;

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle, SendResponse};

use super::*;
use crate::backend::{CreateSpec, SnapshotSpec};
use crate::fs::FsType;
use crate::host::Host;
use crate::host::fake::loop_machine;
use crate::k8s::fixtures::NODE;
use crate::k8s::mock_api::status;
use crate::model::{ClaimRef, Token, VolumeMode};

type ApiHandle = Handle<Request<Body>, Response<Body>>;

const CONTENTS: &str = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents";

/// A node (loop class `default`) holding volume `src` and its snapshot `snap-1`.
struct Node {
    volumes: Arc<Volumes>,
    /// The snapshot's id, as its content's `snapshotHandle`.
    handle: String,
    _dir: tempfile::TempDir,
}

impl Node {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (commands, syscalls) = loop_machine(Path::new("/dev/loop-fake7"), 0);
        let host = Host {
            commands,
            syscalls: Arc::new(syscalls),
        };
        let volumes = Arc::new(Volumes::one_loop_class(dir.path(), host, NODE));
        let backend = volumes.backends().next().unwrap();
        // Made at start-up on a node: the class's snapshot directory.
        let crate::backend::Backend::Loop(loop_backend) = backend else {
            unreachable!("one loop class")
        };
        loop_backend.prepare().await.unwrap();
        backend
            .create(&CreateSpec {
                token: Token::for_name("src"),
                name: "src".to_string(),
                size_bytes: 64 << 20,
                mode: VolumeMode::Filesystem,
                fs_type: Some(FsType::Ext4),
                claim: ClaimRef::default(),
            })
            .await
            .unwrap();
        let snapshot = backend
            .create_snapshot(&SnapshotSpec {
                token: Token::for_name("snap-1"),
                name: "snap-1".to_string(),
                source: Token::for_name("src"),
                freeze: None,
            })
            .await
            .unwrap();
        Self {
            volumes,
            handle: snapshot.id.to_string(),
            _dir: dir,
        }
    }

    /// A labeller of this node, node-a, over a mock API server.
    fn labeller(&self) -> (ContentLabeller, ApiHandle) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let labeller = ContentLabeller::new(Client::new(service, "default"), Arc::clone(&self.volumes), NODE);
        (labeller, handle)
    }
}

/// A VolumeSnapshotContent as the API server sends it, at resourceVersion 42.
fn content(name: &str, driver: &str, source: Value, labels: Value) -> Value {
    json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotContent",
        "metadata": {"name": name, "resourceVersion": "42", "uid": "u-1", "labels": labels},
        "spec": {
            "deletionPolicy": "Delete",
            "driver": driver,
            "source": source,
            "volumeSnapshotRef": {"name": "pre", "namespace": "apps"},
        },
    })
}

/// A pre-provisioned content of `handle`, unlabelled.
fn pre_provisioned(name: &str, driver: &str, handle: &str) -> Value {
    content(name, driver, json!({"snapshotHandle": handle}), json!({}))
}

fn object(value: &Value) -> DynamicObject {
    serde_json::from_value(value.clone()).unwrap()
}

fn respond(send: SendResponse<Response<Body>>, code: StatusCode, body: &Value) {
    send.send_response(
        Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap(),
    );
}

/// Takes the next request, which must be the label PATCH of `name`, exactly: a JSON
/// merge patch of the label and the version seen, nothing else.
async fn expect_label_patch(handle: &mut ApiHandle, name: &str) -> SendResponse<Response<Body>> {
    let (request, send) = handle.next_request().await.expect("a PATCH");
    assert_eq!(request.method(), Method::PATCH);
    assert_eq!(request.uri().to_string(), format!("{CONTENTS}/{name}?"));
    assert_eq!(
        request.headers()[http::header::CONTENT_TYPE],
        "application/merge-patch+json"
    );
    let body: Value = serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"metadata": {
            "resourceVersion": "42",
            "labels": {"snapshot.storage.kubernetes.io/managed-by": NODE},
        }})
    );
    send
}

/// Drops the labeller and asserts that it made no request (more).
async fn no_more_requests(labeller: ContentLabeller, mut handle: ApiHandle) {
    drop(labeller);
    if let Some((request, _)) = handle.next_request().await {
        panic!("unexpected request {} {}", request.method(), request.uri());
    }
}

#[tokio::test]
async fn a_content_of_this_nodes_snapshot_gets_one_label_patch_with_its_version() {
    let node = Node::new().await;
    assert_eq!(node.handle, "snapshot.default.snap-1");
    let (labeller, mut handle) = node.labeller();
    let content = pre_provisioned("pre-1", DRIVER_NAME, &node.handle);
    let labelling = tokio::spawn({
        let (labeller, content) = (labeller.clone(), object(&content));
        async move { labeller.label(&content).await }
    });
    let send = expect_label_patch(&mut handle, "pre-1").await;
    let mut labelled = content.clone();
    labelled["metadata"]["labels"] = json!({MANAGED_BY: NODE});
    labelled["metadata"]["resourceVersion"] = json!("43");
    respond(send, StatusCode::OK, &labelled);
    assert_eq!(labelling.await.unwrap().unwrap(), Outcome::Labelled);
    no_more_requests(labeller, handle).await;
}

#[tokio::test]
async fn a_content_of_a_snapshot_not_on_this_node_gets_no_request() {
    let node = Node::new().await;
    let (labeller, handle) = node.labeller();
    for handle_text in ["snapshot.default.elsewhere", "snapshot.fast.snap-1"] {
        let content = object(&pre_provisioned("pre-1", DRIVER_NAME, handle_text));
        assert_eq!(
            labeller.label(&content).await.unwrap(),
            Outcome::Skipped(Skip::NotHere),
            "{handle_text}"
        );
    }
    no_more_requests(labeller, handle).await;
}

#[tokio::test]
async fn contents_of_other_drivers_and_handles_not_ours_get_no_request() {
    let node = Node::new().await;
    let (labeller, handle) = node.labeller();
    let cases = [
        // Another driver's content, even with a handle that is this node's snapshot id.
        (
            pre_provisioned("other", "hostpath.csi.k8s.io", &node.handle),
            Skip::OtherDriver,
        ),
        (
            content("no-driver", "", json!({"snapshotHandle": node.handle}), json!({})),
            Skip::OtherDriver,
        ),
        // A dynamic content (its source is the volume), unlabelled.
        (
            content(
                "dynamic",
                DRIVER_NAME,
                json!({"volumeHandle": "default.src"}),
                json!({}),
            ),
            Skip::NoHandle,
        ),
        // A handle localvol never makes: a volume id, foreign text.
        (
            pre_provisioned("volume-id", DRIVER_NAME, "default.src"),
            Skip::NotOurId,
        ),
        (
            pre_provisioned("foreign", DRIVER_NAME, "e7f1-4a2b"),
            Skip::NotOurId,
        ),
    ];
    for (content, skip) in cases {
        assert_eq!(
            labeller.label(&object(&content)).await.unwrap(),
            Outcome::Skipped(skip),
            "{content}"
        );
    }
    no_more_requests(labeller, handle).await;
}

/// The watch's selector keeps labelled contents away, but one that comes anyway (a
/// label added between list and use) is left to whoever labelled it.
#[tokio::test]
async fn a_labelled_content_is_left_alone() {
    let node = Node::new().await;
    let (labeller, handle) = node.labeller();
    for value in [NODE, "node-b", ""] {
        let labelled = content(
            "pre-1",
            DRIVER_NAME,
            json!({"snapshotHandle": node.handle}),
            json!({MANAGED_BY: value}),
        );
        assert_eq!(
            labeller.label(&object(&labelled)).await.unwrap(),
            Outcome::Skipped(Skip::Labelled),
            "{value:?}"
        );
    }
    // Never written without the version it was seen at.
    let mut unversioned = pre_provisioned("pre-1", DRIVER_NAME, &node.handle);
    unversioned["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    assert_eq!(
        labeller.label(&object(&unversioned)).await.unwrap(),
        Outcome::Skipped(Skip::Incomplete)
    );
    no_more_requests(labeller, handle).await;
}

/// 404: gone, nothing to do; 409: changed since seen, left for its next event; other
/// answers are errors, terminal or not as the API call's.
#[tokio::test]
async fn patch_answers_gone_conflict_and_failures() {
    let node = Node::new().await;
    let (labeller, mut handle) = node.labeller();
    let content = object(&pre_provisioned("pre-1", DRIVER_NAME, &node.handle));
    for (code, reason) in [
        (404, "NotFound"),
        (409, "Conflict"),
        (403, "Forbidden"),
        (503, "ServiceUnavailable"),
    ] {
        let labelling = tokio::spawn({
            let (labeller, content) = (labeller.clone(), content.clone());
            async move { labeller.label(&content).await }
        });
        let send = expect_label_patch(&mut handle, "pre-1").await;
        respond(send, StatusCode::from_u16(code).unwrap(), &status(code, reason));
        match (code, labelling.await.unwrap()) {
            (404, Ok(Outcome::Gone)) | (409, Ok(Outcome::Conflict)) => {}
            (403, Err(e @ ContentError::Label(_))) => assert!(e.is_terminal(), "{e}"),
            (503, Err(e @ ContentError::Label(_))) => assert!(!e.is_terminal(), "{e}"),
            (code, other) => panic!("{code}: {other:?}"),
        }
    }
    no_more_requests(labeller, handle).await;
}

/// The list and the watch both select the unlabelled contents only; of what they show,
/// this node's pre-provisioned content is labelled and nothing else is written.
#[tokio::test]
async fn the_watch_selects_unlabelled_contents_and_labels_this_nodes() {
    let node = Node::new().await;
    let (labeller, mut handle) = node.labeller();
    let task = tokio::spawn(run(labeller, Timings::default()));
    let selector = "labelSelector=%21snapshot.storage.kubernetes.io%2Fmanaged-by";

    let (request, send) = handle.next_request().await.unwrap();
    assert_eq!(request.method(), Method::GET);
    assert_eq!(
        request.uri().to_string(),
        format!("{CONTENTS}?&{selector}&limit=500")
    );
    let list = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotContentList",
        "metadata": {"resourceVersion": "50"},
        "items": [
            pre_provisioned("elsewhere", DRIVER_NAME, "snapshot.default.elsewhere"),
            pre_provisioned("other", "hostpath.csi.k8s.io", &node.handle),
            pre_provisioned("pre-1", DRIVER_NAME, &node.handle),
        ],
    });
    respond(send, StatusCode::OK, &list);

    let send = expect_label_patch(&mut handle, "pre-1").await;
    respond(
        send,
        StatusCode::OK,
        &content(
            "pre-1",
            DRIVER_NAME,
            json!({"snapshotHandle": node.handle}),
            json!({MANAGED_BY: NODE}),
        ),
    );

    let (request, _held) = handle.next_request().await.unwrap();
    assert_eq!(request.method(), Method::GET);
    assert_eq!(
        request.uri().to_string(),
        format!(
            "{CONTENTS}?&watch=true&timeoutSeconds=290&{selector}&allowWatchBookmarks=true&resourceVersion=50"
        )
    );
    task.abort();
    let _ = task.await;
    assert!(handle.next_request().await.is_none(), "a request after the watch");
}

/// Without the CRD (404) or the RBAC (403) the list is asked for again only every
/// ABSENT_RETRY, and the labelling starts once it answers.
#[tokio::test(start_paused = true)]
async fn without_the_api_the_list_is_retried_slowly() {
    let node = Node::new().await;
    let (labeller, mut handle) = node.labeller();
    let task = tokio::spawn(run(labeller, Timings::default()));
    let mut last = None;
    for (code, reason) in [(404, "NotFound"), (404, "NotFound"), (403, "Forbidden")] {
        let (request, send) = handle.next_request().await.unwrap();
        let now = tokio::time::Instant::now();
        if let Some(last) = last {
            assert!(now - last >= ABSENT_RETRY, "asked again after {:?}", now - last);
        }
        last = Some(now);
        assert!(
            request.uri().query().unwrap().contains("limit=500"),
            "{}",
            request.uri()
        );
        respond(send, StatusCode::from_u16(code).unwrap(), &status(code, reason));
    }
    let (request, send) = handle.next_request().await.unwrap();
    assert!(tokio::time::Instant::now() - last.unwrap() >= ABSENT_RETRY);
    assert!(
        request.uri().query().unwrap().contains("limit=500"),
        "{}",
        request.uri()
    );
    let list = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotContentList",
        "metadata": {"resourceVersion": "7"},
        "items": [pre_provisioned("pre-1", DRIVER_NAME, &node.handle)],
    });
    respond(send, StatusCode::OK, &list);
    let send = expect_label_patch(&mut handle, "pre-1").await;
    respond(send, StatusCode::CONFLICT, &status(409, "Conflict"));
    // A conflict is left for the content's next event: the watch goes on.
    let (request, _held) = handle.next_request().await.unwrap();
    assert!(
        request.uri().query().unwrap().contains("watch=true"),
        "{}",
        request.uri()
    );
    task.abort();
    let _ = task.await;
}

/// A failed PATCH lists again after the backoff, which brings the content back.
#[tokio::test(start_paused = true)]
async fn a_failed_label_is_retried_by_listing_again() {
    let node = Node::new().await;
    let (labeller, mut handle) = node.labeller();
    let task = tokio::spawn(run(labeller, Timings::default()));
    let list = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotContentList",
        "metadata": {"resourceVersion": "7"},
        "items": [pre_provisioned("pre-1", DRIVER_NAME, &node.handle)],
    });
    let (_, send) = handle.next_request().await.unwrap();
    respond(send, StatusCode::OK, &list);
    let send = expect_label_patch(&mut handle, "pre-1").await;
    let failed = tokio::time::Instant::now();
    respond(
        send,
        StatusCode::SERVICE_UNAVAILABLE,
        &status(503, "ServiceUnavailable"),
    );
    let (request, send) = handle.next_request().await.unwrap();
    assert!(
        request.uri().query().unwrap().contains("limit=500"),
        "{}",
        request.uri()
    );
    assert!(tokio::time::Instant::now() - failed >= WATCH_RETRY.first);
    respond(send, StatusCode::OK, &list);
    let send = expect_label_patch(&mut handle, "pre-1").await;
    respond(send, StatusCode::NOT_FOUND, &status(404, "NotFound"));
    task.abort();
    let _ = task.await;
}

#[test]
fn each_unavailable_state_is_said_once() {
    let mut said = Said::default();
    assert!(said.unavailable(Unavailable::NoApi));
    assert!(!said.unavailable(Unavailable::NoApi));
    assert!(said.unavailable(Unavailable::Forbidden));
    assert!(!said.unavailable(Unavailable::Forbidden));
    assert!(said.available());
    assert!(!said.available());
    assert!(said.unavailable(Unavailable::Forbidden));
}

#[test]
fn the_selector_is_the_absence_of_the_label() {
    assert_eq!(UNLABELLED, format!("!{MANAGED_BY}"));
    let resource = resource();
    assert_eq!(resource.api_version, "snapshot.storage.k8s.io/v1");
    assert_eq!(resource.plural, "volumesnapshotcontents");
}

#[test]
fn node_names_that_cannot_be_label_values_are_told_apart() {
    assert!(is_label_value("node-a"));
    assert!(is_label_value("node-a.example.com"));
    assert!(is_label_value(&"n".repeat(63)));
    assert!(!is_label_value(&"n".repeat(64)));
    assert!(!is_label_value(""));
    assert!(!is_label_value("-node"));
    assert!(!is_label_value("node/a"));
}
