//! The hostile node cases of tests/hostile.rs (`tests/testkit/src/hostile/node_cases.rs`, issue 14) on
//! LVM thick, LVM thin, PMEM direct and PMEM on LVM, in the tests/vm guest: the same
//! case list and sandbox, with the device class as the parameter, and after every case
//! also the guest's block devices (device-mapper ones by name), NVDIMM namespaces and
//! LVs (with their tags) compared with what they were before it.
//!
//! It makes its own storage and removes it at the end: VG `hostilevg` with the zeroing
//! thin pool `hostilepool` on the disk named by `LOCALVOL_VM_DISK` (wiped first: earlier
//! steps in the same guest may have used it as scratch), and on region0 one fsdax
//! namespace holding VG `hostilepmemvg`; PMEM direct volumes take region0's free space.
//! region0's labels are initialised only when it offers no space at all (a label-less
//! region, as the guest boots). Each class runs in its own sandboxed child with one
//! daemon serving only that class.
//!
//! In CI, `tests/vm/suite.sh` runs it as the part `hostile` (all four classes on
//! `/dev/vdb`, one storage set-up). Alone: `tests/vm/suite.sh hostile`.
//!
//! On the host it reports that it did not run and passes, unless `LOCALVOL_VM_SUITE=1`
//! says it must run (then it fails outside the guest).

use localvol_testkit::hostile::{node_cases, sandbox};

use std::path::{Path, PathBuf};
use std::time::Instant;

use localvol_testkit::guest::{self, sh, try_sh};
use node_cases::Backend;
use sandbox::{PhysicalVolume, Sandbox, Storage};

const VG: &str = "hostilevg";
const POOL: &str = "hostilepool";
const PMEM_VG: &str = "hostilepmemvg";
const PMEM_VG_NAMESPACE: &str = "hostile-pmemvg";
const CONFIG_DIR: &str = "/run/localvol-hostile-vm";
const CLASS_ENV: &str = "LOCALVOL_HOSTILE_CLASS";
const DISK_ENV: &str = "LOCALVOL_VM_DISK";

/// Each class is the default of its own daemon, so the cases' CreateVolume calls
/// (which name no class) land on it.
const CLASSES: &[(&str, &str)] = &[
    (
        "lvm",
        "{name: lvm, kind: lvm, volume-group: hostilevg, spare-gb: 0, default: true}",
    ),
    (
        "lvm-thin",
        "{name: lvm-thin, kind: lvm-thin, volume-group: hostilevg, default: true, \
         thin-pool: {name: hostilepool, overprovision-ratio: 1.0}}",
    ),
    (
        "pmem",
        "{name: pmem, kind: pmem, mode: direct, region: region0, default: true}",
    ),
    (
        "pmem-lvm",
        "{name: pmem-lvm, kind: pmem, mode: lvm, volume-group: hostilepmemvg, default: true}",
    ),
];

/// The namespaces of region0 that hold space, disabled ones too, as `dev name size
/// mode` (a destroyed namespace leaves an idle seed of size 0 behind, which is no leak).
fn namespaces() -> Vec<String> {
    let mut all: Vec<String> = guest::namespaces(true)
        .iter()
        .filter(|n| n["size"].as_u64().unwrap_or(0) > 0)
        .map(|n| format!("{} {} {} {}", n["dev"], n["name"], n["size"], n["mode"]))
        .collect();
    all.sort();
    all
}

/// Device-mapper devices by name, but the thin pool's own: LVM activates the pool's
/// `-tpool` layer with its first thin LV and keeps it, which is the pool's, no volume's.
fn dm_devices() -> Vec<String> {
    let pool = format!("{VG}-{POOL}");
    let mut all: Vec<String> = sh("dmsetup", &["ls"])
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "No" && !n.starts_with(&pool))
        .map(str::to_string)
        .collect();
    all.sort();
    all
}

fn lvs(vg: &str) -> Vec<String> {
    sh("lvs", &["--noheadings", "-o", "lv_name", vg])
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The suite's VGs and namespace; removed again when dropped, also after a failure.
struct GuestStorage {
    disk: String,
    pmem_namespace: Option<(String, String)>,
}

impl GuestStorage {
    fn set_up() -> Self {
        let started = Instant::now();
        let disk = std::env::var(DISK_ENV)
            .unwrap_or_else(|_| panic!("{DISK_ENV} names the disk this suite may wipe (CI: /dev/vdc)"));
        assert!(Path::new(&disk).exists(), "{DISK_ENV}={disk} does not exist");
        let mut storage = Self {
            disk: disk.clone(),
            pmem_namespace: None,
        };
        sh("wipefs", &["-q", "-a", &disk]);
        guest::volume_group(VG, &[&disk]);
        guest::thin_pool(VG, POOL, "512M", true);
        // A region nobody labelled holds one label-less raw namespace and offers nothing.
        if guest::region()["available_size"].as_u64() == Some(0) {
            guest::reset_region();
        }
        let (namespace, pv) = guest::volume_group_on_pmem(PMEM_VG, "256M", PMEM_VG_NAMESPACE);
        storage.pmem_namespace = Some((namespace, pv.clone()));
        guest::single_class_configs(CONFIG_DIR, CLASSES);
        eprintln!(
            "hostile_vm: storage set up in {:.1}s (VG {VG} on {disk}, VG {PMEM_VG} on {pv})",
            started.elapsed().as_secs_f64()
        );
        storage
    }

    /// What a class's run must leave as it found it.
    fn state() -> (Vec<String>, Vec<String>, Vec<String>, Vec<String>) {
        (lvs(VG), lvs(PMEM_VG), namespaces(), dm_devices())
    }
}

impl Drop for GuestStorage {
    fn drop(&mut self) {
        let mut failed = Vec::new();
        let mut run = |program: &str, args: &[&str]| {
            if let Err(e) = try_sh(program, args) {
                failed.push(e);
            }
        };
        run("vgremove", &["-q", "-f", "-y", VG]);
        run("pvremove", &["-q", "-y", &self.disk]);
        run("wipefs", &["-q", "-a", &self.disk]);
        if let Some((namespace, pv)) = &self.pmem_namespace {
            run("vgremove", &["-q", "-f", "-y", PMEM_VG]);
            run("pvremove", &["-q", "-y", pv]);
            run("ndctl", &["destroy-namespace", "-f", namespace]);
        }
        let _ = std::fs::remove_dir_all(CONFIG_DIR);
        if !failed.is_empty() {
            eprintln!("hostile_vm: cleaning up failed:\n{}", failed.join("\n"));
            if !std::thread::panicking() {
                panic!("hostile_vm: the suite's storage was not removed: {failed:?}");
            }
        }
    }
}

fn config_path(class: &str) -> PathBuf {
    Path::new(CONFIG_DIR).join(format!("{class}.yaml"))
}

/// The PVs of the suite's two VGs, whose metadata each case must leave unchanged.
fn physical_volumes() -> Vec<PhysicalVolume> {
    let select = format!("vg_name={VG}||vg_name={PMEM_VG}");
    let args = [
        "--noheadings",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        "pv_name,pe_start",
        "-S",
        &select,
    ];
    sh("pvs", &args)
        .lines()
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            Some((fields.next()?, fields.next()?))
        })
        .map(|(path, pe_start)| PhysicalVolume {
            path: PathBuf::from(path),
            pe_start: pe_start
                .parse()
                .unwrap_or_else(|e| panic!("pe_start {pe_start}: {e}")),
        })
        .collect()
}

