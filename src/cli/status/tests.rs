use std::collections::HashMap;
use std::path::Path;

use super::mounts::{is_publish_path, mounts_of};
use super::table::{reclaim_cell, resize_cell};
use super::*;

const KUBELET: &str = "/var/lib/kubelet";

fn mountinfo() -> MountTable {
    MountTable::parse(&format!(
        "\
22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
101 22 7:3 / {KUBELET}/plugins/kubernetes.io/csi/localvol.csi.dev/abc/globalmount rw shared:50 - ext4 /dev/loop3 rw
102 22 7:3 / {KUBELET}/pods/uid-1/volumes/kubernetes.io~csi/pvc-1/mount rw shared:50 - ext4 /dev/loop3 rw
103 22 7:3 / {KUBELET}/pods/uid-2/volumes/kubernetes.io~csi/pvc-1/mount ro shared:50 - ext4 /dev/loop3 rw
104 22 0:5 /loop4 {KUBELET}/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-2/uid-3 rw - devtmpfs udev rw
105 22 0:5 /loop44 /elsewhere rw - devtmpfs udev rw
106 22 7:5 / /mnt/other rw - ext4 /dev/loop5 rw
"
    ))
    .unwrap()
}

#[test]
fn mounts_are_split_into_staged_and_published() {
    let table = mountinfo();
    let dev = nix::sys::stat::makedev(7, 3);
    let (staged, published) = mounts_of(&table, dev, Path::new("/loop3"));
    assert_eq!(
        staged,
        vec![PathBuf::from(format!(
            "{KUBELET}/plugins/kubernetes.io/csi/localvol.csi.dev/abc/globalmount"
        ))]
    );
    assert_eq!(
        published,
        vec![
            PathBuf::from(format!(
                "{KUBELET}/pods/uid-1/volumes/kubernetes.io~csi/pvc-1/mount"
            )),
            PathBuf::from(format!(
                "{KUBELET}/pods/uid-2/volumes/kubernetes.io~csi/pvc-1/mount"
            )),
        ]
    );
    // A raw block volume: its device node bound at kubelet's publish path.
    let (staged, published) = mounts_of(&table, nix::sys::stat::makedev(7, 4), Path::new("/loop4"));
    assert!(staged.is_empty());
    assert_eq!(
        published,
        vec![PathBuf::from(format!(
            "{KUBELET}/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-2/uid-3"
        ))]
    );
    // Nothing mounted.
    let (staged, published) = mounts_of(&table, nix::sys::stat::makedev(7, 9), Path::new("/loop9"));
    assert!(staged.is_empty() && published.is_empty());
}

#[test]
fn publish_paths_follow_kubelet_layout() {
    assert!(is_publish_path(Path::new(
        "/k/pods/u/volumes/kubernetes.io~csi/p/mount"
    )));
    assert!(is_publish_path(Path::new(
        "/k/pods/u/volumeDevices/kubernetes.io~csi/p"
    )));
    assert!(is_publish_path(Path::new(
        "/k/plugins/kubernetes.io/csi/volumeDevices/publish/p/u"
    )));
    assert!(!is_publish_path(Path::new(
        "/k/plugins/kubernetes.io/csi/d/h/globalmount"
    )));
    assert!(!is_publish_path(Path::new("/pods")));
    assert!(!is_publish_path(Path::new("/tmp/volumes/x")));
}

#[test]
fn listing_fills_class_size_and_claim() {
    let volume = csi::Volume {
        capacity_bytes: 1 << 30,
        volume_id: "fast.pvc-1".into(),
        volume_context: HashMap::from([
            (PARAM_DEVICE_CLASS.to_string(), "fast".to_string()),
            (PARAM_PVC_NAME.to_string(), "data".to_string()),
            (PARAM_PVC_NAMESPACE.to_string(), "apps".to_string()),
        ]),
        content_source: None,
        accessible_topology: Vec::new(),
    };
    let status = from_listing(&volume);
    assert_eq!(status.device_class.as_deref(), Some("fast"));
    assert_eq!(status.size_bytes, 1 << 30);
    assert_eq!(
        status.pvc,
        Some(ObjectName {
            namespace: "apps".into(),
            name: "data".into()
        })
    );
    let bare = from_listing(&csi::Volume {
        volume_context: HashMap::from([(PARAM_PVC_NAME.to_string(), "data".to_string())]),
        ..volume
    });
    assert_eq!(bare.pvc, None, "a claim needs its namespace");
    assert_eq!(bare.device_class, None);
}

