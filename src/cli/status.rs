//! `localvol status`: this node's volumes, as the running daemon and the mount table
//! show them.
//!
//! The daemon is asked over its CSI socket (NodeGetInfo, ListVolumes) for the volumes,
//! their sizes, classes and claims. Which device holds a volume is looked up read-only
//! through the same backends the daemon builds from the same configuration (nothing is
//! created or attached); the mount table then tells where that device is staged and
//! published, and statvfs of the staging path how much of it is used.
//!
//! A mount counts as published when its path has kubelet's layout for pod volumes
//! (`pods/<uid>/volumes/...`) or block publications (`volumeDevices/publish/...`);
//! every other mount of the volume's device counts as staged.
//!
//! The pod using a volume, the last reclaim and the resize state are not known yet:
//! they show as `-` in the table and `null` in JSON.

use std::io::Write;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::backend::Backend;
use crate::config::{ConfigError, OutputFormat, StatusArgs, load_classes};
use crate::csi::socket::{self, SocketError};
use crate::host::Host;
use crate::model::{VolumeId, VolumeMode};
use crate::mount::{MountError, MountTable};
use crate::proto::csi::v1 as csi;
use crate::proto::csi::v1::controller_client::ControllerClient;
use crate::proto::csi::v1::node_client::NodeClient;
use crate::request::{PARAM_DEVICE_CLASS, PARAM_PVC_NAME, PARAM_PVC_NAMESPACE};

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot open the device classes")]
    Classes(#[source] anyhow::Error),
    #[error(transparent)]
    Endpoint(#[from] SocketError),
    #[error("cannot connect to the localvol daemon at {path}", path = path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("the daemon answered {call} with {code:?}: {message}", code = source.code(), message = source.message())]
    Rpc {
        call: &'static str,
        #[source]
        source: tonic::Status,
    },
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error("cannot write the output")]
    Output(#[from] std::io::Error),
}

/// What `localvol status -o json` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusReport {
    pub node: String,
    pub volumes: Vec<VolumeStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VolumeStatus {
    pub id: String,
    pub device_class: Option<String>,
    pub size_bytes: u64,
    /// Bytes used in the filesystem, when it is staged.
    pub used_bytes: Option<u64>,
    /// `filesystem` or `block`; unknown when the class is not in this configuration.
    pub mode: Option<&'static str>,
    /// The block device while the volume is attached (staged).
    pub device: Option<PathBuf>,
    pub staged_paths: Vec<PathBuf>,
    pub published_paths: Vec<PathBuf>,
    pub pvc: Option<ClaimName>,
    /// Not known yet: always null.
    pub pod: Option<String>,
    /// Not known yet: always null.
    pub last_reclaim: Option<String>,
    /// Not known yet: always null.
    pub resize_state: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimName {
    pub namespace: String,
    pub name: String,
}

fn rpc(call: &'static str) -> impl FnOnce(tonic::Status) -> StatusError {
    move |source| StatusError::Rpc { call, source }
}

/// Runs `localvol status`: the report on `out`, anything that could not be looked up
/// as warnings on `err`.
pub async fn run(args: &StatusArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), StatusError> {
    let (report, warnings) = collect(args).await?;
    for warning in warnings {
        writeln!(err, "warning: {warning}")?;
    }
    match args.output {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &report).map_err(std::io::Error::from)?;
            writeln!(out)?;
        }
        OutputFormat::Table => out.write_all(render_table(&report).as_bytes())?,
    }
    Ok(())
}

