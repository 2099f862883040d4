//! Scenario 13: encryption at rest under a real kubelet (docs/encryption.md). A
//! StorageClass with localvol.csi.dev/encryption: luks2 whose node-stage Secret is
//! templated per claim (`${pvc.name}-luks`): the claim's pod runs on the dm-crypt mapping
//! (its mount is the mapping's; the LV holds a LUKS header and no plaintext), its data is
//! intact in a second pod after the first is deleted (unstage closed the mapping, the new
//! stage opened it with the Secret again), and it grows online. A claim whose Secret has
//! no `passphrase` key never mounts, and localvol's Warning is on that claim. Needs
//! device-mapper: the guest's lvm-thin class.
//!
//! Cost: two claims, three pods, a LUKS format and two opens, an online growth (about
//! 200 s under TCG: luksFormat's key derivation dominates).

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use localvol_testkit::guest::try_sh;
use serde_json::json;

use crate::node::{self, Volume};
use crate::run::{ClaimShape, IDLE, PodVolume, Result, Run};

const CLASS: &str = "lvtest-luks";
const MARKER: &str = "LVTEST-S13-PLAINTEXT-7d2c";

pub async fn encrypted_at_rest(run: Run) -> Result {
    let mut class = run.storage_class(CLASS, "ext4", true)?;
    class.parameters.get_or_insert_default().extend(
        [
            ("localvol.csi.dev/encryption", "luks2"),
            ("csi.storage.k8s.io/node-stage-secret-name", "${pvc.name}-luks"),
            (
                "csi.storage.k8s.io/node-stage-secret-namespace",
                "${pvc.namespace}",
            ),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    run.create_storage_class(&class).await?;
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .subsec_nanos();
    secret(
        &run,
        "sealed-luks",
        "passphrase",
        &format!("s13-{nanos}-{}", std::process::id()),
    )
    .await?;
    // The key misnamed: kubelet passes the Secret, localvol finds no passphrase in it.
    secret(&run, "unkeyed-luks", "password", "x").await?;
    let shape = ClaimShape {
        size: "64Mi".into(),
        class: CLASS.into(),
        ..run.claim_shape()
    };
    run.create_claim("sealed", &shape).await?;
    run.create_claim("unkeyed", &shape).await?;
    run.create_pod(
        "writer",
        &PodVolume::Filesystem("sealed"),
        "/data",
        &format!("echo {MARKER} > /data/f; sync; {IDLE}"),
    )
    .await?;
    run.create_pod("nokey", &PodVolume::Filesystem("unkeyed"), "/data", IDLE)
        .await?;
    run.pods_running(&["writer"], Duration::from_secs(120)).await?;

    let volume = Volume::of_claim(&run, "sealed").await?;
    let lv = volume.device()?.to_path_buf();
    let header = try_sh("blkid", &["-o", "value", "-s", "TYPE", &lv.to_string_lossy()])?;
    if header.trim() != "crypto_LUKS" {
        return Err(format!("{} holds no LUKS header ({})", lv.display(), header.trim()).into());
    }
    let mapping = PathBuf::from(format!("/dev/mapper/localvol-crypt-{}", volume.handle));
    node::majmin(&mapping).map_err(|e| format!("no mapping while the pod runs: {e}"))?;
    if node::mounts_of(&volume.pv, Some(&mapping))?.is_empty() {
        return Err(format!("the pod's volume is not mounted from {}", mapping.display()).into());
    }
    expect_marker(&run, "writer").await?;
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3")?;
    if !node::holds_bytes(&mapping, MARKER.as_bytes())? {
        return Err("the plaintext is not on the mapping (the check would prove nothing)".into());
    }
    if node::holds_bytes(&lv, MARKER.as_bytes())? {
        return Err(format!("the plaintext reached the LV {}", lv.display()).into());
    }
    run.note(&format!(
        "NOTE s13: {} on {} (crypto_LUKS), mounted from {}; no plaintext on the LV",
        volume.handle,
        lv.display(),
        mapping.display()
    ));

    run.delete_pods(&["writer"]).await?;
    mapping_closed(&run, &mapping, "at unstage").await?;
    run.create_pod("reader", &PodVolume::Filesystem("sealed"), "/data", IDLE)
        .await?;
    run.pods_running(&["reader"], Duration::from_secs(120)).await?;
    expect_marker(&run, "reader").await?;
    // Online growth through the resizer the overlay runs: the LV, the mapping, then ext4.
    let before = run.filesystem_kib("reader").await?;
    run.claims()
        .patch(
            "sealed",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "128Mi"}}}})),
        )
        .await?;
    let after = run
        .wait_for(
            "the encrypted filesystem grown in the pod",
            Duration::from_secs(180),
            || async {
                let now = run.filesystem_kib("reader").await?;
                Ok((now >= before + 48 * 1024).then_some(now))
            },
        )
        .await?;
    run.note(&format!(
        "NOTE s13: ext4 on the mapping grew online from {before} to {after} KiB"
    ));

    let warning = run
        .wait_for(
            "localvol's Warning on the claim whose Secret has no passphrase",
            Duration::from_secs(90),
            || async {
                Ok(run.claim_events("unkeyed").await?.into_iter().find_map(|e| {
                    let note = e.note.unwrap_or_default();
                    (e.reason.as_deref() == Some("EncryptedVolumeNotOpened")
                        && e.type_.as_deref() == Some("Warning")
                        && note.contains("passphrase"))
                    .then_some(note)
                }))
            },
        )
        .await?;
    if run.pod_phase("nokey").await?.as_deref() != Some("Pending") {
        return Err("the pod without a passphrase left Pending".into());
    }
    run.note(&format!(
        "NOTE s13: {}",
        warning.chars().take(200).collect::<String>()
    ));

    run.delete_pods(&["reader", "nokey"]).await?;
    mapping_closed(&run, &mapping, "").await?;
    for claim in ["sealed", "unkeyed"] {
        run.claims().delete(claim, &Default::default()).await?;
    }
    run.volume_gone(&volume.pv, Duration::from_secs(60)).await?;
    if !volume.backing.gone()? {
        return Err(format!("{} left", volume.backing).into());
    }
    Ok(())
}

async fn secret(run: &Run, name: &str, key: &str, value: &str) -> Result {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {key: value}
    }))?;
    kube::Api::<Secret>::namespaced(run.client.clone(), &run.namespace)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

async fn expect_marker(run: &Run, pod: &str) -> Result {
    let data = run.exec(pod, "cat /data/f").await?;
    if data.trim_end() != MARKER {
        return Err(format!("the data in pod {pod}: {data:?}").into());
    }
    Ok(())
}

async fn mapping_closed(run: &Run, mapping: &std::path::Path, when: &str) -> Result {
    run.wait_for(
        &format!("mapping {} closed {when}", mapping.display()),
        Duration::from_secs(60),
        || async { Ok((!mapping.exists()).then_some(())) },
    )
    .await
}
