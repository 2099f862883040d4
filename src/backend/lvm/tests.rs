//! The LVM backends against a simulated lvm: an in-memory VG that answers lvs, vgs,
//! lvcreate, lvextend, lvchange and lvremove the way lvm 2.03 does (its JSON shape and
//! its error text, as captured in tests/fixtures/lvm). Tests assert on the exact
//! commands run and on what is left in the VG.

use std::sync::{Arc, Mutex};

use super::*;
use crate::backend::CreateSpec;
use crate::fs::FsType;
use crate::fs::superblock::FsUuid;
use crate::host::CommandError;
use crate::host::fake::{FakeCommands, FakeSyscalls, failed, succeeded as ok, take_scripted};
use crate::model::ClaimRef;
use crate::model::Encryption;
use crate::model::VolumeMode;

/// Capacity per layout, and what open and create refuse.
mod capacity;
/// What the copy tests start from: a formatted thin volume, a copy left half made.
mod copies;
/// Creation: tags and the commit mark, zeroing block volumes, the container config, a
/// pending LV left by a crash.
mod create;
/// The format mark (`format=formatting` until mkfs finished).
mod format;
/// Growth, leftover zeroing LVs and deletion.
mod grow_delete;
/// The filesystem-grow mark of a copy larger than its source.
mod grow_mark;
/// Reading lvm: one shared report per VG, patched by our own changes, tags, error
/// text, a hung lvs.
mod reports;
/// Thin snapshots, restores and clones.
mod snapshots;

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
    /// The thin pools' ninth lv_attr character (lvm's health verdict; `-` healthy).
    pool_health: char,
    /// The thin pools' data and metadata fill in percent, reported when set.
    pool_fill: Option<(f64, f64)>,
    /// PVs lvm cannot find: the VG is reported partial.
    missing_pvs: u64,
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

/// The arguments of an LVM command after its `--config` pair, which every LVM
/// command must start with (the simulated lvm refuses to answer otherwise).
fn args(cmd: &CommandSpec) -> Vec<String> {
    let all: Vec<String> = cmd
        .args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        all.get(..2),
        Some(&["--config".to_string(), CONTAINER_CONFIG.to_string()][..]),
        "{cmd:?} lacks the container's LVM configuration"
    );
    all[2..].to_vec()
}

/// The commands run so far, as `program args`, with the `--config` pair of each LVM
/// command checked and left out (so expectations show what differs between commands).
fn calls_without_config(commands: &FakeCommands) -> Vec<String> {
    let config = format!(" --config {CONTAINER_CONFIG}");
    commands
        .calls()
        .into_iter()
        .map(|call| {
            let program = call.split(' ').next().unwrap_or_default();
            if !LVM_PROGRAMS.contains(&program) {
                return call;
            }
            let rest = call[program.len()..]
                .strip_prefix(config.as_str())
                .unwrap_or_else(|| panic!("{call} lacks the container's LVM configuration"));
            format!("{program}{rest}")
        })
        .collect()
}

