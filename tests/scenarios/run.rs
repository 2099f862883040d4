//! What a scenario knows of its run, and the cluster calls scenarios share.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T = ()> = std::result::Result<T, Error>;

/// Where the manifests deploy the daemon (deploy/base).
const SYSTEM_NAMESPACE: &str = "localvol-system";
const DAEMONSET: &str = "localvol-node";
const DAEMON_CONTAINER: &str = "localvol";

/// The run's facts, as the shell entry exports them (the names tests/cluster/lib.sh
/// uses), and a client of its API server.
#[derive(Clone)]
pub struct Run {
    pub client: Client,
    /// The scenario's own namespace.
    pub namespace: String,
    /// The overlay's StorageClass, and the device class and kind behind it.
    pub storage_class: String,
    pub device_class: String,
    pub class_kind: String,
    /// The size of a filesystem claim on this class.
    pub fs_size: String,
    pub node: String,
    /// The loop class's images on the node (`/var/lib/localvol/loop`).
    pub loop_dir: PathBuf,
    /// The API server's audit log of the daemon's requests, when the run keeps one
    /// (tests/cluster/run.sh).
    pub audit_log: Option<PathBuf>,
    /// The daemon's metrics port on the node's loopback (host network), as the
    /// DaemonSet sets it.
    pub metrics_port: u16,
}

fn var(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

impl Run {
    /// The run the environment describes; fails loudly without a cluster to run on.
    pub async fn from_env(scenario: &str) -> Self {
        assert!(
            std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty()),
            "{scenario}: KUBECONFIG must name the cluster under test (the scenario's shell entry sets it)"
        );
        let short = scenario.split('_').next().unwrap_or(scenario);
        let client = Client::try_default().await.expect("a client from KUBECONFIG");
        let metrics_port = metrics_port(&client)
            .await
            .unwrap_or_else(|e| panic!("{scenario}: the daemon's metrics port: {e}"));
        Self {
            client,
            namespace: format!("lvtest-{short}"),
            storage_class: var("SC", "localvol-loop"),
            device_class: var("DEVICE_CLASS", "loop"),
            class_kind: var("CLASS_KIND", "loop"),
            fs_size: var("FS_SIZE", "64Mi"),
            node: var("NODE_NAME", "node1"),
            loop_dir: PathBuf::from(var("LOOP_DIR", "/var/lib/localvol/loop")),
            audit_log: std::env::var_os("AUDIT_LOG")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            metrics_port,
        }
    }

    /// A line in the run's log, as the shell scenarios print theirs (tests/cluster/lib.sh's
    /// `note`): tests/cluster/run.sh's summary takes the lines that start `NOTE `.
    pub fn note(&self, line: &str) {
        let now = k8s_openapi::jiff::Timestamp::now().strftime("%H:%M:%S");
        let _ = writeln!(std::io::stderr(), "  [{now}] {line}");
    }

    fn namespaced<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub async fn create_namespace(&self) {
        self.create_namespace_named(&self.namespace)
            .await
            .unwrap_or_else(|e| panic!("namespace {}: {e}", self.namespace));
    }

    /// A namespace `name` labelled as the tests' (the run's cleanup finds them by it).
    pub async fn create_namespace_named(&self, name: &str) -> Result {
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"lvtest": "1"}}
        }))?;
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(())
    }

    /// Deletes the namespace and waits until it, and so its claims' volumes, are gone.
    pub async fn delete_namespace(&self) -> Result {
        let namespaces = Api::<Namespace>::all(self.client.clone());
        namespaces
            .delete(&self.namespace, &DeleteParams::default())
            .await?;
        self.wait_for("the namespace gone", Duration::from_secs(180), || async {
            Ok(namespaces.get_opt(&self.namespace).await?.is_none().then_some(()))
        })
        .await
    }

    /// Polls `found` every second until it finds something, or fails after `limit`.
    pub async fn wait_for<T, F, Fut>(&self, what: &str, limit: Duration, mut found: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<T>>>,
    {
        let start = Instant::now();
        loop {
            if let Some(found) = found().await? {
                self.note(&format!("{what} ({} s)", start.elapsed().as_secs()));
                return Ok(found);
            }
            if start.elapsed() > limit {
                return Err(format!("timed out after {limit:?} waiting for: {what}").into());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// A ReadWriteOnce filesystem claim `name` of the run's class and size.
    pub async fn claim(&self, name: &str) -> Result {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": self.storage_class,
                "resources": {"requests": {"storage": self.fs_size}}
            }
        }))?;
        self.namespaced::<PersistentVolumeClaim>()
            .create(&PostParams::default(), &claim)
            .await?;
        Ok(())
    }

    /// A pod `name` (the kit's busybox, idle) with claim `claim` mounted at /data, on the
    /// node's network as lib.sh's apply_pod makes them (a pod network adds the CNI
    /// plugins' runs, not what is tested).
    pub async fn pod_with(&self, name: &str, claim: &str) -> Result {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "hostNetwork": true,
                "containers": [{
                    "name": "app",
                    "image": "localhost/busybox:1",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 3600 & wait $!; done"],
                    "volumeMounts": [{"name": "vol", "mountPath": "/data"}]
                }],
                "volumes": [{"name": "vol", "persistentVolumeClaim": {"claimName": claim}}]
            }
        }))?;
        self.namespaced::<Pod>()
            .create(&PostParams::default(), &pod)
            .await?;
        let pods = self.namespaced::<Pod>();
        self.wait_for(
            &format!("pod {name} Running"),
            Duration::from_secs(120),
            || async {
                let pod = pods.get(name).await?;
                Ok((pod.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
            },
        )
        .await
    }

    /// Deletes pod `pod` and claim `claim`, and waits until the claim's volume `pv` is
    /// gone: unpublished, unstaged and deleted by the driver.
    pub async fn delete_pod_and_claim(&self, pod: &str, claim: &str, pv: &str) -> Result {
        self.pods().delete(pod, &DeleteParams::default()).await?;
        self.claims().delete(claim, &DeleteParams::default()).await?;
        let volumes = self.volumes();
        self.wait_for("the volume deleted", Duration::from_secs(120), || async {
            Ok(volumes.get_opt(pv).await?.is_none().then_some(()))
        })
        .await
    }

    /// The PersistentVolume bound to claim `claim`, and its CSI volume id.
    pub async fn volume_of(&self, claim: &str) -> Result<(String, String)> {
        let claim = self.namespaced::<PersistentVolumeClaim>().get(claim).await?;
        let pv = claim
            .spec
            .and_then(|s| s.volume_name)
            .ok_or("the claim is not bound")?;
        let id = self
            .volumes()
            .get(&pv)
            .await?
            .spec
            .and_then(|s| s.csi)
            .ok_or("the volume is not a CSI volume")?
            .volume_handle;
        Ok((pv, id))
    }

    pub fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    pub fn pods(&self) -> Api<Pod> {
        self.namespaced()
    }

    pub fn claims(&self) -> Api<PersistentVolumeClaim> {
        self.namespaced()
    }

    /// The events about the claim `claim`, oldest first.
    pub async fn claim_events(&self, claim: &str) -> Result<Vec<Event>> {
        let selector = format!("regarding.kind=PersistentVolumeClaim,regarding.name={claim}");
        let mut events = self
            .namespaced::<Event>()
            .list(&ListParams::default().fields(&selector))
            .await?
            .items;
        events.sort_by_key(|e| e.metadata.creation_timestamp.clone());
        Ok(events)
    }

    /// The node's kubelet's /metrics, through the API server's node proxy.
    pub async fn kubelet_metrics(&self) -> Result<String> {
        let request =
            http::Request::get(format!("/api/v1/nodes/{}/proxy/metrics", self.node)).body(Vec::new())?;
        Ok(self.client.request_text(request).await?)
    }

    /// The daemon's /metrics on the node (the manifests' host network and port).
    pub async fn driver_metrics(&self) -> Result<String> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.metrics_port));
        match localvol_testkit::http_get(addr, "/metrics").await? {
            (200, body) => Ok(body),
            (code, body) => Err(format!("/metrics answered {code}: {body}").into()),
        }
    }
}

