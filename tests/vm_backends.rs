//! The LVM and PMEM backends on real device-mapper and an emulated NVDIMM, driven over
//! the daemon's CSI socket as kubelet and external-provisioner do. They need the
//! tests/vm guest: run them with `tests/vm/suite.sh backends`, which sets up nothing itself
//! but boots the guest with two disks and an NVDIMM and requires every test to run.
//!
//! On the host they report that they did not run and pass, unless
//! `LOCALVOL_VM_SUITE=1` says they must run (then they fail outside the guest).
//!
//! In the guest, the first test to run prepares the storage once: VG `vmvg` on
//! /dev/vda and /dev/vdb with thin pools `pool0` (zeroing) and `pool1` (no zeroing),
//! region0 with initialised labels, and VG `pmemvg` on one fsdax namespace. Each
//! step's wall time is printed as `vm-step <class> <step> <seconds>`.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;
use std::time::{Duration, Instant};

use common::Daemon;
use common::limits::{self, Class};
use localvol::proto::csi::v1 as csi;
use tonic::Code;

const MIB: u64 = 1 << 20;
const VG: &str = "vmvg";
const PMEM_VG: &str = "pmemvg";
const REGION: &str = "region0";
const CONFIG_DIR: &str = "/run/localvol-vm-suite";

const CONFIG: &str = "\
device-classes:
  - name: thick
    kind: lvm
    volume-group: vmvg
    spare-gb: 1
    default: true
  - name: striped
    kind: lvm
    volume-group: vmvg
    spare-gb: 1
    stripe: 2
    stripe-size: 64k
  - name: thin
    kind: lvm-thin
    volume-group: vmvg
    thin-pool: {name: pool0, overprovision-ratio: 2.0}
  - name: thin-nozero
    kind: lvm-thin
    volume-group: vmvg
    thin-pool: {name: pool1, overprovision-ratio: 1.0}
  - name: pmem
    kind: pmem
    mode: direct
    region: region0
  - name: pmem-lvm
    kind: pmem
    mode: lvm
    volume-group: pmemvg
";

/// True in the guest. On the host: fails if the suite is required, else says so.
fn in_guest(test: &str) -> bool {
    if std::env::var("VMTEST_GUEST").as_deref() == Ok("1") {
        return true;
    }
    if std::env::var("LOCALVOL_VM_SUITE").as_deref() == Ok("1") {
        panic!("{test}: LOCALVOL_VM_SUITE=1 but this is not the VM guest; run tests/vm/suite.sh backends");
    }
    eprintln!("vm_backends: {test} not run: run through tests/vm/suite.sh backends");
    false
}

// ------------------------------------------------------------------ host commands

/// Runs a command that must succeed; returns its stdout.
fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

static SETUP: Once = Once::new();

fn config_path() -> PathBuf {
    Path::new(CONFIG_DIR).join("config.yaml")
}

fn setup() {
    SETUP.call_once(|| {
        let started = Instant::now();
        sh("pvcreate", &["-q", "/dev/vda", "/dev/vdb"]);
        sh("vgcreate", &["-q", VG, "/dev/vda", "/dev/vdb"]);
        sh("lvcreate", &["-q", "-y", "-T", "vmvg/pool0", "-L", "256M", "-Zy"]);
        sh("lvcreate", &["-q", "-y", "-T", "vmvg/pool1", "-L", "64M", "-Zn"]);
        sh("ndctl", &["disable-region", REGION]);
        sh("ndctl", &["init-labels", "-f", "nmem0"]);
        sh("ndctl", &["enable-region", REGION]);
        let ns = sh(
            "ndctl",
            &[
                "create-namespace",
                "-r",
                REGION,
                "-m",
                "fsdax",
                "-M",
                "dev",
                "-s",
                "768M",
                "-n",
                "vm-pmemvg",
            ],
        );
        let dev = format!("/dev/{}", json_field(&ns, "blockdev"));
        sh("pvcreate", &["-q", &dev]);
        sh("vgcreate", &["-q", PMEM_VG, &dev]);
        std::fs::create_dir_all(CONFIG_DIR).unwrap();
        std::fs::write(config_path(), CONFIG).unwrap();
        step_time("setup", "vg+pools+region+pmemvg", started.elapsed());
    });
}

/// A string field of ndctl's pretty JSON (`"key":"value"`).
fn json_field(json: &str, key: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} in {json}"))
        .to_string()
}

fn step_time(class: &str, step: &str, elapsed: Duration) {
    eprintln!("vm-step {class:<11} {step:<36} {:>7.2}s", elapsed.as_secs_f64());
}

/// Times each step of one class's scenario.
struct Steps {
    class: String,
    last: Instant,
}

impl Steps {
    fn new(class: &str) -> Self {
        Self {
            class: class.to_string(),
            last: Instant::now(),
        }
    }

    fn done(&mut self, step: &str) {
        step_time(&self.class, step, self.last.elapsed());
        self.last = Instant::now();
    }
}

/// LVs of `vg` whose tags name the CreateVolume `name`.
fn lvs_named(vg: &str, name: &str) -> Vec<String> {
    sh("lvs", &["--noheadings", "-o", "lv_name,lv_tags", vg])
        .lines()
        .filter(|l| l.contains(&format!("localvol.csi.dev/name={name}")))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect()
}

/// Namespaces of region0 with this name.
fn namespaces_named(name: &str) -> Vec<serde_json::Value> {
    let out = sh("ndctl", &["list", "-N", "-i", "-r", REGION]);
    if out.trim().is_empty() {
        return Vec::new();
    }
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let all = match v {
        serde_json::Value::Array(a) => a,
        one => vec![one],
    };
    all.into_iter().filter(|n| n["name"] == name).collect()
}

/// Whether anything of the volume `name` is left in the class's storage.
fn leftovers(class: &str, name: &str) -> Vec<String> {
    match class {
        "pmem" => namespaces_named(name).iter().map(|n| n.to_string()).collect(),
        "pmem-lvm" => lvs_named(PMEM_VG, name),
        _ => lvs_named(VG, name),
    }
}

fn block_size(path: &Path) -> u64 {
    let mut f = std::fs::File::open(path).unwrap();
    f.seek(SeekFrom::End(0)).unwrap()
}

fn read_all(path: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    bytes
}

fn write_at(path: &Path, offset: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
}

fn mount_options(path: &Path) -> String {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(path.to_str().unwrap()))
        .unwrap_or_else(|| panic!("{} is not mounted", path.display()))
        .to_string()
}

// ------------------------------------------------------------------ CSI calls

fn mount_cap(fs: &str) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: fs.to_string(),
                ..Default::default()
            },
        )),
    }
}

