//! Scenario 5: ReclaimSpace. A claim annotated with a schedule is trimmed on it: after a
//! file is deleted in the pod, the space its blocks took on the node is given back (the
//! loop class: the image's allocated bytes; lvm-thin: the thin LV's mapped share, and the
//! pool's data_percent falls). `localvol status` and `localvol reclaim` work through an
//! exec in the daemon pod.
//!
//! Cost: a claim and a pod, two 64 MiB writes, up to a minute for the schedule (about
//! 60 s on the host's cluster).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::node::{self, Volume};
use crate::run::{ClaimShape, Result, Run};

const CLAIM: &str = "trim";
const POD: &str = "app";
const SCHEDULE: &str = "reclaimspace.csiaddons.openshift.io/schedule";
/// Of the 64 MiB written, at least this much must come back.
const SLACK: u64 = 48 << 20;

pub async fn freed_blocks_given_back(run: Run) -> Result {
    let shape = ClaimShape {
        size: "256Mi".into(),
        annotations: BTreeMap::from([(SCHEDULE.to_string(), "* * * * *".to_string())]),
        ..run.claim_shape()
    };
    run.create_claim(CLAIM, &shape).await?;
    run.create_pod(
        POD,
        &crate::run::PodVolume::Filesystem(CLAIM),
        "/data",
        crate::run::IDLE,
    )
    .await?;
    run.pods_running(&[POD], Duration::from_secs(90)).await?;
    let volume = Volume::of_claim(&run, CLAIM).await?;
    let thin = run.class_kind == "lvm-thin";

    // The space in use is measured with the file written, before it is deleted: a
    // scheduled run may come between the delete and any later measurement (each minute),
    // and then the space is back before the test could see it taken (seen in the guest).
    fill(&run).await?;
    let full = volume.backing.used_bytes(&run)?;
    let pool_full = if thin {
        Some(node::pool_data_percent(&run)?)
    } else {
        None
    };
    empty(&run).await?;
    run.note(&format!(
        "{} used {} MiB on the node with the file written{}; file deleted",
        volume.backing,
        full >> 20,
        pool_full.map_or(String::new(), |p| format!(" (pool data_percent {p})"))
    ));
    run.wait_for(
        "scheduled reclaim gave back the freed blocks",
        Duration::from_secs(90),
        || async { Ok((volume.backing.used_bytes(&run)? < full - SLACK).then_some(())) },
    )
    .await?;
    let mut pool = String::new();
    if let Some(before) = pool_full {
        let after = node::pool_data_percent(&run)?;
        if after >= before {
            return Err(format!("the pool's data_percent did not fall: {before} -> {after}").into());
        }
        pool = format!("; pool {} data_percent {before} -> {after}", run.thin_pool);
    }
    run.note(&format!(
        "NOTE s5: scheduled (* * * * *): {} -> {} MiB used{pool}",
        full >> 20,
        volume.backing.used_bytes(&run)? >> 20
    ));

    let daemon = run.daemon_pod().await?;
    let (status, _) = run
        .exec_daemon(&daemon, &["localvol", "status"])
        .await
        .map_err(|e| format!("localvol status in the daemon pod: {e}"))?;
    if !status.contains(&volume.handle) {
        return Err(format!("localvol status does not list {}: {status}", volume.handle).into());
    }
    fill(&run).await?;
    let full = volume.backing.used_bytes(&run)?;
    empty(&run).await?;
    // A scheduled run may trim before this one: the space must be back either way, and
    // this run must succeed and say what it did.
    let (out, err) = run
        .exec_daemon(&daemon, &["localvol", "reclaim", &volume.handle])
        .await
        .map_err(|e| format!("localvol reclaim: {e}"))?;
    let said = format!("{out}{err}");
    if !said.contains("reclaimed") {
        return Err(format!("localvol reclaim did not say what it reclaimed: {said}").into());
    }
    run.note(&format!("localvol reclaim: {}", said.trim_end()));
    let after = volume.backing.used_bytes(&run)?;
    if after >= full - SLACK {
        return Err(format!("on-demand reclaim: {} -> {} MiB used", full >> 20, after >> 20).into());
    }
    run.note(&format!(
        "NOTE s5: on demand (exec localvol reclaim): {} -> {} MiB used",
        full >> 20,
        after >> 20
    ));

    run.delete_pods(&[POD]).await?;
    run.claims().delete(CLAIM, &Default::default()).await?;
    run.volume_gone(&volume.pv, Duration::from_secs(60)).await?;
    if !volume.backing.gone()? {
        return Err(format!("{} left after the volume was deleted", volume.backing).into());
    }
    Ok(())
}

async fn fill(run: &Run) -> Result {
    run.exec(
        POD,
        "dd if=/dev/urandom of=/data/big bs=1M count=64 2>/dev/null && sync",
    )
    .await
    .map(drop)
}

async fn empty(run: &Run) -> Result {
    run.exec(POD, "rm /data/big && sync").await.map(drop)
}
