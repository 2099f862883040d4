//! What a scenario knows of its run, and the cluster calls scenarios share.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{
    ApiResource, AttachParams, DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client};
use localvol::model::DRIVER_NAME;
use serde_json::json;
use tokio::io::AsyncReadExt;

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T = ()> = std::result::Result<T, Error>;

/// Where the manifests deploy the daemon (deploy/base), and the label of its pods.
pub const SYSTEM_NAMESPACE: &str = "localvol-system";
const DAEMONSET: &str = "localvol-node";
const DAEMON_SELECTOR: &str = "app.kubernetes.io/component=node";
const DAEMON_CONTAINER: &str = "localvol";
/// The label of what the scenarios make outside their namespace (tests/cluster/lib.sh's
/// too: the run's cleanup finds them by it).
const TEST_LABEL: &str = "lvtest";
/// A test pod's script: idle, one process an hour (each costs the emulated guest).
pub const IDLE: &str = "while true; do sleep 3600 & wait $!; done";

/// How a test pod has its volume.
pub enum PodVolume<'a> {
    /// A filesystem claim, mounted.
    Filesystem(&'a str),
    /// A raw block claim, its device node.
    Block(&'a str),
    /// A generic ephemeral volume of the class and size, mounted.
    Ephemeral { class: &'a str, size: &'a str },
}

/// A claim to make: its size, StorageClass, volume mode and annotations.
#[derive(Clone, Debug)]
pub struct ClaimShape {
    pub size: String,
    pub class: String,
    pub block: bool,
    pub annotations: BTreeMap<String, String>,
    /// The claim's `spec.dataSource`: a VolumeSnapshot to restore, a claim to clone.
    pub data_source: Option<serde_json::Value>,
}

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
    /// The StorageClass's csi.storage.k8s.io/fstype.
    pub fstype: String,
    /// The size of a filesystem claim on this class, and of a raw block claim.
    pub fs_size: String,
    pub block_size: String,
    pub node: String,
    /// The loop class's images on the node (`/var/lib/localvol/loop`).
    pub loop_dir: PathBuf,
    /// The API server's audit log of the daemon's requests, when the run keeps one
    /// (tests/cluster/run.sh).
    pub audit_log: Option<PathBuf>,
    /// The daemon's metrics port on the node's loopback (host network), as the
    /// DaemonSet sets it.
    pub metrics_port: u16,
    /// The volume group of the lvm classes (the overlay's config.yaml's), and the thin
    /// pool of the lvm-thin ones.
    pub lvm_vg: String,
    pub thin_pool: String,
    /// The overlay the run deployed (OVERLAY), which a scenario that swaps overlays puts
    /// back.
    pub overlay: Option<PathBuf>,
    /// What every wait's limit is multiplied by: 3 under TCG in the guest
    /// (tests/vm/cluster-guest.sh's WAIT_SCALE, as the shell scenarios take it).
    pub wait_scale: u32,
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
            fstype: var("FSTYPE", "ext4"),
            fs_size: var("FS_SIZE", "64Mi"),
            block_size: var("BLOCK_SIZE", "32Mi"),
            node: var("NODE_NAME", "node1"),
            loop_dir: PathBuf::from(var("LOOP_DIR", "/var/lib/localvol/loop")),
            audit_log: std::env::var_os("AUDIT_LOG")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            metrics_port,
            lvm_vg: var("LVM_VG", "localvol"),
            thin_pool: var("THIN_POOL", "pool0"),
            overlay: std::env::var_os("OVERLAY")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            wait_scale: var("WAIT_SCALE", "1")
                .parse()
                .unwrap_or_else(|e| panic!("{scenario}: WAIT_SCALE: {e}")),
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
            "metadata": {"name": name, "labels": {TEST_LABEL: "1"}}
        }))?;
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(())
    }

    /// Deletes the namespace and waits until it and its claims' volumes are gone.
    pub async fn delete_namespace(&self) -> Result {
        let volumes: Vec<String> = self
            .claims()
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|c| c.spec?.volume_name)
            .collect();
        let namespaces = Api::<Namespace>::all(self.client.clone());
        namespaces
            .delete(&self.namespace, &DeleteParams::default())
            .await?;
        self.wait_for("the namespace gone", Duration::from_secs(180), || async {
            Ok(namespaces.get_opt(&self.namespace).await?.is_none().then_some(()))
        })
        .await?;
        for pv in volumes {
            self.volume_gone(&pv, Duration::from_secs(60)).await?;
        }
        Ok(())
    }

    /// Polls `found` every second until it finds something, or fails after `limit` (times
    /// the run's wait scale).
    pub async fn wait_for<T, F, Fut>(&self, what: &str, limit: Duration, mut found: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<T>>>,
    {
        let start = Instant::now();
        let limit = limit * self.wait_scale;
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
        self.create_claim(name, &self.claim_shape()).await
    }

    /// The run's filesystem claim, to change before [`Run::create_claim`].
    pub fn claim_shape(&self) -> ClaimShape {
        ClaimShape {
            size: self.fs_size.clone(),
            class: self.storage_class.clone(),
            block: false,
            annotations: BTreeMap::new(),
            data_source: None,
        }
    }

    /// A ReadWriteOnce claim `name` of `shape`.
    pub async fn create_claim(&self, name: &str, shape: &ClaimShape) -> Result {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": shape.annotations},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": if shape.block { "Block" } else { "Filesystem" },
                "storageClassName": shape.class,
                "resources": {"requests": {"storage": shape.size}},
                "dataSource": shape.data_source
            }
        }))?;
        self.claims().create(&PostParams::default(), &claim).await?;
        Ok(())
    }

    /// The claim's phase (Pending, Bound, Lost), `None` before it has one.
    pub async fn claim_phase(&self, claim: &str) -> Result<Option<String>> {
        Ok(self.claims().get(claim).await?.status.and_then(|s| s.phase))
    }

    /// A WaitForFirstConsumer StorageClass `name` of the run's device class with
    /// `fstype`, labelled as the tests' (the scenario's cleanup deletes it), to change
    /// before [`Run::create_storage_class`].
    pub fn storage_class(&self, name: &str, fstype: &str, allow_expansion: bool) -> Result<StorageClass> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {TEST_LABEL: "1"}},
            "provisioner": DRIVER_NAME,
            "parameters": {
                "localvol.csi.dev/device-class": self.device_class,
                "csi.storage.k8s.io/fstype": fstype
            },
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": allow_expansion
        }))?)
    }

    pub async fn create_storage_class(&self, class: &StorageClass) -> Result {
        Api::<StorageClass>::all(self.client.clone())
            .create(&PostParams::default(), class)
            .await?;
        Ok(())
    }

    /// Deletes the StorageClasses the scenarios made (labelled as the tests').
    pub async fn delete_test_storage_classes(&self) -> Result {
        Api::<StorageClass>::all(self.client.clone())
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&format!("{TEST_LABEL}=1")),
            )
            .await?;
        Ok(())
    }

    /// A pod `name` (the kit's busybox, idle) with claim `claim` mounted at /data,
    /// Running.
    pub async fn pod_with(&self, name: &str, claim: &str) -> Result {
        self.create_pod(name, &PodVolume::Filesystem(claim), "/data", IDLE)
            .await?;
        self.pods_running(&[name], Duration::from_secs(120)).await
    }

    /// A pod `name` of the kit's busybox that runs `script` (sh) until stopped, with
    /// `volume` at `path` (a mount, or a raw block claim's device node), on the node's
    /// network (a pod network adds the CNI plugins' runs, not what is tested). Not
    /// waited for.
    pub async fn create_pod(&self, name: &str, volume: &PodVolume<'_>, path: &str, script: &str) -> Result {
        let (source, attach) = match volume {
            PodVolume::Filesystem(claim) => (
                json!({"persistentVolumeClaim": {"claimName": claim}}),
                json!({"volumeMounts": [{"name": "vol", "mountPath": path}]}),
            ),
            PodVolume::Block(claim) => (
                json!({"persistentVolumeClaim": {"claimName": claim}}),
                json!({"volumeDevices": [{"name": "vol", "devicePath": path}]}),
            ),
            PodVolume::Ephemeral { class, size } => (
                json!({"ephemeral": {"volumeClaimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": class,
                    "resources": {"requests": {"storage": size}}
                }}}}),
                json!({"volumeMounts": [{"name": "vol", "mountPath": path}]}),
            ),
        };
        let mut container = json!({
            "name": "app",
            "image": "localhost/busybox:1",
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", format!("trap 'exit 0' TERM; {script}")],
        });
        container
            .as_object_mut()
            .ok_or("a container that is not an object")?
            .extend(attach.as_object().cloned().unwrap_or_default());
        let mut volume = json!({"name": "vol"});
        volume
            .as_object_mut()
            .ok_or("a volume that is not an object")?
            .extend(source.as_object().cloned().unwrap_or_default());
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "hostNetwork": true,
                "containers": [container],
                "volumes": [volume]
            }
        }))?;
        self.pods().create(&PostParams::default(), &pod).await?;
        Ok(())
    }

    /// Waits until every pod of `names` is Running, in one list of the namespace a poll.
    pub async fn pods_running(&self, names: &[&str], limit: Duration) -> Result {
        let pods = self.pods();
        self.wait_for(&format!("pods {} Running", names.join(", ")), limit, || async {
            let running: Vec<String> = pods
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter_map(|p| p.metadata.name)
                .collect();
            Ok(names.iter().all(|n| running.iter().any(|r| r == n)).then_some(()))
        })
        .await
    }

    /// The pod's phase, `None` before it has one.
    pub async fn pod_phase(&self, pod: &str) -> Result<Option<String>> {
        Ok(self.pods().get(pod).await?.status.and_then(|s| s.phase))
    }

    /// Deletes the pods `names` and waits until they are gone.
    pub async fn delete_pods(&self, names: &[&str]) -> Result {
        let pods = self.pods();
        for name in names {
            pods.delete(name, &DeleteParams::default()).await?;
        }
        self.wait_for(
            &format!("pods {} gone", names.join(", ")),
            Duration::from_secs(90),
            || async {
                for name in names {
                    if pods.get_opt(name).await?.is_some() {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            },
        )
        .await
    }

    /// Deletes pod `pod` and claim `claim`, and waits until the claim's volume `pv` is
    /// gone: unpublished, unstaged and deleted by the driver.
    pub async fn delete_pod_and_claim(&self, pod: &str, claim: &str, pv: &str) -> Result {
        self.pods().delete(pod, &DeleteParams::default()).await?;
        self.claims().delete(claim, &DeleteParams::default()).await?;
        self.volume_gone(pv, Duration::from_secs(120)).await
    }

    /// Waits up to `limit` until the PersistentVolume `pv` is gone (the driver deleted
    /// the volume).
    pub async fn volume_gone(&self, pv: &str, limit: Duration) -> Result {
        self.gone(&self.volumes(), pv, &format!("volume {pv} deleted"), limit)
            .await
    }

    /// Waits up to `limit` until the object `name` of `api` is gone.
    pub async fn gone<K>(&self, api: &Api<K>, name: &str, what: &str, limit: Duration) -> Result
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        self.wait_for(what, limit, || async {
            Ok(api.get_opt(name).await?.is_none().then_some(()))
        })
        .await
    }

    /// The PersistentVolume bound to claim `claim`, and its CSI volume id; fails unless
    /// it is localvol's and pinned to the run's node.
    pub async fn volume_of(&self, claim: &str) -> Result<(String, String)> {
        let claim = self.namespaced::<PersistentVolumeClaim>().get(claim).await?;
        let pv = claim
            .spec
            .and_then(|s| s.volume_name)
            .ok_or("the claim is not bound")?;
        let spec = self.volumes().get(&pv).await?.spec.ok_or("a PV without spec")?;
        let nodes: Vec<String> = spec
            .node_affinity
            .and_then(|a| a.required)
            .into_iter()
            .flat_map(|r| r.node_selector_terms)
            .flat_map(|t| t.match_expressions.unwrap_or_default())
            .flat_map(|e| e.values.unwrap_or_default())
            .collect();
        if nodes != [self.node.clone()] {
            return Err(format!("PV {pv} is pinned to {nodes:?}, not to node {}", self.node).into());
        }
        let csi = spec.csi.ok_or("the volume is not a CSI volume")?;
        if csi.driver != DRIVER_NAME {
            return Err(format!("PV {pv} is {}'s, not {DRIVER_NAME}'s", csi.driver).into());
        }
        Ok((pv, csi.volume_handle))
    }

    /// Runs `script` with sh in pod `pod`'s container `app` (the test pods) and returns
    /// its standard output; an error if it does not exit 0.
    pub async fn exec(&self, pod: &str, script: &str) -> Result<String> {
        Ok(exec_in(&self.pods(), pod, "app", &["sh", "-c", script]).await?.0)
    }

    /// The size in KiB of the filesystem at /data in pod `pod` (a test pod's), as df
    /// shows it there.
    pub async fn filesystem_kib(&self, pod: &str) -> Result<u64> {
        // -P: one line, even when the device's name is long, as an LV's /dev/mapper name is
        // (busybox wraps it otherwise).
        let out = self.exec(pod, "df -P -k /data").await?;
        df_size_kib(&out).ok_or_else(|| format!("df -P -k /data in {pod}: {out:?}").into())
    }

    /// Runs `argv` in the daemon pod `pod`'s localvol container and returns its standard
    /// output and error; an error, with both, if it does not exit 0.
    pub async fn exec_daemon(&self, pod: &str, argv: &[&str]) -> Result<(String, String)> {
        exec_in(&self.system_pods(), pod, DAEMON_CONTAINER, argv).await
    }

    /// Asks for claim `claim` to hold `size` (its spec's storage request), as a user
    /// asks for an expansion.
    pub async fn resize_claim(&self, claim: &str, size: &str) -> Result {
        let patch = json!({"spec": {"resources": {"requests": {"storage": size}}}});
        self.claims()
            .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// The arguments of the daemon's container in the DaemonSet's pod template.
    pub async fn daemon_args(&self) -> Result<Vec<String>> {
        let ds = Api::<DaemonSet>::namespaced(self.client.clone(), SYSTEM_NAMESPACE)
            .get(DAEMONSET)
            .await?;
        ds.spec
            .template
            .spec
            .and_then(|p| p.containers.into_iter().find(|c| c.name == DAEMON_CONTAINER))
            .map(|c| c.args.unwrap_or_default())
            .ok_or_else(|| format!("no container {DAEMON_CONTAINER} in DaemonSet {DAEMONSET}").into())
    }

    /// The daemon's pods on the node (the DaemonSet's).
    pub async fn daemon_pods(&self) -> Result<Vec<Pod>> {
        Ok(self
            .system_pods()
            .list(&ListParams::default().labels(DAEMON_SELECTOR))
            .await?
            .items)
    }

    /// The name of the daemon's pod.
    pub async fn daemon_pod(&self) -> Result<String> {
        self.daemon_pods()
            .await?
            .into_iter()
            .find_map(|p| p.metadata.name)
            .ok_or_else(|| "no daemon pod".into())
    }

    /// Every scheduled daemon pod Ready and of the DaemonSet's current generation, and
    /// no other (a replaced pod still terminating is one too many).
    pub async fn daemon_ready(&self) -> Result<bool> {
        let ds = Api::<DaemonSet>::namespaced(self.client.clone(), SYSTEM_NAMESPACE)
            .get(DAEMONSET)
            .await?;
        let generation = ds.metadata.generation;
        let Some(status) = ds.status else {
            return Ok(false);
        };
        let desired = status.desired_number_scheduled;
        Ok(desired >= 1
            && status.number_ready == desired
            && status.updated_number_scheduled == Some(desired)
            && status.observed_generation == generation
            && self.daemon_pods().await?.len() == usize::try_from(desired)?)
    }

    /// The node's CSINode lists localvol with its topology key.
    pub async fn registered(&self) -> Result<bool> {
        let Some(node) = Api::<CSINode>::all(self.client.clone())
            .get_opt(&self.node)
            .await?
        else {
            return Ok(false);
        };
        Ok(node.spec.drivers.iter().any(|d| {
            d.name == DRIVER_NAME
                && d.topology_keys
                    .iter()
                    .flatten()
                    .any(|k| k == "topology.localvol.csi.dev/node")
        }))
    }

    /// The node's PID of the daemon container of daemon pod `pod` (its containerd task).
    pub async fn daemon_pid(&self, pod: &str) -> Result<i32> {
        let status = self.system_pods().get(pod).await?.status.unwrap_or_default();
        let id = status
            .container_statuses
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.name == DAEMON_CONTAINER)
            .and_then(|c| c.container_id)
            .ok_or_else(|| format!("no container {DAEMON_CONTAINER} running in {pod}"))?;
        let id = id.strip_prefix("containerd://").unwrap_or(&id).to_string();
        let socket = var("KUBE_KIT_CRI_SOCK", "/run/containerd/containerd.sock");
        let tasks =
            localvol_testkit::guest::try_sh("ctr", &["--address", &socket, "-n", "k8s.io", "task", "ls"])?;
        task_pid(&tasks, &id).ok_or_else(|| format!("no containerd task {id} of {pod}").into())
    }

    /// A daemon pod other than `old` Ready, and the DaemonSet rolled out (an upgrade's or
    /// a rollback's replacement of `old`).
    pub async fn daemon_replaced(&self, old: &str) -> Result {
        self.wait_for(
            &format!("a daemon pod in place of {old} Ready"),
            Duration::from_secs(120),
            || async {
                let replaced = self
                    .daemon_pods()
                    .await?
                    .iter()
                    .all(|p| p.metadata.name.as_deref() != Some(old));
                Ok((replaced && self.daemon_ready().await?).then_some(()))
            },
        )
        .await
    }

    /// Deletes the object `name` of `api` and waits up to `limit` until it is gone, its
    /// finalizers done (`kubectl delete --wait`).
    pub async fn delete_and_wait<K>(&self, api: &Api<K>, name: &str, limit: Duration) -> Result
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        api.delete(name, &DeleteParams::default()).await?;
        self.gone(api, name, &format!("{name} deleted"), limit).await
    }

    /// `kubectl apply -k OVERLAY`, as an operator applies an overlay: kustomize has no
    /// kube-rs counterpart, and the run deployed its own overlay this way.
    pub async fn apply_overlay(&self, overlay: &Path) -> Result {
        tool("kubectl", &["apply", "-k", &overlay.to_string_lossy()], None).await?;
        self.note(&format!("applied {}", overlay.display()));
        Ok(())
    }

    /// The overlay the run deployed; an error when the shell entry did not say.
    pub fn own_overlay(&self) -> Result<&Path> {
        self.overlay
            .as_deref()
            .ok_or_else(|| "OVERLAY must name the run's overlay (the scenario's shell entry sets it)".into())
    }

    pub fn system_pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), SYSTEM_NAMESPACE)
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
        self.events_about(&self.namespaced(), "PersistentVolumeClaim", claim)
            .await
    }

    /// The events about the pod `pod`, oldest first.
    pub async fn pod_events(&self, pod: &str) -> Result<Vec<Event>> {
        self.events_about(&self.namespaced(), "Pod", pod).await
    }

    /// The events about the node (in the default namespace, as kubelet and localvol
    /// record them), oldest first.
    pub async fn node_events(&self) -> Result<Vec<Event>> {
        let default = Api::namespaced(self.client.clone(), "default");
        self.events_about(&default, "Node", &self.node).await
    }

    async fn events_about(&self, events: &Api<Event>, kind: &str, name: &str) -> Result<Vec<Event>> {
        let selector = format!("regarding.kind={kind},regarding.name={name}");
        let mut events = events.list(&ListParams::default().fields(&selector)).await?.items;
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
        self.driver_page("/metrics").await
    }

    /// A page of the daemon's metrics listener (/metrics, /readyz, /healthz); an error
    /// unless it answers 200.
    pub async fn driver_page(&self, path: &str) -> Result<String> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.metrics_port));
        match localvol_testkit::http_get(addr, path).await? {
            (200, body) => Ok(body),
            (code, body) => Err(format!("{path} answered {code}: {body}").into()),
        }
    }

    /// The daemon container's log (`kubectl logs POD -c localvol`).
    pub async fn daemon_log(&self) -> Result<String> {
        let pod = self.daemon_pod().await?;
        let params = LogParams {
            container: Some(DAEMON_CONTAINER.to_string()),
            ..LogParams::default()
        };
        Ok(self.system_pods().logs(&pod, &params).await?)
    }

    /// Whether container `container` of the daemon's pod is ready (a sidecar an
    /// overlay adds).
    pub async fn daemon_container_ready(&self, container: &str) -> Result<bool> {
        let pod = self.system_pods().get(&self.daemon_pod().await?).await?;
        Ok(pod
            .status
            .and_then(|s| s.container_statuses)
            .into_iter()
            .flatten()
            .any(|c| c.name == container && c.ready))
    }

    /// The scenario's VolumeSnapshots (a CRD: no k8s-openapi type).
    pub fn volume_snapshots(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &snapshot_resource("VolumeSnapshot", "volumesnapshots"),
        )
    }

    /// The VolumeSnapshots of every namespace.
    pub fn all_volume_snapshots(&self) -> Api<DynamicObject> {
        Api::all_with(
            self.client.clone(),
            &snapshot_resource("VolumeSnapshot", "volumesnapshots"),
        )
    }

    /// The cluster's VolumeSnapshotContents.
    pub fn volume_snapshot_contents(&self) -> Api<DynamicObject> {
        Api::all_with(
            self.client.clone(),
            &snapshot_resource("VolumeSnapshotContent", "volumesnapshotcontents"),
        )
    }

    /// The cluster's VolumeSnapshotClasses.
    pub fn volume_snapshot_classes(&self) -> Api<DynamicObject> {
        Api::all_with(
            self.client.clone(),
            &snapshot_resource("VolumeSnapshotClass", "volumesnapshotclasses"),
        )
    }
}

