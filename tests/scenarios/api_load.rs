//! Scenario 8: the daemon's API footprint grows with its own node's claims only. The API
//! server's audit log (tests/cluster/run.sh starts it with one, Metadata level, the
//! daemon pod's service account only) is read for the localvol container's requests
//! (the provisioner sidecar shares the service account; its user agent tells them apart)
//! in equal windows: with 1, 10 and 50 claims provisioned on this node (selected-node
//! annotation, no pods), then with 500 more claims that concern another node
//! (selected-node names a node that does not exist, so they stay Pending), which are
//! changed once during their window.
//!
//! Fails if the daemon reads or watches claims without this node's label selector,
//! makes any request about the other node's claims, opens claim watches per claim (more
//! than its two, each re-opened once), or makes more claim requests with the other
//! node's claims than with its own 50 plus one read of each of those (a resync may fall
//! in a window). Prints a table.
//!
//! Cost: about 80 s (four windows of 10 s, 50 claims bound, 500 made and changed).

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::audit::{Event, daemon_events};
use crate::run::{Result, Run};

/// A window's length, and how long the audit backend takes to write its batch.
const WINDOW: Duration = Duration::from_secs(8);
const AUDIT_BATCH: Duration = Duration::from_secs(2);
const OTHER_NODE: &str = "node-elsewhere";
const OTHER_CLAIMS: usize = 500;
const NODE_SELECTOR: &str = "labelSelector=localvol.csi.dev%2Fnode%3D";

pub async fn footprint_follows_own_claims(run: Run) -> Result {
    let audit = run
        .audit_log
        .clone()
        .ok_or("no AUDIT_LOG (tests/cluster/run.sh starts the API server with one)")?;
    if std::fs::metadata(&audit).map(|m| m.len()).unwrap_or(0) == 0 {
        return Err(format!("no audit log at {}", audit.display()).into());
    }
    // The filter must see the daemon at all, or every count below is a vacuous 0: its
    // claim watches, opened when it started, are in the log.
    if !daemon_events(&audit)?
        .iter()
        .any(|e| e.watch_opened() && e.of_claims())
    {
        return Err(format!("no claim watch of the daemon's in {}", audit.display()).into());
    }
    let other = format!("{}-other", run.namespace);
    let start = Timestamp::now().as_second();
    let own = run.claims();
    let mut rows = Vec::new();
    let mut made = 0;
    for target in [1, 10, 50] {
        for i in made..target {
            own.create(
                &PostParams::default(),
                &claim(&format!("local-{i}"), &run.node, &run.storage_class)?,
            )
            .await?;
        }
        made = target;
        run.wait_for(
            &format!("{target} claims bound"),
            Duration::from_secs(90),
            || async {
                let bound = own
                    .list(&Default::default())
                    .await?
                    .items
                    .iter()
                    .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                    .count();
                Ok((bound == target).then_some(()))
            },
        )
        .await?;
        rows.push(window(&audit, start, (target, 0), &other, None).await?);
    }

    run.create_namespace_named(&other).await?;
    let foreign = Api::<PersistentVolumeClaim>::namespaced(run.client.clone(), &other);
    for i in 0..OTHER_CLAIMS {
        foreign
            .create(
                &PostParams::default(),
                &claim(&format!("foreign-{i}"), OTHER_NODE, &run.storage_class)?,
            )
            .await?;
    }
    run.note(&format!("{OTHER_CLAIMS} claims of {OTHER_NODE} created"));
    rows.push(window(&audit, start, (50, OTHER_CLAIMS), &other, Some(&foreign)).await?);

    run.note(&format!(
        "NOTE s8: API requests of the localvol container, {}s windows (audit log)",
        WINDOW.as_secs()
    ));
    run.note(&format!("NOTE s8:   {}", Row::HEADER));
    for row in &rows {
        run.note(&format!("NOTE s8:   {row}"));
    }
    let (with_50, with_other) = (&rows[2], &rows[3]);
    if with_other.other_claim_events != 0 {
        return Err(format!(
            "the daemon made {} requests about another node's claims",
            with_other.other_claim_events
        )
        .into());
    }
    // Two claim watches at most (node resizer, reclaim scheduler), re-opened at most once
    // each in the scenario: never one per claim.
    if with_other.claim_watches > 4 {
        return Err(format!(
            "{} claim watches opened while claims were added",
            with_other.claim_watches
        )
        .into());
    }
    // The node's own 50 claims may each be read once in a window (the resizer's resync);
    // the other node's 500 must cost nothing.
    if with_other.claim_requests > with_50.claim_requests + 50 {
        return Err(format!(
            "claim requests grew from {} to {} with another node's {OTHER_CLAIMS} claims",
            with_50.claim_requests, with_other.claim_requests
        )
        .into());
    }
    let events = daemon_events(&audit)?;
    let unlabelled = unlabelled_claim_reads(since(&events, start));
    if !unlabelled.is_empty() {
        return Err(format!("claims listed or watched without this node's label: {unlabelled:?}").into());
    }
    run.note(&format!(
        "NOTE s8: every claim list/watch of the daemon carried labelSelector=localvol.csi.dev/node={}",
        run.node
    ));
    // Pending claims without volumes: nothing to wait for (the node is purged at the end).
    Api::<Namespace>::all(run.client.clone())
        .delete(&other, &DeleteParams::default())
        .await?;
    Ok(())
}

