//! Scenario 14: the Helm chart (deploy/helm/localvol). Rendered with each of its ci/
//! values files, accepted by the API server (a server-side dry run). Then installed in
//! place of the overlay, with tests/cluster/helm-values.yaml, which renders the objects
//! the overlay does (tests/helm.rs): helm install, a claim and its pod; helm upgrade to a
//! changed device-class file and log level: the DaemonSet rolls, and the pod's volume
//! stays mounted, readable and writable; helm rollback: it rolls back; the claim deleted
//! by the chart's daemon; helm uninstall: no DaemonSet, CSIDriver or registration left.
//! Then the overlay again, as the run had it, also when a step failed. The loop class,
//! on the host's node.
//!
//! Cost: four rollouts of the daemon and a claim (about 60 s on the host's cluster).

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use localvol::model::DRIVER_NAME;
use serde_json::json;

use crate::node::Volume;
use crate::run::{Result, Run, SYSTEM_NAMESPACE, tool};

const RELEASE: &str = "localvol";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub async fn install_upgrade_rollback_uninstall(run: Run) -> Result {
    let overlay = run.own_overlay()?.to_path_buf();
    let helm = tool(&repo().join("tests/tools/helm.sh").to_string_lossy(), &[], None)
        .await
        .map_err(|e| format!("no helm (tests/tools/helm.sh): {e}"))?;
    let helm = Helm(helm.trim().to_string());
    let outcome = with_the_chart(&run, &helm, &overlay).await;
    if outcome.is_err() {
        // The overlay back for the scenarios after this one; the failure is this one's.
        let _ = helm
            .run(&["uninstall", RELEASE, "--wait", "--timeout", "120s"])
            .await;
        let _ = overlay_again(&run, &overlay).await;
        return outcome;
    }
    overlay_again(&run, &overlay).await
}

async fn with_the_chart(run: &Run, helm: &Helm, overlay: &Path) -> Result {
    let chart = repo().join("deploy/helm/localvol");
    let chart_arg = chart.to_string_lossy().to_string();
    // Every configuration the chart ships, accepted by this API server as rendered.
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart.join("ci"))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.to_string_lossy().ends_with("-values.yaml"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("no values files in {}/ci", chart.display()).into());
    }
    for values in &files {
        let rendered = helm
            .run(&[
                "template",
                RELEASE,
                &chart_arg,
                "--values",
                &values.to_string_lossy(),
            ])
            .await?;
        tool(
            "kubectl",
            &["apply", "--dry-run=server", "-f", "-"],
            Some(&rendered),
        )
        .await
        .map_err(|e| {
            format!(
                "the API server refuses the chart rendered with {}: {e}",
                values.display()
            )
        })?;
    }
    run.note(&format!(
        "server-side dry run: the chart with each of {} values files accepted",
        files.len()
    ));

    tool(
        "kubectl",
        &["delete", "-k", &overlay.to_string_lossy(), "--wait=true"],
        None,
    )
    .await?;
    let namespaces = Api::<Namespace>::all(run.client.clone());
    run.gone(
        &namespaces,
        SYSTEM_NAMESPACE,
        "the overlay's namespace deleted",
        Duration::from_secs(90),
    )
    .await?;
    unregistered(run, "").await?;
    // The namespace as deploy/helm/localvol/README.md makes it.
    let privileged = "privileged";
    let namespace: Namespace = serde_json::from_value(json!({
        "metadata": {"name": SYSTEM_NAMESPACE, "labels": {
            "pod-security.kubernetes.io/enforce": privileged,
            "pod-security.kubernetes.io/audit": privileged,
            "pod-security.kubernetes.io/warn": privileged
        }}
    }))?;
    namespaces.create(&PostParams::default(), &namespace).await?;

    let values = repo().join("tests/cluster/helm-values.yaml");
    let values = values.to_string_lossy();
    helm.run(&[
        "install",
        RELEASE,
        &chart_arg,
        "--values",
        &values,
        "--wait",
        "--timeout",
        "120s",
    ])
    .await?;
    served(run, "the chart's").await?;
    run.note(&format!("helm install: revision {}", helm.revision().await?));
    run.claim("data").await?;
    run.pod_with("app", "data").await?;
    let volume = Volume::of_claim(run, "data").await?;
    run.exec("app", "echo helm-s14 > /data/f && sync")
        .await
        .map_err(|e| format!("writing into the volume: {e}"))?;

    // A changed device-class file (the loop class's limit) and log level.
    let changed = tempfile::NamedTempFile::new()?;
    std::fs::write(
        changed.path(),
        "logLevel: debug\ndeviceClasses:\n  - {name: loop, kind: loop, default: true, fs-type: ext4, directory: /var/lib/localvol/loop, capacity-gb: 200}\n",
    )?;
    let old = run.daemon_pod().await?;
    helm.run(&[
        "upgrade",
        RELEASE,
        &chart_arg,
        "--values",
        &values,
        "--values",
        &changed.path().to_string_lossy(),
        "--wait",
        "--timeout",
        "120s",
    ])
    .await?;
    run.daemon_replaced(&old).await?;
    served(run, "the upgraded").await?;
    expect_log_level(run, "debug").await?;
    let config = Api::<ConfigMap>::namespaced(run.client.clone(), SYSTEM_NAMESPACE)
        .get("localvol-config")
        .await?
        .data
        .unwrap_or_default()
        .remove("config.yaml")
        .unwrap_or_default();
    if !config.contains("capacity-gb: 200") {
        return Err(format!("helm upgrade: the device-class file did not change: {config}").into());
    }
    still_served(
        run,
        &volume,
        &format!("after helm upgrade (revision {})", helm.revision().await?),
    )
    .await?;

    let old = run.daemon_pod().await?;
    helm.run(&["rollback", RELEASE, "1", "--wait", "--timeout", "120s"])
        .await?;
    run.daemon_replaced(&old).await?;
    served(run, "the rolled-back").await?;
    expect_log_level(run, "info").await?;
    still_served(
        run,
        &volume,
        &format!("after helm rollback (revision {})", helm.revision().await?),
    )
    .await?;

    run.delete_pods(&["app"]).await?;
    run.wait_for(
        &format!(
            "volume {} unpublished and unstaged by the chart's daemon",
            volume.pv
        ),
        Duration::from_secs(60),
        || async { Ok(volume.backing.released(&volume.pv)?.then_some(())) },
    )
    .await?;
    run.claims().delete("data", &DeleteParams::default()).await?;
    run.volume_gone(&volume.pv, Duration::from_secs(60)).await?;
    if !volume.backing.gone()? {
        return Err(format!("{} left after its claim was deleted", volume.backing).into());
    }

    helm.run(&["uninstall", RELEASE, "--wait", "--timeout", "120s"])
        .await?;
    let daemonsets = Api::<DaemonSet>::namespaced(run.client.clone(), SYSTEM_NAMESPACE);
    run.wait_for("the chart's DaemonSet gone", Duration::from_secs(60), || async {
        Ok(daemonsets.get_opt("localvol-node").await?.is_none().then_some(()))
    })
    .await?;
    if Api::<CSIDriver>::all(run.client.clone())
        .get_opt(DRIVER_NAME)
        .await?
        .is_some()
    {
        return Err("helm uninstall left the CSIDriver".into());
    }
    unregistered(run, " after helm uninstall").await?;
    let left = helm.run(&["list", "--short"]).await?;
    if !left.trim().is_empty() {
        return Err(format!("helm list still shows a release: {left}").into());
    }
    run.note("helm uninstall: nothing of the chart left");
    Ok(())
}

