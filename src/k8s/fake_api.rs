//! A stateful fake API server for tests that run the real pod reflector: it holds pods,
//! claims and volumes, serves list, watch and get from them, records every request
//! (method, path and query) so that tests can assert exactly what each call asked, and
//! can go down, fail, or hang, and come back.
//!
//! Watches follow the API server's rules closely enough for the reflector: a watch from
//! a resource version gets every change after it, a version older than the compacted
//! history gets `410 Gone`, and a watch with nothing to tell is held open. A held watch
//! is answered once a change comes (its body then ends, as when the server's watch
//! timeout closes it, and the client watches again from the last version it saw).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{self, SendResponse};

use super::fixtures::{NODE, status};

/// How the fake answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Up,
    /// Connections fail (the server is down or unreachable); open watches break.
    Down,
    /// Every request is answered with this HTTP error code (e.g. 503 while etcd is away).
    Failing(u16),
    /// Requests are taken and never answered, until the mode changes.
    Silent,
}

type Respond = SendResponse<Response<Body>>;

struct State {
    mode: Mode,
    version: u64,
    /// Changes to pods on [`NODE`], for watches: (resource version, type, pod).
    history: Vec<(u64, &'static str, Pod)>,
    /// Watches from a version below this get `410 Gone`.
    compacted: u64,
    /// Changes are kept from open watches (see [`FakeApi::hold_watch_events`]).
    holding: bool,
    pods: BTreeMap<String, Pod>,
    pvcs: BTreeMap<String, PersistentVolumeClaim>,
    pvs: BTreeMap<String, PersistentVolume>,
    /// Held watches: the version each watches from, and where to answer.
    watches: Vec<(u64, Respond)>,
    /// Requests taken while silent.
    held: Vec<Respond>,
    requests: Vec<String>,
}

/// The test's side of the fake: change its state and mode, read what was asked.
#[derive(Clone)]
pub struct FakeApi(Arc<Mutex<State>>);

fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

fn json_response(code: StatusCode, value: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(value).unwrap()))
        .unwrap()
}

fn refused() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "connection refused (fake API server down)",
    )
}

impl FakeApi {
    /// A client wired to a new fake, up and empty.
    pub fn start() -> (Client, FakeApi) {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let api = FakeApi(Arc::new(Mutex::new(State {
            mode: Mode::Up,
            version: 100,
            history: Vec::new(),
            compacted: 0,
            holding: false,
            pods: BTreeMap::new(),
            pvcs: BTreeMap::new(),
            pvs: BTreeMap::new(),
            watches: Vec::new(),
            held: Vec::new(),
            requests: Vec::new(),
        })));
        let server = api.clone();
        tokio::spawn(async move {
            while let Some((request, respond)) = handle.next_request().await {
                let (parts, body) = request.into_parts();
                let body = body.collect_bytes().await.unwrap_or_default();
                server.serve(&parts.method, &parts.uri.to_string(), &body, respond);
            }
        });
        (Client::new(service, "default"), api)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn serve(&self, method: &Method, uri: &str, body: &[u8], respond: Respond) {
        let mut state = self.state();
        state.requests.push(format!("{method} {uri}"));
        match state.mode {
            Mode::Up => {}
            Mode::Down => return respond.send_error(refused()),
            Mode::Failing(code) => {
                let code = StatusCode::from_u16(code).unwrap();
                let reason = code.canonical_reason().unwrap_or("Failing");
                return respond.send_response(json_response(code, &status(code.as_u16(), reason)));
            }
            Mode::Silent => return state.held.push(respond),
        }
        let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let found = |value: Option<Value>| match value {
            Some(v) => json_response(StatusCode::OK, &v),
            None => json_response(StatusCode::NOT_FOUND, &status(404, "NotFound")),
        };
        let reply = match (method, segments.as_slice()) {
            (&Method::GET, ["api", "v1", "pods"]) => {
                assert!(
                    query.contains(&format!("fieldSelector=spec.nodeName%3D{NODE}")),
                    "the pod list or watch is not scoped to this node: {uri}"
                );
                if query.split('&').any(|p| p == "watch=true") {
                    return state.watch(query, respond);
                }
                state.list()
            }
            (&Method::GET, ["api", "v1", "namespaces", ns, "pods", name]) => found(
                state
                    .pods
                    .get(&key(ns, name))
                    .map(|p| serde_json::to_value(p).unwrap()),
            ),
            (&Method::GET, ["api", "v1", "namespaces", ns, "persistentvolumeclaims", name]) => found(
                state
                    .pvcs
                    .get(&key(ns, name))
                    .map(|p| serde_json::to_value(p).unwrap()),
            ),
            // The node label's merge patch: its labels merged into the claim's.
            (&Method::PATCH, ["api", "v1", "namespaces", ns, "persistentvolumeclaims", name]) => {
                let patch: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                let patched = state.pvcs.get_mut(&key(ns, name)).map(|claim| {
                    let labels = claim.metadata.labels.get_or_insert_with(Default::default);
                    if let Some(Value::Object(added)) = patch.pointer("/metadata/labels") {
                        for (k, v) in added {
                            labels.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
                        }
                    }
                    serde_json::to_value(&*claim).unwrap()
                });
                found(patched)
            }
            (&Method::GET, ["api", "v1", "persistentvolumes", name]) => {
                found(state.pvs.get(*name).map(|p| serde_json::to_value(p).unwrap()))
            }
            (&Method::POST, ["apis", "events.k8s.io", "v1", "namespaces", _, "events"]) => {
                let event: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                json_response(StatusCode::CREATED, &event)
            }
            _ => json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &status(500, "the fake API server does not serve this"),
            ),
        };
        respond.send_response(reply);
    }

