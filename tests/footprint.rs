//! Memory footprint of the daemon, the numbers behind the DaemonSet's memory request:
//! resident memory idle, and with 50 loop volumes created, staged and published.
//!
//! Ignored by default (it formats 50 volumes and needs root):
//!   cargo test --test footprint -- --ignored --nocapture
//! It measures the binary cargo built (a debug build unless run with --release).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Cleanup, create_request, kubelet_paths, mount_capability};
use localvol::proto::csi::v1 as csi;
use localvol::proto::csi::v1::controller_client::ControllerClient;
use localvol::proto::csi::v1::node_client::NodeClient;

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
    let socket = dir.path().join("csi.sock");
    let data = dir.path().join("data");
    let mut daemon = tokio::process::Command::new(env!("CARGO_BIN_EXE_localvol"))
        .args(["serve", "--node-id", "measure", "--loop-capacity", "20Gi"])
        .arg("--endpoint")
        .arg(format!("unix://{}", socket.display()))
        .arg("--data-dir")
        .arg(&data)
        .arg("--kubelet-root-dir")
        .arg(dir.path())
        .arg("--registration-dir")
        .arg(dir.path().join("registry"))
        .args(["--metrics-addr", "127.0.0.1:0", "--stats-interval", "1s"])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = daemon.id().unwrap();
    for _ in 0..200 {
        if Path::new(&socket).exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (idle, _) = memory(pid);
    let started = std::time::Instant::now();
    let (cpu_before, _) = cpu_seconds(pid);

    let channel = localvol::csi::socket::connect(&socket).await.unwrap();
    let mut controller = ControllerClient::new(channel.clone());
    let mut node = NodeClient::new(channel);
    let root = dir.path().join("kubelet");
    let mut cleanup = Cleanup {
        mounts: Vec::new(),
        data: data.clone(),
    };
    let mut ids = Vec::new();
    for i in 0..VOLUMES {
        let id = controller
            .create_volume(create_request(&format!("pvc-m{i}"), 64 << 20, ("ns", "c")))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id;
        let (staging, target) = kubelet_paths(&root, &format!("pv-m{i}"), &format!("pod-{i}"));
        cleanup.mounts.extend([staging.clone(), target.clone()]);
        node.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_capability()),
            ..Default::default()
        })
        .await
        .unwrap();
        node.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(mount_capability()),
            ..Default::default()
        })
        .await
        .unwrap();
        ids.push((id, staging, target));
    }
    // A few stats refreshes and ListVolumes calls over 50 volumes.
    for _ in 0..5 {
        controller
            .list_volumes(csi::ListVolumesRequest::default())
            .await
            .unwrap();
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
        node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .unwrap();
        controller
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(20), daemon.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "{exit}");
    drop(cleanup);
    assert!(
        peak < REQUEST_BYTES,
        "peak RSS {} is above the DaemonSet's memory request {}",
        mib(peak),
        mib(REQUEST_BYTES)
    );
}
