//! The node resizer (`--node-resizer`) against the scripted mock API server of the
//! parent module, over a loop class on fake host seams.

use super::*;

/// A loop class `default` on fake host seams, in a temp dir.
struct Node {
    volumes: Arc<Volumes>,
    locks: VolumeLocks,
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let syscalls = FakeSyscalls::default();
        syscalls.set_usage(FsUsage {
            total_bytes: 100 << 30,
            available_bytes: 50 << 30,
            ..FsUsage::default()
        });
        let host = Host {
            commands: Arc::new(FakeCommands::default()),
            syscalls: Arc::new(syscalls),
        };
        let volumes = Volumes::one_loop_class(dir.path(), host, "node-a");
        Self {
            volumes: Arc::new(volumes),
            locks: VolumeLocks::default(),
            dir,
        }
    }

    /// A 64 MiB filesystem volume created for apps/data (PV pvc-1).
    async fn create(&self) -> VolumeId {
        let req = CreateRequest {
            name: PV.to_string(),
            token: Token::for_name(PV),
            capacity: CapacityRange {
                required: 64 << 20,
                limit: None,
            },
            capabilities: vec![Capability {
                access: AccessType::Mount {
                    fs_type: None,
                    mount_flags: Vec::new(),
                },
                mode: AccessMode::SingleNodeWriter,
            }],
            class: None,
            claim: claim(),
            topologies: Vec::new(),
            source: None,
            encryption: None,
        };
        let guard = self.locks.try_lock(&req.token, "create").unwrap();
        self.volumes.create(&guard, &req).await.unwrap().record.id
    }

    fn image_size(&self) -> u64 {
        let dir = self.dir.path().join("loop");
        let image = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .find(|e| e.path().extension().is_some_and(|x| x == "img"))
            .unwrap();
        image.metadata().unwrap().len()
    }
}

fn pv_json(id: &VolumeId, rv: &str, capacity: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": PV, "resourceVersion": rv},
        "spec": {
            "capacity": {"storage": capacity},
            "csi": {"driver": "localvol.csi.dev", "volumeHandle": id.to_string()},
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": NS, "name": PVC},
        },
    })
}

/// The read of PV pvc-1 (volume `id`) at `rv`.
fn get_pv(id: &VolumeId, rv: &str, capacity: &str) -> Exchange {
    step(
        Method::GET,
        "/api/v1/persistentvolumes/pvc-1",
        200,
        pv_json(id, rv, capacity),
    )
}

fn storage_class(allow: bool) -> Exchange {
    step(
        Method::GET,
        "/apis/storage.k8s.io/v1/storageclasses/localvol",
        200,
        json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "localvol"}, "provisioner": "localvol.csi.dev",
            "allowVolumeExpansion": allow,
        }),
    )
}

fn resizer(client: Client, node: &Node) -> NodeResizer {
    let labels =
        crate::k8s::claim_label::ClaimLabels::new(client.clone(), "node-a").with_grace(Duration::ZERO);
    NodeResizer::new(
        ResizeApi::new(client),
        "node-a",
        FailureValue::Auto,
        Arc::clone(&node.volumes),
        node.locks.clone(),
        labels,
    )
}

fn key() -> (String, String) {
    (NS.to_string(), PVC.to_string())
}

#[tokio::test]
async fn node_resizer_grows_the_volume_records_it_and_leaves_the_filesystem_to_kubelet() {
    let node = Node::new();
    let id = node.create().await;
    let (client, server) = MockApi::scripted(vec![
        get_claim("41", "128Mi", "64Mi", None),
        get_pv(&id, "7", "64Mi"),
        storage_class(true),
        step(Method::PATCH, STATUS_PATH, 200, pvc("42", "128Mi", "64Mi", Some("ControllerResizeInProgress"), json!([{"type": "Resizing", "status": "True"}])))
            .body(json!({
                "metadata": {"resourceVersion": "41"},
                "status": {
                    "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"},
                    "allocatedResources": {"storage": "128Mi"},
                    "conditions": [{"type": "Resizing", "status": "True", "lastTransitionTime": TIME}],
                },
            })),
        event("Normal", "Resizing"),
        step(Method::PUT, "/api/v1/persistentvolumes/pvc-1?&fieldManager=localvol", 200, pv_json(&id, "8", "128Mi"))
            .check(|pv| {
                assert_eq!(pv["metadata"]["resourceVersion"], "7");
                assert_eq!(pv["spec"]["capacity"]["storage"], "128Mi");
            }),
        patch_claim("43", "128Mi", "64Mi", Some("NodeResizePending"))
            .body(json!({
                "metadata": {"resourceVersion": "42"},
                "status": {
                    "allocatedResourceStatuses": {"storage": "NodeResizePending"},
                    "conditions": [
                        {
                            "type": "FileSystemResizePending", "status": "True", "lastTransitionTime": TIME,
                            "message": "The volume has grown; its node grows the filesystem when a pod mounts the claim.",
                        },
                        {"$patch": "delete", "type": "Resizing"},
                    ],
                },
            })),
        event("Normal", "FileSystemResizeRequired"),
        // Looked at again: the node's part is kubelet's.
        get_claim("43", "128Mi", "64Mi", Some("NodeResizePending")),
        get_pv(&id, "8", "128Mi"),
    ]);
    let resizer = resizer(client, &node);
    assert_eq!(resizer.reconcile(&key()).await.unwrap(), Outcome::Done);
    assert_eq!(node.image_size(), 128 << 20, "the backing file grew");
    assert_eq!(resizer.reconcile(&key()).await.unwrap(), Outcome::Done);
    drop(resizer);
    server.finish().await;
}

