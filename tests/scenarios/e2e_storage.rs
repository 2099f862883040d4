//! Scenario 11: Kubernetes' own storage e2e suites (the kit's e2e.test, "External
//! Storage") against the run's class, as the reference CSI driver runs them for
//! conformance. On the loop class (the host's) the driver is tests/e2e/driver-loop.yaml
//! and the deployment the run's overlay with the csi-snapshotter sidecar
//! (tests/cluster/overlays/snapshots; the snapshot-controller is the harness's); in the
//! guest's cluster (`tests/vm/cluster.sh --classes lvm-thin 11`) the same promises on the
//! class, ext4 as its default fs, focused on what the host cannot run. Every spec that
//! runs must pass.
//!
//! Which specs: LOCALVOL_E2E_FOCUS (a ginkgo regex; default the suites of a CSI driver's
//! conformance run without [Slow], sized for CI), or `all` (every External Storage spec,
//! [Slow] ones too: about 30 minutes with 3 processes on 2 cores). Processes:
//! LOCALVOL_E2E_PROCS (2).
//!
//! Cost: about 600 s on the host's cluster with the default focus; 600 s in the guest.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::Value;

use crate::run::{Result, Run, tool};
use crate::snapshots;

/// Skipped always, each with its reason.
const SKIP: &[&str] = &[
    // ssh to the node and kubelet restarts: this harness has neither (the kit's README).
    r"\[Disruptive\]",
    r"\[Serial\]",
    // SELinux mount options: Debian's kernel here runs without SELinux.
    r"\[Feature:SELinux\]",
];
/// A pod entering PID 1's mount namespace to inspect the node's directories: this
/// sandbox's init forbids it on the host (the kit's README). The guest's cluster, whose
/// PID 1 is its own init, runs it.
const HOST_SKIP: &[&str] = &["should not mount / map unused volumes in a pod"];
/// Skipped in the default run only, for CI's time: minutes per spec, over the calls the
/// kept specs make (xfs and ext3 patterns, many pods on one volume, stress).
const CI_SKIP: &[&str] = &[r"\[Slow\]"];
const FOCUS: &str = r"External.Storage.*\] (provisioning|volumes|volumeMode|volumeIO|volume-expand|snapshottable|ephemeral|read-write-once-pod|fsgroupchangepolicy|subPath|multiVolume|capacity|topology) ";
/// In the guest's cluster, what the host cannot run: online growth of ext4, filesystem
/// and raw block, and the PID 1 specs. LOCALVOL_E2E_FOCUS='External.Storage.*\]
/// (volume-expand |volumeMode )' runs those suites whole there (10 specs, 599 s).
const GUEST_FOCUS: &str = r"External.Storage.*\] (volume-expand should resize volume when PVC is edited while pod is using it|volumeMode should not mount / map unused volumes in a pod)";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn env(name: &str) -> Result<String> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("{name} must be set (scenario 11's shell entry passes it)").into())
}

pub async fn kubernetes_storage_suites(run: Run) -> Result {
    let kit_bin = PathBuf::from(env("KUBE_KIT_BIN")?);
    for tool in ["e2e.test", "ginkgo"] {
        if !kit_bin.join(tool).is_file() {
            return Err(format!("no {tool} in {} (the kit's install.sh)", kit_bin.display()).into());
        }
    }
    let work = tempfile::Builder::new().prefix("localvol-e2e.").tempdir()?;
    import_images(work.path()).await?;
    let on_host = run.class_kind == "loop";
    if on_host {
        snapshots::snapshot_component_on(&run).await?;
    }
    let outcome = suites(&run, &kit_bin, work.path(), on_host).await;
    if on_host {
        // The e2e namespaces' snapshots go first: the component's sidecar deletes their
        // contents.
        let deleted = delete_every_snapshot(&run).await;
        let restored = snapshots::snapshot_component_off(&run).await;
        outcome?;
        deleted?;
        return restored;
    }
    outcome
}

