//! The real `localvol serve` as a child process, on a test directory: spawned with the
//! paths every test gives it, waited for until its socket listens, killed (alone or with
//! the tools it runs) and restarted. lib.rs has the in-process daemon; this
//! is for what needs a process to kill or to measure.
//!
//! The binary is the caller's to name ([`localvol_bin!`](crate::localvol_bin)): only
//! the root package's tests and benchmarks know where cargo built it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// The daemon binary: `LOCALVOL_BIN` (tests/vm/suite.sh passes a private copy), else
/// `built`, the one cargo built with the calling test ([`localvol_bin!`](crate::localvol_bin)).
pub fn localvol_bin(built: &str) -> PathBuf {
    std::env::var_os("LOCALVOL_BIN").map_or_else(|| PathBuf::from(built), PathBuf::from)
}

/// The daemon binary for a test or benchmark of the root package:
/// [`process::localvol_bin`](crate::process::localvol_bin) with the path cargo gave the
/// caller at build time (`CARGO_BIN_EXE_localvol`, which only those crates see).
#[macro_export]
macro_rules! localvol_bin {
    () => {
        $crate::process::localvol_bin(env!("CARGO_BIN_EXE_localvol"))
    };
}

/// Where the daemon's stdout and stderr go.
pub enum Output {
    Inherit,
    /// Appended to this file (kept across restarts).
    AppendTo(PathBuf),
    /// stdout dropped; stderr written to this file, else inherited.
    StderrTo(Option<PathBuf>),
}

/// How to start the daemon beyond what every start has: `serve` with its CSI socket at
/// `dir/csi.sock`, its data in `dir/data`, kubelet's root at `dir` and metrics on a
/// free port.
pub struct Spawn<'a> {
    /// The binary ([`localvol_bin!`](crate::localvol_bin)).
    pub bin: PathBuf,
    pub dir: &'a Path,
    pub node_id: &'a str,
    pub args: Vec<OsString>,
    pub env: Vec<(&'a str, OsString)>,
    pub output: Output,
    /// Where the daemon logs each external command it runs, when asked to (read back by
    /// [`DaemonProcess::commands_run`]; the caller points the output and `RUST_LOG` there).
    pub command_log: Option<PathBuf>,
    /// In its own process group, so that a kill of the group takes the tools it runs
    /// (lvcreate, mkfs, losetup) with it, as a container's death does.
    pub own_group: bool,
}

impl<'a> Spawn<'a> {
    pub fn new(bin: PathBuf, dir: &'a Path, node_id: &'a str) -> Self {
        Self {
            bin,
            dir,
            node_id,
            args: Vec::new(),
            env: Vec::new(),
            output: Output::Inherit,
            command_log: None,
            own_group: false,
        }
    }

    /// Appends command-line arguments.
    pub fn args<S: Into<OsString>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Standalone, as the crash and fault tests run it: no Kubernetes API, and kubelet
    /// registration left to a sidecar (none).
    pub fn standalone(self) -> Self {
        self.args(["--kube", "off", "--kubelet-registration", "external"])
    }

    pub fn env(mut self, name: &'a str, value: impl Into<OsString>) -> Self {
        self.env.push((name, value.into()));
        self
    }

    pub fn output(mut self, output: Output) -> Self {
        self.output = output;
        self
    }

    pub fn command_log(mut self, path: Option<PathBuf>) -> Self {
        self.command_log = path;
        self
    }

    pub fn own_group(mut self) -> Self {
        self.own_group = true;
        self
    }

    /// Spawns the daemon; it is killed when the returned value is dropped.
    pub fn spawn(self) -> DaemonProcess {
        let socket = self.dir.join("csi.sock");
        let mut command = tokio::process::Command::new(&self.bin);
        command
            .args([
                "serve",
                "--node-id",
                self.node_id,
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .arg("--kubelet-root-dir")
            .arg(self.dir)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true);
        match &self.output {
            Output::Inherit => {}
            Output::AppendTo(path) => {
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .unwrap();
                command.stdout(log.try_clone().unwrap()).stderr(log);
            }
            Output::StderrTo(path) => {
                command.stdout(Stdio::null());
                if let Some(path) = path {
                    command.stderr(std::fs::File::create(path).unwrap());
                }
            }
        }
        if self.own_group {
            command.process_group(0);
        }
        let child = command.spawn().expect("the daemon starts");
        DaemonProcess {
            pid: child.id().unwrap() as i32,
            child: Some(child),
            socket,
            dir: self.dir.to_path_buf(),
            command_log: self.command_log,
            own_group: self.own_group,
        }
    }
}

/// Why the daemon did not come to serve.
#[derive(Debug)]
pub enum StartError {
    Exited(ExitStatus),
    TimedOut(Duration),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exited(status) => write!(f, "the daemon exited during start-up: {status}"),
            Self::TimedOut(limit) => write!(f, "the daemon did not serve within {limit:?}"),
        }
    }
}

