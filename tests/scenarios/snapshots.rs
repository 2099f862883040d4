//! Scenario 9: VolumeSnapshots and clones of a claim that a running pod writes to, with
//! csi-snapshotter as a node sidecar (deploy/components/csi-snapshotter) and the
//! snapshot-controller started with --enable-distributed-snapshotting (lib.sh's
//! start_snapshot_controller, for the host's cluster and the guest's): a restore holds
//! the data as at the snapshot and a clone as at the clone, not what came after;
//! deleting everything leaves no VolumeSnapshotContent and nothing of the class's on
//! the node ([`node::class_storage_left`]: the loop class's images and records,
//! lvm-thin's volume and snapshot LVs).
//!
//! On the loop class the scenario adds the component (tests/cluster/overlays/snapshots)
//! and puts the run's overlay back after; the guest's lvm-thin overlay carries it from
//! the start.
//!
//! Pre-provisioned snapshots: a VolumeSnapshotContent made by hand for the handle of an
//! existing snapshot, bound to a VolumeSnapshot of its own, is made ready from
//! ListSnapshots with the snapshot's size; with deletionPolicy Retain, deleting both
//! leaves the snapshot on the node; with Delete, deleting the VolumeSnapshot deletes the
//! content and the snapshot. Under distributed snapshotting the node's csi-snapshotter
//! handles only contents labelled with its node (docs/backends.md, "Pre-provisioned
//! snapshots"): the Retain and Delete contents are labelled by hand, which still works;
//! a third content, for a second snapshot of the source, is made without the label, and
//! the daemon of the node holding the snapshot labels it.
//!
//! Cost: about 60 s on the host's cluster (two rollouts of the daemon among it), 160 to
//! 230 s under TCG in the guest.

use std::ops::RangeInclusive;
use std::path::Path;
use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use localvol::model::DRIVER_NAME;
use serde_json::{Value, json};

use crate::node::{self, Backing, SnapshotStorage, Volume};
use crate::run::{ClaimShape, PodVolume, Result, Run, SNAPSHOT_GROUP, test_overlay, tool};

/// The daemon pod's sidecar that serves the snapshots (deploy/components/csi-snapshotter).
const SNAPSHOTTER: &str = "csi-snapshotter";
/// The label distributed snapshotting puts on a content for the node that serves it.
const MANAGED_BY: &str = "snapshot.storage.kubernetes.io/managed-by";
/// The component's VolumeSnapshotClass (deletionPolicy Delete), and the Retain class the
/// scenario makes for the unlabelled content's snapshot.
const SNAPSHOT_CLASS: &str = "localvol";
const RETAIN_CLASS: &str = "localvol-retain";
const SOURCE: &str = "src";
const WRITER: &str = "writer";
/// The source's writer: a numbered line every 50 ms for as long as it runs, so that the
/// snapshot and the clone are taken under writes.
const WRITER_SCRIPT: &str =
    r#"i=0; while true; do i=$((i+1)); echo "line $i" >> /data/log; sleep 0.05; done"#;
const SNAPSHOT: &str = "snap";

pub async fn copies_hold_their_moment(run: Run) -> Result {
    let swaps_overlay = run.class_kind == "loop";
    let outcome = copies_of_a_written_claim(&run, swaps_overlay).await;
    // Back to the run's overlay even when a step failed, so that later scenarios see it.
    let cleanup = if swaps_overlay {
        back_to_own_overlay(&run).await
    } else {
        delete_snapshots(&run).await
    };
    match (outcome, cleanup) {
        (Ok(notes), Ok(())) => {
            // Last: the shell entry shows the end of the output, where run.sh's summary
            // finds the NOTE lines.
            for note in notes {
                run.note(&note);
            }
            Ok(())
        }
        (Ok(_), Err(e)) => Err(e),
        (Err(e), cleanup) => {
            if let Err(c) = cleanup {
                run.note(&format!("cleanup after the failure failed too: {c}"));
            }
            Err(e)
        }
    }
}