#[tokio::test]
async fn node_resizer_marks_an_expansion_that_cannot_fit_as_infeasible() {
    let node = Node::new();
    let id = node.create().await;
    let (client, server) = MockApi::scripted(vec![
        get_claim("41", "20Gi", "64Mi", None),
        get_pv(&id, "7", "64Mi"),
        storage_class(true),
        patch_claim("42", "20Gi", "64Mi", Some("ControllerResizeInProgress"))
            .check(|b| assert_eq!(b["status"]["allocatedResources"]["storage"], "20Gi")),
        event("Normal", "Resizing"),
        version("32"),
        patch_claim("43", "20Gi", "64Mi", Some("ControllerResizeInfeasible")).check(|b| {
            assert_eq!(b["metadata"]["resourceVersion"], "42");
            assert_eq!(
                b["status"]["allocatedResourceStatuses"]["storage"],
                "ControllerResizeInfeasible"
            );
            let condition = &b["status"]["conditions"][0];
            assert_eq!(condition["type"], "ControllerResizeError");
            let message = condition["message"].as_str().unwrap();
            assert!(message.contains("bytes free"), "{message}");
        }),
        event("Warning", "VolumeResizeFailed"),
        // Not retried at the same size.
        get_claim("43", "20Gi", "64Mi", Some("ControllerResizeInfeasible")),
    ]);
    let resizer = resizer(client, &node);
    assert_eq!(resizer.reconcile(&key()).await.unwrap(), Outcome::Done);
    assert_eq!(node.image_size(), 64 << 20, "nothing grew");
    assert_eq!(resizer.reconcile(&key()).await.unwrap(), Outcome::Done);
    drop(resizer);
    server.finish().await;
}

#[tokio::test]
async fn node_resizer_leaves_claims_it_may_not_or_need_not_grow() {
    let node = Node::new();
    let id = node.create().await;
    let (client, server) = MockApi::scripted(vec![
        // The class does not allow expansion.
        get_claim("41", "128Mi", "64Mi", None),
        get_pv(&id, "7", "64Mi"),
        storage_class(false),
        // Nothing asked beyond the capacity.
        get_claim("41", "64Mi", "64Mi", None),
    ]);
    let resizer = resizer(client, &node);
    assert_eq!(resizer.reconcile(&key()).await.unwrap(), Outcome::Done);
    assert_eq!(resizer.reconcile(&key()).await.unwrap(), Outcome::Done);
    // Not a claim of this node: no request at all.
    let other = (NS.to_string(), "elsewhere".to_string());
    assert_eq!(resizer.reconcile(&other).await.unwrap(), Outcome::Done);
    assert_eq!(node.image_size(), 64 << 20);
    drop(resizer);
    server.finish().await;
}

#[tokio::test]
async fn node_resizer_retries_a_busy_volume_without_touching_the_status_more() {
    let node = Node::new();
    let id = node.create().await;
    let _held = node.locks.try_lock(&id.token, "NodeExpandVolume").unwrap();
    let (client, server) = MockApi::scripted(vec![
        get_claim("41", "128Mi", "64Mi", None),
        get_pv(&id, "7", "64Mi"),
        storage_class(true),
        patch_claim("42", "128Mi", "64Mi", Some("ControllerResizeInProgress")),
        event("Normal", "Resizing"),
        event("Warning", "VolumeResizeRetrying"),
    ]);
    let resizer = resizer(client, &node);
    assert_eq!(
        resizer.reconcile(&key()).await.unwrap(),
        Outcome::RetryAfter(crate::resize::node_resizer::RETRY)
    );
    drop(resizer);
    server.finish().await;
}

#[tokio::test]
async fn reporting_off_makes_no_request_at_all() {
    let node = Node::new();
    let id = node.create().await;
    let (client, server) = MockApi::scripted(vec![]);
    let args = ResizeArgs {
        report_resize_status: ReportResizeStatus::Off,
        ..ResizeArgs::default()
    };
    assert!(!args.needs_api());
    let reporting = crate::resize::reporting(&args, Some(&client), "node-a")
        .await
        .unwrap();
    assert!(matches!(reporting, NodeReporting::Off));
    let report = reporting.started(&node.volumes, &id, GI2).await;
    reporting.finished(report, &Err(no_space())).await;
    drop((reporting, client));
    server.finish().await;
}

