//! Runs the `localvol status` binary against an in-process daemon and checks its table
//! and JSON output. Staging and publishing need root: without it the test fails unless
//! SKIP_PRIVILEGED=1, and then checks only volumes that are not staged.

mod common;

use std::path::Path;
use std::process::Output;

use common::{Cleanup, Daemon, create_request, kubelet_paths, mount_capability, privileged};
use localvol::proto::csi::v1 as csi;
use localvol::proto::csi::v1::controller_client::ControllerClient;
use localvol::proto::csi::v1::node_client::NodeClient;
use serde_json::{Value, json};

/// `localvol status` with the daemon's flags, and none of the caller's LOCALVOL_*
/// environment.
async fn status(daemon: &Daemon, extra: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_localvol"));
    for (key, _) in std::env::vars() {
        if key.starts_with("LOCALVOL_") {
            command.env_remove(key);
        }
    }
    command
        .args(["status", "--endpoint", &daemon.endpoint(), "--data-dir"])
        .arg(daemon.data_dir())
        .args(extra)
        .output()
        .await
        .unwrap()
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "status failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_volumes_as_table_and_json() {
    let staged_too = privileged();
    let daemon = Daemon::start(&[]).await;
    let channel = daemon.channel().await;
    let mut controller = ControllerClient::new(channel.clone());
    let mut node = NodeClient::new(channel);
    let mut ids = Vec::new();
    for (name, pvc) in [("pvc-status-1", "data"), ("pvc-status-2", "logs")] {
        let volume = controller
            .create_volume(create_request(name, 64 << 20, ("apps", pvc)))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        ids.push(volume.volume_id);
    }
    let (staging, target) = kubelet_paths(&daemon.dir.path().join("kubelet"), "pv-status-1", "pod-uid-1");
    let _cleanup = Cleanup {
        mounts: vec![staging.clone(), target.clone()],
        data: daemon.data_dir(),
    };
    if staged_too {
        node.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: ids[0].clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_capability()),
            ..Default::default()
        })
        .await
        .unwrap();
        node.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: ids[0].clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(mount_capability()),
            ..Default::default()
        })
        .await
        .unwrap();
        // Something to count as used.
        std::fs::write(target.join("payload"), vec![7u8; 4 << 20]).unwrap();
        nix::unistd::sync();
    }

    let report: Value = serde_json::from_str(&stdout(&status(&daemon, &["-o", "json"]).await)).unwrap();
    assert_eq!(report["node"], "test-node");
    let volumes = report["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 2, "{report:#}");
    let (first, second) = (&volumes[0], &volumes[1]);
    assert_eq!(first["id"], ids[0].as_str());
    assert_eq!(second["id"], ids[1].as_str());
    for v in volumes {
        assert_eq!(v["device_class"], "default");
        assert_eq!(v["size_bytes"], 64 << 20);
        assert_eq!(v["mode"], "filesystem");
        for unknown in ["pod", "last_reclaim", "resize_state"] {
            assert!(v[unknown].is_null(), "{unknown} must be null: {v:#}");
        }
    }
    assert_eq!(first["pvc"], json!({"namespace": "apps", "name": "data"}));
    assert_eq!(second["pvc"], json!({"namespace": "apps", "name": "logs"}));
    // Never staged: no device, no mounts, no usage.
    assert!(
        second["device"].is_null() && second["used_bytes"].is_null(),
        "{second:#}"
    );
    assert_eq!(second["staged_paths"], json!([]));
    assert_eq!(second["published_paths"], json!([]));
    if staged_too {
        assert!(
            first["device"].as_str().unwrap().starts_with("/dev/loop"),
            "{first:#}"
        );
        assert_eq!(first["staged_paths"], json!([staging.display().to_string()]));
        assert_eq!(first["published_paths"], json!([target.display().to_string()]));
        let used = first["used_bytes"]
            .as_u64()
            .expect("used bytes of a staged volume");
        assert!((4 << 20..64 << 20).contains(&used), "used {used}");
    }

    let table = stdout(&status(&daemon, &[]).await);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines[0], "NODE test-node");
    assert!(lines[1].starts_with("ID "), "{table}");
    assert_eq!(lines.len(), 4, "{table}");
    let row = |id: &str| -> Vec<String> {
        let line = lines
            .iter()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("{id} not in\n{table}"));
        line.split_whitespace().map(str::to_string).collect()
    };
    let unstaged = row(&ids[1]);
    assert_eq!(
        unstaged[1..],
        ["default", "64Mi", "-", "-", "-", "apps/logs", "-", "-", "-"],
        "{table}"
    );
    let staged_row = row(&ids[0]);
    assert_eq!(staged_row[1..3], ["default", "64Mi"], "{table}");
    assert_eq!(staged_row[6..], ["apps/data", "-", "-", "-"], "{table}");
    if staged_too {
        assert_ne!(staged_row[3], "-", "used is shown: {table}");
        assert_eq!(staged_row[4], staging.display().to_string());
        assert_eq!(staged_row[5], target.display().to_string());
        node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: ids[0].clone(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: ids[0].clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .unwrap();
    }
    for id in ids {
        controller
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let empty: Value = serde_json::from_str(&stdout(&status(&daemon, &["-o", "json"]).await)).unwrap();
    assert_eq!(empty["volumes"], json!([]));
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_without_a_daemon_fails_and_says_where_it_looked() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_localvol"))
        .args(["status", "--endpoint"])
        .arg(format!("unix://{}", socket.display()))
        .arg("--data-dir")
        .arg(dir.path())
        .env_remove("LOCALVOL_CONFIG")
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot connect to the localvol daemon at {}",
            socket.display()
        )),
        "{stderr}"
    );
    assert!(!Path::new(&socket).exists());
}