/// Deletes the VolumeSnapshots of every namespace, one by one (the API has no
/// cluster-wide deletecollection of a namespaced kind).
async fn delete_every_snapshot(run: &Run) -> Result {
    let snapshots = run.all_volume_snapshots().list(&Default::default()).await?;
    for snapshot in snapshots.items {
        let (Some(namespace), Some(name)) = (snapshot.metadata.namespace, snapshot.metadata.name) else {
            continue;
        };
        let api = kube::Api::<kube::api::DynamicObject>::namespaced_with(
            run.client.clone(),
            &namespace,
            &crate::run::snapshot_resource("VolumeSnapshot", "volumesnapshots"),
        );
        match api.delete(&name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The images the suites run, under their upstream names, without a registry.
async fn import_images(work: &Path) -> Result {
    let kit = env("KIT")?;
    let images = work.join("images");
    let script = Path::new(&kit).join("recipe/e2e-images.sh");
    tool(&script.to_string_lossy(), &[&images.to_string_lossy()], None).await?;
    let socket = env("KUBE_KIT_CRI_SOCK")?;
    for entry in std::fs::read_dir(&images)? {
        let tar = entry?.path();
        if tar.extension().is_some_and(|e| e == "tar") {
            tool(
                "ctr",
                &[
                    "--address",
                    &socket,
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                    &tar.to_string_lossy(),
                ],
                None,
            )
            .await?;
        }
    }
    Ok(())
}

async fn suites(run: &Run, kit_bin: &Path, work: &Path, on_host: bool) -> Result {
    let mut skips: Vec<&str> = SKIP.to_vec();
    let (driver, default_focus) = if on_host {
        skips.extend_from_slice(HOST_SKIP);
        (repo().join("tests/e2e/driver-loop.yaml"), FOCUS)
    } else {
        // The class's shipped overlay, without the snapshot component: the guest's focus
        // leaves out snapshottable, and nothing is to be restored afterwards.
        (class_driver(run)?, GUEST_FOCUS)
    };
    let focus = std::env::var("LOCALVOL_E2E_FOCUS")
        .ok()
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| default_focus.to_string());
    let focus = if focus == "all" {
        "External.Storage".to_string()
    } else {
        skips.extend_from_slice(CI_SKIP);
        focus
    };
    let procs = std::env::var("LOCALVOL_E2E_PROCS").unwrap_or_else(|_| "2".into());
    let log_path = work.join("ginkgo.log");
    let log = std::fs::File::create(&log_path)?;
    let kubeconfig = env("KUBECONFIG")?;
    // e2e.test resolves the driver's FromFile against --repo-root.
    let status = tokio::process::Command::new(kit_bin.join("ginkgo"))
        .current_dir(repo())
        .args([
            format!("--procs={procs}"),
            "--timeout=2h".into(),
            "--no-color".into(),
            "--succinct".into(),
            format!("--focus={focus}"),
            format!("--skip={}", skips.join("|")),
            format!("--output-dir={}", work.display()),
            "--json-report=report.json".into(),
            kit_bin.join("e2e.test").display().to_string(),
            "--".into(),
            format!("-storage.testdriver={}", driver.display()),
            format!("-repo-root={}", repo().display()),
            "-provider=local".into(),
            "-node-os-distro=debian".into(),
            "-allowed-not-ready-nodes=0".into(),
            format!("-kubectl-path={}", kit_bin.join("kubectl").display()),
            "-disable-log-dump".into(),
            format!("-kubeconfig={kubeconfig}"),
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .status()
        .await?;
    if let Ok(logs) = std::env::var("LOGS") {
        let _ = std::fs::copy(&log_path, Path::new(&logs).join("e2e-ginkgo.log"));
    }
    let report = std::fs::read_to_string(work.join("report.json"))
        .map_err(|e| format!("ginkgo wrote no report.json ({e}); ginkgo {status}"))?;
    let summary = Summary::of(&serde_json::from_str(&report)?);
    let text = std::fs::read_to_string(&log_path)?;
    // ginkgo's verdict and, on failure, which specs (succinct output: a line each).
    let verdict: Vec<&str> = text
        .lines()
        .filter(|l| {
            ["[FAIL]", "Summarizing", "Ran ", "FAIL! ", "SUCCESS! "]
                .iter()
                .any(|m| l.contains(m))
        })
        .collect();
    for line in &verdict[verdict.len().saturating_sub(40)..] {
        run.note(line);
    }
    for line in summary.lines() {
        run.note(&format!("NOTE s11: {line}"));
    }
    if !status.success() || summary.failed > 0 || summary.ran == 0 {
        return Err(format!(
            "the e2e suites failed (ginkgo {status}; {} of {} specs failed; the log is e2e-ginkgo.log in the run's logs)",
            summary.failed, summary.ran
        )
        .into());
    }
    Ok(())
}

/// The loop driver's definition for the run's device class, made under target/ (e2e.test
/// reads a StorageClass FromFile relative to --repo-root): the same promises, which hold
/// on lvm-thin (snapshots, clones, growth; the guest runs this scenario on that class
/// only), and its StorageClass with S11_FSTYPE (default ext4) as the suites' default fs.
fn class_driver(run: &Run) -> Result<PathBuf> {
    let fstype = std::env::var("S11_FSTYPE").unwrap_or_else(|_| "ext4".into());
    let dir = format!("target/e2e-{}", run.device_class);
    std::fs::create_dir_all(repo().join(&dir))?;
    let class = std::fs::read_to_string(repo().join("tests/e2e/storageclass-loop.yaml"))?
        .replace(
            "device-class: loop",
            &format!("device-class: {}", run.device_class),
        )
        .replace("fstype: xfs", &format!("fstype: {fstype}"));
    std::fs::write(repo().join(&dir).join("storageclass.yaml"), class)?;
    let from_file = format!("FromFile: {dir}/storageclass.yaml");
    let driver = std::fs::read_to_string(repo().join("tests/e2e/driver-loop.yaml"))?
        .replace("FromFile: tests/e2e/storageclass-loop.yaml", &from_file)
        .replace(
            "# the class default: xfs in storageclass-loop.yaml",
            &format!("# the class default: {fstype} (storageclass.yaml beside this file)"),
        );
    if !driver.contains(&from_file) {
        return Err("tests/e2e/driver-loop.yaml: its FromFile line changed".into());
    }
    let path = repo().join(&dir).join("driver.yaml");
    std::fs::write(&path, driver)?;
    Ok(path)
}

/// What ran of the External Storage specs, from ginkgo's JSON report.
#[derive(Debug, Default, PartialEq)]
struct Summary {
    ran: usize,
    passed: usize,
    failed: usize,
    skipped: usize,
    /// Specs run per suite (the word after the test pattern: provisioning, volumes, ...).
    per_suite: std::collections::BTreeMap<String, usize>,
    failures: Vec<String>,
}

impl Summary {
    fn of(report: &Value) -> Self {
        let mut summary = Self::default();
        let specs = report
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|suite| suite["SpecReports"].as_array().into_iter().flatten());
        for spec in specs {
            let mut name: Vec<&str> = spec["ContainerHierarchyTexts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            name.extend(spec["LeafNodeText"].as_str());
            let name = name.join(" ");
            if !name.contains("External Storage") {
                continue;
            }
            match spec["State"].as_str().unwrap_or_default() {
                "skipped" | "pending" => {
                    summary.skipped += 1;
                    continue;
                }
                "passed" => summary.passed += 1,
                _ => {
                    summary.failed += 1;
                    summary.failures.push(name.clone());
                }
            }
            summary.ran += 1;
            *summary.per_suite.entry(suite_of(&name).to_string()).or_default() += 1;
        }
        summary
    }

    fn lines(&self) -> Vec<String> {
        let mut lines = vec![
            format!(
                "External Storage: {} specs ran, {} passed, {} failed, {} skipped",
                self.ran, self.passed, self.failed, self.skipped
            ),
            format!(
                "ran per suite: {}",
                self.per_suite
                    .iter()
                    .map(|(suite, n)| format!("{suite} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ];
        lines.extend(self.failures.iter().map(|f| format!("FAILED {f}")));
        lines
    }
}

/// The suite of a spec's full name: the word after `[Testpattern: ...] `.
fn suite_of(name: &str) -> &str {
    name.split_once("[Testpattern: ")
        .and_then(|(_, rest)| rest.split_once("] "))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_summary_counts_external_storage_specs_by_state_and_suite() {
        let spec = |texts: &[&str], leaf: &str, state: &str| json!({"ContainerHierarchyTexts": texts, "LeafNodeText": leaf, "State": state});
        let external = "[sig-storage] External Storage [Driver: localvol.csi.dev]";
        let report = json!([{"SpecReports": [
            spec(&[external, "[Testpattern: Dynamic PV (default fs)] provisioning"], "should provision storage", "passed"),
            spec(&[external, "[Testpattern: Dynamic PV (xfs)] volumes"], "should store data", "failed"),
            spec(&[external, "[Testpattern: Dynamic PV (ext3)] volumes"], "should store data", "skipped"),
            spec(&["[sig-storage] In-tree Volumes"], "other", "passed"),
            {"LeafNodeType": "SynchronizedBeforeSuite", "State": "passed"}
        ]}]);
        let summary = Summary::of(&report);
        assert_eq!(
            (summary.ran, summary.passed, summary.failed, summary.skipped),
            (2, 1, 1, 1)
        );
        assert_eq!(
            summary.per_suite.into_iter().collect::<Vec<_>>(),
            [("provisioning".to_string(), 1), ("volumes".to_string(), 1)]
        );
        assert_eq!(summary.failures.len(), 1);
        assert!(summary.failures[0].ends_with("volumes should store data"));
    }

    #[test]
    fn a_specs_suite_follows_its_test_pattern() {
        assert_eq!(
            suite_of(
                "External Storage [Driver: d] [Testpattern: Dynamic PV (block volmode)] volumeMode should fail"
            ),
            "volumeMode"
        );
        assert_eq!(suite_of("External Storage [Driver: d] no pattern"), "other");
    }
}