fn report() -> StatusReport {
    StatusReport {
        node: "node-1".into(),
        known_since: None,
        volumes: vec![
            VolumeStatus {
                id: "fast.pvc-1".into(),
                device_class: Some("fast".into()),
                size_bytes: 3 << 29,
                used_bytes: Some(24 << 20),
                mode: Some("filesystem"),
                encryption: Some("luks2"),
                device: Some("/dev/loop3".into()),
                staged_paths: vec!["/s/globalmount".into()],
                published_paths: vec!["/p/1/mount".into(), "/p/2/mount".into()],
                pvc: Some(ObjectName {
                    namespace: "apps".into(),
                    name: "data".into(),
                }),
                pods: Vec::new(),
                last_reclaim: None,
                resize_state: None,
                condition: None,
            },
            VolumeStatus {
                id: "fast.pvc-2".into(),
                device_class: Some("fast".into()),
                size_bytes: 1 << 20,
                used_bytes: None,
                mode: Some("block"),
                encryption: None,
                device: None,
                staged_paths: Vec::new(),
                published_paths: Vec::new(),
                pvc: None,
                pods: Vec::new(),
                last_reclaim: None,
                resize_state: None,
                condition: None,
            },
        ],
        snapshots: Vec::new(),
    }
}

#[test]
fn table_has_a_row_per_volume_and_dashes_for_unknowns() {
    let mut report = report();
    report.volumes[0].condition = Some(ConditionStatus {
        abnormal: true,
        message: "its ext4 filesystem recorded 1 error since its last fsck (on /dev/loop3)".into(),
    });
    let text = render_table(&report);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "NODE node-1");
    let header: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        header,
        [
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
            "HEALTH"
        ]
    );
    let first: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        first,
        [
            "fast.pvc-1",
            "fast",
            "1.5Gi",
            "24Mi",
            "/s/globalmount",
            "/p/1/mount,/p/2/mount",
            "apps/data",
            "-",
            "-",
            "-",
            "luks2",
            "abnormal"
        ]
    );
    let second: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(
        second,
        [
            "fast.pvc-2",
            "fast",
            "1Mi",
            "-",
            "-",
            "-",
            "-",
            "-",
            "-",
            "-",
            "-",
            "-"
        ]
    );
    // Columns line up: every row's second column starts where the header's does.
    let column = lines[1].find("CLASS").unwrap();
    assert_eq!(lines[2].find("fast ").unwrap(), column);
    // Why the abnormal one is, below the table.
    assert_eq!(
        lines[4],
        "ABNORMAL fast.pvc-1: its ext4 filesystem recorded 1 error since its last fsck (on /dev/loop3)"
    );
    assert_eq!(lines.len(), 5);
}

#[test]
fn json_has_nulls_for_what_is_not_known() {
    let value = serde_json::to_value(report()).unwrap();
    let second = &value["volumes"][1];
    for field in [
        "used_bytes",
        "device",
        "pvc",
        "last_reclaim",
        "resize_state",
        "condition",
    ] {
        assert!(second[field].is_null(), "{field}: {second}");
    }
    assert_eq!(second["staged_paths"], serde_json::json!([]));
    assert_eq!(second["pods"], serde_json::json!([]));
    let first = &value["volumes"][0];
    assert_eq!(
        first["pvc"],
        serde_json::json!({"namespace": "apps", "name": "data"})
    );
    assert_eq!(first["used_bytes"], 24 << 20);
    assert_eq!(first["mode"], "filesystem");
}

#[test]
fn sizes_read_like_kubernetes_quantities() {
    assert_eq!(human_bytes(0), "0");
    assert_eq!(human_bytes(1023), "1023");
    assert_eq!(human_bytes(1024), "1Ki");
    assert_eq!(human_bytes(3 << 29), "1.5Gi");
    assert_eq!(human_bytes(100 << 30), "100Gi");
    assert_eq!(human_bytes(5 << 40), "5Ti");
}

const NOW: i64 = 1_750_000_000;

fn pb_object(namespace: &str, name: &str) -> Option<pb::ObjectName> {
    Some(pb::ObjectName {
        namespace: namespace.into(),
        name: name.into(),
    })
}

