//! End to end against a real API server: localvol runs in-process (`--kube=on`, loop
//! backend, a temp dir) and the test drives it over its socket the way kubelet would,
//! with Pod, PVC and PV objects created in a fresh namespace.
//!
//! Ignored by a plain `cargo test` (which reports it as ignored): the cluster suite runs
//! it with `--ignored` against its API server (`tests/cluster`, scenario s10_e2e_k8s),
//! and without KUBECONFIG it fails. It needs root (loop devices, mkfs, mount). Pods are bound to a node name of the test's own
//! (`E2E_NODE_NAME`, default `localvol-e2e-node`), so no kubelet acts on them.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Container, EphemeralVolumeSource, Namespace, ObjectReference,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimTemplate,
    PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, Pod, PodSpec, Volume,
    VolumeResourceRequirements,
};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use localvol::proto::csi::v1 as csi;
use localvol_testkit::csi_client::{publish_request, stage_request};
use localvol_testkit::{CsiClient, InProcessDaemon, create_request, mount_capability};
use tonic::Code;

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const STORAGE_CLASS: &str = "localvol-e2e-unprovisioned";

fn say(line: &str) {
    // Straight to stderr, past the test harness's capture, so CI logs show it.
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real API server: tests/cluster/run.sh runs it (scenario s10_e2e_k8s)"]
async fn e2e_k8s() {
    assert!(
        std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty()),
        "e2e_k8s: KUBECONFIG must name a real API server (tests/cluster/run.sh sets it)"
    );
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "e2e_k8s: KUBECONFIG is set but this test needs root (loop devices, mkfs, mount)"
    );
    let node = std::env::var("E2E_NODE_NAME").unwrap_or_else(|_| "localvol-e2e-node".to_string());
    let client = Client::try_default().await.expect("a client from KUBECONFIG");
    let namespace = format!(
        "localvol-e2e-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 100_000
    );
    // The cluster's kubelet serves the DaemonSet's localvol: this one never registers.
    let daemon =
        InProcessDaemon::start_as(&node, &["--kube", "on", "--kubelet-registration", "external"]).await;

    let mut cluster = Cluster {
        client: client.clone(),
        namespace: namespace.clone(),
        node,
        pvs: Vec::new(),
    };
    let result = run(&mut cluster, &daemon).await;
    let cleanup = cluster.cleanup().await;
    let dir = daemon.dir.path().to_path_buf();
    // In a task of its own: a daemon that does not stop is reported after the run.
    let stopped = tokio::spawn(daemon.stop()).await;
    // A failed case leaves its volume staged: the mounts and loop devices of the temp
    // dir go before the failure is reported.
    drop(localvol_testkit::Cleanup {
        mounts: localvol_testkit::mounts_under(&dir)
            .into_iter()
            .map(PathBuf::from)
            .collect(),
        data: dir,
    });
    result.expect("e2e_k8s");
    cleanup.expect("cleanup");
    stopped.expect("daemon stops");
    say("e2e_k8s: PASSED against a real API server");
}

struct Cluster {
    client: Client,
    namespace: String,
    node: String,
    pvs: Vec<String>,
}

