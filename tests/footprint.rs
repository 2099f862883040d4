//! Memory footprint of the daemon, the numbers behind the DaemonSet's memory request:
//! resident memory idle, and with 50 loop volumes created, staged and published.
//!
//! Ignored by default (it formats 50 volumes and needs root):
//!   cargo test --test footprint -- --ignored --nocapture
//! It measures the binary cargo built (a debug build unless run with --release).

use std::time::Duration;

use localvol_testkit::process::Spawn;
use localvol_testkit::{Cleanup, CsiClient, create_request, kubelet_paths, mount_capability};

const VOLUMES: usize = 50;
/// The localvol container's memory request in deploy/base/daemonset.yaml.
const REQUEST_BYTES: u64 = 32 << 20;

/// (VmRSS, VmHWM) of a process, in bytes.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib << 10
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU seconds of a process itself and of its waited-for children (utime+stime,
/// cutime+cstime in /proc/PID/stat).
fn cpu_seconds(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<f64> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as f64;
    // utime, stime, cutime, cstime are fields 14-17 of stat(5): 11-14 after the name.
    (
        (fields[11] + fields[12]) / ticks,
        (fields[13] + fields[14]) / ticks,
    )
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: formats 50 loop volumes as root"]
async fn resident_memory_idle_and_with_50_volumes() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (loop devices, mkfs, mount)"
    );
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let registry = dir.path().join("registry");
    let mut daemon = Spawn::new(localvol_testkit::localvol_bin!(), dir.path(), "measure")
        .args(["--loop-capacity", "20Gi", "--stats-interval", "1s"])
        .args(["--registration-dir".as_ref(), registry.as_os_str()])
        .env("RUST_LOG", "warn")
        .spawn();
    let pid = daemon.pid as u32;
    if let Err(e) = daemon
        .wait_for_socket(Duration::from_secs(5), Duration::from_millis(25))
        .await
    {
        panic!("{e}");
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (idle, _) = memory(pid);
    let started = std::time::Instant::now();
    let (cpu_before, _) = cpu_seconds(pid);

    let csi = CsiClient::new(daemon.channel().await);
    let root = dir.path().join("kubelet");
    let mut cleanup = Cleanup {
        mounts: Vec::new(),
        data: data.clone(),
    };
    let mut ids = Vec::new();
    for i in 0..VOLUMES {
        let id = csi
            .create_id(create_request(&format!("pvc-m{i}"), 64 << 20, ("ns", "c")))
            .await;
        let (staging, target) = kubelet_paths(&root, &format!("pv-m{i}"), &format!("pod-{i}"));
        cleanup.mounts.extend([staging.clone(), target.clone()]);
        csi.stage(&id, &staging, &mount_capability()).await.unwrap();
        csi.publish(&id, &staging, &target, &mount_capability())
            .await
            .unwrap();
        ids.push((id, staging, target));
    }
    // A few stats refreshes and ListVolumes calls over 50 volumes.
    for _ in 0..5 {
        csi.list().await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (busy, peak) = memory(pid);
    let (cpu, children) = cpu_seconds(pid);
    println!(
        "localvol RSS: idle {}, with {VOLUMES} staged+published volumes {}, peak {}",
        mib(idle),
        mib(busy),
        mib(peak)
    );
    println!(
        "CPU over {:.1}s of creating, staging and publishing {VOLUMES} volumes: \
         localvol {:.2}s, its children (losetup, mkfs) {children:.2}s",
        started.elapsed().as_secs_f64(),
        cpu - cpu_before,
    );
    for (id, staging, target) in ids {
        csi.unpublish(&id, &target).await.unwrap();
        csi.unstage(&id, &staging).await.unwrap();
        csi.delete(&id).await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(20), daemon.terminate())
        .await
        .expect("the daemon stops within 20s of SIGTERM");
    drop(cleanup);
    assert!(
        peak < REQUEST_BYTES,
        "peak RSS {} is above the DaemonSet's memory request {}",
        mib(peak),
        mib(REQUEST_BYTES)
    );
}
