//! A restore and a clone larger than their source on lvm-thin, in the tests/vm guest
//! (device-mapper): the scenario of tests/grow/mod.rs, with the LV tag
//! `localvol.csi.dev/grow=filesystem` as the mark. Needs one scratch disk of 4G, the one
//! `LOCALVOL_VM_DISK` names (default /dev/vda; wiped), and no NVDIMM. `tests/vm/suite.sh
//! grow` runs it; by hand:
//!
//!   cargo test --no-run --test vm_grow
//!   tests/vm/run.sh --disks 1 --disk-size 4G --pmem-size 0 -- <exe> --test-threads=1
//!
//! On the host it reports that it did not run and passes, unless `LOCALVOL_VM_SUITE=1`
//! says it must run (then it fails outside the guest).

mod grow;

use localvol_testkit::InProcessDaemon;
use localvol_testkit::guest::{in_guest, sh, thin_pool, volume_group};

const VG: &str = "growvg";
const CONFIG: &str = "\
device-classes:
  - name: thin
    kind: lvm-thin
    volume-group: growvg
    thin-pool: {name: pool0, overprovision-ratio: 4.0}
    default: true
";

/// Whether the LV whose name tag is `name` carries the grow mark.
fn lv_marked(name: &str) -> bool {
    let rows = sh("lvs", &["--noheadings", "-o", "lv_name,lv_tags", VG]);
    let name_tag = format!("localvol.csi.dev/name={name}");
    let tags: Vec<&str> = rows
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|tags| tags.split(',').collect::<Vec<_>>())
        .find(|tags| tags.contains(&name_tag.as_str()))
        .unwrap_or_else(|| panic!("no LV named {name} in {rows}"));
    tags.contains(&"localvol.csi.dev/grow=filesystem")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_thin_restore_and_clone_larger_than_the_source_are_grown_at_stage() {
    let test = "lvm_thin_restore_and_clone_larger_than_the_source_are_grown_at_stage";
    if !in_guest("vm_grow", test, "run it through tests/vm/suite.sh grow") {
        return;
    }
    let disk = std::env::var("LOCALVOL_VM_DISK").unwrap_or_else(|_| "/dev/vda".to_owned());
    sh("wipefs", &["-q", "-a", &disk]);
    volume_group(VG, &[&disk]);
    thin_pool(VG, "pool0", "2G", true);
    let dir = tempfile::Builder::new()
        .prefix("localvol-grow-")
        .tempdir()
        .unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let daemon = InProcessDaemon::start_with_config(dir, "test-node", &config).await;
    for fs in ["ext4", "xfs"] {
        let started = std::time::Instant::now();
        grow::restore_and_clone_grow(&daemon, fs, &lv_marked).await;
        eprintln!(
            "vm-step thin {fs} restore+clone grown {:.2}s",
            started.elapsed().as_secs_f64()
        );
    }
    daemon.stop().await;
    let left = sh("lvs", &["--noheadings", "-o", "lv_name", VG]);
    assert_eq!(
        left.split_whitespace().collect::<Vec<_>>(),
        ["pool0"],
        "nothing left in the pool"
    );
}
