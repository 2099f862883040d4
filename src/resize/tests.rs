//! Resize reporting and the node resizer against a scripted mock API server: every
//! request is checked in order (method, path with query, JSON body) and answered from
//! the script; a request past the script, or a script step never reached, fails.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::node_resizer::{NodeResizer, Outcome};
use super::report::{NodeReporter, NodeReporting};
use super::{FailureValue, ReportResizeStatus, ResizeArgs};
use crate::backend::{Backend, BackendError, LoopBackend};
use crate::error::Error;
use crate::host::fake::{FakeCommands, FakeSyscalls};
use crate::host::{CommandError, FsUsage, Host};
use crate::locks::{LockError, VolumeLocks};
use crate::model::{AccessMode, AccessType, Capability, ClassName, Token, VolumeId};
use crate::model::{CapacityRange, ClaimRef};
use crate::request::CreateRequest;
use crate::volume::{VolumeError, Volumes};

mod node_resizer;

const NS: &str = "apps";
const PVC: &str = "data";
const PV: &str = "pvc-1";
const PVC_PATH: &str = "/api/v1/namespaces/apps/persistentvolumeclaims/data";
const STATUS_PATH: &str = "/api/v1/namespaces/apps/persistentvolumeclaims/data/status?&fieldManager=localvol";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/apps/events?";
const TIME: &str = "<time>";

type Check = Box<dyn Fn(&Value) + Send + Sync>;

/// One request the server expects, and its answer.
struct Step {
    method: Method,
    /// Path and query; a trailing `*` matches any rest.
    path: String,
    check: Option<Check>,
    status: u16,
    reply: Value,
}

fn step(method: Method, path: &str, status: u16, reply: Value) -> Step {
    Step {
        method,
        path: path.to_string(),
        check: None,
        status,
        reply,
    }
}

impl Step {
    /// The body must equal `expected` once every `lastTransitionTime` is replaced by
    /// [`TIME`] (after checking it is an RFC 3339 time).
    fn body(mut self, expected: Value) -> Self {
        self.check = Some(Box::new(move |actual| {
            let mut actual = actual.clone();
            normalise_times(&mut actual);
            assert_eq!(actual, expected, "request body");
        }));
        self
    }

    fn check(mut self, check: impl Fn(&Value) + Send + Sync + 'static) -> Self {
        self.check = Some(Box::new(check));
        self
    }
}

fn normalise_times(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if k == "lastTransitionTime" {
                    let text = v.as_str().expect("a time string");
                    text.parse::<k8s_openapi::jiff::Timestamp>()
                        .unwrap_or_else(|e| panic!("{text:?} is not a time: {e}"));
                    *v = Value::String(TIME.to_string());
                } else {
                    normalise_times(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalise_times),
        _ => {}
    }
}

/// A mock API server answering `script` in order. Await the handle after dropping every
/// user of the client: it fails on a missing or extra request.
fn serve(script: Vec<Step>) -> (Client, JoinHandle<()>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(async move {
        for (i, step) in script.into_iter().enumerate() {
            let (request, send) = tokio::time::timeout(Duration::from_secs(10), handle.next_request())
                .await
                .unwrap_or_else(|_| panic!("step {i}: no {} {} within 10s", step.method, step.path))
                .unwrap_or_else(|| panic!("step {i}: client gone before {} {}", step.method, step.path));
            let uri = request.uri().to_string();
            assert_eq!(request.method(), step.method, "step {i}: method of {uri}");
            match step.path.strip_suffix('*') {
                Some(prefix) => assert!(
                    uri.starts_with(prefix),
                    "step {i}: {uri} does not start with {prefix}"
                ),
                None => assert_eq!(uri, step.path, "step {i}: path"),
            }
            if let Some(check) = &step.check {
                let bytes = request.into_body().collect_bytes().await.unwrap();
                let body: Value = serde_json::from_slice(&bytes).unwrap();
                check(&body);
            }
            let response = Response::builder()
                .status(step.status)
                .body(Body::from(serde_json::to_vec(&step.reply).unwrap()))
                .unwrap();
            send.send_response(response);
        }
        if let Some((request, _)) = handle.next_request().await {
            panic!("request past the script: {} {}", request.method(), request.uri());
        }
    });
    (Client::new(service, "default"), server)
}

fn pvc(rv: &str, request: &str, capacity: &str, value: Option<&str>, conditions: Value) -> Value {
    let mut status = json!({
        "phase": "Bound",
        "capacity": {"storage": capacity},
        "conditions": conditions,
    });
    if let Some(value) = value {
        status["allocatedResourceStatuses"] = json!({"storage": value});
        status["allocatedResources"] = json!({"storage": request});
    }
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": PVC, "namespace": NS, "uid": "uid-data", "resourceVersion": rv},
        "spec": {
            "volumeName": PV,
            "storageClassName": "localvol",
            "resources": {"requests": {"storage": request}},
        },
        "status": status,
    })
}