impl Cluster {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// A pod bound to the test's node; `ephemeral` volumes and `claims` volumes.
    async fn pod(&self, name: &str, ephemeral: &[&str], claims: &[&str]) -> TestResult<Pod> {
        let template = PersistentVolumeClaimTemplate {
            metadata: None,
            spec: claim_spec(),
        };
        let volumes = ephemeral
            .iter()
            .map(|v| Volume {
                name: v.to_string(),
                ephemeral: Some(EphemeralVolumeSource {
                    volume_claim_template: Some(template.clone()),
                }),
                ..Volume::default()
            })
            .chain(claims.iter().enumerate().map(|(i, c)| Volume {
                name: format!("claim{i}"),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: c.to_string(),
                    read_only: None,
                }),
                ..Volume::default()
            }))
            .collect();
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(self.node.clone()),
                containers: vec![Container {
                    name: "app".to_string(),
                    image: Some("registry.k8s.io/pause:3.10".to_string()),
                    ..Container::default()
                }],
                volumes: Some(volumes),
                ..PodSpec::default()
            }),
            status: None,
        };
        Ok(self.pods().create(&PostParams::default(), &pod).await?)
    }

    /// A claim, owned by `owner` if given. If the cluster's ephemeral volume controller
    /// made it first (for an owned claim), that one is used.
    async fn pvc(&self, name: &str, owner: Option<&Pod>) -> TestResult<PersistentVolumeClaim> {
        let pvc = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                owner_references: owner.map(|p| {
                    vec![OwnerReference {
                        api_version: "v1".to_string(),
                        kind: "Pod".to_string(),
                        name: p.metadata.name.clone().unwrap(),
                        uid: p.metadata.uid.clone().unwrap(),
                        controller: Some(true),
                        block_owner_deletion: Some(true),
                    }]
                }),
                ..ObjectMeta::default()
            },
            spec: Some(claim_spec()),
            status: None,
        };
        match self.pvcs().create(&PostParams::default(), &pvc).await {
            Ok(created) => Ok(created),
            Err(kube::Error::Api(s)) if s.code == 409 && owner.is_some() => Ok(self.pvcs().get(name).await?),
            Err(e) => Err(e.into()),
        }
    }

    /// The PV kubelet would read the volume context from.
    async fn pv(&mut self, name: &str, volume: &csi::Volume, claim: &PersistentVolumeClaim) -> TestResult {
        let pv = PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(vec!["ReadWriteOnce".to_string()]),
                capacity: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity("64Mi".to_string()),
                )])),
                csi: Some(CSIPersistentVolumeSource {
                    driver: "localvol.csi.dev".to_string(),
                    volume_handle: volume.volume_id.clone(),
                    volume_attributes: Some(volume.volume_context.clone().into_iter().collect()),
                    ..CSIPersistentVolumeSource::default()
                }),
                claim_ref: Some(ObjectReference {
                    api_version: Some("v1".to_string()),
                    kind: Some("PersistentVolumeClaim".to_string()),
                    namespace: claim.metadata.namespace.clone(),
                    name: claim.metadata.name.clone(),
                    uid: claim.metadata.uid.clone(),
                    ..ObjectReference::default()
                }),
                persistent_volume_reclaim_policy: Some("Retain".to_string()),
                storage_class_name: Some(STORAGE_CLASS.to_string()),
                ..PersistentVolumeSpec::default()
            }),
            status: None,
        };
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        api.create(&PostParams::default(), &pv).await?;
        self.pvs.push(name.to_string());
        Ok(())
    }

    async fn cleanup(&self) -> TestResult {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let mut failed = Vec::new();
        for pv in &self.pvs {
            if let Err(e) = pvs.delete(pv, &DeleteParams::default()).await {
                failed.push(format!("PV {pv}: {e}"));
            }
        }
        if let Err(e) = namespaces.delete(&self.namespace, &DeleteParams::default()).await {
            failed.push(format!("namespace {}: {e}", self.namespace));
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; ").into())
        }
    }
}

fn claim_spec() -> PersistentVolumeClaimSpec {
    PersistentVolumeClaimSpec {
        access_modes: Some(vec!["ReadWriteOnce".to_string()]),
        storage_class_name: Some(STORAGE_CLASS.to_string()),
        resources: Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([(
                "storage".to_string(),
                Quantity("64Mi".to_string()),
            )])),
            ..VolumeResourceRequirements::default()
        }),
        ..PersistentVolumeClaimSpec::default()
    }
}

/// What external-provisioner and kubelet send, over the one test client; kubelet's paths
/// are below `dir`.
struct Kubelet {
    csi: CsiClient,
    dir: PathBuf,
}

impl Kubelet {
    async fn create(
        &self,
        namespace: &str,
        pvc: &PersistentVolumeClaim,
        pv: &str,
    ) -> Result<csi::Volume, tonic::Status> {
        let uid = pvc.metadata.uid.clone().unwrap();
        let claim = pvc.metadata.name.clone().unwrap();
        let mut request = create_request(&format!("pvc-{uid}"), 64 << 20, (namespace, &claim));
        request
            .parameters
            .insert("csi.storage.k8s.io/pv/name".to_string(), pv.to_string());
        self.csi.create(request).await
    }

    fn staging(&self, volume: &csi::Volume) -> PathBuf {
        self.dir.join("staging").join(volume.volume_id.replace('/', "_"))
    }