/// Asks the daemon and the node; returns the report and warnings.
pub async fn collect(args: &StatusArgs) -> Result<(StatusReport, Vec<String>), StatusError> {
    let classes = load_classes(args.config.as_deref(), &args.data_dir, args.loop_capacity)?;
    let host = Host::system();
    let volumes = crate::app::open_volumes(&classes, &args.data_dir, "", host.clone())
        .await
        .map_err(StatusError::Classes)?;
    let path = socket::endpoint_path(&args.endpoint)?;
    let channel = socket::connect(&path)
        .await
        .map_err(|source| StatusError::Connect { path, source })?;
    let node = NodeClient::new(channel.clone())
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .map_err(rpc("NodeGetInfo"))?
        .into_inner()
        .node_id;
    let listed = list_all(ControllerClient::new(channel)).await?;
    let table = MountTable::read(&host).await?;

    let mut warnings = Vec::new();
    let mut report = StatusReport {
        node,
        volumes: Vec::new(),
    };
    for volume in listed {
        let mut status = from_listing(&volume);
        match local_view(&volumes, &host, &table, &status.id).await {
            Ok(view) => {
                status.mode = view.mode;
                status.device = view.device;
                status.staged_paths = view.staged;
                status.published_paths = view.published;
                if status.mode == Some("filesystem")
                    && let Some(staged) = status.staged_paths.first()
                {
                    match host.syscalls.statvfs(staged).await {
                        Ok(usage) => status.used_bytes = Some(usage.used_bytes),
                        Err(e) => warnings.push(format!("{}: {e}", status.id)),
                    }
                }
            }
            Err(warning) => warnings.push(format!("{}: {warning}", status.id)),
        }
        report.volumes.push(status);
    }
    Ok((report, warnings))
}

async fn list_all(
    mut client: ControllerClient<tonic::transport::Channel>,
) -> Result<Vec<csi::Volume>, StatusError> {
    let mut all = Vec::new();
    let mut starting_token = String::new();
    loop {
        let page = client
            .list_volumes(csi::ListVolumesRequest {
                max_entries: 0,
                starting_token: starting_token.clone(),
            })
            .await
            .map_err(rpc("ListVolumes"))?
            .into_inner();
        all.extend(page.entries.into_iter().filter_map(|e| e.volume));
        if page.next_token.is_empty() || page.next_token == starting_token {
            return Ok(all);
        }
        starting_token = page.next_token;
    }
}

/// What the daemon's answer alone tells about a volume.
fn from_listing(volume: &csi::Volume) -> VolumeStatus {
    let context = |key: &str| volume.volume_context.get(key).filter(|v| !v.is_empty()).cloned();
    let pvc = match (context(PARAM_PVC_NAMESPACE), context(PARAM_PVC_NAME)) {
        (Some(namespace), Some(name)) => Some(ClaimName { namespace, name }),
        _ => None,
    };
    VolumeStatus {
        id: volume.volume_id.clone(),
        device_class: context(PARAM_DEVICE_CLASS),
        size_bytes: u64::try_from(volume.capacity_bytes).unwrap_or(0),
        used_bytes: None,
        mode: None,
        device: None,
        staged_paths: Vec::new(),
        published_paths: Vec::new(),
        pvc,
        pod: None,
        last_reclaim: None,
        resize_state: None,
    }
}

/// What this node shows about one volume.
#[derive(Debug, Default, PartialEq, Eq)]
struct LocalView {
    mode: Option<&'static str>,
    device: Option<PathBuf>,
    staged: Vec<PathBuf>,
    published: Vec<PathBuf>,
}

