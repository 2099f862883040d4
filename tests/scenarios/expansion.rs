//! Scenario 4: online expansion of a mounted claim, first by localvol's --node-resizer
//! (the shipped default), then by a central csi-resizer Deployment
//! (deploy/components/csi-resizer, through the overlay S4_CENTRAL_OVERLAY names); each
//! time the pod sees the new size and the claim's status ends as on any real cluster
//! (capacity and allocatedResources at the request, no allocatedResourceStatuses, no
//! conditions), and a request the class cannot hold ends ControllerResizeInfeasible and
//! is not retried. The filesystem is S4_FSTYPE: xfs on the host, where root lacks the
//! CAP_SYS_RESOURCE resize2fs needs on a mounted ext4; the guest's classes grow their
//! own (tests/vm/cluster-guest.sh), and leave the central half to the host (an empty
//! S4_CENTRAL_OVERLAY: a note says so). On pmem direct, whose namespaces cannot grow in
//! place, localvol's refusal instead.
//!
//! Cost: two claims grown and refused, 20 s of watching for retries after each refusal,
//! and two rollouts of the DaemonSet (about 2 minutes on the host's cluster).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimStatus, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::DeleteParams;
use kube::{Api, Resource};
use localvol::resize::claim_status::CONTROLLER_RESIZE_INFEASIBLE;
use serde::de::DeserializeOwned;

use crate::node::{self, Backing, Volume};
use crate::run::{ClaimShape, Result, Run, SYSTEM_NAMESPACE};

/// A claim's size as made and as grown (xfs needs 300 MB at mkfs: tests/vm/README.md).
const MADE: &str = "320Mi";
const GROWN: &str = "640Mi";
const GROWN_BYTES: u64 = 640 << 20;
/// More than the classes' capacity (100 GB): a request no resizer can meet.
const TOO_BIG: &str = "200Gi";
/// How long a refused request is watched for retries; not scaled: a retry comes on the
/// resizer's own clock, not the node's.
const QUIET: Duration = Duration::from_secs(20);
/// What deploy/components/csi-resizer adds, and the run's own overlay lacks.
const RESIZER: &str = "localvol-resizer";
const RESIZER_LEADER: &str = "localvol-resizer-leader";

/// The scenario's facts beyond the run's, from its shell entry
/// (tests/cluster/scenarios/s4_expansion.sh).
struct Facts {
    /// The filesystem the claims are made with and grown.
    fstype: String,
    /// The overlay with the central csi-resizer; `None`: --node-resizer only.
    central_overlay: Option<PathBuf>,
}

impl Facts {
    fn from_env() -> Result<Self> {
        let fstype = std::env::var("S4_FSTYPE")
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or("S4_FSTYPE must name the filesystem to grow (the scenario's shell entry sets it)")?;
        let central_overlay = std::env::var_os("S4_CENTRAL_OVERLAY")
            .ok_or("S4_CENTRAL_OVERLAY must name the central csi-resizer overlay, or be empty for none (the scenario's shell entry sets it)")?;
        Ok(Self {
            fstype,
            central_overlay: Some(PathBuf::from(central_overlay)).filter(|p| !p.as_os_str().is_empty()),
        })
    }
}

pub async fn grows_online(run: Run) -> Result {
    let facts = Facts::from_env()?;
    if run.class_kind == "pmem" {
        return refused(&run).await;
    }
    if facts.fstype == "xfs" {
        let status = std::fs::read_to_string("/proc/self/status")?;
        if has_sys_resource(&status) == Some(false) {
            run.note(
                "NOTE s4: ext4 is not grown online here: root lacks CAP_SYS_RESOURCE on this machine, which resize2fs needs on a mounted ext4; xfs is used",
            );
        }
    }
    let class = format!("lvtest-{}", facts.fstype);
    // The scenario's cleanup deletes it (main.rs).
    run.create_storage_class(&run.storage_class(&class, &facts.fstype, true)?)
        .await?;
    grow_by_both(&run, &facts, &class).await
}