    async fn stage(
        &self,
        volume: &csi::Volume,
        context: HashMap<String, String>,
    ) -> Result<(), tonic::Status> {
        let staging = self.staging(volume);
        std::fs::create_dir_all(&staging).unwrap();
        let request = csi::NodeStageVolumeRequest {
            volume_context: context,
            ..stage_request(&volume.volume_id, &staging, &mount_capability())
        };
        self.csi.node().node_stage_volume(request).await.map(drop)
    }

    /// Publish as kubelet does for `pod`: the PV's attributes plus the pod's identity.
    async fn publish(&self, volume: &csi::Volume, pod: &Pod) -> Result<PathBuf, tonic::Status> {
        let uid = pod.metadata.uid.clone().unwrap();
        let target = self.dir.join("pods").join(&uid).join("mount");
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let mut context = volume.volume_context.clone();
        context.insert(
            "csi.storage.k8s.io/pod.name".into(),
            pod.metadata.name.clone().unwrap(),
        );
        context.insert(
            "csi.storage.k8s.io/pod.namespace".into(),
            pod.metadata.namespace.clone().unwrap(),
        );
        context.insert("csi.storage.k8s.io/pod.uid".into(), uid);
        context.insert("csi.storage.k8s.io/ephemeral".into(), "false".into());
        let request = csi::NodePublishVolumeRequest {
            volume_context: context,
            ..publish_request(
                &volume.volume_id,
                &self.staging(volume),
                &target,
                &mount_capability(),
            )
        };
        self.csi.node().node_publish_volume(request).await.map(|_| target)
    }

    async fn teardown(&self, volume: &csi::Volume, targets: &[PathBuf]) -> TestResult {
        for target in targets {
            self.csi.unpublish(&volume.volume_id, target).await?;
        }
        self.csi.unstage(&volume.volume_id, &self.staging(volume)).await?;
        self.csi.delete(&volume.volume_id).await?;
        Ok(())
    }
}

/// FAILED_PRECONDITION whose message names `pvc` and contains each of `also`.
fn expect_refused(
    result: Result<impl std::fmt::Debug, tonic::Status>,
    pvc: &str,
    also: &[&str],
) -> TestResult {
    let status = match result {
        Ok(v) => return Err(format!("expected a refusal for {pvc}, got {v:?}").into()),
        Err(status) => status,
    };
    if status.code() != Code::FailedPrecondition
        || !status.message().contains(pvc)
        || also.iter().any(|a| !status.message().contains(a))
    {
        return Err(format!("expected FAILED_PRECONDITION naming {pvc} and {also:?}, got {status:?}").into());
    }
    Ok(())
}

