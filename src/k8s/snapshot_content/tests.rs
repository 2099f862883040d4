//! The labeller against a mock API server that sees every request (method, path, query,
//! content type and body), over a loop class on the fake host that holds one real
//! snapshot record.

use std::path::Path;

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::*;
use crate::backend::{CreateSpec, SnapshotSpec};
use crate::fs::FsType;
use crate::host::Host;
use crate::host::fake::loop_machine;
use crate::k8s::fixtures::NODE;
use crate::k8s::mock_api::{Exchange, MockApi, Reply, get, status};
use crate::model::{ClaimRef, Token, VolumeMode};

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
                encryption: None,
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

    /// A labeller of this node, node-a, over a mock API server that expects nothing yet.
    fn labeller(&self) -> (ContentLabeller, MockApi) {
        let (client, api) = MockApi::scripted(vec![]);
        let labeller = ContentLabeller::new(client, Arc::clone(&self.volumes), NODE);
        (labeller, api)
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

fn answer(code: u16, body: Value) -> Reply {
    Reply::Json(StatusCode::from_u16(code).unwrap(), body)
}

/// The label PATCH of `name`, exactly: a JSON merge patch of the label and the version
/// seen, nothing else.
fn label_patch(name: &str, reply: Reply) -> Exchange {
    Exchange::new(Method::PATCH, format!("{CONTENTS}/{name}?"), reply)
        .content_type("application/merge-patch+json")
        .check(|body| {
            assert_eq!(
                body,
                &json!({"metadata": {
                    "resourceVersion": "42",
                    "labels": {"snapshot.storage.kubernetes.io/managed-by": NODE},
                }})
            );
        })
}

const SELECTOR: &str = "labelSelector=%21snapshot.storage.kubernetes.io%2Fmanaged-by";

/// The list of the unlabelled contents.
fn list(reply: Reply) -> Exchange {
    get(format!("{CONTENTS}?&{SELECTOR}&limit=500"), reply)
}

/// The watch of the unlabelled contents from `version`. Its reply is held and never
/// released: a watch with nothing to tell.
fn watch(version: u64) -> Exchange {
    let uri = format!(
        "{CONTENTS}?&watch=true&timeoutSeconds=290&{SELECTOR}&allowWatchBookmarks=true&resourceVersion={version}"
    );
    get(uri, answer(200, json!({}))).held()
}

/// Drops the labeller and asserts that it made no request but the expected ones.
async fn finish(labeller: ContentLabeller, api: MockApi) {
    drop(labeller);
    api.finish().await;
}

#[tokio::test]
async fn a_content_of_this_nodes_snapshot_gets_one_label_patch_with_its_version() {
    let node = Node::new().await;
    assert_eq!(node.handle, "snapshot.default.snap-1");
    let (labeller, api) = node.labeller();
    let content = pre_provisioned("pre-1", DRIVER_NAME, &node.handle);
    let mut labelled = content.clone();
    labelled["metadata"]["labels"] = json!({MANAGED_BY: NODE});
    labelled["metadata"]["resourceVersion"] = json!("43");
    api.expect(label_patch("pre-1", answer(200, labelled)));
    assert_eq!(
        labeller.label(&object(&content)).await.unwrap(),
        Outcome::Labelled
    );
    finish(labeller, api).await;
}

#[tokio::test]
async fn a_content_of_a_snapshot_not_on_this_node_gets_no_request() {
    let node = Node::new().await;
    let (labeller, api) = node.labeller();
    for handle_text in ["snapshot.default.elsewhere", "snapshot.fast.snap-1"] {
        let content = object(&pre_provisioned("pre-1", DRIVER_NAME, handle_text));
        assert_eq!(
            labeller.label(&content).await.unwrap(),
            Outcome::Skipped(Skip::NotHere),
            "{handle_text}"
        );
    }
    finish(labeller, api).await;
}

#[tokio::test]
async fn contents_of_other_drivers_and_handles_not_ours_get_no_request() {
    let node = Node::new().await;
    let (labeller, api) = node.labeller();
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
    finish(labeller, api).await;
}

/// The watch's selector keeps labelled contents away, but one that comes anyway (a
/// label added between list and use) is left to whoever labelled it.
#[tokio::test]
async fn a_labelled_content_is_left_alone() {
    let node = Node::new().await;
    let (labeller, api) = node.labeller();
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
    finish(labeller, api).await;
}

/// 404: gone, nothing to do; 409: changed since seen, left for its next event; other
/// answers are errors, terminal or not as the API call's.
#[tokio::test]
async fn patch_answers_gone_conflict_and_failures() {
    let node = Node::new().await;
    let (labeller, api) = node.labeller();
    let content = object(&pre_provisioned("pre-1", DRIVER_NAME, &node.handle));
    for (code, reason) in [
        (404, "NotFound"),
        (409, "Conflict"),
        (403, "Forbidden"),
        (503, "ServiceUnavailable"),
    ] {
        api.expect(label_patch("pre-1", answer(code, status(code, reason))));
        match (code, labeller.label(&content).await) {
            (404, Ok(Outcome::Gone)) | (409, Ok(Outcome::Conflict)) => {}
            (403, Err(e @ ContentError::Label(_))) => assert!(e.is_terminal(), "{e}"),
            (503, Err(e @ ContentError::Label(_))) => assert!(!e.is_terminal(), "{e}"),
            (code, other) => panic!("{code}: {other:?}"),
        }
    }
    finish(labeller, api).await;
}

/// The list and the watch both select the unlabelled contents only; of what they show,
/// this node's pre-provisioned content is labelled and nothing else is written.
#[tokio::test]
async fn the_watch_selects_unlabelled_contents_and_labels_this_nodes() {
    let node = Node::new().await;
    let (labeller, api) = node.labeller();
    api.expect(list(answer(
        200,
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotContentList",
            "metadata": {"resourceVersion": "50"},
            "items": [
                pre_provisioned("elsewhere", DRIVER_NAME, "snapshot.default.elsewhere"),
                pre_provisioned("other", "hostpath.csi.k8s.io", &node.handle),
                pre_provisioned("pre-1", DRIVER_NAME, &node.handle),
            ],
        }),
    )));
    api.expect(label_patch(
        "pre-1",
        answer(
            200,
            content(
                "pre-1",
                DRIVER_NAME,
                json!({"snapshotHandle": node.handle}),
                json!({MANAGED_BY: NODE}),
            ),
        ),
    ));
    let watching = api.expect(watch(50));
    let task = tokio::spawn(run(labeller, Timings::default()));
    watching.asked().await;
    task.abort();
    let _ = task.await;
    // Nothing after the watch: it would be past the script.
    api.finish().await;
}

