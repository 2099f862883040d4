//! Scrapes /metrics of an in-process daemon after a volume's lifecycle and checks the
//! counters, gauges and info metrics it should show.
//!
//! Create and delete run anywhere. Stage, publish, unpublish and unstage need root
//! (loop devices, mkfs, mount): without root the test fails unless SKIP_PRIVILEGED=1.

use localvol::proto::csi::v1 as csi;
use localvol_testkit::csi_client::{publish_request, stage_request};
use localvol_testkit::{
    Cleanup, InProcessDaemon, create_request, kubelet_paths, mount_capability, privileged,
};

fn count(text: &str, prefix: &str) -> Option<String> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .map(|l| l[prefix.len()..].trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_after_a_volume_lifecycle() {
    let staged_too = privileged();
    let daemon = InProcessDaemon::start(&[]).await;
    assert!(
        daemon.registration_socket.exists(),
        "builtin registration serves its socket"
    );
    daemon
        .wait_for_metric(r#"localvol_volumes{device_class="default"} 0"#)
        .await;

    let csi = daemon.client().await;
    let volume = csi
        .create(create_request("pvc-scrape", 64 << 20, ("apps", "data")))
        .await
        .unwrap();
    let id = volume.volume_id.clone();
    daemon
        .wait_for_metric(r#"localvol_volumes{device_class="default"} 1"#)
        .await;
    daemon
        .wait_for_metric(r#"localvol_provisioned_bytes{device_class="default"} 67108864"#)
        .await;

    if staged_too {
        let (staging, target) = kubelet_paths(&daemon.dir.path().join("kubelet"), "pv-scrape", "pod-1");
        let _cleanup = Cleanup {
            mounts: vec![staging.clone(), target.clone()],
            data: daemon.data_dir(),
        };
        // With the volume context CreateVolume returned, as kubelet passes it on.
        csi.node()
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_context: volume.volume_context.clone(),
                ..stage_request(&id, &staging, &mount_capability())
            })
            .await
            .unwrap();
        csi.node()
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_context: volume.volume_context.clone(),
                ..publish_request(&id, &staging, &target, &mount_capability())
            })
            .await
            .unwrap();
        csi.unpublish(&id, &target).await.unwrap();
        csi.unstage(&id, &staging).await.unwrap();
    }
    csi.delete(&id).await.unwrap();
    // A bad request is counted under its code.
    let refused = csi
        .node()
        .node_stage_volume(csi::NodeStageVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);

    let text = daemon
        .wait_for_metric(r#"localvol_volumes{device_class="default"} 0"#)
        .await;
    let mut expected = vec![
        r#"localvol_rpc_requests_total{code="Ok",method="CreateVolume"} 1"#,
        r#"localvol_rpc_requests_total{code="Ok",method="DeleteVolume"} 1"#,
        r#"localvol_rpc_requests_total{code="InvalidArgument",method="NodeStageVolume"} 1"#,
        r#"localvol_rpc_duration_seconds_count{code="Ok",method="CreateVolume"} 1"#,
        r#"localvol_rpc_duration_seconds_count{code="Ok",method="DeleteVolume"} 1"#,
        r#"localvol_provisioned_bytes{device_class="default"} 0"#,
    ];
    if staged_too {
        expected.extend([
            r#"localvol_rpc_requests_total{code="Ok",method="NodeStageVolume"} 1"#,
            r#"localvol_rpc_requests_total{code="Ok",method="NodePublishVolume"} 1"#,
            r#"localvol_rpc_requests_total{code="Ok",method="NodeUnpublishVolume"} 1"#,
            r#"localvol_rpc_requests_total{code="Ok",method="NodeUnstageVolume"} 1"#,
            r#"localvol_rpc_duration_seconds_count{code="Ok",method="NodeStageVolume"} 1"#,
        ]);
    }
    for line in &expected {
        assert!(
            text.lines().any(|l| l == *line),
            "{line} missing from /metrics:\n{text}"
        );
    }
    let build_info = format!(
        r#"localvol_build_info{{version="{}"}} 1"#,
        env!("CARGO_PKG_VERSION")
    );
    assert!(
        text.lines().any(|l| l == build_info),
        "{build_info} missing:\n{text}"
    );
    assert!(
        text.contains("# TYPE localvol_rpc_duration_seconds histogram"),
        "{text}"
    );

    // Capacity: the class's whole size (at most the 2Gi limit) and what is free now.
    let total: u64 = count(
        &text,
        r#"localvol_capacity_bytes{device_class="default",kind="total"}"#,
    )
    .expect("total capacity")
    .parse()
    .unwrap();
    let available: u64 = count(
        &text,
        r#"localvol_capacity_bytes{device_class="default",kind="available"}"#,
    )
    .expect("available capacity")
    .parse()
    .unwrap();
    assert!(0 < total && total <= 2 << 30, "total {total}");
    assert!(
        0 < available && available <= total,
        "available {available} of {total}"
    );
    // The filesystem under the loop class's directory.
    let storage = |kind: &str| -> u64 {
        count(
            &text,
            &format!(r#"localvol_storage_bytes{{device_class="default",kind="{kind}"}}"#),
        )
        .unwrap_or_else(|| panic!("storage {kind} missing:\n{text}"))
        .parse()
        .unwrap()
    };
    let (size, used, free) = (storage("size"), storage("used"), storage("free"));
    assert!(
        0 < used && used < size && free <= size - used,
        "{size} {used} {free}"
    );

    // The daemon's own process metrics.
    let rss: f64 = count(&text, "process_resident_memory_bytes ")
        .expect("process metrics")
        .parse()
        .unwrap();
    assert!(rss > 1e6, "resident memory {rss}");
    // Nothing exported for features that have not reported anything.
    for absent in ["localvol_reclaim", "localvol_resize", "localvol_thin_pool"] {
        assert!(
            !text.contains(absent),
            "{absent} exported without a producer:\n{text}"
        );
    }

    assert_eq!(daemon.get("/healthz").await, (200, "ok\n".to_string()));
    assert_eq!(daemon.get("/readyz").await, (200, "ready\n".to_string()));

    let (socket, registration) = (daemon.socket.clone(), daemon.registration_socket.clone());
    daemon.stop().await;
    assert!(!socket.exists(), "CSI socket removed on shutdown");
    assert!(!registration.exists(), "registration socket removed on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_registration_serves_no_registration_socket() {
    let daemon = InProcessDaemon::start(&["--kubelet-registration", "external"]).await;
    assert!(daemon.socket.exists());
    assert!(
        daemon.registration_socket.parent().unwrap().is_dir(),
        "kubelet's registry exists"
    );
    assert!(
        !daemon.registration_socket.exists(),
        "but localvol leaves registration to the sidecar"
    );
    daemon.stop().await;
}