/// The port of the daemon's metrics listener: its DaemonSet's LOCALVOL_METRICS_ADDR.
async fn metrics_port(client: &Client) -> Result<u16> {
    let daemonset = Api::<DaemonSet>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .get(DAEMONSET)
        .await?;
    let addr = daemonset
        .spec
        .template
        .spec
        .and_then(|p| p.containers.into_iter().find(|c| c.name == DAEMON_CONTAINER))
        .and_then(|c| c.env)
        .into_iter()
        .flatten()
        .find(|e| e.name == "LOCALVOL_METRICS_ADDR")
        .and_then(|e| e.value)
        .ok_or("no LOCALVOL_METRICS_ADDR on the DaemonSet's localvol container")?;
    let (_, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("LOCALVOL_METRICS_ADDR {addr} has no port"))?;
    Ok(port.parse()?)
}

/// The sum of every series `name{labels}` in a Prometheus text exposition that carries
/// every label of `labels` (whatever its other labels); `None` when there is none.
pub fn series_total(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    series(text, name, labels).reduce(|a, b| a + b)
}

/// The value of the series `name{labels}` in a Prometheus text exposition, whatever the
/// order of its labels, when every label of `labels` is on it.
pub fn series_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    series(text, name, labels).next()
}

fn series<'a>(
    text: &'a str,
    name: &'a str,
    labels: &'a [(&'a str, &'a str)],
) -> impl Iterator<Item = f64> + 'a {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (inside, value) = rest.rsplit_once("} ")?;
        labels
            .iter()
            .all(|(k, v)| inside.split(',').any(|pair| pair == format!(r#"{k}="{v}""#)))
            .then(|| value.trim().parse().ok())?
    })
}