async fn grow_by_both(run: &Run, facts: &Facts, class: &str) -> Result {
    let grown = grow(run, facts, class, "node-resizer").await?;
    infeasible(run, "node-resizer", &grown).await?;

    let Some(central) = &facts.central_overlay else {
        run.note(&format!(
            "NOTE s4: no central csi-resizer overlay for class {}: --node-resizer only",
            run.device_class
        ));
        return Ok(());
    };
    // Back to the run's overlay even when a step fails, so later scenarios see it.
    let outcome = grow_by_central_resizer(run, facts, class, central).await;
    let restored = restore(run).await;
    outcome.and(restored)
}

async fn grow_by_central_resizer(run: &Run, facts: &Facts, class: &str, overlay: &Path) -> Result {
    run.apply_overlay(overlay).await?;
    run.wait_for(
        "DaemonSet without --node-resizer rolled out",
        Duration::from_secs(120),
        || async { Ok(run.daemon_ready().await?.then_some(())) },
    )
    .await?;
    let deployments = Api::<Deployment>::namespaced(run.client.clone(), SYSTEM_NAMESPACE);
    run.wait_for(
        "csi-resizer Deployment available",
        Duration::from_secs(90),
        || async { Ok(deployments.get_opt(RESIZER).await?.filter(rolled_out).map(|_| ())) },
    )
    .await?;
    let args = run.daemon_args().await?;
    if args.iter().any(|a| a.contains("node-resizer")) {
        return Err(format!("the central-resizer component left --node-resizer on: {args:?}").into());
    }
    let grown = grow(run, facts, class, "csi-resizer").await?;
    infeasible(run, "csi-resizer", &grown).await
}

/// The run's overlay again, and the central resizer's objects, which it does not name,
/// gone.
async fn restore(run: &Run) -> Result {
    run.apply_overlay(run.own_overlay()?).await?;
    let client = || run.client.clone();
    delete_if_present(Api::<Deployment>::namespaced(client(), SYSTEM_NAMESPACE), RESIZER).await?;
    delete_if_present(
        Api::<ServiceAccount>::namespaced(client(), SYSTEM_NAMESPACE),
        RESIZER,
    )
    .await?;
    delete_if_present(
        Api::<Role>::namespaced(client(), SYSTEM_NAMESPACE),
        RESIZER_LEADER,
    )
    .await?;
    delete_if_present(
        Api::<RoleBinding>::namespaced(client(), SYSTEM_NAMESPACE),
        RESIZER_LEADER,
    )
    .await?;
    delete_if_present(Api::<ClusterRole>::all(client()), RESIZER).await?;
    delete_if_present(Api::<ClusterRoleBinding>::all(client()), RESIZER).await?;
    let registration = std::env::var("REGISTRATION").unwrap_or_else(|_| "builtin".into());
    run.wait_for(
        &format!("DaemonSet back to the {registration} overlay"),
        Duration::from_secs(120),
        || async { Ok(run.daemon_ready().await?.then_some(())) },
    )
    .await
}

/// A claim grown by `resizer` (its claim `grow-RESIZER`, its pod `app-RESIZER`).
struct Grown {
    claim: String,
    pod: String,
    pv: String,
    backing: Backing,
}