/// A claim of 8 MiB that the scheduler has placed on `node` (no pod needs it).
fn claim(name: &str, node: &str, storage_class: &str) -> Result<PersistentVolumeClaim> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"volume.kubernetes.io/selected-node": node}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": "8Mi"}}
        }
    }))?)
}

/// One window of the daemon's requests with `claims` (own, other's) on the cluster,
/// every other claim changed at its start when `change` is given.
async fn window(
    audit: &Path,
    start: i64,
    claims: (usize, usize),
    other_namespace: &str,
    change: Option<&Api<PersistentVolumeClaim>>,
) -> Result<Row> {
    let t0 = Timestamp::now().as_second();
    if let Some(api) = change {
        let patch = json!({"metadata": {"annotations": {"localvol-test/touched": t0.to_string()}}});
        for i in 0..OTHER_CLAIMS {
            api.patch(
                &format!("foreign-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        }
    }
    tokio::time::sleep(WINDOW).await;
    let t1 = Timestamp::now().as_second();
    tokio::time::sleep(AUDIT_BATCH).await;
    let events = daemon_events(audit)?;
    let in_window: Vec<&Event> = since(&events, t0).filter(|e| e.second < t1).collect();
    Ok(Row::of(
        claims,
        &in_window,
        since(&events, start),
        other_namespace,
    ))
}

/// The events at or after second `from`.
fn since(events: &[Event], from: i64) -> impl Iterator<Item = &Event> + Clone {
    events.iter().filter(move |e| e.second >= from)
}

/// The request URIs of the daemon's claim lists and watches that lack this node's label
/// selector.
fn unlabelled_claim_reads<'a>(events: impl Iterator<Item = &'a Event>) -> Vec<&'a str> {
    let mut uris: Vec<&str> = events
        .filter(|e| e.of_claims() && (e.verb == "list" || e.is_watch()))
        .map(|e| e.request_uri.as_str())
        .filter(|uri| !uri.contains(NODE_SELECTOR))
        .collect();
    uris.sort();
    uris.dedup();
    uris
}

/// A line of the table: requests and claim requests are the completed non-watch requests
/// of the window; the watches, and the requests about the other namespace, are counted
/// since the scenario started.
#[derive(Debug, PartialEq)]
struct Row {
    own: usize,
    other: usize,
    requests: usize,
    claim_requests: usize,
    watches: usize,
    claim_watches: usize,
    other_claim_events: usize,
}

impl Row {
    const HEADER: &str =
        "local  other  requests  claim-requests  watches-opened  claim-watches  other-claim-requests";

    fn of<'a>(
        claims: (usize, usize),
        window: &[&Event],
        since_start: impl Iterator<Item = &'a Event> + Clone,
        other_namespace: &str,
    ) -> Self {
        let completed = || window.iter().filter(|e| e.request_completed());
        let opened = || since_start.clone().filter(|e| e.watch_opened());
        Self {
            own: claims.0,
            other: claims.1,
            requests: completed().count(),
            claim_requests: completed().filter(|e| e.of_claims()).count(),
            watches: opened().count(),
            claim_watches: opened().filter(|e| e.of_claims()).count(),
            other_claim_events: since_start
                .clone()
                .filter(|e| e.in_namespace(other_namespace))
                .count(),
        }
    }
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:5}  {:5}  {:8}  {:14}  {:14}  {:13}  {:20}",
            self.own,
            self.other,
            self.requests,
            self.claim_requests,
            self.watches,
            self.claim_watches,
            self.other_claim_events
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::tests::{events, second};

    #[test]
    fn a_window_counts_from_its_first_second_up_to_not_into_its_last() {
        let all = events();
        let window: Vec<&Event> = since(&all, second("2026-12-03T10:00:02Z"))
            .filter(|e| e.second < second("2026-12-03T10:00:09Z"))
            .collect();
        assert_eq!(window.len(), 2);
        let row = Row::of((50, 500), &window, since(&all, 0), "lvtest-s8-other");
        let expected = Row {
            own: 50,
            other: 500,
            requests: 1,
            claim_requests: 1,
            watches: 1,
            claim_watches: 1,
            other_claim_events: 1,
        };
        assert_eq!(row, expected);
    }

    #[test]
    fn a_claim_list_without_the_nodes_selector_is_named() {
        let all = events();
        assert_eq!(
            unlabelled_claim_reads(all.iter()),
            ["/api/v1/namespaces/a/persistentvolumeclaims"]
        );
    }
}
