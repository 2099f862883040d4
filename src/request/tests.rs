//! The table of malformed requests: each is refused at the edge with the right code.

use std::collections::HashMap;
use std::path::Path;

use tonic::Code;

use super::*;
use crate::error::Error;
use crate::model::DEFAULT_VOLUME_BYTES;

fn kubelet() -> KubeletRoots {
    KubeletRoots::new(vec!["/var/lib/kubelet".into()])
}

/// Parsing as the daemon does with its default `--kubelet-root-dir`.
trait ParseInKubelet<R>: Sized {
    fn parse_in_kubelet(raw: &R) -> Result<Self, ValidationError>;
}

impl ParseInKubelet<csi::NodeStageVolumeRequest> for StageRequest {
    fn parse_in_kubelet(raw: &csi::NodeStageVolumeRequest) -> Result<Self, ValidationError> {
        Self::parse(raw, &kubelet())
    }
}

impl ParseInKubelet<csi::NodePublishVolumeRequest> for PublishRequest {
    fn parse_in_kubelet(raw: &csi::NodePublishVolumeRequest) -> Result<Self, ValidationError> {
        Self::parse(raw, &kubelet())
    }
}

fn mount_cap(fs: &str, mode: csi::volume_capability::access_mode::Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: fs.to_string(),
                mount_flags: vec![],
                volume_mount_group: String::new(),
            },
        )),
    }
}

fn writer(fs: &str) -> csi::VolumeCapability {
    mount_cap(fs, csi::volume_capability::access_mode::Mode::SingleNodeWriter)
}

fn code<T: std::fmt::Debug>(r: Result<T, ValidationError>) -> Code {
    Error::from(r.expect_err("request must be refused")).code()
}

fn create(name: &str, cap: csi::VolumeCapability, range: Option<(i64, i64)>) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: range.map(|(r, l)| csi::CapacityRange {
            required_bytes: r,
            limit_bytes: l,
        }),
        volume_capabilities: vec![cap],
        ..Default::default()
    }
}

