//! The LVM backends against a simulated lvm: an in-memory VG that answers lvs, vgs,
//! lvcreate, lvextend, lvchange and lvremove the way lvm 2.03 does (its JSON shape and
//! its error text, as captured in tests/fixtures/lvm). Tests assert on the exact
//! commands run and on what is left in the VG.

use std::sync::{Arc, Mutex};

use super::*;
use crate::backend::CreateSpec;
use crate::fs::FsType;
use crate::host::fake::{FakeCommands, FakeSyscalls};
use crate::host::{CommandError, CommandOutput};
use crate::model::VolumeMode;
use crate::request::ClaimRef;

/// The format mark (`format=formatting` until mkfs finished).
mod format;

const EXTENT: u64 = 4 << 20;
const MIB: u64 = 1 << 20;

#[derive(Debug, Clone)]
struct FakeLv {
    name: String,
    size: u64,
    tags: Vec<String>,
    pool: Option<String>,
    thin_pool: bool,
    zeroing: bool,
    in_use: bool,
}

#[derive(Debug)]
struct FakeVg {
    name: String,
    size: u64,
    lvs: Vec<FakeLv>,
    /// Next fails of a program: (program, stderr).
    fail: Vec<(&'static str, String)>,
}

impl FakeVg {
    fn used(&self) -> u64 {
        self.lvs.iter().filter(|l| l.pool.is_none()).map(|l| l.size).sum()
    }

    fn free(&self) -> u64 {
        self.size - self.used()
    }

    fn lv(&self, name: &str) -> Option<&FakeLv> {
        self.lvs.iter().find(|l| l.name == name)
    }
}

type Shared = Arc<Mutex<FakeVg>>;

fn failed(cmd: &CommandSpec, code: i32, stderr: impl Into<String>) -> Result<CommandOutput, CommandError> {
    Err(CommandError::Failed {
        program: cmd.program,
        args: cmd.args_display(),
        exit_code: Some(code),
        stdout: String::new(),
        stderr: stderr.into(),
    })
}

fn ok(stdout: String) -> Result<CommandOutput, CommandError> {
    Ok(CommandOutput {
        stdout: stdout.into_bytes(),
        stderr: String::new(),
    })
}

fn args(cmd: &CommandSpec) -> Vec<String> {
    cmd.args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).map(|i| args[i + 1].clone())
}

fn bytes(size: &str) -> u64 {
    size.strip_suffix('b').unwrap().parse().unwrap()
}

fn split_target(target: &str) -> (String, String) {
    let (vg, lv) = target.split_once('/').unwrap();
    (vg.to_string(), lv.to_string())
}

