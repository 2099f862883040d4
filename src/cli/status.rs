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
//!
//! The snapshots are the daemon's ListSnapshots: each with its class, source volume,
//! size and creation time, ordered by class. The human output is in `status_table.rs`.

use std::io::Write;
use std::path::PathBuf;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use tonic::transport::Channel;

use crate::cli::{OutputFormat, StatusArgs};
use crate::config::{ConfigError, load_classes};
use crate::csi::socket::{self, SocketError};
use crate::host::Host;
use crate::model::SnapshotId;
use crate::model::{PARAM_PVC_NAME, PARAM_PVC_NAMESPACE};
use crate::mount::{MountError, MountTable};
use crate::proto::csi::v1 as csi;
use crate::proto::csi::v1::controller_client::ControllerClient;
use crate::proto::csi::v1::node_client::NodeClient;
use crate::proto::localvol::v1 as pb;
use crate::proto::localvol::v1::volume_states_client::VolumeStatesClient;
use crate::request::PARAM_DEVICE_CLASS;
use crate::volume::{OpenError, Volumes};

mod mounts;
mod table;
use mounts::local_view;
pub use table::{human_bytes, render_table, render_table_at};

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot open the device classes")]
    Classes(#[source] OpenError),
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
    /// Ordered by class, then id.
    pub snapshots: Vec<SnapshotStatus>,
}

/// A snapshot as the daemon lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotStatus {
    pub id: String,
    /// None for an id that is not localvol's (never from a localvol daemon).
    pub device_class: Option<String>,
    pub source_volume_id: String,
    pub size_bytes: u64,
    /// RFC 3339.
    pub created_at: Option<String>,
    pub ready_to_use: bool,
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
    /// `luks2` or `luks2+discards` for a volume encrypted at rest; unknown as `mode` is.
    pub encryption: Option<&'static str>,
    /// The block device while the volume is attached (staged).
    pub device: Option<PathBuf>,
    pub staged_paths: Vec<PathBuf>,
    pub published_paths: Vec<PathBuf>,
    pub pvc: Option<ObjectName>,
    /// The pods it is published for, as kubelet named them (podInfoOnMount).
    pub pods: Vec<ObjectName>,
    pub last_reclaim: Option<ReclaimStatus>,
    pub resize_state: Option<ResizeStatus>,
    /// The daemon's NodeGetVolumeStats condition while the volume is staged: what
    /// kubelet's volume health sees.
    pub condition: Option<ConditionStatus>,
}

/// A volume's condition as the daemon reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConditionStatus {
    pub abnormal: bool,
    pub message: String,
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
    let volumes = Volumes::open(&classes, &args.data_dir, "", host.clone())
        .await
        .map_err(StatusError::Classes)?;
    let path = socket::endpoint_path(&args.endpoint)?;
    let channel = socket::connect(&path)
        .await
        .map_err(|source| StatusError::Connect { path, source })?;
    let mut node_client = NodeClient::new(channel.clone());
    let node = node_client
        .clone()
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .map_err(rpc("NodeGetInfo"))?
        .into_inner()
        .node_id;
    let listed = list_all(ControllerClient::new(channel.clone())).await?;
    let mut warnings = Vec::new();
    let snapshots = match list_all_snapshots(ControllerClient::new(channel.clone())).await {
        Ok(all) => all,
        // A daemon older than snapshots: everything else still works.
        Err(StatusError::Rpc { source, .. }) if source.code() == tonic::Code::Unimplemented => {
            warnings.push("the daemon does not list snapshots".to_string());
            Vec::new()
        }
        Err(e) => return Err(e),
    };
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
        snapshots: sorted_snapshots(snapshots.iter().map(from_snapshot).collect()),
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
                status.encryption = view.encryption;
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
                if let Some(path) = status.published_paths.first().or(status.staged_paths.first()) {
                    match condition_of(&mut node_client, &status.id, path).await {
                        Ok(condition) => status.condition = condition,
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

/// The volume's condition, asked of the daemon at one of its paths as kubelet asks it.
async fn condition_of(
    client: &mut NodeClient<Channel>,
    id: &str,
    path: &std::path::Path,
) -> Result<Option<ConditionStatus>, StatusError> {
    let stats = client
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: id.to_string(),
            volume_path: path.display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .map_err(rpc("NodeGetVolumeStats"))?
        .into_inner();
    Ok(stats.volume_condition.map(|c| ConditionStatus {
        abnormal: c.abnormal,
        message: c.message,
    }))
}

/// Every page of a paged listing: `call` gets a starting token and returns that page's
/// entries and the next token.
async fn all_pages<T, F, Fut>(mut call: F) -> Result<Vec<T>, StatusError>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, String), StatusError>>,
{
    let mut all = Vec::new();
    let mut starting_token = String::new();
    loop {
        let (entries, next_token) = call(starting_token.clone()).await?;
        all.extend(entries);
        if next_token.is_empty() || next_token == starting_token {
            return Ok(all);
        }
        starting_token = next_token;
    }
}

async fn list_all(client: ControllerClient<Channel>) -> Result<Vec<csi::Volume>, StatusError> {
    all_pages(|starting_token| {
        let mut client = client.clone();
        async move {
            let request = csi::ListVolumesRequest {
                max_entries: 0,
                starting_token,
            };
            let page = client
                .list_volumes(request)
                .await
                .map_err(rpc("ListVolumes"))?
                .into_inner();
            Ok((
                page.entries.into_iter().filter_map(|e| e.volume).collect(),
                page.next_token,
            ))
        }
    })
    .await
}

async fn list_all_snapshots(client: ControllerClient<Channel>) -> Result<Vec<csi::Snapshot>, StatusError> {
    all_pages(|starting_token| {
        let mut client = client.clone();
        async move {
            let request = csi::ListSnapshotsRequest {
                starting_token,
                ..Default::default()
            };
            let page = client
                .list_snapshots(request)
                .await
                .map_err(rpc("ListSnapshots"))?
                .into_inner();
            Ok((
                page.entries.into_iter().filter_map(|e| e.snapshot).collect(),
                page.next_token,
            ))
        }
    })
    .await
}

fn from_snapshot(snapshot: &csi::Snapshot) -> SnapshotStatus {
    SnapshotStatus {
        id: snapshot.snapshot_id.clone(),
        device_class: SnapshotId::parse(&snapshot.snapshot_id)
            .ok()
            .map(|id| id.class.to_string()),
        source_volume_id: snapshot.source_volume_id.clone(),
        size_bytes: u64::try_from(snapshot.size_bytes).unwrap_or(0),
        created_at: snapshot.creation_time.as_ref().map(|t| {
            Timestamp::new(t.seconds, t.nanos)
                .unwrap_or(Timestamp::UNIX_EPOCH)
                .to_string()
        }),
        ready_to_use: snapshot.ready_to_use,
    }
}

/// Per class, then by id.
fn sorted_snapshots(mut all: Vec<SnapshotStatus>) -> Vec<SnapshotStatus> {
    all.sort_by(|a, b| (&a.device_class, &a.id).cmp(&(&b.device_class, &b.id)));
    all
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
        encryption: None,
        device: None,
        staged_paths: Vec::new(),
        published_paths: Vec::new(),
        pvc,
        pods: Vec::new(),
        last_reclaim: None,
        resize_state: None,
        condition: None,
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

#[cfg(test)]
mod tests;
