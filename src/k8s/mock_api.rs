//! The mock Kubernetes API server of the unit tests, behind a real `kube::Client`. It
//! records every request (method, path and query, content type, JSON body), for tests
//! to assert exactly what was asked, and answers each by the first of:
//!
//! 1. its mode: up, down (connections fail), failing (every request gets one HTTP
//!    error) or silent (requests are taken and never answered until the mode changes);
//! 2. the next expected exchange, if the request is that one: its checks run on the
//!    content type and body, and its reply is sent, or, for a held exchange, kept
//!    until the test releases it. Expectations are met in the order they were given;
//! 3. its store of objects: get, list and watch, JSON merge patch, and creates (answered
//!    with what was sent, not kept). A scripted server has no store: every request
//!    must be the next expected one.
//!
//! Watches follow the API server's rules closely enough for kube's watcher: a watch
//! from a resource version gets every change after it that its selectors match, a
//! version older than the compacted history gets `410 Gone`, and a watch with nothing
//! to tell is held open. A held watch is answered once a change comes (its body then
//! ends, as when the server's watch timeout closes it, and the client watches again
//! from the last version it saw).
//!
//! [`MockApi::expect`] returns a handle on its exchange, [`Expected`]: the test waits
//! for the request with it (to act while a call is in flight, or to read what was
//! asked), and releases a held exchange's reply with it. A held reply never released
//! is never sent: the request hangs, as one to a server that stopped answering.
//!
//! Every request is recorded with the (tokio) time it came, for tests of retry delays.
//!
//! What goes wrong (a request other than the expected one, a failed check, one the
//! store does not serve) is answered with a 500 and kept: [`MockApi::finish`] fails on
//! it, and on expectations never met. Finishing waits for the client to be dropped;
//! where a test cannot drop it (a spawned reflector keeps it) or must know that nothing
//! more is asked while it is still in use, [`MockApi::assert_no_request_within`] waits
//! a while instead.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use kube::{Client, Resource};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower_test::mock::{self, Handle, SendResponse};

/// How the server answers.
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

/// An expected exchange's answer.
pub enum Reply {
    Json(StatusCode, Value),
    /// The connection fails (the API server is down).
    Unreachable,
}

pub fn ok<T: Serialize>(object: &T) -> Reply {
    Reply::Json(StatusCode::OK, serde_json::to_value(object).unwrap())
}

pub fn not_found() -> Reply {
    Reply::Json(StatusCode::NOT_FOUND, status(404, "NotFound"))
}

/// A Kubernetes `Status` body for an error answer.
pub fn status(code: u16, reason: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("scripted {reason}"),
        "reason": reason,
        "code": code,
    })
}

/// Assertions on a request body, parsed as JSON.
type BodyCheck = Box<dyn Fn(&Value) + Send>;

/// One expected request and its answer.
pub struct Exchange {
    method: Method,
    /// Path and query; a trailing `*` matches any rest.
    uri: String,
    content_type: Option<String>,
    check: Option<BodyCheck>,
    reply: Reply,
    /// The reply waits for [`Expected::release`].
    held: bool,
}

impl Exchange {
    pub fn new(method: Method, uri: impl Into<String>, reply: Reply) -> Self {
        Self {
            method,
            uri: uri.into(),
            content_type: None,
            check: None,
            reply,
            held: false,
        }
    }

    /// The request must carry this content type (a patch's says which kind it is).
    pub fn content_type(mut self, content_type: &str) -> Self {
        self.content_type = Some(content_type.to_string());
        self
    }

    /// Runs `check` on the request's body, parsed as JSON; its panics fail the exchange.
    pub fn check(mut self, check: impl Fn(&Value) + Send + 'static) -> Self {
        self.check = Some(Box::new(check));
        self
    }

    /// The reply is sent only when the test calls [`Expected::release`], so that it can
    /// act while the call is in flight; until then the request hangs.
    pub fn held(mut self) -> Self {
        self.held = true;
        self
    }