#[test]
fn malformed_create_requests() {
    use csi::volume_capability::access_mode::Mode;
    let cases: Vec<(&str, csi::CreateVolumeRequest, Code)> = vec![
        (
            "empty name",
            create("", writer("ext4"), None),
            Code::InvalidArgument,
        ),
        (
            "huge name",
            create(&"n".repeat(300), writer("ext4"), None),
            Code::InvalidArgument,
        ),
        (
            "unknown fs",
            create("v", writer("btrfs"), None),
            Code::InvalidArgument,
        ),
        (
            "fs with flag injection",
            create("v", writer("ext4 -O ^has_journal"), None),
            Code::InvalidArgument,
        ),
        (
            "multi-node mode",
            create("v", mount_cap("ext4", Mode::MultiNodeMultiWriter), None),
            Code::InvalidArgument,
        ),
        (
            "unknown mode",
            create("v", mount_cap("ext4", Mode::Unknown), None),
            Code::InvalidArgument,
        ),
        (
            "negative size",
            create("v", writer("ext4"), Some((-1, 0))),
            Code::InvalidArgument,
        ),
        (
            "limit below required",
            create("v", writer("ext4"), Some((10, 5))),
            Code::InvalidArgument,
        ),
        (
            "absurd size",
            create("v", writer("ext4"), Some((i64::MAX, 0))),
            Code::OutOfRange,
        ),
        (
            "no capabilities",
            csi::CreateVolumeRequest {
                name: "v".into(),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "unknown parameter",
            csi::CreateVolumeRequest {
                parameters: HashMap::from([("colour".to_string(), "red".to_string())]),
                ..create("v", writer("ext4"), None)
            },
            Code::InvalidArgument,
        ),
        (
            "bad device class",
            csi::CreateVolumeRequest {
                parameters: HashMap::from([(PARAM_DEVICE_CLASS.to_string(), "../x".to_string())]),
                ..create("v", writer("ext4"), None)
            },
            Code::InvalidArgument,
        ),
        (
            "clone source",
            csi::CreateVolumeRequest {
                volume_content_source: Some(csi::VolumeContentSource { r#type: None }),
                ..create("v", writer("ext4"), None)
            },
            Code::InvalidArgument,
        ),
    ];
    for (what, req, expected) in cases {
        assert_eq!(code(CreateRequest::try_from(&req)), expected, "{what}");
    }
}

#[test]
fn encryption_parameters() {
    let with = |pairs: &[(&str, &str)]| {
        let req = csi::CreateVolumeRequest {
            parameters: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..create("v", writer("ext4"), None)
        };
        CreateRequest::try_from(&req)
    };
    assert_eq!(with(&[]).unwrap().encryption, None);
    assert_eq!(
        with(&[(PARAM_ENCRYPTION, "luks2")]).unwrap().encryption,
        Some(Encryption {
            allow_discards: false
        })
    );
    assert_eq!(
        with(&[(PARAM_ENCRYPTION, "luks2"), (PARAM_ENCRYPTION_DISCARDS, "true")])
            .unwrap()
            .encryption,
        Some(Encryption { allow_discards: true })
    );
    for (what, pairs) in [
        ("another format", &[(PARAM_ENCRYPTION, "luks1")][..]),
        ("empty", &[(PARAM_ENCRYPTION, "")][..]),
        ("discards alone", &[(PARAM_ENCRYPTION_DISCARDS, "true")][..]),
        (
            "discards not a bool",
            &[(PARAM_ENCRYPTION, "luks2"), (PARAM_ENCRYPTION_DISCARDS, "yes")][..],
        ),
    ] {
        let err = with(pairs).unwrap_err();
        assert_eq!(code(Err::<(), _>(err.clone())), Code::InvalidArgument, "{what}");
        assert!(
            err.to_string().contains("localvol.csi.dev/encryption"),
            "{what}: {err}"
        );
    }
}

#[test]
fn the_passphrase_comes_from_the_stage_secret_and_never_shows() {
    let roots = KubeletRoots::new(vec!["/var/lib/kubelet".into()]);
    let stage = |secrets: &[(&str, &str)]| csi::NodeStageVolumeRequest {
        volume_id: "default.v".into(),
        staging_target_path: "/var/lib/kubelet/plugins/x/globalmount".into(),
        volume_capability: Some(writer("ext4")),
        secrets: secrets
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    let parsed = StageRequest::parse(&stage(&[("passphrase", "hunter22")]), &roots).unwrap();
    assert_eq!(parsed.passphrase, crate::crypt::Passphrase::new(b"hunter22"));
    assert!(!format!("{parsed:?}").contains("hunter22"));
    for secrets in [&[][..], &[("passphrase", "")][..], &[("password", "x")][..]] {
        assert_eq!(
            StageRequest::parse(&stage(secrets), &roots).unwrap().passphrase,
            None
        );
    }
}

#[test]
fn malformed_node_paths_and_ids() {
    let stage = |id: &str, path: &str| csi::NodeStageVolumeRequest {
        volume_id: id.to_string(),
        staging_target_path: path.to_string(),
        volume_capability: Some(writer("ext4")),
        ..Default::default()
    };
    let cases = [
        (
            "empty id",
            stage("", "/var/lib/kubelet/stage"),
            Code::InvalidArgument,
        ),
        (
            "id with slash",
            stage("default.../../etc", "/var/lib/kubelet/stage"),
            Code::InvalidArgument,
        ),
        (
            "id with NUL",
            stage("default.a\0b", "/var/lib/kubelet/stage"),
            Code::InvalidArgument,
        ),
        (
            "foreign id",
            stage("fake-vol-id", "/var/lib/kubelet/stage"),
            Code::NotFound,
        ),
        ("empty path", stage("default.pvc-1", ""), Code::InvalidArgument),
        (
            "relative path",
            stage("default.pvc-1", "var/lib/x"),
            Code::InvalidArgument,
        ),
        (
            "escaping path",
            stage("default.pvc-1", "/var/lib/../../etc"),
            Code::InvalidArgument,
        ),
        (
            "dot path",
            stage("default.pvc-1", "/var/./lib"),
            Code::InvalidArgument,
        ),
        (
            "double slash",
            stage("default.pvc-1", "/var//lib"),
            Code::InvalidArgument,
        ),
        ("root", stage("default.pvc-1", "/"), Code::InvalidArgument),
        (
            "outside the roots",
            stage("default.pvc-1", "/etc"),
            Code::InvalidArgument,
        ),
        (
            "a root itself",
            stage("default.pvc-1", "/var/lib/kubelet"),
            Code::InvalidArgument,
        ),
        (
            "a sibling of a root",
            stage("default.pvc-1", "/var/lib/kubelet2/x"),
            Code::InvalidArgument,
        ),
        (
            "NUL in path",
            stage("default.pvc-1", "/a\0b"),
            Code::InvalidArgument,
        ),
        (
            "overlong path",
            stage("default.pvc-1", &format!("/{}", "a/".repeat(3000))),
            Code::InvalidArgument,
        ),
    ];
    for (what, req, expected) in cases {
        assert_eq!(code(StageRequest::parse_in_kubelet(&req)), expected, "{what}");
    }
    // A foreign id with a missing argument is reported as the missing argument.
    assert_eq!(
        code(StageRequest::parse_in_kubelet(&stage("fake-vol-id", ""))),
        Code::InvalidArgument
    );
}

#[test]
fn good_requests_convert() {
    let req = StageRequest::parse_in_kubelet(&csi::NodeStageVolumeRequest {
        volume_id: "default.pvc-1".into(),
        staging_target_path: "/var/lib/kubelet/plugins/x/globalmount/".into(),
        volume_capability: Some(writer("xfs")),
        volume_context: HashMap::from([
            ("csi.storage.k8s.io/pvc/name".to_string(), "data".to_string()),
            ("csi.storage.k8s.io/pvc/namespace".to_string(), "team".to_string()),
        ]),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        req.staging_path.as_path(),
        Path::new("/var/lib/kubelet/plugins/x/globalmount")
    );
    assert_eq!(req.context.claim.pvc_name.as_deref(), Some("data"));
    assert!(matches!(
        req.capability.access,
        AccessType::Mount {
            fs_type: Some(FsType::Xfs),
            ..
        }
    ));
}

#[test]
fn publish_carries_pod_info_and_read_only() {
    use csi::volume_capability::access_mode::Mode;
    let req = PublishRequest::parse_in_kubelet(&csi::NodePublishVolumeRequest {
        volume_id: "default.pvc-1".into(),
        staging_target_path: "/var/lib/kubelet/s".into(),
        target_path: "/var/lib/kubelet/t".into(),
        volume_capability: Some(mount_cap("", Mode::SingleNodeReaderOnly)),
        volume_context: HashMap::from([
            ("csi.storage.k8s.io/pod.name".to_string(), "web-0".to_string()),
            ("csi.storage.k8s.io/pod.namespace".to_string(), "team".to_string()),
            ("csi.storage.k8s.io/pod.uid".to_string(), "u-1".to_string()),
        ]),
        ..Default::default()
    })
    .unwrap();
    assert!(req.read_only, "a reader-only mode publishes read-only");
    assert_eq!(req.context.pod.unwrap().uid, "u-1");
    let inline = csi::NodePublishVolumeRequest {
        volume_context: HashMap::from([("csi.storage.k8s.io/ephemeral".to_string(), "true".to_string())]),
        ..Default::default()
    };
    let inline = csi::NodePublishVolumeRequest {
        volume_id: "default.pvc-1".into(),
        staging_target_path: "/var/lib/kubelet/s".into(),
        target_path: "/var/lib/kubelet/t".into(),
        volume_capability: Some(writer("ext4")),
        ..inline
    };
    assert_eq!(
        code(PublishRequest::parse_in_kubelet(&inline)),
        Code::InvalidArgument
    );
}

#[test]
fn capacity_ranges_round_up_within_limits() {
    let range = |r, l| {
        capacity_range(Some(&csi::CapacityRange {
            required_bytes: r,
            limit_bytes: l,
        }))
        .unwrap()
    };
    assert_eq!(range(1, 0).size_for(1 << 20), Ok(1 << 20));
    assert_eq!(range(0, 0).size_for(1 << 20), Ok(DEFAULT_VOLUME_BYTES));
    assert_eq!(
        range(0, 4 << 20).size_for(1 << 20),
        Ok(4 << 20),
        "a small limit caps the default"
    );
    assert!(matches!(
        range(1, 1000).size_for(1 << 20),
        Err(ValidationError::OutOfRange(_))
    ));
    assert_eq!(
        range(64 << 20, 64 << 20).size_for(1 << 20),
        Ok(64 << 20),
        "exact sizes stay exact"
    );
}

#[test]
fn content_sources_and_snapshot_requests_convert() {
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let from = |t: Type| csi::CreateVolumeRequest {
        volume_content_source: Some(csi::VolumeContentSource { r#type: Some(t) }),
        ..create("v", writer("ext4"), None)
    };
    let snap = from(Type::Snapshot(SnapshotSource {
        snapshot_id: "snapshot.default.s1".into(),
    }));
    assert_eq!(
        CreateRequest::try_from(&snap).unwrap().source,
        Some(ContentSource::Snapshot(
            SnapshotId::parse("snapshot.default.s1").unwrap()
        ))
    );
    let clone = from(Type::Volume(VolumeSource {
        volume_id: "default.v1".into(),
    }));
    assert_eq!(
        CreateRequest::try_from(&clone).unwrap().source,
        Some(ContentSource::Volume(VolumeId::parse("default.v1").unwrap()))
    );
    // CSI: a source that does not exist is NOT_FOUND; one that is malformed is invalid.
    for (id, expected) in [
        ("default.v1", Code::NotFound),
        ("fake-snapshot", Code::NotFound),
        ("a/b", Code::InvalidArgument),
    ] {
        let req = from(Type::Snapshot(SnapshotSource {
            snapshot_id: id.into(),
        }));
        assert_eq!(code(CreateRequest::try_from(&req)), expected, "{id}");
    }

    let snapshot = |name: &str, source: &str| csi::CreateSnapshotRequest {
        source_volume_id: source.into(),
        name: name.into(),
        ..Default::default()
    };
    let ok = SnapshotRequest::try_from(&snapshot("s1", "default.v1")).unwrap();
    assert_eq!(
        (ok.token.as_str(), ok.source.to_string().as_str()),
        ("s1", "default.v1")
    );
    assert_eq!(
        code(SnapshotRequest::try_from(&snapshot("", "default.v1"))),
        Code::InvalidArgument
    );
    assert_eq!(
        code(SnapshotRequest::try_from(&snapshot("s1", ""))),
        Code::InvalidArgument
    );
    assert_eq!(
        code(SnapshotRequest::try_from(&snapshot("s1", "gone"))),
        Code::NotFound
    );
    let with_param = csi::CreateSnapshotRequest {
        parameters: HashMap::from([("typo".to_string(), "x".to_string())]),
        ..snapshot("s1", "default.v1")
    };
    assert_eq!(
        code(SnapshotRequest::try_from(&with_param)),
        Code::InvalidArgument
    );

    let list = |snapshot_id: &str, source_volume_id: &str| csi::ListSnapshotsRequest {
        snapshot_id: snapshot_id.into(),
        source_volume_id: source_volume_id.into(),
        ..Default::default()
    };
    let filter = |r: csi::ListSnapshotsRequest| ListSnapshotsRequest::try_from(&r).unwrap().filter;
    assert_eq!(filter(list("", "")), SnapshotFilter::All);
    assert_eq!(filter(list("unknown", "")), SnapshotFilter::Nothing);
    assert_eq!(filter(list("", "unknown")), SnapshotFilter::Nothing);
    assert_eq!(
        filter(list("", "default.v1")),
        SnapshotFilter::Source(VolumeId::parse("default.v1").unwrap())
    );
    let negative = csi::ListSnapshotsRequest {
        max_entries: -1,
        ..Default::default()
    };
    assert_eq!(
        code(ListSnapshotsRequest::try_from(&negative)),
        Code::InvalidArgument
    );
}
