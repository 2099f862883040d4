//! Which schedule applies to a volume: csi-addons' annotations and ConfigMap, then this
//! node's configuration. Pure functions over the Kubernetes objects, so the precedence
//! is tested without a cluster.
//!
//! csi-addons semantics, as its PersistentVolumeClaim controller applies them:
//! - `schedule-precedence: pvc` (the default; `""` means the same): the first of the
//!   PVC, its Namespace, its StorageClass that carries the schedule annotation wins.
//!   `storageclass` (or the older `sc-only`): only the StorageClass is read.
//! - `reclaimspace.csiaddons.openshift.io/enable: "false"` on any object read under the
//!   precedence turns reclaim off for the volume, whatever the schedules say.
//! - A schedule that does not parse counts as found, and is replaced by `@weekly` with a
//!   warning (an event on the PVC).
//! - `cronjob-stagger-window` is in whole hours (default 2; 0 or less disables).
//!
//! localvol adds a layer below the cluster's: the node configuration's per-StorageClass
//! map, then its default schedule. Annotations are the cluster's explicit intent, so they
//! win; the node's file only fills in where the cluster says nothing.

pub mod schedule;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use schedule::{FALLBACK, Schedule};

/// The schedule annotation csi-addons reads on PVCs, Namespaces and StorageClasses.
pub const SCHEDULE_ANNOTATION: &str = "reclaimspace.csiaddons.openshift.io/schedule";
/// `"false"` turns reclaim off for the object's volumes (csi-addons semantics).
pub const ENABLE_ANNOTATION: &str = "reclaimspace.csiaddons.openshift.io/enable";

/// Name of csi-addons' ConfigMap (in the csi-addons operator's namespace).
pub const CONFIG_MAP_NAME: &str = "csi-addons-config";
pub const PRECEDENCE_KEY: &str = "schedule-precedence";
pub const STAGGER_WINDOW_KEY: &str = "cronjob-stagger-window";
const DEFAULT_STAGGER_HOURS: i64 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precedence {
    /// PVC, then Namespace, then StorageClass.
    Pvc,
    /// The StorageClass only.
    StorageClass,
}

/// What the csi-addons ConfigMap says, with its defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    pub precedence: Precedence,
    pub stagger_window: Duration,
    /// Values that could not be used (the default stands for them).
    pub warnings: Vec<String>,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            precedence: Precedence::Pvc,
            stagger_window: Duration::from_secs(DEFAULT_STAGGER_HOURS as u64 * 3600),
            warnings: Vec::new(),
        }
    }
}

impl ClusterSettings {
    /// Reads the two keys localvol uses. The ConfigMap is the csi-addons operator's, so
    /// its other keys are not ours to judge; a bad value of ours keeps the default and is
    /// reported (csi-addons refuses to start instead; a node daemon should not).
    pub fn from_config_map(cm: Option<&ConfigMap>) -> Self {
        let mut settings = Self::default();
        let Some(data) = cm.and_then(|cm| cm.data.as_ref()) else {
            return settings;
        };
        if let Some(value) = data.get(PRECEDENCE_KEY) {
            match value.as_str() {
                "" | "pvc" => settings.precedence = Precedence::Pvc,
                "storageclass" | "sc-only" => settings.precedence = Precedence::StorageClass,
                other => settings.warnings.push(format!(
                    "{CONFIG_MAP_NAME}: {PRECEDENCE_KEY} {other:?} is neither \"pvc\" nor \"storageclass\"; using \"pvc\""
                )),
            }
        }
        if let Some(value) = data.get(STAGGER_WINDOW_KEY) {
            match value.trim().parse::<i64>() {
                Ok(hours) => settings.stagger_window = Duration::from_secs(hours.clamp(0, 24 * 366) as u64 * 3600),
                Err(_) => settings.warnings.push(format!(
                    "{CONFIG_MAP_NAME}: {STAGGER_WINDOW_KEY} {value:?} is not a whole number of hours; using {DEFAULT_STAGGER_HOURS}"
                )),
            }
        }
        settings
    }
}

