//! The mock API server's store of objects, answering as the API server would: get,
//! list and watch with equality selectors, JSON merge patch, and creates (answered with
//! what was sent, not kept). Every change takes the next resource version and is kept
//! for watches until the history is compacted.

use std::collections::BTreeMap;

use http::{Method, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};

use super::{Asked, Respond, json_response, status};

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

pub(super) struct Store {
    version: u64,
    /// By path, e.g. `/api/v1/namespaces/apps/pods/web-0`.
    objects: BTreeMap<String, Value>,
    history: Vec<Change>,
    /// Watches from a version below this get `410 Gone`.
    compacted: u64,
    /// Changes are kept from open watches (see [`Store::hold_changes`]).
    holding: bool,
    watches: Vec<Watch>,
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

impl Store {
    pub(super) fn new() -> Self {
        Store {
            version: 100,
            objects: BTreeMap::new(),
            history: Vec::new(),
            compacted: 0,
            holding: false,
            watches: Vec::new(),
        }
    }

    /// The latest resource version.
    pub(super) fn version(&self) -> u64 {
        self.version
    }

    /// Whether a client holds a watch open.
    pub(super) fn is_watched(&self) -> bool {
        !self.watches.is_empty()
    }

    fn bump(&mut self) -> u64 {
        self.version += 1;
        self.version
    }

    /// Creates or replaces the object at `path`; watches see ADDED or MODIFIED.
    pub(super) fn put(&mut self, path: String, mut value: Value) {
        let version = self.bump();
        value["metadata"]["resourceVersion"] = json!(version.to_string());
        let kind = match self.objects.insert(path.clone(), value.clone()) {
            Some(_) => "MODIFIED",
            None => "ADDED",
        };
        self.changed(version, kind, path, value);
    }

    /// Deletes the object at `path`, which must be there; watches see DELETED.
    pub(super) fn delete(&mut self, path: &str) {
        let version = self.bump();
        let mut value = self.objects.remove(path).expect("no such object");
        value["metadata"]["resourceVersion"] = json!(version.to_string());
        self.changed(version, "DELETED", path.to_string(), value);
    }

    /// Changes from now on reach no open watch, until [`Self::expire_watches`].
    pub(super) fn hold_changes(&mut self) {
        self.holding = true;
    }

    /// Forgets the history so far and ends the open watches with `410 Gone`.
    pub(super) fn expire_watches(&mut self) {
        self.holding = false;
        self.compacted = self.version;
        self.history.clear();
        for watch in std::mem::take(&mut self.watches) {
            watch.respond.send_response(gone());
        }
    }

    /// Closes the open watches: the caller answers each (the connection broke).
    pub(super) fn end_watches(&mut self) -> Vec<Respond> {
        std::mem::take(&mut self.watches)
            .into_iter()
            .map(|w| w.respond)
            .collect()
    }

    /// Answers a request from the store, or says why the store cannot serve it.
    pub(super) fn answer(
        &mut self,
        n: usize,
        asked: &Asked,
        respond: Respond,
    ) -> Result<(), (String, Respond)> {
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
            _ => return Err((format!("request {n}: the store does not serve {asked}"), respond)),
        };
        respond.send_response(reply);
        Ok(())
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

    fn watch(
        &mut self,
        n: usize,
        collection: &str,
        query: Query,
        respond: Respond,
    ) -> Result<(), (String, Respond)> {
        let Some(from) = query.resource_version else {
            let problem = format!("request {n}: a watch names the resource version it resumes from");
            return Err((problem, respond));
        };
        if from < self.compacted {
            respond.send_response(gone());
            return Ok(());
        }
        let watch = Watch {
            collection: collection.to_string(),
            query,
            from,
            respond,
        };
        self.answer_or_hold(watch);
        Ok(())
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
