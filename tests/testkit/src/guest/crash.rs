//! The tests/vm guest's storage as tests/crash_vm.rs sets it up (with its parent's
//! fixtures) and inspects it: one
//! VG with a thin pool on /dev/vda, region0 with empty labels, and what is on (or left
//! of) a volume, read with the tools themselves rather than through the daemon.

use std::path::{Path, PathBuf};
use std::sync::Once;

use crate::guest::{self, sh};

pub const VG: &str = "crashvg";
pub const POOL: &str = "crashpool";
pub use crate::guest::REGION;
pub const CONFIG_DIR: &str = "/run/localvol-crash-vm";
/// The device classes under test; each test runs a daemon with only its own class.
pub const CLASSES: &[(&str, &str)] = &[
    (
        "thick",
        "{name: thick, kind: lvm, volume-group: crashvg, spare-gb: 0}",
    ),
    (
        "thin",
        "{name: thin, kind: lvm-thin, volume-group: crashvg, thin-pool: {name: crashpool, overprovision-ratio: 4.0}}",
    ),
    ("pmem", "{name: pmem, kind: pmem, mode: direct, region: region0}"),
];

/// Runs a command; its stdout, or `None` when it failed.
pub fn try_sh(program: &str, args: &[&str]) -> Option<String> {
    guest::try_sh(program, args).ok()
}

static SETUP: Once = Once::new();

/// VG `crashvg` on /dev/vda with the zeroing thin pool `crashpool`, region0 with empty
/// labels, and one config file per class.
pub fn setup() {
    SETUP.call_once(|| {
        guest::volume_group(VG, &["/dev/vda"]);
        guest::thin_pool(VG, POOL, "1G", true);
        guest::reset_region();
        guest::single_class_configs(CONFIG_DIR, CLASSES);
    });
}

/// The size CreateVolume reports for `required` bytes on PMEM: the usable bytes of the
/// smallest fsdax namespace (a multiple of the 16 MiB alignment) holding them, where
/// usable = raw - roundup(8 KiB + (raw - 8 KiB) / 64, 2 MiB) (tests/fixtures/README.md).
pub fn fsdax_volume_size(required: i64) -> i64 {
    const MIB: i64 = 1 << 20;
    let usable = |raw: i64| raw - (8192 + (raw - 8192) / 64 + 2 * MIB - 1) / (2 * MIB) * 2 * MIB;
    (1..)
        .map(|n| usable(n * 16 * MIB))
        .find(|u| *u >= required)
        .unwrap()
}

/// The VG's LVs with their tags and the region's namespaces (all of them, disabled
/// ones too), for a failure message.
pub fn storage_state() -> String {
    let lvs = try_sh("lvs", &["-a", "-o", "lv_name,lv_attr,lv_size,lv_tags", VG]);
    let namespaces = try_sh("ndctl", &["list", "-N", "-i", "-r", REGION]);
    format!(
        "{}\n{}",
        lvs.unwrap_or_else(|| "lvs failed".into()),
        namespaces.unwrap_or_else(|| "ndctl list failed".into())
    )
}

/// The config file of a daemon serving only `class`.
pub fn config_path(class: &str) -> PathBuf {
    Path::new(CONFIG_DIR).join(format!("{class}.yaml"))
}

pub fn is_lvm(class: &str) -> bool {
    class != "pmem"
}