/// A claim of `class` made, mounted by a pod that writes to it, and grown while
/// mounted: the claim settles at the new size, the volume on the node and its PV hold
/// it, the pod sees the grown filesystem and its data.
async fn grow(run: &Run, facts: &Facts, class: &str, resizer: &str) -> Result<Grown> {
    let (claim, pod) = (format!("grow-{resizer}"), format!("app-{resizer}"));
    run.create_claim(&claim, &sized(run, MADE, class)).await?;
    run.pod_with(&pod, &claim).await?;
    let Volume { pv, backing, .. } = Volume::of_claim(run, &claim).await?;
    let fstype = pod_fstype(run, &pod).await?;
    if fstype != facts.fstype {
        return Err(format!("/data in pod {pod} is {fstype}, not {}", facts.fstype).into());
    }
    run.exec(&pod, "echo before-resize > /data/f && sync").await?;
    let before = pod_fs_bytes(run, &pod).await?;

    run.resize_claim(&claim, GROWN).await?;
    let claims = run.claims();
    run.wait_for(
        &format!("claim settled at {GROWN} ({resizer})"),
        Duration::from_secs(120),
        || async { Ok(settled_at(&claims.get(&claim).await?, GROWN).then_some(())) },
    )
    .await?;
    run.wait_for(
        &format!("{backing} grown to {GROWN} ({resizer})"),
        Duration::from_secs(30),
        || async { Ok((backing.bytes()? >= GROWN_BYTES).then_some(())) },
    )
    .await?;
    let pv_spec = run.volumes().get(&pv).await?.spec.unwrap_or_default();
    let capacity = storage(pv_spec.capacity.as_ref());
    if capacity != Some(GROWN) {
        return Err(format!("PV {pv} capacity {capacity:?}, not {GROWN}").into());
    }
    let seen = run
        .wait_for(
            &format!("the pod sees the grown filesystem ({resizer})"),
            Duration::from_secs(60),
            || async {
                let now = pod_fs_bytes(run, &pod).await?;
                Ok((now > before + (200 << 20)).then_some(now))
            },
        )
        .await;
    let seen = match seen {
        Ok(seen) => seen,
        Err(e) => {
            return Err(format!(
                "{e}; {}",
                not_grown(run, facts, &pod, &pv, &backing, before).await
            )
            .into());
        }
    };
    let data = run.exec(&pod, "cat /data/f").await?;
    if data.trim() != "before-resize" {
        return Err(format!("data lost in the resize: {data:?}").into());
    }
    run.note(&format!(
        "NOTE s4: {resizer}: {} seen by the pod {} MiB -> {} MiB",
        facts.fstype,
        before >> 20,
        seen >> 20
    ));
    Ok(Grown {
        claim,
        pod,
        pv,
        backing,
    })
}

