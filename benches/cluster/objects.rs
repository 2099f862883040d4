//! The benchmark's pods and claims: what each kind of pod is, how they are made and
//! removed, and how long removal takes until the API (and so the driver) is done.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::Semaphore;

pub const NAMESPACE: &str = "lvtest-bench";
/// Every object of the benchmark carries this label (the watches select on it).
pub const LABEL: &str = "localvol-bench/run";

/// What a pod gets as its volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An emptyDir: the floor, a pod start with no driver in it.
    Floor,
    /// A new claim of localvol's loop class.
    Localvol,
    /// A new claim of the peer (csi-driver-host-path, distributed mode).
    Peer,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Floor, Kind::Localvol, Kind::Peer];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Floor => "floor",
            Kind::Localvol => "localvol",
            Kind::Peer => "peer",
        }
    }

    fn storage_class(self) -> Option<&'static str> {
        match self {
            Kind::Floor => None,
            Kind::Localvol => Some("localvol-loop"),
            Kind::Peer => Some("localvol-bench-hostpath"),
        }
    }
}

#[derive(Clone)]
pub struct Objects {
    pub pods: Api<Pod>,
    pub claims: Api<PersistentVolumeClaim>,
    pub volumes: Api<PersistentVolume>,
}

/// A pod to start: its name, kind, and how many new claims it mounts (0 for the floor).
pub struct PodSpec {
    pub name: String,
    pub kind: Kind,
    pub group: String,
    pub claims: usize,
}

impl PodSpec {
    pub fn one(name: String, kind: Kind, group: &str) -> Self {
        let claims = usize::from(kind != Kind::Floor);
        Self {
            name,
            kind,
            group: group.to_string(),
            claims,
        }
    }

    pub fn claim_names(&self) -> Vec<String> {
        match self.claims {
            0 => vec![],
            1 => vec![self.name.clone()],
            n => (0..n).map(|i| format!("{}-{i}", self.name)).collect(),
        }
    }
}

fn labels(spec: &PodSpec) -> serde_json::Value {
    json!({ LABEL: "1", "localvol-bench/group": spec.group, "localvol-bench/kind": spec.kind.name() })
}

impl Objects {
    pub fn new(client: &Client) -> Self {
        Self {
            pods: Api::namespaced(client.clone(), NAMESPACE),
            claims: Api::namespaced(client.clone(), NAMESPACE),
            volumes: Api::all(client.clone()),
        }
    }

    /// Creates the pod's claims, then the pod; the scheduler binds them together.
    pub async fn create(&self, spec: &PodSpec) -> Result<(), kube::Error> {
        let pp = PostParams::default();
        let mut volumes = vec![];
        let mut mounts = vec![];
        for (i, claim) in spec.claim_names().iter().enumerate() {
            let class = spec.kind.storage_class().expect("a kind with claims has a class");
            let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
                "metadata": { "name": claim, "labels": labels(spec) },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": class,
                    "resources": { "requests": { "storage": "64Mi" } }
                }
            }))
            .expect("valid claim");
            self.claims.create(&pp, &pvc).await?;
            volumes.push(json!({ "name": format!("v{i}"), "persistentVolumeClaim": { "claimName": claim } }));
            mounts.push(json!({ "name": format!("v{i}"), "mountPath": format!("/data/{i}") }));
        }
        if spec.kind == Kind::Floor {
            volumes.push(json!({ "name": "v0", "emptyDir": {} }));
            mounts.push(json!({ "name": "v0", "mountPath": "/data/0" }));
        }
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": spec.name, "labels": labels(spec) },
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "app",
                    "image": "localhost/busybox:1",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                    "volumeMounts": mounts,
                }],
                "volumes": volumes,
            }
        }))
        .expect("valid pod");
        self.pods.create(&pp, &pod).await?;
        Ok(())
    }

    /// Creates many pods at once, 16 requests in flight (as a controller would).
    pub async fn create_all(&self, specs: Vec<PodSpec>) -> Result<(), String> {
        let gate = Arc::new(Semaphore::new(16));
        let mut tasks = tokio::task::JoinSet::new();
        for spec in specs {
            let (objects, gate) = (self.clone(), gate.clone());
            tasks.spawn(async move {
                let _permit = gate.acquire().await.expect("open semaphore");
                objects
                    .create(&spec)
                    .await
                    .map_err(|e| format!("create {}: {e}", spec.name))
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.map_err(|e| e.to_string())??;
        }
        Ok(())
    }

    /// The PV names of these claims (they are Bound).
    pub async fn volumes_of(&self, claims: &[String]) -> Result<BTreeSet<String>, String> {
        let wanted: BTreeSet<&String> = claims.iter().collect();
        let list = self
            .claims
            .list(&ListParams::default().labels(LABEL))
            .await
            .map_err(|e| e.to_string())?;
        Ok(list
            .items
            .into_iter()
            .filter(|c| c.metadata.name.as_ref().is_some_and(|n| wanted.contains(n)))
            .filter_map(|c| c.spec.and_then(|s| s.volume_name))
            .collect())
    }

    /// Deletes the pods and claims of a group and waits until the pods, and then the
    /// claims' PVs, are gone: the time the driver needs to unmount and delete too.
    /// Returns (pods gone, volumes gone), since `start`.
    pub async fn delete_group(
        &self,
        group: &str,
        volumes: &BTreeSet<String>,
        start: Instant,
        limit: Duration,
    ) -> Result<(Duration, Duration), String> {
        let selector = format!("{LABEL},localvol-bench/group={group}");
        let lp = ListParams::default().labels(&selector);
        let dp = DeleteParams::default();
        self.pods
            .delete_collection(&dp, &lp)
            .await
            .map_err(|e| e.to_string())?;
        self.claims
            .delete_collection(&dp, &lp)
            .await
            .map_err(|e| e.to_string())?;
        let deadline = start + limit;
        let pods_gone = loop {
            if self
                .pods
                .list_metadata(&lp)
                .await
                .map_err(|e| e.to_string())?
                .items
                .is_empty()
            {
                break start.elapsed();
            }
            if Instant::now() > deadline {
                return Err(format!("pods of {group} still there after {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        loop {
            let left = self
                .volumes
                .list_metadata(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter(|pv| pv.metadata.name.as_ref().is_some_and(|n| volumes.contains(n)))
                .count();
            if left == 0 {
                return Ok((pods_gone, start.elapsed()));
            }
            if Instant::now() > deadline {
                return Err(format!("{left} volumes of {group} still there after {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