/// The scenario's steps; its NOTE lines.
async fn copies_of_a_written_claim(run: &Run, swaps_overlay: bool) -> Result<Vec<String>> {
    if swaps_overlay {
        snapshot_component_on(run).await?;
    } else {
        snapshotter_ready(run).await?;
    }
    // The source's size; a restore asks for twice as much.
    let size = run.fs_size.clone();
    let double = doubled(&size)?;

    run.claim(SOURCE).await?;
    run.create_pod(WRITER, &PodVolume::Filesystem(SOURCE), "/data", WRITER_SCRIPT)
        .await?;
    run.pods_running(&[WRITER], Duration::from_secs(120)).await?;
    let source = Volume::of_claim(run, SOURCE).await?.backing;
    run.exec(WRITER, "echo before-snapshot > /data/marker-1 && sync")
        .await
        .map_err(|e| format!("writing into the source: {e}"))?;
    wait_for_lines(run, "the writer is writing", 5).await?;
    let lines_before_snapshot = log_lines(run, WRITER).await?;

    create(&run.volume_snapshots(), snapshot_of(SNAPSHOT, SNAPSHOT_CLASS)).await?;
    wait_ready(run, SNAPSHOT, "VolumeSnapshot ready to use").await?;
    // Every line the snapshot can hold was written before it was ready.
    let lines_at_ready = log_lines(run, WRITER).await?;
    run.exec(WRITER, "echo after-snapshot > /data/marker-2 && sync")
        .await
        .map_err(|e| format!("writing after the snapshot: {e}"))?;
    let (content, handle) = bound_content(run, SNAPSHOT).await?;
    let storage = SnapshotStorage::of(run, &handle)?;
    run.note(&format!("snapshot content {content} handle {handle}"));
    if managed_by(run, &content).await?.as_deref() != Some(run.node.as_str()) {
        return Err(format!(
            "content {content} not labelled for node {} (snapshot-controller without --enable-distributed-snapshotting?)",
            run.node
        )
        .into());
    }
    if !storage.present()? {
        return Err(format!(
            "snapshot {handle} missing on the node ({storage}); the class's storage there: {:?}",
            node::class_storage_left(run)?
        )
        .into());
    }
    expect_restore_size(run, SNAPSHOT, &size).await?;

    // Restore into a claim twice the snapshot's size: the data as at the snapshot, and
    // the pod sees the size it asked for (the filesystem grown at stage), not the
    // source's.
    let from_snapshot = json!({"apiGroup": SNAPSHOT_GROUP, "kind": "VolumeSnapshot", "name": SNAPSHOT});
    let restored = ClaimShape {
        size: double.clone(),
        data_source: Some(from_snapshot),
        ..run.claim_shape()
    };
    run.create_claim("restored", &restored).await?;
    run.pod_with("restore-reader", "restored").await?;
    let restore = Copy {
        what: "restore",
        pod: "restore-reader",
        claim: "restored",
    };
    let restored_lines = restore
        .holds(
            run,
            &source,
            ("marker-1", "before-snapshot"),
            "marker-2",
            lines_before_snapshot..=lines_at_ready,
        )
        .await?;
    let source_kib = run.filesystem_kib(WRITER).await?;
    let restored_kib = run.filesystem_kib(restore.pod).await?;
    // The filesystem keeps a few MiB of either size for itself: twice the size, less 10%.
    if restored_kib <= source_kib * 9 / 5 {
        return Err(format!(
            "the {double} restore shows {restored_kib} KiB in the pod, the {size} source {source_kib} KiB: its filesystem was not grown"
        )
        .into());
    }

    // Clone of the running source: the data as at the clone.
    let lines_before_clone = log_lines(run, WRITER).await?;
    let from_claim = json!({"kind": "PersistentVolumeClaim", "name": SOURCE});
    let clone = ClaimShape {
        size: size.clone(),
        data_source: Some(from_claim),
        ..run.claim_shape()
    };
    run.create_claim("clone", &clone).await?;
    run.pod_with("clone-reader", "clone").await?;
    let lines_at_clone = log_lines(run, WRITER).await?;
    run.exec(WRITER, "echo after-clone > /data/marker-3 && sync")
        .await
        .map_err(|e| format!("writing after the clone: {e}"))?;
    let clone = Copy {
        what: "clone",
        pod: "clone-reader",
        claim: "clone",
    };
    clone
        .holds(
            run,
            &source,
            ("marker-2", "after-snapshot"),
            "marker-3",
            lines_before_clone..=lines_at_clone,
        )
        .await?;
    // The source kept running and writing through both copies.
    let before = log_lines(run, WRITER).await?;
    wait_for_lines(run, "the writer still writes after the copies", before + 5).await?;

    // Contents made by hand for the same snapshot; the last one deletes it, so deleting
    // the dynamic VolumeSnapshot below finds nothing to delete.
    let mut notes = preprovisioned(run, &handle, &storage, &size).await?;

    // Delete everything: the snapshot first (its content and storage go with it), then
    // the pods and claims.
    run.delete_and_wait(&run.volume_snapshots(), SNAPSHOT, Duration::from_secs(60))
        .await?;
    let contents = run.volume_snapshot_contents();
    run.gone(
        &contents,
        &content,
        &format!("VolumeSnapshotContent {content} deleted"),
        Duration::from_secs(60),
    )
    .await?;
    if !storage.gone()? {
        return Err(format!("snapshot {handle} left on the node ({storage})").into());
    }
    let mut volumes = Vec::new();
    for claim in [SOURCE, restore.claim, clone.claim] {
        volumes.push(run.volume_of(claim).await?.0);
    }
    for pod in [WRITER, restore.pod, clone.pod] {
        run.pods().delete(pod, &DeleteParams::default()).await?;
    }
    for claim in [SOURCE, restore.claim, clone.claim] {
        run.claims().delete(claim, &DeleteParams::default()).await?;
    }
    for pv in &volumes {
        run.volume_gone(pv, Duration::from_secs(90)).await?;
    }
    let left: Vec<String> = contents
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    if !left.is_empty() {
        return Err(format!("VolumeSnapshotContents left: {left:?}").into());
    }
    let left = node::class_storage_left(run)?;
    if !left.is_empty() {
        return Err(format!("left of the {} class on the node: {left:?}", run.device_class).into());
    }
    notes.push(format!(
        "NOTE s9 ({}): restore holds {restored_lines} of the {lines_at_ready} lines written when the snapshot was ready; df in its pod {restored_kib} KiB ({double} claim; the {size} source {source_kib} KiB); nothing of the class left on the node",
        run.device_class
    ));
    Ok(notes)
}

