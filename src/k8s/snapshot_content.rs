//! Pre-provisioned VolumeSnapshotContents of this node's snapshots, labelled so that the
//! node's csi-snapshotter serves them.
//!
//! Why: under distributed snapshotting (snapshot-controller
//! `--enable-distributed-snapshotting`, csi-snapshotter a node sidecar with
//! `--node-deployment`) each node's csi-snapshotter lists and watches only the contents
//! labelled [`MANAGED_BY`]`=<its NODE_NAME>`. snapshot-controller puts that label on the
//! contents it creates for dynamic snapshots (from the source volume's node affinity),
//! never on a content made by hand for an existing snapshot (`spec.source.snapshotHandle`):
//! no node's sidecar would ever make such a content ready or, with
//! `deletionPolicy: Delete`, delete its snapshot. A snapshot id does not name its node, so
//! only the node that holds the snapshot can tell. Each daemon looks the handle up as
//! ListSnapshots does (the call its sidecar then makes to make the content ready) and
//! labels the contents whose snapshot it holds with its node id, the NODE_NAME its sidecar
//! selects by.
//!
//! Why the stream is bounded: the watch selects `!`[`MANAGED_BY`], the contents no one has
//! labelled, and the API server filters by it, so a node is sent nothing else. Under
//! distributed snapshotting those are pre-provisioned contents (made by hand: rare) and
//! the dynamic contents of volumes without node affinity (other drivers' network
//! volumes). Neither grows with the number of nodes or pods, nor with localvol's own
//! dynamic snapshots (they are labelled when created). A content leaves every node's
//! stream when it is labelled, by this node, another one or by hand. Nothing is cached:
//! each content is looked at as it comes. Another driver's content costs a comparison;
//! one of localvol's that is not on this node, one read of a record.
//!
//! Writes: one merge PATCH of `metadata.labels` per content, carrying the content's
//! `metadata.resourceVersion`, so it applies only to the content as seen. A content
//! changed meanwhile (409) comes again with its next event, or has left the selection
//! because it got labelled (another node holding a snapshot of the same id came first).
//! A content gone (404) is left. Nothing but the label is ever written.
//!
//! Without the snapshot CRDs (no snapshot component deployed) the list answers 404, and
//! without the RBAC the csi-snapshotter component grants, 403: said once at info, and
//! asked again every [`ABSENT_RETRY`]. Other failures are retried with the watch's backoff
//! by listing again, which also brings back a content whose labelling failed.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher;
use serde_json::json;
use tokio_stream::StreamExt;
use tracing::{debug, info, warn};

use super::api::{ApiError, merge_patch};
use super::reflect::{Retry, WATCH_RETRY};
use crate::model::{DRIVER_NAME, SnapshotId, Terminal, full_message};
use crate::request::SnapshotFilter;
use crate::volume::{VolumeError, Volumes};

/// The label csi-snapshotter `--node-deployment` selects its contents by.
pub const MANAGED_BY: &str = "snapshot.storage.kubernetes.io/managed-by";
/// The watch's label selector: contents without [`MANAGED_BY`].
pub const UNLABELLED: &str = "!snapshot.storage.kubernetes.io/managed-by";
/// How often the contents are asked for again while the API answers that there are
/// none to ask for (no CRD) or that this daemon may not (no RBAC): either changes only
/// when an administrator deploys the snapshot component.
pub const ABSENT_RETRY: Duration = Duration::from_secs(300);

/// VolumeSnapshotContent, snapshot.storage.k8s.io/v1, cluster-scoped (k8s-openapi has no
/// type for it: the CRD comes from external-snapshotter).
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent"),
        "volumesnapshotcontents",
    )
}

#[derive(Debug, thiserror::Error)]
pub enum ContentError {
    #[error("looking snapshot {handle} up on this node: {source}")]
    Lookup {
        handle: String,
        #[source]
        source: VolumeError,
    },
    #[error(transparent)]
    Label(#[from] ApiError),
}

impl Terminal for ContentError {
    fn is_terminal(&self) -> bool {
        match self {
            ContentError::Lookup { source, .. } => source.is_terminal(),
            ContentError::Label(e) => e.is_terminal(),
        }
    }
}

/// Why a content is left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// It carries [`MANAGED_BY`] already, naming any node: someone has decided.
    Labelled,
    /// `spec.driver` is not localvol's.
    OtherDriver,
    /// No `spec.source.snapshotHandle`: a dynamic content, which snapshot-controller
    /// labels itself when it can.
    NoHandle,
    /// The handle is not a snapshot id localvol makes.
    NotOurId,
    /// No name or resourceVersion to write with (the API server sends both): never
    /// written without the version.
    Incomplete,
    /// A localvol snapshot id that this node does not hold.
    NotHere,
}

