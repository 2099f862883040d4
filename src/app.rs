//! Wiring: configuration → backends → services, all served until one shutdown signal.
//!
//! Start-up is a list of steps: open the storage ([`Volumes::open`]), connect to
//! Kubernetes, build the CSI driver and the reclaim runner, bind and serve the sockets,
//! start the background work; then everything runs until one `Stop`.

use std::future::Future;
use std::sync::Arc;

use anyhow::{Context, bail};
use kube::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Server;
use tracing::info;

use crate::config::{Config, RegistrationConfig};
use crate::csi::addons::Addons;
use crate::csi::{self, Driver};
use crate::gauges;
use crate::health::Health;
use crate::host::Host;
use crate::k8s::OwnerCheck;
use crate::k8s::claim_label::ClaimLabels;
use crate::k8s::node_claims::NodeClaims;
use crate::locks::VolumeLocks;
use crate::metrics::{self, Metrics};
use crate::reclaim::scheduler::{NoCluster, Scheduler, SchedulerConfig};
use crate::reclaim::{self, Runner};
use crate::registration::{self, RegistrationService};
use crate::request::KubeletRoots;
use crate::resize::NodeReporting;
use crate::volume::Volumes;
use crate::volume_states::VolumeStates;

/// The volume limit kubelet is told for this node: 0 is CSI's "unset", no limit. Local
/// volumes are bounded by the node's capacity, which the device classes report, not by
/// a count.
const MAX_VOLUMES_PER_NODE: i64 = 0;

/// Installs the SIGTERM and SIGINT handlers now, so that a signal arriving any time
/// after this call drains the daemon instead of killing it; the future resolves on the
/// first of them. Call it inside the runtime, before binding anything.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler installs");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler installs");
    async move {
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: draining in-flight calls"),
            _ = int.recv() => info!("SIGINT: draining in-flight calls"),
        }
    }
}

/// Serves until `shutdown` resolves, then lets in-flight calls finish and returns.
pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let host = Host::system();
    let mut volumes = Volumes::open(&config.device_classes, &config.data_dir, &config.node_id, host).await?;
    volumes
        .keep_placed_paths_in(config.data_dir.join("placed"))
        .context("reading the record of staged and published paths")?;
    let volumes = Arc::new(volumes);
    let metrics = Metrics::new();
    let health = Arc::new(Health::new(Arc::clone(&volumes)));
    let Kubernetes {
        api,
        resize,
        owner_check,
    } = connect_kubernetes(&config, &volumes, &health).await?;
    // CSI calls and reclaim runs take the same volume locks, record in the same volume
    // states and stay below the same kubelet roots.
    let locks = VolumeLocks::default();
    let states = VolumeStates::new();
    let roots = KubeletRoots::new(config.kubelet_root_dirs.clone());
    let runner = Runner::new(
        Arc::clone(&volumes),
        locks.clone(),
        metrics.clone(),
        config.reclaim.concurrency,
        config.reclaim.timeout,
        states.clone(),
        roots.clone(),
    );
    let driver = Arc::new(Driver {
        volumes: Arc::clone(&volumes),
        locks: locks.clone(),
        resize,
        metrics: metrics.clone(),
        health,
        owner_check,
        max_volumes_per_node: MAX_VOLUMES_PER_NODE,
        volume_states: states,
        roots,
    });
    let stop = Stop::new();
    // Background work starts once every socket is bound: a daemon that cannot bind one
    // (another localvol serving) starts none of it.
    let servers = serve_sockets(&config, driver, runner.clone(), &stop).await?;
    let background = start_background(&config, api, volumes, locks, metrics, runner, &stop);
    stop.raise_on(shutdown);
    // Every server drains and its socket goes, then the scheduler ends (abandoning runs
    // in flight); the first error is reported in this order.
    let served = servers.await;
    if let Some(scheduler) = background.scheduler {
        let _ = scheduler.await;
    }
    served.csi.context("CSI server")?;
    served.http.context("metrics server")?;
    served
        .registration
        .context("kubelet plugin registration server")?;
    background.stats.await.context("stats refresh task")?;
    served.addons.context("csi-addons server")?;
    info!("stopped");
    Ok(())
}

/// The daemon's one stop signal, which every server and background task waits on. It is
/// raised when the shutdown future resolves, or by dropping the handle: an error return
/// from `serve` stops whatever it had started.
struct Stop(watch::Sender<bool>);

impl Stop {
    fn new() -> Self {
        Self(watch::Sender::new(false))
    }

