//! The storage tests/sanity/vm.sh runs csi-sanity on, beside whatever the backend suite
//! left in the same guest: VG `sanityvg` on a disk (wiped) with the zeroing thin pool
//! `sanitypool`, and on region0 one fsdax namespace holding VG `sanitypmemvg`; the
//! configuration of one class of each kind over it; and the volume sizes each class holds
//! exactly, so that csi-sanity's size checks compare like with like.

use std::path::Path;

use crate::guest::{self, REGION, json_field, sh};

pub const VG: &str = "sanityvg";
pub const POOL: &str = "sanitypool";
pub const PMEM_VG: &str = "sanitypmemvg";
const PMEM_VG_NAMESPACE: &str = "sanity-pmemvg";

/// A class's csi-sanity volume sizes: what it creates, and what it grows to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    pub size: u64,
    pub expand: u64,
}

/// Each class's sizes, in the order tests/sanity/vm.sh runs them.
pub struct SanityStorage {
    pub classes: Vec<(&'static str, Sizes)>,
}

/// The loop class's sizes: its files hold any size.
const LOOP: Sizes = Sizes {
    size: 64 << 20,
    expand: 128 << 20,
};

/// Makes the storage on `disk` and region0 and writes the configuration to `config`,
/// the loop class's files in `loop_dir`.
pub fn make(disk: &str, config: &Path, loop_dir: &Path) -> SanityStorage {
    sh("wipefs", &["-q", "-a", disk]);
    guest::volume_group(VG, &[disk]);
    guest::thin_pool(VG, POOL, "512M", true);
    // A region whose labels nobody initialised holds one label-less raw namespace and
    // offers nothing to create-namespace. (Labelling it leaves its alignment as it is.)
    let region = guest::region();
    if region["available_size"].as_u64() == Some(0) {
        guest::reset_region();
    }
    let made = guest::fsdax_namespace("256M", PMEM_VG_NAMESPACE);
    let pmem_pv = format!("/dev/{}", json_field(&made, "blockdev"));
    // A new namespace shows whatever earlier tests left on the media.
    sh("wipefs", &["-q", "-a", &pmem_pv]);
    guest::volume_group(PMEM_VG, &[&pmem_pv]);

    let extents = |vg, n| n * guest::lvm_bytes("vgs", "vg_extent_size", vg);
    let align = region["align"]
        .as_u64()
        .unwrap_or_else(|| panic!("ndctl lists no align for {REGION}"));
    let lvm = Sizes {
        size: extents(VG, 16),
        expand: extents(VG, 32),
    };
    let pmem = Sizes {
        size: namespace_usable(5 * align),
        expand: namespace_usable(10 * align),
    };
    let pmem_lvm = Sizes {
        size: extents(PMEM_VG, 16),
        expand: extents(PMEM_VG, 32),
    };
    std::fs::write(config, configuration(loop_dir)).unwrap();
    eprintln!(
        "csi-sanity sizes: lvm, lvm-thin: 16 and 32 extents of {VG}; pmem-lvm: 16 and 32 extents of {PMEM_VG}; \
         pmem: fsdax namespaces of {} and {} bytes offer {} and {}",
        5 * align,
        10 * align,
        pmem.size,
        pmem.expand
    );
    SanityStorage {
        classes: vec![
            ("lvm", lvm),
            ("lvm-thin", lvm),
            ("pmem", pmem),
            ("pmem-lvm", pmem_lvm),
            ("loop", LOOP),
        ],
    }
}

/// One class of each kind over the storage. The classes' new LUKS headers use a cheap
/// key derivation: csi-sanity stages dozens of volumes, and what it checks is the CSI
/// calls, not argon2id's cost (tests/vm_backends.rs runs the default).
fn configuration(loop_dir: &Path) -> String {
    let cheap = "luks: {pbkdf-memory-kib: 8192, iter-time-ms: 50}";
    format!(
        "device-classes:
  - {{name: lvm, kind: lvm, volume-group: {VG}, spare-gb: 0, default: true, {cheap}}}
  - {{name: lvm-thin, kind: lvm-thin, volume-group: {VG}, thin-pool: {{name: {POOL}, overprovision-ratio: 1.0}}, {cheap}}}
  - {{name: pmem, kind: pmem, mode: direct, region: {REGION}}}
  - {{name: pmem-lvm, kind: pmem, mode: lvm, volume-group: {PMEM_VG}, {cheap}}}
  - {{name: loop, kind: loop, directory: {}, capacity-gb: 2, {cheap}}}
",
        loop_dir.display()
    )
}

/// What an fsdax namespace of `raw` bytes offers, measured by making one.
fn namespace_usable(raw: u64) -> u64 {
    let made = guest::fsdax_namespace(&raw.to_string(), "sanity-probe");
    let dev = json_field(&made, "dev");
    sh("ndctl", &["destroy-namespace", "-f", &dev]);
    let v: serde_json::Value = serde_json::from_str(&made).unwrap();
    v["size"].as_u64().unwrap_or_else(|| panic!("no size in {made}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_names_the_storage_made() {
        let yaml = configuration(Path::new("/tmp/sanity-loop.x"));
        let config: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
        let classes = config["device-classes"].as_sequence().unwrap();
        let names: Vec<&str> = classes.iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["lvm", "lvm-thin", "pmem", "pmem-lvm", "loop"]);
        assert_eq!(classes[1]["thin-pool"]["name"].as_str(), Some(POOL));
        assert_eq!(classes[3]["volume-group"].as_str(), Some(PMEM_VG));
        assert_eq!(classes[4]["directory"].as_str(), Some("/tmp/sanity-loop.x"));
        assert_eq!(classes[0]["luks"]["iter-time-ms"].as_u64(), Some(50));
        assert!(
            classes[2].get("luks").is_none(),
            "pmem direct holds no encryption"
        );
    }
}
