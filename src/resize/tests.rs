//! Resize reporting and the node resizer against a scripted mock API server
//! (`crate::k8s::mock_api`): every request is checked in order (method, path with
//! query, JSON body) and answered from the script; a request past the script, or a
//! script step never reached, fails.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use kube::Client;
use serde_json::{Value, json};

use super::node_resizer::{NodeResizer, Outcome};
use super::report::{NodeReporter, NodeReporting};
use super::{FailureValue, ReportResizeStatus, ResizeArgs};
use crate::backend::BackendError;
use crate::error::Error;
use crate::host::fake::{FakeCommands, FakeSyscalls};
use crate::host::{CommandError, FsUsage, Host};
use crate::k8s::claim_resize::ResizeApi;
use crate::k8s::mock_api::{Exchange, MockApi, Reply};
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
/// A repeated event's series, whichever name the event got.
const EVENTS_SERIES_PATH: &str = "/apis/events.k8s.io/v1/namespaces/apps/events/data.*";
const TIME: &str = "<time>";

/// An expected request and its answer.
fn step(method: Method, path: &str, status: u16, reply: Value) -> Exchange {
    Exchange::new(
        method,
        path,
        Reply::Json(StatusCode::from_u16(status).unwrap(), reply),
    )
}

trait NormalisedBody {
    /// The body must equal `expected` once every `lastTransitionTime` is replaced by
    /// [`TIME`] (after checking it is an RFC 3339 time).
    fn body(self, expected: Value) -> Self;
}

impl NormalisedBody for Exchange {
    fn body(self, expected: Value) -> Self {
        self.check(move |actual| {
            let mut actual = actual.clone();
            normalise_times(&mut actual);
            assert_eq!(actual, expected, "request body");
        })
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
fn get_claim(rv: &str, request: &str, capacity: &str, value: Option<&str>) -> Exchange {
    step(
        Method::GET,
        PVC_PATH,
        200,
        pvc(rv, request, capacity, value, json!([])),
    )
}

/// A write of the claim's status, answered with the claim at `rv`, with no conditions.
fn patch_claim(rv: &str, request: &str, capacity: &str, value: Option<&str>) -> Exchange {
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

fn version(minor: &str) -> Exchange {
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
fn event(kind: &'static str, reason: &'static str) -> Exchange {
    let reply = json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "data.1", "namespace": NS},
        "eventTime": "2025-01-01T00:00:00.000000Z", "reason": reason, "type": kind,
    });
    step(Method::POST, EVENTS_PATH, 201, reply).check(move |body| {
        assert_eq!(body["reason"], reason, "event {body}");
        assert_eq!(body["type"], kind, "event {body}");
        assert_eq!(body["regarding"]["kind"], "PersistentVolumeClaim");
        assert_eq!(body["regarding"]["name"], PVC);
        assert_eq!(body["reportingController"], "localvol.csi.dev");
        assert_eq!(body["reportingInstance"], "node-a");
    })
}

/// The same event again: kube's recorder patches the series.
fn event_again(reason: &'static str) -> Exchange {
    let reply = json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "data.1", "namespace": NS},
        "eventTime": "2025-01-01T00:00:00.000000Z", "reason": reason,
    });
    step(Method::PATCH, EVENTS_SERIES_PATH, 200, reply).check(move |body| {
        assert_eq!(body["reason"], reason, "event {body}");
        assert_eq!(body["series"]["count"], 2, "event {body}");
    })
}

fn claim() -> ClaimRef {
    ClaimRef {
        pvc_name: Some(PVC.to_string()),
        pvc_namespace: Some(NS.to_string()),
        pv_name: Some(PV.to_string()),
    }
}

fn reporter(client: Client, failure: FailureValue) -> Arc<NodeReporter> {
    match NodeReporting::new(ResizeApi::new(client), "node-a", failure) {
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
    (client, server): (Client, MockApi),
    failure: FailureValue,
    required: u64,
    result: Result<u64, E>,
) {
    let reporter = reporter(client, failure);
    let report = reporter.started(&claim(), required).await;
    reporter.finished(report, &result).await;
    drop(reporter);
    server.finish().await;
}

fn in_progress_patch(rv: &str) -> Value {
    json!({
        "metadata": {"resourceVersion": rv},
        "status": {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}},
    })
}

const GI2: u64 = 2 << 30;