/// The namespaces of region0, as (name, blockdev).
pub fn namespaces() -> Vec<(String, String)> {
    guest::namespaces(false)
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap_or_default().to_string(),
                n["blockdev"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// What a kill inside `ndctl create-namespace` leaves when it lands after the uuid and
/// name of the namespace ndctl picked were written and before its size was: written
/// here by hand into every idle namespace of the region (ndctl picks namespace0.0 when
/// it is idle, the seed otherwise). Returns the namespaces written.
pub fn interrupt_namespace_setup(name: &str) -> Vec<String> {
    let devices = Path::new("/sys/bus/nd/devices");
    let mut written = Vec::new();
    for entry in std::fs::read_dir(devices).unwrap() {
        let dev = entry.unwrap().file_name().to_string_lossy().into_owned();
        let attr = |a: &str| devices.join(&dev).join(a);
        if !dev.starts_with("namespace")
            || std::fs::read_to_string(attr("size")).map_or(true, |s| s.trim() != "0")
        {
            continue;
        }
        let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap();
        std::fs::write(attr("uuid"), uuid.trim()).unwrap();
        std::fs::write(attr("alt_name"), name).unwrap();
        written.push(dev);
    }
    written
}

/// The volume's block device, if it exists (the LV and namespace are named after the
/// volume's token, which for these names is the name itself).
pub fn volume_device(class: &str, name: &str) -> Option<PathBuf> {
    if is_lvm(class) {
        let path = Path::new("/dev").join(VG).join(name);
        return path.exists().then_some(path);
    }
    namespaces()
        .into_iter()
        .find(|(n, dev)| n == name && !dev.is_empty())
        .map(|(_, dev)| Path::new("/dev").join(dev))
}

/// The signature blkid reads from the device itself (`-p`: no cache), if any.
pub fn signature(device: &Path) -> Option<String> {
    let out = try_sh("blkid", &["-p", "-o", "export", device.to_str().unwrap()])?;
    out.lines()
        .find_map(|l| l.strip_prefix("TYPE=").or_else(|| l.strip_prefix("PTTYPE=")))
        .map(str::to_string)
}

/// The filesystem UUID of the device.
pub fn uuid(device: &Path) -> String {
    let uuid = sh(
        "blkid",
        &["-p", "-s", "UUID", "-o", "value", device.to_str().unwrap()],
    )
    .trim()
    .to_string();
    assert!(!uuid.is_empty(), "{} has a filesystem UUID", device.display());
    uuid
}

/// The device mounted at `path`, from this namespace's mount table.
pub fn mounted_device(path: &Path) -> PathBuf {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for line in table.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.get(4) == Some(&path.to_str().unwrap()) {
            let after = line.split(" - ").nth(1).unwrap();
            return PathBuf::from(after.split(' ').nth(1).unwrap());
        }
    }
    panic!("nothing is mounted at {}", path.display());
}

/// The volume's format mark: `Some(true)` while a format is unfinished, `Some(false)`
/// once finished, `None` without a mark (no such volume, or never formatted on LVM).
/// An LV tagged `fs-uuid` keeps `format=formatting` for good: its format is finished
/// once blkid finds that UUID on the device, and for xfs `xfs_db` finds mkfs's
/// in-progress flag clear (blkid reports an xfs in progress all the same).
pub fn format_unfinished(class: &str, data: &Path, name: &str) -> Option<bool> {
    if is_lvm(class) {
        let tags = try_sh("lvs", &["--noheadings", "-o", "lv_tags", &format!("{VG}/{name}")])?;
        if tags.contains("localvol.csi.dev/format=formatting") {
            let Some(chosen) = tags
                .trim()
                .split(',')
                .find_map(|t| t.strip_prefix("localvol.csi.dev/fs-uuid="))
            else {
                return Some(true);
            };
            let device = format!("/dev/{VG}/{name}");
            let probe = |tag: &str| try_sh("blkid", &["-p", "-s", tag, "-o", "value", &device]);
            let found = probe("UUID").unwrap_or_default();
            let in_progress = probe("TYPE").as_deref().map(str::trim) == Some("xfs")
                && try_sh("xfs_db", &["-r", "-c", "sb 0", "-c", "p inprogress", &device])
                    .is_none_or(|out| out.trim() != "inprogress = 0");
            return Some(found.trim() != chosen || in_progress);
        }
        return tags
            .contains("localvol.csi.dev/format=formatted")
            .then_some(false);
    }
    let record = data.join("pmem").join(class).join(format!("{name}.json"));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(record).ok()?).unwrap();
    json["formatted"].as_bool().map(|formatted| !formatted)
}

/// What is left of a class's volumes in the storage: LVs (and their temporary zeroing
/// LVs), device-mapper devices, namespaces. Besides the pool, only volumes of this
/// test live in the VG and region, so anything else is reported too.
pub fn leftovers(class: &str) -> Vec<String> {
    let ours = format!("pvc-crash-{class}-");
    let mut left: Vec<String> = sh("lvs", &["--noheadings", "-o", "lv_name,lv_tags", VG])
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty() && l.split_whitespace().next() != Some(POOL))
        .filter(|l| l.contains(&ours) || !l.contains("pvc-crash-"))
        .collect();
    let dm = ours.replace('-', "--");
    left.extend(
        sh("dmsetup", &["ls"])
            .lines()
            .filter(|l| l.contains(&dm))
            .map(|l| format!("dm {l}")),
    );
    left.extend(
        namespaces()
            .into_iter()
            .map(|(n, dev)| format!("namespace {n} {dev}")),
    );
    left
}
