//! The Helm chart, deploy/helm/localvol, against the kustomize manifests: the chart is
//! the second way to install what deploy/ holds, and must never drift from it. For each
//! values file of the chart's `ci/`, `helm template` renders exactly the objects
//! `kubectl kustomize` renders for the same configuration (an overlay, or a fixture
//! that adds components to one), after the differences each tool makes by design:
//! Helm's own labels, the config's checksum annotation (kustomize hashes the
//! ConfigMap's name instead), and the Namespace, which a chart does not own.
//! `helm lint --strict` passes on each, and values the chart refuses fail at render,
//! naming the field.
//!
//! helm and kubectl are required (`localvol_testkit::tools`); without them these tests
//! fail, they never skip. tests/tools/helm.sh installs helm.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use localvol::config::FileConfig;
use localvol_testkit::tools::{helm, kustomize, yaml_documents};
use serde_yaml::{Mapping, Value};

const CHART: &str = "deploy/helm/localvol";
const NAMESPACE: &str = "localvol-system";

/// Each values file of the chart's ci/ (by its name there) and the kustomization that
/// renders the same.
const CASES: &[(&str, &str)] = &[
    ("loop", "deploy/overlays/loop"),
    ("loop-registrar", "deploy/overlays/loop-registrar"),
    ("lvm", "deploy/overlays/lvm"),
    ("lvm-thin", "deploy/overlays/lvm-thin"),
    ("lvm-thin-snapshots", "tests/fixtures/helm/lvm-thin-snapshots"),
    ("pmem", "deploy/overlays/pmem"),
    ("pmem-lvm", "deploy/overlays/pmem-lvm"),
    ("k0s-registrar", "tests/fixtures/kubelet-root-dir/registrar"),
    ("k0s-resizer", "tests/fixtures/kubelet-root-dir/resizer"),
];
/// The values the host cluster's scenario 14 installs with, and the overlay the rest of
/// that suite deploys: so the chart installs what the suite proved.
const CLUSTER_VALUES: &str = "tests/cluster/helm-values.yaml";
const CLUSTER_OVERLAY: &str = "tests/cluster/overlays/builtin";

/// The labels Helm's convention adds to every object, which the overlays do not carry.
const HELM_LABELS: [&str; 4] = [
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "helm.sh/chart",
];
const CHECKSUM: &str = "checksum/config";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn values_file(case: &str) -> PathBuf {
    repo(&format!("{CHART}/ci/{case}-values.yaml"))
}

/// `helm ARGS...` in the repository: its stdout, or its stderr as the error.
fn run_helm(args: &[&str]) -> Result<String, String> {
    let out = Command::new(helm())
        .args(args)
        .current_dir(repo(""))
        .output()
        .expect("helm runs");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The chart rendered with the values files given, as a release in NAMESPACE.
fn template(values: &[&Path]) -> Result<Vec<Value>, String> {
    let mut args = vec!["template", "localvol", CHART, "--namespace", NAMESPACE];
    let values: Vec<String> = values.iter().map(|v| v.display().to_string()).collect();
    for v in &values {
        args.extend(["--values", v]);
    }
    run_helm(&args).map(|text| yaml_documents(&text))
}

/// kustomize's generated name of the config map, `localvol-config-<10-char hash>`, as
/// the chart names it.
fn unhashed(s: &str) -> Option<&'static str> {
    let hash = s.strip_prefix("localvol-config-")?;
    (hash.len() == 10 && hash.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
        .then_some("localvol-config")
}

/// VALUE with what may legitimately differ made equal: the config map's hashed name
/// restored, lists of named items (containers, env, volumes, mounts, ports) in name
/// order (a strategic-merge patch puts its items first; the order means nothing to
/// the API but for env's `$(VAR)` references, checked on their own below), and the
/// device-class file as the daemon parses it, so that its YAML's spelling does not count.
fn canonical(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(unhashed(s).map_or_else(|| s.clone(), str::to_string)),
        Value::Sequence(items) => {
            let mut items: Vec<Value> = items.iter().map(canonical).collect();
            if !items.is_empty() && items.iter().all(|i| i["name"].is_string()) {
                items.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            }
            Value::Sequence(items)
        }
        Value::Mapping(m) => Value::Mapping(
            m.iter()
                .map(|(k, v)| (k.clone(), canonical(v)))
                .collect::<Mapping>(),
        ),
        other => other.clone(),
    }
}

fn key(doc: &Value) -> (String, String) {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (s(&doc["kind"]), s(&doc["metadata"]["name"]))
}

/// The chart's objects with Helm's labels and the checksum annotation taken off (each
/// checked to be there first).
fn without_helm_conventions(mut doc: Value) -> Value {
    let what = format!("{:?}", key(&doc));
    let labels = doc["metadata"]["labels"]
        .as_mapping_mut()
        .unwrap_or_else(|| panic!("{what}: no labels"));
    for label in HELM_LABELS {
        assert!(labels.remove(label).is_some(), "{what}: no label {label}");
    }
    if doc["kind"] == "DaemonSet" {
        let annotations = doc["spec"]["template"]["metadata"]["annotations"]
            .as_mapping_mut()
            .unwrap();
        assert!(
            annotations.remove(CHECKSUM).is_some(),
            "the DaemonSet's pods carry no {CHECKSUM}"
        );
    }
    doc
}