async fn local_view(
    volumes: &crate::volume::Volumes,
    host: &Host,
    table: &MountTable,
    id: &str,
) -> Result<LocalView, String> {
    let id = VolumeId::parse(id).map_err(|e| e.to_string())?;
    let backend: &Backend = volumes
        .backends()
        .find(|b| *b.class() == id.class)
        .ok_or_else(|| {
            format!(
                "device class {} is not in this configuration (run status with the daemon's \
                 --config); mounts unknown",
                id.class
            )
        })?;
    let record = backend
        .get(&id.token)
        .await
        .map_err(|e| crate::error::full_message(&e))?
        .ok_or_else(|| "no record on this node (deleted meanwhile?)".to_string())?;
    let mode = match record.mode {
        VolumeMode::Filesystem => "filesystem",
        VolumeMode::Block => "block",
    };
    let Some(device) = backend
        .device(&id.token)
        .await
        .map_err(|e| crate::error::full_message(&e))?
    else {
        // Not attached: neither staged nor published.
        return Ok(LocalView {
            mode: Some(mode),
            ..LocalView::default()
        });
    };
    let number = host
        .syscalls
        .device_number(&device)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{} is not a device node", device.display()))?;
    let real = tokio::fs::canonicalize(&device)
        .await
        .unwrap_or_else(|_| device.clone());
    let devtmpfs_root = Path::new("/").join(real.strip_prefix("/dev").unwrap_or(&real));
    let (staged, published) = mounts_of(table, number, &devtmpfs_root);
    Ok(LocalView {
        mode: Some(mode),
        device: Some(device),
        staged,
        published,
    })
}

/// The mounts of a device: filesystems on it (and bind mounts of them), and bind mounts
/// of its device node (`devtmpfs` with the node's name as root). Split into (staged,
/// published) by kubelet's path layout.
fn mounts_of(table: &MountTable, device_number: u64, devtmpfs_root: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut staged = Vec::new();
    let mut published = Vec::new();
    for entry in table.entries() {
        let is_fs = entry.fs_type != "devtmpfs" && entry.device_number() == device_number;
        let is_node = entry.fs_type == "devtmpfs" && entry.root == devtmpfs_root;
        if !(is_fs || is_node) {
            continue;
        }
        let list = if is_publish_path(&entry.mount_point) {
            &mut published
        } else {
            &mut staged
        };
        if !list.contains(&entry.mount_point) {
            list.push(entry.mount_point.clone());
        }
    }
    (staged, published)
}

/// kubelet's publish targets: `.../pods/<uid>/volumes/...` (filesystem) and
/// `.../pods/<uid>/volumeDevices/...` or `.../volumeDevices/publish/...` (block).
fn is_publish_path(path: &Path) -> bool {
    let parts: Vec<&str> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    parts.windows(3).any(|w| {
        w[0] == "pods" && (w[2] == "volumes" || w[2] == "volumeDevices")
            || w[0] == "volumeDevices" && w[1] == "publish"
    })
}

/// Bytes in binary units: `1Gi`, `1.5Gi`, `512Mi`, `100`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["Ki", "Mi", "Gi", "Ti", "Pi"];
    if bytes < 1024 {
        return bytes.to_string();
    }
    let mut value = bytes as f64;
    let mut unit = "";
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    let text = format!("{value:.1}");
    format!("{}{unit}", text.strip_suffix(".0").unwrap_or(&text))
}