fn conflict() -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
        "message": "the object has been modified; please apply your changes to the latest version and try again",
    })
}

fn version(minor: &str) -> Step {
    step(
        Method::GET,
        "/version",
        200,
        json!({
            "major": "1", "minor": minor, "gitVersion": format!("v1.{minor}.2"), "gitCommit": "abc",
            "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.23",
            "compiler": "gc", "platform": "linux/amd64",
        }),
    )
}

/// An event on the claim: created (POST) and echoed back.
fn event(kind: &'static str, reason: &'static str) -> Step {
    Step {
        method: Method::POST,
        path: EVENTS_PATH.to_string(),
        check: Some(Box::new(move |body| {
            assert_eq!(body["reason"], reason, "event {body}");
            assert_eq!(body["type"], kind, "event {body}");
            assert_eq!(body["regarding"]["kind"], "PersistentVolumeClaim");
            assert_eq!(body["regarding"]["name"], PVC);
            assert_eq!(body["reportingController"], "localvol.csi.dev");
            assert_eq!(body["reportingInstance"], "node-a");
        })),
        status: 201,
        reply: json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "data.1", "namespace": NS},
            "eventTime": "2025-01-01T00:00:00.000000Z", "reason": reason, "type": kind,
        }),
    }
}

/// The same event again: kube's recorder patches the series.
fn event_again(reason: &'static str) -> Step {
    Step {
        method: Method::PATCH,
        path: "/apis/events.k8s.io/v1/namespaces/apps/events/data.*".to_string(),
        check: Some(Box::new(move |body| {
            assert_eq!(body["reason"], reason, "event {body}");
            assert_eq!(body["series"]["count"], 2, "event {body}");
        })),
        status: 200,
        reply: json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "data.1", "namespace": NS},
            "eventTime": "2025-01-01T00:00:00.000000Z", "reason": reason,
        }),
    }
}

fn claim() -> ClaimRef {
    ClaimRef {
        pvc_name: Some(PVC.to_string()),
        pvc_namespace: Some(NS.to_string()),
        pv_name: Some(PV.to_string()),
    }
}

fn reporter(client: Client, failure: FailureValue) -> Arc<NodeReporter> {
    match NodeReporting::new(client, "node-a", failure) {
        NodeReporting::On(reporter) => reporter,
        NodeReporting::Off => unreachable!(),
    }
}

fn no_space() -> Error {
    VolumeError::Backend(BackendError::NoSpace {
        class: ClassName::parse("default").unwrap(),
        requested: 4 << 30,
        available: 1 << 30,
    })
    .into()
}

fn in_progress_patch(rv: &str) -> Value {
    json!({
        "metadata": {"resourceVersion": rv},
        "status": {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}},
    })
}

const GI2: u64 = 2 << 30;

#[tokio::test]
async fn success_reports_in_progress_then_the_new_capacity() {
    let fs_pending = json!([{"type": "FileSystemResizePending", "status": "True"}]);
    let (client, server) = serve(vec![
        step(
            Method::GET,
            PVC_PATH,
            200,
            pvc("41", "2Gi", "1Gi", Some("NodeResizePending"), fs_pending.clone()),
        ),
        step(
            Method::PATCH,
            STATUS_PATH,
            200,
            pvc("42", "2Gi", "1Gi", Some("NodeResizeInProgress"), fs_pending),
        )
        .body(in_progress_patch("41")),
        event("Normal", "NodeExpansionStarted"),
        step(
            Method::PATCH,
            STATUS_PATH,
            200,
            pvc("43", "2Gi", "2Gi", None, json!([])),
        )
        .body(json!({
            "metadata": {"resourceVersion": "42"},
            "status": {
                "allocatedResourceStatuses": {"storage": null},
                "capacity": {"storage": "2Gi"},
                "conditions": [{"$patch": "delete", "type": "FileSystemResizePending"}],
            },
        })),
        event("Normal", "NodeExpansionSucceeded"),
    ]);
    let reporter = reporter(client, FailureValue::Auto);
    let report = reporter.started(&claim(), GI2).await;
    reporter.finished(report, &Ok::<_, Error>(GI2)).await;
    drop(reporter);
    server.await.unwrap();
}

