//! The configuration file: device classes (TopoLVM lvmd-style keys where they overlap)
//! and this node's own reclaim schedules, parsed and validated at start-up.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::ConfigError;

mod reclaim;
use crate::crypt::Pbkdf;
use crate::fs::FsType;
use crate::model::ClassName;
pub use reclaim::{ReclaimConfig, ReclaimFileConfig, validate_reclaim};

/// The configuration file. Keys follow TopoLVM's lvmd where they overlap.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FileConfig {
    pub device_classes: Vec<DeviceClassConfig>,
    #[serde(default)]
    pub reclaim: Option<ReclaimFileConfig>,
}

// Unknown keys are rejected by the kind's variant: `flatten` hands it every key the
// common fields did not take.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DeviceClassConfig {
    pub name: String,
    #[serde(flatten)]
    pub kind: KindConfig,
    #[serde(default)]
    pub default: bool,
    #[serde(default)]
    pub fs_type: Option<FsType>,
    #[serde(default)]
    pub mount_options: Vec<String>,
    /// The key derivation of the class's encrypted volumes' new LUKS2 headers.
    #[serde(default)]
    pub luks: Option<LuksConfig>,
}

/// `luks:` of a device class (docs/backends.md): argon2id's cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct LuksConfig {
    #[serde(default)]
    pub pbkdf_memory_kib: Option<u32>,
    #[serde(default)]
    pub iter_time_ms: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum KindConfig {
    #[serde(rename_all = "kebab-case")]
    Loop {
        #[serde(default)]
        directory: Option<PathBuf>,
        #[serde(default)]
        capacity_gb: Option<u64>,
    },
    #[serde(rename_all = "kebab-case")]
    Lvm {
        volume_group: String,
        #[serde(default)]
        spare_gb: Option<u64>,
        #[serde(default)]
        stripe: Option<u32>,
        #[serde(default)]
        stripe_size: Option<String>,
        #[serde(default)]
        lvcreate_options: Vec<String>,
    },
    #[serde(rename_all = "kebab-case")]
    LvmThin {
        volume_group: String,
        thin_pool: ThinPoolConfig,
        #[serde(default)]
        lvcreate_options: Vec<String>,
    },
    #[serde(rename_all = "kebab-case")]
    Pmem {
        mode: PmemMode,
        #[serde(default)]
        region: Option<String>,
        #[serde(default)]
        volume_group: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ThinPoolConfig {
    pub name: String,
    #[serde(default = "default_overprovision")]
    pub overprovision_ratio: f64,
    /// Data or metadata fill, in percent, past which the pool's state is reported
    /// (default 80).
    #[serde(default)]
    pub warning_percent: Option<f64>,
    /// Data or metadata fill, in percent, past which the pool takes no new volume and its
    /// volumes are reported abnormal (default 95).
    #[serde(default)]
    pub critical_percent: Option<f64>,
}

impl ThinPoolConfig {
    /// The pool's fill thresholds, the defaults where none is set.
    pub fn thresholds(&self) -> PoolThresholds {
        let default = PoolThresholds::default();
        PoolThresholds {
            warning: self.warning_percent.unwrap_or(default.warning),
            critical: self.critical_percent.unwrap_or(default.critical),
        }
    }
}

/// A thin pool's fill thresholds, in percent of its data or its metadata (`thin-pool:`
/// `warning-percent`, `critical-percent` of the class).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolThresholds {
    pub warning: f64,
    pub critical: f64,
}

impl Default for PoolThresholds {
    fn default() -> Self {
        Self {
            warning: 80.0,
            critical: 95.0,
        }
    }
}

fn default_overprovision() -> f64 {
    1.0
}

fn valid_thresholds(t: PoolThresholds) -> bool {
    let percent = |p: f64| p > 0.0 && p <= 100.0;
    percent(t.warning) && percent(t.critical) && t.warning <= t.critical
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PmemMode {
    Direct,
    Lvm,
}

/// One validated device class.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceClass {
    pub name: ClassName,
    pub kind: KindConfig,
    pub default: bool,
    pub fs_type: Option<FsType>,
    pub mount_options: Vec<String>,
    pub luks: Pbkdf,
}

/// The device classes from the configuration file, or without one the single loop
/// class `default` under `data_dir`; validated.
pub fn load_classes(
    config: Option<&Path>,
    data_dir: &Path,
    loop_capacity: u64,
) -> Result<Vec<DeviceClass>, ConfigError> {
    validate_classes(load_file_config(config)?, data_dir, loop_capacity)
}

/// The configuration file, or without one a single loop class `default`.
pub(crate) fn load_file_config(config: Option<&Path>) -> Result<FileConfig, ConfigError> {
    Ok(match config {
        Some(path) => load_file(path)?,
        None => FileConfig {
            device_classes: vec![DeviceClassConfig {
                name: "default".to_string(),
                kind: KindConfig::Loop {
                    directory: None,
                    capacity_gb: None,
                },
                default: true,
                fs_type: None,
                mount_options: Vec::new(),
                luks: None,
            }],
            reclaim: None,
        },
    })
}

fn load_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_yaml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

/// Checks names, defaults and each kind's settings; fills in loop defaults.
pub fn validate_classes(
    file: FileConfig,
    data_dir: &Path,
    loop_capacity: u64,
) -> Result<Vec<DeviceClass>, ConfigError> {
    let invalid = |m: String| ConfigError::Invalid(m);
    if file.device_classes.is_empty() {
        return Err(invalid("device-classes is empty".to_string()));
    }
    let mut names = BTreeSet::new();
    let mut classes = Vec::new();
    let only_one = file.device_classes.len() == 1;
    for c in file.device_classes {
        let name = ClassName::parse(&c.name).map_err(invalid)?;
        if !names.insert(name.clone()) {
            return Err(invalid(format!("device class {name} is defined twice")));
        }
        crate::mount::MountOptions::parse(&c.mount_options)
            .map_err(|e| invalid(format!("device class {name}: mount-options: {e}")))?;
        let luks = pbkdf(&name, c.luks)?;
        let kind = match c.kind {
            KindConfig::Loop {
                directory,
                capacity_gb,
            } => {
                let directory = directory.unwrap_or_else(|| data_dir.join("loop").join(name.as_str()));
                if !directory.is_absolute() {
                    return Err(invalid(format!(
                        "device class {name}: directory must be absolute"
                    )));
                }
                KindConfig::Loop {
                    directory: Some(directory),
                    capacity_gb: Some(capacity_gb.unwrap_or(loop_capacity >> 30)),
                }
            }
            KindConfig::Lvm { ref volume_group, .. } | KindConfig::LvmThin { ref volume_group, .. }
                if volume_group.is_empty() =>
            {
                return Err(invalid(format!("device class {name}: volume-group is required")));
            }
            KindConfig::LvmThin { ref thin_pool, .. }
                if thin_pool.name.is_empty()
                    || thin_pool.overprovision_ratio.is_nan()
                    || thin_pool.overprovision_ratio < 1.0 =>
            {
                return Err(invalid(format!(
                    "device class {name}: thin-pool needs a name and an overprovision-ratio of at least 1.0"
                )));
            }
            KindConfig::LvmThin { ref thin_pool, .. } if !valid_thresholds(thin_pool.thresholds()) => {
                let t = thin_pool.thresholds();
                return Err(invalid(format!(
                    "device class {name}: thin-pool warning-percent ({}) and critical-percent ({}) must be \
                     above 0, at most 100, and warning at most critical",
                    t.warning, t.critical
                )));
            }
            KindConfig::Pmem {
                mode: PmemMode::Direct,
                ref region,
                ..
            } if region.is_none() => {
                return Err(invalid(format!(
                    "device class {name}: pmem mode direct needs a region"
                )));
            }
            KindConfig::Pmem {
                mode: PmemMode::Lvm,
                ref volume_group,
                ..
            } if volume_group.is_none() => {
                return Err(invalid(format!(
                    "device class {name}: pmem mode lvm needs a volume-group"
                )));
            }
            other => other,
        };
        classes.push(DeviceClass {
            name,
            kind,
            default: c.default || only_one,
            fs_type: c.fs_type,
            mount_options: c.mount_options,
            luks,
        });
    }
    match classes.iter().filter(|c| c.default).count() {
        1 => Ok(classes),
        0 => Err(invalid("no device class is marked default: true".to_string())),
        _ => Err(invalid(
            "more than one device class is marked default: true".to_string(),
        )),
    }
}

/// A class's `luks` settings over cryptsetup's bounds, the defaults where unset.
fn pbkdf(name: &ClassName, luks: Option<LuksConfig>) -> Result<Pbkdf, ConfigError> {
    let default = Pbkdf::default();
    let Some(luks) = luks else {
        return Ok(default);
    };
    let memory_kib = luks.pbkdf_memory_kib.unwrap_or(default.memory_kib);
    let iter_time_ms = luks.iter_time_ms.unwrap_or(default.iter_time_ms);
    if !(Pbkdf::MIN_MEMORY_KIB..=Pbkdf::MAX_MEMORY_KIB).contains(&memory_kib) {
        return Err(ConfigError::Invalid(format!(
            "device class {name}: luks: pbkdf-memory-kib must be {} to {}",
            Pbkdf::MIN_MEMORY_KIB,
            Pbkdf::MAX_MEMORY_KIB
        )));
    }
    if iter_time_ms == 0 {
        return Err(ConfigError::Invalid(format!(
            "device class {name}: luks: iter-time-ms must be at least 1"
        )));
    }
    Ok(Pbkdf {
        memory_kib,
        iter_time_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<Vec<DeviceClass>, ConfigError> {
        let file: FileConfig = serde_yaml::from_str(yaml).map_err(|source| ConfigError::Parse {
            path: "test.yaml".into(),
            source,
        })?;
        validate_classes(file, Path::new("/var/lib/localvol"), 100 << 30)
    }

    #[test]
    fn every_kind_parses() {
        let classes = parse(
            r#"
device-classes:
  - name: scratch
    kind: loop
    capacity-gb: 20
  - name: ssd
    kind: lvm
    volume-group: vg-ssd
    default: true
    spare-gb: 10
    stripe: 2
    stripe-size: 64k
  - name: thin
    kind: lvm-thin
    volume-group: vg-ssd
    thin-pool: {name: pool0, overprovision-ratio: 5.0}
    fs-type: xfs
  - name: pmem
    kind: pmem
    mode: direct
    region: region0
"#,
        )
        .unwrap();
        assert_eq!(classes.len(), 4);
        assert_eq!(
            classes[0].kind,
            KindConfig::Loop {
                directory: Some("/var/lib/localvol/loop/scratch".into()),
                capacity_gb: Some(20)
            }
        );
        assert!(classes[1].default);
        assert_eq!(classes[2].fs_type, Some(FsType::Xfs));
    }

    #[test]
    fn mistakes_are_reported_clearly() {
        let cases = [
            ("device-classes: []", "empty"),
            (
                "device-classes: [{name: a, kind: loop}, {name: a, kind: loop, default: true}]",
                "twice",
            ),
            (
                "device-classes: [{name: a, kind: loop}, {name: b, kind: loop}]",
                "no device class is marked",
            ),
            ("device-classes: [{name: A, kind: loop}]", "must be 1-32"),
            (
                "device-classes: [{name: t, kind: lvm-thin, volume-group: vg, thin-pool: {name: p, overprovision-ratio: 0.5}}]",
                "at least 1.0",
            ),
            (
                "device-classes: [{name: t, kind: lvm-thin, volume-group: vg, thin-pool: {name: p, warning-percent: 96}}]",
                "warning at most critical",
            ),
            (
                "device-classes: [{name: t, kind: lvm-thin, volume-group: vg, thin-pool: {name: p, critical-percent: 101}}]",
                "at most 100",
            ),
            (
                "device-classes: [{name: t, kind: lvm-thin, volume-group: vg, thin-pool: {name: p, warning-percent: 0}}]",
                "above 0",
            ),
            (
                "device-classes: [{name: p, kind: pmem, mode: direct}]",
                "needs a region",
            ),
            ("device-classes: [{name: a, kind: zfs}]", "unknown variant"),
            (
                "device-classes: [{name: a, kind: loop, mount-options: [bind]}]",
                "not allowed",
            ),
            (
                "device-classes: [{name: a, kind: loop, colour: red}]",
                "unknown field",
            ),
        ];
        for (yaml, expected) in cases {
            let err = parse(yaml).unwrap_err().to_string();
            assert!(err.contains(expected), "{yaml}: {err}");
        }
    }

    #[test]
    fn thin_pool_thresholds_default_and_are_set_per_class() {
        let pool = |yaml: &str| -> ThinPoolConfig { serde_yaml::from_str(yaml).unwrap() };
        assert_eq!(pool("{name: p}").thresholds(), PoolThresholds::default());
        let set = pool("{name: p, warning-percent: 50, critical-percent: 70.5}").thresholds();
        assert_eq!((set.warning, set.critical), (50.0, 70.5));
        assert!(parse(
            "device-classes: [{name: t, kind: lvm-thin, volume-group: vg, thin-pool: {name: p, warning-percent: 90, critical-percent: 90}}]"
        )
        .is_ok());
    }

    #[test]
    fn luks_settings_default_and_are_bounded() {
        let classes = |yaml: &str| {
            let file: FileConfig = serde_yaml::from_str(yaml).unwrap();
            validate_classes(file, Path::new("/var/lib/localvol"), 1 << 30)
        };
        let plain = classes("device-classes: [{name: a, kind: loop}]").unwrap();
        assert_eq!(plain[0].luks, Pbkdf::default());
        let cheap = classes(
            "device-classes: [{name: a, kind: loop, luks: {pbkdf-memory-kib: 65536, iter-time-ms: 500}}]",
        )
        .unwrap();
        assert_eq!(
            cheap[0].luks,
            Pbkdf {
                memory_kib: 65536,
                iter_time_ms: 500
            }
        );
        for bad in [
            "{pbkdf-memory-kib: 16}",
            "{iter-time-ms: 0}",
            "{pbkdf-memory-kib: 8388608}",
        ] {
            let err =
                classes(&format!("device-classes: [{{name: a, kind: loop, luks: {bad}}}]")).unwrap_err();
            assert!(err.to_string().contains("device class a: luks:"), "{err}");
        }
        let unknown =
            serde_yaml::from_str::<FileConfig>("device-classes: [{name: a, kind: loop, luks: {memory: 1}}]");
        assert!(unknown.is_err());
    }
}