/// A kind of the external snapshotter's API group (snapshot.storage.k8s.io/v1).
pub fn snapshot_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: SNAPSHOT_GROUP.to_string(),
        version: "v1".to_string(),
        api_version: format!("{SNAPSHOT_GROUP}/v1"),
        kind: kind.to_string(),
        plural: plural.to_string(),
    }
}

/// The external snapshotter's API group.
pub const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";

/// The directory of an overlay of the cluster tests (tests/cluster/overlays/NAME).
pub fn test_overlay(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/cluster/overlays")
        .join(name)
}

/// Runs `program` with `args` (and `input` on its standard input), in the C locale, and
/// returns its standard output; an error with its standard error unless it exits 0.
/// For the tools a scenario drives as an operator would (kubectl's kustomize, helm).
pub async fn tool(program: &str, args: &[&str], input: Option<&str>) -> Result<String> {
    use std::process::Stdio;
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("LC_ALL", "C")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(input.as_bytes()).await?;
    }
    let out = child.wait_with_output().await?;
    if !out.status.success() {
        return Err(format!(
            "{program} {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        )
        .into());
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Runs `argv` in container `container` of pod `pod` and returns its standard output and
/// error; an error, with both, if it does not exit 0.
async fn exec_in(pods: &Api<Pod>, pod: &str, container: &str, argv: &[&str]) -> Result<(String, String)> {
    let params = AttachParams::default().container(container).stderr(true);
    let mut process = pods.exec(pod, argv.to_vec(), &params).await?;
    let mut stdout = process.stdout().ok_or("exec without stdout")?;
    let mut stderr = process.stderr().ok_or("exec without stderr")?;
    let status = process.take_status().ok_or("exec without status")?;
    let (mut out, mut err) = (String::new(), String::new());
    let (read_out, read_err) = tokio::join!(stdout.read_to_string(&mut out), stderr.read_to_string(&mut err));
    read_out?;
    read_err?;
    let status = status.await;
    process.join().await?;
    match status.as_ref().and_then(|s| s.status.as_deref()) {
        Some("Success") => Ok((out, err)),
        _ => Err(format!("{pod}/{container}: {argv:?}: {status:?}: {out}{err}").into()),
    }
}

/// The size of the filesystem on `df -P -k`'s one line after its header.
fn df_size_kib(df: &str) -> Option<u64> {
    df.lines().nth(1)?.split_whitespace().nth(1)?.parse().ok()
}

/// The PID of task `id` in `ctr task ls`'s table (TASK PID STATUS).
fn task_pid(tasks: &str, id: &str) -> Option<i32> {
    tasks.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next()? == id).then(|| words.next()?.parse().ok())?
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dfs_size_is_the_second_field_of_its_second_line() {
        let df = "Filesystem           1024-blocks    Used Available Capacity Mounted on\n\
                  /dev/mapper/localvol-pvc--0df4652c--5f26  589824   35580    554244   6% /data\n";
        assert_eq!(df_size_kib(df), Some(589_824));
        assert_eq!(df_size_kib("Filesystem 1024-blocks\n"), None);
    }

    #[test]
    fn a_tasks_pid_is_read_from_ctrs_table() {
        let table = "TASK                                                                PID     STATUS\n\
                     4f2a9c                                                              1234    RUNNING\n\
                     9e11ab                                                              987     RUNNING\n";
        assert_eq!(task_pid(table, "9e11ab"), Some(987));
        assert_eq!(task_pid(table, "4f2a"), None, "a prefix is another task");
        assert_eq!(task_pid(table, "TASK"), None, "the header has no PID");
    }
}
