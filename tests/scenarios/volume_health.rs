//! Scenario 15: storage that fails under a running pod is seen where users look, under
//! the node's real kubelet (CSIVolumeHealth on): a Warning on the claim, kubelet's own
//! volume health metric and localvol's, from the NodeGetVolumeStats kubelet asks of
//! each published volume every minute. The failure: the loop class's image of the
//! volume deleted under its device. The volume is then still deleted cleanly.
//!
//! Cost: about 60 to 70 s of waiting for kubelet's next volume stats, plus a claim and
//! a pod (about 90 s on the host's cluster).

use std::time::Duration;

use crate::run::{Result, Run, series_value};

const CLAIM: &str = "health";

pub async fn loop_image_deleted(run: Run) -> Result {
    if run.class_kind != "loop" {
        return Err(format!(
            "scenario 15 deletes a loop volume's image; class kind {} is not one (tests/plan.yaml says where it runs)",
            run.class_kind
        )
        .into());
    }
    run.claim(CLAIM).await?;
    run.pod_with("app", CLAIM).await?;
    let (pv, id) = run.volume_of(CLAIM).await?;
    let token = id.split_once('.').ok_or("a volume id of class.token")?.1;
    let image = run.loop_dir.join(format!("{token}.img"));
    std::fs::remove_file(&image).map_err(|e| format!("deleting {}: {e}", image.display()))?;
    run.note(&format!("deleted {} under the running pod", image.display()));

    // kubelet's next volume stats (volumeStatsAggPeriod: a minute).
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
        || !note.contains(&format!("volume {id} is abnormal: its image "))
        || !note.contains("was deleted while")
    {
        return Err(format!("the claim's event: {event:?}").into());
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
    let abnormal = [
        claim[0],
        claim[1],
        ("status", "abnormal"),
        ("volume_id", id.as_str()),
    ];
    match series_value(&text, "localvol_volume_health", &abnormal) {
        Some(1.0) => {}
        other => return Err(format!("localvol_volume_health abnormal: {other:?}").into()),
    }

    // Its data is lost, but the volume still goes whole: unstaged from the device
    // that held the deleted image, deleted, and its series with it.
    run.delete_pod_and_claim("app", CLAIM, &pv).await?;
    let text = run.driver_metrics().await?;
    if series_value(&text, "localvol_volume_health", &[("volume_id", id.as_str())]).is_some() {
        return Err(format!("localvol_volume_health still has {id} after its deletion").into());
    }
    Ok(())
}