/// What the pod and the node see of a volume that did not grow in the pod: the pod's
/// size of /data, the device's size, its mounts on the node and, at the first one, the
/// filesystem's own view of its size.
async fn not_grown(run: &Run, facts: &Facts, pod: &str, pv: &str, backing: &Backing, before: u64) -> String {
    let now = match pod_fs_bytes(run, pod).await {
        Ok(now) => now.to_string(),
        Err(e) => format!("({e})"),
    };
    let mut seen = format!("the pod sees {now} bytes at /data (before: {before})");
    let device = match backing.device() {
        Ok(Some(device)) => device,
        other => return format!("{seen}; no device of {backing}: {other:?}"),
    };
    let tool = |program: &str, args: &[&str]| {
        localvol_testkit::guest::try_sh(program, args).unwrap_or_else(|e| format!("({program}: {e})"))
    };
    let dev = device.to_string_lossy();
    seen += &format!(
        "; {dev} holds {} bytes; its mounts here:",
        tool("blockdev", &["--getsize64", &dev]).trim()
    );
    let mounts = node::mounts_of(pv, Some(&device)).unwrap_or_else(|e| vec![format!("({e})")]);
    for line in &mounts {
        seen += &format!("\n  {line}");
    }
    if let Some(point) = mounts.first().and_then(|l| l.split(' ').nth(4)) {
        seen += &format!("\n{}", tool("df", &["-B1", point]));
        seen += &if facts.fstype == "xfs" {
            tool("xfs_info", &[point])
        } else {
            tool("dumpe2fs", &["-h", &dev])
                .lines()
                .filter(|l| {
                    let l = l.to_ascii_lowercase();
                    l.starts_with("block count") || l.starts_with("block size")
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
    }
    seen
}

/// A request the class cannot hold, on the grown claim: the claim ends
/// ControllerResizeInfeasible and stays so, with at most one more failure event in
/// [`QUIET`] (not retried), its capacity unchanged; then the claim and its volume go.
async fn infeasible(run: &Run, resizer: &str, grown: &Grown) -> Result {
    let claim = &grown.claim;
    run.resize_claim(claim, TOO_BIG).await?;
    marked_infeasible(run, claim, &format!(" ({resizer})")).await?;
    let (events_before, events_after) = failure_events_over_quiet(run, claim).await?;
    let status = run.claims().get(claim).await?.status.unwrap_or_default();
    if resize_status(&status) != Some(CONTROLLER_RESIZE_INFEASIBLE) {
        return Err(format!("infeasible status did not stay ({resizer}): {status:?}").into());
    }
    if events_after > events_before + 1 {
        return Err(format!(
            "resize retried after an infeasible request ({resizer}): failure events {events_before} -> {events_after} in {} s",
            QUIET.as_secs()
        )
        .into());
    }
    let capacity = storage(status.capacity.as_ref());
    if capacity != Some(GROWN) {
        return Err(format!("capacity moved on an infeasible request: {capacity:?}, not {GROWN}").into());
    }
    let conditions: Vec<&str> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.as_str())
        .collect();
    run.note(&format!(
        "NOTE s4: {resizer}: infeasible request: {}, failure events {events_before} -> {events_after} in {} s",
        conditions.join(" "),
        QUIET.as_secs()
    ));
    run.delete_pod_and_claim(&grown.pod, claim, &grown.pv).await?;
    if !grown.backing.gone()? {
        return Err(format!("{} left", grown.backing).into());
    }
    Ok(())
}

/// Waits for the claim's resize status to be ControllerResizeInfeasible.
async fn marked_infeasible(run: &Run, claim: &str, what: &str) -> Result {
    let claims = run.claims();
    run.wait_for(
        &format!("claim marked {CONTROLLER_RESIZE_INFEASIBLE}{what}"),
        Duration::from_secs(90),
        || async {
            let status = claims.get(claim).await?.status.unwrap_or_default();
            Ok((resize_status(&status) == Some(CONTROLLER_RESIZE_INFEASIBLE)).then_some(()))
        },
    )
    .await
}

/// The claim's failure events (Warnings, with their repeats) now and [`QUIET`] later:
/// more than one more is a retry.
async fn failure_events_over_quiet(run: &Run, claim: &str) -> Result<(u64, u64)> {
    let before = warnings(&run.claim_events(claim).await?);
    tokio::time::sleep(QUIET).await;
    let after = warnings(&run.claim_events(claim).await?);
    Ok((before, after))
}

/// pmem direct: a namespace cannot grow in place (docs/backends.md), and the shipped
/// StorageClass says so up front (allowVolumeExpansion: false, which the API server
/// enforces). A class that allows expansion anyway gets localvol's own refusal: the
/// claim ends ControllerResizeInfeasible with the reason in a Warning event, nothing
/// retried, nothing changed, the pod's data intact.
async fn refused(run: &Run) -> Result {
    let class = "lvtest-s4-pmem";
    run.create_storage_class(&run.storage_class(class, &run.fstype, true)?)
        .await?;
    refused_on(run, class).await
}

async fn refused_on(run: &Run, class: &str) -> Result {
    let (claim, pod) = ("grow", "app");
    run.create_claim(claim, &sized(run, &run.fs_size, class)).await?;
    run.pod_with(pod, claim).await?;
    let Volume { pv, backing, .. } = Volume::of_claim(run, claim).await?;
    run.exec(pod, "echo before-refusal > /data/f && sync").await?;
    let capacity_of = |claim: PersistentVolumeClaim| {
        storage(claim.status.unwrap_or_default().capacity.as_ref()).map(str::to_string)
    };
    let capacity = capacity_of(run.claims().get(claim).await?);
    let bytes = backing.bytes()?;

    run.resize_claim(claim, "128Mi").await?;
    marked_infeasible(run, claim, "").await?;
    let reasons: Vec<String> = run
        .claim_events(claim)
        .await?
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter_map(|e| e.note)
        .collect();
    let Some(reason) = reasons.iter().find_map(|n| cannot_grow_sentence(n)) else {
        return Err(format!("no Warning event gives the reason: {reasons:?}").into());
    };
    let (events_before, events_after) = failure_events_over_quiet(run, claim).await?;
    if events_after > events_before + 1 {
        return Err(format!(
            "resize retried after the refusal: failure events {events_before} -> {events_after} in {} s",
            QUIET.as_secs()
        )
        .into());
    }
    let now = capacity_of(run.claims().get(claim).await?);
    if now != capacity {
        return Err(format!("capacity moved on a refused growth: {capacity:?} -> {now:?}").into());
    }
    if backing.bytes()? != bytes {
        return Err(format!("{backing} changed size on a refused growth").into());
    }
    let data = run.exec(pod, "cat /data/f").await?;
    if data.trim() != "before-refusal" {
        return Err(format!("data lost after the refusal: {data:?}").into());
    }
    run.note(&format!("NOTE s4: pmem direct: growth refused: {reason}"));
    run.delete_pod_and_claim(pod, claim, &pv).await?;
    if !backing.gone()? {
        return Err(format!("{backing} left").into());
    }
    Ok(())
}

/// The claim's resize state when nothing is in progress: capacity and allocatedResources
/// at `size`, no allocatedResourceStatuses, no conditions.
fn settled_at(claim: &PersistentVolumeClaim, size: &str) -> bool {
    let Some(status) = &claim.status else {
        return false;
    };
    storage(status.capacity.as_ref()) == Some(size)
        && storage(status.allocated_resources.as_ref()) == Some(size)
        && status
            .allocated_resource_statuses
            .as_ref()
            .is_none_or(|m| m.is_empty())
        && status.conditions.as_ref().is_none_or(|c| c.is_empty())
}

/// The storage of a capacity or allocatedResources map.
fn storage(resources: Option<&BTreeMap<String, Quantity>>) -> Option<&str> {
    resources?.get("storage").map(|q| q.0.as_str())
}

/// `status.allocatedResourceStatuses["storage"]`.
fn resize_status(status: &PersistentVolumeClaimStatus) -> Option<&str> {
    status
        .allocated_resource_statuses
        .as_ref()?
        .get("storage")
        .map(String::as_str)
}

/// The Warning events among `events`, each with its repeats (an event's series count,
/// or the count core/v1 kept, whichever is more).
fn warnings(events: &[Event]) -> u64 {
    events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| {
            let series = e.series.as_ref().map_or(1, |s| s.count);
            let count = e.deprecated_count.unwrap_or(1);
            u64::try_from(series.max(count).max(1)).unwrap_or(1)
        })
        .sum()
}

/// The sentence of an event's note that says the volume cannot grow in place.
fn cannot_grow_sentence(note: &str) -> Option<&str> {
    note.split('.')
        .map(str::trim)
        .find(|s| s.contains("cannot grow in place"))
}

/// The size of /data as pod `pod` sees it, in bytes.
async fn pod_fs_bytes(run: &Run, pod: &str) -> Result<u64> {
    Ok(run.filesystem_kib(pod).await? * 1024)
}

/// Whether CAP_SYS_RESOURCE (bit 24) is among the effective capabilities of a
/// /proc/PID/status; `None` without a CapEff line.
fn has_sys_resource(status: &str) -> Option<bool> {
    let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    let eff = u64::from_str_radix(eff, 16).ok()?;
    Some(eff >> 24 & 1 == 1)
}

/// The API's answer to `kubectl rollout status deploy/NAME`: the newest generation
/// seen, every replica updated and available, none of an older one left.
fn rolled_out(deployment: &Deployment) -> bool {
    let wanted = deployment.spec.replicas.unwrap_or(1);
    let Some(status) = &deployment.status else {
        return false;
    };
    status.observed_generation >= deployment.metadata.generation
        && status.updated_replicas == Some(wanted)
        && status.replicas == Some(wanted)
        && status.available_replicas == Some(wanted)
}

/// Deletes `name` through `api`; already gone is fine.
async fn delete_if_present<K>(api: Api<K>, name: &str) -> Result
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(format!("deleting {name}: {e}").into()),
    }
}