fn block_cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Block(
            csi::volume_capability::BlockVolume {},
        )),
    }
}

/// A CSI client of one daemon socket, with kubelet's paths under `dir`.
struct Csi {
    socket: PathBuf,
    dir: PathBuf,
}

impl Csi {
    fn of(d: &Daemon) -> Self {
        Self {
            socket: d.socket.clone(),
            dir: d.dir.path().to_path_buf(),
        }
    }

    fn staging(&self, name: &str) -> PathBuf {
        self.dir.join("staging").join(name)
    }

    fn target(&self, name: &str) -> PathBuf {
        self.dir.join("pods").join(name)
    }

    async fn controller(&self) -> csi::controller_client::ControllerClient<tonic::transport::Channel> {
        csi::controller_client::ControllerClient::new(common::connect(&self.socket).await)
    }

    async fn node(&self) -> csi::node_client::NodeClient<tonic::transport::Channel> {
        csi::node_client::NodeClient::new(common::connect(&self.socket).await)
    }

    async fn create(
        &self,
        class: &str,
        name: &str,
        size: u64,
        cap: &csi::VolumeCapability,
    ) -> Result<csi::Volume, tonic::Status> {
        let req = csi::CreateVolumeRequest {
            name: name.to_string(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: size as i64,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap.clone()],
            parameters: [
                ("localvol.csi.dev/device-class".to_string(), class.to_string()),
                ("csi.storage.k8s.io/pvc/name".to_string(), format!("claim-{name}")),
                (
                    "csi.storage.k8s.io/pvc/namespace".to_string(),
                    "vm-suite".to_string(),
                ),
            ]
            .into(),
            ..Default::default()
        };
        let volume = self
            .controller()
            .await
            .create_volume(req)
            .await?
            .into_inner()
            .volume;
        Ok(volume.unwrap())
    }

    async fn stage(&self, id: &str, name: &str, cap: &csi::VolumeCapability) -> Result<(), tonic::Status> {
        std::fs::create_dir_all(self.staging(name)).unwrap();
        self.node()
            .await
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: id.to_string(),
                staging_target_path: self.staging(name).display().to_string(),
                volume_capability: Some(cap.clone()),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    async fn publish(&self, id: &str, name: &str, cap: &csi::VolumeCapability) -> Result<(), tonic::Status> {
        std::fs::create_dir_all(self.dir.join("pods")).unwrap();
        self.node()
            .await
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: id.to_string(),
                staging_target_path: self.staging(name).display().to_string(),
                target_path: self.target(name).display().to_string(),
                volume_capability: Some(cap.clone()),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    async fn unpublish(&self, id: &str, name: &str) -> Result<(), tonic::Status> {
        self.node()
            .await
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: id.to_string(),
                target_path: self.target(name).display().to_string(),
            })
            .await
            .map(drop)
    }

    async fn unstage(&self, id: &str, name: &str) -> Result<(), tonic::Status> {
        self.node()
            .await
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: id.to_string(),
                staging_target_path: self.staging(name).display().to_string(),
            })
            .await
            .map(drop)
    }

    async fn delete(&self, id: &str) -> Result<(), tonic::Status> {
        self.controller()
            .await
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.to_string(),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    async fn expand_controller(
        &self,
        id: &str,
        size: u64,
    ) -> Result<csi::ControllerExpandVolumeResponse, tonic::Status> {
        self.controller()
            .await
            .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                volume_id: id.to_string(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: size as i64,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner())
    }

    async fn expand_node(
        &self,
        id: &str,
        name: &str,
        size: u64,
        cap: &csi::VolumeCapability,
    ) -> Result<u64, tonic::Status> {
        self.node()
            .await
            .node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: id.to_string(),
                volume_path: self.target(name).display().to_string(),
                staging_target_path: self.staging(name).display().to_string(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: size as i64,
                    limit_bytes: 0,
                }),
                volume_capability: Some(cap.clone()),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().capacity_bytes as u64)
    }

    async fn stats_total(&self, id: &str, name: &str) -> u64 {
        let stats = self
            .node()
            .await
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: id.to_string(),
                volume_path: self.target(name).display().to_string(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(
            !stats.volume_condition.as_ref().unwrap().abnormal,
            "{:?}",
            stats.volume_condition
        );
        stats
            .usage
            .iter()
            .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
            .unwrap()
            .total as u64
    }

    async fn capacity(&self, class: &str) -> (u64, u64) {
        let r = self
            .controller()
            .await
            .get_capacity(csi::GetCapacityRequest {
                parameters: [("localvol.csi.dev/device-class".to_string(), class.to_string())].into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        (r.available_capacity as u64, r.maximum_volume_size.unwrap() as u64)
    }

    async fn listed(&self, id: &str) -> bool {
        self.controller()
            .await
            .list_volumes(csi::ListVolumesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .entries
            .iter()
            .any(|e| e.volume.as_ref().unwrap().volume_id == id)
    }
}

// ------------------------------------------------------------------ lifecycles

/// create, stage, publish, write+read, stats, expand online, unpublish, unstage,
/// delete, and nothing left: for one filesystem volume.
async fn filesystem_lifecycle(c: &Csi, class: &str, fs: &str, size: u64, grown: u64) {
    let mut t = Steps::new(class);
    let name = format!("{class}-{fs}");
    let cap = mount_cap(fs);
    let vol = c.create(class, &name, size, &cap).await.unwrap();
    let id = vol.volume_id.clone();
    let got = vol.capacity_bytes as u64;
    assert!(got >= size && got < size + 16 * MIB, "{class}: {got} for {size}");
    t.done(&format!("create {fs}"));
    if class != "pmem" {
        let lv = leftovers(class, &name);
        assert_eq!(lv.len(), 1, "one LV tagged with the volume's name: {lv:?}");
    }
    c.stage(&id, &name, &cap).await.unwrap();
    t.done(&format!("stage {fs} (mkfs+mount)"));
    if class.starts_with("pmem") {
        let line = mount_options(&c.staging(&name));
        assert!(line.contains("dax"), "{class} mounts with -o dax: {line}");
    }
    c.publish(&id, &name, &cap).await.unwrap();
    t.done("publish");
    let file = c.target(&name).join("data");
    std::fs::write(&file, b"localvol vm suite").unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), b"localvol vm suite");
    t.done("write+read");
    let before = c.stats_total(&id, &name).await;
    assert!(
        before > got / 2 && before <= got,
        "{class}: fs of {before} bytes on {got}"
    );
    t.done("stats");
    if class == "pmem" {
        let err = c.expand_controller(&id, grown).await.unwrap_err();
        assert_eq!(err.code(), Code::OutOfRange, "{}", err.message());
        assert!(err.message().contains("cannot grow"), "{}", err.message());
        let same = c.expand_controller(&id, got).await.unwrap();
        assert_eq!(same.capacity_bytes as u64, got);
        t.done("expand refused (fixed size)");
    } else {
        let expanded = c.expand_controller(&id, grown).await.unwrap();
        assert_eq!(expanded.capacity_bytes as u64, grown);
        assert!(expanded.node_expansion_required);
        t.done("expand controller (lvextend)");
        let device = c.expand_node(&id, &name, grown, &cap).await.unwrap();
        assert_eq!(device, grown);
        let after = c.stats_total(&id, &name).await;
        assert!(
            after > before + (grown - size) / 2,
            "{class} {fs} grew online: {before} -> {after}"
        );
        t.done("expand node (fs grow online)");
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"localvol vm suite");
    c.unpublish(&id, &name).await.unwrap();
    t.done("unpublish");
    c.unstage(&id, &name).await.unwrap();
    t.done("unstage");
    c.delete(&id).await.unwrap();
    t.done("delete");
    assert!(
        leftovers(class, &name).is_empty(),
        "{class}: {:?}",
        leftovers(class, &name)
    );
    assert!(!c.listed(&id).await);
    c.delete(&id).await.unwrap();
}

/// The same for a raw block volume: the device is published, written and read.
async fn block_lifecycle(c: &Csi, class: &str, size: u64, grown: u64) {
    let mut t = Steps::new(class);
    let name = format!("{class}-block");
    let cap = block_cap();
    let vol = c.create(class, &name, size, &cap).await.unwrap();
    let id = vol.volume_id.clone();
    let got = vol.capacity_bytes as u64;
    t.done("create block (zeroed)");
    c.stage(&id, &name, &cap).await.unwrap();
    c.publish(&id, &name, &cap).await.unwrap();
    t.done("stage+publish block");
    let dev = c.target(&name);
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&dev).unwrap().file_type().is_block_device());
    assert_eq!(block_size(&dev), got, "{class}: the device is the volume's size");
    write_at(&dev, 0, &[0xC3; 4096]);
    write_at(&dev, got - 4096, &[0x3C; 4096]);
    let bytes = read_all(&dev);
    assert!(
        bytes[..4096].iter().all(|b| *b == 0xC3) && bytes[bytes.len() - 4096..].iter().all(|b| *b == 0x3C)
    );
    assert!(
        bytes[4096..bytes.len() - 4096].iter().all(|b| *b == 0),
        "{class}: a new block volume reads zeros"
    );
    t.done("write+read block");
    assert_eq!(c.stats_total(&id, &name).await, got);
    if class == "pmem" {
        let err = c.expand_controller(&id, grown).await.unwrap_err();
        assert_eq!(err.code(), Code::OutOfRange, "{}", err.message());
    } else {
        let expanded = c.expand_controller(&id, grown).await.unwrap();
        assert_eq!(expanded.capacity_bytes as u64, grown);
        assert!(!expanded.node_expansion_required, "an LV device grows by itself");
        assert_eq!(block_size(&dev), grown);
        let tail = read_all(&dev);
        assert!(
            tail[got as usize..].iter().all(|b| *b == 0),
            "{class}: the extension reads zeros"
        );
        assert_eq!(&tail[..4096], &[0xC3; 4096]);
        t.done(if class == "thin" {
            "expand block"
        } else {
            "expand block (pre-zeroed extents)"
        });
    }
    c.unpublish(&id, &name).await.unwrap();
    c.unstage(&id, &name).await.unwrap();
    c.delete(&id).await.unwrap();
    t.done("unpublish+unstage+delete");
    assert!(
        leftovers(class, &name).is_empty(),
        "{class}: {:?}",
        leftovers(class, &name)
    );
}