/// The node's own reclaim settings (validated from the configuration file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePolicy {
    /// Scheduled runs at all; on-demand runs over the csi-addons API are not affected.
    pub enabled: bool,
    /// For volumes about which nothing else says anything. `None`: they are not trimmed.
    pub default_schedule: Option<Schedule>,
    /// By StorageClass name.
    pub storage_classes: BTreeMap<String, Schedule>,
    /// Where the csi-addons ConfigMap lives.
    pub csi_addons_namespace: String,
}

impl Default for NodePolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            default_schedule: None,
            storage_classes: BTreeMap::new(),
            csi_addons_namespace: "csi-addons-system".to_string(),
        }
    }
}

/// Where a schedule (or the decision not to run) came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Pvc,
    Namespace,
    StorageClass,
    NodeStorageClass,
    NodeDefault,
}

impl Source {
    pub fn as_str(&self) -> &'static str {
        match self {
            Source::Pvc => "PersistentVolumeClaim",
            Source::Namespace => "Namespace",
            Source::StorageClass => "StorageClass",
            Source::NodeStorageClass => "node configuration (storage-classes)",
            Source::NodeDefault => "node configuration (default-schedule)",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// `enable: "false"` on the named object.
    Disabled(Source),
    /// Nothing names a schedule.
    Unscheduled,
    Scheduled {
        schedule: Schedule,
        source: Source,
        /// Set when the schedule found was invalid and `@weekly` stands in for it.
        warning: Option<String>,
    },
}

/// The objects one volume's schedule depends on, as the caches hold them now.
#[derive(Debug, Clone, Default)]
pub struct ClaimObjects<'a> {
    pub pvc: Option<&'a PersistentVolumeClaim>,
    pub namespace: Option<&'a Namespace>,
    pub storage_class: Option<&'a StorageClass>,
}

fn annotation<'a>(annotations: Option<&'a BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
    annotations.and_then(|a| a.get(key)).map(String::as_str)
}

/// The PVC's StorageClass name, when it has one (statically provisioned PVs have none).
pub fn storage_class_name(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// Applies csi-addons' precedence, then the node's layers.
pub fn resolve(objects: &ClaimObjects<'_>, cluster: &ClusterSettings, node: &NodePolicy) -> Resolution {
    let levels: Vec<(Source, Option<&BTreeMap<String, String>>)> = match cluster.precedence {
        Precedence::Pvc => vec![
            (
                Source::Pvc,
                objects.pvc.and_then(|o| o.metadata.annotations.as_ref()),
            ),
            (
                Source::Namespace,
                objects.namespace.and_then(|o| o.metadata.annotations.as_ref()),
            ),
            (
                Source::StorageClass,
                objects
                    .storage_class
                    .and_then(|o| o.metadata.annotations.as_ref()),
            ),
        ],
        Precedence::StorageClass => vec![(
            Source::StorageClass,
            objects
                .storage_class
                .and_then(|o| o.metadata.annotations.as_ref()),
        )],
    };
    if let Some((source, _)) = levels
        .iter()
        .find(|(_, a)| annotation(*a, ENABLE_ANNOTATION) == Some("false"))
    {
        return Resolution::Disabled(source.clone());
    }
    for (source, annotations) in &levels {
        if let Some(text) = annotation(*annotations, SCHEDULE_ANNOTATION) {
            return match Schedule::parse(text) {
                Ok(schedule) => Resolution::Scheduled {
                    schedule,
                    source: source.clone(),
                    warning: None,
                },
                Err(e) => Resolution::Scheduled {
                    schedule: FALLBACK,
                    source: source.clone(),
                    warning: Some(format!(
                        "{} annotation {SCHEDULE_ANNOTATION}: {e}; using {FALLBACK}",
                        source.as_str()
                    )),
                },
            };
        }
    }
    let class = objects.pvc.and_then(storage_class_name);
    if let Some(schedule) = class.and_then(|c| node.storage_classes.get(c)) {
        return Resolution::Scheduled {
            schedule: schedule.clone(),
            source: Source::NodeStorageClass,
            warning: None,
        };
    }
    match &node.default_schedule {
        Some(schedule) => Resolution::Scheduled {
            schedule: schedule.clone(),
            source: Source::NodeDefault,
            warning: None,
        },
        None => Resolution::Unscheduled,
    }
}

/// Test objects' annotations, written as pairs.
#[cfg(test)]
pub(crate) fn annotations(pairs: &[(&str, &str)]) -> Option<std::collections::BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

#[cfg(test)]
mod tests;
