//! Command line and configuration file, validated once into a [`Config`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::Deserialize;

use crate::fs::FsType;
use crate::model::ClassName;
use crate::reclaim::policy::NodePolicy;
use crate::reclaim::schedule::Schedule;

#[derive(Debug, Parser)]
#[command(
    name = "localvol",
    version,
    about = "CSI driver for node-local LVM, PMEM and loop-file volumes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the CSI services on this node.
    Serve(ServeArgs),
    /// List this node's volumes as the running daemon and the mount table show them.
    Status(StatusArgs),
    /// Reclaim free space (FITRIM) on volumes of the running daemon, now.
    Reclaim(crate::cli::reclaim::ReclaimCommand),
}

/// `localvol status`: a client of the running daemon. The device-class flags must match
/// the daemon's (they read the same environment variables, so `kubectl exec` into the
/// localvol container needs none): they tell which device holds each volume.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// The daemon's CSI endpoint.
    #[arg(
        long,
        env = "LOCALVOL_ENDPOINT",
        default_value = "unix:///var/lib/localvol/csi.sock"
    )]
    pub endpoint: String,
    /// Output format.
    #[arg(short, long, default_value = "table")]
    pub output: OutputFormat,
    /// The daemon's device-class file.
    #[arg(long, env = "LOCALVOL_CONFIG")]
    pub config: Option<PathBuf>,
    /// The daemon's data directory.
    #[arg(long, env = "LOCALVOL_DATA_DIR", default_value = "/var/lib/localvol")]
    pub data_dir: PathBuf,
    /// The daemon's default loop capacity (only read to build the same classes).
    #[arg(long, env = "LOCALVOL_LOOP_CAPACITY", default_value = "100Gi", value_parser = parse_quantity)]
    pub loop_capacity: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// CSI endpoint: unix:///absolute/path. The socket is created with mode 0600.
    #[arg(
        long,
        env = "LOCALVOL_ENDPOINT",
        default_value = "unix:///var/lib/localvol/csi.sock"
    )]
    pub endpoint: String,
    /// This node's name as Kubernetes knows it; volumes are reported in its topology.
    /// Defaults to $NODE_NAME, then the hostname.
    #[arg(long, env = "NODE_NAME")]
    pub node_id: Option<String>,
    /// Where localvol keeps loop-backend files.
    #[arg(long, env = "LOCALVOL_DATA_DIR", default_value = "/var/lib/localvol")]
    pub data_dir: PathBuf,
    /// Address of the HTTP listener for /metrics, /healthz and /readyz.
    #[arg(long, env = "LOCALVOL_METRICS_ADDR", default_value = "127.0.0.1:9808")]
    pub metrics_addr: SocketAddr,
    /// Device classes (YAML). Without it: one loop class `default` under --data-dir.
    #[arg(long, env = "LOCALVOL_CONFIG")]
    pub config: Option<PathBuf>,
    /// Most the default loop class may promise to volumes (free disk also bounds it).
    /// Accepts bytes or a Kubernetes quantity such as 100Gi.
    #[arg(long, env = "LOCALVOL_LOOP_CAPACITY", default_value = "100Gi", value_parser = parse_quantity)]
    pub loop_capacity: u64,
    #[command(flatten)]
    pub resize: crate::resize::ResizeArgs,
    /// Log format: text for people, json for log pipelines.
    #[arg(long, env = "LOCALVOL_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
    /// Kubernetes API access (in-cluster, else $KUBECONFIG). on: required, and
    /// NodeStage/NodePublish check generic ephemeral volume ownership; auto: on when a
    /// configuration is found, else standalone; off: standalone, no checks.
    #[arg(long, env = "LOCALVOL_KUBE", default_value = "auto")]
    pub kube: KubeMode,
    /// Who registers the driver with kubelet. builtin: localvol serves kubelet's plugin
    /// registration socket itself, no sidecar needed. external: a node-driver-registrar
    /// sidecar registers it, and localvol serves no registration socket.
    #[arg(long, env = "LOCALVOL_KUBELET_REGISTRATION", default_value = "builtin")]
    pub kubelet_registration: KubeletRegistration,
    /// kubelet's plugin registration directory, where builtin registration puts its
    /// socket (localvol.csi.dev-reg.sock).
    #[arg(
        long,
        env = "LOCALVOL_REGISTRATION_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    pub registration_dir: PathBuf,
    /// The CSI socket's path as kubelet sees it, told to kubelet at registration. Needed
    /// only when localvol sees the socket at another path than kubelet does (a container
    /// that mounts the host directory elsewhere). Default: --endpoint's path.
    #[arg(long, env = "LOCALVOL_KUBELET_CSI_ENDPOINT")]
    pub kubelet_csi_endpoint: Option<String>,
    /// How often the volume and capacity gauges of each device class are refreshed
    /// (`30s`, `5m`). Each refresh lists the class's volumes and asks for its free
    /// space (on LVM: runs lvs and vgs).
    #[arg(long, env = "LOCALVOL_STATS_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub stats_interval: Duration,
    #[command(flatten)]
    pub reclaim: ReclaimArgs,
}