    fn is(&self, asked: &Asked) -> bool {
        asked.method == self.method
            && match self.uri.strip_suffix('*') {
                Some(prefix) => asked.uri.starts_with(prefix),
                None => asked.uri == self.uri,
            }
    }
}

impl fmt::Display for Exchange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.uri)
    }
}

pub fn get(uri: impl Into<String>, reply: Reply) -> Exchange {
    Exchange::new(Method::GET, uri, reply)
}

/// A request as the server received it.
#[derive(Debug, Clone)]
pub struct Asked {
    pub method: Method,
    /// Path and query.
    pub uri: String,
    pub content_type: Option<String>,
    /// `Null` when there is none or it is not JSON.
    pub body: Value,
    /// When it came.
    pub at: Instant,
}

/// `METHOD /path?query`.
impl fmt::Display for Asked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.uri)
    }
}

type Respond = SendResponse<Response<Body>>;

/// A change to a stored object, for watches.
struct Change {
    version: u64,
    kind: &'static str,
    path: String,
    object: Value,
}

/// A held watch: what it watches, from which version, and where to answer.
struct Watch {
    collection: String,
    query: Query,
    from: u64,
    respond: Respond,
}

struct State {
    mode: Mode,
    /// Requests no expectation covers fail instead of going to the store.
    scripted: bool,
    /// With the number of each, counted from 0 in the order given.
    expected: VecDeque<(usize, Exchange)>,
    /// How many expectations were given.
    given: usize,
    /// The request (its index in `asked`) that met each expectation, by number.
    met: BTreeMap<usize, usize>,
    /// The replies of held exchanges asked and not yet released, by number.
    held: BTreeMap<usize, (Respond, Reply)>,
    /// Held exchanges released before they were asked: answered at once.
    released: BTreeSet<usize>,
    asked: Vec<Asked>,
    /// How many of `asked` [`MockApi::take_requests`] has returned.
    taken: usize,
    failures: Vec<String>,
    version: u64,
    /// By path, e.g. `/api/v1/namespaces/apps/pods/web-0`.
    objects: BTreeMap<String, Value>,
    history: Vec<Change>,
    /// Watches from a version below this get `410 Gone`.
    compacted: u64,
    /// Changes are kept from open watches (see [`MockApi::hold_watch_events`]).
    holding: bool,
    watches: Vec<Watch>,
    /// Requests taken while silent.
    silenced: Vec<Respond>,
    /// The client is gone: nothing more will be asked.
    ended: bool,
    /// Wakes [`Expected::asked`] after each request and when the client is gone.
    news: Arc<Notify>,
    task: Option<JoinHandle<()>>,
}

/// The test's side of the server: set its objects, mode and expectations, read what was
/// asked.
#[derive(Clone)]
pub struct MockApi(Arc<Mutex<State>>);

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Poisoned by a panic under the lock (a test deleting an object that is not there):
    // what it guards is still whole, and later reads must still see the requests.
    state.lock().unwrap_or_else(|p| p.into_inner())
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
        "connection refused (mock API server down)",
    )
}

