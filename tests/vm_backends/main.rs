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
//!
//! The tests are listed here, under the names CI knows; their bodies live beside this
//! file, one file per concern (lifecycle, capacity, restarts, old bytes, half-done
//! creates, a missing VG, a full thin pool and a disabled region, encryption). The storage set-up and gate are tests/testkit/src/guest.rs, the
//! CSI client tests/testkit/src/csi_client.rs.

mod capacity;
mod encryption;
mod half_done;
mod health;
mod lifecycle;
mod missing_vg;
mod old_bytes;
mod restarts;

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, Instant};

use localvol::proto::csi::v1 as csi;
use localvol_testkit::InProcessDaemon;
use localvol_testkit::csi_client::{CsiClient, NewVolume};
pub use localvol_testkit::csi_client::{block_capability as block_cap, fs_capability};
use localvol_testkit::guest::{self, lvm_bytes, lvm_report, sh};
use tonic::Code;

const MIB: u64 = 1 << 20;
const VG: &str = "vmvg";
const PMEM_VG: &str = "pmemvg";
const REGION: &str = "region0";
const CONFIG_DIR: &str = "/run/localvol-vm-suite";

/// Encrypted volumes' new headers use a cheap key derivation (`luks:`) on every class
/// but thick, which keeps the production default (tests/vm_backends/encryption.rs).
const CONFIG: &str = "\
device-classes:
  - name: thick
    kind: lvm
    volume-group: vmvg
    spare-gb: 1
    default: true
  - name: striped
    luks: {pbkdf-memory-kib: 8192, iter-time-ms: 50}
    kind: lvm
    volume-group: vmvg
    spare-gb: 1
    stripe: 2
    stripe-size: 64k
  - name: thin
    luks: {pbkdf-memory-kib: 8192, iter-time-ms: 50}
    kind: lvm-thin
    volume-group: vmvg
    thin-pool: {name: pool0, overprovision-ratio: 2.0}
  - name: thin-nozero
    luks: {pbkdf-memory-kib: 8192, iter-time-ms: 50}
    kind: lvm-thin
    volume-group: vmvg
    thin-pool: {name: pool1, overprovision-ratio: 1.0}
  - name: pmem
    kind: pmem
    mode: direct
    region: region0
  - name: pmem-lvm
    luks: {pbkdf-memory-kib: 8192, iter-time-ms: 50}
    kind: pmem
    mode: lvm
    volume-group: pmemvg
  - name: loop
    luks: {pbkdf-memory-kib: 8192, iter-time-ms: 50}
    kind: loop
    capacity-gb: 1
";

/// The gate of every test: it runs in the guest only (tests/testkit/src/guest.rs), after the
/// storage is set up once.
macro_rules! vm_tests {
    ($($module:ident :: $test:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            if guest::in_guest("vm_backends", stringify!($test), "run through tests/vm/suite.sh backends") {
                setup();
                $module::$test().await;
            }
        }
    )*};
}

vm_tests! {
    missing_vg::a_missing_volume_group_is_served_once_it_appears,
    health::a_full_thin_pool_is_reported_and_takes_no_volume,
    health::a_disabled_pmem_region_is_reported_and_takes_no_volume,
    capacity::capacity_matches_the_tools_and_too_big_leaves_nothing,
    half_done::half_done_creates_are_finished_on_retry,
    capacity::limits_are_kept_and_the_largest_volume_fits,
    lifecycle::lvm_thick_lifecycle,
    lifecycle::lvm_thin_lifecycle,
    old_bytes::no_bytes_of_a_previous_tenant,
    lifecycle::pmem_direct_lifecycle,
    lifecycle::pmem_lvm_lifecycle,
    restarts::restarts_between_and_during_steps,
    encryption::encrypted_volumes_on_lvm_classes,
    encryption::encrypted_volumes_survive_a_daemon_kill,
}

// ------------------------------------------------------------------ storage

static SETUP: Once = Once::new();

fn config_path() -> PathBuf {
    Path::new(CONFIG_DIR).join("config.yaml")
}