/// A list of the one pre-provisioned content of this node, at resourceVersion 7.
fn list_of_pre_1(node: &Node) -> Reply {
    answer(
        200,
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotContentList",
            "metadata": {"resourceVersion": "7"},
            "items": [pre_provisioned("pre-1", DRIVER_NAME, &node.handle)],
        }),
    )
}

/// Without the CRD (404) or the RBAC (403) the list is asked for again only every
/// ABSENT_RETRY, and the labelling starts once it answers.
#[tokio::test(start_paused = true)]
async fn without_the_api_the_list_is_retried_slowly() {
    let node = Node::new().await;
    let (labeller, api) = node.labeller();
    for (code, reason) in [(404, "NotFound"), (404, "NotFound"), (403, "Forbidden")] {
        api.expect(list(answer(code, status(code, reason))));
    }
    api.expect(list(list_of_pre_1(&node)));
    api.expect(label_patch("pre-1", answer(409, status(409, "Conflict"))));
    // A conflict is left for the content's next event: the watch goes on.
    let watching = api.expect(watch(7));
    let task = tokio::spawn(run(labeller, Timings::default()));
    watching.asked().await;
    let lists: Vec<_> = api
        .requests()
        .iter()
        .filter(|r| r.uri.contains("limit=500"))
        .map(|r| r.at)
        .collect();
    assert_eq!(lists.len(), 4);
    for pair in lists.windows(2) {
        let again = pair[1] - pair[0];
        assert!(again >= ABSENT_RETRY, "asked again after {again:?}");
    }
    task.abort();
    let _ = task.await;
    api.finish().await;
}

/// A failed PATCH lists again after the backoff, which brings the content back.
#[tokio::test(start_paused = true)]
async fn a_failed_label_is_retried_by_listing_again() {
    let node = Node::new().await;
    let (labeller, api) = node.labeller();
    api.expect(list(list_of_pre_1(&node)));
    let failed = api.expect(label_patch(
        "pre-1",
        answer(503, status(503, "ServiceUnavailable")),
    ));
    let listed_again = api.expect(list(list_of_pre_1(&node)));
    api.expect(label_patch("pre-1", answer(404, status(404, "NotFound"))));
    // Gone: nothing more to label, the watch goes on.
    let watching = api.expect(watch(7));
    let task = tokio::spawn(run(labeller, Timings::default()));
    watching.asked().await;
    let backoff = listed_again.asked().await.at - failed.asked().await.at;
    assert!(backoff >= WATCH_RETRY.first, "listed again after {backoff:?}");
    task.abort();
    let _ = task.await;
    api.finish().await;
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