fn failing(code: u16) -> Response<Body> {
    let code = StatusCode::from_u16(code).unwrap();
    let reason = code.canonical_reason().unwrap_or("Failing");
    json_response(code, &status(code.as_u16(), reason))
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

fn gone() -> Response<Body> {
    watch_body(&[json!({"type": "ERROR", "object": status(410, "Expired")})])
}

impl MockApi {
    /// A client wired to a new server, up and empty, answering from its store.
    pub fn start() -> (Client, MockApi) {
        Self::new(false)
    }

    /// A client wired to a new server that expects `script`, in order, and nothing else.
    pub fn scripted(script: Vec<Exchange>) -> (Client, MockApi) {
        let (client, api) = Self::new(true);
        for exchange in script {
            api.expect(exchange);
        }
        (client, api)
    }

    fn new(scripted: bool) -> (Client, MockApi) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let api = MockApi(Arc::new(Mutex::new(State {
            mode: Mode::Up,
            scripted,
            expected: VecDeque::new(),
            given: 0,
            met: BTreeMap::new(),
            held: BTreeMap::new(),
            released: BTreeSet::new(),
            asked: Vec::new(),
            taken: 0,
            failures: Vec::new(),
            version: 100,
            objects: BTreeMap::new(),
            history: Vec::new(),
            compacted: 0,
            holding: false,
            watches: Vec::new(),
            silenced: Vec::new(),
            ended: false,
            news: Arc::new(Notify::new()),
            task: None,
        })));
        let task = tokio::spawn(serve(Arc::clone(&api.0), handle));
        api.state().task = Some(task);
        (Client::new(service, "default"), api)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.0)
    }

    /// Expects `exchange` after the ones expected before it. The handle may be dropped,
    /// but for a held exchange whose reply the test means to release.
    pub fn expect(&self, exchange: Exchange) -> Expected {
        let mut state = self.state();
        let number = state.given;
        state.given += 1;
        let expected = Expected {
            api: self.clone(),
            number,
            held: exchange.held,
            exchange: exchange.to_string(),
        };
        state.expected.push_back((number, exchange));
        expected
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Asked> {
        self.state().asked.clone()
    }

    /// Every request since the last call, in order.
    pub fn take_requests(&self) -> Vec<Asked> {
        let mut state = self.state();
        let new = state.asked[state.taken..].to_vec();
        state.taken = state.asked.len();
        new
    }

    /// Waits until every clone of the client is gone, then fails on anything that went
    /// wrong and on expected requests never asked.
    pub async fn finish(self) {
        let task = self.state().task.take().expect("finished once");
        let ended = tokio::time::timeout(Duration::from_secs(10), task).await;
        let state = self.state();
        let mut problems = state.failures.clone();
        problems.extend(state.expected.iter().map(|(_, e)| format!("never asked: {e}")));
        if ended.is_err() {
            problems.push("the client is still in use 10s on".to_string());
        }
        assert!(problems.is_empty(), "mock API server: {problems:#?}");
    }

    /// Waits `wait`, then fails if anything was asked meanwhile, or went wrong before.
    pub async fn assert_no_request_within(&self, wait: Duration) {
        let before = self.state().asked.len();
        tokio::time::sleep(wait).await;
        let state = self.state();
        let mut problems = state.failures.clone();
        problems.extend(
            state.asked[before..]
                .iter()
                .map(|a| format!("asked within {wait:?}: {a}")),
        );
        assert!(problems.is_empty(), "mock API server: {problems:#?}");
    }

    /// The latest resource version: where a watch that has seen everything resumes.
    pub fn version(&self) -> u64 {
        self.state().version
    }

    pub fn set_mode(&self, mode: Mode) {
        let mut state = self.state();
        state.mode = mode;
        // Whatever was silenced is cut off, as a dropped connection would be. Held
        // exchanges' replies are the test's to release, and stay held.
        for respond in std::mem::take(&mut state.silenced) {
            respond.send_error(refused());
        }
        match mode {
            Mode::Up | Mode::Silent => {}
            Mode::Down => {
                for watch in std::mem::take(&mut state.watches) {
                    watch.respond.send_error(refused());
                }
            }
            Mode::Failing(code) => {
                for watch in std::mem::take(&mut state.watches) {
                    watch.respond.send_response(failing(code));
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
        for watch in std::mem::take(&mut state.watches) {
            watch.respond.send_response(gone());
        }
    }

    /// Creates or replaces an object at a new resource version; watches see ADDED or
    /// MODIFIED.
    pub fn put<K: Resource<DynamicType = ()> + Serialize>(&self, object: K) {
        let meta = object.meta();
        let path = object_path::<K>(meta.namespace.as_deref(), meta.name.as_deref().expect("a name"));
        let mut value = serde_json::to_value(&object).unwrap();
        let mut state = self.state();
        let version = state.bump();
        value["metadata"]["resourceVersion"] = json!(version.to_string());
        let kind = match state.objects.insert(path.clone(), value.clone()) {
            Some(_) => "MODIFIED",
            None => "ADDED",
        };
        state.changed(version, kind, path, value);
    }

    /// Deletes an object; watches see DELETED.
    pub fn delete<K: Resource<DynamicType = ()>>(&self, namespace: Option<&str>, name: &str) {
        let path = object_path::<K>(namespace, name);
        let mut state = self.state();
        let version = state.bump();
        let mut value = state.objects.remove(&path).expect("no such object");
        value["metadata"]["resourceVersion"] = json!(version.to_string());
        state.changed(version, "DELETED", path, value);
    }

    /// Waits until a client holds a watch open (it has listed and is watching).
    pub async fn until_watching(&self) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while self.state().watches.is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("no watch was opened");
    }
}

/// The test's handle on one expected exchange.
pub struct Expected {
    api: MockApi,
    /// Its number in the order of expectations.
    number: usize,
    held: bool,
    /// `METHOD /uri`, for messages.
    exchange: String,
}

impl Expected {
    /// Waits until the exchange has been asked, and returns the request. Fails instead if
    /// something went wrong first (a request out of order, say) or the client is gone.
    pub async fn asked(&self) -> Asked {
        let news = Arc::clone(&self.api.state().news);
        loop {
            // Registered before looking, so that news in between is not missed.
            let notified = news.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = self.api.state();
                if let Some(&n) = state.met.get(&self.number) {
                    return state.asked[n].clone();
                }
                let failures = &state.failures;
                assert!(
                    failures.is_empty(),
                    "mock API server, waiting for {}: {failures:#?}",
                    self.exchange
                );
                assert!(!state.ended, "{} never asked: the client is gone", self.exchange);
            }
            notified.await;
        }
    }

    /// Sends a held exchange's reply: now if it has been asked, else as soon as it is.
    pub fn release(self) {
        assert!(self.held, "{} is not held", self.exchange);
        let mut state = self.api.state();
        match state.held.remove(&self.number) {
            Some((respond, reply)) => {
                drop(state);
                send(reply, respond);
            }
            None => {
                state.released.insert(self.number);
            }
        }
    }
}

fn object_path<K: Resource<DynamicType = ()>>(namespace: Option<&str>, name: &str) -> String {
    format!("{}/{name}", K::url_path(&(), namespace))
}

async fn serve(state: Arc<Mutex<State>>, mut handle: Handle<Request<Body>, Response<Body>>) {
    while let Some((request, respond)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let body = body.collect_bytes().await.unwrap_or_default();
        let asked = Asked {
            method: parts.method,
            uri: parts.uri.to_string(),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .map(|v| v.to_str().unwrap().to_string()),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            at: Instant::now(),
        };
        answer(&state, asked, respond);
        let news = Arc::clone(&lock(&state).news);
        news.notify_waiters();
    }
    let news = {
        let mut state = lock(&state);
        state.ended = true;
        Arc::clone(&state.news)
    };
    news.notify_waiters();
}

fn answer(shared: &Mutex<State>, asked: Asked, respond: Respond) {
    let mut state = lock(shared);
    let n = state.asked.len();
    state.asked.push(asked.clone());
    match state.mode {
        Mode::Up => {}
        Mode::Down => return respond.send_error(refused()),
        Mode::Failing(code) => return respond.send_response(failing(code)),
        Mode::Silent => return state.silenced.push(respond),
    }
    if state.expected.front().is_some_and(|(_, e)| e.is(&asked)) {
        let (number, exchange) = state.expected.pop_front().unwrap();
        // The check may panic: not under the lock.
        drop(state);
        return answer_expected(shared, n, number, exchange, &asked, respond);
    }
    if state.scripted {
        let problem = match state.expected.front().map(|(_, e)| e) {
            Some(expected) => format!("request {n}: expected {expected}, got {asked}"),
            None => format!("request {n} past the script: {asked}"),
        };
        return state.fail(problem, respond);
    }
    state.answer_from_store(n, &asked, respond);
}

fn answer_expected(
    shared: &Mutex<State>,
    n: usize,
    number: usize,
    exchange: Exchange,
    asked: &Asked,
    respond: Respond,
) {
    if let Some(wanted) = &exchange.content_type
        && asked.content_type.as_ref() != Some(wanted)
    {
        let problem = format!(
            "request {n} ({asked}): content type {:?}, not {wanted}",
            asked.content_type
        );
        return lock(shared).fail(problem, respond);
    }
    if let Some(check) = &exchange.check {
        let problem = if asked.body.is_null() {
            Some("no JSON body".to_string())
        } else {
            catch_unwind(AssertUnwindSafe(|| check(&asked.body)))
                .err()
                .map(|panic| {
                    panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                })
        };
        if let Some(problem) = problem {
            return lock(shared).fail(format!("request {n} ({asked}): body: {problem}"), respond);
        }
    }
    let mut state = lock(shared);
    state.met.insert(number, n);
    if exchange.held && !state.released.remove(&number) {
        state.held.insert(number, (respond, exchange.reply));
        return;
    }
    drop(state);
    send(exchange.reply, respond);
}

fn send(reply: Reply, respond: Respond) {
    match reply {
        Reply::Json(code, value) => respond.send_response(json_response(code, &value)),
        Reply::Unreachable => respond.send_error(refused()),
    }
}

/// What a path names: a collection (to list, watch or create in) or one object.
enum Target {
    Collection,
    Object,
}

fn target(path: &str) -> Option<Target> {
    let rest = match path.strip_prefix("/api/v1/") {
        Some(rest) => rest,
        // `/apis/<group>/<version>/`
        None => path.strip_prefix("/apis/")?.splitn(3, '/').nth(2)?,
    };
    match rest.split('/').collect::<Vec<_>>().as_slice() {
        ["namespaces", _, _] | [_] => Some(Target::Collection),
        ["namespaces", _, _, _] | [_, _] => Some(Target::Object),
        _ => None,
    }
}

/// Whether the object at `path` is in `collection`: its own, or the all-namespaces
/// collection of its resource (`/api/v1/pods` holds `/api/v1/namespaces/*/pods/*`).
fn in_collection(path: &str, collection: &str) -> bool {
    let Some((parent, _)) = path.rsplit_once('/') else {
        return false;
    };
    if parent == collection {
        return true;
    }
    let Some((prefix, resource)) = collection.rsplit_once('/') else {
        return false;
    };
    parent
        .strip_prefix(prefix)
        .and_then(|p| p.strip_prefix("/namespaces/"))
        .and_then(|p| p.split_once('/'))
        .is_some_and(|(_, r)| r == resource)
}

/// The parts of a list or watch query the store heeds.
struct Query {
    watch: bool,
    resource_version: Option<u64>,
    /// `labelSelector` and `fieldSelector` terms; only equality is understood.
    labels: Vec<(String, String)>,
    fields: Vec<(String, String)>,
}

/// Undoes the query's percent-encoding (`%3D` for `=`, `+` for a space).
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok());
        match (escaped, bytes[i]) {
            (Some(byte), _) => {
                out.push(byte);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, byte) => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn terms(selector: &str) -> Vec<(String, String)> {
    selector
        .split(',')
        .filter_map(|term| term.split_once('='))
        .map(|(key, value)| (key.to_string(), value.trim_start_matches('=').to_string()))
        .collect()
}

impl Query {
    fn parse(query: &str) -> Self {
        let mut parsed = Query {
            watch: false,
            resource_version: None,
            labels: Vec::new(),
            fields: Vec::new(),
        };
        for (key, value) in query.split('&').filter_map(|p| p.split_once('=')) {
            let value = decode(value);
            match key {
                "watch" => parsed.watch = value == "true",
                "resourceVersion" => parsed.resource_version = value.parse().ok(),
                "labelSelector" => parsed.labels = terms(&value),
                "fieldSelector" => parsed.fields = terms(&value),
                _ => {}
            }
        }
        parsed
    }

    fn selects(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.labels
            .iter()
            .all(|(key, value)| labels[key].as_str() == Some(value))
            && self.fields.iter().all(|(field, value)| {
                let found = field.split('.').fold(object, |o, part| &o[part]);
                found.as_str() == Some(value)
            })
    }
}

/// RFC 7386: objects are merged key by key, `null` removes, anything else replaces.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let fields = target.as_object_mut().unwrap();
    for (key, value) in patch {
        if value.is_null() {
            fields.remove(key);
        } else {
            merge(fields.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

impl State {
    fn bump(&mut self) -> u64 {
        self.version += 1;
        self.version
    }

    fn fail(&mut self, problem: String, respond: Respond) {
        let body = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("mock API server: {problem}"), "reason": "InternalError", "code": 500,
        });
        self.failures.push(problem);
        respond.send_response(json_response(StatusCode::INTERNAL_SERVER_ERROR, &body));
    }

    fn answer_from_store(&mut self, n: usize, asked: &Asked, respond: Respond) {
        let (path, query) = asked.uri.split_once('?').unwrap_or((&asked.uri, ""));
        let query = Query::parse(query);
        let found = |object: Option<&Value>| match object {
            Some(object) => json_response(StatusCode::OK, object),
            None => json_response(StatusCode::NOT_FOUND, &status(404, "NotFound")),
        };
        let merge_patch = asked.content_type.as_deref() == Some("application/merge-patch+json");
        let reply = match (&asked.method, target(path)) {
            (&Method::GET, Some(Target::Collection)) if query.watch => {
                return self.watch(n, path, query, respond);
            }
            (&Method::GET, Some(Target::Collection)) => self.list(path, &query),
            (&Method::GET, Some(Target::Object)) => found(self.objects.get(path)),
            (&Method::PATCH, Some(Target::Object)) if merge_patch => {
                let patched = self.merge_patch(path, &asked.body);
                found(patched.as_ref())
            }
            (&Method::POST, Some(Target::Collection)) => json_response(StatusCode::CREATED, &asked.body),
            _ => return self.fail(format!("request {n}: the store does not serve {asked}"), respond),
        };
        respond.send_response(reply);
    }

    fn list(&self, collection: &str, query: &Query) -> Response<Body> {
        let items: Vec<&Value> = self
            .objects
            .iter()
            .filter(|(path, object)| in_collection(path, collection) && query.selects(object))
            .map(|(_, object)| object)
            .collect();
        json_response(
            StatusCode::OK,
            &json!({
                "kind": "List",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": self.version.to_string()},
                "items": items,
            }),
        )
    }

    /// The patched object, if there is one; a change only if the patch changed it.
    fn merge_patch(&mut self, path: &str, patch: &Value) -> Option<Value> {
        let mut object = self.objects.get(path)?.clone();
        merge(&mut object, patch);
        if self.objects.get(path) != Some(&object) {
            let version = self.bump();
            object["metadata"]["resourceVersion"] = json!(version.to_string());
            self.objects.insert(path.to_string(), object.clone());
            self.changed(version, "MODIFIED", path.to_string(), object.clone());
        }
        Some(object)
    }

    fn watch(&mut self, n: usize, collection: &str, query: Query, respond: Respond) {
        let Some(from) = query.resource_version else {
            return self.fail(
                format!("request {n}: a watch names the resource version it resumes from"),
                respond,
            );
        };
        if from < self.compacted {
            return respond.send_response(gone());
        }
        let watch = Watch {
            collection: collection.to_string(),
            query,
            from,
            respond,
        };
        self.answer_or_hold(watch);
    }

    fn answer_or_hold(&mut self, watch: Watch) {
        let events: Vec<Value> = self
            .history
            .iter()
            .filter(|c| c.version > watch.from)
            .filter(|c| in_collection(&c.path, &watch.collection) && watch.query.selects(&c.object))
            .map(|c| json!({"type": c.kind, "object": c.object}))
            .collect();
        if events.is_empty() {
            self.watches.push(watch);
        } else {
            watch.respond.send_response(watch_body(&events));
        }
    }

    /// Records a change and answers the held watches it concerns.
    fn changed(&mut self, version: u64, kind: &'static str, path: String, object: Value) {
        self.history.push(Change {
            version,
            kind,
            path,
            object,
        });
        if self.holding {
            return;
        }
        for watch in std::mem::take(&mut self.watches) {
            self.answer_or_hold(watch);
        }
    }
}
