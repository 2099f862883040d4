//! Kubelet plugin registration, served by localvol itself.
//!
//! kubelet watches its `plugins_registry` directory for sockets. For each one it finds it
//! calls `GetInfo`, checks the answer, registers the driver and dials the CSI endpoint
//! the answer names, then reports the outcome with `NotifyRegistrationStatus`. Serving
//! this here makes the node-driver-registrar sidecar unnecessary; with
//! `--kubelet-registration external` that sidecar does it instead and nothing here runs.
//!
//! A refusal from kubelet is logged and fails `/healthz`, so the liveness probe restarts
//! the container and the restart registers again (node-driver-registrar exits for the
//! same reason). Removing the socket on shutdown tells kubelet the plugin is gone.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::{error, info};

use crate::csi::socket::{self, SocketError};
use crate::health::Health;
use crate::model::DRIVER_NAME;
use crate::proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use crate::proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};

/// The plugin type kubelet's CSI handler accepts.
pub const PLUGIN_TYPE: &str = "CSIPlugin";
/// CSI spec versions offered to kubelet.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// The registration socket's file name: kubelet accepts any name, this is the one
/// node-driver-registrar would use, so switching between the two leaves no stray socket.
pub fn socket_name() -> String {
    format!("{DRIVER_NAME}-reg.sock")
}

/// The registration socket's path in `dir` (kubelet's `plugins_registry`).
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(socket_name())
}

/// Answers kubelet's registration calls.
#[derive(Debug)]
pub struct RegistrationService {
    /// The CSI socket as kubelet sees it (a plain path: kubelet dials it as given).
    csi_endpoint: PathBuf,
    health: Arc<Health>,
}

impl RegistrationService {
    pub fn new(csi_endpoint: PathBuf, health: Arc<Health>) -> Self {
        Self { csi_endpoint, health }
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        info!(endpoint = %self.csi_endpoint.display(), "kubelet asked for plugin info");
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: DRIVER_NAME.to_string(),
            endpoint: self.csi_endpoint.to_string_lossy().into_owned(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            info!("kubelet registered the plugin");
            self.health.set_registration_error(None);
        } else {
            let reason = if status.error.is_empty() {
                "kubelet gave no reason".to_string()
            } else {
                status.error
            };
            error!(error = %reason, "kubelet refused to register the plugin; /healthz now fails");
            self.health.set_registration_error(Some(reason));
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Binds the registration socket (0600) at `path` and returns the future that serves it
/// until `shutdown` resolves, then removes the socket.
pub fn serve(
    path: PathBuf,
    service: RegistrationService,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<impl Future<Output = Result<(), tonic::transport::Error>>, SocketError> {
    let endpoint = service.csi_endpoint.clone();
    let router = tonic::transport::Server::builder().add_service(RegistrationServer::new(service));
    let serving = socket::serve(&path, router, shutdown)?;
    info!(
        socket = %path.display(),
        endpoint = %endpoint.display(),
        "serving kubelet plugin registration"
    );
    Ok(async move {
        let served = serving.await;
        // Gone from plugins_registry, the plugin is deregistered by kubelet.
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            error!(socket = %path.display(), error = %e, "cannot remove the registration socket");
        }
        served
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::backend::{Backend, LoopBackend};
    use crate::host::Host;
    use crate::model::ClassName;
    use crate::proto::pluginregistration::registration_client::RegistrationClient;
    use crate::volume::Volumes;

    fn health(dir: &Path) -> Arc<Health> {
        let class = ClassName::parse("default").unwrap();
        let backend = LoopBackend::new(class.clone(), dir.join("loop"), 1 << 30, Host::system());
        let volumes = Volumes::new(
            vec![Backend::Loop(backend)],
            class,
            BTreeMap::new(),
            Host::system(),
            "node-1".into(),
        );
        Arc::new(Health::new(Arc::new(volumes)))
    }

    /// kubelet's side of the conversation: GetInfo, then NotifyRegistrationStatus.
    #[tokio::test]
    async fn kubelet_registers_the_plugin_over_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let health = health(dir.path());
        let path = socket_path(&dir.path().join("plugins_registry"));
        assert!(path.ends_with("localvol.csi.dev-reg.sock"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = RegistrationService::new("/var/lib/kubelet/plugins/x/csi.sock".into(), health.clone());
        let server = tokio::spawn(
            serve(path.clone(), service, async {
                let _ = stopped.await;
            })
            .unwrap(),
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);

        let channel = socket::connect(&path).await.unwrap();
        let mut kubelet = RegistrationClient::new(channel);
        let info = kubelet.get_info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(
            info,
            PluginInfo {
                r#type: "CSIPlugin".into(),
                name: "localvol.csi.dev".into(),
                endpoint: "/var/lib/kubelet/plugins/x/csi.sock".into(),
                supported_versions: vec!["1.0.0".into()],
            }
        );
        kubelet
            .notify_registration_status(RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(health.liveness(), Ok(()));

        // A refusal fails liveness with kubelet's reason...
        kubelet
            .notify_registration_status(RegistrationStatus {
                plugin_registered: false,
                error: "plugin localvol.csi.dev: unsupported versions [0.9]".into(),
            })
            .await
            .unwrap();
        let failed = health.liveness().unwrap_err();
        assert!(failed.contains("registration failed"), "{failed}");
        assert!(failed.contains("unsupported versions [0.9]"), "{failed}");
        // ...an empty reason still fails it...
        kubelet
            .notify_registration_status(RegistrationStatus {
                plugin_registered: false,
                error: String::new(),
            })
            .await
            .unwrap();
        assert!(health.liveness().unwrap_err().contains("no reason"));
        // ...and a later success clears it.
        kubelet
            .notify_registration_status(RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(health.liveness(), Ok(()));

        drop(kubelet);
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
        assert!(!path.exists(), "the socket is removed on shutdown");
    }

    #[tokio::test]
    async fn a_live_registration_socket_is_not_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let health = health(dir.path());
        let path = socket_path(dir.path());
        let _live = socket::bind_private(&path).unwrap();
        let service = RegistrationService::new("/x/csi.sock".into(), health);
        assert!(matches!(
            serve(path, service, async {}),
            Err(SocketError::Live(_))
        ));
    }
}
