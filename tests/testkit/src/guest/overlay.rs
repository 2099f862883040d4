//! The storage each cluster configuration of tests/vm/cluster-guest.sh expects on the
//! guest's node, made as the shipped overlays' config.yaml comments tell an operator to
//! make it, and what may be left of it: a class's volumes once its test namespaces are
//! gone (none), and anything of the classes' storage once it is removed (nothing).
//!
//! The configurations are tests/plan.yaml's classes with storage of their own: the
//! shipped overlays lvm, lvm-thin, pmem and pmem-lvm (deploy/overlays/*/config.yaml), and
//! tests/cluster/overlays' mixed and all-classes.

use std::path::Path;

use crate::guest::{self, REGION, sh, try_sh};

/// deploy/overlays/lvm*/config.yaml's volume group.
pub const LVM_VG: &str = "localvol";
/// deploy/overlays/pmem-lvm/config.yaml's volume group, on the region's fsdax namespace.
pub const PMEM_VG: &str = "localvol-pmem";
/// deploy/overlays/lvm-thin/config.yaml's thin pool in [`LVM_VG`].
pub const THIN_POOL: &str = "pool0";
/// The loop classes' directory (the overlays' default data dir).
pub const LOOP_DIR: &str = "/var/lib/localvol/loop";

/// What a configuration needs on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// An empty, labelled region0 (new hardware's first step).
    region: bool,
    /// VG [`PMEM_VG`] on a new fsdax namespace of this size.
    pmem_vg: Option<NamespaceSize>,
    /// VG [`LVM_VG`] on the disk: made here, or (the mixed configuration's) made by a
    /// scenario, so it may be missing.
    lvm_vg: Option<MadeBy>,
    /// Thin pool [`THIN_POOL`] of this size in [`LVM_VG`].
    thin_pool: Option<&'static str>,
}

/// The size of the namespace under [`PMEM_VG`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NamespaceSize {
    WholeRegion,
    Of(&'static str),
}

/// Who makes a volume group of a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MadeBy {
    /// [`make`], so it must be there.
    Make,
    /// A scenario, so it may be missing (scenario 12 makes the mixed node's).
    Scenario,
}

/// The configuration `class` of the plan, or an error naming the known ones.
pub fn needs(class: &str) -> Result<Needs, String> {
    let none = Needs {
        region: false,
        pmem_vg: None,
        lvm_vg: None,
        thin_pool: None,
    };
    let lvm_vg = Some(MadeBy::Make);
    Ok(match class {
        "lvm" => Needs { lvm_vg, ..none },
        "lvm-thin" => Needs {
            lvm_vg,
            thin_pool: Some("2G"),
            ..none
        },
        "pmem" => Needs { region: true, ..none },
        "pmem-lvm" => Needs {
            region: true,
            pmem_vg: Some(NamespaceSize::WholeRegion),
            ..none
        },
        // The lvm class's volume group is missing: scenario 12 makes it, and may leave it.
        "mixed" => Needs {
            region: true,
            lvm_vg: Some(MadeBy::Scenario),
            ..none
        },
        // A 256 MiB namespace under the pmem-lvm class's VG, the rest of the region for
        // the direct class.
        "all-classes" => Needs {
            region: true,
            pmem_vg: Some(NamespaceSize::Of("256M")),
            lvm_vg,
            thin_pool: Some("2G"),
        },
        other => {
            return Err(format!(
                "no storage known for class {other} (lvm, lvm-thin, pmem, pmem-lvm, mixed, all-classes)"
            ));
        }
    })
}

/// The VGs whose LVs are the configuration's volumes, and who makes each.
fn volume_groups(needs: Needs) -> Vec<(&'static str, MadeBy)> {
    let pmem = needs.pmem_vg.map(|_| (PMEM_VG, MadeBy::Make));
    needs
        .lvm_vg
        .map(|by| (LVM_VG, by))
        .into_iter()
        .chain(pmem)
        .collect()
}