/// The daemon's answer for fast.pvc-1: two pods, a reclaim 5 minutes ago, a failed
/// node expansion 30 seconds ago.
fn daemon_state() -> pb::VolumeState {
    let mut reclaim = pb::Reclaim {
        finished_unix_seconds: NOW - 300,
        reclaimed_bytes: 12 << 20,
        trimmed_bytes: 40 << 20,
        ..Default::default()
    };
    reclaim.set_result(pb::reclaim::Result::Trimmed);
    let mut resize = pb::Resize {
        updated_unix_seconds: NOW - 30,
        step: "node".into(),
        size_bytes: 2 << 30,
        reason: "resize2fs /dev/loop3: exit 1: resize2fs 1.47.0\n  Permission denied\n".into(),
        ..Default::default()
    };
    resize.set_state(pb::resize::State::Failed);
    pb::VolumeState {
        volume_id: "fast.pvc-1".into(),
        pvc: pb_object("apps", "from-publish"),
        publications: vec![
            pb::Publication {
                target_path: "/p/2/mount".into(),
                pod: pb_object("apps", "web-1"),
            },
            pb::Publication {
                target_path: "/p/1/mount".into(),
                pod: pb_object("apps", "web-0"),
            },
            // kubelet without podInfoOnMount: a publication with no pod.
            pb::Publication {
                target_path: "/p/3/mount".into(),
                pod: None,
            },
        ],
        last_reclaim: Some(reclaim),
        resize: Some(resize),
    }
}

#[test]
fn the_daemon_state_fills_pods_reclaim_and_resize() {
    let mut report = report();
    add_daemon_state(&mut report.volumes[0], &daemon_state());
    let v = &report.volumes[0];
    assert_eq!(
        v.pvc.as_ref().map(|c| c.name.as_str()),
        Some("data"),
        "the listing's claim wins"
    );
    let pods: Vec<&str> = v.pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(pods, ["web-0", "web-1"]);
    assert_eq!(
        v.last_reclaim,
        Some(ReclaimStatus {
            finished_at: "2025-06-15T15:01:40Z".into(),
            result: "trimmed",
            reclaimed_bytes: Some(12 << 20),
            trimmed_bytes: Some(40 << 20),
            error: None,
        })
    );
    let resize = v.resize_state.as_ref().unwrap();
    assert_eq!((resize.state, resize.step.as_str()), ("failed", "node"));
    assert_eq!(
        resize.reason.as_deref(),
        Some("resize2fs /dev/loop3: exit 1: resize2fs 1.47.0\n  Permission denied\n"),
        "JSON keeps the message as it is"
    );

    // A volume the listing knows no claim of takes the publish request's.
    let mut bare = report.volumes[1].clone();
    add_daemon_state(&mut bare, &pb::VolumeState::default());
    assert_eq!(bare.pvc, None);
    assert!(bare.pods.is_empty() && bare.last_reclaim.is_none() && bare.resize_state.is_none());
    add_daemon_state(&mut bare, &daemon_state());
    assert_eq!(bare.pvc.unwrap().name, "from-publish");

    let now = Timestamp::from_second(NOW).unwrap();
    let text = render_table_at(&report, now);
    let lines: Vec<&str> = text.lines().collect();
    let column = |name: &str| lines[1].find(name).unwrap();
    let row = lines[2];
    assert_eq!(
        row[column("POD")..column("LAST-RECLAIM")].trim_end(),
        "apps/web-0,apps/web-1"
    );
    assert_eq!(
        row[column("LAST-RECLAIM")..column("RESIZE")].trim_end(),
        "ok 12Mi (5m ago)"
    );
    assert_eq!(
        row[column("RESIZE")..column("ENCRYPTION")].trim_end(),
        "failed to 2Gi (node, 30s ago): resize2fs /dev/loop3: exit 1: resize2fs 1.47.0; Permission denied"
    );
    assert_eq!(lines.len(), 4, "one line per volume:\n{text}");
    let value = serde_json::to_value(&report).unwrap();
    assert_eq!(
        value["volumes"][0]["pods"],
        serde_json::json!([
            {"namespace": "apps", "name": "web-0"},
            {"namespace": "apps", "name": "web-1"}
        ])
    );
    assert_eq!(value["volumes"][0]["last_reclaim"]["reclaimed_bytes"], 12 << 20);
    assert_eq!(value["volumes"][0]["resize_state"]["state"], "failed");
}

