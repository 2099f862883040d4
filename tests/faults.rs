//! Faults: the storage under a volume disappears, the class runs out of space, a
//! storage tool hangs. Each case checks the answer's code and that the daemon cleans
//! up, stays responsive and lets the volume be retried. (The API server going away is
//! covered by the mock-apiserver tests in src/k8s/tests.rs.)

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use localvol_testkit::csi_client::{NewVolume, fs_capability};
use localvol_testkit::process::{DaemonProcess, Output, Spawn};
use localvol_testkit::{
    Cleanup, CsiClient, InProcessDaemon, assert_released, create_request, kubelet_paths, loops_under,
    mount_capability, privileged,
};
use tonic::Code;

const MIB: i64 = 1 << 20;

fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().unwrap().is_dir() {
            found.extend(files_below(&entry.path()));
        } else {
            found.push(entry.path());
        }
    }
    found
}

async fn create(csi: &CsiClient, name: &str, bytes: i64) -> String {
    csi.create_id(create_request(name, bytes, ("faults", name))).await
}

/// The backing file of a staged and published volume is deleted: stats report the
/// volume abnormal, and unpublish, unstage and delete still clean up everything,
/// including the loop device still holding the deleted file.
#[tokio::test]
async fn backing_file_deleted_under_a_mounted_volume() {
    if !privileged() {
        return;
    }
    let d = InProcessDaemon::start(&[]).await;
    let csi = d.client().await;
    let (staging, target) = kubelet_paths(&d.path("kubelet"), "pv-gone", "pod-gone");
    let _cleanup = Cleanup {
        mounts: vec![staging.clone(), target.clone()],
        data: d.data_dir(),
    };
    let id = create(&csi, "pvc-gone", 32 * MIB).await;
    csi.stage(&id, &staging, &mount_capability()).await.unwrap();
    csi.publish(&id, &staging, &target, &mount_capability())
        .await
        .unwrap();
    std::fs::write(target.join("data"), b"before the fault").unwrap();
    let stats = async || csi.stats(&id, &target).await.unwrap();
    assert!(!stats().await.volume_condition.unwrap().abnormal);

    let images: Vec<PathBuf> = files_below(&d.data_dir())
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "img"))
        .collect();
    assert_eq!(images.len(), 1, "{images:?}");
    std::fs::remove_file(&images[0]).unwrap();

    let condition = stats().await.volume_condition.unwrap();
    assert!(
        condition.abnormal,
        "a volume whose storage is gone is abnormal: {condition:?}"
    );
    assert!(!condition.message.is_empty());

    csi.unpublish(&id, &target).await.unwrap();
    csi.unstage(&id, &staging).await.unwrap();
    assert_released(d.dir.path(), &d.data_dir(), "after unpublish and unstage");
    csi.delete(&id).await.unwrap();
    assert!(
        files_below(&d.data_dir()).is_empty(),
        "{:?}",
        files_below(&d.data_dir())
    );
    d.stop().await;
}

/// A full class: create and expand are RESOURCE_EXHAUSTED and leave nothing behind;
/// the volumes that fit are untouched and space freed by a delete can be used again.
#[tokio::test]
async fn full_capacity_is_resource_exhausted_and_leaves_nothing() {
    // The test daemon's loop class promises at most 2 GiB (sparse files).
    let d = InProcessDaemon::start(&[]).await;
    let csi = d.client().await;
    let a = create(&csi, "pvc-a", 1280 * MIB).await;
    let b = create(&csi, "pvc-b", 768 * MIB).await;
    let before = files_below(&d.data_dir());
    assert_eq!(before.len(), 4, "two images and two records: {before:?}");

    let full = csi
        .create(create_request("pvc-c", MIB, ("faults", "pvc-c")))
        .await
        .unwrap_err();
    assert_eq!(full.code(), Code::ResourceExhausted, "{}", full.message());
    let grow = csi.expand_controller(&a, 1281 * MIB).await.unwrap_err();
    assert_eq!(grow.code(), Code::OutOfRange, "{}", grow.message());
    assert_eq!(
        files_below(&d.data_dir()),
        before,
        "a refused call creates nothing"
    );
    let sizes: Vec<i64> = csi
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.volume.unwrap().capacity_bytes)
        .collect();
    assert_eq!(sizes.iter().sum::<i64>(), 2048 * MIB, "{sizes:?}");

    csi.delete(&b).await.unwrap();
    create(&csi, "pvc-c", 768 * MIB).await;
    d.stop().await;
}

