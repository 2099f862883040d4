//! The real-node benchmark (`bench/cluster/run.sh`, which starts the cluster of
//! tests/cluster, deploys localvol and the peer, and runs this): what a user of the
//! driver waits for, against csi-driver-host-path (distributed mode) and a pod with an
//! emptyDir (the floor), measured in one run and reported as ratios.
//!
//! 1. Pod start: one pod with a new volume at a time, interleaved across the three
//!    kinds; each split at the marks the watches see, plus each driver's time per CSI
//!    call from kubelet's metrics and localvol's own.
//! 2. Bursts of 10, 50 and 100 pods: until all Running, until all are gone after
//!    deletion, and the API requests per pod of each driver's pods (audit log).
//! 3. Restart: each driver's pod deleted with no volumes, with the other's 500 on the
//!    node (the peer only), and with 500 of its own staged and published; until the
//!    new one is Ready and has answered NodeGetVolumeStats for every volume; its RSS.
//!
//! Environment: KUBECONFIG, LOCALVOL_BENCH_AUDIT_LOG (the API server's audit log),
//! NODE_NAME (node1). `-- --quick`: 3 rounds, a burst of 10, 20 volumes.
//! Writes target/bench/cluster.json and target/bench/cluster.md.

use localvol_testkit::csi_client;

mod audit;
mod clock;
mod metrics;
mod objects;
mod report;
mod restart;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use kube::Client;

use clock::{Clock, Mark};
use objects::{Kind, Objects, PodSpec};
use report::{Burst, CallTimes, Report, Start, StartSummary, ms};

const LOCALVOL_USER: &str = "system:serviceaccount:localvol-system:localvol-node";
const PEER_USER: &str = "system:serviceaccount:localvol-bench-peer:hostpath-peer";
const LOCALVOL_DRIVER: &str = "localvol.csi.dev";
const PEER_DRIVER: &str = "hostpath.csi.k8s.io";

struct Plan {
    rounds: usize,
    bursts: Vec<usize>,
    restart_pods: usize,
    volumes_per_pod: usize,
}

struct Bench {
    client: Client,
    objects: Objects,
    clock: Arc<Clock>,
    audit_log: PathBuf,
    node: String,
}

fn user_of(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::Floor => None,
        Kind::Localvol => Some(LOCALVOL_USER),
        Kind::Peer => Some(PEER_USER),
    }
}

impl Bench {
    async fn one_start(&self, kind: Kind, round: usize) -> Result<Start, String> {
        let spec = PodSpec::one(format!("start-{}-{round}", kind.name()), kind, "start");
        let name = spec.name.clone();
        let t0 = Instant::now();
        self.objects.create(&spec).await.map_err(|e| e.to_string())?;
        self.clock
            .all(
                Mark::PodRunning,
                std::slice::from_ref(&name),
                Duration::from_secs(120),
            )
            .await?;
        self.split(&name, kind, t0)
    }

    /// A started pod's time from `t0`, split at the marks seen.
    fn split(&self, name: &str, kind: Kind, t0: Instant) -> Result<Start, String> {
        let name = name.to_string();
        let running = self.clock.get(Mark::PodRunning, &name).ok_or("not Running")?;
        let bound = self.clock.get(Mark::PodBound, &name).unwrap_or(running);
        let since = |a: Instant, b: Instant| ms(a.saturating_duration_since(b));
        let mut start = Start {
            total: since(running, t0),
            node: since(running, bound),
            ..Default::default()
        };
        match (
            self.clock.get(Mark::ClaimSelected, &name),
            self.clock.get(Mark::ClaimBound, &name),
        ) {
            (Some(selected), Some(claim_bound)) => {
                start.first_pass = since(selected, t0);
                start.provision = since(claim_bound, selected);
                start.bind_wait = since(bound, claim_bound);
            }
            _ if kind == Kind::Floor => start.first_pass = since(bound, t0),
            _ => return Err(format!("{name}: Running without its claim's marks")),
        }
        Ok(start)
    }

    async fn call_times(&self) -> Result<[metrics::Histograms; 3], String> {
        let daemon = restart::daemon_pod(&self.client).await?;
        Ok([
            metrics::kubelet(&self.client, &self.node, LOCALVOL_DRIVER).await?,
            metrics::kubelet(&self.client, &self.node, PEER_DRIVER).await?,
            metrics::localvol(&self.client, restart::SYSTEM_NAMESPACE, &daemon).await?,
        ])
    }

