//! The manifests as kustomize renders them (`kubectl kustomize`): what the DaemonSet
//! mounts from the host for LVM, kubelet's root directory as one setting, and each
//! overlay's device-class file as the daemon loads it.
//!
//! kubectl is required (`localvol_testkit::tools::kubectl`): without it these tests fail;
//! they never skip.

use std::path::Path;

use localvol_testkit::tools::kustomize;
use serde_yaml::Value;

const DEFAULT_ROOT: &str = "/var/lib/kubelet";
/// The root the fixtures under tests/fixtures/kubelet-root-dir set (k0s's).
const K0S_ROOT: &str = "/var/lib/k0s/kubelet";
const ROOT_ANNOTATION: &str = "localvol.csi.dev/kubelet-root-dir";

/// Every document `kubectl kustomize DIR` prints (DIR relative to the repository).
fn render(dir: &str) -> Vec<Value> {
    kustomize(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir))
}

fn object<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name} in the render"))
}

fn pod_spec<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    &object(docs, kind, name)["spec"]["template"]["spec"]
}

fn named<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list.as_sequence()?
        .iter()
        .find(|item| item["name"].as_str() == Some(name))
}

fn container<'a>(spec: &'a Value, name: &str) -> &'a Value {
    named(&spec["containers"], name).unwrap_or_else(|| panic!("no container {name}"))
}

fn host_path(spec: &Value, volume: &str) -> (String, String) {
    let v = named(&spec["volumes"], volume).unwrap_or_else(|| panic!("no volume {volume}"));
    (
        v["hostPath"]["path"].as_str().unwrap_or_default().to_string(),
        v["hostPath"]["type"].as_str().unwrap_or_default().to_string(),
    )
}