/// The daemon binary (tests/testkit/src/process.rs), with `dir/bin` first in its PATH (where
/// a test puts a fake tool).
async fn start_with_fake_tools(dir: &Path) -> DaemonProcess {
    let path = format!("{}:{}", dir.join("bin").display(), std::env::var("PATH").unwrap());
    let mut daemon = Spawn::new(localvol_testkit::localvol_bin!(), dir, "faults")
        .standalone()
        .args(["--loop-capacity", "1Gi"])
        .env("PATH", path)
        // Slow calls are logged at info (the hung-tool test reads them).
        .env("RUST_LOG", "warn,localvol::csi=info")
        .env("LOCALVOL_LOG_FORMAT", "json")
        .output(Output::StderrTo(Some(dir.join("daemon.log"))))
        .spawn();
    if let Err(e) = daemon
        .wait_for_socket(Duration::from_secs(60), Duration::from_millis(25))
        .await
    {
        panic!("{e}");
    }
    daemon
}

/// Processes whose command line contains `needle` (to see the hung tool die).
fn processes_with(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .count()
}

/// A storage tool that hangs (blkid, run by every stage of a volume formatted before at
/// a stage; a volume formatted at its create is mounted without it):
/// the call fails with DEADLINE_EXCEEDED when the daemon's timeout (30s for blkid)
/// kills the tool;
/// meanwhile the daemon answers other calls at once and the same volume is ABORTED, not
/// queued; afterwards the lock is free and the retried stage succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_storage_command_times_out_and_the_volume_is_retryable() {
    if !privileged() {
        return;
    }
    let tmp = tempfile::Builder::new()
        .prefix("localvol-hang-")
        .tempdir()
        .unwrap();
    let dir = tmp.path();
    // A sleep long enough to hang, with a duration no other process has.
    let marker = format!("1000.{}", std::process::id());
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let (staging, _) = kubelet_paths(&dir.join("kubelet"), "pv-hang", "pod-hang");
    let _cleanup = Cleanup {
        mounts: vec![staging.clone()],
        data: dir.join("data"),
    };
    let mut daemon = start_with_fake_tools(dir).await;
    let csi = CsiClient::new(daemon.channel().await);
    // No filesystem type at create: the first stage formats, so blkid has a say later.
    let unformatted = NewVolume {
        capability: fs_capability("", &[]),
        pvc: Some(("faults", "pvc-hang")),
        ..NewVolume::new("pvc-hang", 32 * MIB)
    };
    let id = csi.create_id(unformatted.request()).await;
    // Formatted once with the real tools: from now on every stage asks blkid first.
    csi.stage(&id, &staging, &mount_capability()).await.unwrap();
    csi.unstage(&id, &staging).await.unwrap();
    let fake = dir.join("bin/blkid");
    // `exec`, so the process the daemon kills is the one that hangs.
    std::fs::write(&fake, format!("#!/bin/sh\nexec sleep {marker}\n")).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let started = Instant::now();
    let hung = {
        let (csi, id, staging) = (csi.clone(), id.clone(), staging.clone());
        tokio::spawn(async move { csi.stage(&id, &staging, &mount_capability()).await })
    };
    // Wait until the tool is really hanging.
    while processes_with(&marker) == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "blkid never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Responsive meanwhile: other volumes and lock-free calls are answered at once.
    let quick = Instant::now();
    let other = create(&csi, "pvc-other", 16 * MIB).await;
    csi.capacity(None).await.unwrap();
    csi.node_capabilities().await.unwrap();
    assert!(
        quick.elapsed() < Duration::from_secs(5),
        "answered while a tool hangs: {:?}",
        quick.elapsed()
    );
    let busy = csi.stage(&id, &staging, &mount_capability()).await.unwrap_err();
    assert_eq!(busy.code(), Code::Aborted, "{}", busy.message());

    let timed_out = tokio::time::timeout(Duration::from_secs(60), hung)
        .await
        .expect("the hung call is answered within blkid's timeout")
        .unwrap()
        .unwrap_err();
    assert_eq!(
        timed_out.code(),
        Code::DeadlineExceeded,
        "{}",
        timed_out.message()
    );
    assert!(timed_out.message().contains("blkid"), "{}", timed_out.message());
    eprintln!(
        "hung blkid answered after {:?}: {}",
        started.elapsed(),
        timed_out.message()
    );
    for _ in 0..100 {
        if processes_with(&marker) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(processes_with(&marker), 0, "the hung tool was killed");
    // The log names the slow call and its time, whatever its outcome.
    let log = std::fs::read_to_string(dir.join("daemon.log")).unwrap();
    let slow: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["message"] == "slow call" && e["span"]["rpc.method"] == "NodeStageVolume")
        .collect();
    assert!(
        slow.iter()
            .any(|e| e["ok"] == false && e["elapsed_ms"].as_u64().is_some_and(|ms| ms >= 1000)),
        "no slow-call line for the hung stage in:\n{log}"
    );

    // The tool works again: the same stage succeeds (the lock was released).
    std::fs::remove_file(&fake).unwrap();
    csi.stage(&id, &staging, &mount_capability()).await.unwrap();
    csi.unstage(&id, &staging).await.unwrap();
    for vol in [id, other] {
        csi.delete(&vol).await.unwrap();
    }
    assert!(loops_under(&dir.join("data")).is_empty());
    daemon.kill().await;
}
