//! `reclaim:` of the configuration file: this node's own ReclaimSpace schedules,
//! validated into the policy `crate::reclaim_policy` applies.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use crate::reclaim_policy::NodePolicy;
use crate::reclaim_policy::schedule::Schedule;

/// `reclaim:` in the configuration file: this node's own schedules, below the cluster's
/// csi-addons annotations.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ReclaimFileConfig {
    /// Scheduled runs (default true). On-demand runs over --csi-addons-endpoint still work.
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
    /// For volumes no annotation or storage-classes entry names a schedule for.
    #[serde(default)]
    pub default_schedule: Option<String>,
    /// StorageClass name to schedule.
    #[serde(default)]
    pub storage_classes: BTreeMap<String, String>,
    /// Namespace of the csi-addons-config ConfigMap (default csi-addons-system).
    #[serde(default)]
    pub csi_addons_namespace: Option<String>,
}

fn enabled_by_default() -> bool {
    true
}

/// Validated reclaim settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ReclaimConfig {
    pub policy: NodePolicy,
    pub csi_addons_socket: Option<PathBuf>,
    pub concurrency: usize,
    pub timeout: Duration,
}

/// Parses the schedules now: a typo in the node's own file is a startup error, not a
/// silent @weekly.
pub fn validate_reclaim(file: Option<ReclaimFileConfig>) -> Result<NodePolicy, ConfigError> {
    let invalid = |m: String| ConfigError::Invalid(m);
    let mut policy = NodePolicy::default();
    let Some(file) = file else {
        return Ok(policy);
    };
    policy.enabled = file.enabled;
    if let Some(text) = &file.default_schedule {
        policy.default_schedule =
            Some(Schedule::parse(text).map_err(|e| invalid(format!("reclaim.default-schedule: {e}")))?);
    }
    for (class, text) in &file.storage_classes {
        let schedule =
            Schedule::parse(text).map_err(|e| invalid(format!("reclaim.storage-classes.{class}: {e}")))?;
        policy.storage_classes.insert(class.clone(), schedule);
    }
    if let Some(ns) = file.csi_addons_namespace {
        let label = !ns.is_empty()
            && ns.len() <= 63
            && ns
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !ns.starts_with('-')
            && !ns.ends_with('-');
        if !label {
            return Err(invalid(format!(
                "reclaim.csi-addons-namespace {ns:?} is not a namespace name"
            )));
        }
        policy.csi_addons_namespace = ns;
    }
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::super::FileConfig;
    use super::*;

    fn reclaim(yaml: &str) -> Result<NodePolicy, ConfigError> {
        let file: FileConfig = serde_yaml::from_str(yaml).map_err(|source| ConfigError::Parse {
            path: "test.yaml".into(),
            source,
        })?;
        validate_reclaim(file.reclaim)
    }

    #[test]
    fn reclaim_settings_validate() {
        let classes = "device-classes: [{name: a, kind: loop}]\n";
        assert_eq!(reclaim(classes).unwrap(), NodePolicy::default());
        let policy = reclaim(&format!(
            "{classes}reclaim:\n  enabled: false\n  default-schedule: '@weekly'\n  storage-classes: {{fast: '30 2 * * *'}}\n  csi-addons-namespace: storage\n"
        ))
        .unwrap();
        assert!(!policy.enabled);
        assert_eq!(policy.default_schedule, Some(Schedule::Weekly));
        assert_eq!(policy.storage_classes["fast"].to_string(), "30 2 * * *");
        assert_eq!(policy.csi_addons_namespace, "storage");
        assert!(reclaim(&format!("{classes}reclaim: {{}}\n")).unwrap().enabled);
        for (yaml, expected) in [
            (
                "reclaim: {default-schedule: '@often'}",
                "reclaim.default-schedule",
            ),
            (
                "reclaim: {storage-classes: {fast: '61 * * * *'}}",
                "reclaim.storage-classes.fast",
            ),
            ("reclaim: {csi-addons-namespace: 'Bad_NS'}", "not a namespace"),
            ("reclaim: {schedule: '@daily'}", "unknown field"),
        ] {
            let err = reclaim(&format!("{classes}{yaml}\n")).unwrap_err().to_string();
            assert!(err.contains(expected), "{yaml}: {err}");
        }
    }
}
