//! Scenario 15: storage that fails under a running pod is seen where users look, under
//! the node's real kubelet (CSIVolumeHealth on): a Warning on the claim, kubelet's own
//! volume health metric and localvol's, from the NodeGetVolumeStats kubelet asks of
//! each published volume every minute. The failure is the class's own:
//! - loop (the host's cluster): the volume's image deleted under its device. The volume
//!   is then still deleted cleanly.
//! - lvm-thin (the guest's): the thin pool filled past its critical fill by the pod's
//!   writes. The class's storage is critical too (a Warning on the Node, its metric),
//!   and healthy again once the claim is deleted.
//!
//! Cost: about 60 to 70 s of waiting for kubelet's next volume stats, plus a claim and
//! a pod (about 90 s on the host's cluster); lvm-thin adds the pod's writes of 1.9 GiB
//! and the pool's next report after the deletion.

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

use crate::node;
use crate::run::{Result, Run, series_value};

const CLAIM: &str = "health";
const MIB: u64 = 1 << 20;

/// The failure of the run's class kind under a running pod, seen where users look.
pub async fn storage_failed(run: Run) -> Result {
    match run.class_kind.as_str() {
        "loop" => loop_image_deleted(run).await,
        "lvm-thin" => thin_pool_filled(run).await,
        other => Err(format!(
            "scenario 15 fails a loop or an lvm-thin class's storage; class kind {other} is neither \
             (tests/plan.yaml says where it runs)"
        )
        .into()),
    }
}

/// The loop class's image of the volume deleted under its device.
async fn loop_image_deleted(run: Run) -> Result {
    run.claim(CLAIM).await?;
    run.pod_with("app", CLAIM).await?;
    let (pv, id) = run.volume_of(CLAIM).await?;
    let token = id.split_once('.').ok_or("a volume id of class.token")?.1;
    let image = run.loop_dir.join(format!("{token}.img"));
    std::fs::remove_file(&image).map_err(|e| format!("deleting {}: {e}", image.display()))?;
    run.note(&format!("deleted {} under the running pod", image.display()));
    seen_abnormal(
        &run,
        &id,
        &[
            &format!("volume {id} is abnormal: its image "),
            "was deleted while",
        ],
    )
    .await?;

    // Its data is lost, but the volume still goes whole: unstaged from the device
    // that held the deleted image, deleted, and its series with it.
    run.delete_pod_and_claim("app", CLAIM, &pv).await?;
    series_gone(&run, &id).await
}

/// The class's default critical fill of a thin pool (deploy/overlays/lvm-thin sets no
/// `critical-percent`; src/config/file.rs, `PoolThresholds`).
const CRITICAL_PERCENT: f64 = 95.0;

/// The thin pool filled by the pod's writes to 97 %: past the critical fill, short of
/// full (a full pool queues the writes of every volume in it for a minute and then
/// fails them, and the node's other scenarios share the pool).
async fn thin_pool_filled(run: Run) -> Result {
    let pool = format!("{}/{}", run.lvm_vg, run.thin_pool);
    let pool_bytes = node::pool_bytes(&run)?;
    // Larger than the pool: the class overprovisions, and the writes must not fill the
    // filesystem first.
    let mut shape = run.claim_shape();
    shape.size = format!("{}Mi", pool_bytes * 3 / 2 / MIB);
    run.create_claim(CLAIM, &shape).await?;
    run.pod_with("app", CLAIM).await?;
    let (pv, id) = run.volume_of(CLAIM).await?;
    let before = node::pool_data_percent(&run)?;
    let mib = ((97.0 - before) / 100.0 * pool_bytes as f64 / MIB as f64).ceil() as u64;
    run.exec(
        "app",
        &format!("dd if=/dev/zero of=/data/fill bs=1M count={mib} conv=fsync 2>&1"),
    )
    .await?;
    let after = node::pool_data_percent(&run)?;
    if !(CRITICAL_PERCENT..100.0).contains(&after) {
        return Err(format!(
            "{pool} is {after}% full after the pod's {mib} MiB (from {before}%): not past the critical \
             {CRITICAL_PERCENT}% and short of full"
        )
        .into());
    }
    run.note(&format!(
        "the pod wrote {mib} MiB: {pool} from {before}% to {after}% full"
    ));
    let problem = format!("thin pool {pool}: data ");
    let limit = format!("(critical at {CRITICAL_PERCENT}%)");
    seen_abnormal(
        &run,
        &id,
        &[&format!("volume {id} is abnormal: {problem}"), &limit],
    )
    .await?;

    // The class's storage: critical on the Node and in localvol's metric.
    let critical = storage_event(&run, "DeviceClassStorageCritical", "Warning", &problem, None).await?;
    storage_status(&run, "critical").await?;

    // The cause gone (the claim, its LV with it): healthy again at the pool's next
    // report, told on the Node after the critical event.
    run.delete_pod_and_claim("app", CLAIM, &pv).await?;
    series_gone(&run, &id).await?;
    storage_event(
        &run,
        "DeviceClassStorageHealthy",
        "Normal",
        "",
        last_seen(&critical),
    )
    .await?;
    storage_status(&run, "healthy").await
}