/// Installs the simulated lvm into `commands`.
fn simulate(commands: &FakeCommands, vg: &Shared) {
    let failing = |vg: &Shared, program: &'static str| {
        let mut v = vg.lock().unwrap();
        v.fail
            .iter()
            .position(|(p, _)| *p == program)
            .map(|i| v.fail.remove(i).1)
    };
    {
        let vg = Arc::clone(vg);
        commands.on("lvs", move |cmd| {
            let a = args(cmd);
            let v = vg.lock().unwrap();
            if a.contains(&"--segments".to_string()) {
                let (_, lv) = split_target(a.last().unwrap());
                let l = v.lv(&lv).unwrap();
                let extents = l.size / EXTENT;
                return ok(format!(
                    r#"{{"report":[{{"seg":[{{"lv_name":"{}","seg_pe_ranges":"/dev/vda:900-{}"}}]}}]}}"#,
                    l.name,
                    900 + extents - 1
                ));
            }
            if a.last().unwrap() != &v.name {
                return failed(cmd, 5, format!("  Volume group \"{}\" not found\n", a.last().unwrap()));
            }
            let rows: Vec<String> = v
                .lvs
                .iter()
                .map(|l| {
                    let attr = if l.thin_pool {
                        format!("twi-aot{}--", if l.zeroing { 'z' } else { '-' })
                    } else if l.pool.is_some() {
                        "Vwi-a-tz--".to_string()
                    } else {
                        "-wi-a-----".to_string()
                    };
                    let path = if l.thin_pool {
                        String::new()
                    } else {
                        format!("/dev/{}/{}", v.name, l.name)
                    };
                    format!(
                        r#"{{"lv_name":"{}", "vg_name":"{}", "lv_size":"{}", "lv_attr":"{attr}", "lv_tags":"{}", "pool_lv":"{}", "data_percent":"", "lv_path":"{path}"}}"#,
                        l.name,
                        v.name,
                        l.size,
                        l.tags.join(","),
                        l.pool.clone().unwrap_or_default()
                    )
                })
                .collect();
            ok(format!(r#"{{"report":[{{"lv":[{}]}}]}}"#, rows.join(",")))
        });
    }
    {
        let vg = Arc::clone(vg);
        commands.on("vgs", move |cmd| {
            let a = args(cmd);
            let v = vg.lock().unwrap();
            if a.last().unwrap() != &v.name {
                return failed(cmd, 5, format!("  Volume group \"{}\" not found\n", a.last().unwrap()));
            }
            ok(format!(
                r#"{{"report":[{{"vg":[{{"vg_name":"{}", "vg_size":"{}", "vg_free":"{}", "vg_extent_size":"{EXTENT}", "vg_tags":""}}]}}]}}"#,
                v.name,
                v.size,
                v.free()
            ))
        });
    }
    {
        let vg = Arc::clone(vg);
        commands.on("lvcreate", move |cmd| {
            if let Some(stderr) = failing(&vg, "lvcreate") {
                return failed(cmd, 5, stderr);
            }
            let a = args(cmd);
            let mut v = vg.lock().unwrap();
            let name = flag(&a, "-n").unwrap();
            if v.lv(&name).is_some() {
                return failed(
                    cmd,
                    5,
                    format!(
                        "  Logical Volume \"{name}\" already exists in volume group \"{}\"\n",
                        v.name
                    ),
                );
            }
            let tags = a
                .iter()
                .enumerate()
                .filter(|(_, x)| *x == "--addtag")
                .map(|(i, _)| a[i + 1].clone())
                .collect();
            let pool = flag(&a, "--thinpool");
            if let Some(pool) = &pool
                && v.lv(pool).is_none()
            {
                return failed(
                    cmd,
                    5,
                    format!("  Pool {pool} not found in Volume group {}.\n", v.name),
                );
            }
            let size = bytes(&flag(&a, "-L").or_else(|| flag(&a, "-V")).unwrap());
            if pool.is_none() && size > v.free() {
                return failed(
                    cmd,
                    5,
                    format!(
                        "  Volume group \"{}\" has insufficient free space ({} extents): {} required.\n",
                        v.name,
                        v.free() / EXTENT,
                        size / EXTENT
                    ),
                );
            }
            v.lvs.push(FakeLv {
                name,
                size,
                tags,
                pool,
                thin_pool: false,
                zeroing: false,
                in_use: false,
            });
            ok(String::new())
        });
    }
    {
        let vg = Arc::clone(vg);
        commands.on("lvremove", move |cmd| {
            let (vg_name, lv) = split_target(args(cmd).last().unwrap());
            let mut v = vg.lock().unwrap();
            match v.lvs.iter().position(|l| l.name == lv) {
                None => failed(
                    cmd,
                    5,
                    format!("  Failed to find logical volume \"{vg_name}/{lv}\"\n"),
                ),
                Some(i) if v.lvs[i].in_use => failed(
                    cmd,
                    5,
                    format!("  Logical volume {vg_name}/{lv} contains a filesystem in use.\n"),
                ),
                Some(i) => {
                    v.lvs.remove(i);
                    ok(String::new())
                }
            }
        });
    }
    {
        let vg = Arc::clone(vg);
        commands.on("lvextend", move |cmd| {
            let a = args(cmd);
            let mut v = vg.lock().unwrap();
            let size = bytes(&flag(&a, "-L").unwrap());
            let (_, lv) = split_target(&a[2]);
            let free = v.free();
            let l = v.lvs.iter_mut().find(|l| l.name == lv).unwrap();
            if l.pool.is_none() && size - l.size > free {
                return failed(
                    cmd,
                    5,
                    "  Insufficient free space: 25600 extents needed, but only 1 available\n",
                );
            }
            l.size = size;
            ok(String::new())
        });
    }
    {
        let vg = Arc::clone(vg);
        commands.on("lvchange", move |cmd| {
            let a = args(cmd);
            let mut v = vg.lock().unwrap();
            let (_, lv) = split_target(a.last().unwrap());
            let l = v.lvs.iter_mut().find(|l| l.name == lv).unwrap();
            // Every --deltag and --addtag of one command, as lvm applies them: in one
            // metadata commit.
            for (i, option) in a.iter().enumerate() {
                match option.as_str() {
                    "--deltag" => l.tags.retain(|t| *t != a[i + 1]),
                    "--addtag" if !l.tags.contains(&a[i + 1]) => l.tags.push(a[i + 1].clone()),
                    _ => {}
                }
            }
            ok(String::new())
        });
    }
    {
        let vg = Arc::clone(vg);
        commands.on("blkdiscard", move |cmd| match failing(&vg, "blkdiscard") {
            Some(stderr) => failed(cmd, 1, stderr),
            None => ok(String::new()),
        });
    }
}

struct Fixture {
    vg: Shared,
    commands: Arc<FakeCommands>,
    group: Arc<VolumeGroup>,
    host: Host,
}

impl Fixture {
    /// A 1 GiB VG `vg1`, optionally with a 256 MiB thin pool `pool0`.
    fn new(pool_zeroing: Option<bool>) -> Self {
        let mut lvs = Vec::new();
        if let Some(zeroing) = pool_zeroing {
            lvs.push(FakeLv {
                name: "pool0".into(),
                size: 256 * MIB,
                tags: Vec::new(),
                pool: None,
                thin_pool: true,
                zeroing,
                in_use: false,
            });
        }
        let vg = Arc::new(Mutex::new(FakeVg {
            name: "vg1".into(),
            size: 1 << 30,
            lvs,
            fail: Vec::new(),
        }));
        let commands = Arc::new(FakeCommands::default());
        simulate(&commands, &vg);
        let host = Host {
            commands: commands.clone(),
            syscalls: Arc::new(FakeSyscalls::default()),
        };
        let group = VolumeGroup::new("vg1".into(), host.clone());
        Self {
            vg,
            commands,
            group,
            host,
        }
    }

    async fn thick(&self, spare_bytes: u64) -> LvmBackend {
        self.open(
            "thick",
            Layout::Thick {
                spare_bytes,
                stripes: None,
                stripe_size: None,
            },
        )
        .await
    }

    async fn thin(&self, ratio: f64) -> LvmBackend {
        self.open(
            "thin",
            Layout::Thin {
                pool: "pool0".into(),
                overprovision_ratio: ratio,
            },
        )
        .await
    }

    async fn open(&self, class: &str, layout: Layout) -> LvmBackend {
        let settings = LvmSettings {
            kind: "lvm",
            layout,
            lvcreate_options: Vec::new(),
            dax: false,
        };
        LvmBackend::open(
            ClassName::parse(class).unwrap(),
            settings,
            Arc::clone(&self.group),
            self.host.clone(),
        )
        .await
        .unwrap()
    }

    fn lv_names(&self) -> Vec<String> {
        self.vg
            .lock()
            .unwrap()
            .lvs
            .iter()
            .map(|l| l.name.clone())
            .collect()
    }

    fn lv(&self, name: &str) -> FakeLv {
        self.vg.lock().unwrap().lv(name).unwrap().clone()
    }

    /// The commands run since the last call, reports left out.
    fn changes(&self) -> Vec<String> {
        let calls = self.commands.calls();
        calls
            .into_iter()
            .filter(|c| {
                !(c.starts_with("lvs --reportformat json --units b --nosuffix -o") || c.starts_with("vgs "))
            })
            .collect()
    }
}

fn spec(name: &str, size: u64, mode: VolumeMode) -> CreateSpec {
    CreateSpec {
        token: Token::for_name(name),
        name: name.to_string(),
        size_bytes: size,
        mode,
        fs_type: (mode == VolumeMode::Filesystem).then_some(FsType::Ext4),
        claim: ClaimRef {
            pvc_name: Some("data".into()),
            pvc_namespace: Some("team".into()),
            pv_name: Some("pvc-1".into()),
        },
    }
}

#[tokio::test]
async fn a_thick_filesystem_volume_is_tagged_committed_and_listed() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    let record = b
        .create(&spec("pvc-1", 64 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    assert_eq!(record.size_bytes, 64 * MIB);
    assert_eq!(record.claim.pvc_namespace.as_deref(), Some("team"));
    assert_eq!(
        f.changes(),
        [
            "lvcreate -y -n pvc-1 -L 67108864b -Wy -Zy --addtag localvol.csi.dev/class=thick \
             --addtag localvol.csi.dev/name=pvc-1 --addtag localvol.csi.dev/mode=filesystem \
             --addtag localvol.csi.dev/fs=ext4 --addtag localvol.csi.dev/pvc=data \
             --addtag localvol.csi.dev/namespace=team --addtag localvol.csi.dev/pv=pvc-1 \
             --addtag localvol.csi.dev/state=zeroing vg1",
            "lvchange --deltag localvol.csi.dev/state=zeroing vg1/pvc-1",
        ]
    );
    assert!(!f.lv("pvc-1").tags.contains(&tags::PENDING.to_string()));
    assert_eq!(
        b.get(&Token::for_name("pvc-1")).await.unwrap(),
        Some(record.clone())
    );
    assert_eq!(b.list().await.unwrap(), [record]);
    assert_eq!(
        b.device(&Token::for_name("pvc-1")).await.unwrap(),
        Some(PathBuf::from("/dev/vg1/pvc-1"))
    );
    // A repeated create changes nothing.
    b.create(&spec("pvc-1", 64 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    assert!(f.changes().iter().filter(|c| c.starts_with("lvcreate")).count() == 1);
}

#[tokio::test]
async fn a_thick_block_volume_is_zeroed_before_it_becomes_a_volume() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    b.create(&spec("blk", 8 * MIB, VolumeMode::Block)).await.unwrap();
    let changes = f.changes();
    assert!(changes[0].starts_with("lvcreate") && changes[0].ends_with("state=zeroing vg1"));
    assert_eq!(
        changes[1..],
        [
            "blkdiscard -f -z /dev/vg1/blk",
            "lvchange --deltag localvol.csi.dev/state=zeroing vg1/blk"
        ]
    );
}

#[tokio::test]
async fn a_failed_zeroing_leaves_nothing_behind() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    f.vg.lock()
        .unwrap()
        .fail
        .push(("blkdiscard", "blkdiscard: Input/output error".into()));
    let err = b
        .create(&spec("blk", 8 * MIB, VolumeMode::Block))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Input/output error"), "{err}");
    assert!(f.lv_names().is_empty(), "{:?}", f.lv_names());
    assert!(b.get(&Token::for_name("blk")).await.unwrap().is_none());
}

#[tokio::test]
async fn a_pending_lv_from_a_crash_is_not_a_volume_and_is_redone() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    // The daemon died while zeroing: the LV exists with the pending tag.
    let mut tags = tags::volume_tags(b.class(), &spec("blk", 8 * MIB, VolumeMode::Block));
    tags.push(tags::PENDING.to_string());
    f.vg.lock().unwrap().lvs.push(FakeLv {
        name: "blk".into(),
        size: 8 * MIB,
        tags,
        pool: None,
        thin_pool: false,
        zeroing: false,
        in_use: false,
    });
    f.group.invalidate();
    assert!(b.get(&Token::for_name("blk")).await.unwrap().is_none());
    assert!(b.list().await.unwrap().is_empty());
    assert!(b.device(&Token::for_name("blk")).await.unwrap().is_none());
    b.create(&spec("blk", 8 * MIB, VolumeMode::Block)).await.unwrap();
    let changes = f.changes();
    assert_eq!(changes[0], "lvremove -y vg1/blk");
    assert!(changes[1].starts_with("lvcreate"));
    assert_eq!(changes[2], "blkdiscard -f -z /dev/vg1/blk");
    assert!(b.get(&Token::for_name("blk")).await.unwrap().is_some());

    // Or the retry is a delete: it removes the pending LV just the same.
    f.vg.lock().unwrap().lvs[0].tags.push(tags::PENDING.to_string());
    f.group.invalidate();
    b.delete(&Token::for_name("blk")).await.unwrap();
    assert!(f.lv_names().is_empty());
}

#[tokio::test]
async fn thick_capacity_is_vg_free_minus_spare_and_too_big_changes_nothing() {
    let f = Fixture::new(None);
    let b = f.thick(256 * MIB).await;
    let cap = b.capacity().await.unwrap();
    assert_eq!(cap.available, 768 * MIB);
    assert_eq!(cap.total, 768 * MIB);
    assert_eq!(cap.max_volume, 768 * MIB);
    let err = b
        .create(&spec("big", 800 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::NoSpace { available, .. } if available == 768 * MIB),
        "{err}"
    );
    assert!(f.changes().is_empty(), "refused before any lvcreate");
    b.create(&spec("a", 700 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    assert_eq!(b.capacity().await.unwrap().available, 68 * MIB);

    // Someone else took the space meanwhile: lvcreate's own refusal is NoSpace too.
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    f.vg.lock().unwrap().fail.push((
        "lvcreate",
        "  Volume group \"vg1\" has insufficient free space (1 extents): 2 required.\n".into(),
    ));
    let err = b
        .create(&spec("x", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::NoSpace { .. }), "{err}");
}

#[tokio::test]
async fn thin_volumes_are_bounded_by_the_overprovision_ratio() {
    let f = Fixture::new(Some(true));
    let b = f.thin(2.0).await;
    assert_eq!(b.capacity().await.unwrap().available, 512 * MIB);
    b.create(&spec("t1", 400 * MIB, VolumeMode::Block)).await.unwrap();
    assert_eq!(
        f.changes(),
        [
            "lvcreate -y -n t1 -V 419430400b --thinpool pool0 --addtag localvol.csi.dev/class=thin \
          --addtag localvol.csi.dev/name=t1 --addtag localvol.csi.dev/mode=block \
          --addtag localvol.csi.dev/pvc=data --addtag localvol.csi.dev/namespace=team \
          --addtag localvol.csi.dev/pv=pvc-1 vg1"
        ],
        "a thin LV reads zeros until written: no pending tag, no zeroing"
    );
    let cap = b.capacity().await.unwrap();
    assert_eq!((cap.available, cap.total), (112 * MIB, 512 * MIB));
    let err = b
        .create(&spec("t2", 200 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::NoSpace { .. }), "{err}");
    let err = b.expand(&Token::for_name("t1"), 600 * MIB).await.unwrap_err();
    assert!(matches!(err, BackendError::NoSpace { .. }), "{err}");
    assert_eq!(
        b.expand(&Token::for_name("t1"), 500 * MIB).await.unwrap(),
        500 * MIB
    );
    assert!(
        f.changes()
            .last()
            .unwrap()
            .starts_with("lvextend -L 524288000b vg1/t1")
    );
}

#[tokio::test]
async fn block_volumes_are_refused_on_a_pool_that_does_not_zero() {
    let f = Fixture::new(Some(false));
    let b = f.thin(1.0).await;
    let err = b
        .create(&spec("t1", 8 * MIB, VolumeMode::Block))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::Lvm(LvmError::PoolNotZeroing { .. })),
        "{err}"
    );
    b.create(&spec("t2", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_missing_vg_or_pool_fails_at_open() {
    let f = Fixture::new(None);
    let settings = |layout| LvmSettings {
        kind: "lvm-thin",
        layout,
        lvcreate_options: Vec::new(),
        dax: false,
    };
    let missing_vg = VolumeGroup::new("nosuchvg".into(), f.host.clone());
    let thick = Layout::Thick {
        spare_bytes: 0,
        stripes: None,
        stripe_size: None,
    };
    let err = LvmBackend::open(
        ClassName::parse("a").unwrap(),
        settings(thick),
        missing_vg,
        f.host.clone(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, BackendError::Lvm(LvmError::VgNotFound { .. })),
        "{err}"
    );
    let thin = Layout::Thin {
        pool: "pool0".into(),
        overprovision_ratio: 1.0,
    };
    let err = LvmBackend::open(
        ClassName::parse("a").unwrap(),
        settings(thin),
        Arc::clone(&f.group),
        f.host.clone(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, BackendError::Lvm(LvmError::PoolNotFound { .. })),
        "{err}"
    );
}

#[tokio::test]
async fn a_filesystem_volume_grows_with_lvextend_and_never_shrinks() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    let token = Token::for_name("pvc-1");
    b.create(&spec("pvc-1", 64 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    f.changes();
    assert_eq!(b.expand(&token, 128 * MIB).await.unwrap(), 128 * MIB);
    assert_eq!(b.expand(&token, 32 * MIB).await.unwrap(), 128 * MIB);
    let extends: Vec<_> = f
        .changes()
        .into_iter()
        .filter(|c| c.starts_with("lvextend"))
        .collect();
    assert_eq!(extends, ["lvextend -L 134217728b vg1/pvc-1"]);
    let missing = b.expand(&Token::for_name("nope"), MIB).await.unwrap_err();
    assert!(matches!(missing, BackendError::NotFound { .. }), "{missing}");
}

#[tokio::test]
async fn a_block_volume_grows_only_onto_extents_zeroed_first() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    let token = Token::for_name("blk");
    b.create(&spec("blk", 64 * MIB, VolumeMode::Block)).await.unwrap();
    let before = f.changes().len();
    assert_eq!(b.expand(&token, 96 * MIB).await.unwrap(), 96 * MIB);
    let changes = f.changes()[before..].to_vec();
    assert_eq!(
        changes,
        [
            "lvcreate -y -Wn -Zn -n blk+zero -L 33554432b --addtag localvol.csi.dev/zeroing-for=blk vg1",
            "lvs --reportformat json --units b --nosuffix --segments -o lv_name,seg_pe_ranges vg1/blk+zero",
            "blkdiscard -f -z /dev/vg1/blk+zero",
            "lvremove -y vg1/blk+zero",
            "lvextend -L 100663296b vg1/blk /dev/vda:900-907",
        ]
    );
    assert_eq!(f.lv_names(), ["blk"]);
}

#[tokio::test]
async fn a_leftover_zeroing_lv_is_removed_by_the_retry_or_the_delete() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    b.create(&spec("blk", 64 * MIB, VolumeMode::Block)).await.unwrap();
    let leftover = FakeLv {
        name: "blk+zero".into(),
        size: 32 * MIB,
        tags: vec![tags::zeroing_tag("blk")],
        pool: None,
        thin_pool: false,
        zeroing: false,
        in_use: false,
    };
    f.vg.lock().unwrap().lvs.push(leftover.clone());
    f.group.invalidate();
    assert_eq!(b.list().await.unwrap().len(), 1, "a zeroing LV is not a volume");
    b.expand(&Token::for_name("blk"), 96 * MIB).await.unwrap();
    assert_eq!(f.lv_names(), ["blk"]);

    f.vg.lock().unwrap().lvs.push(leftover);
    f.group.invalidate();
    b.delete(&Token::for_name("blk")).await.unwrap();
    assert!(f.lv_names().is_empty(), "{:?}", f.lv_names());
}

#[tokio::test]
async fn delete_is_idempotent_refuses_busy_lvs_and_spares_foreign_ones() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    let token = Token::for_name("pvc-1");
    b.create(&spec("pvc-1", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    f.vg.lock().unwrap().lvs[0].in_use = true;
    let err = b.delete(&token).await.unwrap_err();
    assert!(matches!(err, BackendError::InUse { .. }), "{err}");
    f.vg.lock().unwrap().lvs[0].in_use = false;
    b.delete(&token).await.unwrap();
    b.delete(&token).await.unwrap();
    assert!(f.lv_names().is_empty());

    // An LV of the same name that is not this class's volume is left alone.
    f.vg.lock().unwrap().lvs.push(FakeLv {
        name: "root".into(),
        size: 8 * MIB,
        tags: Vec::new(),
        pool: None,
        thin_pool: false,
        zeroing: false,
        in_use: false,
    });
    f.group.invalidate();
    b.delete(&Token::for_name("root")).await.unwrap();
    assert_eq!(f.lv_names(), ["root"]);
    let err = b
        .create(&spec("root", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::Lvm(LvmError::NameTaken { .. })),
        "{err}"
    );
}

#[tokio::test]
async fn classes_on_one_vg_share_one_report_and_see_only_their_volumes() {
    let f = Fixture::new(Some(true));
    let thick = f.thick(0).await;
    let thin = f.thin(1.0).await;
    thick
        .create(&spec("a", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    thin.create(&spec("b", 8 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    let reports = |f: &Fixture| f.commands.calls_of("lvs").len() + f.commands.calls_of("vgs").len();
    let before = reports(&f);
    for _ in 0..3 {
        assert_eq!(thick.list().await.unwrap().len(), 1);
        assert_eq!(thin.list().await.unwrap().len(), 1);
        assert!(thick.get(&Token::for_name("b")).await.unwrap().is_none());
        thick.capacity().await.unwrap();
        thin.check_health().await.unwrap();
    }
    assert!(
        reports(&f) - before <= 2,
        "one lvs and one vgs at most: {}",
        reports(&f) - before
    );
}

#[tokio::test]
async fn inconsistent_tags_fail_get_and_are_skipped_by_list() {
    let f = Fixture::new(None);
    let b = f.thick(0).await;
    f.vg.lock().unwrap().lvs.push(FakeLv {
        name: "pvc-9".into(),
        size: 8 * MIB,
        tags: vec![
            "localvol.csi.dev/class=thick".into(),
            "localvol.csi.dev/name=pvc-9".into(),
        ],
        pool: None,
        thin_pool: false,
        zeroing: false,
        in_use: false,
    });
    f.group.invalidate();
    let err = b.get(&Token::for_name("pvc-9")).await.unwrap_err();
    assert!(matches!(err, BackendError::CorruptRecord { .. }), "{err}");
    assert!(b.list().await.unwrap().is_empty());
    // Deleting it is still possible: it is this class's LV.
    b.delete(&Token::for_name("pvc-9")).await.unwrap();
    assert!(f.lv_names().is_empty());
}

#[test]
fn lvm_error_text_is_classified() {
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
    macro_rules! fixture {
        ($name:literal) => {
            text(include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/lvm/",
                $name
            )))
        };
    }
    use super::vg::stderr::*;
    assert!(is_no_space(&fixture!("lvcreate-insufficient-space.txt")));
    assert!(is_no_space(&fixture!("lvextend-thick-insufficient-space.txt")));
    assert!(is_no_space(&fixture!("lvextend-thinpool-insufficient-space.txt")));
    assert!(is_name_taken(&fixture!("lvcreate-name-exists.txt")));
    assert!(is_vg_not_found(&fixture!("lvs-missing-vg.txt")));
    assert!(is_vg_not_found(&fixture!("lvremove-missing-vg.txt")));
    assert!(is_lv_not_found(&fixture!("lvremove-missing-lv.txt")));
    assert!(is_pool_not_found(&fixture!("lvcreate-missing-pool.txt")));
    assert!(is_in_use(&fixture!("lvremove-fs-in-use.txt")));
    assert!(is_in_use(&fixture!("lvremove-open.txt")));
    for other in [
        fixture!("lvcreate-invalid-tag.txt"),
        fixture!("lvcreate-thin-overprovision.txt"),
    ] {
        assert!(
            !is_no_space(&other) && !is_in_use(&other) && !is_vg_not_found(&other),
            "{other}"
        );
    }
}

#[tokio::test]
async fn a_hung_lvs_costs_one_timeout_not_one_per_call() {
    let commands = Arc::new(FakeCommands::default());
    commands.on("lvs", |cmd| {
        Err(CommandError::TimedOut {
            program: cmd.program,
            args: cmd.args_display(),
            timeout: cmd.timeout,
        })
    });
    let host = Host {
        commands: commands.clone(),
        syscalls: Arc::new(FakeSyscalls::default()),
    };
    let group = VolumeGroup::new("vg1".into(), host);
    let first = group.state().await.unwrap_err();
    assert!(
        matches!(&first, BackendError::Lvm(LvmError::Command { source, .. }) if source.is_timeout()),
        "{first}"
    );
    assert!(
        first.to_string().starts_with("lvs vg1: lvs --reportformat json"),
        "{first}"
    );
    for _ in 0..5 {
        let again = group.state().await.unwrap_err();
        assert!(
            matches!(&again, BackendError::Lvm(LvmError::ReportUnavailable { .. })),
            "{again}"
        );
    }
    assert_eq!(
        commands.calls_of("lvs").len(),
        1,
        "waiters get the failure, not a new scan"
    );
    assert_eq!(
        crate::error::Error::from(crate::volume::VolumeError::Backend(first)).code(),
        tonic::Code::DeadlineExceeded
    );
}
