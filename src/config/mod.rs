//! Configuration, validated once into a [`Config`]: the daemon's settings, whatever
//! they were read from (the command line in `cli`, the file whose schema is in [`file`]).

mod file;
pub mod fuzz;
mod resize;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub(crate) use file::load_file_config;
pub use file::{
    DeviceClass, DeviceClassConfig, FileConfig, KindConfig, LuksConfig, PmemMode, PoolThresholds,
    ReclaimConfig, ReclaimFileConfig, ThinPoolConfig, load_classes, validate_classes, validate_reclaim,
};
pub use resize::{FailureValue, ReportResizeStatus, ResizeArgs};

/// How the driver becomes known to kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrationConfig {
    /// localvol serves the registration socket at `socket_path` and names `csi_endpoint`.
    Builtin {
        socket_path: PathBuf,
        csi_endpoint: PathBuf,
    },
    /// A node-driver-registrar sidecar registers the driver.
    External,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KubeMode {
    Auto,
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Parses a size written as a Kubernetes quantity (`1073741824`, `1Gi`, `1.5G`, `2e9`),
/// as [`crate::model::quantity`] reads them. `K` is refused with a note to write `k`
/// or `Ki`: Kubernetes has no `K`.
pub fn parse_quantity(s: &str) -> Result<u64, String> {
    crate::model::quantity::parse_bytes(s).map_err(|e| e.to_string())
}

/// Parses `30s`, `5m`, `1h` or plain seconds; at least one second.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 30s or 5m"))?;
    let seconds = match unit {
        "" | "s" => Some(value),
        "m" => value.checked_mul(60),
        "h" => value.checked_mul(3600),
        other => return Err(format!("unknown unit {other:?} in {s:?} (s, m or h)")),
    }
    .ok_or_else(|| format!("{s:?} is too long"))?;
    if seconds == 0 {
        return Err(format!("{s:?}: must be at least 1s"));
    }
    Ok(Duration::from_secs(seconds))
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}", path = path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}", path = path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Everything `serve` needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub socket_path: PathBuf,
    pub node_id: String,
    pub data_dir: PathBuf,
    /// Roots under which node calls may stage and publish (kubelet's root directory).
    pub kubelet_root_dirs: Vec<PathBuf>,
    pub metrics_addr: SocketAddr,
    pub device_classes: Vec<DeviceClass>,
    pub resize: ResizeArgs,
    pub log_format: LogFormat,
    pub kube: KubeMode,
    pub registration: RegistrationConfig,
    pub stats_interval: Duration,
    pub reclaim: ReclaimConfig,
}

impl Config {
    pub fn default_class(&self) -> &DeviceClass {
        self.device_classes
            .iter()
            .find(|c| c.default)
            .expect("validation guarantees a default class")
    }
}