const LVM_PROGRAMS: [&str; 6] = ["lvs", "vgs", "lvcreate", "lvchange", "lvextend", "lvremove"];

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
    let failing = |vg: &Shared, program: &'static str| take_scripted(&mut vg.lock().unwrap().fail, program);
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
            // Every row carries its VG's fields, as lvm's do for `-o REPORT_FIELDS`.
            let vg_fields = format!(
                r#""vg_size":"{}", "vg_free":"{}", "vg_extent_size":"{EXTENT}", "vg_tags":"", "vg_attr":"{}", "vg_missing_pv_count":"{}""#,
                v.size,
                v.free(),
                if v.missing_pvs > 0 { "wz-pn-" } else { "wz--n-" },
                v.missing_pvs
            );
            let rows: Vec<String> = v
                .lvs
                .iter()
                .map(|l| {
                    let attr = if l.thin_pool {
                        format!("twi-aot{}{}-", if l.zeroing { 'z' } else { '-' }, v.pool_health)
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
                    let fill = match v.pool_fill {
                        Some((data, metadata)) if l.thin_pool => {
                            format!(r#""data_percent":"{data:.2}", "metadata_percent":"{metadata:.2}""#)
                        }
                        _ => r#""data_percent":"""#.to_string(),
                    };
                    format!(
                        r#"{{"lv_name":"{}", "vg_name":"{}", "lv_size":"{}", "lv_attr":"{attr}", "lv_tags":"{}", "pool_lv":"{}", {fill}, "lv_path":"{path}", {vg_fields}}}"#,
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
            let attr = if v.missing_pvs > 0 { "wz-pn-" } else { "wz--n-" };
            ok(format!(
                r#"{{"report":[{{"vg":[{{"vg_name":"{}", "vg_size":"{}", "vg_free":"{}", "vg_extent_size":"{EXTENT}", "vg_tags":"", "vg_attr":"{attr}", "vg_missing_pv_count":"{}"}}]}}]}}"#,
                v.name,
                v.size,
                v.free(),
                v.missing_pvs
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
            // A thin snapshot (`-s vg/origin`): the origin's size, in its pool.
            let origin = a
                .contains(&"-s".to_string())
                .then(|| v.lv(&split_target(a.last().unwrap()).1).cloned());
            let pool = match &origin {
                Some(Some(o)) => o.pool.clone(),
                Some(None) => {
                    return failed(
                        cmd,
                        5,
                        format!("  Failed to find logical volume \"{}\"\n", a.last().unwrap()),
                    );
                }
                None => flag(&a, "--thinpool"),
            };
            if let Some(pool) = &pool
                && v.lv(pool).is_none()
            {
                return failed(
                    cmd,
                    5,
                    format!("  Pool {pool} not found in Volume group {}.\n", v.name),
                );
            }
            let size = match origin {
                Some(Some(o)) => o.size,
                _ => bytes(&flag(&a, "-L").or_else(|| flag(&a, "-V")).unwrap()),
            };
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
    syscalls: FakeSyscalls,
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
            pool_health: '-',
            pool_fill: None,
            missing_pvs: 0,
        }));
        let commands = Arc::new(FakeCommands::default());
        simulate(&commands, &vg);
        let syscalls = FakeSyscalls::default();
        let host = Host {
            commands: commands.clone(),
            syscalls: Arc::new(syscalls.clone()),
        };
        let group = VolumeGroup::new("vg1".into(), host.clone());
        Self {
            vg,
            commands,
            syscalls,
            group,
            host,
        }
    }

    /// The same VG as a restarted daemon finds it: the same storage and tools, a
    /// `VolumeGroup` of its own with nothing cached.
    fn restarted(&self) -> Self {
        Self {
            vg: Arc::clone(&self.vg),
            commands: self.commands.clone(),
            syscalls: self.syscalls.clone(),
            group: VolumeGroup::new("vg1".into(), self.host.clone()),
            host: self.host.clone(),
        }
    }

    /// A thick class holding volume `pvc-1` of 64 MiB, made with `mode`.
    async fn thick_with_volume(&self, mode: VolumeMode) -> (LvmBackend, Token) {
        let b = self.thick(0).await;
        b.create(&spec("pvc-1", 64 * MIB, mode)).await.unwrap();
        (b, Token::for_name("pvc-1"))
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
                thresholds: crate::config::PoolThresholds::default(),
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

    /// A thick LV made behind the daemon's back (an earlier version, a killed create,
    /// an administrator), seen at the next report.
    fn plant_thick(&self, name: &str, size: u64, tags: Vec<String>) {
        self.plant(name, size, tags, None);
    }

    /// An LV `name` with `tags`, thick or thin in `pool`, seen at the next report.
    fn plant(&self, name: &str, size: u64, tags: Vec<String>, pool: Option<&str>) {
        self.vg.lock().unwrap().lvs.push(FakeLv {
            name: name.into(),
            size,
            tags,
            pool: pool.map(Into::into),
            thin_pool: false,
            zeroing: false,
            in_use: false,
        });
        self.group.invalidate();
    }

    /// The UUID in the LV's `fs-uuid` tag, which must be one if present.
    fn fs_uuid(&self, lv: &str) -> Option<FsUuid> {
        let prefix = format!("{}{}=", tags::PREFIX, tags::FS_UUID);
        let tags = self.lv(lv).tags;
        let value = tags.iter().find_map(|t| t.strip_prefix(&prefix))?;
        Some(FsUuid::parse(value).expect("a UUID"))
    }

    /// A thick LV with the `thick` class's tags for a volume `name` of `mode` plus
    /// `extra` (a mark, the pending tag), planted as [`Fixture::plant_thick`] does.
    fn plant_thick_volume(&self, name: &str, size: u64, mode: VolumeMode, extra: &[&str]) {
        self.plant_volume("thick", name, size, mode, extra);
    }

    /// The same for class `class` (`thick`, or `thin` in `pool0`).
    fn plant_volume(&self, class: &str, name: &str, size: u64, mode: VolumeMode, extra: &[&str]) {
        let class = ClassName::parse(class).unwrap();
        let mut tags = tags::volume_tags(&class, &spec(name, size, mode));
        tags.extend(extra.iter().map(|t| t.to_string()));
        self.plant(name, size, tags, (class.as_str() == "thin").then_some("pool0"));
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
        let calls = calls_without_config(&self.commands);
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
        encryption: None,
    }
}

/// Past the cached report's lifetime (in a test with time paused): the next call reads
/// lvm again.
async fn past_the_report_ttl() {
    tokio::time::advance(crate::backend::cache::DEFAULT_TTL + std::time::Duration::from_secs(1)).await;
}
