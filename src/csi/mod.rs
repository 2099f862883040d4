//! The CSI gRPC services on a unix socket. Handlers here only translate: request
//! conversion, the volume lock, one volume operation, the response. Errors are logged
//! once, here, and counted by method and code.

pub mod addons;
pub mod authority;
mod controller;
mod identity;
mod node;
pub mod socket;
pub mod volume_states;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::{Response, Status};
use tracing::{Instrument, info, info_span, warn};

use crate::error::Error;
use crate::health::Health;
use crate::k8s::OwnerCheck;
use crate::locks::{VolumeGuard, VolumeLocks};
use crate::metrics::Metrics;
use crate::model::Token;
use crate::proto::csi::v1::controller_server::ControllerServer;
use crate::proto::csi::v1::identity_server::IdentityServer;
use crate::proto::csi::v1::node_server::NodeServer;
use crate::proto::localvol::v1::volume_states_server::VolumeStatesServer;
use crate::request::KubeletRoots;
use crate::volume::Volumes;
use crate::volume_states::VolumeStates;

/// Shared state of the CSI services.
#[derive(Debug)]
pub struct Driver {
    pub volumes: Arc<Volumes>,
    pub locks: VolumeLocks,
    /// Resize status around NodeExpandVolume (`--report-resize-status`; off: kubelet's).
    pub resize: crate::resize::NodeReporting,
    pub metrics: Metrics,
    pub health: Arc<Health>,
    /// Generic ephemeral volume owner check before stage and publish (off: standalone).
    pub owner_check: OwnerCheck,
    /// Upper bound kubelet is told for volumes on this node (0: no limit).
    pub max_volumes_per_node: i64,
    /// What `localvol status` shows beyond the backends: pods, last reclaim, resize.
    pub volume_states: VolumeStates,
    /// Where node calls may stage and publish (`--kubelet-root-dir`).
    pub roots: KubeletRoots,
}

/// A call that takes longer is logged with its time, whatever its outcome: on a
/// node, where pods wait on stage and publish, it is the first thing to look for.
/// (`RUST_LOG=localvol::host=debug` adds each syscall, command and record write.)
const SLOW_CALL: Duration = Duration::from_millis(200);

impl Driver {
    fn lock(&self, token: &Token, method: &'static str) -> Result<VolumeGuard, Error> {
        Ok(self.locks.try_lock(token, method)?)
    }

    /// [`observe`](Self::observe) for a call that owns its driver and runs on one
    /// thread ([`on_one_thread`](crate::host::blocking::on_one_thread)).
    async fn observe_on_one_thread<T, Call>(
        self: &Arc<Self>,
        method: &'static str,
        volume: String,
        call: impl FnOnce(Arc<Self>) -> Call,
    ) -> Result<Response<T>, Status>
    where
        T: Send + 'static,
        Call: Future<Output = Result<T, Error>> + Send + 'static,
    {
        let call = crate::host::blocking::on_one_thread(call(self.clone()));
        self.observe(method, &volume, call).await
    }

    /// Runs one RPC: a span with the method and volume, metrics by code, and the error
    /// logged once and turned into a status.
    async fn observe<T>(
        &self,
        method: &'static str,
        volume: &str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<Response<T>, Status> {
        let started = Instant::now();
        let span = info_span!("rpc", rpc.method = method, volume.id = volume);
        let result = call.instrument(span.clone()).await;
        let took = started.elapsed();
        if took >= SLOW_CALL {
            span.in_scope(|| {
                info!(
                    elapsed_ms = took.as_millis() as u64,
                    ok = result.is_ok(),
                    "slow call"
                )
            });
        }
        match result {
            Ok(reply) => {
                self.metrics
                    .observe_rpc(method, &code_label(tonic::Code::Ok), started);
                Ok(Response::new(reply))
            }
            Err(error) => {
                let status = Status::from(error);
                span.in_scope(|| warn!(code = ?status.code(), error = status.message(), "call failed"));
                self.metrics
                    .observe_rpc(method, &code_label(status.code()), started);
                Err(status)
            }
        }
    }
}

/// The tonic services for the driver, ready to add to a server: the three CSI ones
/// and localvol's own read-only VolumeStates (for `localvol status`).
pub fn services(
    driver: Arc<Driver>,
) -> (
    IdentityServer<identity::IdentityService>,
    ControllerServer<controller::ControllerService>,
    NodeServer<node::NodeService>,
    VolumeStatesServer<volume_states::StatesService>,
) {
    (
        IdentityServer::new(identity::IdentityService(Arc::clone(&driver))),
        ControllerServer::new(controller::ControllerService(Arc::clone(&driver))),
        NodeServer::new(node::NodeService(Arc::clone(&driver))),
        VolumeStatesServer::new(volume_states::StatesService(driver)),
    )
}

/// The answer CSI requires for a call whose capability localvol does not advertise.
/// A status code as the RPC metrics label it (`Ok`, `InvalidArgument`, ...): the edge
/// names it, so the metrics below never see a gRPC type.
fn code_label(code: tonic::Code) -> String {
    format!("{code:?}")
}

fn not_supported(method: &str, why: &str) -> Status {
    Status::new(
        tonic::Code::Unimplemented,
        format!("{method} is not supported by localvol: {why}"),
    )
}
