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
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use kube::client::Body;
use kube::{Client, Resource};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower_test::mock::{self, Handle, SendResponse};

pub use exchange::{Asked, Exchange, Reply, get, not_found, ok, status};
use store::Store;

mod exchange;
mod store;

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

type Respond = SendResponse<Response<Body>>;

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
    store: Store,
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
            store: Store::new(),
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
        self.state().store.version()
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
                for respond in state.store.end_watches() {
                    respond.send_error(refused());
                }
            }
            Mode::Failing(code) => {
                for respond in state.store.end_watches() {
                    respond.send_response(failing(code));
                }
            }
        }
    }

    /// Changes from now on reach no open watch, until [`Self::expire_watches`].
    pub fn hold_watch_events(&self) {
        self.state().store.hold_changes();
    }

    /// Forgets the watch history so far (etcd compaction) and ends the open watches with
    /// `410 Gone`, as when the server's watch cache has fallen too far behind: a client
    /// must list again to see what it missed.
    pub fn expire_watches(&self) {
        self.state().store.expire_watches();
    }

    /// Creates or replaces an object at a new resource version; watches see ADDED or
    /// MODIFIED.
    pub fn put<K: Resource<DynamicType = ()> + Serialize>(&self, object: K) {
        let meta = object.meta();
        let path = object_path::<K>(meta.namespace.as_deref(), meta.name.as_deref().expect("a name"));
        let value = serde_json::to_value(&object).unwrap();
        self.state().store.put(path, value);
    }

    /// Deletes an object; watches see DELETED.
    pub fn delete<K: Resource<DynamicType = ()>>(&self, namespace: Option<&str>, name: &str) {
        self.state().store.delete(&object_path::<K>(namespace, name));
    }

    /// Waits until a client holds a watch open (it has listed and is watching).
    pub async fn until_watching(&self) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while !self.state().store.is_watched() {
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
    if let Err((problem, respond)) = state.store.answer(n, &asked, respond) {
        state.fail(problem, respond);
    }
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

impl State {
    fn fail(&mut self, problem: String, respond: Respond) {
        let body = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("mock API server: {problem}"), "reason": "InternalError", "code": 500,
        });
        self.failures.push(problem);
        respond.send_response(json_response(StatusCode::INTERNAL_SERVER_ERROR, &body));
    }
}