/// ReclaimSpace flags of `serve`. Schedules are configured in the file (`reclaim:`) and
/// by csi-addons annotations.
#[derive(Debug, Clone, Args)]
pub struct ReclaimArgs {
    /// csi-addons endpoint (Identity, ReclaimSpaceNode) for the csi-addons sidecar and
    /// `localvol reclaim`: unix:///absolute/path, created 0600. Not served when unset;
    /// scheduled reclaim runs either way.
    #[arg(long, env = "LOCALVOL_CSI_ADDONS_ENDPOINT")]
    pub csi_addons_endpoint: Option<String>,
    /// ReclaimSpace runs at once on this node, scheduled and on demand together. FITRIM
    /// makes the device discard every free extent: more at once means more I/O load.
    #[arg(long, env = "LOCALVOL_RECLAIM_CONCURRENCY", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub reclaim_concurrency: u16,
    /// How long a caller waits for one run (e.g. 90s, 10m, 1h). The kernel cannot be
    /// interrupted: a run past it is reported failed and keeps its volume locked until
    /// FITRIM returns.
    #[arg(long, env = "LOCALVOL_RECLAIM_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub reclaim_timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KubeletRegistration {
    Builtin,
    External,
}

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

/// Parses `1073741824`, `1Gi`, `512Mi`, `10G` (Kubernetes quantity suffixes).
pub fn parse_quantity(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    let value: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size"))?;
    let multiplier: u64 = match suffix {
        "" => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        other => return Err(format!("unknown size suffix {other:?} in {s:?}")),
    };
    value
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{s:?} is too large"))
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

/// The configuration file. Keys follow TopoLVM's lvmd where they overlap.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FileConfig {
    pub device_classes: Vec<DeviceClassConfig>,
    #[serde(default)]
    pub reclaim: Option<ReclaimFileConfig>,
}

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
}

fn default_overprovision() -> f64 {
    1.0
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
}

/// Everything `serve` needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub socket_path: PathBuf,
    pub node_id: String,
    pub data_dir: PathBuf,
    pub metrics_addr: SocketAddr,
    pub device_classes: Vec<DeviceClass>,
    pub resize: crate::resize::ResizeArgs,
    pub log_format: LogFormat,
    pub kube: KubeMode,
    pub registration: RegistrationConfig,
    pub stats_interval: Duration,
    pub reclaim: ReclaimConfig,
}

impl Config {
    pub fn from_args(args: &ServeArgs) -> Result<Self, ConfigError> {
        let socket_path = crate::csi::socket::endpoint_path(&args.endpoint)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let node_id = match &args.node_id {
            Some(id) if !id.is_empty() => id.clone(),
            _ => nix::unistd::gethostname()
                .map_err(|e| ConfigError::Invalid(format!("no --node-id and no hostname: {e}")))?
                .to_string_lossy()
                .into_owned(),
        };
        if node_id.is_empty() || node_id.len() > 253 {
            return Err(ConfigError::Invalid(format!(
                "node id {node_id:?} must be 1-253 characters"
            )));
        }
        if !args.data_dir.is_absolute() {
            return Err(ConfigError::Invalid(
                "--data-dir must be an absolute path".to_string(),
            ));
        }
        let registration = registration_config(args, &socket_path)?;
        let file = load_file_config(args.config.as_deref())?;
        let csi_addons_socket = match &args.reclaim.csi_addons_endpoint {
            Some(endpoint) => {
                let path = crate::csi::socket::endpoint_path(endpoint)
                    .map_err(|e| ConfigError::Invalid(format!("--csi-addons-endpoint: {e}")))?;
                if path == socket_path {
                    return Err(ConfigError::Invalid(
                        "--csi-addons-endpoint must differ from --endpoint".to_string(),
                    ));
                }
                Some(path)
            }
            None => None,
        };
        let reclaim = ReclaimConfig {
            policy: validate_reclaim(file.reclaim.clone())?,
            csi_addons_socket,
            concurrency: usize::from(args.reclaim.reclaim_concurrency.max(1)),
            timeout: args.reclaim.reclaim_timeout,
        };
        Ok(Self {
            reclaim,
            registration,
            stats_interval: args.stats_interval,
            socket_path,
            node_id,
            data_dir: args.data_dir.clone(),
            metrics_addr: args.metrics_addr,
            device_classes: validate_classes(file, &args.data_dir, args.loop_capacity)?,
            resize: args.resize.clone(),
            log_format: args.log_format,
            kube: args.kube,
        })
    }

