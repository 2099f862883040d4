//! Scenario 6: the daemon is SIGKILLed and its pod deleted while a workload has a
//! volume mounted: the workload keeps its data and can still write, a new daemon pod
//! becomes Ready and is registered again, and the new daemon unpublishes and unstages
//! the volume once the workload goes, then deletes it.
//!
//! Cost: a claim, a pod, a daemon pod's replacement (about 20 s on the host's cluster;
//! 70 s under TCG in the guest).

use std::time::Duration;

use kube::api::DeleteParams;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::node::{self, Volume};
use crate::run::{Result, Run};

const CLAIM: &str = "keep";
const POD: &str = "app";

pub async fn workload_outlives_a_killed_daemon(run: Run) -> Result {
    run.claim(CLAIM).await?;
    run.pod_with(POD, CLAIM).await?;
    let volume = Volume::of_claim(&run, CLAIM).await?;
    let (pv, backing) = (&volume.pv, &volume.backing);
    let device = volume.device()?.to_path_buf();
    run.exec(POD, "echo survives > /data/f && sync").await?;

    let old = run.daemon_pod().await?;
    let pid = run.daemon_pid(&old).await?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    if !String::from_utf8_lossy(&cmdline).contains("localvol") {
        return Err(format!("PID {pid} is not localvol").into());
    }
    // SIGKILL first: once the pod is being deleted, kubelet's SIGTERM may end the daemon
    // (cleanly) before a SIGKILL reaches it.
    kill(Pid::from_raw(pid), Signal::SIGKILL)?;
    run.system_pods().delete(&old, &DeleteParams::default()).await?;
    run.note(&format!("localvol PID {pid} SIGKILLed, daemon pod {old} deleted"));
    run.daemon_replaced(&old).await?;
    run.wait_for(
        "CSINode lists the driver again",
        Duration::from_secs(60),
        || async { Ok(run.registered().await?.then_some(())) },
    )
    .await?;

    let data = run.exec(POD, "cat /data/f").await?;
    if data.trim() != "survives" {
        return Err(format!("the workload lost its data: {data:?}").into());
    }
    run.exec(POD, "echo still-writable >> /data/f && sync")
        .await
        .map_err(|e| format!("the workload cannot write any more: {e}"))?;
    let mounts = node::mounts_of(pv, Some(&device))?;
    if mounts.len() < 2 {
        return Err(format!(
            "{pv} on {}: {} mounts on the node, expected at least 2 (staging and the pod's): {mounts:?}",
            device.display(),
            mounts.len()
        )
        .into());
    }
    run.note(&format!(
        "node: {} mounts of {pv} on {}",
        mounts.len(),
        device.display()
    ));

    run.pods().delete(POD, &DeleteParams::default()).await?;
    run.wait_for(
        "unpublished and unstaged by the new daemon",
        Duration::from_secs(90),
        || async { Ok(backing.released(pv)?.then_some(())) },
    )
    .await?;
    run.claims().delete(CLAIM, &DeleteParams::default()).await?;
    run.volume_gone(pv, Duration::from_secs(90)).await?;
    if !backing.gone()? {
        return Err(format!("{backing} left after the volume was deleted").into());
    }
    run.note(&format!(
        "NOTE s6: {backing} kept the workload's data through a SIGKILLed daemon, then removed"
    ));
    Ok(())
}
