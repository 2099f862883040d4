//! What localvol's tests and benchmarks share, as one crate they `use` instead of
//! including files with `#[path]`: the one CSI client (csi_client.rs), the daemon as a
//! child process (process.rs) and the in-process one ([`InProcessDaemon`], below), the
//! tests/vm guest's storage set-up (guest.rs), the crash kit (crash.rs), the hostile
//! node cases and their sandbox (hostile/), the limits cases (limits.rs), what the
//! benchmarks measure with (bench.rs) and the outside programs the manifest tests
//! render with (tools.rs).
//!
//! The daemon binary cargo built is known only to the tests and benchmarks of the root
//! package: they name it with [`localvol_bin!`].

pub mod bench;
pub mod crash;
pub mod csi_client;
pub mod fill;
pub mod guest;
pub mod hostile;
pub mod limits;
pub mod plan;
pub mod process;
pub mod tools;

pub use csi_client::{CsiClient, create_request, mount_capability};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use localvol::cli::{Cli, Command};
use localvol::proto::csi::v1 as csi;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// True when the privileged part (loop devices, mkfs, mount) can run. Not being root
/// fails the test unless SKIP_PRIVILEGED=1 says skipping is intended.
pub fn privileged() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("SKIP_PRIVILEGED").as_deref() == Ok("1") {
        eprintln!("SKIP_PRIVILEGED=1: skipping the stage/publish part (needs root)");
        return false;
    }
    panic!(
        "this test stages and publishes a loop volume and must run as root; \
         set SKIP_PRIVILEGED=1 to run only its unprivileged part"
    );
}

/// Whether this process may grow ext4 online (CAP_SYS_RESOURCE, bit 24 of CapEff).
pub fn has_cap_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim();
    u64::from_str_radix(hex, 16).unwrap() & (1 << 24) != 0
}