/// The container's mounts as (volume, mountPath, subPath).
fn mounts(container: &Value) -> Vec<(String, String, String)> {
    container["volumeMounts"]
        .as_sequence()
        .map(|list| {
            list.iter()
                .map(|m| {
                    let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
                    (s("name"), s("mountPath"), s("subPath"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What kubelet makes of a container's environment and arguments: each variable's
/// value with `fieldRef`s to pod annotations resolved and `$(VAR)` references to
/// earlier variables expanded.
fn expanded(pod: &Value, container: &Value) -> (Vec<(String, String)>, Vec<String>) {
    let annotations = &pod["metadata"]["annotations"];
    let mut env: Vec<(String, String)> = Vec::new();
    let expand = |text: &str, env: &[(String, String)]| {
        env.iter()
            .fold(text.to_string(), |t, (k, v)| t.replace(&format!("$({k})"), v))
    };
    for var in container["env"].as_sequence().into_iter().flatten() {
        let name = var["name"].as_str().unwrap().to_string();
        let value = if let Some(field) = var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            match field
                .strip_prefix("metadata.annotations['")
                .and_then(|f| f.strip_suffix("']"))
            {
                Some(key) => annotations[key].as_str().unwrap_or_default().to_string(),
                None => format!("<{field}>"),
            }
        } else {
            expand(var["value"].as_str().unwrap_or_default(), &env)
        };
        env.push((name, value));
    }
    let args = container["args"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|a| expand(a.as_str().unwrap(), &env))
        .collect();
    (env, args)
}

fn env_value(env: &[(String, String)], name: &str) -> String {
    env.iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no env {name}"))
        .1
        .clone()
}

const LVM_DIRS: [(&str, &str); 3] = [
    ("lvm-config", "/etc/lvm"),
    ("run-lvm", "/run/lvm"),
    ("run-lock-lvm", "/run/lock/lvm"),
];

#[test]
fn lvm_overlays_mount_the_hosts_lvm_configuration_locks_and_run_dir() {
    for overlay in [
        "deploy/overlays/lvm",
        "deploy/overlays/lvm-thin",
        "deploy/overlays/pmem-lvm",
        "tests/cluster/overlays/mixed",
        "tests/cluster/overlays/all-classes",
    ] {
        let docs = render(overlay);
        let spec = pod_spec(&docs, "DaemonSet", "localvol-node");
        let localvol = container(spec, "localvol");
        let mounted = mounts(localvol);
        for (volume, path) in LVM_DIRS {
            assert!(
                mounted.contains(&(volume.to_string(), path.to_string(), String::new())),
                "{overlay}: {path} not mounted whole from volume {volume}: {mounted:?}"
            );
            let mount = named(&localvol["volumeMounts"], volume).unwrap();
            assert_ne!(
                mount["readOnly"].as_bool(),
                Some(true),
                "{overlay}: {path}: LVM writes backups there"
            );
            // Same path as on the host, and a node without LVM still starts the pod.
            assert_eq!(
                host_path(spec, volume),
                (path.to_string(), "DirectoryOrCreate".to_string()),
                "{overlay}"
            );
        }
    }
}

#[test]
fn the_loop_overlay_needs_no_lvm_on_the_host() {
    let docs = render("deploy/overlays/loop");
    let spec = pod_spec(&docs, "DaemonSet", "localvol-node");
    for (volume, path) in LVM_DIRS {
        assert!(
            named(&spec["volumes"], volume).is_none(),
            "loop overlay has volume {volume}"
        );
        assert!(
            !mounts(container(spec, "localvol"))
                .iter()
                .any(|(_, mount, _)| mount == path),
            "loop overlay mounts {path}"
        );
    }
}

/// Every string in the render, with where it is (for the messages).
fn strings(value: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match value {
        Value::String(s) => out.push((at.to_string(), s.clone())),
        Value::Sequence(list) => {
            for (i, v) in list.iter().enumerate() {
                strings(v, &format!("{at}[{i}]"), out);
            }
        }
        Value::Mapping(map) => {
            for (k, v) in map {
                strings(v, &format!("{at}.{}", k.as_str().unwrap_or("?")), out);
            }
        }
        _ => {}
    }
}

fn all_strings(docs: &[Value]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        strings(doc, &format!("doc{i}"), &mut out);
    }
    out
}

/// (fixture, the shipped overlay it starts from, the same plus its components)
const ROOT_FIXTURES: [(&str, &str); 3] = [
    ("tests/fixtures/kubelet-root-dir/loop", "deploy/overlays/loop"),
    (
        "tests/fixtures/kubelet-root-dir/registrar",
        "deploy/overlays/loop-registrar",
    ),
    (
        "tests/fixtures/kubelet-root-dir/resizer",
        "tests/cluster/overlays/central-resizer",
    ),
];

#[test]
fn kubelet_root_dir_is_one_setting_for_every_kubelet_path() {
    for (fixture, shipped) in ROOT_FIXTURES {
        let moved = render(fixture);
        // Nothing still names the default root, the setting itself is not applied.
        let left: Vec<_> = all_strings(&moved)
            .into_iter()
            .filter(|(_, s)| s.contains(DEFAULT_ROOT))
            .collect();
        assert!(left.is_empty(), "{fixture}: {left:#?}");
        assert!(
            !moved
                .iter()
                .any(|d| d["metadata"]["name"].as_str() == Some("kubelet-root-dir")),
            "{fixture}: the setting's ConfigMap would be applied"
        );

        // Every place that held the default root holds the new one (the shipped
        // render has the same paths; only the test environment's own objects differ).
        let default_paths: Vec<String> = all_strings(&render(shipped))
            .into_iter()
            .filter(|(_, s)| s.contains(DEFAULT_ROOT))
            .map(|(_, s)| s.replace(DEFAULT_ROOT, K0S_ROOT))
            .collect();
        let moved_values: Vec<String> = all_strings(&moved).into_iter().map(|(_, s)| s).collect();
        assert!(!default_paths.is_empty());
        for expected in &default_paths {
            assert!(moved_values.contains(expected), "{fixture}: {expected} missing");
        }

        // What the containers see once kubelet resolved their environment.
        let ds = object(&moved, "DaemonSet", "localvol-node");
        let pod = &ds["spec"]["template"];
        let spec = &pod["spec"];
        assert_eq!(
            pod["metadata"]["annotations"][ROOT_ANNOTATION].as_str(),
            Some(K0S_ROOT)
        );
        assert_eq!(host_path(spec, "kubelet-dir").0, K0S_ROOT, "{fixture}");
        assert_eq!(
            host_path(spec, "socket-dir").0,
            format!("{K0S_ROOT}/plugins/localvol.csi.dev"),
            "{fixture}"
        );
        let localvol = container(spec, "localvol");
        assert!(
            mounts(localvol).contains(&("kubelet-dir".into(), K0S_ROOT.into(), String::new())),
            "{fixture}"
        );
        let (env, _) = expanded(pod, localvol);
        assert_eq!(env_value(&env, "LOCALVOL_KUBELET_ROOT_DIR"), K0S_ROOT);
        assert_eq!(
            env_value(&env, "LOCALVOL_ENDPOINT"),
            format!("unix://{K0S_ROOT}/plugins/localvol.csi.dev/csi.sock")
        );
        assert_eq!(
            env_value(&env, "LOCALVOL_REGISTRATION_DIR"),
            format!("{K0S_ROOT}/plugins_registry")
        );
        if let Some(registrar) = named(&spec["containers"], "node-driver-registrar") {
            let (_, args) = expanded(pod, registrar);
            assert!(
                args.contains(&format!(
                    "--kubelet-registration-path={K0S_ROOT}/plugins/localvol.csi.dev/csi.sock"
                )),
                "{args:?}"
            );
            assert!(mounts(registrar).contains(&(
                "kubelet-dir".into(),
                "/registration".into(),
                "plugins_registry".into()
            )));
        }
        if fixture.ends_with("resizer") {
            let resizer = pod_spec(&moved, "Deployment", "localvol-resizer");
            assert_eq!(
                host_path(resizer, "socket-dir").0,
                format!("{K0S_ROOT}/plugins/localvol.csi.dev")
            );
        }
    }
}

#[test]
fn without_the_component_every_kubelet_path_is_the_default_root() {
    let docs = render("deploy/overlays/loop-registrar");
    let ds = object(&docs, "DaemonSet", "localvol-node");
    let pod = &ds["spec"]["template"];
    assert_eq!(
        pod["metadata"]["annotations"][ROOT_ANNOTATION].as_str(),
        Some(DEFAULT_ROOT)
    );
    let (env, _) = expanded(pod, container(&pod["spec"], "localvol"));
    assert_eq!(
        env_value(&env, "LOCALVOL_ENDPOINT"),
        format!("unix://{DEFAULT_ROOT}/plugins/localvol.csi.dev/csi.sock")
    );
    let (_, args) = expanded(pod, container(&pod["spec"], "node-driver-registrar"));
    assert!(args.contains(&format!(
        "--kubelet-registration-path={DEFAULT_ROOT}/plugins/localvol.csi.dev/csi.sock"
    )));
}

/// Every overlay's device-class file, shipped or the tests' own (the mixed node's), is
/// one the daemon accepts (parsed and validated as `serve` does), and each of its
/// StorageClasses names a class in it.
#[test]
fn every_overlays_config_loads_and_its_storage_classes_name_its_classes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = Vec::new();
    for overlays in ["deploy/overlays", "tests/cluster/overlays"] {
        dirs.extend(
            std::fs::read_dir(root.join(overlays))
                .unwrap()
                .map(|e| e.unwrap().path()),
        );
    }
    let mut seen = 0;
    for dir in dirs {
        let config = dir.join("config.yaml");
        if !config.is_file() {
            continue;
        }
        seen += 1;
        let data = tempfile::tempdir().unwrap();
        let classes = localvol::config::load_classes(Some(&config), data.path(), 1 << 30)
            .unwrap_or_else(|e| panic!("{}: {e}", config.display()));
        let names: Vec<String> = classes.iter().map(|c| c.name.to_string()).collect();
        let rel = dir.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap();
        let docs = render(rel.to_str().unwrap());
        let storage_classes: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "StorageClass").collect();
        assert!(!storage_classes.is_empty(), "{}: no StorageClass", rel.display());
        for sc in storage_classes {
            let class = sc["parameters"]["localvol.csi.dev/device-class"]
                .as_str()
                .unwrap_or_default();
            assert!(
                names.iter().any(|n| n == class),
                "{}: StorageClass {} names device class {class:?}, the config has {names:?}",
                rel.display(),
                sc["metadata"]["name"].as_str().unwrap_or_default()
            );
        }
    }
    assert!(seen >= 6, "only {seen} overlays with a config.yaml");
}