    pub fn default_class(&self) -> &DeviceClass {
        self.device_classes
            .iter()
            .find(|c| c.default)
            .expect("validation guarantees a default class")
    }
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
fn load_file_config(config: Option<&Path>) -> Result<FileConfig, ConfigError> {
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
            }],
            reclaim: None,
        },
    })
}

fn registration_config(args: &ServeArgs, socket_path: &Path) -> Result<RegistrationConfig, ConfigError> {
    if args.kubelet_registration == KubeletRegistration::External {
        return Ok(RegistrationConfig::External);
    }
    if !args.registration_dir.is_absolute() {
        return Err(ConfigError::Invalid(
            "--registration-dir must be an absolute path".to_string(),
        ));
    }
    let csi_endpoint = match &args.kubelet_csi_endpoint {
        Some(endpoint) if !endpoint.is_empty() => crate::csi::socket::endpoint_path(endpoint)
            .map_err(|e| ConfigError::Invalid(format!("--kubelet-csi-endpoint: {e}")))?,
        _ => socket_path.to_path_buf(),
    };
    Ok(RegistrationConfig::Builtin {
        socket_path: crate::registration::socket_path(&args.registration_dir),
        csi_endpoint,
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

    fn serve_args(extra: &[&str]) -> ServeArgs {
        let mut argv = vec!["localvol", "serve", "--node-id", "node-1"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Serve(args) => args,
            other => panic!("not serve: {other:?}"),
        }
    }

    #[test]
    fn registration_is_builtin_by_default_and_names_the_csi_socket() {
        let config = Config::from_args(&serve_args(&["--endpoint", "unix:///plugins/l/csi.sock"])).unwrap();
        assert_eq!(
            config.registration,
            RegistrationConfig::Builtin {
                socket_path: "/var/lib/kubelet/plugins_registry/localvol.csi.dev-reg.sock".into(),
                csi_endpoint: "/plugins/l/csi.sock".into(),
            }
        );
        let config = Config::from_args(&serve_args(&[
            "--registration-dir",
            "/reg",
            "--kubelet-csi-endpoint",
            "unix:///host/plugins/l/csi.sock",
        ]))
        .unwrap();
        assert_eq!(
            config.registration,
            RegistrationConfig::Builtin {
                socket_path: "/reg/localvol.csi.dev-reg.sock".into(),
                csi_endpoint: "/host/plugins/l/csi.sock".into(),
            }
        );
        let config = Config::from_args(&serve_args(&["--kubelet-registration", "external"])).unwrap();
        assert_eq!(config.registration, RegistrationConfig::External);
    }

    #[test]
    fn bad_registration_settings_are_refused() {
        let err = Config::from_args(&serve_args(&["--registration-dir", "reg"])).unwrap_err();
        assert!(err.to_string().contains("--registration-dir"), "{err}");
        let err = Config::from_args(&serve_args(&["--kubelet-csi-endpoint", "tcp://x:1"])).unwrap_err();
        assert!(err.to_string().contains("--kubelet-csi-endpoint"), "{err}");
        assert!(Cli::try_parse_from(["localvol", "serve", "--kubelet-registration", "off"]).is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        for bad in ["0s", "", "s", "1d", "1.5s", "-1s", "99999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(serve_args(&[]).stats_interval, Duration::from_secs(30));
    }

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

    #[test]
    fn quantities_parse() {
        assert_eq!(parse_quantity("100Gi"), Ok(100 << 30));
        assert_eq!(parse_quantity("1G"), Ok(1_000_000_000));
        assert_eq!(parse_quantity("4096"), Ok(4096));
        assert!(parse_quantity("1Qi").is_err());
        assert!(parse_quantity("Gi").is_err());
        assert!(parse_quantity("99999999999Pi").is_err());
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
}