async fn daemon() -> Daemon {
    let dir = tempfile::Builder::new().prefix("localvol-vm-").tempdir().unwrap();
    let started = Instant::now();
    let d = Daemon::start_with_config(dir, "vm-node", &config_path()).await;
    step_time("daemon", "start (open 6 classes)", started.elapsed());
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_thick_lifecycle() {
    if !in_guest("lvm_thick_lifecycle") {
        return;
    }
    setup();
    let d = daemon().await;
    let c = Csi::of(&d);
    filesystem_lifecycle(&c, "thick", "ext4", 64 * MIB, 128 * MIB).await;
    filesystem_lifecycle(&c, "thick", "xfs", 320 * MIB, 480 * MIB).await;
    block_lifecycle(&c, "thick", 16 * MIB, 32 * MIB).await;
    // Two stripes on two PVs; the extension is pre-zeroed on both.
    block_lifecycle(&c, "striped", 16 * MIB, 32 * MIB).await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_thin_lifecycle() {
    if !in_guest("lvm_thin_lifecycle") {
        return;
    }
    setup();
    let d = daemon().await;
    let c = Csi::of(&d);
    filesystem_lifecycle(&c, "thin", "ext4", 64 * MIB, 128 * MIB).await;
    filesystem_lifecycle(&c, "thin", "xfs", 320 * MIB, 480 * MIB).await;
    block_lifecycle(&c, "thin", 16 * MIB, 32 * MIB).await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pmem_direct_lifecycle() {
    if !in_guest("pmem_direct_lifecycle") {
        return;
    }
    setup();
    let d = daemon().await;
    let c = Csi::of(&d);
    filesystem_lifecycle(&c, "pmem", "ext4", 64 * MIB, 128 * MIB).await;
    filesystem_lifecycle(&c, "pmem", "xfs", 320 * MIB, 480 * MIB).await;
    block_lifecycle(&c, "pmem", 16 * MIB, 32 * MIB).await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pmem_lvm_lifecycle() {
    if !in_guest("pmem_lvm_lifecycle") {
        return;
    }
    setup();
    let d = daemon().await;
    let c = Csi::of(&d);
    filesystem_lifecycle(&c, "pmem-lvm", "ext4", 64 * MIB, 128 * MIB).await;
    filesystem_lifecycle(&c, "pmem-lvm", "xfs", 320 * MIB, 400 * MIB).await;
    block_lifecycle(&c, "pmem-lvm", 16 * MIB, 32 * MIB).await;
    d.stop().await;
}

// ------------------------------------------------------------------ capacity

/// The usable bytes of an fsdax namespace of `raw` bytes, as tests/fixtures/README.md
/// derives it from the kernel's sizes: raw - roundup(8K + (raw - 8K) / 64, 2M).
fn fsdax_usable(raw: u64) -> u64 {
    let reserve = (8192 + (raw - 8192) / 64).div_ceil(2 * MIB) * 2 * MIB;
    raw.saturating_sub(reserve)
}

fn numbers(program: &str, args: &[&str]) -> Vec<u64> {
    sh(program, args)
        .split_whitespace()
        .map(|n| n.parse().unwrap_or_else(|_| panic!("{program} {args:?}: {n:?}")))
        .collect()
}

/// What the tools say a class can still hold: (available, largest volume).
fn tool_capacity(class: &str) -> (u64, u64) {
    let vg_free = |vg: &str| {
        numbers(
            "vgs",
            &["--noheadings", "--units", "b", "--nosuffix", "-o", "vg_free", vg],
        )[0]
    };
    let align = |bytes: u64, to: u64| bytes / to * to;
    match class {
        "thick" => {
            let a = align(vg_free(VG).saturating_sub(1 << 30), 4 * MIB);
            (a, a)
        }
        "striped" => {
            let a = align(vg_free(VG).saturating_sub(1 << 30), 8 * MIB);
            (a, a)
        }
        "thin" => {
            let pool = numbers(
                "lvs",
                &[
                    "--noheadings",
                    "--units",
                    "b",
                    "--nosuffix",
                    "-o",
                    "lv_size",
                    "vmvg/pool0",
                ],
            )[0];
            let thin: u64 = sh(
                "lvs",
                &[
                    "--noheadings",
                    "--units",
                    "b",
                    "--nosuffix",
                    "-o",
                    "lv_size,pool_lv",
                    VG,
                ],
            )
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some("pool0"))
            .map(|l| l.split_whitespace().next().unwrap().parse::<u64>().unwrap())
            .sum();
            let a = align((2 * pool).saturating_sub(thin), 4 * MIB);
            (a, a)
        }
        "pmem" => {
            let region: serde_json::Value =
                serde_json::from_str(&sh("ndctl", &["list", "-R", "-r", REGION])).unwrap();
            let region = if region.is_array() {
                region[0].clone()
            } else {
                region
            };
            let usable = |key: &str| fsdax_usable(align(region[key].as_u64().unwrap(), 16 * MIB));
            (usable("available_size"), usable("max_available_extent"))
        }
        "pmem-lvm" => {
            let a = align(vg_free(PMEM_VG), 4 * MIB);
            (a, a)
        }
        other => panic!("{other}"),
    }
}

/// Everything in the storage the classes use, to compare before and after.
fn storage_snapshot() -> String {
    format!(
        "{}\n{}\n{}",
        sh("lvs", &["--noheadings", "-o", "lv_name,lv_size,lv_tags", VG]),
        sh("lvs", &["--noheadings", "-o", "lv_name,lv_size,lv_tags", PMEM_VG]),
        sh("ndctl", &["list", "-N", "-i", "-r", REGION]),
    )
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(files_under(&path));
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_matches_the_tools_and_too_big_leaves_nothing() {
    if !in_guest("capacity_matches_the_tools_and_too_big_leaves_nothing") {
        return;
    }
    setup();
    let d = daemon().await;
    let c = Csi::of(&d);
    let data = d.dir.path().join("data");
    for class in ["thick", "striped", "thin", "pmem", "pmem-lvm"] {
        let mut t = Steps::new(class);
        let (available, max) = c.capacity(class).await;
        t.done("GetCapacity");
        let expected = tool_capacity(class);
        assert_eq!(
            (available, max),
            expected,
            "{class}: GetCapacity vs vgs/lvs/ndctl"
        );
        assert!(max > 0, "{class} has room");
        eprintln!("capacity {class}: available {available}, largest volume {max} (= tools)");

        let before = storage_snapshot();
        let records = files_under(&data);
        let too_big = max + 16 * MIB;
        for cap in [mount_cap("ext4"), block_cap()] {
            let err = c
                .create(class, &format!("{class}-too-big"), too_big, &cap)
                .await
                .unwrap_err();
            assert_eq!(err.code(), Code::ResourceExhausted, "{class}: {}", err.message());
        }
        t.done("too-big create refused x2");
        assert_eq!(
            storage_snapshot(),
            before,
            "{class}: a refused create leaves no LV or namespace"
        );
        assert_eq!(files_under(&data), records, "{class}: and no record");
    }

    // Block volumes on a pool that does not zero: refused, nothing made.
    let before = storage_snapshot();
    let err = c
        .create("thin-nozero", "nozero-block", 16 * MIB, &block_cap())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().contains("does not zero"), "{}", err.message());
    assert_eq!(storage_snapshot(), before);
    d.stop().await;
}

/// `limit_bytes` kept and GetCapacity's largest volume made, on each class (see
/// tests/common/limits.rs): whole extents of the VG, usable sizes of fsdax namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_kept_and_the_largest_volume_fits() {
    if !in_guest("limits_are_kept_and_the_largest_volume_fits") {
        return;
    }
    setup();
    let d = daemon().await;
    let extent = |vg: &str| {
        numbers(
            "vgs",
            &[
                "--noheadings",
                "--units",
                "b",
                "--nosuffix",
                "-o",
                "vg_extent_size",
                vg,
            ],
        )[0]
    };
    let lvm = |name, vg| Class {
        name: Some(name),
        small: 16 * extent(vg),
        large: 32 * extent(vg),
        grows: true,
    };
    for class in [
        lvm("thick", VG),
        lvm("thin", VG),
        lvm("pmem-lvm", PMEM_VG),
        Class {
            name: Some("pmem"),
            small: fsdax_usable(80 * MIB),
            large: fsdax_usable(160 * MIB),
            grows: false,
        },
    ] {
        let mut t = Steps::new(class.name.unwrap());
        limits::check(&d.socket, class).await;
        t.done("limits and largest volume");
    }
    d.stop().await;
}

// ------------------------------------------------------------------ restarts

/// The daemon binary: `LOCALVOL_BIN` (tests/vm/suite.sh passes a private copy), else the
/// one cargo built with this test.
fn localvol_bin() -> PathBuf {
    std::env::var_os("LOCALVOL_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_localvol")), PathBuf::from)
}