#[test]
fn reclaim_and_resize_cells_say_what_happened_and_when() {
    let now = Timestamp::from_second(NOW).unwrap();
    let at = |secs_ago: i64| rfc3339(NOW - secs_ago);
    let reclaim = |result, error: Option<&str>| ReclaimStatus {
        finished_at: at(7200),
        result,
        reclaimed_bytes: None,
        trimmed_bytes: None,
        error: error.map(str::to_string),
    };
    assert_eq!(
        reclaim_cell(&reclaim("not_discarded", None), now),
        "skipped: raw block (2h ago)"
    );
    assert_eq!(
        reclaim_cell(&reclaim("failed", Some("FITRIM: EIO")), now),
        "failed (2h ago)"
    );
    let resize = |state, secs_ago| ResizeStatus {
        updated_at: at(secs_ago),
        state,
        step: "controller".into(),
        size_bytes: 1 << 30,
        reason: None,
    };
    assert_eq!(
        resize_cell(&resize("in_progress", 5), now),
        "expanding to 1Gi (controller, 5s ago)"
    );
    assert_eq!(
        resize_cell(&resize("node_expansion_pending", 600), now),
        "1Gi, node expansion pending (10m ago)"
    );
    assert_eq!(resize_cell(&resize("done", 3 * 86_400), now), "done 1Gi (3d ago)");
}

fn listed_snapshot(id: &str, source: &str, seconds: i64) -> csi::Snapshot {
    csi::Snapshot {
        snapshot_id: id.into(),
        source_volume_id: source.into(),
        size_bytes: 64 << 20,
        creation_time: Some(prost_types::Timestamp {
            seconds,
            nanos: 500_000_000,
        }),
        ready_to_use: true,
        ..Default::default()
    }
}

#[test]
fn snapshots_are_listed_per_class_with_source_size_and_creation_time() {
    let at = 1_795_000_000; // 2026-11-18T11:06:40Z
    let listed = [
        listed_snapshot("snapshot.slow.snap-b", "slow.pvc-2", at),
        listed_snapshot("snapshot.fast.snap-z", "fast.pvc-1", at + 60),
        listed_snapshot("snapshot.fast.snap-a", "fast.pvc-1", at + 120),
    ];
    let snapshots = sorted_snapshots(listed.iter().map(from_snapshot).collect());
    let ids: Vec<&str> = snapshots.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "snapshot.fast.snap-a",
            "snapshot.fast.snap-z",
            "snapshot.slow.snap-b"
        ],
        "ordered by class, then id"
    );
    assert_eq!(
        snapshots[2],
        SnapshotStatus {
            id: "snapshot.slow.snap-b".into(),
            device_class: Some("slow".into()),
            source_volume_id: "slow.pvc-2".into(),
            size_bytes: 64 << 20,
            created_at: Some("2026-11-18T11:06:40.5Z".into()),
            ready_to_use: true,
        }
    );
    // Not an id localvol makes: no class rather than a guess.
    let foreign = from_snapshot(&listed_snapshot("other-driver-id", "x", at));
    assert_eq!(foreign.device_class, None);
    let untimed = from_snapshot(&csi::Snapshot {
        creation_time: None,
        ..listed[0].clone()
    });
    assert_eq!(untimed.created_at, None);

    let mut report = report();
    report.snapshots = snapshots;
    let value = serde_json::to_value(&report).unwrap();
    assert_eq!(
        value["snapshots"][0],
        serde_json::json!({
            "id": "snapshot.fast.snap-a",
            "device_class": "fast",
            "source_volume_id": "fast.pvc-1",
            "size_bytes": 64 << 20,
            "created_at": "2026-11-18T11:08:40.5Z",
            "ready_to_use": true,
        })
    );

    let now: Timestamp = "2026-11-18T11:11:40Z".parse().unwrap();
    let text = render_table_at(&report, now);
    let lines: Vec<&str> = text.lines().collect();
    // The volume table as before, a blank line, then the snapshots.
    assert_eq!(lines.len(), 4 + 1 + 1 + 3, "{text}");
    assert_eq!(lines[4], "");
    let header: Vec<&str> = lines[5].split_whitespace().collect();
    assert_eq!(header, ["SNAPSHOT", "CLASS", "SOURCE", "SIZE", "CREATED"]);
    let first: Vec<&str> = lines[6].split_whitespace().collect();
    assert_eq!(
        first,
        [
            "snapshot.fast.snap-a",
            "fast",
            "fast.pvc-1",
            "64Mi",
            "2026-11-18T11:08:40Z",
            "(3m",
            "ago)"
        ]
    );
    assert!(lines[8].starts_with("snapshot.slow.snap-b  slow "), "{text}");
    assert!(lines[8].ends_with("2026-11-18T11:06:40Z (5m ago)"), "{text}");
}

#[test]
fn no_snapshot_table_without_snapshots() {
    let text = render_table(&report());
    assert!(!text.contains("SNAPSHOT"), "{text}");
    assert_eq!(
        serde_json::to_value(report()).unwrap()["snapshots"],
        serde_json::json!([])
    );
}