fn by_key(docs: Vec<Value>) -> BTreeMap<(String, String), Value> {
    let mut out = BTreeMap::new();
    for mut doc in docs {
        if doc["kind"] == "ConfigMap" {
            // The device-class file as the daemon reads it (5 and 5.0 are one ratio;
            // 100.0 GB would not be), in its own terms.
            for (_, text) in doc["data"].as_mapping_mut().unwrap().iter_mut() {
                let file: FileConfig = serde_yaml::from_str(text.as_str().unwrap()).unwrap_or_else(|e| {
                    panic!("the daemon cannot read this device-class file: {e}\n{text:?}")
                });
                *text = Value::String(format!("{file:?}"));
            }
        }
        let doc = canonical(&doc);
        let k = key(&doc);
        assert!(out.insert(k.clone(), doc).is_none(), "{k:?} rendered twice");
    }
    out
}

#[test]
fn every_values_file_renders_what_its_kustomization_renders() {
    let mut failures = Vec::new();
    let cases = CASES
        .iter()
        .map(|(case, dir)| (values_file(case), *dir))
        .chain([(repo(CLUSTER_VALUES), CLUSTER_OVERLAY)]);
    for (values, dir) in cases {
        let case = values.strip_prefix(repo("")).unwrap().display().to_string();
        let chart = template(&[&values]).unwrap_or_else(|e| panic!("{case}: {e}"));
        let chart = by_key(chart.into_iter().map(without_helm_conventions).collect());
        // The overlays make and label the namespace; a chart is installed into one
        // (deploy/helm/localvol/README.md says how to make it with the same labels).
        let (namespaces, kustomized): (Vec<Value>, Vec<Value>) = kustomize(&repo(dir))
            .into_iter()
            .partition(|d| d["kind"] == "Namespace");
        assert_eq!(namespaces.len(), 1, "{dir}: one Namespace");
        assert_eq!(namespaces[0]["metadata"]["name"], NAMESPACE);
        let kustomized = by_key(kustomized);
        let keys: Vec<_> = chart.keys().chain(kustomized.keys()).collect();
        for k in keys {
            match (chart.get(k), kustomized.get(k)) {
                (Some(a), Some(b)) if a == b => {}
                (a, b) => failures.push(format!(
                    "{case} ({dir}): {k:?}\n--- chart\n{}--- kustomize\n{}",
                    a.map_or("(none)\n".into(), |a| serde_yaml::to_string(a).unwrap()),
                    b.map_or("(none)\n".into(), |b| serde_yaml::to_string(b).unwrap()),
                )),
            }
        }
    }
    failures.dedup();
    assert!(
        failures.is_empty(),
        "the chart and deploy/ differ:\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_table_holds_every_ci_values_file() {
    let mut files: Vec<String> = std::fs::read_dir(repo(&format!("{CHART}/ci")))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    let mut named: Vec<String> = CASES.iter().map(|(c, _)| format!("{c}-values.yaml")).collect();
    named.sort();
    assert_eq!(files, named);
}

#[test]
fn helm_lint_strict_passes_on_the_defaults_and_every_ci_values_file() {
    run_helm(&["lint", "--strict", CHART]).unwrap_or_else(|e| panic!("defaults: {e}"));
    for (case, _) in CASES {
        let values = values_file(case).display().to_string();
        run_helm(&["lint", "--strict", CHART, "--values", &values]).unwrap_or_else(|e| panic!("{case}: {e}"));
    }
}

/// The defaults are the loop overlay's: `helm install` with no values gives storage.
#[test]
fn the_defaults_are_the_loop_overlays() {
    let defaults = by_key(template(&[]).unwrap());
    let loop_case = by_key(template(&[&values_file("loop")]).unwrap());
    assert_eq!(defaults, loop_case);
}

/// Every `$(VAR)` in a container's env or args names a variable defined before it:
/// kubelet leaves a later one unexpanded.
#[test]
fn env_references_name_an_earlier_variable() {
    for (case, _) in CASES {
        for doc in template(&[&values_file(case)]).unwrap() {
            let spec = &doc["spec"]["template"]["spec"];
            for c in spec["containers"].as_sequence().into_iter().flatten() {
                let mut defined: Vec<&str> = Vec::new();
                let check = |text: &str, defined: &[&str]| {
                    for part in text.split("$(").skip(1) {
                        let var = part.split(')').next().unwrap();
                        assert!(
                            defined.contains(&var),
                            "{case}: {:?} container {}: $({var}) before its definition",
                            key(&doc),
                            c["name"].as_str().unwrap()
                        );
                    }
                };
                for var in c["env"].as_sequence().into_iter().flatten() {
                    check(var["value"].as_str().unwrap_or_default(), &defined);
                    defined.push(var["name"].as_str().unwrap());
                }
                for arg in c["args"].as_sequence().into_iter().flatten() {
                    check(arg.as_str().unwrap(), &defined);
                }
            }
        }
    }
}

fn scratch_values(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn daemonset(docs: &[Value]) -> &Value {
    docs.iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet")
}

/// A changed device-class file changes the pods' checksum, so `helm upgrade` rolls the
/// DaemonSet (kustomize renames the config map for the same effect); a changed
/// StorageClass alone does not restart the node plugin.
#[test]
fn a_config_change_rolls_the_daemonset_and_only_that() {
    let checksum =
        |docs: &[Value]| daemonset(docs)["spec"]["template"]["metadata"]["annotations"][CHECKSUM].clone();
    let base = template(&[]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let capacity = scratch_values(
        &dir,
        "capacity.yaml",
        "deviceClasses: [{name: loop, kind: loop, default: true, fs-type: ext4, directory: /var/lib/localvol/loop, capacity-gb: 200}]\n",
    );
    let other_class = scratch_values(
        &dir,
        "class.yaml",
        "storageClasses: [{name: localvol-loop, deviceClass: loop, fsType: xfs}]\n",
    );
    assert_ne!(checksum(&base), checksum(&template(&[&capacity]).unwrap()));
    assert_eq!(checksum(&base), checksum(&template(&[&other_class]).unwrap()));
}

/// lvmHost: auto mounts the host's LVM directories exactly when a class uses LVM; true
/// and false override it.
#[test]
fn lvm_host_follows_the_classes_unless_set() {
    let mounts = |docs: &[Value]| -> bool {
        daemonset(docs)["spec"]["template"]["spec"]["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "lvm-config")
    };
    assert!(!mounts(&template(&[]).unwrap()));
    assert!(mounts(&template(&[&values_file("lvm")]).unwrap()));
    assert!(mounts(&template(&[&values_file("pmem-lvm")]).unwrap()));
    assert!(!mounts(&template(&[&values_file("pmem")]).unwrap()));
    let dir = tempfile::tempdir().unwrap();
    let on = scratch_values(&dir, "lvm-on.yaml", "lvmHost: true\n");
    let off = scratch_values(&dir, "lvm-off.yaml", "lvmHost: false\n");
    assert!(mounts(&template(&[&on]).unwrap()));
    assert!(!mounts(&template(&[&values_file("lvm"), &off]).unwrap()));
}

/// Values the chart cannot install fail at render with the field named, not in the pod.
#[test]
fn wrong_values_fail_at_render_naming_the_field() {
    let cases: &[(&str, &str)] = &[
        ("registration: sidecar\n", "/registration"),
        ("resizer: central\n", "/resizer"),
        ("lvmHost: sometimes\n", "/lvmHost"),
        ("kubeletRootDir: var/lib/kubelet\n", "/kubeletRootDir"),
        ("kubeletRootDir: /var/lib/kubelet/\n", "/kubeletRootDir"),
        ("deviceClasses: []\n", "/deviceClasses"),
        ("deviceClasses: [{name: z, kind: zfs}]\n", "/deviceClasses/0/kind"),
        ("deviceClasses: [{name: a, kind: lvm}]\n", "volume-group"),
        (
            "deviceClasses: [{name: a, kind: lvm-thin, volume-group: vg}]\n",
            "thin-pool",
        ),
        (
            "deviceClasses: [{name: a, kind: pmem, region: region0}]\n",
            "mode",
        ),
        (
            "deviceClasses: [{name: a, kind: pmem, mode: fsdax}]\n",
            "/deviceClasses/0/mode",
        ),
        (
            "deviceClasses: [{name: a, kind: loop, volume-group: vg}]\n",
            "volume-group",
        ),
        (
            "deviceClasses: [{name: Loop, kind: loop}]\n",
            "/deviceClasses/0/name",
        ),
        (
            "deviceClasses: [{name: a, kind: loop}, {name: a, kind: loop}]\nstorageClasses: []\n",
            "deviceClasses: a is named twice",
        ),
        (
            "storageClasses: [{name: localvol-x, deviceClass: lvm}]\n",
            "storageClasses: localvol-x names device class lvm",
        ),
        (
            "storageClasses: [{name: x, deviceClass: loop, fsType: btrfs}]\n",
            "fsType",
        ),
        (
            "storageClasses: [{name: x, deviceClass: loop, reclaimPolicy: Recycle}]\n",
            "reclaimPolicy",
        ),
        ("imagee: {repository: x}\n", "imagee"),
        ("node: {resources: {request: {cpu: 1}}}\n", "request"),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (i, (values, expected)) in cases.iter().enumerate() {
        let file = scratch_values(&dir, &format!("wrong-{i}.yaml"), values);
        match template(&[&file]) {
            Ok(_) => panic!("{values:?}: rendered"),
            Err(e) => assert!(e.contains(expected), "{values:?}: expected {expected:?} in\n{e}"),
        }
    }
}
