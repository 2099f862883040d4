//! The outside programs the manifest tests render with: kubectl (kustomize) and helm.
//! Each is found at the path a setting names, else on PATH, else where this project
//! installs it; without one a test fails with how to get it, never skips.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_yaml::Value;

fn find(setting: &str, name: &str, installed: &str, how: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(setting) {
        return path.into();
    }
    let on_path = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    let installed = Path::new(installed);
    on_path
        .or_else(|| installed.is_file().then(|| installed.to_path_buf()))
        .unwrap_or_else(|| panic!("{name} is needed: set {setting}, put it on PATH or {how}"))
}

/// kubectl: `LOCALVOL_KUBECTL`, PATH, or the kube-kit's (`install.sh /var/cache/kube-kit`).
pub fn kubectl() -> PathBuf {
    find(
        "LOCALVOL_KUBECTL",
        "kubectl",
        "/var/cache/kube-kit/bin/kubectl",
        "install the kube-kit (../shared/kube-kit/install.sh /var/cache/kube-kit)",
    )
}

/// helm v4: `LOCALVOL_HELM`, PATH, or tests/tools/helm.sh's.
pub fn helm() -> PathBuf {
    find(
        "LOCALVOL_HELM",
        "helm",
        "/var/cache/localvol-tools/helm-4.1.4/helm",
        "run tests/tools/helm.sh",
    )
}

/// Every document of a YAML stream, empty ones left out.
pub fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|doc| !doc.is_null())
        .collect()
}

/// Every document `kubectl kustomize DIR` prints.
pub fn kustomize(dir: &Path) -> Vec<Value> {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_documents(&String::from_utf8(out.stdout).unwrap())
}
