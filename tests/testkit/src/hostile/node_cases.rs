//! The node calls of issue 14, one hostile case at a time, each followed by a check
//! that nothing changed: paths outside kubelet's root or through a symlink, a tmpfs that
//! is not a volume, another volume's staging and target paths, a volume's own staging
//! path named as a target and its target as a staging path (issue 33), stats and expand
//! on foreign paths, NodeReclaimSpace (csi-addons) on paths that do not hold the volume,
//! and requests beyond the CSI spec's limits.
//!
//! The backend is a parameter ([`Backend`]): tests/hostile.rs runs the cases on the
//! loop default on the host, tests/hostile_vm.rs on LVM and PMEM in the tests/vm guest.
//! With `LOCALVOL_HOSTILE_KEEP_GOING=1` a failing case is reported and the next one
//! runs; the suite still fails at the end, with the count (used to measure a driver
//! without the checks).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use localvol::proto::csi::v1 as csi;
use localvol::proto::reclaimspace::reclaim_space_node_client::ReclaimSpaceNodeClient;
use tonic::Code;

use super::requests::{
    block_capability, publish, reclaim_req, s, stage, stats_req, unpublish_req, unstage_req,
};
use super::sandbox::{Snapshot, Storage};
use crate::csi_client::NewVolume;
use crate::{CsiClient, InProcessDaemon, connect, create_request, mount_capability};

const MIB: i64 = 1 << 20;

/// Where the suite's volumes live.
pub struct Backend {
    /// For the report: `loop`, `lvm`, `lvm-thin`, ...
    pub name: String,
    /// Extra daemon arguments: a `--config` whose default class is the one under test.
    pub daemon_args: Vec<String>,
    /// What besides mounts, loop devices and files each case must leave unchanged.
    pub storage: Storage,
    /// Whether the device takes discards: FITRIM on PMEM is EOPNOTSUPP, which a
    /// legitimate NodeReclaimSpace answers as FAILED_PRECONDITION.
    pub discards: bool,
}

impl Backend {
    /// The embedded default: one loop class.
    pub fn loop_files() -> Self {
        Self {
            name: "loop".into(),
            daemon_args: Vec::new(),
            storage: Storage::Loop,
            discards: true,
        }
    }
}

struct Suite {
    node: csi::node_client::NodeClient<tonic::transport::Channel>,
    client: CsiClient,
    controller: csi::controller_client::ControllerClient<tonic::transport::Channel>,
    reclaim: ReclaimSpaceNodeClient<tonic::transport::Channel>,
    scratch: PathBuf,
    trees: Vec<PathBuf>,
    storage: Storage,
    cases: usize,
    /// With `LOCALVOL_HOSTILE_KEEP_GOING=1`: the cases that failed, instead of a panic.
    failures: Option<Vec<String>>,
}

impl Suite {
    /// Runs one hostile call: it must fail with `expected` (or succeed when `expected`
    /// is OK) and leave mounts, loop devices and files exactly as they were.
    async fn case<T: std::fmt::Debug>(
        &mut self,
        what: &str,
        expected: Code,
        call: impl AsyncFnOnce(&mut Self) -> Result<T, tonic::Status>,
    ) {
        let before = self.snapshot();
        let result = call(self).await;
        let code = match &result {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        };
        let after = self.snapshot();
        self.cases += 1;
        let Some(failures) = &mut self.failures else {
            assert_eq!(code, expected, "{what}: {result:?}");
            assert_eq!(after, before, "{what} changed the host");
            return;
        };
        let changed = before.diff(&after);
        if code != expected || !changed.is_empty() {
            eprintln!(
                "hostile-case FAIL {what}: {code:?} (expected {expected:?}); {} changes{}",
                changed.len(),
                changed.iter().map(|l| format!("\n    {l}")).collect::<String>()
            );
            failures.push(format!(
                "{what}: {code:?}, expected {expected:?}; {} changes",
                changed.len()
            ));
        }
    }

    fn snapshot(&self) -> Snapshot {
        let trees: Vec<&Path> = self.trees.iter().map(PathBuf::as_path).collect();
        Snapshot::take(&self.scratch, &trees, &self.storage)
    }