    async fn pod_starts(&self, rounds: usize, report: &mut Report) -> Result<(), String> {
        let before = self.call_times().await?;
        let mut samples: Vec<Vec<Start>> = vec![vec![]; Kind::ALL.len()];
        for round in 0..rounds {
            // Interleaved, and each kind first in turn.
            for i in 0..Kind::ALL.len() {
                let k = (i + round) % Kind::ALL.len();
                samples[k].push(self.one_start(Kind::ALL[k], round).await?);
            }
        }
        let after = self.call_times().await?;
        for (k, kind) in Kind::ALL.iter().enumerate() {
            report
                .starts
                .push(StartSummary::new(kind.name(), std::mem::take(&mut samples[k])));
        }
        for (kind, kubelet) in [(Kind::Localvol, 0), (Kind::Peer, 1)] {
            let mut calls = CallTimes {
                kubelet_stage: after[kubelet].mean_ms_since(&before[kubelet], "NodeStageVolume"),
                kubelet_publish: after[kubelet].mean_ms_since(&before[kubelet], "NodePublishVolume"),
                ..Default::default()
            };
            if kind == Kind::Localvol {
                calls.own_create = after[2].mean_ms_since(&before[2], "CreateVolume");
                calls.own_stage = after[2].mean_ms_since(&before[2], "NodeStageVolume");
                calls.own_publish = after[2].mean_ms_since(&before[2], "NodePublishVolume");
            }
            report.calls.push((kind.name(), calls));
        }
        let volumes = self.objects.volumes_of(&start_claims(rounds)).await?;
        self.objects
            .delete_group("start", &volumes, Instant::now(), Duration::from_secs(600))
            .await?;
        Ok(())
    }

    async fn burst(&self, pods: usize, kind: Kind) -> Result<Burst, String> {
        let group = format!("burst{pods}-{}", kind.name());
        let specs: Vec<PodSpec> = (0..pods)
            .map(|i| PodSpec::one(format!("b{pods}-{}-{i}", kind.name()), kind, &group))
            .collect();
        let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
        let (wall0, t0) = (SystemTime::now(), Instant::now());
        self.objects.create_all(specs).await?;
        let running = self
            .clock
            .all(Mark::PodRunning, &names, Duration::from_secs(900))
            .await?;
        let wall1 = SystemTime::now();
        let splits = names
            .iter()
            .map(|n| self.split(n, kind, t0))
            .collect::<Result<Vec<_>, _>>()?;
        let volumes = if kind == Kind::Floor {
            Default::default()
        } else {
            self.objects.volumes_of(&names).await?
        };
        let t1 = Instant::now();
        let (pods_gone, all_gone) = self
            .objects
            .delete_group(&group, &volumes, t1, Duration::from_secs(900))
            .await?;
        let wall2 = SystemTime::now();
        let mut out = Burst {
            pods,
            kind: kind.name(),
            all_running_ms: ms(running - t0),
            pods_gone_ms: ms(pods_gone),
            all_gone_ms: ms(all_gone),
            phases_p50: StartSummary::new(kind.name(), splits).without_samples(),
            ..Default::default()
        };
        if let Some(user) = user_of(kind) {
            // The API server writes its audit batches every second.
            tokio::time::sleep(Duration::from_millis(2500)).await;
            let starts = audit::requests(&self.audit_log, user, wall0, wall1).map_err(|e| e.to_string())?;
            let deletes = audit::requests(&self.audit_log, user, wall1, wall2).map_err(|e| e.to_string())?;
            if starts.total == 0 {
                return Err(format!(
                    "no audit record of {user} while its {pods} volumes were provisioned"
                ));
            }
            out.requests_per_start = starts.total as f64 / pods as f64;
            out.requests_per_delete = deletes.total as f64 / pods as f64;
            out.start_requests = Some(starts);
            out.delete_requests = Some(deletes);
        }
        Ok(out)
    }

    async fn restarts(&self, plan: &Plan, report: &mut Report) -> Result<(), String> {
        let limit = Duration::from_secs(300);
        report
            .restarts
            .push(restart::restart(&self.client, &restart::LOCALVOL, vec![], limit).await?);
        report
            .restarts
            .push(restart::restart(&self.client, &restart::PEER, vec![], limit).await?);
        let (published, claims) = self.restart_volumes(plan, Kind::Localvol, report).await?;
        report
            .restarts
            .push(restart::restart(&self.client, &restart::LOCALVOL, published, limit).await?);
        // The peer on the same node, with localvol's volumes still mounted: what any node
        // plugin's pod pays to start there.
        let mut peer = restart::restart(&self.client, &restart::PEER, vec![], limit).await?;
        peer.node_volumes = claims.len();
        report.restarts.push(peer);
        self.delete_restart_volumes(Kind::Localvol, &claims).await?;
        // And with as many volumes of its own: the restart like for like.
        let (published, claims) = self.restart_volumes(plan, Kind::Peer, report).await?;
        report
            .restarts
            .push(restart::restart(&self.client, &restart::PEER, published, limit).await?);
        self.delete_restart_volumes(Kind::Peer, &claims).await
    }

