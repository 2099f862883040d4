//! One version everywhere: Cargo.toml, `localvol --version`, the image tag the manifests
//! deploy, the Helm chart's version and appVersion, and the newest release in
//! CHANGELOG.md. A release that bumps one of them and
//! forgets another fails here.

use std::process::Command;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn repo_file(path: &str) -> String {
    let full = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

#[test]
fn the_binary_reports_the_crate_version() {
    let out = Command::new(env!("CARGO_BIN_EXE_localvol"))
        .arg("--version")
        .output()
        .expect("localvol --version runs");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("localvol {VERSION}")
    );
}

#[test]
fn the_manifests_deploy_the_image_of_this_version() {
    let kustomization = repo_file("deploy/base/kustomization.yaml");
    let tags: Vec<&str> = kustomization
        .lines()
        .filter_map(|l| l.trim().strip_prefix("newTag:"))
        .map(|t| t.trim().trim_matches('"'))
        .collect();
    assert_eq!(tags, vec![VERSION], "deploy/base/kustomization.yaml newTag");
}

#[test]
fn the_chart_is_this_version_and_deploys_its_image() {
    let chart: serde_yaml::Value =
        serde_yaml::from_str(&repo_file("deploy/helm/localvol/Chart.yaml")).unwrap();
    assert_eq!(chart["version"].as_str(), Some(VERSION), "Chart.yaml version");
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(VERSION),
        "Chart.yaml appVersion"
    );
    // The image tag defaults to the appVersion.
    let values: serde_yaml::Value =
        serde_yaml::from_str(&repo_file("deploy/helm/localvol/values.yaml")).unwrap();
    assert_eq!(values["image"]["tag"].as_str(), Some(""), "values.yaml image.tag");
}

#[test]
fn the_changelog_names_this_version_as_the_newest_release() {
    let changelog = repo_file("CHANGELOG.md");
    let newest = changelog
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .find(|heading| !heading.starts_with("Unreleased"))
        .expect("a release heading in CHANGELOG.md");
    let version = newest.split_whitespace().next().unwrap_or_default();
    assert_eq!(version, VERSION, "newest CHANGELOG.md release: {newest:?}");
}
