//! What both benchmarks share: the release daemon as its own process, one volume's
//! lifecycle through its socket timed per step, the tools run directly, and
//! percentiles.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags};
use tonic::transport::Channel;

use crate::csi_client::{CsiClient, NewVolume, mount_capability};
use crate::process::{DaemonProcess, Output, Spawn};

pub const MIB: i64 = 1 << 20;
pub const VOLUME_BYTES: i64 = 64 * MIB;

/// How to start the daemon beyond its socket and data directory.
#[derive(Default)]
pub struct Launch<'a> {
    pub args: &'a [&'a str],
    /// For `--kube on`.
    pub kubeconfig: Option<&'a Path>,
    /// Log every external command the daemon runs (debug level of its runner).
    pub log_commands: bool,
}

/// Starts the release daemon `bin` as its own process (process.rs) on `dir`; returns it
/// and the time until its socket accepted a connection.
pub async fn start_daemon(bin: PathBuf, dir: &Path, launch: Launch<'_>) -> (DaemonProcess, Duration) {
    std::fs::create_dir_all(dir).unwrap();
    let command_log = launch.log_commands.then(|| dir.join("commands.log"));
    let output = Output::StderrTo(command_log.clone());
    let started = Instant::now();
    let mut process = Spawn::new(bin, dir, "bench")
        .args(launch.args.iter().copied())
        .env(
            "RUST_LOG",
            if launch.log_commands {
                "warn,localvol::host::command=debug"
            } else {
                "warn"
            },
        )
        .env("LOCALVOL_LOG_FORMAT", "json")
        .env(
            "KUBECONFIG",
            launch.kubeconfig.unwrap_or(Path::new("/nonexistent")),
        )
        .output(output)
        .command_log(command_log)
        .spawn();
    if let Err(e) = process
        .wait_for_socket(Duration::from_secs(60), Duration::from_micros(200))
        .await
    {
        panic!("{e}");
    }
    let elapsed = started.elapsed();
    (process, elapsed)
}

/// Programs counted by name: `{"lvcreate": 1, "mkfs.ext4": 1}`.
pub fn tally(programs: &[String]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for p in programs {
        *counts.entry(p.clone()).or_default() += 1;
    }
    counts
}

/// `losetup×2 mkfs.ext4`: the programs and how often each ran.
pub fn tally_line(programs: &[String]) -> String {
    tally(programs)
        .iter()
        .map(|(p, n)| if *n == 1 { p.clone() } else { format!("{p}×{n}") })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The six steps of a lifecycle, in order: what each costs tells where the time goes.
pub const STEPS: [&str; 6] = ["create", "stage", "publish", "unpublish", "unstage", "delete"];

/// Times the steps of one lifecycle.
pub struct StepClock {
    last: Instant,
    pub steps: [Duration; 6],
    next: usize,
}

impl StepClock {
    pub fn start() -> Self {
        Self {
            last: Instant::now(),
            steps: [Duration::ZERO; 6],
            next: 0,
        }
    }

    pub fn lap(&mut self) {
        let now = Instant::now();
        self.steps[self.next] = now - self.last;
        self.last = now;
        self.next += 1;
    }
}

/// The CSI calls of a lifecycle, each of which must succeed: the shared test client
/// (csi_client.rs) in the benchmarks' words, ext4 volumes only.
pub struct Csi(CsiClient);

impl Csi {
    pub fn new(channel: Channel) -> Self {
        Self(CsiClient::new(channel))
    }

    /// Creates an ext4 volume of `bytes` in `class` (the default class if `None`);
    /// returns its id.
    pub async fn create(&mut self, name: &str, bytes: i64, class: Option<&str>) -> String {
        self.0
            .create_id(
                NewVolume {
                    class,
                    ..NewVolume::new(name, bytes)
                }
                .request(),
            )
            .await
    }

    pub async fn stage(&mut self, id: &str, stage: &Path) {
        self.0.stage(id, stage, &mount_capability()).await.unwrap();
    }

    pub async fn publish(&mut self, id: &str, stage: &Path, target: &Path) {
        self.0
            .publish(id, stage, target, &mount_capability())
            .await
            .unwrap();
    }

    pub async fn unpublish(&mut self, id: &str, target: &Path) {
        self.0.unpublish(id, target).await.unwrap();
    }

    pub async fn unstage(&mut self, id: &str, stage: &Path) {
        self.0.unstage(id, stage).await.unwrap();
    }

    pub async fn delete(&mut self, id: &str) {
        self.0.delete(id).await.unwrap();
    }

    pub async fn stats(&mut self, id: &str, path: &Path) {
        self.0.stats(id, path).await.unwrap();
    }

    /// A call that does no work: one round trip of the transport.
    pub async fn nothing(&mut self) {
        self.0.node_capabilities().await.unwrap();
    }

    /// GetCapacity of the default class (what external-provisioner polls).
    pub async fn capacity(&mut self) {
        self.0.capacity(None).await.unwrap();
    }

    /// GetCapacity of `class`.
    pub async fn capacity_of(&mut self, class: &str) {
        self.0.capacity(Some(class)).await.unwrap();
    }

    pub async fn list(&mut self) {
        self.0.list().await.unwrap();
    }
}

/// One full lifecycle through the socket, as external-provisioner and kubelet drive it,
/// in the device class `class` (the default class if `None`); returns each step's time.
pub async fn lifecycle(channel: Channel, base: &Path, name: &str, class: Option<&str>) -> [Duration; 6] {
    let mut csi = Csi::new(channel);
    let stage = base.join(format!("{name}-stage"));
    let target = base.join(format!("{name}-target"));
    std::fs::create_dir_all(&stage).unwrap();
    let mut clock = StepClock::start();
    let id = csi.create(name, VOLUME_BYTES, class).await;
    clock.lap();
    csi.stage(&id, &stage).await;
    clock.lap();
    csi.publish(&id, &stage, &target).await;
    clock.lap();
    csi.unpublish(&id, &target).await;
    clock.lap();
    csi.unstage(&id, &stage).await;
    clock.lap();
    csi.delete(&id).await;
    clock.lap();
    std::fs::remove_dir(&stage).unwrap();
    clock.steps
}

/// Writes `report` to `target/bench/<file>` and says so.
pub fn write_report(file: &str, report: serde_json::Map<String, serde_json::Value>) {
    // The root package's target/, two folders above this crate's.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .parent()
        .unwrap();
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join(file), serde_json::to_vec_pretty(&report).unwrap()).unwrap();
    println!("\nwritten: target/bench/{file}");
}

