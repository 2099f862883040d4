//! The command line: the root parser and every subcommand's flags. `serve`'s flags turn
//! into a validated [`Config`] here; nothing below this module sees clap's types.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{
    Config, ConfigError, KubeMode, LogFormat, ReclaimConfig, RegistrationConfig, ResizeArgs,
    load_file_config, parse_duration, parse_quantity, validate_classes, validate_reclaim,
};

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
    Reclaim(super::reclaim::ReclaimCommand),
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
    pub resize: ResizeArgs,
    /// kubelet's root directory. Staging and target paths of node calls must lie below
    /// it (or below another one given here: the flag repeats; the environment variable
    /// takes a comma-separated list). Anything else is refused before any change.
    #[arg(
        long = "kubelet-root-dir",
        env = "LOCALVOL_KUBELET_ROOT_DIR",
        value_delimiter = ',',
        default_value = "/var/lib/kubelet"
    )]
    pub kubelet_root_dirs: Vec<PathBuf>,
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
    /// space (on LVM: one lvs when the report is older than a minute).
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

impl ServeArgs {
    /// The configuration these flags and the file they name describe, validated.
    pub fn config(&self) -> Result<Config, ConfigError> {
        let args = self;
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
        let kubelet_root_dirs = kubelet_root_dirs(&args.kubelet_root_dirs)?;
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
        Ok(Config {
            reclaim,
            registration,
            stats_interval: args.stats_interval,
            socket_path,
            node_id,
            data_dir: args.data_dir.clone(),
            kubelet_root_dirs,
            metrics_addr: args.metrics_addr,
            device_classes: validate_classes(file, &args.data_dir, args.loop_capacity)?,
            resize: args.resize.clone(),
            log_format: args.log_format,
            kube: args.kube,
        })
    }
}

/// Each root must be absolute and normal (no `.`, `..` or empty components): a root is
/// compared component by component with the paths of node calls.
fn kubelet_root_dirs(roots: &[PathBuf]) -> Result<Vec<PathBuf>, ConfigError> {
    use std::path::Component;
    if roots.is_empty() {
        return Err(ConfigError::Invalid(
            "--kubelet-root-dir: at least one directory".to_string(),
        ));
    }
    for root in roots {
        // components() silently drops `.`, `//` and a trailing `/`: rebuilding the path
        // from them and comparing the bytes finds those too.
        let rebuilt: PathBuf = root.components().collect();
        let normal = root.is_absolute()
            && root
                .components()
                .skip(1)
                .all(|c| matches!(c, Component::Normal(_)))
            && root.components().count() > 1
            && rebuilt.as_os_str() == root.as_os_str();
        if !normal {
            return Err(ConfigError::Invalid(format!(
                "--kubelet-root-dir {}: must be an absolute path without ., .., // or a trailing / (and not /)",
                root.display()
            )));
        }
    }
    Ok(roots.to_vec())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn serve_args(extra: &[&str]) -> ServeArgs {
        let mut argv = vec!["localvol", "serve", "--node-id", "node-1"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Serve(args) => args,
            other => panic!("not serve: {other:?}"),
        }
    }

    fn config_of(args: &ServeArgs) -> Result<Config, ConfigError> {
        args.config()
    }

    #[test]
    fn registration_is_builtin_by_default_and_names_the_csi_socket() {
        let config = config_of(&serve_args(&["--endpoint", "unix:///plugins/l/csi.sock"])).unwrap();
        assert_eq!(
            config.registration,
            RegistrationConfig::Builtin {
                socket_path: "/var/lib/kubelet/plugins_registry/localvol.csi.dev-reg.sock".into(),
                csi_endpoint: "/plugins/l/csi.sock".into(),
            }
        );
        let config = config_of(&serve_args(&[
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
        let config = config_of(&serve_args(&["--kubelet-registration", "external"])).unwrap();
        assert_eq!(config.registration, RegistrationConfig::External);
    }

    #[test]
    fn bad_registration_settings_are_refused() {
        let err = config_of(&serve_args(&["--registration-dir", "reg"])).unwrap_err();
        assert!(err.to_string().contains("--registration-dir"), "{err}");
        let err = config_of(&serve_args(&["--kubelet-csi-endpoint", "tcp://x:1"])).unwrap_err();
        assert!(err.to_string().contains("--kubelet-csi-endpoint"), "{err}");
        assert!(Cli::try_parse_from(["localvol", "serve", "--kubelet-registration", "off"]).is_err());
    }

    #[test]
    fn kubelet_root_dirs_default_repeat_and_must_be_normal() {
        let config = config_of(&serve_args(&[])).unwrap();
        assert_eq!(config.kubelet_root_dirs, vec![PathBuf::from("/var/lib/kubelet")]);
        let config = config_of(&serve_args(&[
            "--kubelet-root-dir",
            "/var/lib/k0s/kubelet",
            "--kubelet-root-dir",
            "/tmp/sanity",
        ]))
        .unwrap();
        assert_eq!(
            config.kubelet_root_dirs,
            vec![
                PathBuf::from("/var/lib/k0s/kubelet"),
                PathBuf::from("/tmp/sanity")
            ]
        );
        for bad in [
            "/",
            "kubelet",
            "/var/../etc",
            "/var/./lib",
            "/var/lib/kubelet/",
            "/var//lib",
        ] {
            let err = config_of(&serve_args(&["--kubelet-root-dir", bad])).unwrap_err();
            assert!(err.to_string().contains("--kubelet-root-dir"), "{bad}: {err}");
        }
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

    #[test]
    fn quantities_parse() {
        assert_eq!(parse_quantity("100Gi"), Ok(100 << 30));
        assert_eq!(parse_quantity("1G"), Ok(1_000_000_000));
        assert_eq!(parse_quantity("4096"), Ok(4096));
        assert!(parse_quantity("1Qi").is_err());
        assert!(parse_quantity("Gi").is_err());
        assert!(parse_quantity("99999999999Pi").is_err());
        assert_eq!(parse_quantity("1.5Gi"), Ok(3 << 29));
        // Kubernetes has no `K`; the flag says so instead of guessing.
        let refused = parse_quantity("512K").unwrap_err();
        assert!(refused.contains("write `k` (1000) or `Ki` (1024)"), "{refused}");
    }
}