#[test]
fn flags_parse_from_the_command_line() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        resize: ResizeArgs,
    }
    let cli = Cli::parse_from([
        "x",
        "--report-resize-status",
        "--node-resizer",
        "--resize-failure-value",
        "NodeResizeFailed",
    ]);
    assert!(cli.resize.report_resize_status == ReportResizeStatus::On && cli.resize.node_resizer);
    assert_eq!(cli.resize.resize_failure_value, FailureValue::NodeResizeFailed);
    let cli = Cli::parse_from(["x"]);
    assert_eq!(cli.resize, ResizeArgs::default());
    assert_eq!(cli.resize.report_resize_status, ReportResizeStatus::Auto);
    assert!(!cli.resize.needs_api(), "auto works without an API");
    for (value, expected) in [
        ("on", ReportResizeStatus::On),
        ("true", ReportResizeStatus::On),
        ("off", ReportResizeStatus::Off),
        ("false", ReportResizeStatus::Off),
        ("auto", ReportResizeStatus::Auto),
    ] {
        let cli = Cli::parse_from(["x", &format!("--report-resize-status={value}")]);
        assert_eq!(cli.resize.report_resize_status, expected, "{value}");
    }
    assert!(Cli::try_parse_from(["x", "--resize-failure-value", "Failed"]).is_err());
}

/// `auto` reads this node's Node once and reports only for a kubelet before 1.32; an
/// unreadable version leaves reporting off.
#[tokio::test]
async fn auto_reporting_follows_the_kubelet_version() {
    let node_with = |version: &str| {
        json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a"}, "status": {"nodeInfo": {"kubeletVersion": version,
        "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "",
        "kubeProxyVersion": "", "machineID": "", "operatingSystem": "linux", "osImage": "",
        "systemUUID": ""}}})
    };
    let args = ResizeArgs::default();
    for (status, reply, expect_on) in [
        (200, node_with("v1.31.9"), true),
        (200, node_with("v1.36.3"), false),
        (200, node_with("unknown"), false),
        (
            403,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
            "reason": "Forbidden", "message": "nodes \"node-a\" is forbidden"}),
            false,
        ),
    ] {
        let (client, server) =
            MockApi::scripted(vec![step(Method::GET, "/api/v1/nodes/node-a", status, reply)]);
        let reporting = crate::resize::reporting(&args, Some(&client), "node-a")
            .await
            .unwrap();
        assert_eq!(matches!(reporting, NodeReporting::On(_)), expect_on);
        drop((reporting, client));
        server.finish().await;
    }
    let reporting = crate::resize::reporting(&args, None, "node-a").await.unwrap();
    assert!(
        matches!(reporting, NodeReporting::Off),
        "auto without an API is off"
    );
    let on = ResizeArgs {
        report_resize_status: ReportResizeStatus::On,
        ..ResizeArgs::default()
    };
    assert!(crate::resize::reporting(&on, None, "node-a").await.is_err());
}

#[tokio::test]
async fn the_claims_of_this_nodes_volumes_are_labelled_once_and_watched_by_that_label() {
    let node = Node::new();
    node.create().await;
    let (client, server) = MockApi::scripted(vec![
        step(
            Method::PATCH,
            &format!("{PVC_PATH}?*"),
            200,
            pvc("41", "64Mi", "64Mi", None, json!([])),
        )
        .body(json!({"metadata": {"labels": {"localvol.csi.dev/node": "node-a"}}})),
    ]);
    let resizer = resizer(client, &node);
    let watch = crate::k8s::claim_resize::claim_watch("node-a");
    assert_eq!(
        watch.label_selector.as_deref(),
        Some("localvol.csi.dev/node=node-a")
    );
    assert_eq!(watch.field_selector, None);
    resizer.label_local().await.unwrap();
    // Labelled already: no second request (the script would fail on one).
    resizer.label_local().await.unwrap();
    drop(resizer);
    server.finish().await;
}

/// A volume created after the resizer last read the node's volume list (its claim then
/// labelled at the volume's first stage, so its events arrive) is found on the claim's
/// next event, not at the next resync: a miss always re-reads the list.
#[tokio::test]
async fn a_claim_of_a_volume_newer_than_the_resizer_list_is_looked_at() {
    let node = Node::new();
    let (client, server) = MockApi::scripted(vec![get_claim("41", "64Mi", "64Mi", None)]);
    let resizer = resizer(client, &node);
    // Read while the node had no volume: nothing to look at, nothing asked.
    assert_eq!(resizer.reconcile(&key()).await.unwrap(), Outcome::Done);
    node.create().await;
    // At once: the claim is read (the script fails if it is not).
    assert_eq!(resizer.reconcile(&key()).await.unwrap(), Outcome::Done);
    drop(resizer);
    server.finish().await;
}