/// A copy of the source, read by a pod of its own.
struct Copy {
    /// "restore" or "clone", for the messages.
    what: &'static str,
    pod: &'static str,
    claim: &'static str,
}

impl Copy {
    /// Another volume than the source's; `before` (a file and what was written into it
    /// before the copy) in it, the file `after` (written after the copy) not; its log
    /// intact, of as many lines as `lines` allows (the source's count before the copy
    /// began, and when it was done). Its log's lines.
    async fn holds(
        &self,
        run: &Run,
        source: &Backing,
        before: (&str, &str),
        after: &str,
        lines: RangeInclusive<usize>,
    ) -> Result<usize> {
        let what = self.what;
        let backing = Volume::of_claim(run, self.claim).await?.backing;
        if backing == *source {
            return Err(format!("the {what} is the source volume ({backing})").into());
        }
        let (file, content) = before;
        let held = run.exec(self.pod, &format!("cat /data/{file}")).await?;
        if held.trim_end_matches('\n') != content {
            return Err(format!("the {what} lacks what was written before it: {file} holds {held:?}").into());
        }
        let later = run
            .exec(self.pod, &format!("if test -e /data/{after}; then echo yes; fi"))
            .await?;
        if !later.trim().is_empty() {
            return Err(format!("the {what} holds what was written after it ({after})").into());
        }
        let log = run.exec(self.pod, "cat /data/log").await?;
        let (n, in_order) = numbered_lines(&log);
        if !lines.contains(&n) {
            return Err(format!(
                "the {what}'s log has {n} lines, expected {}..{}",
                lines.start(),
                lines.end()
            )
            .into());
        }
        if !in_order {
            let head: String = log.chars().take(300).collect();
            return Err(format!("the {what}'s log is not lines 1..{n} in order: {head}").into());
        }
        run.note(&format!(
            "{what}: log lines 1..{n} intact (source had {} before the copy began, {} when it was done)",
            lines.start(),
            lines.end()
        ));
        Ok(n)
    }
}

/// The lines of a copy's log, and whether they are the writer's `line 1` to `line n`
/// in order, none torn or missing (the trailing newline's absence is no line).
fn numbered_lines(log: &str) -> (usize, bool) {
    let lines: Vec<&str> = log.trim_end_matches('\n').split('\n').collect();
    let in_order = lines
        .iter()
        .enumerate()
        .all(|(i, line)| *line == format!("line {}", i + 1));
    (lines.len(), in_order)
}

/// The lines the writer's log has in pod `pod`.
async fn log_lines(run: &Run, pod: &str) -> Result<usize> {
    let out = run.exec(pod, "wc -l < /data/log").await?;
    Ok(out.trim().parse()?)
}

