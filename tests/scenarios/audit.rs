//! The API server's audit log as tests/cluster/run.sh has it written (audit.k8s.io/v1
//! events at Metadata level, one JSON object a line): the daemon's own requests, typed
//! to the fields scenario 8 reads.

use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

use crate::run::Result;

const DAEMON_USER: &str = "system:serviceaccount:localvol-system:localvol-node";
/// The provisioner sidecar shares the daemon's service account; its user agent tells
/// its requests apart.
const PROVISIONER_AGENT: &str = "csi-provisioner";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Line {
    stage: String,
    verb: String,
    #[serde(rename = "requestURI")]
    request_uri: String,
    user: User,
    #[serde(default)]
    user_agent: String,
    #[serde(default)]
    object_ref: ObjectRef,
    stage_timestamp: String,
}

#[derive(Deserialize)]
struct User {
    username: String,
}

#[derive(Deserialize, Default)]
pub struct ObjectRef {
    #[serde(default)]
    pub resource: String,
    pub namespace: Option<String>,
}

/// One of the daemon's requests, at one stage.
pub struct Event {
    pub stage: String,
    pub verb: String,
    pub request_uri: String,
    pub object: ObjectRef,
    /// The stage's time, in whole seconds since the epoch.
    pub second: i64,
}

impl Event {
    pub fn is_watch(&self) -> bool {
        self.verb == "watch"
    }

    pub fn watch_opened(&self) -> bool {
        self.stage == "ResponseStarted" && self.is_watch()
    }

    /// A request other than a watch, answered.
    pub fn request_completed(&self) -> bool {
        self.stage == "ResponseComplete" && !self.is_watch()
    }

    pub fn of_claims(&self) -> bool {
        self.object.resource == "persistentvolumeclaims"
    }

    pub fn in_namespace(&self, namespace: &str) -> bool {
        self.object.namespace.as_deref() == Some(namespace)
    }
}

/// The daemon's events in the log at `path`, oldest first.
pub fn daemon_events(path: &Path) -> Result<Vec<Event>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    parse_daemon_events(&text)
}

fn parse_daemon_events(text: &str) -> Result<Vec<Event>> {
    let mut events = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let line: Line = serde_json::from_str(line)?;
        if line.user.username != DAEMON_USER || line.user_agent.starts_with(PROVISIONER_AGENT) {
            continue;
        }
        events.push(Event {
            second: line.stage_timestamp.parse::<Timestamp>()?.as_second(),
            stage: line.stage,
            verb: line.verb,
            request_uri: line.request_uri,
            object: line.object_ref,
        });
    }
    Ok(events)
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// Audit lines as the API server writes them (audit.k8s.io/v1, Metadata level),
    /// trimmed to the fields read here.
    pub const LOG: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete","requestURI":"/api/v1/persistentvolumeclaims?labelSelector=localvol.csi.dev%2Fnode%3Dnode1&limit=500","verb":"list","user":{"username":"system:serviceaccount:localvol-system:localvol-node"},"userAgent":"localvol/0.1","objectRef":{"resource":"persistentvolumeclaims","apiVersion":"v1"},"stageTimestamp":"2026-12-03T10:00:01.123456Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseStarted","requestURI":"/api/v1/persistentvolumeclaims?labelSelector=localvol.csi.dev%2Fnode%3Dnode1&watch=true","verb":"watch","user":{"username":"system:serviceaccount:localvol-system:localvol-node"},"userAgent":"localvol/0.1","objectRef":{"resource":"persistentvolumeclaims","apiVersion":"v1"},"stageTimestamp":"2026-12-03T10:00:02.5Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/lvtest-s8-other/persistentvolumeclaims/foreign-1","verb":"get","user":{"username":"system:serviceaccount:localvol-system:localvol-node"},"userAgent":"localvol/0.1","objectRef":{"resource":"persistentvolumeclaims","namespace":"lvtest-s8-other","name":"foreign-1","apiVersion":"v1"},"stageTimestamp":"2026-12-03T10:00:03.000001Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete","requestURI":"/api/v1/persistentvolumeclaims","verb":"list","user":{"username":"system:serviceaccount:localvol-system:localvol-node"},"userAgent":"csi-provisioner/v5","objectRef":{"resource":"persistentvolumeclaims","apiVersion":"v1"},"stageTimestamp":"2026-12-03T10:00:03.2Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete","requestURI":"/api/v1/nodes/node1","verb":"get","user":{"username":"system:node:node1"},"userAgent":"kubelet","objectRef":{"resource":"nodes","name":"node1","apiVersion":"v1"},"stageTimestamp":"2026-12-03T10:00:03.3Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/a/persistentvolumeclaims","verb":"list","user":{"username":"system:serviceaccount:localvol-system:localvol-node"},"userAgent":"localvol/0.1","objectRef":{"resource":"persistentvolumeclaims","namespace":"a","apiVersion":"v1"},"stageTimestamp":"2026-12-03T10:00:09Z"}
"#;

    pub fn events() -> Vec<Event> {
        parse_daemon_events(LOG).unwrap()
    }

    pub fn second(at: &str) -> i64 {
        at.parse::<Timestamp>().unwrap().as_second()
    }

    #[test]
    fn only_the_daemons_own_requests_are_read() {
        let events = events();
        assert_eq!(
            events.len(),
            4,
            "the provisioner's and kubelet's requests are not the daemon's"
        );
        assert_eq!(events[1].second, second("2026-12-03T10:00:02Z"), "whole seconds");
        assert!(events[1].watch_opened() && events[1].of_claims());
        assert!(events[2].request_completed() && events[2].in_namespace("lvtest-s8-other"));
    }
}