/// The real `localvol` binary, in its own process group, so that a kill takes its
/// children (lvcreate, blkdiscard, mkfs) with it, as a container's death does.
struct Process {
    child: std::process::Child,
    csi: Csi,
}

impl Process {
    async fn start(dir: &Path, config: &Path) -> Self {
        use std::os::unix::process::CommandExt;
        let started = Instant::now();
        let socket = dir.join("csi.sock");
        let child = Command::new(localvol_bin())
            .arg("serve")
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .args(["--node-id", "vm-node", "--metrics-addr", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--kubelet-root-dir")
            .arg(dir)
            .arg("--config")
            .arg(config)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .process_group(0)
            .spawn()
            .unwrap();
        let mut p = Self {
            child,
            csi: Csi {
                socket: socket.clone(),
                dir: dir.to_path_buf(),
            },
        };
        loop {
            if let Some(status) = p.child.try_wait().unwrap() {
                panic!("localvol exited at start: {status}");
            }
            if tokio::net::UnixStream::connect(&socket).await.is_ok() {
                let mut identity = csi::identity_client::IdentityClient::new(common::connect(&socket).await);
                if let Ok(probe) = identity.probe(csi::ProbeRequest {}).await
                    && probe.into_inner().ready == Some(true)
                {
                    break;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "localvol did not become ready"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        step_time("daemon", "process start to ready", started.elapsed());
        p
    }

    /// SIGKILL to the daemon and everything it started.
    fn kill(mut self) {
        let pgid = nix::unistd::Pid::from_raw(-(self.child.id() as i32));
        nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL).unwrap();
        self.child.wait().unwrap();
    }
}

/// A config with only `class` of CONFIG (a restart then opens just that class).
fn single_class_config(class: &str) -> PathBuf {
    let start = CONFIG.find(&format!("  - name: {class}\n")).unwrap();
    let rest = &CONFIG[start + 1..];
    let end = rest
        .find("\n  - name:")
        .map_or(CONFIG.len(), |i| start + 1 + i + 1);
    let yaml = format!("device-classes:\n{}", &CONFIG[start..end]);
    let path = Path::new(CONFIG_DIR).join(format!("{class}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path
}

/// Retries a call the way a CO does while a killed call's leftovers settle.
async fn retried<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    for attempt in 1.. {
        match call().await {
            Ok(v) => return v,
            Err(s)
                if attempt < 10
                    && matches!(
                        s.code(),
                        Code::Aborted | Code::Unavailable | Code::FailedPrecondition
                    ) =>
            {
                eprintln!(
                    "{what}: attempt {attempt}: {:?} {}; retrying",
                    s.code(),
                    s.message()
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(s) => panic!("{what}: {:?} {}", s.code(), s.message()),
        }
    }
    unreachable!()
}

/// A filesystem volume's whole life with the daemon SIGKILLed after every step; each
/// step is then repeated against the new daemon, which must accept it.
async fn restart_lifecycle(class: &str) {
    let dir = tempfile::Builder::new()
        .prefix("localvol-vm-restart-")
        .tempdir()
        .unwrap();
    let config = single_class_config(class);
    let name = format!("{class}-restart");
    let cap = mount_cap("ext4");
    let mut t = Steps::new(class);
    let mut p = Process::start(dir.path(), &config).await;
    macro_rules! step {
        ($label:expr, |$c:ident| $call:expr) => {{
            let first = {
                let $c = &p.csi;
                $call
                    .await
                    .unwrap_or_else(|s| panic!("{}: {:?} {}", $label, s.code(), s.message()))
            };
            p.kill();
            p = Process::start(dir.path(), &config).await;
            let again = {
                let $c = &p.csi;
                retried($label, || $call).await
            };
            t.done(concat!($label, " +kill+retry"));
            (first, again)
        }};
    }
    let (vol, again) = step!("create", |c| c.create(class, &name, 64 * MIB, &cap));
    assert_eq!(vol.volume_id, again.volume_id);
    assert_eq!(vol.capacity_bytes, again.capacity_bytes);
    let id = vol.volume_id.clone();
    step!("stage", |c| c.stage(&id, &name, &cap));
    step!("publish", |c| c.publish(&id, &name, &cap));
    std::fs::write(p.csi.target(&name).join("kept"), b"across restarts").unwrap();
    if class == "pmem" {
        let err = p.csi.expand_controller(&id, 128 * MIB).await.unwrap_err();
        assert_eq!(err.code(), Code::OutOfRange);
    } else {
        step!("expand controller", |c| c.expand_controller(&id, 128 * MIB));
        step!("expand node", |c| c.expand_node(&id, &name, 128 * MIB, &cap));
    }
    assert_eq!(
        std::fs::read(p.csi.target(&name).join("kept")).unwrap(),
        b"across restarts"
    );
    step!("unpublish", |c| c.unpublish(&id, &name));
    step!("unstage", |c| c.unstage(&id, &name));
    step!("delete", |c| c.delete(&id));
    assert!(
        leftovers(class, &name).is_empty(),
        "{class}: {:?}",
        leftovers(class, &name)
    );
    assert!(!p.csi.listed(&id).await);
    p.kill();
}

/// When to kill the daemon during a create.
#[derive(Clone, Copy, Debug)]
enum KillAt {
    /// A fixed time after the call was sent.
    After(Duration),
    /// As soon as the LV's device node or the namespace exists, before the create
    /// could finish (it still has to zero the volume and commit its record).
    Visible,
}

fn visible(class: &str, name: &str) -> bool {
    if class == "pmem" {
        sh("ndctl", &["list", "-N", "-r", REGION]).contains(&format!("\"name\":\"{name}\""))
    } else {
        Path::new("/dev").join(VG).join(name).exists()
    }
}

/// Kills the daemon (and its lvcreate/ndctl/blkdiscard) while a block volume is being
/// created; the retried create must finish a whole, zeroed volume.
async fn killed_during_create(class: &str) {
    let dir = tempfile::Builder::new()
        .prefix("localvol-vm-kill-")
        .tempdir()
        .unwrap();
    let config = single_class_config(class);
    let cap = block_cap();
    for kill_at in [KillAt::After(Duration::from_millis(300)), KillAt::Visible] {
        let mut t = Steps::new(class);
        let name = format!(
            "{class}-kill-{}",
            if matches!(kill_at, KillAt::Visible) {
                "visible"
            } else {
                "early"
            }
        );
        // Old bytes where the volume will likely be placed, so "reads zeros" means zeroed.
        dirty(class, 32 * MIB);
        let p = Process::start(dir.path(), &config).await;
        let socket = p.csi.socket.clone();
        let (class_owned, name_owned) = (class.to_string(), name.clone());
        let dir_owned = dir.path().to_path_buf();
        let call = tokio::spawn(async move {
            let c = Csi {
                socket,
                dir: dir_owned,
            };
            c.create(&class_owned, &name_owned, 32 * MIB, &block_cap()).await
        });
        match kill_at {
            KillAt::After(delay) => tokio::time::sleep(delay).await,
            KillAt::Visible => {
                let started = Instant::now();
                while !visible(class, &name) {
                    assert!(
                        !call.is_finished(),
                        "{class}: the create finished before it could be seen"
                    );
                    assert!(
                        started.elapsed() < Duration::from_secs(120),
                        "{class}: {name} never appeared"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        p.kill();
        let outcome = call.await.unwrap();
        let state = match class {
            "pmem" => format!("namespaces {:?}", namespaces_named(&name).len()),
            _ => sh("lvs", &["--noheadings", "-o", "lv_name,lv_tags", VG])
                .lines()
                .filter(|l| l.contains(&name))
                .map(|l| l.trim().to_string())
                .collect::<Vec<_>>()
                .join("; "),
        };
        eprintln!(
            "killed {class} create ({kill_at:?}): the call {}; left: {state}",
            if outcome.is_ok() {
                "had returned"
            } else {
                "was cut off"
            }
        );
        let p = Process::start(dir.path(), &config).await;
        let vol = retried("create after kill", || p.csi.create(class, &name, 32 * MIB, &cap)).await;
        p.csi.stage(&vol.volume_id, &name, &cap).await.unwrap();
        p.csi.publish(&vol.volume_id, &name, &cap).await.unwrap();
        let bytes = read_all(&p.csi.target(&name));
        assert_eq!(bytes.len() as u64, vol.capacity_bytes as u64);
        assert!(
            bytes.iter().all(|b| *b == 0),
            "{class}: the finished volume reads zeros"
        );
        p.csi.unpublish(&vol.volume_id, &name).await.unwrap();
        p.csi.unstage(&vol.volume_id, &name).await.unwrap();
        p.csi.delete(&vol.volume_id).await.unwrap();
        assert!(leftovers(class, &name).is_empty());
        if class != "pmem" {
            let zeroing: Vec<_> = sh("lvs", &["--noheadings", "-o", "lv_name,lv_tags", VG])
                .lines()
                .filter(|l| l.contains("state=zeroing") || l.contains("zeroing-for"))
                .map(str::to_string)
                .collect();
            assert!(zeroing.is_empty(), "{zeroing:?}");
        }
        t.done(&format!("kill in create ({kill_at:?}), retry"));
        p.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_between_and_during_steps() {
    if !in_guest("restarts_between_and_during_steps") {
        return;
    }
    setup();
    for class in ["thick", "thin", "pmem", "pmem-lvm"] {
        restart_lifecycle(class).await;
    }
    killed_during_create("thick").await;
    killed_during_create("pmem").await;
}

// ------------------------------------------------------------------ old bytes

const OLD: u8 = 0xA5;

/// `PV:first-last` extent ranges of an LV.
fn pe_ranges(vg: &str, lv: &str) -> Vec<(String, u64, u64)> {
    sh(
        "lvs",
        &[
            "--noheadings",
            "--segments",
            "-o",
            "seg_pe_ranges",
            &format!("{vg}/{lv}"),
        ],
    )
    .split_whitespace()
    .map(|r| {
        let (pv, extents) = r.rsplit_once(':').unwrap();
        let (a, b) = extents.split_once('-').unwrap();
        (pv.to_string(), a.parse().unwrap(), b.parse().unwrap())
    })
    .collect()
}

fn overlaps(a: &[(String, u64, u64)], b: &[(String, u64, u64)]) -> bool {
    a.iter()
        .any(|(pv, s, e)| b.iter().any(|(pv2, s2, e2)| pv == pv2 && s <= e2 && s2 <= e))
}

/// Leaves `OLD` bytes on storage the class will allocate next: an LV (or namespace)
/// made outside localvol, filled, and removed. Returns where it was.
fn dirty(class: &str, bytes: u64) -> Dirt {
    let fill = |dev: &str, n: u64| write_at(Path::new(dev), 0, &vec![OLD; n as usize]);
    if class == "pmem" {
        let raw = (bytes + 2 * MIB).div_ceil(16 * MIB) * 16 * MIB;
        let out = sh(
            "ndctl",
            &[
                "create-namespace",
                "-r",
                REGION,
                "-m",
                "fsdax",
                "-M",
                "dev",
                "-s",
                &raw.to_string(),
                "-n",
                "dirt",
            ],
        );
        let dev = json_field(&out, "dev");
        fill(
            &format!("/dev/{}", json_field(&out, "blockdev")),
            fsdax_usable(raw),
        );
        let resource = namespace_resource(&dev);
        sh("ndctl", &["destroy-namespace", "-f", &dev]);
        return Dirt::Namespace(resource);
    }
    let vg = if class == "pmem-lvm" { PMEM_VG } else { VG };
    sh(
        "lvcreate",
        &[
            "-q",
            "-y",
            "-Wn",
            "-Zn",
            "-n",
            "dirt",
            "-L",
            &format!("{bytes}b"),
            vg,
        ],
    );
    fill(&format!("/dev/{vg}/dirt"), bytes);
    let ranges = pe_ranges(vg, "dirt");
    sh("lvremove", &["-q", "-y", &format!("{vg}/dirt")]);
    Dirt::Extents(ranges)
}

enum Dirt {
    Extents(Vec<(String, u64, u64)>),
    Namespace(String),
}

fn namespace_resource(dev: &str) -> String {
    std::fs::read_to_string(format!("/sys/bus/nd/devices/{dev}/resource"))
        .unwrap()
        .trim()
        .to_string()
}

/// Asserts the volume `name` sits on the dirtied storage (else the test proves nothing).
fn assert_on_dirt(class: &str, name: &str, dirt: &Dirt) {
    match dirt {
        Dirt::Extents(ranges) => {
            let vg = if class == "pmem-lvm" { PMEM_VG } else { VG };
            let lv = lvs_named(vg, name).pop().unwrap();
            let mine = pe_ranges(vg, &lv);
            assert!(
                overlaps(&mine, ranges),
                "{class}: {name} on {mine:?}, dirt was on {ranges:?}"
            );
        }
        Dirt::Namespace(resource) => {
            let ns = namespaces_named(name).pop().unwrap();
            let dev = ns["dev"].as_str().unwrap();
            assert_eq!(
                &namespace_resource(dev),
                resource,
                "{name} was placed where the dirt was"
            );
        }
    }
}

/// A raw block volume made on storage full of old bytes reads zeros everywhere, and
/// so does what an expansion adds.
async fn block_over_old_bytes(c: &Csi, class: &str) {
    let mut t = Steps::new(class);
    let name = format!("{class}-old-bytes");
    let cap = block_cap();
    let dirt = dirty(class, 16 * MIB);
    let vol = c.create(class, &name, 16 * MIB, &cap).await.unwrap();
    assert_on_dirt(class, &name, &dirt);
    c.stage(&vol.volume_id, &name, &cap).await.unwrap();
    c.publish(&vol.volume_id, &name, &cap).await.unwrap();
    let dev = c.target(&name);
    let size = vol.capacity_bytes as u64;
    assert!(
        read_all(&dev).iter().all(|b| *b == 0),
        "{class}: old bytes visible in a new volume"
    );
    t.done("new block volume on old bytes: zeros");
    if class != "pmem" {
        let dirt = dirty(class, 16 * MIB);
        c.expand_controller(&vol.volume_id, size + 16 * MIB)
            .await
            .unwrap();
        assert_on_dirt(class, &name, &dirt);
        let bytes = read_all(&dev);
        assert_eq!(bytes.len() as u64, size + 16 * MIB);
        assert!(
            bytes.iter().all(|b| *b == 0),
            "{class}: old bytes visible in the extension"
        );
        t.done("extension over old bytes: zeros");
    }
    c.unpublish(&vol.volume_id, &name).await.unwrap();
    c.unstage(&vol.volume_id, &name).await.unwrap();
    c.delete(&vol.volume_id).await.unwrap();
}

fn chunk_size(pool: &str) -> u64 {
    numbers(
        "lvs",
        &[
            "--noheadings",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            "chunk_size",
            &format!("{VG}/{pool}"),
        ],
    )[0]
}

/// Writes 4 KiB at the start of every pool chunk of a new 16 MiB thin device, then
/// returns the bytes of the device that were not written: what the pool provided.
fn unwritten_after_small_writes(dev: &Path, chunk: u64) -> Vec<u8> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)
        .unwrap();
    for offset in (0..16 * MIB).step_by(chunk as usize) {
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(&[0x5A; 4096]).unwrap();
    }
    f.sync_all().unwrap();
    let bytes = read_all(dev);
    bytes
        .chunks(chunk as usize)
        .flat_map(|c| c[4096..].iter().copied())
        .collect()
}

/// Thin volumes rely on the pool zeroing newly provisioned chunks. A first tenant fills
/// all but a few chunks of the pool with old bytes and is deleted; a second one writes
/// 4 KiB into each of its chunks: most of them must be the first tenant's (there are
/// not enough never-used chunks), and the rest of every chunk must read zeros. The
/// same on the pool without zeroing, with plain lvm, is the control: old bytes show.
async fn thin_zeroing(c: &Csi) {
    let mut t = Steps::new("thin");
    let fill = |pool: &str| {
        numbers(
            "lvs",
            &[
                "--noheadings",
                "--units",
                "b",
                "--nosuffix",
                "-o",
                "lv_size",
                &format!("{VG}/{pool}"),
            ],
        )[0] - 4 * MIB
    };
    let chunk = chunk_size("pool1");
    let a = fill("pool1");
    sh(
        "lvcreate",
        &[
            "-q",
            "-y",
            "-n",
            "ctl-a",
            "-V",
            &format!("{a}b"),
            "--thinpool",
            "pool1",
            VG,
        ],
    );
    write_at(Path::new("/dev/vmvg/ctl-a"), 0, &vec![OLD; a as usize]);
    sh("lvremove", &["-q", "-y", "vmvg/ctl-a"]);
    sh(
        "lvcreate",
        &["-q", "-y", "-n", "ctl-b", "-V", "16M", "--thinpool", "pool1", VG],
    );
    let control = unwritten_after_small_writes(Path::new("/dev/vmvg/ctl-b"), chunk);
    sh("lvremove", &["-q", "-y", "vmvg/ctl-b"]);
    let stale = control.iter().filter(|b| **b == OLD).count();
    assert!(
        stale > control.len() / 2,
        "control: a pool without zeroing shows old bytes ({stale})"
    );
    eprintln!(
        "thin control (pool1, no zeroing): {stale} of {} unwritten bytes are old",
        control.len()
    );
    t.done("control: pool without zeroing leaks");

    let cap = block_cap();
    let chunk = chunk_size("pool0");
    let a = fill("pool0");
    for (name, size) in [("thin-tenant-a", a), ("thin-tenant-b", 16 * MIB)] {
        let vol = c.create("thin", name, size, &cap).await.unwrap();
        c.stage(&vol.volume_id, name, &cap).await.unwrap();
        c.publish(&vol.volume_id, name, &cap).await.unwrap();
        let dev = c.target(name);
        if size == a {
            write_at(&dev, 0, &vec![OLD; a as usize]);
        } else {
            let unwritten = unwritten_after_small_writes(&dev, chunk);
            let old = unwritten.iter().filter(|b| **b != 0).count();
            assert_eq!(old, 0, "thin: {old} bytes of a deleted volume visible");
        }
        c.unpublish(&vol.volume_id, name).await.unwrap();
        c.unstage(&vol.volume_id, name).await.unwrap();
        c.delete(&vol.volume_id).await.unwrap();
    }
    t.done("pool0 zeroes: no old bytes");
}

/// A filesystem volume on a region where an old filesystem was: never mounted.
async fn pmem_old_filesystem(c: &Csi) {
    let mut t = Steps::new("pmem");
    let out = sh(
        "ndctl",
        &[
            "create-namespace",
            "-r",
            REGION,
            "-m",
            "fsdax",
            "-M",
            "dev",
            "-s",
            "80M",
            "-n",
            "dirt",
        ],
    );
    let dev = json_field(&out, "dev");
    let blockdev = format!("/dev/{}", json_field(&out, "blockdev"));
    sh("mkfs.ext4", &["-q", "-b", "4096", &blockdev]);
    let mnt = Path::new(CONFIG_DIR).join("old-fs");
    std::fs::create_dir_all(&mnt).unwrap();
    sh("mount", &[&blockdev, mnt.to_str().unwrap()]);
    std::fs::write(mnt.join("previous-tenant"), b"secret").unwrap();
    sh("umount", &[mnt.to_str().unwrap()]);
    let dirt = Dirt::Namespace(namespace_resource(&dev));
    sh("ndctl", &["destroy-namespace", "-f", &dev]);

    let name = "pmem-old-fs";
    let cap = mount_cap("ext4");
    let vol = c.create("pmem", name, 78 * MIB, &cap).await.unwrap();
    assert_on_dirt("pmem", name, &dirt);
    c.stage(&vol.volume_id, name, &cap).await.unwrap();
    assert!(
        !c.staging(name).join("previous-tenant").exists(),
        "the old filesystem must not be what gets mounted"
    );
    c.unstage(&vol.volume_id, name).await.unwrap();
    c.delete(&vol.volume_id).await.unwrap();
    t.done("old filesystem wiped, new one made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_bytes_of_a_previous_tenant() {
    if !in_guest("no_bytes_of_a_previous_tenant") {
        return;
    }
    setup();
    let d = daemon().await;
    let c = Csi::of(&d);
    for class in ["thick", "pmem", "pmem-lvm"] {
        block_over_old_bytes(&c, class).await;
    }
    thin_zeroing(&c).await;
    pmem_old_filesystem(&c).await;
    d.stop().await;
}

// ------------------------------------------------------------------ half-done creates

/// The states a create leaves when it dies midway, made by hand with the tools before
/// the daemon starts: the volume does not exist yet, and the retried create finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_done_creates_are_finished_on_retry() {
    if !in_guest("half_done_creates_are_finished_on_retry") {
        return;
    }
    setup();
    let cap = block_cap();
    // Thick: lvcreate done, zeroing not: the LV still has its state=zeroing tag.
    let thick = "crash-thick";
    sh(
        "lvcreate",
        &[
            "-q",
            "-y",
            "-Wn",
            "-Zn",
            "-n",
            thick,
            "-L",
            "16M",
            "--addtag",
            "localvol.csi.dev/class=thick",
            "--addtag",
            "localvol.csi.dev/name=crash-thick",
            "--addtag",
            "localvol.csi.dev/mode=block",
            "--addtag",
            "localvol.csi.dev/state=zeroing",
            VG,
        ],
    );
    write_at(
        Path::new("/dev/vmvg/crash-thick"),
        0,
        &vec![OLD; 16 * MIB as usize],
    );
    // PMEM: the pending record written and the namespace made, not yet cleared.
    let pmem = "crash-pmem";
    let out = sh(
        "ndctl",
        &[
            "create-namespace",
            "-r",
            REGION,
            "-m",
            "fsdax",
            "-M",
            "dev",
            "-s",
            "32M",
            "-n",
            pmem,
        ],
    );
    write_at(
        Path::new(&format!("/dev/{}", json_field(&out, "blockdev"))),
        0,
        &vec![OLD; 30 * MIB as usize],
    );
    let dir = tempfile::Builder::new().prefix("localvol-vm-").tempdir().unwrap();
    let records = dir.path().join("data/pmem/pmem");
    std::fs::create_dir_all(&records).unwrap();
    std::fs::write(
        records.join(format!("{pmem}.json")),
        format!(
            r#"{{"name":"{pmem}","size_bytes":{},"mode":"block","namespace":"{pmem}","pending":true}}"#,
            30 * MIB
        ),
    )
    .unwrap();

    let d = Daemon::start_with_config(dir, "vm-node", &config_path()).await;
    let c = Csi::of(&d);
    for (class, name, size) in [("thick", thick, 16 * MIB), ("pmem", pmem, 30 * MIB)] {
        let mut t = Steps::new(class);
        assert!(
            !c.listed(&format!("{class}.{name}")).await,
            "{class}: half done is not a volume"
        );
        let vol = c.create(class, name, size, &cap).await.unwrap();
        if class == "thick" {
            let tags = sh("lvs", &["--noheadings", "-o", "lv_tags", &format!("{VG}/{name}")]);
            assert!(!tags.contains("state=zeroing"), "{tags}");
        } else {
            assert_eq!(namespaces_named(name).len(), 1);
        }
        c.stage(&vol.volume_id, name, &cap).await.unwrap();
        c.publish(&vol.volume_id, name, &cap).await.unwrap();
        assert!(
            read_all(&c.target(name)).iter().all(|b| *b == 0),
            "{class}: old bytes"
        );
        c.unpublish(&vol.volume_id, name).await.unwrap();
        c.unstage(&vol.volume_id, name).await.unwrap();
        c.delete(&vol.volume_id).await.unwrap();
        assert!(leftovers(class, name).is_empty(), "{:?}", leftovers(class, name));
        t.done("half-done create finished by retry");
    }
    assert!(files_under(&records).is_empty(), "{:?}", files_under(&records));
    d.stop().await;
}

// ------------------------------------------------------------------ missing storage

/// A configuration naming a VG this node does not have, beside one it has: the daemon
/// serves the present class, offers nothing in the missing one and says why, and
/// serves it once the VG appears, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_volume_group_is_served_once_it_appears() {
    if !in_guest("a_missing_volume_group_is_served_once_it_appears") {
        return;
    }
    setup();
    const LATE_VG: &str = "latevg";
    let config = Path::new(CONFIG_DIR).join("late.yaml");
    std::fs::write(
        &config,
        "device-classes:\n  - name: thick\n    kind: lvm\n    volume-group: vmvg\n    spare-gb: 1\n    default: true\n  \
         - name: late\n    kind: lvm\n    volume-group: latevg\n    spare-gb: 0\n",
    )
    .unwrap();
    let dir = tempfile::Builder::new().prefix("localvol-vm-").tempdir().unwrap();
    let backing = dir.path().join("latevg.img");
    let d = Daemon::start_with_config(dir, "vm-node", &config).await;
    let c = Csi::of(&d);
    let mut t = Steps::new("late");

    // Ready, the present class served, the missing one empty and explained.
    let (code, body) = d.get("/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("device class late not served"), "{body}");
    assert!(body.contains("volume group latevg does not exist"), "{body}");
    assert_eq!(c.capacity("late").await.0, 0);
    assert!(c.capacity("thick").await.0 > 0);
    let refused = c
        .create("late", "early", 16 * MIB, &block_cap())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("latevg"), "{refused:?}");
    d.wait_for_metric("localvol_device_class_available{device_class=\"late\"} 0")
        .await;
    d.wait_for_metric("localvol_device_class_available{device_class=\"thick\"} 1")
        .await;
    t.done("missing class: ready, no capacity, refused");

    // The VG appears (on a loop device: the guest's disks are taken).
    let file = std::fs::File::create(&backing).unwrap();
    file.set_len(64 * MIB).unwrap();
    drop(file);
    let loop_dev = sh("losetup", &["-f", "--show", backing.to_str().unwrap()]);
    let loop_dev = loop_dev.trim();
    sh("pvcreate", &["-q", loop_dev]);
    sh("vgcreate", &["-q", LATE_VG, loop_dev]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while c.capacity("late").await.0 == 0 {
        assert!(Instant::now() < deadline, "latevg not picked up within 120 s");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    t.done("VG appeared: picked up");
    let vol = c.create("late", "late-1", 16 * MIB, &block_cap()).await.unwrap();
    assert_eq!(lvs_named(LATE_VG, "late-1").len(), 1);
    c.delete(&vol.volume_id).await.unwrap();
    assert!(lvs_named(LATE_VG, "late-1").is_empty());
    t.done("create+delete in the late class");
    let (_, body) = d.get("/readyz").await;
    assert!(!body.contains("not served"), "{body}");
    d.stop().await;
    sh("vgremove", &["-q", "-f", LATE_VG]);
    sh("pvremove", &["-q", loop_dev]);
    sh("losetup", &["-d", loop_dev]);
}