    async fn create(&mut self, name: &str, cap: csi::VolumeCapability) -> String {
        let req = NewVolume {
            capability: cap,
            pvc: Some(("ns", name)),
            ..NewVolume::new(name, 32 * MIB)
        };
        self.client.create_id(req.request()).await
    }
}

/// Issue 33: a volume's own staging path named as a target, its target as the staging
/// path, and paths above and below the staging path. The ownership proof passes both of
/// A's paths (a staging mount and a bind of it look alike in the mount table); each call
/// is still refused, and A's staging mount, its publication and the data seen through
/// both stay as they were.
async fn own_paths_in_the_wrong_role(t: &mut Suite, a: &str, b: &str, root: &Path) {
    use Code::{FailedPrecondition as Busy, InvalidArgument as Invalid, Ok as Done};
    let a_stage = root.join("plugins/a/globalmount");
    let a_target = root.join("pods/1/volumes/a/mount");
    let b_stage = root.join("plugins/b");
    t.case("unpublish A at its own staging path", Invalid, async |t| {
        t.node.node_unpublish_volume(unpublish_req(a, s(&a_stage))).await
    })
    .await;
    assert_published(&a_stage, &a_target);
    t.case(
        "unpublish B (raw block) at its own staging directory",
        Invalid,
        async |t| t.node.node_unpublish_volume(unpublish_req(b, s(&b_stage))).await,
    )
    .await;
    t.case("unstage A at its own target", Invalid, async |t| {
        t.node.node_unstage_volume(unstage_req(a, s(&a_target))).await
    })
    .await;
    t.case("stage A at its own target", Invalid, async |t| {
        t.node
            .node_stage_volume(stage(a, &s(&a_target), mount_capability()))
            .await
    })
    .await;
    for (what, target) in [
        ("its staging path", a_stage.clone()),
        ("below its staging path", a_stage.join("a-pod")),
        ("above its staging path", root.join("plugins/a")),
    ] {
        t.case(&format!("publish A at {what}"), Invalid, async |t| {
            t.node
                .node_publish_volume(publish(a, &s(&a_stage), &s(&target), mount_capability()))
                .await
        })
        .await;
    }
    t.case(
        "publish A from its target onto its staging path",
        Invalid,
        async |t| {
            t.node
                .node_publish_volume(publish(a, &s(&a_target), &s(&a_stage), mount_capability()))
                .await
        },
    )
    .await;
    for (what, path) in [
        ("its staging path", a_stage.join("a-empty")),
        ("its target", a_target.join("a-empty")),
    ] {
        t.case(
            &format!("unpublish A at an empty directory of its own below {what}"),
            Invalid,
            async |t| t.node.node_unpublish_volume(unpublish_req(a, s(&path))).await,
        )
        .await;
        t.case(
            &format!("unstage A at an empty directory of its own below {what}"),
            Busy,
            async |t| t.node.node_unstage_volume(unstage_req(a, s(&path))).await,
        )
        .await;
    }
    t.case(
        "unpublish A above its staging path, holding nothing: kept",
        Done,
        async |t| {
            t.node
                .node_unpublish_volume(unpublish_req(a, s(&root.join("plugins/a"))))
                .await
        },
    )
    .await;
    assert_published(&a_stage, &a_target);
}

/// Paths inside volume A (below its staging path or its target) named for volume F: no
/// staging or target path is there, and a stage or publish would make a directory in A's
/// filesystem and mount F over it, an unpublish would remove A's empty directory.
async fn paths_inside_another_volume(t: &mut Suite, f: &str, root: &Path) {
    use Code::InvalidArgument as Invalid;
    let a_stage = root.join("plugins/a/globalmount");
    let a_target = root.join("pods/1/volumes/a/mount");
    let f_stage = root.join("plugins/f/globalmount");
    for (what, path) in [
        ("below A's staging path", a_stage.join("a-empty")),
        ("below A's target", a_target.join("a-empty")),
    ] {
        t.case(
            &format!("unpublish F at an empty directory of A's {what}"),
            Invalid,
            async |t| t.node.node_unpublish_volume(unpublish_req(f, s(&path))).await,
        )
        .await;
    }
    let inside = a_target.join("f");
    t.case("stage F inside A's target", Invalid, async |t| {
        t.node
            .node_stage_volume(stage(f, &s(&inside), mount_capability()))
            .await
    })
    .await;
    t.case("publish F inside A's target", Invalid, async |t| {
        t.node
            .node_publish_volume(publish(f, &s(&f_stage), &s(&inside), mount_capability()))
            .await
    })
    .await;
    assert_published(&a_stage, &a_target);
}

