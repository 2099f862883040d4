//! A node without a configured class's storage: served classes stay served, the missing
//! one offers nothing and says why, and is picked up when its storage appears.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::config::KindConfig;
use crate::host::fake::{FakeCommands, FakeSyscalls};
use crate::host::{CommandError, CommandOutput, FsUsage, Host};
use crate::locks::VolumeLocks;
use crate::metrics::Metrics;
use crate::model::{AccessMode, AccessType, Capability, Token};
use crate::model::{CapacityRange, ClaimRef};
use crate::request::CreateRequest;

const EXTENT: u64 = 4 << 20;

/// lvm as on a node where `vg-late` is absent until `present` is set; then an empty
/// 1 GiB VG. Any other VG is absent.
fn lvm(commands: &FakeCommands, present: &Arc<AtomicBool>) {
    for program in ["vgs", "lvs"] {
        let present = Arc::clone(present);
        commands.on(program, move |cmd| {
            let vg = cmd.args.last().unwrap().to_string_lossy().into_owned();
            if vg != "vg-late" || !present.load(Ordering::SeqCst) {
                return Err(CommandError::Failed {
                    program: cmd.program,
                    args: cmd.args_display(),
                    exit_code: Some(5),
                    stdout: String::new(),
                    stderr: format!("  Volume group \"{vg}\" not found\n"),
                });
            }
            let stdout = if cmd.program == "vgs" {
                format!(
                    r#"{{"report":[{{"vg":[{{"vg_name":"vg-late", "vg_size":"{}", "vg_free":"{}", "vg_extent_size":"{EXTENT}", "vg_tags":""}}]}}]}}"#,
                    1u64 << 30,
                    1u64 << 30
                )
            } else {
                r#"{"report":[{"lv":[]}]}"#.to_string()
            };
            Ok(CommandOutput {
                stdout: stdout.into_bytes(),
                stderr: String::new(),
            })
        });
    }
}

fn classes(dir: &std::path::Path) -> Vec<DeviceClass> {
    let class = |name: &str, kind, default| DeviceClass {
        name: ClassName::parse(name).unwrap(),
        kind,
        default,
        fs_type: None,
        mount_options: Vec::new(),
        luks: Default::default(),
    };
    let thick = |vg: &str| KindConfig::Lvm {
        volume_group: vg.to_string(),
        spare_gb: Some(0),
        stripe: None,
        stripe_size: None,
        lvcreate_options: Vec::new(),
    };
    vec![
        class(
            "files",
            KindConfig::Loop {
                directory: Some(dir.join("loop")),
                capacity_gb: Some(10),
            },
            true,
        ),
        class("ssd", thick("vg-late"), false),
    ]
}

fn host(commands: Arc<FakeCommands>) -> Host {
    let syscalls = FakeSyscalls::default();
    syscalls.set_usage(FsUsage {
        total_bytes: 100 << 30,
        available_bytes: 50 << 30,
        ..FsUsage::default()
    });
    Host {
        commands,
        syscalls: Arc::new(syscalls),
    }
}

fn create_request(class: &str) -> CreateRequest {
    CreateRequest {
        name: "pvc-1".into(),
        token: Token::for_name("pvc-1"),
        capacity: CapacityRange {
            required: 64 << 20,
            limit: None,
        },
        capabilities: vec![Capability {
            access: AccessType::Block,
            mode: AccessMode::SingleNodeWriter,
        }],
        class: Some(ClassName::parse(class).unwrap()),
        claim: ClaimRef::default(),
        topologies: Vec::new(),
        source: None,
        encryption: None,
    }
}

fn available(metrics: &Metrics, class: &str) -> Option<String> {
    let prefix = format!("localvol_device_class_available{{device_class=\"{class}\"}} ");
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
}