    /// The restart's pods of one driver, running: their published volumes and claims.
    async fn restart_volumes(
        &self,
        plan: &Plan,
        kind: Kind,
        report: &mut Report,
    ) -> Result<(Vec<restart::Published>, Vec<String>), String> {
        let specs: Vec<PodSpec> = (0..plan.restart_pods)
            .map(|i| PodSpec {
                name: format!("r-{}-{i}", kind.name()),
                kind,
                group: format!("restart-{}", kind.name()),
                claims: plan.volumes_per_pod,
            })
            .collect();
        let claims: Vec<String> = specs.iter().flat_map(PodSpec::claim_names).collect();
        let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
        let t0 = Instant::now();
        self.objects.create_all(specs).await?;
        let running = self
            .clock
            .all(Mark::PodRunning, &names, Duration::from_secs(1800))
            .await?;
        if kind == Kind::Localvol {
            report.setup_500_ms = Some(ms(running - t0));
        }
        Ok((self.published(&names).await?, claims))
    }

    async fn delete_restart_volumes(&self, kind: Kind, claims: &[String]) -> Result<(), String> {
        let volumes = self.objects.volumes_of(claims).await?;
        let group = format!("restart-{}", kind.name());
        self.objects
            .delete_group(&group, &volumes, Instant::now(), Duration::from_secs(1800))
            .await
            .map(drop)
    }

    /// The volume id and target path of every volume of these pods.
    async fn published(&self, pods: &[String]) -> Result<Vec<restart::Published>, String> {
        let mut out = vec![];
        for name in pods {
            let pod = self.objects.pods.get(name).await.map_err(|e| e.to_string())?;
            let uid = pod.metadata.uid.unwrap_or_default();
            for volume in pod.spec.and_then(|s| s.volumes).unwrap_or_default() {
                let Some(claim) = volume.persistent_volume_claim else {
                    continue;
                };
                let pvc = self
                    .objects
                    .claims
                    .get(&claim.claim_name)
                    .await
                    .map_err(|e| e.to_string())?;
                let pv_name = pvc
                    .spec
                    .and_then(|s| s.volume_name)
                    .ok_or("claim without volume")?;
                let pv = self
                    .objects
                    .volumes
                    .get(&pv_name)
                    .await
                    .map_err(|e| e.to_string())?;
                let handle = pv
                    .spec
                    .and_then(|s| s.csi)
                    .map(|c| c.volume_handle)
                    .ok_or("PV without CSI handle")?;
                out.push(restart::Published {
                    volume_id: handle,
                    target: PathBuf::from(format!(
                        "/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/{pv_name}/mount"
                    )),
                });
            }
        }
        Ok(out)
    }
}

fn start_claims(rounds: usize) -> Vec<String> {
    (0..rounds)
        .flat_map(|r| [Kind::Localvol, Kind::Peer].map(|k| format!("start-{}-{r}", k.name())))
        .collect()
}

#[tokio::main]
async fn main() {
    audit::self_check();
    metrics::self_check();
    let quick = std::env::args().any(|a| a == "--quick");
    let plan = if quick {
        Plan {
            rounds: 3,
            bursts: vec![10],
            restart_pods: 2,
            volumes_per_pod: 10,
        }
    } else {
        Plan {
            rounds: 30,
            bursts: vec![10, 50, 100],
            restart_pods: 10,
            volumes_per_pod: 50,
        }
    };
    let audit_log = PathBuf::from(
        std::env::var("LOCALVOL_BENCH_AUDIT_LOG")
            .expect("LOCALVOL_BENCH_AUDIT_LOG: the API server's audit log"),
    );
    let client = Client::try_default().await.expect("a kubeconfig (KUBECONFIG)");
    let clock = Arc::new(Clock::default());
    clock.watch(&client, objects::NAMESPACE, objects::LABEL);
    let bench = Bench {
        objects: Objects::new(&client),
        client,
        clock,
        audit_log,
        node: std::env::var("NODE_NAME").unwrap_or_else(|_| "node1".into()),
    };
    let mut report = Report {
        rounds: plan.rounds,
        ..Default::default()
    };
    let result = run(&bench, &plan, &mut report).await;
    let md = report.markdown();
    println!("{md}");
    std::fs::create_dir_all("target/bench").expect("target/bench");
    std::fs::write(
        "target/bench/cluster.json",
        serde_json::to_string_pretty(&report).expect("json"),
    )
    .expect("write json");
    std::fs::write("target/bench/cluster.md", md).expect("write md");
    if let Err(e) = result {
        eprintln!("cluster bench: {e}");
        std::process::exit(1);
    }
}

async fn run(bench: &Bench, plan: &Plan, report: &mut Report) -> Result<(), String> {
    let phase = |what: &str| eprintln!("cluster bench: {what} ({})", humantime());
    phase("pod starts");
    bench.pod_starts(plan.rounds, report).await?;
    for (b, &pods) in plan.bursts.iter().enumerate() {
        // Each kind first in turn: what a burst leaves behind (containers and pod
        // directories still going away) falls on a different kind each time.
        for i in 0..Kind::ALL.len() {
            let kind = Kind::ALL[(i + b) % Kind::ALL.len()];
            phase(&format!("burst of {pods} {}", kind.name()));
            report.bursts.push(bench.burst(pods, kind).await?);
        }
    }
    phase("restarts");
    bench.restarts(plan, report).await?;
    phase("done");
    Ok(())
}

fn humantime() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    )
}