fn setup() {
    SETUP.call_once(|| {
        let started = Instant::now();
        guest::volume_group(VG, &["/dev/vda", "/dev/vdb"]);
        guest::thin_pool(VG, "pool0", "256M", true);
        guest::thin_pool(VG, "pool1", "64M", false);
        guest::reset_region();
        guest::volume_group_on_pmem(PMEM_VG, "768M", "vm-pmemvg");
        std::fs::create_dir_all(CONFIG_DIR).unwrap();
        std::fs::write(config_path(), CONFIG).unwrap();
        step_time("setup", "vg+pools+region+pmemvg", started.elapsed());
    });
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
    guest::namespaces(true)
        .into_iter()
        .filter(|n| n["name"] == name)
        .collect()
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

/// The bytes old_bytes.rs leaves for a volume to be made over (and half_done.rs in
/// half-made volumes).
const OLD: u8 = 0xA5;

/// The usable bytes of an fsdax namespace of `raw` bytes, as tests/fixtures/README.md
/// derives it from the kernel's sizes: raw - roundup(8K + (raw - 8K) / 64, 2M).
fn fsdax_usable(raw: u64) -> u64 {
    let reserve = (8192 + (raw - 8192) / 64).div_ceil(2 * MIB) * 2 * MIB;
    raw.saturating_sub(reserve)
}

fn mount_cap(fs: &str) -> csi::VolumeCapability {
    fs_capability(fs, &[])
}

/// The daemon of most tests, in-process with all of CONFIG's classes.
async fn daemon() -> InProcessDaemon {
    let dir = tempfile::Builder::new().prefix("localvol-vm-").tempdir().unwrap();
    let started = Instant::now();
    let d = InProcessDaemon::start_with_config(dir, "vm-node", &config_path()).await;
    step_time("daemon", "start (open 7 classes)", started.elapsed());
    d
}

// ------------------------------------------------------------------ CSI calls

/// The shared CSI client (tests/testkit/src/csi_client.rs) with kubelet's paths under `dir`,
/// one staging and one target path per volume name, and the suite's claim parameters.
struct Csi {
    client: CsiClient,
    dir: PathBuf,
}

impl Csi {
    async fn at(socket: &Path, dir: &Path) -> Self {
        Self {
            client: CsiClient::connect(socket).await,
            dir: dir.to_path_buf(),
        }
    }

    async fn of(d: &InProcessDaemon) -> Self {
        Self::at(&d.socket, d.dir.path()).await
    }

    fn staging(&self, name: &str) -> PathBuf {
        self.dir.join("staging").join(name)
    }

    fn target(&self, name: &str) -> PathBuf {
        self.dir.join("pods").join(name)
    }

    async fn create(
        &self,
        class: &str,
        name: &str,
        size: u64,
        cap: &csi::VolumeCapability,
    ) -> Result<csi::Volume, tonic::Status> {
        let claim = format!("claim-{name}");
        let volume = NewVolume {
            capability: cap.clone(),
            class: Some(class),
            pvc: Some(("vm-suite", &claim)),
            ..NewVolume::new(name, size as i64)
        };
        self.client.create(volume.request()).await
    }

    async fn stage(&self, id: &str, name: &str, cap: &csi::VolumeCapability) -> Result<(), tonic::Status> {
        std::fs::create_dir_all(self.staging(name)).unwrap();
        self.client.stage(id, &self.staging(name), cap).await
    }

    async fn publish(&self, id: &str, name: &str, cap: &csi::VolumeCapability) -> Result<(), tonic::Status> {
        std::fs::create_dir_all(self.dir.join("pods")).unwrap();
        self.client
            .publish(id, &self.staging(name), &self.target(name), cap)
            .await
    }

    async fn unpublish(&self, id: &str, name: &str) -> Result<(), tonic::Status> {
        self.client.unpublish(id, &self.target(name)).await
    }

    async fn unstage(&self, id: &str, name: &str) -> Result<(), tonic::Status> {
        self.client.unstage(id, &self.staging(name)).await
    }

    async fn delete(&self, id: &str) -> Result<(), tonic::Status> {
        self.client.delete(id).await
    }

    async fn expand_controller(
        &self,
        id: &str,
        size: u64,
    ) -> Result<csi::ControllerExpandVolumeResponse, tonic::Status> {
        self.client.expand_controller(id, size as i64).await
    }

    async fn expand_node(
        &self,
        id: &str,
        name: &str,
        size: u64,
        cap: &csi::VolumeCapability,
    ) -> Result<u64, tonic::Status> {
        self.client
            .expand_node(id, &self.target(name), &self.staging(name), size as i64, cap)
            .await
            .map(|bytes| bytes as u64)
    }

    async fn stats_total(&self, id: &str, name: &str) -> u64 {
        let stats = self.client.stats(id, &self.target(name)).await.unwrap();
        assert!(
            !stats.volume_condition.as_ref().unwrap().abnormal,
            "{:?}",
            stats.volume_condition
        );
        localvol_testkit::csi_client::bytes_total(&stats) as u64
    }

    async fn capacity(&self, class: &str) -> (u64, u64) {
        let r = self.client.capacity(Some(class)).await.unwrap();
        (r.available_capacity as u64, r.maximum_volume_size.unwrap() as u64)
    }

    async fn listed(&self, id: &str) -> bool {
        self.client.listed(id).await
    }
}