/// A claim of the run's shape, of `size` and StorageClass `class`.
fn sized(run: &Run, size: &str, class: &str) -> ClaimShape {
    ClaimShape {
        size: size.into(),
        class: class.into(),
        ..run.claim_shape()
    }
}

/// The type of the filesystem pod `pod` has at /data (the topmost mount there).
async fn pod_fstype(run: &Run, pod: &str) -> Result<String> {
    let mountinfo = run.exec(pod, "cat /proc/self/mountinfo").await?;
    node::mount_at(&mountinfo, "/data")
        .map(|m| m.fstype)
        .ok_or_else(|| format!("no mount at /data in pod {pod}").into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(status: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "c"}, "status": status})).unwrap()
    }

    #[test]
    fn a_claim_is_settled_with_nothing_in_progress() {
        let settled = json!({"capacity": {"storage": "640Mi"}, "allocatedResources": {"storage": "640Mi"}});
        assert!(settled_at(&claim(settled.clone()), "640Mi"));
        assert!(!settled_at(&claim(settled), "320Mi"), "another size");
        let pending = json!({
            "capacity": {"storage": "640Mi"}, "allocatedResources": {"storage": "640Mi"},
            "allocatedResourceStatuses": {"storage": "NodeResizePending"}
        });
        assert!(!settled_at(&claim(pending), "640Mi"));
        let conditions = json!({
            "capacity": {"storage": "640Mi"}, "allocatedResources": {"storage": "640Mi"},
            "conditions": [{"type": "FileSystemResizePending", "status": "True"}]
        });
        assert!(!settled_at(&claim(conditions), "640Mi"));
        let behind = json!({"capacity": {"storage": "320Mi"}, "allocatedResources": {"storage": "640Mi"}});
        assert!(!settled_at(&claim(behind), "640Mi"));
    }

    #[test]
    fn warnings_count_their_repeats() {
        let event = |v: serde_json::Value| -> Event { serde_json::from_value(v).unwrap() };
        let time = "2026-01-01T00:00:00.000000Z";
        let events = [
            event(json!({"eventTime": time, "type": "Warning", "deprecatedCount": 3})),
            event(
                json!({"eventTime": time, "type": "Warning", "series": {"count": 5, "lastObservedTime": time}}),
            ),
            event(json!({"eventTime": time, "type": "Warning"})),
            event(json!({"eventTime": time, "type": "Normal", "deprecatedCount": 7})),
        ];
        assert_eq!(warnings(&events), 3 + 5 + 1);
    }

    #[test]
    fn sys_resource_is_bit_24_of_capeff() {
        assert_eq!(
            has_sys_resource("Name:\tx\nCapEff:\t000001ffffffffff\n"),
            Some(true)
        );
        assert_eq!(has_sys_resource("CapEff:\t00000000a80425fb\n"), Some(false));
        assert_eq!(has_sys_resource("Name:\tx\n"), None);
    }

    #[test]
    fn the_refusals_sentence_is_found() {
        // As the sidecar words it around the daemon's error (src/backend/pmem/mod.rs).
        let note = "resize volume pmem.pvc-1 failed: volume pvc-1 is an fsdax namespace of 67108864 bytes, \
                    and a namespace cannot grow in place (134217728 bytes requested). Nothing changed";
        assert_eq!(
            cannot_grow_sentence(note),
            Some(
                "pvc-1 failed: volume pvc-1 is an fsdax namespace of 67108864 bytes, \
                 and a namespace cannot grow in place (134217728 bytes requested)"
            )
        );
        assert_eq!(cannot_grow_sentence("other"), None);
    }

    #[test]
    fn a_deployment_is_rolled_out_when_every_replica_is_new_and_available() {
        let deployment = |status: serde_json::Value| -> Deployment {
            serde_json::from_value(json!({
                "metadata": {"name": "d", "generation": 2},
                "spec": {"replicas": 1, "selector": {}, "template": {}},
                "status": status
            }))
            .unwrap()
        };
        let done =
            json!({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1});
        assert!(rolled_out(&deployment(done)));
        let old =
            json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1});
        assert!(!rolled_out(&deployment(old)), "an older generation seen");
        let starting = json!({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1});
        assert!(!rolled_out(&deployment(starting)), "not available yet");
    }
}
