//! Wiring: configuration → backends → services, all served until one shutdown signal.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tracing::info;

use crate::backend::Opener;
use crate::config::Config;
use crate::csi::{self, Driver};
use crate::health::Health;
use crate::host::Host;
use crate::locks::VolumeLocks;
use crate::metrics::{self, Metrics};
use crate::volume::Volumes;

/// Builds one backend per configured device class, preparing what each needs.
pub async fn build_volumes(config: &Config, host: Host) -> anyhow::Result<Volumes> {
    let mut opener = Opener::new(host.clone(), config.data_dir.clone());
    let mut backends = Vec::new();
    let mut default_fs = BTreeMap::new();
    let mut mount_options = BTreeMap::new();
    for class in &config.device_classes {
        if let Some(fs) = class.fs_type {
            default_fs.insert(class.name.clone(), fs);
        }
        mount_options.insert(class.name.clone(), class.mount_options.clone());
        let backend = opener
            .open(class)
            .await
            .with_context(|| format!("preparing device class {}", class.name))?;
        backends.push(backend);
    }
    let mut volumes = Volumes::new(
        backends,
        config.default_class().name.clone(),
        default_fs,
        host,
        config.node_id.clone(),
    );
    volumes.set_class_mount_options(mount_options);
    Ok(volumes)
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler installs");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler installs");
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: draining in-flight calls"),
        _ = int.recv() => info!("SIGINT: draining in-flight calls"),
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
    let driver = Arc::new(Driver {
        volumes: Arc::clone(&volumes),
        locks: VolumeLocks::default(),
        metrics: metrics.clone(),
        health: Arc::clone(&health),
        max_volumes_per_node: 0,
    });

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let http = metrics::serve_http(config.metrics_addr, metrics, health, stopped(stop_rx.clone()))
        .await
        .with_context(|| format!("binding the metrics listener on {}", config.metrics_addr))?;
    let listener = csi::socket::bind_private(&config.socket_path)?;
    let (identity, controller, node) = csi::services(driver);
    let grpc = tonic::transport::Server::builder()
        .add_service(identity)
        .add_service(controller)
        .add_service(node)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stopped(stop_rx));
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
    let (grpc, http) = tokio::join!(grpc, http);
    let _ = std::fs::remove_file(&config.socket_path);
    grpc.context("CSI server")?;
    http.context("metrics server")?;
    info!("stopped");
    Ok(())
}
