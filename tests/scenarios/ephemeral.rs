//! Scenario 3: a generic ephemeral volume follows its pod; a second pod naming that
//! pod's claim as a plain claim never starts: localvol's FAILED_PRECONDITION surfaces as
//! kubelet's FailedMount on the intruder, and localvol's Warning event is on the claim.
//!
//! Cost: two pods and a claim (about 15 s on the host's cluster; the intruder's refusal
//! waits for kubelet's first mount attempt).

use std::time::Duration;

use crate::node::Volume;
use crate::run::{IDLE, PodVolume, Result, Run};

const OWNER: &str = "owner";
const INTRUDER: &str = "intruder";
/// The claim Kubernetes makes for the owner's volume: POD-VOLUME (a test pod's volume is
/// `vol`, Run::create_pod).
const CLAIM: &str = "owner-vol";

pub async fn claim_follows_its_pod(run: Run) -> Result {
    let ephemeral = PodVolume::Ephemeral {
        class: &run.storage_class,
        size: &run.fs_size,
    };
    run.create_pod(
        OWNER,
        &ephemeral,
        "/scratch",
        &format!("echo mine > /scratch/f; {IDLE}"),
    )
    .await?;
    run.pods_running(&[OWNER], Duration::from_secs(90)).await?;
    let owners = run
        .claims()
        .get(CLAIM)
        .await?
        .metadata
        .owner_references
        .unwrap_or_default();
    if !owners
        .iter()
        .any(|o| o.kind == "Pod" && o.name == OWNER && o.controller == Some(true))
    {
        return Err(format!("claim {CLAIM} not controlled by pod {OWNER}: {owners:?}").into());
    }
    let volume = Volume::of_claim(&run, CLAIM).await?;
    volume.expect_class_device(&run)?;
    volume.expect_mounted(&run, 2)?;
    let data = run.exec(OWNER, "cat /scratch/f").await?;
    if data.trim_end() != "mine" {
        return Err(format!("ephemeral volume data: {data:?}").into());
    }

    run.create_pod(INTRUDER, &PodVolume::Filesystem(CLAIM), "/data", IDLE)
        .await?;
    let refusal = run
        .wait_for(
            "FailedMount event on the intruder pod with FailedPrecondition",
            Duration::from_secs(90),
            || async {
                Ok(run.pod_events(INTRUDER).await?.into_iter().find_map(|e| {
                    let note = e.note.unwrap_or_default();
                    (e.reason.as_deref() == Some("FailedMount") && note.contains("FailedPrecondition"))
                        .then_some(note)
                }))
            },
        )
        .await?;
    run.wait_for(
        &format!("localvol's Warning event on claim {CLAIM}"),
        Duration::from_secs(30),
        || async {
            Ok(run.claim_events(CLAIM).await?.into_iter().find(|e| {
                let by = [
                    e.reporting_controller.as_deref(),
                    e.deprecated_source.as_ref().and_then(|s| s.component.as_deref()),
                ];
                e.type_.as_deref() == Some("Warning") && by.iter().flatten().any(|c| c.contains("localvol"))
            }))
        },
    )
    .await?;
    let intruder = run.pods().get(INTRUDER).await?.status.unwrap_or_default();
    if intruder.phase.as_deref() != Some("Pending") {
        return Err(format!("the intruder pod left Pending: {:?}", intruder.phase).into());
    }
    let runs = intruder
        .container_statuses
        .unwrap_or_default()
        .iter()
        .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
    if runs {
        return Err("the intruder's container runs".into());
    }
    run.note(&format!(
        "NOTE s3: {}",
        refusal.chars().take(220).collect::<String>()
    ));
    run.delete_pods(&[INTRUDER]).await?;

    run.delete_pods(&[OWNER]).await?;
    let claims = run.claims();
    run.wait_for(
        &format!("claim {CLAIM} deleted with its pod"),
        Duration::from_secs(60),
        || async { Ok(claims.get_opt(CLAIM).await?.is_none().then_some(())) },
    )
    .await?;
    run.volume_gone(&volume.pv, Duration::from_secs(60)).await?;
    if !volume.backing.released(&volume.pv)? {
        return Err(format!("volume {} still mounted or attached", volume.pv).into());
    }
    if !volume.backing.gone()? {
        return Err(format!("{} left", volume.backing).into());
    }
    Ok(())
}
