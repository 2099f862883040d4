//! The daemon pod is deleted with volumes staged and published: how long until its
//! replacement is Ready and has answered NodeGetVolumeStats for every volume (what
//! kubelet asks of it first), and its resident memory then.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, LogParams};
use kube::{Api, Client};
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::csi_client::{CsiClient, stats_request};

pub const SYSTEM_NAMESPACE: &str = "localvol-system";

/// A node plugin's DaemonSet pod, as the restart finds and times it.
pub struct DaemonSetPod {
    pub name: &'static str,
    pub namespace: &'static str,
    pub selector: &'static str,
    /// The container whose start counts, and its process name (for its RSS).
    pub container: &'static str,
    pub process: &'static str,
    pub socket: &'static str,
}

pub const LOCALVOL: DaemonSetPod = DaemonSetPod {
    name: "localvol",
    namespace: SYSTEM_NAMESPACE,
    selector: "app.kubernetes.io/name=localvol,app.kubernetes.io/component=node",
    container: "localvol",
    process: "localvol",
    socket: "/var/lib/kubelet/plugins/localvol.csi.dev/csi.sock",
};

/// The peer (bench/cluster/peer), restarted on the same node for comparison.
pub const PEER: DaemonSetPod = DaemonSetPod {
    name: "peer",
    namespace: "localvol-bench-peer",
    selector: "app=hostpath-peer",
    container: "hostpath",
    process: "hostpathplugin",
    socket: "/var/lib/kubelet/plugins/csi-hostpath/csi.sock",
};

/// One published volume: its id and the target path kubelet asks stats for.
#[derive(Clone)]
pub struct Published {
    pub volume_id: String,
    pub target: PathBuf,
}

/// Milliseconds from the delete request.
#[derive(Debug, Default, Serialize)]
pub struct Restart {
    pub daemon: &'static str,
    /// The daemon's volumes asked for stats.
    pub volumes: usize,
    /// Volumes mounted on the node (anyone's).
    pub node_volumes: usize,
    pub old_pod_gone_ms: f64,
    pub new_pod_running_ms: f64,
    pub ready_ms: f64,
    pub first_stats_ms: f64,
    pub all_stats_ms: f64,
    /// max(ready, all stats answered): the figure the goal is about.
    pub serving_ms: f64,
    pub rss_kib: u64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The daemon pod's name (exactly one on this node).
pub async fn daemon_pod(client: &Client) -> Result<String, String> {
    pod_of(client, &LOCALVOL).await
}

async fn pod_of(client: &Client, daemon: &DaemonSetPod) -> Result<String, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), daemon.namespace);
    let list = pods
        .list(&ListParams::default().labels(daemon.selector))
        .await
        .map_err(|e| e.to_string())?;
    match &list.items[..] {
        [pod] => Ok(pod.metadata.name.clone().unwrap_or_default()),
        other => Err(format!("{} daemon pods, expected 1", other.len())),
    }
}

fn running_and_ready(pod: &Pod, container: &str) -> (bool, bool) {
    let status = pod.status.as_ref();
    let running = status
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.name == container && c.state.as_ref().is_some_and(|s| s.running.is_some()))
        });
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    (running, ready)
}

