//! One Kubernetes API call as localvol makes it: under a deadline, with one error type
//! for every way it can fail, and writes under localvol's field manager. Every module
//! that talks to the API server calls through here, so that the timeout, the field
//! manager and the reading of failures are decided once.

use std::future::Future;
use std::time::Duration;

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::model::Terminal;

/// How long one API call may take before it counts as failed (for the owner check:
/// UNAVAILABLE, which kubelet retries).
pub const API_TIMEOUT: Duration = Duration::from_secs(10);
/// Field manager of every write localvol makes to claims and volumes.
pub const FIELD_MANAGER: &str = "localvol";
/// The longest text localvol writes into an event note or a condition message (the
/// API limits a note to 1 kB).
pub const MAX_MESSAGE: usize = 1024;

/// An API call that failed. The three answers callers act on (gone, someone wrote
/// first, no answer in time) have their own variants; whatever else the server or the
/// connection said is `Failed`. All keep the server's answer as their source.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("Kubernetes API: {what}: {source}")]
    NotFound {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("Kubernetes API: {what}: {source}")]
    Conflict {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("Kubernetes API: {what}: {source}")]
    Failed {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("Kubernetes API: {what}: no answer within {timeout:?}")]
    Timeout { what: String, timeout: Duration },
}

impl ApiError {
    fn answered(what: String, source: kube::Error) -> Self {
        match &source {
            kube::Error::Api(status) if status.code == 404 => ApiError::NotFound { what, source },
            kube::Error::Api(status) if status.code == 409 => ApiError::Conflict { what, source },
            _ => ApiError::Failed { what, source },
        }
    }
}

/// Whether an API error is an answer that will not change until an administrator or
/// the user acts (gone, forbidden by RBAC, refused by validation), as opposed to a
/// server that could not be reached or could not answer for now, or a writer that came
/// first (asking again may work). The one decision for every API call localvol makes.
fn api_is_terminal(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => match status.code {
            // Conflict (someone wrote first), rate limits and server trouble pass.
            409 | 429 => false,
            code => code < 500,
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => false,
        _ => true,
    }
}

impl Terminal for ApiError {
    fn is_terminal(&self) -> bool {
        match self {
            ApiError::NotFound { .. } => true,
            // Someone else wrote first, or no answer: asking again may work.
            ApiError::Conflict { .. } | ApiError::Timeout { .. } => false,
            ApiError::Failed { source, .. } => api_is_terminal(source),
        }
    }
}

/// Runs one API call under `timeout`; `what` names it in the error.
pub async fn call_within<T>(
    timeout: Duration,
    what: impl FnOnce() -> String,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(ApiError::answered(what(), source)),
        Err(_) => Err(ApiError::Timeout {
            what: what(),
            timeout,
        }),
    }
}

/// Runs one API call under [`API_TIMEOUT`].
pub async fn call<T>(
    what: impl FnOnce() -> String,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, ApiError> {
    call_within(API_TIMEOUT, what, request).await
}

/// A JSON merge patch of `name`, as localvol's labels and annotations are written (no
/// field manager: the keys are localvol's own). A `metadata.resourceVersion` in the
/// patch makes it apply only to the object as seen.
pub async fn merge_patch<K>(
    api: &Api<K>,
    what: impl FnOnce() -> String,
    name: &str,
    patch: &serde_json::Value,
) -> Result<K, ApiError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    call(
        what,
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch)),
    )
    .await
}

/// A strategic merge patch of the `status` subresource of `name` under
/// [`FIELD_MANAGER`], as kubelet and external-resizer write a claim's status.
pub async fn patch_status<K>(
    api: &Api<K>,
    what: impl FnOnce() -> String,
    name: &str,
    patch: serde_json::Value,
) -> Result<K, ApiError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    call(what, api.patch_status(name, &params, &Patch::Strategic(patch))).await
}

/// Replaces `name` with `object` under [`FIELD_MANAGER`]; the object's
/// `metadata.resourceVersion` makes it land only on the version it was read as.
pub async fn replace<K>(
    api: &Api<K>,
    what: impl FnOnce() -> String,
    name: &str,
    object: &K,
) -> Result<K, ApiError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    };
    call(what, api.replace(name, &params, object)).await
}

/// `s` cut to at most [`MAX_MESSAGE`] bytes, on a character boundary.
pub fn truncate(s: &str) -> String {
    if s.len() <= MAX_MESSAGE {
        return s.to_string();
    }
    let mut end = MAX_MESSAGE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_stays_on_a_character_boundary() {
        let short = "short";
        assert_eq!(truncate(short), short);
        let long = "é".repeat(MAX_MESSAGE);
        let cut = truncate(&long);
        assert!(
            cut.len() <= MAX_MESSAGE && cut.len() >= MAX_MESSAGE - 1,
            "{}",
            cut.len()
        );
        assert!(long.starts_with(&cut));
    }

    #[tokio::test]
    async fn answers_become_their_variants() {
        let status = |code| kube::Error::Api(Box::new(kube::core::Status::failure("x", "y").with_code(code)));
        let what = || "get thing".to_string();
        let gone = call(what, async { Err::<(), _>(status(404)) }).await;
        assert!(matches!(gone, Err(ApiError::NotFound { .. })), "{gone:?}");
        let conflict = call(what, async { Err::<(), _>(status(409)) }).await;
        assert!(matches!(conflict, Err(ref e @ ApiError::Conflict { .. }) if !e.is_terminal()));
        let forbidden = call(what, async { Err::<(), _>(status(403)) }).await;
        assert!(matches!(forbidden, Err(ref e @ ApiError::Failed { .. }) if e.is_terminal()));
        let slow = call_within(
            Duration::from_millis(1),
            what,
            std::future::pending::<Result<(), _>>(),
        )
        .await;
        let Err(e @ ApiError::Timeout { .. }) = slow else {
            panic!("{slow:?}")
        };
        assert!(!e.is_terminal());
        assert_eq!(e.to_string(), "Kubernetes API: get thing: no answer within 1ms");
    }
}