async fn run(cluster: &mut Cluster, daemon: &InProcessDaemon) -> TestResult {
    let ns = cluster.namespace.clone();
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.clone()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces.create(&PostParams::default(), &namespace).await?;

    let kubelet = Kubelet {
        csi: daemon.client().await,
        dir: daemon.path("kubelet"),
    };
    // Ready means the node's pod cache has synced.
    let mut ready = false;
    for _ in 0..300 {
        let probe = kubelet
            .csi
            .identity()
            .probe(csi::ProbeRequest {})
            .await?
            .into_inner();
        if probe.ready == Some(true) {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !ready {
        return Err("localvol never became ready (pod cache not synced?)".into());
    }

    // 1. A generic ephemeral volume owned by its pod: staged and published.
    let web = cluster.pod("web", &["data"], &[]).await?;
    let web_data = cluster.pvc("web-data", Some(&web)).await?;
    let pv_name = format!("{ns}-web-data");
    let volume = kubelet.create(&ns, &web_data, &pv_name).await?;
    cluster.pv(&pv_name, &volume, &web_data).await?;
    // The pod may not be in the node's cache yet: the check asks the API on a miss.
    kubelet.stage(&volume, volume.volume_context.clone()).await?;
    // Without the claim keys, the claim is found through the PV.
    let pv_only = HashMap::from([("csi.storage.k8s.io/pv/name".to_string(), pv_name.clone())]);
    kubelet.stage(&volume, pv_only).await?;
    let web_target = kubelet.publish(&volume, &web).await?;

    // 2. The same claim, named by another pod's persistentVolumeClaim volume: a claim
    //    controlled by a pod is never published to any other pod.
    let reader = cluster.pod("reader", &[], &["web-data"]).await?;
    let web_uid = web.metadata.uid.clone().unwrap();
    expect_refused(
        kubelet.publish(&volume, &reader).await,
        &format!("{ns}/web-data"),
        &["found Pod", &web_uid],
    )?;
    kubelet.teardown(&volume, &[web_target]).await?;

    // 3. A same-named claim made before the pod, with no owner: staged (a normal claim
    //    as far as staging goes) but refused at publish, with events on pod and claim.
    let planted = cluster.pvc("victim-data", None).await?;
    let victim = cluster.pod("victim", &["data"], &[]).await?;
    let pv_name = format!("{ns}-victim-data");
    let volume = kubelet.create(&ns, &planted, &pv_name).await?;
    cluster.pv(&pv_name, &volume, &planted).await?;
    kubelet.stage(&volume, volume.volume_context.clone()).await?;
    expect_refused(
        kubelet.publish(&volume, &victim).await,
        &format!("{ns}/victim-data"),
        &["found no controlling owner"],
    )?;
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), &ns);
    let mismatch: Vec<_> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ClaimOwnerMismatch"))
        .filter_map(|e| e.regarding.and_then(|r| r.name))
        .collect();
    for object in ["victim", "victim-data", "reader", "web-data"] {
        if !mismatch.iter().any(|n| n == object) {
            return Err(format!("no ClaimOwnerMismatch event regarding {object}: {mismatch:?}").into());
        }
    }
    kubelet.teardown(&volume, &[]).await?;

    // 4. The owner recreated under the same name (new UID): the old claim is refused.
    let stale = cluster.pvc("ghost-data", None).await?;
    let pvcs = cluster.pvcs();
    let old = cluster.pod("ghost", &["data"], &[]).await?;
    let mut owned = stale.clone();
    owned.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".to_string(),
        kind: "Pod".to_string(),
        name: "ghost".to_string(),
        uid: old.metadata.uid.clone().unwrap(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let owned = pvcs.replace("ghost-data", &PostParams::default(), &owned).await?;
    cluster
        .pods()
        .delete("ghost", &DeleteParams::default().grace_period(0))
        .await?;
    let mut recreated = None;
    for _ in 0..100 {
        match cluster.pod("ghost", &["data"], &[]).await {
            Ok(p) => {
                recreated = Some(p);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let recreated = recreated.ok_or("could not recreate pod ghost")?;
    let old_uid = old.metadata.uid.clone().unwrap();
    let new_uid = recreated.metadata.uid.clone().unwrap();
    let pv_name = format!("{ns}-ghost-data");
    let volume = kubelet.create(&ns, &owned, &pv_name).await?;
    cluster.pv(&pv_name, &volume, &owned).await?;
    // The stage check allows from the daemon's pod cache, which may not have seen the
    // old pod go yet (milliseconds behind the API server; publish, which names its pod,
    // still refuses the new one then). Once it has, the stage is refused: a stage that
    // went through is undone and asked again, for at most 5 s.
    let mut staged = kubelet.stage(&volume, volume.volume_context.clone()).await;
    for _ in 0..25 {
        if staged.is_err() {
            break;
        }
        kubelet
            .csi
            .unstage(&volume.volume_id, &kubelet.staging(&volume))
            .await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        staged = kubelet.stage(&volume, volume.volume_context.clone()).await;
    }
    // Refused for one of two reasons, both right: the old claim is still there, owned by
    // the old pod; or, as soon as kube-controller-manager runs, the garbage collector
    // has deleted it (its owner is gone) and the ephemeral volume controller makes a
    // new ghost-data for the new pod, which is not this volume's claim.
    let owner_replaced = expect_refused(
        staged.clone(),
        &format!("{ns}/ghost-data"),
        &[
            &format!("expected owner Pod {ns}/ghost (uid {old_uid})"),
            &format!("found Pod {ns}/ghost (uid {new_uid})"),
        ],
    );
    let claim_replaced = expect_refused(
        staged,
        &format!("{ns}/ghost-data"),
        &[&format!(
            "PersistentVolume {pv_name} is bound to {ns}/ghost-data with another uid"
        )],
    );
    owner_replaced.or(claim_replaced)?;
    kubelet.csi.delete(&volume.volume_id).await?;
    Ok(())
}