/// Makes what `class` needs, `disk` the LVM classes' one PV.
pub fn make(class: &str, disk: &str) -> Result<(), String> {
    let needs = needs(class)?;
    if needs.region {
        guest::reset_region();
    }
    if let Some(size) = needs.pmem_vg {
        let mut args = vec!["create-namespace", "--mode", "fsdax", "--region", REGION];
        if let NamespaceSize::Of(size) = size {
            args.extend(["--size", size]);
        }
        let made = sh("ndctl", &args);
        let pv = format!("/dev/{}", guest::json_field(&made, "blockdev"));
        guest::volume_group(PMEM_VG, &[&pv]);
    }
    if needs.lvm_vg == Some(MadeBy::Make) {
        guest::volume_group(LVM_VG, &[disk]);
    }
    if let Some(size) = needs.thin_pool {
        // deploy/overlays/lvm-thin/config.yaml's command, zeroing as lvm.conf says.
        sh(
            "lvcreate",
            &["-q", "--type", "thin-pool", "-L", size, "-n", THIN_POOL, LVM_VG],
        );
    }
    Ok(())
}

/// Removes what [`make`] made (and scenario 12's VG on the mixed configuration), then,
/// as docs/operations.md tells an operator to after removing on the host what the daemon
/// activated, `dmsetup mknodes`: it removes the /dev/mapper nodes of devices that are
/// gone (the daemon's libdm made those nodes, so the host's udev does not remove them).
pub fn remove(class: &str, disk: &str) -> Result<(), String> {
    let needs = needs(class)?;
    let lvm_vg_there = match needs.lvm_vg {
        Some(MadeBy::Make) => true,
        Some(MadeBy::Scenario) => try_sh("vgs", &[LVM_VG]).is_ok(),
        None => false,
    };
    if lvm_vg_there {
        try_sh("vgremove", &["-q", "-f", LVM_VG])?;
        try_sh("pvremove", &["-q", disk])?;
    }
    if needs.pmem_vg.is_some() {
        let pmem_pv = pvs_of(PMEM_VG);
        try_sh("vgremove", &["-q", "-f", PMEM_VG])?;
        for pv in &pmem_pv {
            try_sh("pvremove", &["-q", pv])?;
        }
        try_sh("ndctl", &["destroy-namespace", "-f", "all", "--region", REGION])?;
    }
    try_sh("dmsetup", &["mknodes"]).map(drop)
}

/// The class's volumes still on the node after its test namespaces are gone (the daemon
/// deletes them): LVs of its VG but the thin pool, fsdax namespaces that are volumes (not
/// the one under [`PMEM_VG`]), loop images and the loop devices over them, and
/// device-mapper nodes but the thin pool's (which the host's LVM made).
pub fn volumes_left(class: &str) -> Result<Vec<String>, String> {
    let needs = needs(class)?;
    let mut left = Vec::new();
    for (vg, made_by) in volume_groups(needs) {
        match try_sh("lvs", &["--noheadings", "-o", "lv_name", vg]) {
            Ok(listing) => left.extend(
                volume_lvs_in(&listing, THIN_POOL)
                    .into_iter()
                    .map(|lv| format!("lv {vg}/{lv}")),
            ),
            Err(e) if made_by == MadeBy::Make => left.push(format!("cannot list the LVs of {vg}: {e}")),
            Err(_) => {}
        }
    }
    let under = match needs.pmem_vg {
        Some(_) => pvs_of(PMEM_VG),
        None => Vec::new(),
    };
    left.extend(
        fsdax_namespaces()
            .into_iter()
            .filter(|n| !under.contains(&format!("/dev/{}", n.blockdev)))
            .map(|n| n.to_string()),
    );
    left.extend(loop_volumes());
    left.extend(
        device_mapper_nodes()
            .into_iter()
            .filter(|node| !is_thin_pool_node(node))
            .map(|node| format!("node /dev/mapper/{node}")),
    );
    Ok(left)
}