    /// Resolves once the stop is raised or its handle dropped.
    fn signal(&self) -> impl Future<Output = ()> + Send + use<> {
        let mut stopped = self.0.subscribe();
        async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }
    }

    /// Raises the stop when `shutdown` resolves.
    fn raise_on(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        tokio::spawn(async move {
            shutdown.await;
            self.0.send_replace(true);
        });
    }
}

/// The Kubernetes API, when the daemon has one, and the claim views built on it.
struct Api {
    client: Client,
    /// One set of labelled claims for the owner check, the node resizer and the reclaim
    /// scheduler: each claim is labelled once (see k8s::claim_label), and one watch of
    /// them (`node_claims`) serves the owner check and the reclaim scheduler.
    claim_labels: ClaimLabels,
    node_claims: NodeClaims,
}

/// What start-up takes from Kubernetes: the API, and what the CSI driver needs of it
/// (both off without the API).
struct Kubernetes {
    api: Option<Api>,
    resize: NodeReporting,
    owner_check: OwnerCheck,
}

/// Connects to the API as `--kube` says, reports the device classes whose storage is
/// missing, and refuses resize options that need the API when there is none.
async fn connect_kubernetes(
    config: &Config,
    volumes: &Volumes,
    health: &Arc<Health>,
) -> anyhow::Result<Kubernetes> {
    let client = crate::k8s::connect(config).await?;
    if let Some(client) = &client {
        let missing: Vec<_> = volumes
            .missing_classes()
            .into_iter()
            .map(|m| (m.class.to_string(), m.reason))
            .collect();
        if !missing.is_empty() {
            crate::k8s::warn_missing_storage(client.clone(), &config.node_id, missing);
        }
    }
    if config.resize.needs_api() && client.is_none() {
        bail!(
            "--report-resize-status on and --node-resizer need the Kubernetes API (--kube on or auto with a configuration)"
        );
    }
    let resize = crate::resize::reporting(&config.resize, client.as_ref(), &config.node_id).await?;
    let api = client.map(|client| Api {
        claim_labels: ClaimLabels::new(client.clone(), &config.node_id),
        node_claims: NodeClaims::start(client.clone(), &config.node_id),
        client,
    });
    let owner_check = crate::k8s::owner_check(
        api.as_ref().map(|api| api.client.clone()),
        config,
        Arc::clone(health),
        api.as_ref().map(|api| api.claim_labels.clone()),
        api.as_ref().map(|api| api.node_claims.clone()),
    );
    Ok(Kubernetes {
        api,
        resize,
        owner_check,
    })
}

/// How each server ended.
struct Served {
    csi: Result<(), tonic::transport::Error>,
    http: std::io::Result<()>,
    registration: Result<(), tonic::transport::Error>,
    addons: Result<(), tonic::transport::Error>,
}