/// The raw tools a benchmark's baseline runs, in order, by program name: the other side
/// of `DaemonProcess::commands_run`.
#[derive(Default)]
pub struct RawTools {
    pub programs: Vec<String>,
}

impl RawTools {
    /// Runs `program` as [`run`] does, and records it.
    pub async fn run(&mut self, program: &'static str, args: &[&str]) -> String {
        self.programs.push(program.to_string());
        run(program, args).await
    }
}

/// Runs a tool directly; it must succeed; returns stdout.
pub async fn run(program: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new(program)
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The mounts of a raw lifecycle, lapped as the CSI calls split the work: `device`
/// mounted on `stage` (ending the stage step), bound to `target` (publish), unbound
/// (unpublish), and `stage` unmounted (the caller ends the unstage step).
pub async fn raw_mounts(
    clock: &mut StepClock,
    device: &str,
    stage: &Path,
    target: &Path,
    data: Option<&'static str>,
) {
    let (s, d) = (stage.to_path_buf(), PathBuf::from(device));
    blocking(move || nix::mount::mount(Some(&d), &s, Some("ext4"), MsFlags::empty(), data)).await;
    clock.lap();
    let (s, t) = (stage.to_path_buf(), target.to_path_buf());
    blocking(move || {
        std::fs::create_dir(&t).unwrap();
        nix::mount::mount(Some(&s), &t, None::<&str>, MsFlags::MS_BIND, None::<&str>)
    })
    .await;
    clock.lap();
    let t = target.to_path_buf();
    blocking(move || {
        nix::mount::umount2(&t, MntFlags::empty())?;
        std::fs::remove_dir(&t).unwrap();
        Ok(())
    })
    .await;
    clock.lap();
    let s = stage.to_path_buf();
    blocking(move || nix::mount::umount2(&s, MntFlags::empty())).await;
}

/// Runs a syscall off the async threads, as the daemon does.
pub async fn blocking(f: impl FnOnce() -> nix::Result<()> + Send + 'static) {
    tokio::task::spawn_blocking(f).await.unwrap().unwrap();
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The median of each step over several lifecycles.
pub fn step_p50(runs: &[[Duration; 6]], step: usize) -> Duration {
    let mut times: Vec<_> = runs.iter().map(|r| r[step]).collect();
    times.sort();
    percentile(&times, 0.5)
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
