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
use crate::backend::BackendError;
use crate::error::Error;
use crate::host::fake::{FakeCommands, FakeSyscalls};
use crate::host::{CommandError, FsUsage, Host};
use crate::locks::{LockError, VolumeLocks};
use crate::model::{AccessMode, AccessType, Capability, ClassName, Token, VolumeId};
use crate::model::{CapacityRange, ClaimRef, Terminal};
use crate::request::CreateRequest;
use crate::volume::{VolumeError, Volumes};

mod node_resizer;
mod reporting;

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

/// The read of the claim, at `rv`, with no conditions.
fn get_claim(rv: &str, request: &str, capacity: &str, value: Option<&str>) -> Step {
    step(
        Method::GET,
        PVC_PATH,
        200,
        pvc(rv, request, capacity, value, json!([])),
    )
}

/// A write of the claim's status, answered with the claim at `rv`, with no conditions.
fn patch_claim(rv: &str, request: &str, capacity: &str, value: Option<&str>) -> Step {
    step(
        Method::PATCH,
        STATUS_PATH,
        200,
        pvc(rv, request, capacity, value, json!([])),
    )
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

/// One node expansion to `required` bytes reported from its start to `result`; then
/// the server's script is checked.
async fn report_one<E: Terminal + Sync>(
    (client, server): (Client, JoinHandle<()>),
    failure: FailureValue,
    required: u64,
    result: Result<u64, E>,
) {
    let reporter = reporter(client, failure);
    let report = reporter.started(&claim(), required).await;
    reporter.finished(report, &result).await;
    drop(reporter);
    server.await.unwrap();
}

fn in_progress_patch(rv: &str) -> Value {
    json!({
        "metadata": {"resourceVersion": rv},
        "status": {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}},
    })
}

const GI2: u64 = 2 << 30;