/// What became of one content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Labelled,
    Skipped(Skip),
    /// Deleted before the PATCH (404).
    Gone,
    /// Changed since it was seen (409): its next event brings it again.
    Conflict,
}

/// What a content must carry to be labelled by this node.
#[derive(Debug, PartialEq, Eq)]
struct Candidate<'a> {
    name: &'a str,
    version: &'a str,
    handle: &'a str,
    id: SnapshotId,
}

/// A localvol content made for an existing snapshot that no one has labelled, or why not.
fn candidate(content: &DynamicObject) -> Result<Candidate<'_>, Skip> {
    let meta = &content.metadata;
    if meta.labels.as_ref().is_some_and(|l| l.contains_key(MANAGED_BY)) {
        return Err(Skip::Labelled);
    }
    let spec = &content.data["spec"];
    if spec["driver"].as_str() != Some(DRIVER_NAME) {
        return Err(Skip::OtherDriver);
    }
    let handle = spec["source"]["snapshotHandle"]
        .as_str()
        .filter(|h| !h.is_empty())
        .ok_or(Skip::NoHandle)?;
    let id = SnapshotId::parse(handle).map_err(|_| Skip::NotOurId)?;
    match (meta.name.as_deref(), meta.resource_version.as_deref()) {
        (Some(name), Some(version)) => Ok(Candidate {
            name,
            version,
            handle,
            id,
        }),
        _ => Err(Skip::Incomplete),
    }
}

/// Whether `node` can be a label value (at most 63 characters, alphanumerics, `-`, `_`
/// and `.`, alphanumeric at both ends). csi-snapshotter selects by the node name as it
/// is, so a longer one cannot be served by it at all.
pub fn is_label_value(node: &str) -> bool {
    let alnum_ends = node.starts_with(|c: char| c.is_ascii_alphanumeric())
        && node.ends_with(|c: char| c.is_ascii_alphanumeric());
    node.len() <= 63
        && alnum_ends
        && node
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Labels the unlabelled contents of this node's snapshots.
#[derive(Clone)]
pub struct ContentLabeller {
    api: Api<DynamicObject>,
    volumes: Arc<Volumes>,
    node: String,
}

impl std::fmt::Debug for ContentLabeller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContentLabeller")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl ContentLabeller {
    pub fn new(client: Client, volumes: Arc<Volumes>, node: &str) -> Self {
        Self {
            api: Api::all_with(client, &resource()),
            volumes,
            node: node.to_string(),
        }
    }

    /// Labels `content` for this node if it is a localvol content that no one has
    /// labelled, made for a snapshot this node holds.
    pub async fn label(&self, content: &DynamicObject) -> Result<Outcome, ContentError> {
        let c = match candidate(content) {
            Ok(c) => c,
            Err(skip) => return Ok(Outcome::Skipped(skip)),
        };
        // The ListSnapshots lookup, so that a content is labelled exactly when the
        // sidecar's ListSnapshots on this node will find its snapshot.
        let held = self
            .volumes
            .list_snapshots(&SnapshotFilter::Snapshot(c.id.clone()))
            .await
            .map_err(|source| ContentError::Lookup {
                handle: c.handle.to_string(),
                source,
            })?;
        if held.is_empty() {
            return Ok(Outcome::Skipped(Skip::NotHere));
        }
        let patch = json!({
            "metadata": {
                "resourceVersion": c.version,
                "labels": {MANAGED_BY: self.node},
            }
        });
        let labelled = merge_patch(
            &self.api,
            || format!("label VolumeSnapshotContent {}", c.name),
            c.name,
            &patch,
        )
        .await;
        match labelled {
            Ok(_) => Ok(Outcome::Labelled),
            Err(ApiError::NotFound { .. }) => Ok(Outcome::Gone),
            Err(ApiError::Conflict { .. }) => Ok(Outcome::Conflict),
            Err(e) => Err(e.into()),
        }
    }

    /// [`label`](Self::label), logged.
    async fn serve(&self, content: &DynamicObject) -> Result<(), ContentError> {
        let name = content.metadata.name.as_deref().unwrap_or_default();
        let handle = content.data["spec"]["source"]["snapshotHandle"]
            .as_str()
            .unwrap_or_default();
        match self.label(content).await? {
            Outcome::Labelled => info!(
                content.name = %name,
                snapshot.id = %handle,
                node.id = %self.node,
                "labelled pre-provisioned VolumeSnapshotContent with this node: its csi-snapshotter serves it now"
            ),
            Outcome::Gone => {
                debug!(content.name = %name, "VolumeSnapshotContent gone before it was labelled")
            }
            Outcome::Conflict => debug!(
                content.name = %name,
                "VolumeSnapshotContent changed while being labelled; its next event tries again"
            ),
            Outcome::Skipped(why) => {
                debug!(content.name = %name, ?why, "VolumeSnapshotContent not labelled here")
            }
        }
        Ok(())
    }
}