#[tokio::test]
async fn terminal_failure_sets_the_failure_value_and_condition() {
    for (minor, value) in [
        ("30", "NodeResizeFailed"),
        ("31", "NodeResizeInfeasible"),
        ("32", "NodeResizeInfeasible"),
    ] {
        let (client, server) = serve(vec![
            step(
                Method::GET,
                PVC_PATH,
                200,
                pvc("41", "4Gi", "1Gi", Some("NodeResizePending"), json!([])),
            ),
            step(
                Method::PATCH,
                STATUS_PATH,
                200,
                pvc("42", "4Gi", "1Gi", Some("NodeResizeInProgress"), json!([])),
            )
            .body(in_progress_patch("41")),
            event("Normal", "NodeExpansionStarted"),
            version(minor),
            step(
                Method::PATCH,
                STATUS_PATH,
                200,
                pvc("43", "4Gi", "1Gi", Some(value), json!([])),
            )
            .check(move |body| {
                let mut body = body.clone();
                normalise_times(&mut body);
                let message = body["status"]["conditions"][0]["message"]
                    .as_str()
                    .unwrap()
                    .to_string();
                assert!(
                    message.contains("has 1073741824 bytes free, 4294967296 requested"),
                    "{message}"
                );
                assert_eq!(
                    body,
                    json!({
                        "metadata": {"resourceVersion": "42"},
                        "status": {
                            "allocatedResourceStatuses": {"storage": value},
                            "conditions": [{
                                "type": "NodeResizeError", "status": "True",
                                "lastTransitionTime": TIME, "message": message,
                            }],
                        },
                    })
                );
            }),
            event("Warning", "NodeExpansionFailed"),
        ]);
        let reporter = reporter(client, FailureValue::Auto);
        let report = reporter.started(&claim(), 4 << 30).await;
        reporter.finished(report, &Err(no_space())).await;
        drop(reporter);
        server.await.unwrap();
    }
}

#[tokio::test]
async fn a_forced_failure_value_does_not_ask_the_server() {
    for (forced, value) in [
        (FailureValue::NodeResizeFailed, "NodeResizeFailed"),
        (FailureValue::NodeResizeInfeasible, "NodeResizeInfeasible"),
    ] {
        let (client, server) = serve(vec![
            step(
                Method::GET,
                PVC_PATH,
                200,
                pvc("41", "4Gi", "1Gi", Some("NodeResizeInProgress"), json!([])),
            ),
            // Already in progress: nothing to write at the start.
            event("Normal", "NodeExpansionStarted"),
            step(
                Method::PATCH,
                STATUS_PATH,
                200,
                pvc("42", "4Gi", "1Gi", Some(value), json!([])),
            )
            .check(move |body| assert_eq!(body["status"]["allocatedResourceStatuses"]["storage"], value)),
            event("Warning", "NodeExpansionFailed"),
        ]);
        let reporter = reporter(client, forced);
        let report = reporter.started(&claim(), 4 << 30).await;
        reporter.finished(report, &Err(no_space())).await;
        drop(reporter);
        server.await.unwrap();
    }
}

#[tokio::test]
async fn transient_failure_writes_no_status_then_success_does() {
    let busy: Error = LockError::Busy {
        volume: "v".into(),
        operation: "NodeExpandVolume",
    }
    .into();
    let timed_out: Error = VolumeError::Backend(BackendError::Command(CommandError::TimedOut {
        program: "lvextend",
        args: String::new(),
        timeout: Duration::from_secs(120),
    }))
    .into();
    let (client, server) = serve(vec![
        // First try: times out.
        step(
            Method::GET,
            PVC_PATH,
            200,
            pvc("41", "2Gi", "1Gi", Some("NodeResizePending"), json!([])),
        ),
        step(
            Method::PATCH,
            STATUS_PATH,
            200,
            pvc("42", "2Gi", "1Gi", Some("NodeResizeInProgress"), json!([])),
        )
        .body(in_progress_patch("41")),
        event("Normal", "NodeExpansionStarted"),
        event("Warning", "NodeExpansionRetrying"),
        // Second try: the volume is busy.
        step(
            Method::GET,
            PVC_PATH,
            200,
            pvc("42", "2Gi", "1Gi", Some("NodeResizeInProgress"), json!([])),
        ),
        event_again("NodeExpansionStarted"),
        event_again("NodeExpansionRetrying"),
        // Third try: done.
        step(
            Method::GET,
            PVC_PATH,
            200,
            pvc("42", "2Gi", "1Gi", Some("NodeResizeInProgress"), json!([])),
        ),
        Step {
            method: Method::PATCH,
            path: "/apis/events.k8s.io/v1/namespaces/apps/events/data.*".to_string(),
            check: None,
            status: 200,
            reply: json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "data.1"}, "eventTime": "2025-01-01T00:00:00.000000Z"}),
        },
        step(
            Method::PATCH,
            STATUS_PATH,
            200,
            pvc("43", "2Gi", "2Gi", None, json!([])),
        )
        .body(json!({
            "metadata": {"resourceVersion": "42"},
            "status": {"allocatedResourceStatuses": {"storage": null}, "capacity": {"storage": "2Gi"}},
        })),
        event("Normal", "NodeExpansionSucceeded"),
    ]);
    let reporter = reporter(client, FailureValue::Auto);
    let report = reporter.started(&claim(), GI2).await;
    reporter.finished(report, &Err(timed_out)).await;
    let report = reporter.started(&claim(), GI2).await;
    reporter.finished(report, &Err(busy)).await;
    let report = reporter.started(&claim(), GI2).await;
    reporter.finished(report, &Ok::<_, Error>(GI2)).await;
    drop(reporter);
    server.await.unwrap();
}

