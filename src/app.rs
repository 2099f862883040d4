//! Wiring: configuration → backends → services, all served until one shutdown signal.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use anyhow::{Context, bail};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::backend::Opener;
use crate::config::{Config, DeviceClass, RegistrationConfig};
use crate::csi::addons::Addons;
use crate::csi::{self, Driver};
use crate::health::Health;
use crate::host::Host;
use crate::locks::VolumeLocks;
use crate::metrics::{self, Metrics};
use crate::reclaim::scheduler::{NoCluster, Scheduler, SchedulerConfig};
use crate::reclaim::{self, Runner};
use crate::registration::{self, RegistrationService};
use crate::request::KubeletRoots;
use crate::stats;
use crate::status_registry::VolumeStates;
use crate::volume::Volumes;

/// Builds one backend per configured device class, preparing what each needs.
pub async fn build_volumes(config: &Config, host: Host) -> anyhow::Result<Volumes> {
    open_volumes(&config.device_classes, &config.data_dir, &config.node_id, host).await
}

/// One backend per device class. Opening a class checks that its storage is there (the
/// volume group, the region) and makes the loop directory if missing; it changes no
/// volume, so `localvol status` uses it too beside a running daemon.
pub async fn open_volumes(
    classes: &[DeviceClass],
    data_dir: &std::path::Path,
    node_id: &str,
    host: Host,
) -> anyhow::Result<Volumes> {
    let mut opener = Opener::new(host.clone(), data_dir.to_path_buf());
    let mut backends = Vec::new();
    let mut missing = Vec::new();
    let mut default_fs = BTreeMap::new();
    let mut mount_options = BTreeMap::new();
    for class in classes {
        if let Some(fs) = class.fs_type {
            default_fs.insert(class.name.clone(), fs);
        }
        mount_options.insert(class.name.clone(), class.mount_options.clone());
        match opener.open(class).await {
            Ok(backend) => backends.push(backend),
            // One configuration serves nodes with different storage: serve the rest.
            Err(e) if e.is_storage_missing() => {
                warn!(
                    device_class = %class.name,
                    reason = %crate::model::full_message(&e),
                    "device class not served on this node: its storage is missing (looked for again on every stats refresh)"
                );
                missing.push((class.clone(), e));
            }
            Err(e) => return Err(e).with_context(|| format!("preparing device class {}", class.name)),
        }
    }
    let default_class = classes
        .iter()
        .find(|c| c.default)
        .context("no default device class")?
        .name
        .clone();
    let mut volumes = Volumes::new(backends, default_class, default_fs, host, node_id.to_string());
    volumes.set_class_mount_options(mount_options);
    volumes
        .keep_placed_paths_in(data_dir.join("placed"))
        .context("reading the record of staged and published paths")?;
    volumes.add_missing_classes(missing, opener);
    Ok(volumes)
}

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
    let volumes = Arc::new(build_volumes(&config, host).await?);
    let metrics = Metrics::new();
    let health = Arc::new(Health::new(Arc::clone(&volumes)));
    let kube = crate::k8s::connect(&config).await?;
    if let Some(client) = &kube {
        let missing: Vec<_> = volumes
            .missing_classes()
            .into_iter()
            .map(|m| (m.class.to_string(), m.reason))
            .collect();
        if !missing.is_empty() {
            crate::k8s::warn_missing_storage(client.clone(), &config.node_id, missing);
        }
    }
    if config.resize.needs_api() && kube.is_none() {
        bail!(
            "--report-resize-status on and --node-resizer need the Kubernetes API (--kube on or auto with a configuration)"
        );
    }
    let resize = crate::resize::reporting(&config.resize, kube.as_ref(), &config.node_id).await?;
    // One set of labelled claims for the owner check, the node resizer and the reclaim
    // scheduler: each claim is labelled once (see k8s::claim_label), and one watch of
    // them serves the owner check and the reclaim scheduler.
    let claim_labels = kube
        .as_ref()
        .map(|client| crate::k8s::claim_label::ClaimLabels::new(client.clone(), &config.node_id));
    let node_claims = kube
        .as_ref()
        .map(|client| crate::k8s::node_claims::NodeClaims::start(client.clone(), &config.node_id));
    let owner_check = crate::k8s::owner_check(
        kube.clone(),
        &config,
        Arc::clone(&health),
        claim_labels.clone(),
        node_claims.clone(),
    );
    let locks = VolumeLocks::default();
    let states = VolumeStates::new();
    let driver = Arc::new(Driver {
        volumes: Arc::clone(&volumes),
        locks: locks.clone(),
        resize,
        metrics: metrics.clone(),
        health: Arc::clone(&health),
        owner_check,
        max_volumes_per_node: 0,
        states: states.clone(),
        roots: KubeletRoots::new(config.kubelet_root_dirs.clone()),
    });

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    if let (Some(client), Some(labels)) = (kube.clone().filter(|_| config.resize.node_resizer), &claim_labels)
    {
        crate::resize::spawn_node_resizer(
            &config.resize,
            client,
            &config.node_id,
            Arc::clone(&volumes),
            driver.locks.clone(),
            labels.clone(),
            stopped(stop_rx.clone()),
        );
    }
    // Pre-provisioned VolumeSnapshotContents of this node's snapshots get the label its
    // csi-snapshotter (--node-deployment) selects by; without the snapshot CRDs or
    // their RBAC this waits quietly (see k8s::snapshot_content).
    if let Some(client) = &kube {
        crate::k8s::snapshot_content::spawn(
            client.clone(),
            Arc::clone(&volumes),
            &config.node_id,
            stopped(stop_rx.clone()),
        );
    }
    let http = metrics::serve_http(
        config.metrics_addr,
        metrics.clone(),
        Arc::clone(&health),
        stopped(stop_rx.clone()),
    )
    .await
    .with_context(|| format!("binding the metrics listener on {}", config.metrics_addr))?;
    let runner = Runner::new(
        Arc::clone(&volumes),
        locks,
        metrics.clone(),
        config.reclaim.concurrency,
        config.reclaim.timeout,
        states,
        KubeletRoots::new(config.kubelet_root_dirs.clone()),
    );
    let addons = match &config.reclaim.csi_addons_socket {
        Some(path) => {
            let listener = csi::socket::bind_private(path)?;
            let (identity, node) = crate::csi::addons::services(Arc::new(Addons {
                runner: runner.clone(),
                health: Arc::clone(&health),
                metrics: metrics.clone(),
            }));
            info!(endpoint = %path.display(), "serving csi-addons");
            Some(
                tonic::transport::Server::builder()
                    .add_service(identity)
                    .add_service(node)
                    .serve_with_incoming_shutdown(csi::socket::incoming(listener), stopped(stop_rx.clone())),
            )
        }
        None => None,
    };
    let addons = async move {
        match addons {
            Some(server) => server.await,
            None => Ok(()),
        }
    };
    // With Kubernetes, schedules come from annotations and the csi-addons ConfigMap,
    // and results are written back to the claims; without it, from the file alone.
    let cluster: Arc<dyn reclaim::scheduler::Cluster> = match (&kube, claim_labels, node_claims) {
        (Some(client), Some(labels), Some(claims)) => reclaim::k8s::KubeCluster::start(
            client.clone(),
            &config.reclaim.policy.csi_addons_namespace,
            &config.node_id,
            labels,
            claims,
        ),
        _ => Arc::new(NoCluster),
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
        tokio::spawn(scheduler.run(stopped(stop_rx.clone())))
    });
    let listener = csi::socket::bind_private(&config.socket_path)?;
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
            let service = RegistrationService::new(csi_endpoint.clone(), Arc::clone(&health));
            match registration::serve(socket_path.clone(), service, stopped(stop_rx.clone())) {
                Ok(serving) => Some(serving),
                Err(e) => {
                    let _ = std::fs::remove_file(&config.socket_path);
                    return Err(e).context("serving kubelet plugin registration");
                }
            }
        }
        RegistrationConfig::External => None,
    };
    let registration = async move {
        match registration {
            Some(serving) => serving.await,
            None => Ok(()),
        }
    };
    let stats = tokio::spawn(stats::run(
        Arc::clone(&volumes),
        metrics,
        config.stats_interval,
        stopped(stop_rx.clone()),
    ));
    let (identity, controller, node, states) = csi::services(driver);
    let grpc = tonic::transport::Server::builder()
        .add_service(identity)
        .add_service(controller)
        .add_service(node)
        .add_service(states)
        .serve_with_incoming_shutdown(csi::socket::incoming(listener), stopped(stop_rx));
    info!(
        endpoint = %config.socket_path.display(),
        node.id = %config.node_id,
        classes = ?config.device_classes.iter().map(|c| c.name.to_string()).collect::<Vec<_>>(),
        version = env!("CARGO_PKG_VERSION"),
        "serving CSI"
    );
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let (grpc, http, registration, addons) = tokio::join!(grpc, http, registration, addons);
    let _ = std::fs::remove_file(&config.socket_path);
    if let Some(path) = &config.reclaim.csi_addons_socket {
        let _ = std::fs::remove_file(path);
    }
    if let Some(scheduler) = scheduler {
        let _ = scheduler.await;
    }
    grpc.context("CSI server")?;
    http.context("metrics server")?;
    registration.context("kubelet plugin registration server")?;
    stats.await.context("stats refresh task")?;
    addons.context("csi-addons server")?;
    info!("stopped");
    Ok(())
}
