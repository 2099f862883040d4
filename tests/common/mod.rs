//! Shared by the integration tests: an in-process daemon on temporary paths and CSI
//! clients connected to its socket.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use localvol::config::{Config, LogFormat, ServeArgs};
use localvol::proto::csi::v1::controller_client::ControllerClient;
use localvol::proto::csi::v1::identity_client::IdentityClient;
use localvol::proto::csi::v1::node_client::NodeClient;
use tokio::sync::oneshot;
use tonic::transport::{Channel, Endpoint, Uri};

/// Privileged tests need root. Without it they fail, loudly, unless the caller opts
/// out with SKIP_PRIVILEGED=1 (then they say so and pass).
pub fn require_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("SKIP_PRIVILEGED").as_deref() == Ok("1") {
        eprintln!("{test}: SKIPPED (not root, SKIP_PRIVILEGED=1)");
        return false;
    }
    panic!("{test} needs root (loop devices, mount); run as root or set SKIP_PRIVILEGED=1");
}

pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Daemon {
    /// Starts `localvol serve` in this process with the default loop class under a
    /// temporary data dir.
    pub async fn start(node_id: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("localvol-test-")
            .tempdir()
            .unwrap();
        Self::start_in(dir, node_id, 1 << 30).await
    }

    pub async fn start_in(dir: tempfile::TempDir, node_id: &str, loop_capacity: u64) -> Self {
        Self::start_with(dir, node_id, loop_capacity, None).await
    }

    /// Starts the daemon with the device classes of the YAML file `config`.
    pub async fn start_with_config(dir: tempfile::TempDir, node_id: &str, config: &Path) -> Self {
        Self::start_with(dir, node_id, 1 << 30, Some(config.to_path_buf())).await
    }

    async fn start_with(
        dir: tempfile::TempDir,
        node_id: &str,
        loop_capacity: u64,
        config_file: Option<PathBuf>,
    ) -> Self {
        let socket = dir.path().join("csi.sock");
        let args = ServeArgs {
            endpoint: format!("unix://{}", socket.display()),
            node_id: Some(node_id.to_string()),
            data_dir: dir.path().join("data"),
            metrics_addr: "127.0.0.1:0".parse().unwrap(),
            config: config_file,
            loop_capacity,
            log_format: LogFormat::Text,
        };
        let config = Config::from_args(&args).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(localvol::app::serve(config, async move {
            let _ = stopped.await;
        }));
        // Opening LVM and PMEM classes runs lvs/vgs/ndctl first: slow in an emulated VM.
        for _ in 0..6000 {
            if socket.exists() || task.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if task.is_finished() && !socket.exists() {
            panic!("daemon did not start: {:?}", task.await);
        }
        assert!(socket.exists(), "daemon did not create its socket");
        Self {
            dir,
            socket,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub async fn channel(&self) -> Channel {
        connect(&self.socket).await
    }

    pub async fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel().await)
    }

    pub async fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel().await)
    }

    pub async fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel().await)
    }

    /// Stops the daemon (as SIGTERM would) and returns its data directory.
    pub async fn stop(mut self) -> tempfile::TempDir {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap().unwrap();
        let dir = tempfile::TempDir::new().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }
}

pub async fn connect(socket: &Path) -> Channel {
    let socket = socket.to_path_buf();
    Endpoint::try_from("http://localvol.invalid")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
        }))
        .await
        .unwrap()
}

/// Mount points under `dir` in this mount namespace.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(dir.to_str().unwrap()))
        .collect()
}

/// Loop devices whose backing file is under `dir`.
pub fn loops_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/sys/block").unwrap().flatten() {
        if let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file"))
            && backing.starts_with(dir.to_str().unwrap())
        {
            found.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    found
}