/// The watch loop's delays; tests shorten them.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// After a failed list or watch, or a failed label: the watch's backoff.
    pub retry: Retry,
    /// While there is no API to list or no right to (and after a failure that will not
    /// change by itself).
    pub absent: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            retry: WATCH_RETRY,
            absent: ABSENT_RETRY,
        }
    }
}

/// Why the contents cannot be listed, until an administrator acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unavailable {
    /// 404: the CRD is not installed.
    NoApi,
    /// 403: the daemon's service account may not list them.
    Forbidden,
}

fn unavailable(e: &watcher::Error) -> Option<Unavailable> {
    let code = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code,
        watcher::Error::WatchError(s) => s.code,
        _ => return None,
    };
    match code {
        404 => Some(Unavailable::NoApi),
        403 => Some(Unavailable::Forbidden),
        _ => None,
    }
}

/// What the loop has said at info about the contents being unavailable, so that each
/// state is said once however often it is found again.
#[derive(Debug, Default)]
struct Said(Option<Unavailable>);

impl Said {
    /// Records `now`; true if it is news (to be said at info).
    fn unavailable(&mut self, now: Unavailable) -> bool {
        self.0.replace(now) != Some(now)
    }

    /// The contents were listed; true if they were unavailable until now.
    fn available(&mut self) -> bool {
        self.0.take().is_some()
    }
}

/// Watches the unlabelled contents and labels those of this node's snapshots, until the
/// task is dropped.
pub async fn run(labeller: ContentLabeller, timings: Timings) {
    let config = watcher::Config::default().labels(UNLABELLED);
    let mut delay = timings.retry.first;
    let mut said = Said::default();
    let mut listed_once = false;
    let backoff = |delay: &mut Duration| {
        let now = *delay;
        *delay = (*delay * 2).min(timings.retry.max);
        now
    };
    loop {
        let events = watcher(labeller.api.clone(), config.clone());
        let mut events = std::pin::pin!(events);
        let wait = loop {
            match events.next().await {
                Some(Ok(watcher::Event::InitDone)) => {
                    if said.available() || !listed_once {
                        info!(
                            node.id = %labeller.node,
                            "watching unlabelled VolumeSnapshotContents: pre-provisioned ones of this node's snapshots get its csi-snapshotter's label"
                        );
                    }
                    listed_once = true;
                    delay = timings.retry.first;
                }
                Some(Ok(watcher::Event::InitApply(content) | watcher::Event::Apply(content))) => {
                    if let Err(e) = labeller.serve(&content).await {
                        let wait = if e.is_terminal() {
                            timings.absent
                        } else {
                            backoff(&mut delay)
                        };
                        warn!(error = %full_message(&e), retry_in = ?wait, "cannot label VolumeSnapshotContent; listing again later");
                        break wait;
                    }
                }
                Some(Ok(watcher::Event::Init | watcher::Event::Delete(_))) => {}
                Some(Err(e)) => match unavailable(&e) {
                    Some(why) => {
                        if said.unavailable(why) {
                            let reason = match why {
                                Unavailable::NoApi => {
                                    "no VolumeSnapshotContent API (the snapshot CRDs are not installed)"
                                }
                                Unavailable::Forbidden => {
                                    "not allowed to list VolumeSnapshotContents (the csi-snapshotter component's RBAC is not applied)"
                                }
                            };
                            info!(retry_in = ?timings.absent, "{reason}: not labelling pre-provisioned snapshot contents");
                        } else {
                            debug!(error = %e, retry_in = ?timings.absent, "VolumeSnapshotContents still unavailable");
                        }
                        break timings.absent;
                    }
                    None => {
                        let wait = backoff(&mut delay);
                        warn!(error = %e, retry_in = ?wait, "cannot list or watch VolumeSnapshotContents");
                        break wait;
                    }
                },
                // A watcher's stream does not end; if it did, start over.
                None => break backoff(&mut delay),
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// Starts labelling this node's pre-provisioned snapshot contents in the background, until
/// `shutdown` resolves; none when `node` cannot be a label value (no csi-snapshotter can
/// select by it either, said once here).
pub fn spawn(
    client: Client,
    volumes: Arc<Volumes>,
    node: &str,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Option<tokio::task::JoinHandle<()>> {
    if !is_label_value(node) {
        info!(
            node.id = %node,
            "the node id is not a valid label value: csi-snapshotter --node-deployment cannot select by it, so pre-provisioned snapshot contents are not labelled"
        );
        return None;
    }
    let labeller = ContentLabeller::new(client, volumes, node);
    Some(tokio::spawn(async move {
        tokio::select! {
            () = run(labeller, Timings::default()) => {}
            () = shutdown => {}
        }
    }))
}

#[cfg(test)]
mod tests;