/// Waits until the writer's log has at least `lines` lines.
async fn wait_for_lines(run: &Run, what: &str, lines: usize) -> Result {
    run.wait_for(what, Duration::from_secs(10), || async {
        // A read that fails (the log not there yet) is another poll's.
        Ok(log_lines(run, WRITER)
            .await
            .ok()
            .filter(|n| *n >= lines)
            .map(|_| ()))
    })
    .await
}

/// Twice a size in Mi (the run's FS_SIZE is one).
fn doubled(size: &str) -> Result<String> {
    let mebibytes: u64 = size
        .strip_suffix("Mi")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("FS_SIZE {size} is not a size in Mi"))?;
    Ok(format!("{}Mi", mebibytes * 2))
}

/// A VolumeSnapshot `name` of the source claim, of class `class`.
fn snapshot_of(name: &str, class: &str) -> Value {
    json!({
        "apiVersion": format!("{SNAPSHOT_GROUP}/v1"),
        "kind": "VolumeSnapshot",
        "metadata": {"name": name},
        "spec": {"volumeSnapshotClassName": class, "source": {"persistentVolumeClaimName": SOURCE}}
    })
}

async fn create(api: &Api<DynamicObject>, object: Value) -> Result {
    let object: DynamicObject = serde_json::from_value(object)?;
    api.create(&PostParams::default(), &object).await?;
    Ok(())
}

/// Waits until the VolumeSnapshot `name` is ready to use.
async fn wait_ready(run: &Run, name: &str, what: &str) -> Result {
    let snapshots = run.volume_snapshots();
    run.wait_for(what, Duration::from_secs(60), || async {
        let snapshot = snapshots.get(name).await?;
        Ok((snapshot.data["status"]["readyToUse"] == true).then_some(()))
    })
    .await
}

/// The VolumeSnapshotContent the VolumeSnapshot `name` is bound to, and its snapshot's
/// handle.
async fn bound_content(run: &Run, name: &str) -> Result<(String, String)> {
    let snapshot = run.volume_snapshots().get(name).await?;
    let content = snapshot.data["status"]["boundVolumeSnapshotContentName"]
        .as_str()
        .ok_or_else(|| format!("VolumeSnapshot {name} is bound to no content"))?
        .to_string();
    let handle = run.volume_snapshot_contents().get(&content).await?.data["status"]["snapshotHandle"]
        .as_str()
        .ok_or_else(|| format!("content {content} has no snapshot handle"))?
        .to_string();
    Ok((content, handle))
}

/// The node the content `content` is labelled managed by.
async fn managed_by(run: &Run, content: &str) -> Result<Option<String>> {
    let content = run.volume_snapshot_contents().get(content).await?;
    Ok(content.metadata.labels.unwrap_or_default().remove(MANAGED_BY))
}

/// The VolumeSnapshot `name`'s restoreSize is `size`, the source's.
async fn expect_restore_size(run: &Run, name: &str, size: &str) -> Result {
    let snapshot = run.volume_snapshots().get(name).await?;
    let restore_size = &snapshot.data["status"]["restoreSize"];
    if restore_size.as_str() != Some(size) {
        return Err(format!("{name}: restoreSize {restore_size}, expected {size}").into());
    }
    Ok(())
}

/// Contents made by hand for the snapshot `handle`, one Retain and one Delete, both
/// labelled for the node; then the unlabelled one. Their NOTE lines.
async fn preprovisioned(
    run: &Run,
    handle: &str,
    storage: &SnapshotStorage,
    size: &str,
) -> Result<Vec<String>> {
    let contents = run.volume_snapshot_contents();
    for policy in ["Retain", "Delete"] {
        let name = format!("pre-{}", policy.to_lowercase());
        let content = make_preprovisioned(run, &name, handle, policy, Some(&run.node)).await?;
        wait_ready(
            run,
            &name,
            &format!("pre-provisioned VolumeSnapshot {name} ({policy}) ready to use"),
        )
        .await?;
        expect_restore_size(run, &name, size).await?;
        run.delete_and_wait(&run.volume_snapshots(), &name, Duration::from_secs(60))
            .await?;
        if policy == "Retain" {
            if contents.get_opt(&content).await?.is_none() {
                return Err(format!("{name}: a Retain content went with its VolumeSnapshot").into());
            }
            run.delete_and_wait(&contents, &content, Duration::from_secs(60))
                .await?;
            if !storage.present()? {
                return Err(format!("{name}: deleting a Retain content deleted snapshot {handle}").into());
            }
        } else {
            delete_content_took_snapshot(run, &contents, &content, storage, &name, handle).await?;
        }
    }
    Ok(vec![
        format!(
            "NOTE s9: pre-provisioned contents for {handle}, labelled for {}: Retain kept the snapshot, Delete deleted it",
            run.node
        ),
        preprovisioned_unlabelled(run, size).await?,
    ])
}