/// Anything of the storage once it is removed: device-mapper devices and their nodes,
/// LVs, fsdax namespaces.
pub fn residue() -> Vec<String> {
    let mut left: Vec<String> = sh("dmsetup", &["ls"])
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("No devices found"))
        .map(|l| format!("dm {l}"))
        .collect();
    left.extend(
        device_mapper_nodes()
            .into_iter()
            .map(|n| format!("node /dev/mapper/{n}")),
    );
    left.extend(
        try_sh("lvs", &["--noheadings", "-o", "vg_name,lv_name"])
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| format!("lv {}", l.trim())),
    );
    left.extend(fsdax_namespaces().into_iter().map(|n| n.to_string()));
    left
}

/// What the node may hold after its kubelet stopped, besides [`residue`]: mounts below
/// kubelet's root or localvol's data directory.
pub fn mounts_left() -> Vec<String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mounts_below(&mountinfo, &["/var/lib/kubelet/", "/var/lib/localvol/"])
}

/// The mount points in `mountinfo` below one of `dirs`.
fn mounts_below(mountinfo: &str, dirs: &[&str]) -> Vec<String> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|point| dirs.iter().any(|d| point.starts_with(d)))
        .map(|point| format!("mount {point}"))
        .collect()
}

/// An fsdax namespace with a size, as localvol makes them (not the raw namespace a
/// label-less region shows at boot, nor the region's idle seed, which has none).
#[derive(Debug, PartialEq, Eq)]
pub struct Namespace {
    pub dev: String,
    pub name: String,
    pub blockdev: String,
    pub size: u64,
}

impl std::fmt::Display for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "namespace {} {:?} /dev/{} {} bytes",
            self.dev, self.name, self.blockdev, self.size
        )
    }
}

/// The region's fsdax namespaces with a size, disabled ones too.
pub fn fsdax_namespaces() -> Vec<Namespace> {
    fsdax_namespaces_in(guest::namespaces(true))
}

fn fsdax_namespaces_in(listing: Vec<serde_json::Value>) -> Vec<Namespace> {
    listing
        .into_iter()
        .filter(|n| n["mode"] == "fsdax" && n["size"].as_u64().unwrap_or(0) > 0)
        .map(|n| Namespace {
            dev: n["dev"].as_str().unwrap_or_default().to_string(),
            name: n["name"].as_str().unwrap_or_default().to_string(),
            blockdev: n["blockdev"].as_str().unwrap_or_default().to_string(),
            size: n["size"].as_u64().unwrap_or(0),
        })
        .collect()
}

/// The LVs of `lvs -o lv_name` but the thin pool `pool` and hidden ones (`[name]`).
pub fn volume_lvs_in(listing: &str, pool: &str) -> Vec<String> {
    listing
        .lines()
        .map(str::trim)
        .filter(|name| !name.is_empty() && *name != pool && !name.starts_with('['))
        .map(str::to_string)
        .collect()
}

/// The PVs of VG `vg` (none when it does not exist).
fn pvs_of(vg: &str) -> Vec<String> {
    try_sh(
        "pvs",
        &[
            "--noheadings",
            "-o",
            "pv_name",
            "--select",
            &format!("vg_name={vg}"),
        ],
    )
    .unwrap_or_default()
    .split_whitespace()
    .map(str::to_string)
    .collect()
}

/// Loop images of the loop classes, and loop devices attached to a file of localvol's.
fn loop_volumes() -> Vec<String> {
    let mut left = Vec::new();
    if let Ok(dir) = std::fs::read_dir(LOOP_DIR) {
        for entry in dir.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "img") {
                left.push(format!("image {}", path.display()));
            }
        }
    }
    let attached = try_sh("losetup", &["-n", "-O", "NAME,BACK-FILE"]).unwrap_or_default();
    left.extend(
        attached
            .lines()
            .filter(|l| l.contains("/var/lib/localvol/"))
            .map(|l| format!("loop {}", l.trim())),
    );
    left
}

/// The nodes in /dev/mapper but `control`.
fn device_mapper_nodes() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(Path::new("/dev/mapper")) else {
        return Vec::new();
    };
    let mut nodes: Vec<String> = dir
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "control")
        .collect();
    nodes.sort();
    nodes
}

