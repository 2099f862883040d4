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
//! The pods a volume is published for, its last reclaim and its last resize come from
//! the daemon's memory (`localvol.v1.VolumeStates` on the same socket): what happened
//! since the daemon started, `-` in the table and `null` or `[]` in JSON otherwise.

use std::io::Write;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::jiff::Timestamp;
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
use crate::proto::localvol::v1 as pb;
use crate::proto::localvol::v1::volume_states_client::VolumeStatesClient;
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
    /// Since when the daemon remembers pods, reclaims and resizes (its start, RFC 3339);
    /// null when it does not report them.
    pub known_since: Option<String>,
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
    pub pvc: Option<ObjectName>,
    /// The pods it is published for, as kubelet named them (podInfoOnMount).
    pub pods: Vec<ObjectName>,
    pub last_reclaim: Option<ReclaimStatus>,
    pub resize_state: Option<ResizeStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObjectName {
    pub namespace: String,
    pub name: String,
}

/// The volume's last reclaim run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReclaimStatus {
    /// RFC 3339.
    pub finished_at: String,
    /// `trimmed`, `not_discarded` (raw block volume) or `failed`.
    pub result: &'static str,
    pub reclaimed_bytes: Option<u64>,
    pub trimmed_bytes: Option<u64>,
    pub error: Option<String>,
}

/// The volume's last resize step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResizeStatus {
    /// RFC 3339.
    pub updated_at: String,
    /// `in_progress`, `node_expansion_pending`, `done` or `failed`.
    pub state: &'static str,
    /// `controller` or `node`.
    pub step: String,
    /// The size asked for (in progress, failed) or reached (pending, done).
    pub size_bytes: u64,
    pub reason: Option<String>,
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
    let listed = list_all(ControllerClient::new(channel.clone())).await?;
    let mut warnings = Vec::new();
    let states = match VolumeStatesClient::new(channel)
        .list_volume_states(pb::ListVolumeStatesRequest {})
        .await
    {
        Ok(answer) => Some(answer.into_inner()),
        // A daemon older than this command: everything else still works.
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            warnings.push("the daemon does not report pods, reclaims and resizes".to_string());
            None
        }
        Err(source) => return Err(rpc("ListVolumeStates")(source)),
    };
    let table = MountTable::read(&host).await?;

    let mut report = StatusReport {
        node,
        known_since: states.as_ref().map(|s| rfc3339(s.since_unix_seconds)),
        volumes: Vec::new(),
    };
    for volume in listed {
        let mut status = from_listing(&volume);
        if let Some(state) = states
            .as_ref()
            .and_then(|s| s.volumes.iter().find(|v| v.volume_id == status.id))
        {
            add_daemon_state(&mut status, state);
        }
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
        (Some(namespace), Some(name)) => Some(ObjectName { namespace, name }),
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
        pods: Vec::new(),
        last_reclaim: None,
        resize_state: None,
    }
}

fn rfc3339(unix_seconds: i64) -> String {
    Timestamp::from_second(unix_seconds)
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_string()
}

fn object(o: &pb::ObjectName) -> ObjectName {
    ObjectName {
        namespace: o.namespace.clone(),
        name: o.name.clone(),
    }
}

/// What the daemon remembers: pods, the claim when the listing had none, the last
/// reclaim and resize.
fn add_daemon_state(status: &mut VolumeStatus, state: &pb::VolumeState) {
    if status.pvc.is_none() {
        status.pvc = state.pvc.as_ref().map(object);
    }
    status.pods = state
        .publications
        .iter()
        .filter_map(|p| p.pod.as_ref().map(object))
        .collect();
    status
        .pods
        .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    status.pods.dedup();
    status.last_reclaim = state.last_reclaim.as_ref().map(|r| {
        use pb::reclaim::Result as R;
        let trimmed = r.result() == R::Trimmed;
        ReclaimStatus {
            finished_at: rfc3339(r.finished_unix_seconds),
            result: match r.result() {
                R::Trimmed => "trimmed",
                R::NotDiscarded => "not_discarded",
                R::Failed | R::Unspecified => "failed",
            },
            reclaimed_bytes: trimmed.then_some(r.reclaimed_bytes),
            trimmed_bytes: trimmed.then_some(r.trimmed_bytes),
            error: (!r.error.is_empty()).then(|| r.error.clone()),
        }
    });
    status.resize_state = state.resize.as_ref().map(|r| {
        use pb::resize::State as S;
        ResizeStatus {
            updated_at: rfc3339(r.updated_unix_seconds),
            state: match r.state() {
                S::InProgress => "in_progress",
                S::NodeExpansionPending => "node_expansion_pending",
                S::Done => "done",
                S::Failed | S::Unspecified => "failed",
            },
            step: r.step.clone(),
            size_bytes: r.size_bytes,
            reason: (!r.reason.is_empty()).then(|| r.reason.clone()),
        }
    });
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

/// How long before `now` an RFC 3339 time was: `40s`, `5m`, `3h`, `2d`.
fn age(at: &str, now: Timestamp) -> String {
    let Ok(at) = at.parse::<Timestamp>() else {
        return at.to_string();
    };
    let secs = now.as_second().saturating_sub(at.as_second()).max(0);
    match secs {
        0..120 => format!("{secs}s"),
        120..7200 => format!("{}m", secs / 60),
        7200..172_800 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

fn reclaim_cell(r: &ReclaimStatus, now: Timestamp) -> String {
    let ago = age(&r.finished_at, now);
    match r.result {
        "trimmed" => format!("ok {} ({ago} ago)", human_bytes(r.reclaimed_bytes.unwrap_or(0))),
        "not_discarded" => format!("skipped: raw block ({ago} ago)"),
        _ => format!("failed ({ago} ago)"),
    }
}

/// A tool's multi-line message as one table cell: its lines joined by `; `.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

fn resize_cell(r: &ResizeStatus, now: Timestamp) -> String {
    let ago = age(&r.updated_at, now);
    let size = human_bytes(r.size_bytes);
    match r.state {
        "in_progress" => format!("expanding to {size} ({}, {ago} ago)", r.step),
        "node_expansion_pending" => format!("{size}, node expansion pending ({ago} ago)"),
        "done" => format!("done {size} ({ago} ago)"),
        _ => format!(
            "failed to {size} ({}, {ago} ago): {}",
            r.step,
            one_line(r.reason.as_deref().unwrap_or("no reason given"))
        ),
    }
}

/// The table `localvol status` prints by default.
pub fn render_table(report: &StatusReport) -> String {
    render_table_at(report, Timestamp::now())
}

/// The table, with ages counted back from `now`. The last two cells may hold spaces;
/// every other cell is a single word.
pub fn render_table_at(report: &StatusReport, now: Timestamp) -> String {
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
        let pods: Vec<String> = v
            .pods
            .iter()
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
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
            if pods.is_empty() { dash() } else { pods.join(",") },
            v.last_reclaim
                .as_ref()
                .map(|r| reclaim_cell(r, now))
                .unwrap_or_else(dash),
            v.resize_state
                .as_ref()
                .map(|r| resize_cell(r, now))
                .unwrap_or_else(dash),
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
#[path = "status_tests.rs"]
mod tests;