/// A content made without the managed-by label, deletionPolicy Delete: the daemon
/// labels it for this node, its csi-snapshotter makes it ready, and deleting its
/// VolumeSnapshot deletes the snapshot. Its snapshot is made as Kubernetes' e2e suite
/// makes one: a dynamic snapshot of the source through a Retain class, whose
/// VolumeSnapshot and content are then deleted, leaving only the snapshot on the node.
async fn preprovisioned_unlabelled(run: &Run, size: &str) -> Result<String> {
    let name = "pre-unlabelled";
    let retained = "snap-retained";
    let (snapshots, contents, classes) = (
        run.volume_snapshots(),
        run.volume_snapshot_contents(),
        run.volume_snapshot_classes(),
    );
    create(
        &classes,
        json!({
            "apiVersion": format!("{SNAPSHOT_GROUP}/v1"),
            "kind": "VolumeSnapshotClass",
            "metadata": {"name": RETAIN_CLASS},
            "driver": DRIVER_NAME,
            "deletionPolicy": "Retain"
        }),
    )
    .await?;
    create(&snapshots, snapshot_of(retained, RETAIN_CLASS)).await?;
    wait_ready(
        run,
        retained,
        "VolumeSnapshot snap-retained (Retain class) ready to use",
    )
    .await?;
    let (content, handle) = bound_content(run, retained).await?;
    let storage = SnapshotStorage::of(run, &handle)?;
    run.delete_and_wait(&snapshots, retained, Duration::from_secs(60))
        .await?;
    run.delete_and_wait(&contents, &content, Duration::from_secs(60))
        .await?;
    classes.delete(RETAIN_CLASS, &DeleteParams::default()).await?;
    if !storage.present()? {
        return Err(format!("deleting the Retain content {content} deleted snapshot {handle}").into());
    }

    let content = make_preprovisioned(run, name, &handle, "Delete", None).await?;
    wait_ready(
        run,
        name,
        &format!("unlabelled pre-provisioned VolumeSnapshot {name} ready to use"),
    )
    .await?;
    let label = managed_by(run, &content).await?;
    if label.as_deref() != Some(run.node.as_str()) {
        return Err(format!(
            "{name}: content {content} labelled managed-by={}, expected {}",
            label.as_deref().unwrap_or("(none)"),
            run.node
        )
        .into());
    }
    let log = run.daemon_log().await?;
    if !log
        .lines()
        .any(|l| l.contains("labelled pre-provisioned VolumeSnapshotContent") && l.contains(&content))
    {
        return Err(format!("{name}: the daemon's log does not say it labelled {content}").into());
    }
    expect_restore_size(run, name, size).await?;
    run.delete_and_wait(&snapshots, name, Duration::from_secs(60))
        .await?;
    delete_content_took_snapshot(run, &contents, &content, &storage, name, &handle).await?;
    Ok(format!(
        "NOTE s9: pre-provisioned content for {handle} made without a label: the daemon labelled it for {}, Delete deleted it",
        run.node
    ))
}

/// A VolumeSnapshotContent NAME-NAMESPACE made by hand for the snapshot `handle` with
/// deletionPolicy `policy`, and the VolumeSnapshot `name` bound to it; the content is
/// labelled managed-by `node`, or not at all. The content's name.
async fn make_preprovisioned(
    run: &Run,
    name: &str,
    handle: &str,
    policy: &str,
    node: Option<&str>,
) -> Result<String> {
    let content = format!("{name}-{}", run.namespace);
    let mut metadata = json!({"name": content});
    if let Some(node) = node {
        metadata["labels"] = json!({MANAGED_BY: node});
    }
    create(
        &run.volume_snapshot_contents(),
        json!({
            "apiVersion": format!("{SNAPSHOT_GROUP}/v1"),
            "kind": "VolumeSnapshotContent",
            "metadata": metadata,
            "spec": {
                "deletionPolicy": policy,
                "driver": DRIVER_NAME,
                "source": {"snapshotHandle": handle},
                "volumeSnapshotClassName": SNAPSHOT_CLASS,
                "volumeSnapshotRef": {"name": name, "namespace": run.namespace}
            }
        }),
    )
    .await?;
    create(
        &run.volume_snapshots(),
        json!({
            "apiVersion": format!("{SNAPSHOT_GROUP}/v1"),
            "kind": "VolumeSnapshot",
            "metadata": {"name": name},
            "spec": {
                "volumeSnapshotClassName": SNAPSHOT_CLASS,
                "source": {"volumeSnapshotContentName": content}
            }
        }),
    )
    .await?;
    Ok(content)
}

