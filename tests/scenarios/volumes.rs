//! Scenario 2: WaitForFirstConsumer claims and their pods, side by side: one of the
//! class's filesystem, one of the other of ext4 and xfs (a StorageClass's fstype) and a
//! raw block claim. Each is provisioned on this node, is the class's device, and holds
//! what its pod writes; pods deleted -> unpublished and unstaged (no mount, no loop
//! device), storage kept; claims deleted -> volumes and their storage gone. The three run
//! at once, as a node's pods do: the same checks as one after another, and a third of the
//! waiting on an emulated node. On the loop class (the host's) also a claim of an
//! Immediate class, which does not depend on the backend.
//!
//! Cost: three claims and pods (about 40 s on the host's cluster, 90 s under TCG); the
//! Immediate claim waits for the provisioner's node-deployment delay (about 20 s).

use std::time::Duration;

use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::json;

use crate::node::Volume;
use crate::run::{IDLE, PodVolume, Result, Run};

/// mkfs.xfs refuses a filesystem under 300 MB (tests/vm/README.md).
const XFS_SIZE: &str = "320Mi";
const BLOCK_PATH: &str = "/dev/xvda";

pub async fn volumes_side_by_side(run: Run) -> Result {
    let (other, other_size) = match run.fstype.as_str() {
        "xfs" => ("ext4", run.fs_size.clone()),
        _ => ("xfs", XFS_SIZE.to_string()),
    };
    let other_class = format!("lvtest-s2-{other}");
    run.create_storage_class(&run.storage_class(&other_class, other, false)?)
        .await?;
    let fs_claim = "fs".to_string();
    let other_claim = format!("fs-{other}");
    let mut shape = run.claim_shape();
    run.create_claim(&fs_claim, &shape).await?;
    run.create_claim(
        &other_claim,
        &crate::run::ClaimShape {
            size: other_size,
            class: other_class.clone(),
            ..shape.clone()
        },
    )
    .await?;
    shape.size.clone_from(&run.block_size);
    shape.block = true;
    run.create_claim("raw", &shape).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for claim in [fs_claim.as_str(), &other_claim, "raw"] {
        if run.claim_phase(claim).await?.as_deref() != Some("Pending") {
            return Err(format!("WaitForFirstConsumer claim {claim} bound before a pod used it").into());
        }
    }

    let other_pod = format!("app-{other}");
    run.create_pod("app", &PodVolume::Filesystem(&fs_claim), "/data", IDLE)
        .await?;
    run.create_pod(&other_pod, &PodVolume::Filesystem(&other_claim), "/data", IDLE)
        .await?;
    run.create_pod("rawapp", &PodVolume::Block("raw"), BLOCK_PATH, IDLE)
        .await?;
    run.pods_running(&["app", &other_pod, "rawapp"], Duration::from_secs(90))
        .await?;

    let volumes = [
        filesystem_holds_data(&run, "app", &fs_claim, &run.fstype).await?,
        filesystem_holds_data(&run, &other_pod, &other_claim, other).await?,
        block_holds_data(&run, "rawapp", "raw").await?,
    ];

    run.delete_pods(&["app", &other_pod, "rawapp"]).await?;
    for volume in &volumes {
        released_and_kept(&run, volume).await?;
    }
    for claim in [fs_claim.as_str(), &other_claim, "raw"] {
        run.claims().delete(claim, &Default::default()).await?;
    }
    for volume in &volumes {
        deleted(&run, volume).await?;
    }
    run.note(&format!(
        "NOTE s2: {} on {}, {other} and raw block: written, read back, released and deleted",
        run.fstype, run.class_kind
    ));
    if run.class_kind == "loop" {
        immediate_claim(&run).await?;
    }
    Ok(())
}

/// One claim's whole lifecycle, alone (scenario 12's loop claim): a pod on the claim
/// (Filesystem mode, `fstype`), checked, deleted, then the claim.
pub async fn filesystem_lifecycle(run: &Run, claim: &str, fstype: &str) -> Result {
    run.create_pod("app", &PodVolume::Filesystem(claim), "/data", IDLE)
        .await?;
    run.pods_running(&["app"], Duration::from_secs(90)).await?;
    let volume = filesystem_holds_data(run, "app", claim, fstype).await?;
    run.delete_pods(&["app"]).await?;
    released_and_kept(run, &volume).await?;
    run.claims().delete(claim, &Default::default()).await?;
    deleted(run, &volume).await
}

/// The volume of a Running pod's filesystem claim is the class's device with `fstype`,
/// mounted for the pod (staging and the pod's); data written is read back.
pub async fn filesystem_holds_data(run: &Run, pod: &str, claim: &str, fstype: &str) -> Result<Volume> {
    let volume = Volume::of_claim(run, claim).await?;
    volume.expect_class_device(run)?;
    volume.expect_mounted(run, 2)?;
    run.exec(pod, "echo cluster-data-s2 > /data/f && sync")
        .await
        .map_err(|e| format!("writing into the {fstype} volume: {e}"))?;
    let back = run.exec(pod, "cat /data/f").await?;
    if back.trim_end() != "cluster-data-s2" {
        return Err(format!("{fstype} volume: data read back differs: {back:?}").into());
    }
    volume.expect_pod_mount(run, pod, "/data", fstype).await?;
    Ok(volume)
}