/// A running daemon process.
pub struct DaemonProcess {
    child: Option<tokio::process::Child>,
    /// Its pid, and its process group's id when it has its own group.
    pub pid: i32,
    pub socket: PathBuf,
    /// The directory it was started on.
    pub dir: PathBuf,
    command_log: Option<PathBuf>,
    own_group: bool,
}

impl DaemonProcess {
    /// Polls every `poll` until the CSI socket accepts a connection; an exit or `limit`
    /// passing is an error for the caller to report with what it knows (its log).
    pub async fn wait_for_socket(&mut self, limit: Duration, poll: Duration) -> Result<(), StartError> {
        let started = Instant::now();
        loop {
            if tokio::net::UnixStream::connect(&self.socket).await.is_ok() {
                return Ok(());
            }
            self.check_running()?;
            if started.elapsed() > limit {
                return Err(StartError::TimedOut(limit));
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// Like [`Self::wait_for_socket`], then until Probe answers ready (the daemon has
    /// opened its device classes, which runs lvs/vgs/ndctl first).
    pub async fn wait_ready(&mut self, limit: Duration, poll: Duration) -> Result<(), StartError> {
        let started = Instant::now();
        self.wait_for_socket(limit, poll).await?;
        loop {
            if let Ok(channel) = localvol::csi::socket::connect(&self.socket).await {
                let mut identity = localvol::proto::csi::v1::identity_client::IdentityClient::new(channel);
                if let Ok(probe) = identity.probe(localvol::proto::csi::v1::ProbeRequest {}).await
                    && probe.into_inner().ready == Some(true)
                {
                    return Ok(());
                }
            }
            self.check_running()?;
            if started.elapsed() > limit {
                return Err(StartError::TimedOut(limit));
            }
            tokio::time::sleep(poll).await;
        }
    }

    fn check_running(&mut self) -> Result<(), StartError> {
        match self.child.as_mut().expect("running").try_wait().unwrap() {
            Some(status) => Err(StartError::Exited(status)),
            None => Ok(()),
        }
    }

    /// Its resident memory, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap()
    }

    /// The programs the daemon has run so far, in order (needs a command log).
    pub fn commands_run(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.command_log.as_ref().expect("log_commands")).unwrap();
        log.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|event| event["message"] == "running")
            .filter_map(|event| {
                let command = event["command"].as_str()?;
                Some(command.split_whitespace().next()?.to_string())
            })
            .collect()
    }

    /// A channel to its CSI socket.
    pub async fn channel(&self) -> tonic::transport::Channel {
        localvol::csi::socket::connect(&self.socket).await.unwrap()
    }

    /// SIGKILL to the daemon and, if it has its own group, everything it runs; returns
    /// once the daemon is reaped (the group's other members may still be dying).
    pub async fn kill(&mut self) {
        self.signal(Signal::SIGKILL, self.own_group);
        self.reap().await;
    }

    /// SIGKILL to the daemon alone: the tools it was running live on as orphans.
    pub async fn kill_daemon_only(&mut self) {
        self.signal(Signal::SIGKILL, false);
        self.reap().await;
    }

    /// SIGTERM, as kubelet stops a pod; the daemon must exit 0.
    pub async fn terminate(&mut self) {
        self.signal(Signal::SIGTERM, false);
        let status = self.child.take().expect("running").wait().await.unwrap();
        assert!(status.success(), "SIGTERM exits 0: {status}");
    }

    /// Whether it has been killed or stopped already.
    pub fn is_stopped(&self) -> bool {
        self.child.is_none()
    }

    fn signal(&self, signal: Signal, whole_group: bool) {
        let pid = Pid::from_raw(self.pid);
        let _ = if whole_group {
            killpg(pid, signal)
        } else {
            kill(pid, signal)
        };
    }

    async fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.wait().await.unwrap();
        }
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        if self.child.is_some() && self.own_group {
            // kill_on_drop takes the daemon alone; its tools go with the group.
            let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
        }
    }
}