/// Deletes the daemon pod and times its replacement (polled every 25 ms).
pub async fn restart(
    client: &Client,
    daemon: &'static DaemonSetPod,
    published: Vec<Published>,
    limit: Duration,
) -> Result<Restart, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), daemon.namespace);
    let old = pod_of(client, daemon).await?;
    keep_log(&pods, daemon, &old).await?;
    let start = Instant::now();
    pods.delete(&old, &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Restart {
        daemon: daemon.name,
        volumes: published.len(),
        node_volumes: published.len(),
        ..Default::default()
    };
    let mut stats: Option<tokio::task::JoinHandle<Result<(Duration, Duration), String>>> = None;
    let (mut old_gone, mut running, mut ready) = (None, None, None);
    while ready.is_none() || old_gone.is_none() {
        if start.elapsed() > limit {
            return Err(format!("daemon not Ready again within {limit:?}"));
        }
        let list = pods
            .list(&ListParams::default().labels(daemon.selector))
            .await
            .map_err(|e| e.to_string())?;
        if old_gone.is_none()
            && !list
                .items
                .iter()
                .any(|p| p.metadata.name.as_deref() == Some(&old))
        {
            old_gone = Some(start.elapsed());
            // From here on the socket can only be the new daemon's.
            stats = Some(tokio::spawn(all_stats(
                daemon.socket,
                published.clone(),
                start,
                limit,
            )));
        }
        for pod in list
            .items
            .iter()
            .filter(|p| p.metadata.name.as_deref() != Some(&old))
        {
            let (is_running, is_ready) = running_and_ready(pod, daemon.container);
            if is_running && running.is_none() {
                running = Some(start.elapsed());
            }
            if is_ready && ready.is_none() {
                ready = Some(start.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (first, all) = stats
        .expect("started once the old pod was gone")
        .await
        .map_err(|e| e.to_string())??;
    out.old_pod_gone_ms = ms(old_gone.unwrap_or_default());
    out.new_pod_running_ms = ms(running.unwrap_or_default());
    out.ready_ms = ms(ready.unwrap_or_default());
    out.first_stats_ms = ms(first);
    out.all_stats_ms = ms(all);
    out.serving_ms = out.ready_ms.max(out.all_stats_ms);
    out.rss_kib = rss_kib(daemon.process).ok_or_else(|| format!("no {} process in /proc", daemon.process))?;
    Ok(out)
}

/// Writes the daemon container's log to `$LOCALVOL_BENCH_LOG_DIR/<daemon>-<pod>.log`
/// when that is set: a deleted pod's log goes with it, and it is where a slow call of
/// the runs before says what it waited on.
async fn keep_log(pods: &Api<Pod>, daemon: &DaemonSetPod, pod: &str) -> Result<(), String> {
    let Some(dir) = std::env::var_os("LOCALVOL_BENCH_LOG_DIR").map(PathBuf::from) else {
        return Ok(());
    };
    let params = LogParams {
        container: Some(daemon.container.into()),
        ..LogParams::default()
    };
    let log = pods
        .logs(pod, &params)
        .await
        .map_err(|e| format!("the log of {pod}: {e}"))?;
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(format!("{}-{pod}.log", daemon.name)), log).map_err(|e| e.to_string())
}

/// Asks the new daemon for every volume's stats, 8 at a time, retrying each until it
/// answers; returns when the first and the last answered, since `start`.
async fn all_stats(
    socket: &'static str,
    published: Vec<Published>,
    start: Instant,
    limit: Duration,
) -> Result<(Duration, Duration), String> {
    let client = loop {
        if start.elapsed() > limit {
            return Err("the new daemon's socket never answered".into());
        }
        match localvol::csi::socket::connect(std::path::Path::new(socket)).await {
            Ok(channel) => break CsiClient::new(channel),
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    if published.is_empty() {
        // No volume to ask about: the first answer is to a probe.
        loop {
            if client
                .identity()
                .probe(localvol::proto::csi::v1::ProbeRequest {})
                .await
                .is_ok()
            {
                let at = start.elapsed();
                return Ok((at, at));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let gate = Arc::new(Semaphore::new(8));
    let mut tasks = tokio::task::JoinSet::new();
    for volume in published {
        let (client, gate) = (client.clone(), gate.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await.expect("open semaphore");
            loop {
                let answer = client
                    .node()
                    .node_get_volume_stats(stats_request(&volume.volume_id, &volume.target))
                    .await;
                match answer {
                    Ok(_) => return Ok(start.elapsed()),
                    Err(e) if start.elapsed() > limit => return Err(format!("{}: {e}", volume.volume_id)),
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        });
    }
    let (mut first, mut last) = (Duration::MAX, Duration::ZERO);
    while let Some(done) = tasks.join_next().await {
        let at = done.map_err(|e| e.to_string())??;
        first = first.min(at);
        last = last.max(at);
    }
    Ok((first, last))
}

/// VmRSS of the one process named `process` on this host.
fn rss_kib(process: &str) -> Option<u64> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let dir = entry.path();
        if std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.trim() == process) {
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            return line.split_whitespace().nth(1)?.parse().ok();
        }
    }
    None
}