/// A raw block claim's device in the pod is the volume's, and the pod's write is read
/// back in the pod and on the node, from the volume's storage.
async fn block_holds_data(run: &Run, pod: &str, claim: &str) -> Result<Volume> {
    let volume = Volume::of_claim(run, claim).await?;
    volume.expect_class_device(run)?;
    volume.expect_mounted(run, 1)?;
    let want = crate::node::majmin(volume.device()?)?;
    let seen = run.exec(pod, &format!("stat -c '%t %T' {BLOCK_PATH}")).await?;
    let seen = hex_majmin(&seen).ok_or_else(|| format!("stat of {BLOCK_PATH} in {pod}: {seen:?}"))?;
    if seen != want {
        return Err(format!(
            "{BLOCK_PATH} in the pod is {seen}, not {} ({want})",
            volume.device()?.display()
        )
        .into());
    }
    run.exec(
        pod,
        &format!("echo raw-data-s2 | dd of={BLOCK_PATH} bs=512 count=1 conv=sync,fsync 2>/dev/null"),
    )
    .await
    .map_err(|e| format!("writing the block device: {e}"))?;
    let back = run
        .exec(
            pod,
            &format!("dd if={BLOCK_PATH} bs=512 count=1 2>/dev/null | head -1"),
        )
        .await?;
    if back.trim_end() != "raw-data-s2" {
        return Err(format!("block data read back differs: {back:?}").into());
    }
    let on_node = volume.backing.read_head(11)?;
    if on_node != b"raw-data-s2" {
        return Err(format!(
            "the pod's block write is not in {}: {:?}",
            volume.backing,
            String::from_utf8_lossy(&on_node)
        )
        .into());
    }
    Ok(volume)
}

/// After its pod is gone: the volume unpublished and unstaged, its storage kept.
async fn released_and_kept(run: &Run, volume: &Volume) -> Result {
    run.wait_for(
        &format!("volume {} unpublished and unstaged", volume.pv),
        Duration::from_secs(60),
        || async { Ok(volume.backing.released(&volume.pv)?.then_some(())) },
    )
    .await?;
    if !volume.backing.present()? {
        return Err(format!("{} gone while the claim exists", volume.backing).into());
    }
    Ok(())
}

/// After its claim is gone: the PV and the volume's storage gone.
async fn deleted(run: &Run, volume: &Volume) -> Result {
    run.volume_gone(&volume.pv, Duration::from_secs(60)).await?;
    if !volume.backing.gone()? {
        return Err(format!("{} left after the volume was deleted", volume.backing).into());
    }
    run.note(&format!("{} removed", volume.backing));
    Ok(())
}

/// A claim of an Immediate class whose allowedTopologies name this node: with no pod,
/// the node's external-provisioner makes itself the claim's selected node (after its
/// random delay, --node-deployment-base-delay, 20 s) and provisions it there; a pod then
/// follows the volume to the node.
async fn immediate_claim(run: &Run) -> Result {
    let class_name = "lvtest-immediate-s2";
    let mut class: StorageClass = run.storage_class(class_name, &run.fstype, false)?;
    class.volume_binding_mode = Some("Immediate".into());
    class.allowed_topologies = Some(vec![serde_json::from_value(json!({
        "matchLabelExpressions": [{"key": "topology.localvol.csi.dev/node", "values": [run.node]}]
    }))?]);
    run.create_storage_class(&class).await?;
    let shape = crate::run::ClaimShape {
        class: class_name.into(),
        ..run.claim_shape()
    };
    run.create_claim("now", &shape).await?;
    run.wait_for(
        "Immediate claim bound with no pod",
        Duration::from_secs(120),
        || async { Ok((run.claim_phase("now").await?.as_deref() == Some("Bound")).then_some(())) },
    )
    .await?;
    let selected = run
        .claims()
        .get("now")
        .await?
        .metadata
        .annotations
        .unwrap_or_default()
        .remove("volume.kubernetes.io/selected-node");
    if selected.as_deref() != Some(run.node.as_str()) {
        return Err(format!(
            "the Immediate claim's selected node is {selected:?}, not {}",
            run.node
        )
        .into());
    }
    let volume = Volume::of_claim(run, "now").await?;
    run.create_pod("nowapp", &PodVolume::Filesystem("now"), "/data", IDLE)
        .await?;
    run.pods_running(&["nowapp"], Duration::from_secs(90)).await?;
    run.exec("nowapp", "echo immediate-s2 > /data/f && sync")
        .await
        .map_err(|e| format!("writing into the Immediate volume: {e}"))?;
    let back = run.exec("nowapp", "cat /data/f").await?;
    if back.trim_end() != "immediate-s2" {
        return Err(format!("Immediate volume: data read back differs: {back:?}").into());
    }
    run.delete_pods(&["nowapp"]).await?;
    run.wait_for(
        "Immediate volume unpublished and unstaged",
        Duration::from_secs(60),
        || async { Ok(volume.backing.released(&volume.pv)?.then_some(())) },
    )
    .await?;
    run.claims().delete("now", &Default::default()).await?;
    deleted(run, &volume).await?;
    run.note(&format!(
        "NOTE s2: an Immediate claim provisioned on {} with no pod, then used",
        run.node
    ));
    Ok(())
}

/// major:minor from `stat -c '%t %T'` (hexadecimal).
fn hex_majmin(stat: &str) -> Option<String> {
    let mut words = stat.split_whitespace();
    let major = u32::from_str_radix(words.next()?, 16).ok()?;
    let minor = u32::from_str_radix(words.next()?, 16).ok()?;
    Some(format!("{major}:{minor}"))
}

#[cfg(test)]
mod tests {
    use super::hex_majmin;

    #[test]
    fn stat_prints_major_and_minor_in_hex() {
        assert_eq!(hex_majmin("fd 1a\n").as_deref(), Some("253:26"));
        assert_eq!(hex_majmin("7 0").as_deref(), Some("7:0"));
        assert_eq!(hex_majmin("nonsense"), None);
    }
}
