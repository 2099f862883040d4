//! Scenario 7: the daemon's /metrics (host network, the port its DaemonSet sets) counts
//! the calls kubelet made for a pod's volume (stage, publish, unpublish, unstage) and
//! the provisioner's (create, delete), each as a success. localvol counts the volume
//! calls only: NodeGetCapabilities, NodeGetInfo and the Identity calls are not in
//! localvol_rpc_requests_total.
//!
//! Cost: a claim, a pod and their deletion (about 20 s on the host's cluster).

use crate::run::{Result, Run, series_total};

const CLAIM: &str = "m";
const COUNTER: &str = "localvol_rpc_requests_total";

pub async fn volume_calls_counted(run: Run) -> Result {
    run.claim(CLAIM).await?;
    run.pod_with("app", CLAIM).await?;
    let text = run.driver_metrics().await?;
    for call in ["CreateVolume", "NodeStageVolume", "NodePublishVolume"] {
        succeeded(&run, &text, call)?;
    }

    let (pv, _) = run.volume_of(CLAIM).await?;
    run.delete_pod_and_claim("app", CLAIM, &pv).await?;
    let text = run.driver_metrics().await?;
    for call in ["NodeUnpublishVolume", "NodeUnstageVolume", "DeleteVolume"] {
        succeeded(&run, &text, call)?;
    }
    let counters = text.lines().filter(|l| l.starts_with(COUNTER)).count();
    run.note(&format!(
        "NOTE s7: {counters} rpc counters scraped from 127.0.0.1:{}",
        run.metrics_port
    ));
    Ok(())
}

/// Fails unless /metrics counts at least one successful `call`.
fn succeeded(run: &Run, text: &str, call: &str) -> Result {
    match series_total(text, COUNTER, &[("method", call), ("code", "Ok")]) {
        Some(n) if n > 0.0 => {
            run.note(&format!("metrics: {call} Ok = {n}"));
            Ok(())
        }
        other => Err(format!("no successful {call} in /metrics ({COUNTER}: {other:?})").into()),
    }
}
