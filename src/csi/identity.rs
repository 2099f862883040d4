//! CSI Identity: who the plugin is, what it offers, whether it is ready.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::Driver;
use crate::model::DRIVER_NAME;
use crate::proto::csi::v1::{self as csi, identity_server::Identity, plugin_capability};

#[derive(Debug)]
pub struct IdentityService(pub Arc<Driver>);

fn service(t: plugin_capability::service::Type) -> csi::PluginCapability {
    csi::PluginCapability {
        r#type: Some(plugin_capability::Type::Service(plugin_capability::Service {
            r#type: t as i32,
        })),
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::service::Type;
        let online = plugin_capability::volume_expansion::Type::Online;
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: vec![
                service(Type::ControllerService),
                service(Type::VolumeAccessibilityConstraints),
                csi::PluginCapability {
                    r#type: Some(plugin_capability::Type::VolumeExpansion(
                        plugin_capability::VolumeExpansion {
                            r#type: online as i32,
                        },
                    )),
                },
            ],
        }))
    }

    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        // Not ready is an answer, not an error: the CO keeps asking.
        let ready = self.0.health.readiness().await;
        if let Err(reason) = &ready {
            tracing::info!(%reason, "probe: not ready");
        }
        // CSI's ProbeResponse has no message: the log, /readyz and
        // localvol_device_class_available say which classes lack storage.
        for missing in self.0.health.missing_classes() {
            tracing::debug!(device_class = %missing.class, reason = %missing.reason, "probe: ready, device class not served");
        }
        Ok(Response::new(csi::ProbeResponse {
            ready: Some(ready.is_ok()),
        }))
    }
}