/// Binds the daemon's sockets, in this order: metrics and health over HTTP, csi-addons
/// (when configured), CSI, kubelet plugin registration. Nothing is served until the
/// returned future is awaited; it serves until the stop, then removes the socket files.
async fn serve_sockets(
    config: &Config,
    driver: Arc<Driver>,
    runner: Runner,
    stop: &Stop,
) -> anyhow::Result<impl Future<Output = Served> + use<>> {
    let http = metrics::serve_http(
        config.metrics_addr,
        driver.metrics.clone(),
        Arc::clone(&driver.health),
        stop.signal(),
    )
    .await
    .with_context(|| format!("binding the metrics listener on {}", config.metrics_addr))?;
    let addons = match &config.reclaim.csi_addons_socket {
        Some(path) => {
            let (identity, node) = csi::addons::services(Arc::new(Addons {
                runner,
                health: Arc::clone(&driver.health),
                metrics: driver.metrics.clone(),
            }));
            let router = Server::builder().add_service(identity).add_service(node);
            let serving = csi::socket::serve(path, router, stop.signal())?;
            info!(endpoint = %path.display(), "serving csi-addons");
            Some(serving)
        }
        None => None,
    };
    let health = Arc::clone(&driver.health);
    let (identity, controller, node, states) = csi::services(driver);
    let router = Server::builder()
        .add_service(identity)
        .add_service(controller)
        .add_service(node)
        .add_service(states);
    let grpc = csi::socket::serve(&config.socket_path, router, stop.signal())?;
    // After the CSI socket exists: kubelet dials it as soon as registration succeeds.
    let registration = match &config.registration {
        // kubelet creates its registry directory; without it there is no kubelet to
        // register with, and localvol does not create kubelet's directories for it.
        RegistrationConfig::Builtin { socket_path, .. }
            if !socket_path.parent().is_some_and(std::path::Path::is_dir) =>
        {
            tracing::warn!(
                socket = %socket_path.display(),
                "no kubelet plugin registry directory: not registering with kubelet"
            );
            None
        }
        RegistrationConfig::Builtin {
            socket_path,
            csi_endpoint,
        } => {
            let service = RegistrationService::new(csi_endpoint.clone(), health);
            match registration::serve(socket_path.clone(), service, stop.signal()) {
                Ok(serving) => Some(serving),
                Err(e) => {
                    let _ = std::fs::remove_file(&config.socket_path);
                    return Err(e).context("serving kubelet plugin registration");
                }
            }
        }
        RegistrationConfig::External => None,
    };
    info!(
        endpoint = %config.socket_path.display(),
        node.id = %config.node_id,
        classes = ?config.device_classes.iter().map(|c| c.name.to_string()).collect::<Vec<_>>(),
        version = env!("CARGO_PKG_VERSION"),
        "serving CSI"
    );
    let csi_socket = config.socket_path.clone();
    let addons_socket = config.reclaim.csi_addons_socket.clone();
    Ok(async move {
        let registration = async move {
            match registration {
                Some(serving) => serving.await,
                None => Ok(()),
            }
        };
        let addons = async move {
            match addons {
                Some(server) => server.await,
                None => Ok(()),
            }
        };
        let (csi, http, registration, addons) = tokio::join!(grpc, http, registration, addons);
        // The registration socket removes itself (see registration::serve).
        let _ = std::fs::remove_file(&csi_socket);
        if let Some(path) = &addons_socket {
            let _ = std::fs::remove_file(path);
        }
        Served {
            csi,
            http,
            registration,
            addons,
        }
    })
}

/// What runs beside the servers until the stop.
struct Background {
    stats: JoinHandle<()>,
    /// The reclaim scheduler, when schedules are enabled.
    scheduler: Option<JoinHandle<()>>,
}

/// Starts the node resizer and the snapshot-content labeller (with the API), the reclaim
/// scheduler (when enabled) and the stats refresh, each until the stop.
fn start_background(
    config: &Config,
    api: Option<Api>,
    volumes: Arc<Volumes>,
    locks: VolumeLocks,
    metrics: Metrics,
    runner: Runner,
    stop: &Stop,
) -> Background {
    // With the API, each change of a class's storage health is an event on the Node.
    let changes = api.as_ref().map(|api| {
        Arc::new(crate::k8s::StorageHealthEvents::new(
            api.client.clone(),
            &config.node_id,
        )) as Arc<dyn gauges::HealthChanges>
    });
    if let Some(api) = api.as_ref().filter(|_| config.resize.node_resizer) {
        crate::resize::spawn_node_resizer(
            &config.resize,
            api.client.clone(),
            &config.node_id,
            Arc::clone(&volumes),
            locks,
            api.claim_labels.clone(),
            stop.signal(),
        );
    }
    // Pre-provisioned VolumeSnapshotContents of this node's snapshots get the label its
    // csi-snapshotter (--node-deployment) selects by; without the snapshot CRDs or
    // their RBAC this waits quietly (see k8s::snapshot_content).
    if let Some(api) = &api {
        crate::k8s::snapshot_content::spawn(
            api.client.clone(),
            Arc::clone(&volumes),
            &config.node_id,
            stop.signal(),
        );
    }
    // With Kubernetes, schedules come from annotations and the csi-addons ConfigMap,
    // and results are written back to the claims; without it, from the file alone.
    let cluster: Arc<dyn reclaim::scheduler::Cluster> = match api {
        Some(api) => reclaim::k8s::KubeCluster::start(
            api.client,
            &config.reclaim.policy.csi_addons_namespace,
            &config.node_id,
            api.claim_labels,
            api.node_claims,
        ),
        None => Arc::new(NoCluster),
    };
    let scheduler = config.reclaim.policy.enabled.then(|| {
        let scheduler = Scheduler::new(
            runner,
            cluster,
            SchedulerConfig {
                policy: config.reclaim.policy.clone(),
                busy_retry: std::time::Duration::from_secs(60),
                rescan: std::time::Duration::from_secs(60),
            },
        );
        tokio::spawn(scheduler.run(stop.signal()))
    });
    let stats = tokio::spawn(gauges::run(
        volumes,
        metrics,
        changes,
        config.stats_interval,
        stop.signal(),
    ));
    Background { stats, scheduler }
}