#[tokio::test]
async fn a_missing_volume_group_leaves_the_node_serving_and_is_picked_up_when_it_appears() {
    let dir = tempfile::tempdir().unwrap();
    let commands = Arc::new(FakeCommands::default());
    let present = Arc::new(AtomicBool::new(false));
    lvm(&commands, &present);
    let volumes = Volumes::open(&classes(dir.path()), dir.path(), "node-a", host(commands))
        .await
        .expect("a missing VG does not stop start-up");
    let ssd = ClassName::parse("ssd").unwrap();
    let files = ClassName::parse("files").unwrap();

    let missing = volumes.missing_classes();
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert_eq!(missing[0].class, ssd);
    assert!(
        missing[0].reason.contains("volume group vg-late does not exist"),
        "{missing:?}"
    );
    assert_eq!(
        volumes.backends().map(|b| b.class().clone()).collect::<Vec<_>>(),
        vec![files.clone()]
    );
    volumes.check_health().await.expect("still ready");
    assert_eq!(
        volumes.capacity(Some(&ssd), None).await.unwrap(),
        Default::default()
    );
    assert!(volumes.capacity(Some(&files), None).await.unwrap().available > 0);

    // CreateVolume in the missing class: RESOURCE_EXHAUSTED, naming what is missing.
    let locks = VolumeLocks::default();
    let req = create_request("ssd");
    let guard = locks.try_lock(&req.token, "create").unwrap();
    let err = volumes.create(&guard, &req).await.unwrap_err();
    assert!(matches!(err, VolumeError::StorageMissing { .. }), "{err}");
    let status = tonic::Status::from(crate::error::Error::from(err));
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(
        status.message().contains("volume group vg-late does not exist"),
        "{status:?}"
    );
    drop(guard);
    // A call on a volume id of the class: unavailable for now, not "not found".
    let id = crate::model::VolumeId::new(ssd.clone(), Token::for_name("pvc-0"));
    let err = volumes.get(&id).await.unwrap_err();
    let status = tonic::Status::from(crate::error::Error::from(err));
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");

    let metrics = Metrics::new();
    crate::gauges::refresh(&volumes, &metrics, None).await;
    assert_eq!(available(&metrics, "ssd").as_deref(), Some("0"));
    assert_eq!(available(&metrics, "files").as_deref(), Some("1"));

    // The VG appears: the next refresh serves it, without a restart (once the failed
    // report is old enough to be read again).
    present.store(true, Ordering::SeqCst);
    tokio::time::sleep(crate::backend::cache::RETRY_AFTER + std::time::Duration::from_millis(100)).await;
    crate::gauges::refresh(&volumes, &metrics, None).await;
    assert!(
        volumes.missing_classes().is_empty(),
        "{:?}",
        volumes.missing_classes()
    );
    assert_eq!(available(&metrics, "ssd").as_deref(), Some("1"));
    assert!(volumes.missing_classes().is_empty());
    assert_eq!(
        volumes.capacity(Some(&ssd), None).await.unwrap().available,
        1 << 30
    );
    assert_eq!(volumes.open_missing().await, Vec::<ClassName>::new());
}

#[tokio::test]
async fn other_failures_still_stop_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let commands = Arc::new(FakeCommands::default());
    commands.fail(
        "vgs",
        5,
        "  /dev/mapper/control: open failed: Permission denied\n",
    );
    commands.fail(
        "lvs",
        5,
        "  /dev/mapper/control: open failed: Permission denied\n",
    );
    let err = Volumes::open(&classes(dir.path()), dir.path(), "node-a", host(commands))
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("preparing device class ssd"),
        "{err:#}"
    );
}

/// `localvol status` opens the classes beside a running daemon: opening them must leave
/// the daemon's record of staged and published paths alone, a write in flight included.
#[tokio::test]
async fn opening_the_classes_leaves_the_daemons_placed_paths_alone() {
    let dir = tempfile::tempdir().unwrap();
    let commands = Arc::new(FakeCommands::default());
    let present = Arc::new(AtomicBool::new(true));
    lvm(&commands, &present);
    let placed = dir.path().join("placed");
    std::fs::create_dir(&placed).unwrap();
    let in_flight = placed.join(".files.pvc-1.tmp");
    std::fs::write(&in_flight, b"stage /k/stage\n").unwrap();
    Volumes::open(&classes(dir.path()), dir.path(), "node-a", host(commands))
        .await
        .unwrap();
    assert!(in_flight.is_file(), "a write in flight is the daemon's");
}