/// A's staging mount and its publication are both in place, each showing A's data.
fn assert_published(stage: &Path, target: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for path in [stage, target] {
        let field = format!(" {} ", s(path));
        assert!(
            mounts.lines().any(|l| l.contains(&field)),
            "{path:?} is not mounted:\n{mounts}"
        );
        assert_eq!(
            std::fs::read(path.join("a-data")).unwrap(),
            b"tenant a",
            "{path:?}"
        );
    }
}

pub async fn run(scratch: PathBuf, backend: Backend) {
    let started = std::time::Instant::now();
    let root = scratch.join("kubelet");
    std::fs::create_dir_all(&root).unwrap();
    let mut args = vec!["--kubelet-root-dir", root.to_str().unwrap()];
    args.extend(backend.daemon_args.iter().map(String::as_str));
    let d = InProcessDaemon::start(&args).await;
    let keep_going = std::env::var("LOCALVOL_HOSTILE_KEEP_GOING").as_deref() == Ok("1");
    let mut t = Suite {
        node: d.node().await,
        client: d.client().await,
        controller: d.controller().await,
        reclaim: ReclaimSpaceNodeClient::new(connect(&d.addons_socket).await),
        trees: vec![root.clone(), d.data_dir()],
        scratch: scratch.clone(),
        storage: backend.storage.clone(),
        cases: 0,
        failures: keep_going.then(Vec::new),
    };
    // The baseline: A staged and published, F staged, B (raw block) published, a tmpfs
    // that is no volume, a directory with content, a symlink out of the root.
    let a = t.create("pvc-a", mount_capability()).await;
    let f = t.create("pvc-f", mount_capability()).await;
    let class = f.split('.').next().unwrap().to_string();
    let b = t.create("pvc-b", block_capability()).await;
    let a_stage = root.join("plugins/a/globalmount");
    let a_target = root.join("pods/1/volumes/a/mount");
    let f_stage = root.join("plugins/f/globalmount");
    let b_target = root.join("pods/2/volumeDevices/b");
    let tmpfs = root.join("pods/3/volumes/tmpfs");
    let full = root.join("pods/4/volumes/full");
    std::fs::create_dir_all(&tmpfs).unwrap();
    std::fs::create_dir_all(&full).unwrap();
    // kubelet makes a raw block target's parent; publish makes the target file.
    std::fs::create_dir_all(b_target.parent().unwrap()).unwrap();
    std::fs::write(full.join("data"), b"kept").unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &tmpfs,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    std::os::unix::fs::symlink("/etc", root.join("etc-link")).unwrap();
    std::os::unix::fs::symlink(root.join("plugins"), root.join("plugins-link")).unwrap();
    let node = &mut t.node;
    node.node_stage_volume(stage(&a, &s(&a_stage), mount_capability()))
        .await
        .unwrap();
    node.node_publish_volume(publish(&a, &s(&a_stage), &s(&a_target), mount_capability()))
        .await
        .unwrap();
    std::fs::write(a_target.join("a-data"), b"tenant a").unwrap();
    // An empty directory of tenant A's, seen at both of A's paths.
    std::fs::create_dir(a_target.join("a-empty")).unwrap();
    node.node_stage_volume(stage(&f, &s(&f_stage), mount_capability()))
        .await
        .unwrap();
    // kubelet makes a raw block staging directory; staging only attaches the device.
    std::fs::create_dir_all(root.join("plugins/b")).unwrap();
    node.node_stage_volume(stage(&b, &s(&root.join("plugins/b")), block_capability()))
        .await
        .unwrap();
    node.node_publish_volume(publish(
        &b,
        &s(&root.join("plugins/b")),
        &s(&b_target),
        block_capability(),
    ))
    .await
    .unwrap();

    use Code::{FailedPrecondition as Busy, InvalidArgument as Invalid, NotFound, Ok as Done};
    // Confinement: outside the root, the root itself, `..`, relative, symlinks, NUL.
    let outside = [
        "/etc".to_string(),
        "/dev".into(),
        "/proc".into(),
        "/".into(),
        s(&root),
        format!("{}/../../etc", s(&root)),
        format!("{}/plugins/../../x", s(&root)),
        "kubelet/plugins/x".into(),
        format!("{}/x\0y", s(&root)),
        format!("{}/x\ny", s(&root)),
    ];
    for path in &outside {
        t.case(&format!("stage at {path:?}"), Invalid, async |t| {
            t.node
                .node_stage_volume(stage(&f, path, mount_capability()))
                .await
        })
        .await;
        t.case(&format!("publish at {path:?}"), Invalid, async |t| {
            t.node
                .node_publish_volume(publish(&f, &s(&f_stage), path, mount_capability()))
                .await
        })
        .await;
        t.case(&format!("unpublish at {path:?}"), Invalid, async |t| {
            t.node
                .node_unpublish_volume(unpublish_req(&f, path.clone()))
                .await
        })
        .await;
        t.case(&format!("unstage at {path:?}"), Invalid, async |t| {
            t.node.node_unstage_volume(unstage_req(&f, path.clone())).await
        })
        .await;
    }
    for path in [
        root.join("etc-link/x"),
        root.join("etc-link"),
        root.join("plugins-link/a/globalmount"),
    ] {
        t.case(&format!("stage through symlink {path:?}"), Invalid, async |t| {
            t.node
                .node_stage_volume(stage(&f, &s(&path), mount_capability()))
                .await
        })
        .await;
        t.case(
            &format!("unpublish through symlink {path:?}"),
            Invalid,
            async |t| t.node.node_unpublish_volume(unpublish_req(&a, s(&path))).await,
        )
        .await;
    }

    // Ownership: what is mounted at a path is proven to be the named volume.
    for (what, path) in [
        ("a tmpfs", &tmpfs),
        ("A's staging path", &a_stage),
        ("A's target", &a_target),
    ] {
        t.case(&format!("stage F at {what}"), Busy, async |t| {
            t.node
                .node_stage_volume(stage(&f, &s(path), mount_capability()))
                .await
        })
        .await;
        t.case(&format!("unpublish F at {what}"), Busy, async |t| {
            t.node.node_unpublish_volume(unpublish_req(&f, s(path))).await
        })
        .await;
        t.case(&format!("unstage F at {what}"), Busy, async |t| {
            t.node.node_unstage_volume(unstage_req(&f, s(path))).await
        })
        .await;
        t.case(&format!("stats of F at {what}"), NotFound, async |t| {
            t.node.node_get_volume_stats(stats_req(&f, s(path))).await
        })
        .await;
        t.case(&format!("expand F at {what}"), NotFound, async |t| {
            let req = csi::NodeExpandVolumeRequest {
                volume_id: f.clone(),
                volume_path: s(path),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: 64 * MIB,
                    limit_bytes: 0,
                }),
                ..Default::default()
            };
            t.node.node_expand_volume(req).await
        })
        .await;
    }
    t.case("publish F from A's staging path", Busy, async |t| {
        let target = root.join("pods/5/volumes/f/mount");
        t.node
            .node_publish_volume(publish(&f, &s(&a_stage), &s(&target), mount_capability()))
            .await
    })
    .await;
    t.case("publish F onto A's target", Busy, async |t| {
        t.node
            .node_publish_volume(publish(&f, &s(&f_stage), &s(&a_target), mount_capability()))
            .await
    })
    .await;
    t.case(
        "publish F over the pods directory (mounts below)",
        Busy,
        async |t| {
            t.node
                .node_publish_volume(publish(
                    &f,
                    &s(&f_stage),
                    &s(&root.join("pods")),
                    mount_capability(),
                ))
                .await
        },
    )
    .await;
    t.case(
        "stage F over the plugins directory (mounts below)",
        Busy,
        async |t| {
            t.node
                .node_stage_volume(stage(&f, &s(&root.join("plugins")), mount_capability()))
                .await
        },
    )
    .await;
    t.case("unpublish F at B's block target", Busy, async |t| {
        t.node
            .node_unpublish_volume(unpublish_req(&f, s(&b_target)))
            .await
    })
    .await;
    t.case("publish B's device onto A's target", Busy, async |t| {
        t.node
            .node_publish_volume(publish(
                &b,
                &s(&root.join("plugins/b")),
                &s(&a_target),
                block_capability(),
            ))
            .await
    })
    .await;
    t.case(
        "unstage A from a path holding nothing while A is in use",
        Busy,
        async |t| {
            t.node
                .node_unstage_volume(unstage_req(&a, s(&root.join("nothing"))))
                .await
        },
    )
    .await;
    own_paths_in_the_wrong_role(&mut t, &a, &b, &root).await;
    // What tells A's staging path from its target is kept across a restart of the
    // daemon, with A staged and published: the same calls are refused again.
    let d = {
        let dir = d.stop().await;
        let d = InProcessDaemon::start_in(dir, &args).await;
        t.node = d.node().await;
        t.client = d.client().await;
        t.controller = d.controller().await;
        t.reclaim = ReclaimSpaceNodeClient::new(connect(&d.addons_socket).await);
        d
    };
    own_paths_in_the_wrong_role(&mut t, &a, &b, &root).await;
    paths_inside_another_volume(&mut t, &f, &root).await;
    t.case(
        "unpublish F at a directory with content, holding nothing: kept",
        Done,
        async |t| t.node.node_unpublish_volume(unpublish_req(&f, s(&full))).await,
    )
    .await;
    t.case("stats of F at a missing path", NotFound, async |t| {
        t.node
            .node_get_volume_stats(stats_req(&f, s(&root.join("missing"))))
            .await
    })
    .await;
    for path in ["/etc", "/proc", "relative/path"] {
        t.case(&format!("stats of F at {path}"), NotFound, async |t| {
            t.node.node_get_volume_stats(stats_req(&f, path)).await
        })
        .await;
    }

    // NodeReclaimSpace (csi-addons): its paths are confined and must hold the volume.
    let f_stage_s = s(&f_stage);
    for path in &outside {
        t.case(&format!("reclaim F at {path:?}"), Invalid, async |t| {
            t.reclaim.node_reclaim_space(reclaim_req(&f, path, "")).await
        })
        .await;
        t.case(&format!("reclaim F staged at {path:?}"), Invalid, async |t| {
            t.reclaim.node_reclaim_space(reclaim_req(&f, "", path)).await
        })
        .await;
    }
    for (what, path) in [
        ("a tmpfs", s(&tmpfs)),
        ("A's staging path", s(&a_stage)),
        ("A's target", s(&a_target)),
        ("B's block target", s(&b_target)),
        ("a directory with content", s(&full)),
        ("a symlink to /etc", s(&root.join("etc-link"))),
        (
            "a symlink to A's staging path",
            s(&root.join("plugins-link/a/globalmount")),
        ),
    ] {
        t.case(&format!("reclaim F at {what}"), NotFound, async |t| {
            t.reclaim.node_reclaim_space(reclaim_req(&f, &path, "")).await
        })
        .await;
        t.case(
            &format!("reclaim F at its staging path, staged at {what}"),
            NotFound,
            async |t| {
                t.reclaim
                    .node_reclaim_space(reclaim_req(&f, &f_stage_s, &path))
                    .await
            },
        )
        .await;
    }
    t.case("reclaim B (raw block) at A's target", NotFound, async |t| {
        t.reclaim
            .node_reclaim_space(reclaim_req(&b, &s(&a_target), ""))
            .await
    })
    .await;
    let trimmed = if backend.discards { Done } else { Busy };
    t.case(
        "reclaim A at its own target and staging path",
        trimmed,
        async |t| {
            t.reclaim
                .node_reclaim_space(reclaim_req(&a, &s(&a_target), &s(&a_stage)))
                .await
        },
    )
    .await;

    // The spec's limits: names, maps, mount flags, context keys.
    let fresh = root.join("plugins/fresh/globalmount");
    let huge = "v".repeat(64 << 10);
    let contexts: [(&str, HashMap<String, String>); 3] = [
        (
            "a 64 KiB volume_context value",
            HashMap::from([("csi.storage.k8s.io/pod.name".into(), huge.clone())]),
        ),
        (
            "an unknown volume_context key",
            HashMap::from([("fsType".into(), "xfs".into())]),
        ),
        (
            "a control character in volume_context",
            HashMap::from([("csi.storage.k8s.io/pod.uid".into(), "a\0b".into())]),
        ),
    ];
    for (what, context) in contexts {
        t.case(what, Invalid, async |t| {
            let mut req = stage(&f, &s(&fresh), mount_capability());
            req.volume_context = context;
            t.node.node_stage_volume(req).await
        })
        .await;
    }
    for flag in [
        "x".repeat(5000),
        "nosuid,bogus".into(),
        "bind".into(),
        "loop".into(),
    ] {
        t.case(&format!("mount flag {:.40}", flag), Invalid, async |t| {
            let mut cap = mount_capability();
            if let Some(csi::volume_capability::AccessType::Mount(m)) = &mut cap.access_type {
                m.mount_flags = vec![flag];
            }
            t.node.node_stage_volume(stage(&f, &s(&fresh), cap)).await
        })
        .await;
    }
    for (what, name) in [
        ("NUL", "pvc-\0-x".to_string()),
        ("129 bytes", "n".repeat(129)),
        ("a newline", "pvc\n".into()),
    ] {
        t.case(&format!("a volume name with {what}"), Invalid, async |t| {
            t.controller
                .create_volume(create_request(&name, 16 * MIB, ("ns", "x")))
                .await
        })
        .await;
    }
    t.case("CreateVolume parameters over 4 KiB", Invalid, async |t| {
        let mut req = create_request("pvc-params", 16 * MIB, ("ns", "x"));
        req.parameters
            .insert("csi.storage.k8s.io/pvc/name".into(), "p".repeat(5000));
        t.controller.create_volume(req).await
    })
    .await;
    t.case("a 129-byte volume id", Invalid, async |t| {
        t.node
            .node_stage_volume(stage(
                &format!("{class}.{}", "a".repeat(128 - class.len())),
                &s(&fresh),
                mount_capability(),
            ))
            .await
    })
    .await;
    if let Some(failures) = &t.failures
        && !failures.is_empty()
    {
        panic!(
            "{}: {} of {} hostile cases failed:\n{}",
            backend.name,
            failures.len(),
            t.cases,
            failures.join("\n")
        );
    }
    assert_eq!(std::fs::read(a_target.join("a-data")).unwrap(), b"tenant a");
    eprintln!(
        "{}: {} hostile node cases, each without a side effect, {:.1}s",
        backend.name,
        t.cases,
        started.elapsed().as_secs_f64()
    );

    // The legitimate teardown still works, and leaves nothing behind.
    let node = &mut t.node;
    let unpublish = |id: &str, p: &Path| unpublish_req(id, s(p));
    let unstage = |id: &str, p: &Path| unstage_req(id, s(p));
    node.node_unpublish_volume(unpublish(&a, &a_target))
        .await
        .unwrap();
    assert!(!a_target.exists(), "the target publish made is removed");
    node.node_unpublish_volume(unpublish(&b, &b_target))
        .await
        .unwrap();
    assert!(!b_target.exists());
    node.node_unstage_volume(unstage(&a, &a_stage)).await.unwrap();
    node.node_unstage_volume(unstage(&f, &f_stage)).await.unwrap();
    node.node_unstage_volume(unstage(&b, &root.join("plugins/b")))
        .await
        .unwrap();
    node.node_unstage_volume(unstage(&b, &root.join("plugins/b")))
        .await
        .unwrap();
    nix::mount::umount(&tmpfs).unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(root.to_str().unwrap()), "{mounts}");
    assert!(full.join("data").exists());
    for id in [a, f, b] {
        t.controller
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    d.stop().await;
}