/// The chart's release, by helm in the daemon's namespace.
struct Helm(String);

impl Helm {
    async fn run(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["--namespace", SYSTEM_NAMESPACE];
        all.extend_from_slice(args);
        tool(&self.0, &all, None).await
    }

    /// The release's newest revision (helm history).
    async fn revision(&self) -> Result<u64> {
        let history = self
            .run(&["history", RELEASE, "--max", "1", "-o", "json"])
            .await?;
        let history: serde_json::Value = serde_json::from_str(&history)?;
        history
            .as_array()
            .and_then(|h| h.last())
            .and_then(|r| r["revision"].as_u64())
            .ok_or_else(|| format!("helm history: {history}").into())
    }
}

/// The daemon Ready and registered with kubelet.
async fn served(run: &Run, which: &str) -> Result {
    run.wait_for(
        &format!("{which} DaemonSet Ready"),
        Duration::from_secs(120),
        || async { Ok(run.daemon_ready().await?.then_some(())) },
    )
    .await?;
    run.wait_for(
        &format!("CSINode lists {DRIVER_NAME} ({which} daemon)"),
        Duration::from_secs(60),
        || async { Ok(run.registered().await?.then_some(())) },
    )
    .await
}

async fn unregistered(run: &Run, when: &str) -> Result {
    run.wait_for(
        &format!("CSINode no longer lists {DRIVER_NAME}{when}"),
        Duration::from_secs(60),
        || async { Ok((!run.registered().await?).then_some(())) },
    )
    .await
}

/// The daemon pod's RUST_LOG is `level`.
async fn expect_log_level(run: &Run, level: &str) -> Result {
    let pod = run.system_pods().get(&run.daemon_pod().await?).await?;
    let seen = pod
        .spec
        .into_iter()
        .flat_map(|s| s.containers)
        .filter(|c| c.name == "localvol")
        .flat_map(|c| c.env.unwrap_or_default())
        .find(|e| e.name == "RUST_LOG")
        .and_then(|e| e.value);
    if seen.as_deref() != Some(level) {
        return Err(format!("the daemon's RUST_LOG is {seen:?}, not {level}").into());
    }
    Ok(())
}

/// The pod's volume kept its data, mounted as before, and takes more.
async fn still_served(run: &Run, volume: &Volume, when: &str) -> Result {
    let data = run.exec("app", "head -n 1 /data/f").await?;
    if data.trim_end() != "helm-s14" {
        return Err(format!("the volume's data is gone {when}: {data:?}").into());
    }
    run.exec("app", "echo more >> /data/f && sync")
        .await
        .map_err(|e| format!("the volume takes no more writes {when}: {e}"))?;
    volume.expect_mounted(run, 2)?;
    run.note(&format!(
        "volume {} still mounted, read and written {when}",
        volume.pv
    ));
    Ok(())
}

/// The run's overlay deployed again, Ready and registered.
async fn overlay_again(run: &Run, overlay: &Path) -> Result {
    let namespaces = Api::<Namespace>::all(run.client.clone());
    if namespaces.get_opt(SYSTEM_NAMESPACE).await?.is_some() {
        namespaces
            .delete(SYSTEM_NAMESPACE, &DeleteParams::default())
            .await?;
        run.gone(
            &namespaces,
            SYSTEM_NAMESPACE,
            "the chart's namespace deleted",
            Duration::from_secs(90),
        )
        .await?;
    }
    run.apply_overlay(overlay).await?;
    served(run, "the overlay's").await
}