/// A free port on 127.0.0.1 (bound, then released for the daemon to take).
fn free_local_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// `localvol serve` run in this process (a task on the test's runtime), on temporary
/// paths; [`process::DaemonProcess`] is the daemon as a child process.
pub struct InProcessDaemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub registration_socket: PathBuf,
    /// The csi-addons socket (Identity, ReclaimSpaceNode).
    pub addons_socket: PathBuf,
    pub metrics_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl InProcessDaemon {
    /// Starts `localvol serve` in this process, configured as the command line would
    /// be (standalone: `--kube off`), and waits until its CSI socket answers.
    pub async fn start(extra_args: &[&str]) -> Self {
        Self::start_as("test-node", extra_args).await
    }

    /// Like [`InProcessDaemon::start`], as node `node_id`. `--kube on` in `extra_args` replaces
    /// the standalone default (and wants $KUBECONFIG).
    pub async fn start_as(node_id: &str, extra_args: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("localvol-test-")
            .tempdir()
            .unwrap();
        Self::launch(dir, node_id, extra_args).await
    }

    /// Like [`InProcessDaemon::start`], on an existing directory: a restart after [`InProcessDaemon::stop`].
    pub async fn start_in(dir: tempfile::TempDir, extra_args: &[&str]) -> Self {
        Self::launch(dir, "test-node", extra_args).await
    }

    /// Starts the daemon as node `node_id` with the device classes of the YAML file
    /// `config`.
    pub async fn start_with_config(dir: tempfile::TempDir, node_id: &str, config: &Path) -> Self {
        Self::launch(dir, node_id, &["--config", config.to_str().unwrap()]).await
    }

    async fn launch(dir: tempfile::TempDir, node_id: &str, extra_args: &[&str]) -> Self {
        let socket = dir.path().join("csi/csi.sock");
        let addons_socket = dir.path().join("csi/csi-addons.sock");
        let addons_endpoint = format!("unix://{}", addons_socket.display());
        let registry = dir.path().join("plugins_registry");
        // As kubelet would have made it: registration only happens where it exists.
        std::fs::create_dir_all(&registry).unwrap();
        let data = dir.path().join("data");
        let metrics_addr = free_local_addr();
        let endpoint = format!("unix://{}", socket.display());
        let metrics = metrics_addr.to_string();
        let mut argv = vec![
            "localvol",
            "serve",
            "--node-id",
            node_id,
            "--endpoint",
            &endpoint,
            "--data-dir",
            data.to_str().unwrap(),
            "--registration-dir",
            registry.to_str().unwrap(),
            "--metrics-addr",
            &metrics,
            "--loop-capacity",
            "2Gi",
            "--stats-interval",
            "1s",
            "--csi-addons-endpoint",
            &addons_endpoint,
        ];
        // Node calls are confined to kubelet's root: the tests' kubelet paths are all in
        // the daemon's directory, unless a test names its own root.
        let root = dir.path().to_str().unwrap().to_string();
        if !extra_args.contains(&"--kubelet-root-dir") {
            argv.extend_from_slice(&["--kubelet-root-dir", &root]);
        }
        if !extra_args.contains(&"--kube") {
            argv.extend_from_slice(&["--kube", "off"]);
        }
        argv.extend_from_slice(extra_args);
        let Command::Serve(args) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!("parsed as serve")
        };
        let config = args.config().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(localvol::app::serve(config, async {
            let _ = stopped.await;
        }));
        // Opening LVM and PMEM classes runs lvs/vgs/ndctl first: slow in an emulated VM.
        for _ in 0..6000 {
            if tokio::net::UnixStream::connect(&socket).await.is_ok() || task.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        if task.is_finished() {
            panic!("the daemon exited during start-up: {:?}", task.await);
        }
        assert!(socket.exists(), "daemon did not create its socket");
        // Builtin registration binds its socket just after the CSI socket: a loaded
        // host showed a test the daemon in between (tests/metrics_scrape.rs, 1 run in
        // 4). Wait for it too, for at most 5s; a test asserting it still fails if it
        // never comes.
        let registration_socket = registry.join("localvol.csi.dev-reg.sock");
        let external = extra_args
            .windows(2)
            .any(|w| w == ["--kubelet-registration", "external"]);
        for _ in 0..200 {
            if external || registration_socket.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Self {
            registration_socket,
            addons_socket,
            dir,
            socket,
            metrics_addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A path inside the daemon's temporary directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub async fn node(&self) -> csi::node_client::NodeClient<Channel> {
        csi::node_client::NodeClient::new(self.channel().await)
    }

    pub async fn controller(&self) -> csi::controller_client::ControllerClient<Channel> {
        csi::controller_client::ControllerClient::new(self.channel().await)
    }

    pub async fn identity(&self) -> csi::identity_client::IdentityClient<Channel> {
        csi::identity_client::IdentityClient::new(self.channel().await)
    }

    /// The one test client (csi_client.rs) on the CSI socket.
    pub async fn client(&self) -> CsiClient {
        CsiClient::new(self.channel().await)
    }

    pub async fn channel(&self) -> Channel {
        connect(&self.socket).await
    }

    /// GET over plain HTTP/1.1; returns the status code and the body.
    pub async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.metrics_addr, path).await.unwrap()
    }

    /// Scrapes /metrics until `line` appears (the stats task refreshes every second).
    pub async fn wait_for_metric(&self, line: &str) -> String {
        let mut text = String::new();
        for _ in 0..50 {
            text = self.get("/metrics").await.1;
            if text.lines().any(|l| l == line) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{line:?} did not appear in /metrics within 5s:\n{text}");
    }

    /// The status `localvol_volume_health` gives volume `id` now (`healthy` or
    /// `abnormal`: what its last NodeGetVolumeStats found), `None` before any.
    pub async fn volume_health(&self, id: &str) -> Option<String> {
        let text = self.get("/metrics").await.1;
        let volume = format!("volume_id=\"{id}\"");
        text.lines()
            .filter(|l| l.starts_with("localvol_volume_health{") && l.contains(&volume))
            .filter(|l| l.ends_with("} 1"))
            .find_map(|l| {
                let status = l.split("status=\"").nth(1)?;
                Some(status.split('"').next()?.to_string())
            })
    }

    /// Stops the daemon as SIGTERM would, waits for it to finish, and hands back its
    /// directory (for a restart with [`InProcessDaemon::start_in`]).
    pub async fn stop(mut self) -> tempfile::TempDir {
        self.stop.take().unwrap().send(()).unwrap();
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("the daemon stops within 20s")
            .unwrap()
            .unwrap();
        self.dir
    }
}

/// kubelet's staging and publish paths for a volume, below `root`.
/// GET `path` from `addr` over plain HTTP/1.1 (the daemon's metrics and health
/// listener); the status code and the body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let not_http = || std::io::Error::other(format!("not an HTTP response: {response:?}"));
        let (head, body) = response.split_once("\r\n\r\n").ok_or_else(not_http)?;
        let code = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(not_http)?;
        Ok((code, body.to_string()))
    })
    .await?
}

pub fn kubelet_paths(root: &Path, pv: &str, pod_uid: &str) -> (PathBuf, PathBuf) {
    (
        root.join(format!(
            "plugins/kubernetes.io/csi/localvol.csi.dev/{pv}/globalmount"
        )),
        root.join(format!("pods/{pod_uid}/volumes/kubernetes.io~csi/{pv}/mount")),
    )
}

/// Unmounts what a failed test may have left mounted below `root` and detaches loop
/// devices backed by files below `data`, so a failure does not leak into the host.
pub struct Cleanup {
    pub mounts: Vec<PathBuf>,
    pub data: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for path in self.mounts.iter().rev() {
            while nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH).is_ok() {}
        }
        let Ok(entries) = std::fs::read_dir("/sys/block") else {
            return;
        };
        for entry in entries.flatten() {
            let backing = std::fs::read_to_string(entry.path().join("loop/backing_file")).unwrap_or_default();
            if Path::new(backing.trim()).starts_with(&self.data) {
                let device = Path::new("/dev").join(entry.file_name());
                let _ = std::process::Command::new("losetup")
                    .arg("-d")
                    .arg(device)
                    .status();
            }
        }
    }
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

/// Nothing left attached: no mount under `dir`, no loop device on a file under `data`.
/// `when` says after what, for the failure message.
pub fn assert_released(dir: &Path, data: &Path, when: &str) {
    let mounts = mounts_under(dir);
    assert!(mounts.is_empty(), "{when}: still mounted: {mounts:?}");
    let loops = loops_under(data);
    assert!(loops.is_empty(), "{when}: loop devices still attached: {loops:?}");
}

/// A client channel to a unix socket.
pub async fn connect(socket: &Path) -> Channel {
    localvol::csi::socket::connect(socket).await.unwrap()
}