/// Whether a /dev/mapper node is the thin pool's or one of its hidden parts
/// (`localvol-pool0`, `localvol-pool0_tdata`, `localvol-pool0-tpool`).
fn is_thin_pool_node(node: &str) -> bool {
    let pool = format!("{LVM_VG}-{THIN_POOL}");
    node.strip_prefix(&pool)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('-') || rest.starts_with('_'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::json_list;

    #[test]
    fn every_plan_configuration_with_storage_is_known() {
        for class in ["lvm", "lvm-thin", "pmem", "pmem-lvm", "mixed", "all-classes"] {
            needs(class).unwrap();
        }
        assert!(
            needs("loop")
                .unwrap_err()
                .contains("no storage known for class loop")
        );
        let vgs = |class| volume_groups(needs(class).unwrap());
        assert_eq!(vgs("pmem-lvm"), vec![(PMEM_VG, MadeBy::Make)]);
        assert_eq!(vgs("lvm-thin"), vec![(LVM_VG, MadeBy::Make)]);
        assert_eq!(
            vgs("all-classes"),
            vec![(LVM_VG, MadeBy::Make), (PMEM_VG, MadeBy::Make)]
        );
        assert_eq!(vgs("mixed"), vec![(LVM_VG, MadeBy::Scenario)]);
        assert!(vgs("pmem").is_empty());
    }

    #[test]
    fn only_sized_fsdax_namespaces_count() {
        // ndctl list -N -i on a region with one volume, its idle seed and a raw namespace.
        let listing = r#"[
          {"dev":"namespace0.1","mode":"fsdax","map":"dev","size":62914560,"uuid":"u","sector_size":512,"align":2097152,"blockdev":"pmem0.1","name":"tok"},
          {"dev":"namespace0.2","mode":"fsdax","size":0,"uuid":"00000000-0000-0000-0000-000000000000","sector_size":512,"state":"disabled"},
          {"dev":"namespace0.0","mode":"raw","size":2147483648,"sector_size":512,"blockdev":"pmem0"}
        ]"#;
        assert_eq!(
            fsdax_namespaces_in(json_list(listing)),
            vec![Namespace {
                dev: "namespace0.1".into(),
                name: "tok".into(),
                blockdev: "pmem0.1".into(),
                size: 62914560
            }]
        );
        assert!(fsdax_namespaces_in(json_list("")).is_empty());
    }

    #[test]
    fn the_pool_and_hidden_lvs_are_not_volumes() {
        let listing = "  pool0\n  [lvol0_pmspare]\n  [pool0_tmeta]\n  pvc-1f\n\n  s+tok\n";
        assert_eq!(volume_lvs_in(listing, "pool0"), vec!["pvc-1f", "s+tok"]);
        assert!(volume_lvs_in("  pool0\n", "pool0").is_empty());
    }

    #[test]
    fn the_thin_pools_nodes_are_told_from_volumes() {
        for node in [
            "localvol-pool0",
            "localvol-pool0_tdata",
            "localvol-pool0_tmeta",
            "localvol-pool0-tpool",
        ] {
            assert!(is_thin_pool_node(node), "{node}");
        }
        for node in ["localvol-pool00", "localvol-pvc--1f", "localvol--pmem-pool0"] {
            assert!(!is_thin_pool_node(node), "{node}");
        }
    }

    #[test]
    fn mounts_below_the_node_dirs_are_found() {
        let mountinfo = "\
22 1 8:1 / / rw - ext4 /dev/vda rw
90 22 253:3 / /var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pvc/mount rw - xfs /dev/dm-3 rw
91 22 0:5 / /var/lib/kubelet rw - ext4 /dev/vda rw
92 22 253:4 / /var/lib/localvol/staging/v rw - ext4 /dev/dm-4 rw
";
        assert_eq!(
            mounts_below(mountinfo, &["/var/lib/kubelet/", "/var/lib/localvol/"]),
            vec![
                "mount /var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pvc/mount",
                "mount /var/lib/localvol/staging/v"
            ]
        );
    }
}