    /// Every request since the last call, as `METHOD /path?query`, in order.
    pub fn take_requests(&self) -> Vec<String> {
        std::mem::take(&mut self.state().requests)
    }

    /// The latest resource version: where a watch that has seen everything resumes.
    pub fn version(&self) -> u64 {
        self.state().version
    }

    pub fn set_mode(&self, mode: Mode) {
        let mut state = self.state();
        state.mode = mode;
        // Whatever was held is cut off, as a dropped connection would be.
        for respond in std::mem::take(&mut state.held) {
            respond.send_error(refused());
        }
        match mode {
            Mode::Up | Mode::Silent => {}
            Mode::Down => {
                for (_, respond) in std::mem::take(&mut state.watches) {
                    respond.send_error(refused());
                }
            }
            Mode::Failing(code) => {
                let code = StatusCode::from_u16(code).unwrap();
                for (_, respond) in std::mem::take(&mut state.watches) {
                    respond.send_response(json_response(code, &status(code.as_u16(), "Failing")));
                }
            }
        }
    }

    /// Changes from now on reach no open watch, until [`Self::expire_watches`].
    pub fn hold_watch_events(&self) {
        self.state().holding = true;
    }

    /// Forgets the watch history so far (etcd compaction) and ends the open watches with
    /// `410 Gone`, as when the server's watch cache has fallen too far behind: a client
    /// must list again to see what it missed.
    pub fn expire_watches(&self) {
        let mut state = self.state();
        state.holding = false;
        state.compacted = state.version;
        state.history.clear();
        for (_, respond) in std::mem::take(&mut state.watches) {
            let gone = json!({"type": "ERROR", "object": status(410, "Expired")});
            respond.send_response(State::watch_body(&[gone]));
        }
    }

    /// Creates or replaces a pod; watches see ADDED or MODIFIED.
    pub fn put_pod(&self, mut pod: Pod) {
        let mut state = self.state();
        let version = state.bump();
        pod.metadata.resource_version = Some(version.to_string());
        let meta = &pod.metadata;
        let key = key(meta.namespace.as_deref().unwrap(), meta.name.as_deref().unwrap());
        let kind = if state.pods.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        state.pods.insert(key, pod.clone());
        state.changed(version, kind, pod);
    }

    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let mut state = self.state();
        let version = state.bump();
        let mut pod = state.pods.remove(&key(namespace, name)).expect("no such pod");
        pod.metadata.resource_version = Some(version.to_string());
        state.changed(version, "DELETED", pod);
    }

    pub fn put_pvc(&self, mut pvc: PersistentVolumeClaim) {
        let mut state = self.state();
        pvc.metadata.resource_version = Some(state.bump().to_string());
        let meta = &pvc.metadata;
        let key = key(meta.namespace.as_deref().unwrap(), meta.name.as_deref().unwrap());
        state.pvcs.insert(key, pvc);
    }

    pub fn put_pv(&self, mut pv: PersistentVolume) {
        let mut state = self.state();
        pv.metadata.resource_version = Some(state.bump().to_string());
        state.pvs.insert(pv.metadata.name.clone().unwrap(), pv);
    }

    /// Waits until the reflector holds a watch open (it has listed and is watching).
    pub async fn until_watching(&self) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while self.state().watches.is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the reflector never opened a watch");
    }
}

impl State {
    fn bump(&mut self) -> u64 {
        self.version += 1;
        self.version
    }

    fn on_node(pod: &Pod) -> bool {
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE)
    }

    fn list(&self) -> Response<Body> {
        let items: Vec<Value> = self
            .pods
            .values()
            .filter(|p| Self::on_node(p))
            .map(|p| serde_json::to_value(p).unwrap())
            .collect();
        json_response(
            StatusCode::OK,
            &json!({
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": self.version.to_string()},
                "items": items,
            }),
        )
    }

    fn watch(&mut self, query: &str, respond: Respond) {
        let from = query
            .split('&')
            .find_map(|p| p.strip_prefix("resourceVersion="))
            .and_then(|v| v.parse::<u64>().ok())
            .expect("a watch names the resource version it resumes from");
        if from < self.compacted {
            let gone = json!({"type": "ERROR", "object": status(410, "Expired")});
            return respond.send_response(Self::watch_body(&[gone]));
        }
        let events = self.events_after(from);
        if events.is_empty() {
            self.watches.push((from, respond));
        } else {
            respond.send_response(Self::watch_body(&events));
        }
    }

    fn events_after(&self, from: u64) -> Vec<Value> {
        self.history
            .iter()
            .filter(|(version, _, _)| *version > from)
            .map(|(_, kind, pod)| json!({"type": kind, "object": pod}))
            .collect()
    }

    fn watch_body(events: &[Value]) -> Response<Body> {
        let mut body = Vec::new();
        for event in events {
            serde_json::to_writer(&mut body, event).unwrap();
            body.push(b'\n');
        }
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap()
    }

    /// Records a pod change and answers the held watches it concerns.
    fn changed(&mut self, version: u64, kind: &'static str, pod: Pod) {
        if !Self::on_node(&pod) {
            return;
        }
        self.history.push((version, kind, pod));
        if self.holding {
            return;
        }
        for (from, respond) in std::mem::take(&mut self.watches) {
            respond.send_response(Self::watch_body(&self.events_after(from)));
        }
    }
}
