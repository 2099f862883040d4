//! A restore and a clone larger than their source on lvm-thin, in the tests/vm guest
//! (device-mapper): the scenario of tests/grow/mod.rs, with the LV tag
//! `localvol.csi.dev/grow=filesystem` as the mark. Needs one scratch disk (/dev/vda,
//! 4G) and no NVDIMM:
//!
//!   cargo test --no-run --test vm_grow
//!   tests/vm/run.sh --disks 1 --disk-size 4G --pmem-size 0 -- <exe> --test-threads=1
//!
//! On the host it reports that it did not run and passes, unless `LOCALVOL_VM_SUITE=1`
//! says it must run (then it fails outside the guest).

mod common;
mod grow;

use std::process::Command;

use common::Daemon;

const VG: &str = "growvg";
const CONFIG: &str = "\
device-classes:
  - name: thin
    kind: lvm-thin
    volume-group: growvg
    thin-pool: {name: pool0, overprovision-ratio: 4.0}
    default: true
";

fn in_guest(test: &str) -> bool {
    if std::env::var("VMTEST_GUEST").as_deref() == Ok("1") {
        return true;
    }
    if std::env::var("LOCALVOL_VM_SUITE").as_deref() == Ok("1") {
        panic!("{test}: LOCALVOL_VM_SUITE=1 but this is not the VM guest; run it through tests/vm/run.sh");
    }
    eprintln!("vm_grow: {test} not run: run it through tests/vm/run.sh");
    false
}

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
    if !in_guest("lvm_thin_restore_and_clone_larger_than_the_source_are_grown_at_stage") {
        return;
    }
    sh("pvcreate", &["-q", "/dev/vda"]);
    sh("vgcreate", &["-q", VG, "/dev/vda"]);
    sh("lvcreate", &["-q", "-y", "-T", "growvg/pool0", "-L", "2G", "-Zy"]);
    let dir = tempfile::Builder::new()
        .prefix("localvol-grow-")
        .tempdir()
        .unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let daemon = Daemon::start_with_config(dir, "test-node", &config).await;
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