fn paths(list: &[PathBuf]) -> String {
    if list.is_empty() {
        "-".to_string()
    } else {
        list.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The table `localvol status` prints by default.
pub fn render_table(report: &StatusReport) -> String {
    let dash = || "-".to_string();
    let mut rows = vec![
        [
            "ID",
            "CLASS",
            "SIZE",
            "USED",
            "STAGED",
            "PUBLISHED",
            "PVC",
            "POD",
            "LAST-RECLAIM",
            "RESIZE",
        ]
        .map(str::to_string),
    ];
    for v in &report.volumes {
        rows.push([
            v.id.clone(),
            v.device_class.clone().unwrap_or_else(dash),
            human_bytes(v.size_bytes),
            v.used_bytes.map(human_bytes).unwrap_or_else(dash),
            paths(&v.staged_paths),
            paths(&v.published_paths),
            v.pvc
                .as_ref()
                .map(|c| format!("{}/{}", c.namespace, c.name))
                .unwrap_or_else(dash),
            v.pod.clone().unwrap_or_else(dash),
            v.last_reclaim.clone().unwrap_or_else(dash),
            v.resize_state.clone().unwrap_or_else(dash),
        ]);
    }
    let mut widths = [0usize; 10];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = format!("NODE {}\n", report.node);
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const KUBELET: &str = "/var/lib/kubelet";

    fn mountinfo() -> MountTable {
        MountTable::parse(&format!(
            "\
22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
101 22 7:3 / {KUBELET}/plugins/kubernetes.io/csi/localvol.csi.dev/abc/globalmount rw shared:50 - ext4 /dev/loop3 rw
102 22 7:3 / {KUBELET}/pods/uid-1/volumes/kubernetes.io~csi/pvc-1/mount rw shared:50 - ext4 /dev/loop3 rw
103 22 7:3 / {KUBELET}/pods/uid-2/volumes/kubernetes.io~csi/pvc-1/mount ro shared:50 - ext4 /dev/loop3 rw
104 22 0:5 /loop4 {KUBELET}/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-2/uid-3 rw - devtmpfs udev rw
105 22 0:5 /loop44 /elsewhere rw - devtmpfs udev rw
106 22 7:5 / /mnt/other rw - ext4 /dev/loop5 rw
"
        ))
        .unwrap()
    }

    #[test]
    fn mounts_are_split_into_staged_and_published() {
        let table = mountinfo();
        let dev = nix::sys::stat::makedev(7, 3);
        let (staged, published) = mounts_of(&table, dev, Path::new("/loop3"));
        assert_eq!(
            staged,
            vec![PathBuf::from(format!(
                "{KUBELET}/plugins/kubernetes.io/csi/localvol.csi.dev/abc/globalmount"
            ))]
        );
        assert_eq!(
            published,
            vec![
                PathBuf::from(format!(
                    "{KUBELET}/pods/uid-1/volumes/kubernetes.io~csi/pvc-1/mount"
                )),
                PathBuf::from(format!(
                    "{KUBELET}/pods/uid-2/volumes/kubernetes.io~csi/pvc-1/mount"
                )),
            ]
        );
        // A raw block volume: its device node bound at kubelet's publish path.
        let (staged, published) = mounts_of(&table, nix::sys::stat::makedev(7, 4), Path::new("/loop4"));
        assert!(staged.is_empty());
        assert_eq!(
            published,
            vec![PathBuf::from(format!(
                "{KUBELET}/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-2/uid-3"
            ))]
        );
        // Nothing mounted.
        let (staged, published) = mounts_of(&table, nix::sys::stat::makedev(7, 9), Path::new("/loop9"));
        assert!(staged.is_empty() && published.is_empty());
    }

    #[test]
    fn publish_paths_follow_kubelet_layout() {
        assert!(is_publish_path(Path::new(
            "/k/pods/u/volumes/kubernetes.io~csi/p/mount"
        )));
        assert!(is_publish_path(Path::new(
            "/k/pods/u/volumeDevices/kubernetes.io~csi/p"
        )));
        assert!(is_publish_path(Path::new(
            "/k/plugins/kubernetes.io/csi/volumeDevices/publish/p/u"
        )));
        assert!(!is_publish_path(Path::new(
            "/k/plugins/kubernetes.io/csi/d/h/globalmount"
        )));
        assert!(!is_publish_path(Path::new("/pods")));
        assert!(!is_publish_path(Path::new("/tmp/volumes/x")));
    }

    #[test]
    fn listing_fills_class_size_and_claim() {
        let volume = csi::Volume {
            capacity_bytes: 1 << 30,
            volume_id: "fast.pvc-1".into(),
            volume_context: HashMap::from([
                (PARAM_DEVICE_CLASS.to_string(), "fast".to_string()),
                (PARAM_PVC_NAME.to_string(), "data".to_string()),
                (PARAM_PVC_NAMESPACE.to_string(), "apps".to_string()),
            ]),
            content_source: None,
            accessible_topology: Vec::new(),
        };
        let status = from_listing(&volume);
        assert_eq!(status.device_class.as_deref(), Some("fast"));
        assert_eq!(status.size_bytes, 1 << 30);
        assert_eq!(
            status.pvc,
            Some(ClaimName {
                namespace: "apps".into(),
                name: "data".into()
            })
        );
        let bare = from_listing(&csi::Volume {
            volume_context: HashMap::from([(PARAM_PVC_NAME.to_string(), "data".to_string())]),
            ..volume
        });
        assert_eq!(bare.pvc, None, "a claim needs its namespace");
        assert_eq!(bare.device_class, None);
    }

    fn report() -> StatusReport {
        StatusReport {
            node: "node-1".into(),
            volumes: vec![
                VolumeStatus {
                    id: "fast.pvc-1".into(),
                    device_class: Some("fast".into()),
                    size_bytes: 3 << 29,
                    used_bytes: Some(24 << 20),
                    mode: Some("filesystem"),
                    device: Some("/dev/loop3".into()),
                    staged_paths: vec!["/s/globalmount".into()],
                    published_paths: vec!["/p/1/mount".into(), "/p/2/mount".into()],
                    pvc: Some(ClaimName {
                        namespace: "apps".into(),
                        name: "data".into(),
                    }),
                    pod: None,
                    last_reclaim: None,
                    resize_state: None,
                },
                VolumeStatus {
                    id: "fast.pvc-2".into(),
                    device_class: Some("fast".into()),
                    size_bytes: 1 << 20,
                    used_bytes: None,
                    mode: Some("block"),
                    device: None,
                    staged_paths: Vec::new(),
                    published_paths: Vec::new(),
                    pvc: None,
                    pod: None,
                    last_reclaim: None,
                    resize_state: None,
                },
            ],
        }
    }

    #[test]
    fn table_has_a_row_per_volume_and_dashes_for_unknowns() {
        let text = render_table(&report());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "NODE node-1");
        let header: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            header,
            [
                "ID",
                "CLASS",
                "SIZE",
                "USED",
                "STAGED",
                "PUBLISHED",
                "PVC",
                "POD",
                "LAST-RECLAIM",
                "RESIZE"
            ]
        );
        let first: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            first,
            [
                "fast.pvc-1",
                "fast",
                "1.5Gi",
                "24Mi",
                "/s/globalmount",
                "/p/1/mount,/p/2/mount",
                "apps/data",
                "-",
                "-",
                "-"
            ]
        );
        let second: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(
            second,
            ["fast.pvc-2", "fast", "1Mi", "-", "-", "-", "-", "-", "-", "-"]
        );
        // Columns line up: every row's second column starts where the header's does.
        let column = lines[1].find("CLASS").unwrap();
        assert_eq!(lines[2].find("fast ").unwrap(), column);
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn json_has_nulls_for_what_is_not_known() {
        let value = serde_json::to_value(report()).unwrap();
        let second = &value["volumes"][1];
        for field in [
            "used_bytes",
            "device",
            "pvc",
            "pod",
            "last_reclaim",
            "resize_state",
        ] {
            assert!(second[field].is_null(), "{field}: {second}");
        }
        assert_eq!(second["staged_paths"], serde_json::json!([]));
        let first = &value["volumes"][0];
        assert_eq!(
            first["pvc"],
            serde_json::json!({"namespace": "apps", "name": "data"})
        );
        assert_eq!(first["used_bytes"], 24 << 20);
        assert_eq!(first["mode"], "filesystem");
    }

    #[test]
    fn sizes_read_like_kubernetes_quantities() {
        assert_eq!(human_bytes(0), "0");
        assert_eq!(human_bytes(1023), "1023");
        assert_eq!(human_bytes(1024), "1Ki");
        assert_eq!(human_bytes(3 << 29), "1.5Gi");
        assert_eq!(human_bytes(100 << 30), "100Gi");
        assert_eq!(human_bytes(5 << 40), "5Ti");
    }
}
