use std::collections::HashMap;

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
        Some(ClaimName {
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
        volumes: vec![
            VolumeStatus {
                id: "fast.pvc-1".into(),
                device_class: Some("fast".into()),
                size_bytes: 3 << 29,
                used_bytes: Some(24 << 20),
                mode: Some("filesystem"),
                device: Some("/dev/loop3".into()),
                staged_paths: vec!["/s/globalmount".into()],
                published_paths: vec!["/p/1/mount".into(), "/p/2/mount".into()],
                pvc: Some(ClaimName {
                    namespace: "apps".into(),
                    name: "data".into(),
                }),
                pod: None,
                last_reclaim: None,
                resize_state: None,
            },
            VolumeStatus {
                id: "fast.pvc-2".into(),
                device_class: Some("fast".into()),
                size_bytes: 1 << 20,
                used_bytes: None,
                mode: Some("block"),
                device: None,
                staged_paths: Vec::new(),
                published_paths: Vec::new(),
                pvc: None,
                pod: None,
                last_reclaim: None,
                resize_state: None,
            },
        ],
    }
}

#[test]
fn table_has_a_row_per_volume_and_dashes_for_unknowns() {
    let text = render_table(&report());
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
            "RESIZE"
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
            "-"
        ]
    );
    let second: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(
        second,
        ["fast.pvc-2", "fast", "1Mi", "-", "-", "-", "-", "-", "-", "-"]
    );
    // Columns line up: every row's second column starts where the header's does.
    let column = lines[1].find("CLASS").unwrap();
    assert_eq!(lines[2].find("fast ").unwrap(), column);
    assert_eq!(lines.len(), 4);
}

#[test]
fn json_has_nulls_for_what_is_not_known() {
    let value = serde_json::to_value(report()).unwrap();
    let second = &value["volumes"][1];
    for field in [
        "used_bytes",
        "device",
        "pvc",
        "pod",
        "last_reclaim",
        "resize_state",
    ] {
        assert!(second[field].is_null(), "{field}: {second}");
    }
    assert_eq!(second["staged_paths"], serde_json::json!([]));
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