/// The volume `id` of the run's claim seen abnormal where users look, within kubelet's
/// next volume stats (volumeStatsAggPeriod: a minute): a Warning on the claim whose
/// note holds each of `note_holds`, kubelet's metric and localvol's.
async fn seen_abnormal(run: &Run, id: &str, note_holds: &[&str]) -> Result {
    let event = run
        .wait_for(
            "a VolumeConditionAbnormal event on the claim",
            Duration::from_secs(150),
            || async {
                let events = run.claim_events(CLAIM).await?;
                Ok(events
                    .into_iter()
                    .find(|e| e.reason.as_deref() == Some("VolumeConditionAbnormal")))
            },
        )
        .await?;
    let note = event.note.clone().unwrap_or_default();
    if event.type_.as_deref() != Some("Warning")
        || event.reporting_controller.as_deref() != Some("localvol.csi.dev")
        || !note_holds.iter().all(|part| note.contains(part))
    {
        return Err(format!("the claim's event (its note to hold {note_holds:?}): {event:?}").into());
    }
    run.note(&format!("event: {note}"));

    let claim = [
        ("namespace", run.namespace.as_str()),
        ("persistentvolumeclaim", CLAIM),
    ];
    run.wait_for(
        "kubelet_volume_stats_health_status_abnormal 1 for the claim",
        Duration::from_secs(90),
        || async {
            let text = run.kubelet_metrics().await?;
            let value = series_value(&text, "kubelet_volume_stats_health_status_abnormal", &claim);
            Ok((value == Some(1.0)).then_some(()))
        },
    )
    .await?;
    let text = run.driver_metrics().await?;
    let abnormal = [claim[0], claim[1], ("status", "abnormal"), ("volume_id", id)];
    match series_value(&text, "localvol_volume_health", &abnormal) {
        Some(1.0) => Ok(()),
        other => Err(format!("localvol_volume_health abnormal: {other:?}").into()),
    }
}

/// After the volume's deletion, localvol_volume_health has no series of it.
async fn series_gone(run: &Run, id: &str) -> Result {
    let text = run.driver_metrics().await?;
    if series_value(&text, "localvol_volume_health", &[("volume_id", id)]).is_some() {
        return Err(format!("localvol_volume_health still has {id} after its deletion").into());
    }
    Ok(())
}

/// The newest event `reason` on the Node about the run's device class, last seen after
/// `after` (when given), within the class's next two stats refreshes; an error unless it
/// is of `type_` with a note holding `holds`.
async fn storage_event(
    run: &Run,
    reason: &str,
    type_: &str,
    holds: &str,
    after: Option<MicroTime>,
) -> Result<Event> {
    let of_class = format!("device class {}'s storage", run.device_class);
    let event = run
        .wait_for(
            &format!("a {reason} event on the Node"),
            Duration::from_secs(150),
            || async {
                let events = run.node_events().await?;
                Ok(events.into_iter().rev().find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.note.as_deref().is_some_and(|n| n.contains(&of_class))
                        && (after.is_none() || last_seen(e) > after)
                }))
            },
        )
        .await?;
    let note = event.note.clone().unwrap_or_default();
    if event.type_.as_deref() != Some(type_) || !note.contains(holds) {
        return Err(
            format!("the Node's {reason} event (a {type_}, its note to hold {holds:?}): {event:?}").into(),
        );
    }
    run.note(&format!("Node event {reason}: {note}"));
    Ok(event)
}

/// When an event was last seen: its series' last observation (the recorder counts a
/// repeat there), else its own time.
fn last_seen(event: &Event) -> Option<MicroTime> {
    event
        .series
        .as_ref()
        .map(|s| s.last_observed_time.clone())
        .or_else(|| event.event_time.clone())
}

/// localvol_storage_health of the run's device class is 1 for `status`.
async fn storage_status(run: &Run, status: &str) -> Result {
    let text = run.driver_metrics().await?;
    let series = [("device_class", run.device_class.as_str()), ("status", status)];
    match series_value(&text, "localvol_storage_health", &series) {
        Some(1.0) => Ok(()),
        other => Err(format!("localvol_storage_health {series:?}: {other:?}").into()),
    }
}
