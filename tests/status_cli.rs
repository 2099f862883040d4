//! Runs the `localvol status` binary against an in-process daemon and checks its table
//! and JSON output. Staging and publishing need root: without it the test fails unless
//! SKIP_PRIVILEGED=1, and then checks only volumes that are not staged.

use std::path::Path;
use std::process::Output;

use localvol::proto::csi::v1 as csi;
use localvol::proto::reclaimspace::{self as rs, reclaim_space_node_client::ReclaimSpaceNodeClient};
use localvol_testkit::csi_client::publish_request;
use localvol_testkit::{
    Cleanup, InProcessDaemon, connect, create_request, kubelet_paths, mount_capability, privileged,
};
use serde_json::{Value, json};

const MIB: u64 = 1 << 20;

/// What kubelet puts in a publish request's volume context: the PV's attributes (the
/// claim, from CreateVolume) and, with podInfoOnMount, the pod.
fn publish_context() -> std::collections::HashMap<String, String> {
    [
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("csi.storage.k8s.io/pvc/namespace", "apps"),
        ("csi.storage.k8s.io/pod.name", "web-0"),
        ("csi.storage.k8s.io/pod.namespace", "apps"),
        ("csi.storage.k8s.io/pod.uid", "pod-uid-1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// `localvol status` with the daemon's flags, and none of the caller's LOCALVOL_*
/// environment.
async fn status(daemon: &InProcessDaemon, extra: &[&str]) -> Output {
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
    let daemon = InProcessDaemon::start(&[]).await;
    let csi = daemon.client().await;
    let mut ids = Vec::new();
    for (name, pvc) in [("pvc-status-1", "data"), ("pvc-status-2", "logs")] {
        ids.push(csi.create_id(create_request(name, 64 << 20, ("apps", pvc))).await);
    }
    let mut node_grew = false;
    let (staging, target) = kubelet_paths(&daemon.dir.path().join("kubelet"), "pv-status-1", "pod-uid-1");
    let _cleanup = Cleanup {
        mounts: vec![staging.clone(), target.clone()],
        data: daemon.data_dir(),
    };
    if staged_too {
        csi.stage(&ids[0], &staging, &mount_capability()).await.unwrap();
        csi.node()
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_context: publish_context(),
                ..publish_request(&ids[0], &staging, &target, &mount_capability())
            })
            .await
            .unwrap();
        // Written and deleted: the blocks a reclaim gives back.
        let scratch = target.join("scratch");
        std::fs::write(&scratch, vec![7u8; (8 * MIB) as usize]).unwrap();
        nix::unistd::sync();
        std::fs::remove_file(&scratch).unwrap();
        nix::unistd::sync();
        let mut addons = ReclaimSpaceNodeClient::new(connect(&daemon.addons_socket).await);
        addons
            .node_reclaim_space(rs::NodeReclaimSpaceRequest {
                volume_id: ids[0].clone(),
                volume_path: target.display().to_string(),
                ..Default::default()
            })
            .await
            .unwrap();
        // Something to count as used.
        std::fs::write(target.join("payload"), vec![7u8; (4 * MIB) as usize]).unwrap();
        nix::unistd::sync();
        // Grown, as external-resizer and kubelet would: controller, then node.
        csi.expand_controller(&ids[0], (128 * MIB) as i64).await.unwrap();
        let grown = csi
            .expand_node(
                &ids[0],
                &target,
                &staging,
                (128 * MIB) as i64,
                &mount_capability(),
            )
            .await;
        // Online ext4 growth needs CAP_SYS_RESOURCE; without it the failure is what
        // status must show.
        assert_eq!(
            grown.is_ok(),
            localvol_testkit::has_cap_sys_resource(),
            "{grown:?}"
        );
        node_grew = grown.is_ok();
    }
    // Grown on the controller side only: its filesystem waits for the node.
    csi.expand_controller(&ids[1], (128 * MIB) as i64).await.unwrap();
    let first_size = if staged_too { 128 * MIB } else { 64 * MIB };

    let report: Value = serde_json::from_str(&stdout(&status(&daemon, &["-o", "json"]).await)).unwrap();
    assert_eq!(report["node"], "test-node");
    let volumes = report["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 2, "{report:#}");
    let (first, second) = (&volumes[0], &volumes[1]);
    assert_eq!(first["id"], ids[0].as_str());
    assert_eq!(second["id"], ids[1].as_str());
    assert!(report["known_since"].is_string(), "{report:#}");
    for v in volumes {
        assert_eq!(v["device_class"], "default");
        assert_eq!(v["mode"], "filesystem");
    }
    assert_eq!(first["size_bytes"], first_size);
    assert_eq!(second["size_bytes"], 128 * MIB);
    assert_eq!(first["pvc"], json!({"namespace": "apps", "name": "data"}));
    assert_eq!(second["pvc"], json!({"namespace": "apps", "name": "logs"}));
    // Never published nor reclaimed; grown by ControllerExpandVolume alone.
    assert_eq!(second["pods"], json!([]));
    assert!(second["last_reclaim"].is_null(), "{second:#}");
    let resize = &second["resize_state"];
    assert_eq!(resize["state"], "node_expansion_pending", "{second:#}");
    assert_eq!(resize["step"], "controller");
    assert_eq!(resize["size_bytes"], 128 * MIB);
    // Never staged: no device, no mounts, no usage.
    assert!(
        second["device"].is_null() && second["used_bytes"].is_null(),
        "{second:#}"
    );
    assert_eq!(second["staged_paths"], json!([]));
    assert_eq!(second["published_paths"], json!([]));
    assert!(second["condition"].is_null(), "not staged: {second:#}");
    if staged_too {
        // The daemon's own condition for it, as kubelet would read it.
        assert_eq!(first["condition"]["abnormal"], false, "{first:#}");
        assert!(
            first["condition"]["message"]
                .as_str()
                .unwrap()
                .starts_with("healthy on /dev/loop"),
            "{first:#}"
        );
        assert!(
            first["device"].as_str().unwrap().starts_with("/dev/loop"),
            "{first:#}"
        );
        assert_eq!(first["staged_paths"], json!([staging.display().to_string()]));
        assert_eq!(first["published_paths"], json!([target.display().to_string()]));
        let used = first["used_bytes"]
            .as_u64()
            .expect("used bytes of a staged volume");
        assert!((4 * MIB..128 * MIB).contains(&used), "used {used}");
        assert_eq!(first["pods"], json!([{"namespace": "apps", "name": "web-0"}]));
        let reclaim = &first["last_reclaim"];
        assert_eq!(reclaim["result"], "trimmed", "{first:#}");
        let reclaimed = reclaim["reclaimed_bytes"].as_u64().unwrap();
        assert!(reclaimed >= 4 * MIB, "reclaimed {reclaimed} of 8 MiB deleted");
        assert!(reclaim["error"].is_null());
        let resize = &first["resize_state"];
        assert_eq!(resize["step"], "node", "{first:#}");
        assert_eq!(resize["size_bytes"], 128 * MIB);
        if node_grew {
            assert_eq!(resize["state"], "done", "{first:#}");
            assert!(resize["reason"].is_null());
        } else {
            assert_eq!(resize["state"], "failed", "{first:#}");
            let reason = resize["reason"].as_str().unwrap();
            assert!(reason.contains("resize2fs"), "{reason}");
        }
    } else {
        for unknown in ["last_reclaim", "resize_state"] {
            assert!(first[unknown].is_null(), "{unknown} must be null: {first:#}");
        }
        assert_eq!(first["pods"], json!([]));
    }

    let table = stdout(&status(&daemon, &[]).await);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines[0], "NODE test-node");
    assert!(lines[1].starts_with("ID "), "{table}");
    assert_eq!(lines.len(), 4, "{table}");
    // Cells are cut at the header's column starts: LAST-RECLAIM and RESIZE may hold
    // spaces.
    let header = lines[1];
    let names = [
        "ID",
        "CLASS",
        "SIZE",
        "USED",
        "STAGED",
        "PUBLISHED",
        "PVC",
        "POD",
        "LAST-RECLAIM",
        "RESIZE",
        "ENCRYPTION",
        "HEALTH",
    ];
    let starts: Vec<usize> = names
        .iter()
        .map(|n| header.find(&format!("{n} ")).or_else(|| header.find(n)).unwrap())
        .collect();
    let row = |id: &str| -> Vec<String> {
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("{id} not in\n{table}"));
        (0..names.len())
            .map(|i| {
                let end = starts.get(i + 1).copied().unwrap_or(usize::MAX).min(line.len());
                line.get(starts[i].min(line.len())..end)
                    .unwrap()
                    .trim()
                    .to_string()
            })
            .collect()
    };
    let unstaged = row(&ids[1]);
    assert_eq!(
        unstaged[1..9],
        ["default", "128Mi", "-", "-", "-", "apps/logs", "-", "-"],
        "{table}"
    );
    assert!(
        unstaged[9].starts_with("128Mi, node expansion pending ("),
        "{table}"
    );
    assert_eq!(unstaged[11], "-", "not staged: {table}");
    let staged_row = row(&ids[0]);
    assert_eq!(staged_row[1], "default", "{table}");
    assert_eq!(staged_row[6], "apps/data", "{table}");
    if staged_too {
        assert_eq!(staged_row[2], "128Mi", "{table}");
        assert_ne!(staged_row[3], "-", "used is shown: {table}");
        assert_eq!(staged_row[4], staging.display().to_string());
        assert_eq!(staged_row[5], target.display().to_string());
        assert_eq!(staged_row[7], "apps/web-0", "{table}");
        assert!(
            staged_row[8].starts_with("ok ") && staged_row[8].ends_with(" ago)"),
            "{table}"
        );
        let resize = if node_grew {
            "done 128Mi ("
        } else {
            "failed to 128Mi (node, "
        };
        assert!(staged_row[9].starts_with(resize), "{table}");
        assert_eq!(staged_row[11], "healthy", "{table}");
        csi.unpublish(&ids[0], &target).await.unwrap();
        // The pod no longer uses it; the claim, reclaim and resize are still known.
        let after: Value = serde_json::from_str(&stdout(&status(&daemon, &["-o", "json"]).await)).unwrap();
        let first = &after["volumes"][0];
        assert_eq!(first["pods"], json!([]), "{first:#}");
        assert_eq!(first["last_reclaim"]["result"], "trimmed");
        assert_eq!(first["resize_state"]["step"], "node");
        csi.unstage(&ids[0], &staging).await.unwrap();
    }
    for id in ids {
        csi.delete(&id).await.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_snapshots_with_class_source_size_and_time() {
    let daemon = InProcessDaemon::start(&[]).await;
    let csi = daemon.client().await;
    let volume = csi
        .create(create_request("pvc-snapshot-source", 64 << 20, ("apps", "db")))
        .await
        .unwrap();
    let before = std::time::SystemTime::now();
    let snapshot = csi
        .snapshot("snapshot-status-1", &volume.volume_id)
        .await
        .unwrap();

    let output = status(&daemon, &["-o", "json"]).await;
    let report: Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert!(
        output.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let listed = report["snapshots"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{report:#}");
    let s = &listed[0];
    assert_eq!(s["id"], snapshot.snapshot_id.as_str());
    assert_eq!(s["device_class"], "default");
    assert_eq!(s["source_volume_id"], volume.volume_id.as_str());
    assert_eq!(s["size_bytes"], 64 * MIB);
    assert_eq!(s["ready_to_use"], true);
    // The record's creation time, not the listing's.
    let created: k8s_openapi::jiff::Timestamp = s["created_at"].as_str().unwrap().parse().unwrap();
    let before = k8s_openapi::jiff::Timestamp::try_from(before).unwrap();
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(created);
    assert!(created >= before && age.as_secs() < 60, "{s:#}");

    let table = stdout(&status(&daemon, &[]).await);
    let lines: Vec<&str> = table.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("SNAPSHOT "))
        .unwrap_or_else(|| panic!("no snapshot table in\n{table}"));
    assert_eq!(lines[at - 1], "", "{table}");
    let row: Vec<&str> = lines[at + 1].split_whitespace().collect();
    assert_eq!(
        row[..4],
        [
            snapshot.snapshot_id.as_str(),
            "default",
            volume.volume_id.as_str(),
            "64Mi"
        ],
        "{table}"
    );
    assert!(lines[at + 1].ends_with(" ago)"), "{table}");

    csi.delete_snapshot(&snapshot.snapshot_id).await.unwrap();
    let after: Value = serde_json::from_str(&stdout(&status(&daemon, &["-o", "json"]).await)).unwrap();
    assert_eq!(after["snapshots"], json!([]), "{after:#}");
    assert!(!stdout(&status(&daemon, &[]).await).contains("SNAPSHOT"));
    csi.delete(&volume.volume_id).await.unwrap();
    daemon.stop().await;
}
