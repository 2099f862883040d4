//! A gRPC server with nothing of localvol's in it: tonic serving the CSI Identity service
//! on a unix socket, from its own process (the bench run again with `--bare-server
//! <socket>`), on a runtime like the daemon's (2 workers). An empty call to
//! it is what the transport costs; an empty call to localvol adds localvol's own
//! layers (the socket's :authority normaliser, the per-call span and metrics).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use localvol::proto::csi::v1 as csi;
use tonic::{Request, Response, Status};

struct Bare;

#[tonic::async_trait]
impl csi::identity_server::Identity for Bare {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: "bare.bench.localvol.csi.dev".into(),
            vendor_version: "0".into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(Default::default()))
    }

    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(Default::default()))
    }
}

/// The child's whole life: serves on `socket` until killed (on the bench's own runtime,
/// 2 workers as the daemon's).
pub async fn serve(socket: &Path) -> ! {
    let listener = tokio::net::UnixListener::bind(socket).expect("bind the bare server's socket");
    tonic::transport::Server::builder()
        .add_service(csi::identity_server::IdentityServer::new(Bare))
        .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
        .await
        .expect("serve");
    std::process::exit(0)
}

/// The bare server's process; killed when dropped.
pub struct BareServer {
    child: std::process::Child,
    pub socket: PathBuf,
}

impl BareServer {
    pub async fn start(dir: &Path) -> Self {
        let socket = dir.join("bare.sock");
        let child = std::process::Command::new(std::env::current_exe().expect("the bench's path"))
            .arg("--bare-server")
            .arg(&socket)
            .spawn()
            .expect("start the bare server");
        let started = Instant::now();
        while !socket.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the bare server never bound its socket"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Self { child, socket }
    }
}

impl Drop for BareServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `--bare-server <socket>` argument, if this process was started as the server.
pub fn requested() -> Option<PathBuf> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == "--bare-server")?;
    args.get(at + 1).map(PathBuf::from)
}