/// The sidecar deletes the snapshots' storage: a step that failed left VolumeSnapshots
/// behind (only the scenario's namespace holds any), so they go while it still runs.
async fn delete_snapshots(run: &Run) -> Result {
    run.volume_snapshots()
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    let contents = run.volume_snapshot_contents();
    run.wait_for(
        "no VolumeSnapshotContent left",
        Duration::from_secs(60),
        || async {
            Ok(contents
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
                .then_some(()))
        },
    )
    .await
}

/// The run's overlay with the csi-snapshotter component (tests/cluster/overlays/snapshots,
/// the loop class's), rolled out, its sidecar ready (scenario 11's too).
pub async fn snapshot_component_on(run: &Run) -> Result {
    run.apply_overlay(&test_overlay("snapshots")).await?;
    run.wait_for(
        "DaemonSet with the csi-snapshotter sidecar rolled out",
        Duration::from_secs(120),
        || async { Ok(run.daemon_ready().await?.then_some(())) },
    )
    .await?;
    snapshotter_ready(run).await
}

async fn snapshotter_ready(run: &Run) -> Result {
    run.wait_for(
        "csi-snapshotter sidecar ready",
        Duration::from_secs(30),
        || async { Ok(run.daemon_container_ready(SNAPSHOTTER).await?.then_some(())) },
    )
    .await
}

/// The run's own overlay again, the snapshots deleted first.
async fn back_to_own_overlay(run: &Run) -> Result {
    let snapshots_gone = delete_snapshots(run).await;
    snapshot_component_off(run).await?;
    snapshots_gone
}

/// The run's own overlay again, without the component's RBAC and snapshot classes (a
/// kustomize apply leaves what the other overlay added), rolled out.
pub async fn snapshot_component_off(run: &Run) -> Result {
    run.apply_overlay(run.own_overlay()?).await?;
    let rbac = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/components/csi-snapshotter/rbac.yaml");
    tool(
        "kubectl",
        &["delete", "--ignore-not-found", "-f", &rbac.to_string_lossy()],
        None,
    )
    .await?;
    let classes = run.volume_snapshot_classes();
    for class in [SNAPSHOT_CLASS, RETAIN_CLASS] {
        match classes.delete(class, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    run.wait_for(
        "DaemonSet back to the run's overlay",
        Duration::from_secs(120),
        || async { Ok(run.daemon_ready().await?.then_some(())) },
    )
    .await
}

/// A Delete content `content` of pre-provisioned snapshot `name` goes, and takes the
/// snapshot `handle` off the node.
async fn delete_content_took_snapshot(
    run: &Run,
    contents: &Api<DynamicObject>,
    content: &str,
    storage: &SnapshotStorage,
    name: &str,
    handle: &str,
) -> Result {
    run.gone(
        contents,
        content,
        &format!("pre-provisioned content {content} deleted"),
        Duration::from_secs(60),
    )
    .await?;
    if !storage.gone()? {
        return Err(format!(
            "{name}: snapshot {handle} left on the node after its Delete content went ({storage})"
        )
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copys_log_is_the_writers_lines_in_order() {
        assert_eq!(numbered_lines("line 1\nline 2\nline 3\n"), (3, true));
        assert_eq!(
            numbered_lines("line 1\nline 2"),
            (2, true),
            "no newline at the end"
        );
        assert_eq!(numbered_lines("line 1\nline 3\n"), (2, false), "a line missing");
        assert_eq!(
            numbered_lines("line 1\nline 2line 3\n"),
            (2, false),
            "a torn line"
        );
        assert_eq!(numbered_lines("line 1\nli"), (2, false), "a cut line");
    }

    #[test]
    fn a_restore_asks_for_twice_the_source() {
        assert_eq!(doubled("64Mi").unwrap(), "128Mi");
        assert_eq!(doubled("320Mi").unwrap(), "640Mi");
        assert!(doubled("1Gi").is_err());
    }
}
