//! The script of the mock API server: what a test expects to be asked ([`Exchange`],
//! built with [`get`] or [`Exchange::new`] and checks on its request), what the server
//! answers it ([`Reply`], [`ok`], [`not_found`], [`status`]), and a request as the server
//! received it ([`Asked`]). The server that plays the script is the parent module.

use std::fmt;

use http::{Method, StatusCode};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;

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
pub(super) type BodyCheck = Box<dyn Fn(&Value) + Send>;

/// One expected request and its answer.
pub struct Exchange {
    pub(super) method: Method,
    /// Path and query; a trailing `*` matches any rest.
    pub(super) uri: String,
    pub(super) content_type: Option<String>,
    pub(super) check: Option<BodyCheck>,
    pub(super) reply: Reply,
    /// The reply waits for [`Expected::release`].
    pub(super) held: bool,
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

    pub(super) fn is(&self, asked: &Asked) -> bool {
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
