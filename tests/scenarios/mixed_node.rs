//! Scenario 12 (the guest's "mixed" run, tests/cluster/overlays/mixed): one
//! configuration with a loop, a pmem and an lvm class on a node that lacks the lvm class's
//! volume group. As the README's "One configuration can serve nodes with different
//! storage" says: the loop and pmem classes are served (a pod on loop), and the lvm class
//! is reported missing (a DeviceClassStorageMissing Warning on the Node, /readyz's body,
//! localvol_device_class_available 0) and gets no volume; once the volume group is made,
//! the next stats refresh serves it and its waiting pod starts.
//!
//! Cost: two claims and pods, and up to the provisioner's capacity poll (a minute) after
//! the volume group appears: about 200 s under TCG.

use std::time::{Duration, Instant};

use localvol_testkit::guest::try_sh;

use crate::node::Volume;
use crate::run::{ClaimShape, IDLE, PodVolume, Result, Run, series_value};
use crate::volumes;

/// The lvm class's volume group, as tests/cluster/overlays/mixed names it.
const VG: &str = "localvol";
const AVAILABLE: &str = "localvol_device_class_available";

pub async fn missing_class_reported_then_served(run: Run) -> Result {
    let disk = std::env::var("VG_DISK")
        .ok()
        .filter(|d| !d.is_empty())
        .ok_or("VG_DISK: the disk for the lvm class's volume group (tests/vm/cluster-guest.sh)")?;
    if try_sh("vgs", &[VG]).is_ok() {
        return Err(format!("the lvm class's volume group {VG} exists before the scenario").into());
    }

    let event = run
        .wait_for(
            &format!(
                "a DeviceClassStorageMissing event on Node {} naming the lvm class",
                run.node
            ),
            Duration::from_secs(60),
            || async {
                Ok(run.node_events().await?.into_iter().find_map(|e| {
                    let note = e.note.unwrap_or_default();
                    (e.reason.as_deref() == Some("DeviceClassStorageMissing")
                        && note.contains("device class lvm "))
                    .then_some(note)
                }))
            },
        )
        .await?;
    run.note(&format!("NOTE s12: Node event: {event}"));
    let ready = run
        .driver_page("/readyz")
        .await
        .map_err(|e| format!("/readyz with one class missing: {e}"))?;
    if !ready
        .lines()
        .any(|l| l.starts_with("device class lvm not served: "))
    {
        return Err(format!("/readyz does not name the missing class: {ready}").into());
    }
    expect_available(&run, &[("loop", 1.0), ("pmem", 1.0), ("lvm", 0.0)]).await?;

    // The lvm claim first: it waits, and must not get a volume while the class is missing.
    let lvm_claim = ClaimShape {
        class: "localvol-mixed-lvm".into(),
        ..run.claim_shape()
    };
    run.create_claim("lvm", &lvm_claim).await?;
    run.create_pod("lvmapp", &PodVolume::Filesystem("lvm"), "/data", IDLE)
        .await?;
    // The loop class serves a pod (the only loop volume under the guest's kubelet); the
    // pmem class's own run (pmem direct) covers its claims: here it is served (above).
    let on_loop = Run {
        class_kind: "loop".into(),
        fstype: "ext4".into(),
        ..run.clone()
    };
    let loop_claim = ClaimShape {
        class: "localvol-mixed-loop".into(),
        ..run.claim_shape()
    };
    on_loop.create_claim("loop", &loop_claim).await?;
    volumes::filesystem_lifecycle(&on_loop, "loop", "ext4").await?;
    if run.pod_phase("lvmapp").await?.as_deref() != Some("Pending") {
        return Err("the pod of the missing class is not Pending".into());
    }
    let bound = run.claims().get("lvm").await?.spec.and_then(|s| s.volume_name);
    if let Some(pv) = bound {
        return Err(format!("the claim of the missing class got volume {pv}").into());
    }
    let waiting = run.pod_events("lvmapp").await?.pop().and_then(|e| e.note);
    run.note(&format!(
        "NOTE s12: the lvm class's pod while its volume group is missing: {}",
        waiting.unwrap_or_default()
    ));

    // The volume group appears: served from the next stats refresh (30 s), and the
    // provisioner's next capacity poll (1 min) lets the scheduler place the pod.
    localvol_testkit::guest::volume_group(VG, &[&disk]);
    let made = Instant::now();
    run.pods_running(&["lvmapp"], Duration::from_secs(240)).await?;
    run.note(&format!(
        "NOTE s12: the lvm class's pod Running {} s after its volume group was made",
        made.elapsed().as_secs()
    ));
    let on_lvm = Run {
        class_kind: "lvm".into(),
        lvm_vg: VG.into(),
        ..run.clone()
    };
    let volume = Volume::of_claim(&on_lvm, "lvm").await?;
    volume.expect_class_device(&on_lvm)?;
    run.exec("lvmapp", "echo mixed-s12 > /data/f && sync")
        .await
        .map_err(|e| format!("writing into the lvm volume: {e}"))?;
    let back = run.exec("lvmapp", "cat /data/f").await?;
    if back.trim_end() != "mixed-s12" {
        return Err(format!("lvm data read back differs: {back:?}").into());
    }
    expect_available(&run, &[("lvm", 1.0)]).await?;
    let ready = run.driver_page("/readyz").await?;
    if ready.contains("not served") {
        return Err(format!("/readyz still names a missing class: {ready}").into());
    }
    run.delete_pods(&["lvmapp"]).await?;
    run.claims().delete("lvm", &Default::default()).await?;
    run.volume_gone(&volume.pv, Duration::from_secs(60)).await?;
    if !volume.backing.gone()? {
        return Err(format!("{} left after its claim was deleted", volume.backing).into());
    }
    Ok(())
}

/// localvol_device_class_available of each class is the value given.
async fn expect_available(run: &Run, classes: &[(&str, f64)]) -> Result {
    let metrics = run.driver_metrics().await?;
    for (class, want) in classes {
        let seen = series_value(&metrics, AVAILABLE, &[("device_class", class)]);
        if seen != Some(*want) {
            let series: Vec<&str> = metrics.lines().filter(|l| l.starts_with(AVAILABLE)).collect();
            return Err(format!("{AVAILABLE} of {class} is {seen:?}, not {want}: {series:?}").into());
        }
    }
    Ok(())
}