#[tokio::test]
async fn a_claim_changed_meanwhile_is_read_again_and_patched_at_its_new_version() {
    let (client, server) = serve(vec![
        step(
            Method::GET,
            PVC_PATH,
            200,
            pvc("41", "2Gi", "1Gi", Some("NodeResizePending"), json!([])),
        ),
        step(Method::PATCH, STATUS_PATH, 409, conflict()).body(in_progress_patch("41")),
        step(
            Method::GET,
            PVC_PATH,
            200,
            pvc("44", "2Gi", "1Gi", Some("NodeResizePending"), json!([])),
        ),
        step(
            Method::PATCH,
            STATUS_PATH,
            200,
            pvc("45", "2Gi", "1Gi", Some("NodeResizeInProgress"), json!([])),
        )
        .body(in_progress_patch("44")),
        event("Normal", "NodeExpansionStarted"),
        step(Method::PATCH, STATUS_PATH, 409, conflict())
            .check(|b| assert_eq!(b["metadata"]["resourceVersion"], "45")),
        // Someone else finished meanwhile: nothing left to write.
        step(
            Method::GET,
            PVC_PATH,
            200,
            pvc("46", "2Gi", "2Gi", None, json!([])),
        ),
        event("Normal", "NodeExpansionSucceeded"),
    ]);
    let reporter = reporter(client, FailureValue::Auto);
    let report = reporter.started(&claim(), GI2).await;
    reporter.finished(report, &Ok::<_, Error>(GI2)).await;
    drop(reporter);
    server.await.unwrap();
}

#[tokio::test]
async fn conflicts_are_retried_a_bounded_number_of_times() {
    let mut script = vec![step(
        Method::GET,
        PVC_PATH,
        200,
        pvc("41", "2Gi", "1Gi", Some("NodeResizePending"), json!([])),
    )];
    for rv in ["41", "50", "51"] {
        script.push(step(Method::PATCH, STATUS_PATH, 409, conflict()).body(in_progress_patch(rv)));
        if rv != "51" {
            let next = if rv == "41" { "50" } else { "51" };
            script.push(step(
                Method::GET,
                PVC_PATH,
                200,
                pvc(next, "2Gi", "1Gi", Some("NodeResizePending"), json!([])),
            ));
        }
    }
    let (client, server) = serve(script);
    let status = super::status::ClaimStatus::new(client, FailureValue::Auto);
    let pvc = status.get(NS, PVC).await.unwrap();
    let err = status
        .apply(pvc, &super::status::Transition::NodeInProgress)
        .await
        .unwrap_err();
    assert!(
        matches!(err, super::status::StatusError::Conflict { .. }),
        "{err}"
    );
    drop(status);
    server.await.unwrap();
}

#[tokio::test]
async fn a_repeated_call_at_the_same_size_writes_nothing() {
    let (client, server) = serve(vec![step(
        Method::GET,
        PVC_PATH,
        200,
        pvc("41", "2Gi", "2Gi", None, json!([])),
    )]);
    let reporter = reporter(client, FailureValue::Auto);
    let report = reporter.started(&claim(), GI2).await;
    reporter.finished(report, &Ok::<_, Error>(GI2)).await;
    drop(reporter);
    server.await.unwrap();
}

#[tokio::test]
async fn a_claim_bound_to_another_volume_is_left_alone() {
    let mut other = pvc("41", "2Gi", "1Gi", Some("NodeResizePending"), json!([]));
    other["spec"]["volumeName"] = json!("pvc-other");
    let (client, server) = serve(vec![step(Method::GET, PVC_PATH, 200, other)]);
    let reporter = reporter(client, FailureValue::Auto);
    let report = reporter.started(&claim(), GI2).await;
    reporter.finished(report, &Err(no_space())).await;
    drop(reporter);
    server.await.unwrap();
}