fn backend(class: &str) -> Backend {
    let physical_volumes = physical_volumes();
    assert_eq!(physical_volumes.len(), 2, "one PV for each of {VG} and {PMEM_VG}");
    Backend {
        name: class.to_string(),
        daemon_args: vec!["--config".into(), config_path(class).display().to_string()],
        storage: Storage::Guest { physical_volumes },
        discards: !class.starts_with("pmem"),
    }
}

/// The cases compare LVM metadata bytes instead of `lvs` listings: prove that a tag
/// added to an LV, the smallest change a case could make, shows in that comparison.
fn metadata_changes_are_seen() {
    let storage = Storage::Guest {
        physical_volumes: physical_volumes(),
    };
    let scratch = Path::new(CONFIG_DIR);
    let before = sandbox::Snapshot::take(scratch, &[], &storage);
    let pool = format!("{VG}/{POOL}");
    sh("lvchange", &["-q", "--addtag", "hostile-probe", &pool]);
    let tagged = sandbox::Snapshot::take(scratch, &[], &storage);
    sh("lvchange", &["-q", "--deltag", "hostile-probe", &pool]);
    assert_ne!(
        tagged, before,
        "adding a tag to {pool} shows in the storage snapshot"
    );
    assert!(
        before.diff(&tagged).iter().any(|l| l.contains("lvm metadata on")),
        "{:?}",
        before.diff(&tagged)
    );
}

#[test]
fn node_calls_act_only_on_what_belongs_to_the_volume_on_lvm_and_pmem() {
    const NAME: &str = "node_calls_act_only_on_what_belongs_to_the_volume_on_lvm_and_pmem";
    if let Ok(class) = std::env::var(CLASS_ENV) {
        // The sandboxed child of one class.
        let scratch = sandbox::run_sandboxed_with(NAME, &Sandbox::guest(), &[])
            .expect("the child runs inside its sandbox");
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(node_cases::run(scratch, backend(&class)));
        return;
    }
    if !guest::in_guest(
        "hostile_vm",
        NAME,
        "run it in the tests/vm guest with tests/vm/run.sh (see this file's header)",
    ) {
        return;
    }
    let started = Instant::now();
    // The plan's vm.hostile (CI: one class of each backend); LOCALVOL_SELECT=vm.hostile=...
    // reruns one class's cases.
    let wanted = localvol_testkit::plan::classes("vm.hostile");
    let classes: Vec<&str> = CLASSES
        .iter()
        .map(|(class, _)| *class)
        .filter(|c| wanted.iter().any(|w| w == c))
        .collect();
    assert_eq!(
        classes.len(),
        wanted.len(),
        "vm.hostile {wanted:?}: this test's classes are {CLASSES:?}"
    );
    let storage = GuestStorage::set_up();
    metadata_changes_are_seen();
    for class in &classes {
        let class_started = Instant::now();
        let before = GuestStorage::state();
        let ran = sandbox::run_sandboxed_with(NAME, &Sandbox::guest(), &[(CLASS_ENV, *class)]);
        assert!(ran.is_none(), "the parent does not run a class itself");
        assert_eq!(
            GuestStorage::state(),
            before,
            "{class}: the run left LVs, namespaces or device-mapper devices behind"
        );
        eprintln!(
            "hostile_vm: {class}: passed in {:.1}s (daemon, baseline, cases, teardown)",
            class_started.elapsed().as_secs_f64()
        );
    }
    drop(storage);
    assert!(
        try_sh("vgs", &[VG]).is_err() && try_sh("vgs", &[PMEM_VG]).is_err(),
        "the suite's VGs are gone"
    );
    assert!(
        !namespaces().iter().any(|n| n.contains(PMEM_VG_NAMESPACE)),
        "the suite's namespace is gone"
    );
    eprintln!(
        "hostile_vm: {} classes in {:.1}s",
        classes.len(),
        started.elapsed().as_secs_f64()
    );
}
