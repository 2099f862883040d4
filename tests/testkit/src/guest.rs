//! The tests/vm guest's storage fixtures, the one Rust copy of them, shared by
//! tests/vm_backends, tests/hostile_vm.rs, tests/crash_vm.rs (through [`crash`]),
//! tests/vm_grow.rs, tests/reclaim_privileged.rs and benches/backends: the gate that
//! fails loudly when a required VM suite runs outside the guest, the tools run directly,
//! a VG and thin pool on the guest's disks or on a loop device, and the NVDIMM region's
//! set-up and listing; [`overlay`] and [`sanity`] the storage of the cluster
//! configurations and of csi-sanity, which the shell in the guest reaches through the
//! `guest-storage` binary. (tests/vm/smoke.sh runs the tools itself on purpose: it tests
//! them.)

use std::path::Path;
use std::process::Command;

pub mod crash;
pub mod overlay;
pub mod sanity;

/// The emulated NVDIMM's region and its one DIMM, as tests/vm/run.sh boots the guest.
pub const REGION: &str = "region0";
pub const NMEM: &str = "nmem0";

/// True in the guest (`VMTEST_GUEST=1`). On the host the test did not run: that fails
/// if `LOCALVOL_VM_SUITE=1` says the suite is required, else it is said and passes.
/// `suite` names the test binary, `how` how to run it in the guest.
pub fn in_guest(suite: &str, test: &str, how: &str) -> bool {
    if std::env::var("VMTEST_GUEST").as_deref() == Ok("1") {
        return true;
    }
    if std::env::var("LOCALVOL_VM_SUITE").as_deref() == Ok("1") {
        panic!("{test}: LOCALVOL_VM_SUITE=1 but this is not the VM guest; {how}");
    }
    eprintln!("{suite}: {test} not run: {how}");
    false
}

/// Runs a tool with `LC_ALL=C`; its stdout, or the failure with its stderr.
pub fn try_sh(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(format!(
            "{program} {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Runs a tool that must succeed; returns its stdout.
pub fn sh(program: &str, args: &[&str]) -> String {
    try_sh(program, args).unwrap_or_else(|e| panic!("{e}"))
}

/// A string field of one JSON object that ndctl printed.
pub fn json_field(json: &str, key: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} in {json}"))
        .to_string()
}

/// ndctl prints one object or an array of them (or nothing).
pub fn json_list(out: &str) -> Vec<serde_json::Value> {
    if out.trim().is_empty() {
        return Vec::new();
    }
    match serde_json::from_str(out).unwrap() {
        serde_json::Value::Array(all) => all,
        one => vec![one],
    }
}

/// LVM's report of `fields` of `what` (a VG, or `vg/lv`) in bytes, without headings.
pub fn lvm_report(program: &str, fields: &str, what: &str) -> String {
    sh(
        program,
        &["--noheadings", "--units", "b", "--nosuffix", "-o", fields, what],
    )
}

/// One field in bytes of a VG (`vgs`) or LV (`lvs`).
pub fn lvm_bytes(program: &str, field: &str, what: &str) -> u64 {
    let out = lvm_report(program, field, what);
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{program} -o {field} {what}: {out:?}"))
}

/// A VG on `disks` (made physical volumes first).
pub fn volume_group(vg: &str, disks: &[&str]) {
    let mut pvcreate = vec!["-q", "-y", "-ff"];
    pvcreate.extend_from_slice(disks);
    sh("pvcreate", &pvcreate);
    let mut vgcreate = vec!["-q", vg];
    vgcreate.extend_from_slice(disks);
    sh("vgcreate", &vgcreate);
}

/// A plain LV `vg/name` of `size` (lvcreate's `-L`) with `tags`, made as a test plants
/// state by hand: no signature wiping, no zeroing, so it shows whatever the extents
/// held.
pub fn plain_lv(vg: &str, name: &str, size: &str, tags: &[&str]) {
    let mut args = vec!["-q", "-y", "-Wn", "-Zn", "-n", name, "-L", size];
    for tag in tags {
        args.extend(["--addtag", tag]);
    }
    args.push(vg);
    sh("lvcreate", &args);
}

/// A thin pool `vg/pool` of `size` (lvcreate's `-L`), zeroing new chunks or not.
pub fn thin_pool(vg: &str, pool: &str, size: &str, zeroing: bool) {
    let zero = if zeroing { "-Zy" } else { "-Zn" };
    sh(
        "lvcreate",
        &["-q", "-y", "-T", &format!("{vg}/{pool}"), "-L", size, zero],
    );
}

/// `disk` wiped and made the one PV of a new VG `vg` with a thin pool `vg/pool` of
/// `size` (lvcreate's `-L`; zeroing as lvm.conf says), as tests/reclaim_privileged.rs
/// measures a pool's space.
pub fn thin_pool_on_wiped_disk(vg: &str, pool: &str, disk: &str, size: &str) {
    sh("wipefs", &["-q", "-a", disk]);
    sh("pvcreate", &["-ff", "-y", disk]);
    sh("vgcreate", &[vg, disk]);
    sh("lvcreate", &["-y", "-L", size, "-T", &format!("{vg}/{pool}")]);
}

/// A VG `vg` on a loop device over a new file `backing` of `bytes` (for a VG that
/// appears while the daemon runs: the guest's disks are taken); returns the loop
/// device, for [`remove_volume_group_on_loop`].
pub fn volume_group_on_loop(vg: &str, backing: &Path, bytes: u64) -> String {
    let file = std::fs::File::create(backing).unwrap();
    file.set_len(bytes).unwrap();
    drop(file);
    let loop_dev = sh("losetup", &["-f", "--show", backing.to_str().unwrap()]);
    let loop_dev = loop_dev.trim().to_string();
    sh("pvcreate", &["-q", &loop_dev]);
    sh("vgcreate", &["-q", vg, &loop_dev]);
    loop_dev
}

/// Removes what [`volume_group_on_loop`] made: the VG, its PV and the loop device.
pub fn remove_volume_group_on_loop(vg: &str, loop_dev: &str) {
    sh("vgremove", &["-q", "-f", vg]);
    sh("pvremove", &["-q", loop_dev]);
    sh("losetup", &["-d", loop_dev]);
}

/// A VG on disks that can fail: each PV a device-mapper linear device, which
/// [`fail`](Self::fail) switches to the `error` target, as a dead disk answers every
/// I/O, and [`restore`](Self::restore) switches back. Under each, an LV of a backing VG
/// on a loop file: lvm does not look inside LVs for PVs (`scan_lvs=0`), so the dm device
/// is the disk's one path, as a real disk's is (over a loop device, lvm would find each
/// PV twice and refuse the duplicates).
pub struct FailableVg {
    pub vg: String,
    backing_vg: String,
    loop_dev: String,
    /// The device-mapper name of each disk.
    disks: Vec<String>,
    sectors: u64,
    /// The disks failed and not restored: a test that fails between the two leaves no
    /// failing disk to the tests after it in the guest (see the `Drop`).
    failed: std::sync::Mutex<std::collections::BTreeSet<usize>>,
}

impl FailableVg {
    /// `vg` on `disks` disks of `bytes` each, their backing file in `dir`.
    pub fn create(vg: &str, dir: &Path, disks: usize, bytes: u64) -> Self {
        let sectors = bytes / 512;
        let backing_vg = format!("{vg}-backing");
        let file = dir.join(format!("{backing_vg}.img"));
        let loop_dev = volume_group_on_loop(&backing_vg, &file, (disks as u64 + 1) * bytes);
        let disks: Vec<String> = (0..disks)
            .map(|i| {
                let lv = format!("disk{i}");
                sh(
                    "lvcreate",
                    &["-q", "-y", "-n", &lv, "-L", &format!("{bytes}b"), &backing_vg],
                );
                let name = format!("{vg}-{lv}");
                let table = format!("0 {sectors} linear /dev/{backing_vg}/{lv} 0");
                sh("dmsetup", &["create", &name, "--table", &table]);
                name
            })
            .collect();
        let pvs: Vec<String> = disks.iter().map(|name| format!("/dev/mapper/{name}")).collect();
        let mut pvcreate = vec!["-q"];
        pvcreate.extend(pvs.iter().map(String::as_str));
        sh("pvcreate", &pvcreate);
        let mut vgcreate = vec!["-q", vg];
        vgcreate.extend(pvs.iter().map(String::as_str));
        sh("vgcreate", &vgcreate);
        Self {
            vg: vg.to_string(),
            backing_vg,
            loop_dev,
            disks,
            sectors,
            failed: Default::default(),
        }
    }

    /// The PV of disk `i`, as lvm names it.
    pub fn pv(&self, i: usize) -> String {
        format!("/dev/mapper/{}", self.disks[i])
    }

    fn load(&self, i: usize, table: &str) {
        self.try_load(i, table).unwrap_or_else(|e| panic!("{e}"));
    }

    fn try_load(&self, i: usize, table: &str) -> Result<(), String> {
        let name = &self.disks[i];
        try_sh("dmsetup", &["suspend", name])?;
        let table = format!("0 {} {table}", self.sectors);
        try_sh("dmsetup", &["load", name, "--table", &table])?;
        try_sh("dmsetup", &["resume", name]).map(drop)
    }

    fn linear(&self, i: usize) -> String {
        format!("linear /dev/{}/disk{i} 0", self.backing_vg)
    }

    /// Disk `i` fails: every read and write of it is an I/O error.
    pub fn fail(&self, i: usize) {
        self.load(i, "error");
        self.failed.lock().unwrap().insert(i);
    }

    /// Disk `i` answers again, with what it held.
    pub fn restore(&self, i: usize) {
        self.load(i, &self.linear(i));
        self.failed.lock().unwrap().remove(&i);
    }

    /// Removes the VG, its PVs, the device-mapper devices and the backing VG.
    pub fn remove(self) {
        sh("vgremove", &["-q", "-f", &self.vg]);
        for name in &self.disks {
            sh("pvremove", &["-q", &format!("/dev/mapper/{name}")]);
            sh("dmsetup", &["remove", name]);
        }
        remove_volume_group_on_loop(&self.backing_vg, &self.loop_dev);
    }
}

impl Drop for FailableVg {
    /// Restores what is still failed (after a failed assertion): the guest's later
    /// tests scan every disk, and a disk of I/O errors under them is not theirs to meet.
    fn drop(&mut self) {
        let failed = std::mem::take(&mut *self.failed.lock().unwrap_or_else(|e| e.into_inner()));
        for i in failed {
            // Not a panic while one unwinds: that would abort the guest's other tests.
            if let Err(e) = self.try_load(i, &self.linear(i)) {
                eprintln!("FailableVg {}: disk {i} not restored: {e}", self.vg);
            }
        }
    }
}

/// Empties the region: its labels initialised, so it offers all its space to new
/// namespaces (a region nobody labelled holds one label-less raw namespace).
pub fn reset_region() {
    sh("ndctl", &["disable-region", REGION]);
    sh("ndctl", &["init-labels", "-f", NMEM]);
    sh("ndctl", &["enable-region", REGION]);
}

/// The region as `ndctl list -R` describes it.
pub fn region() -> serde_json::Value {
    json_list(&sh("ndctl", &["list", "-R", "-r", REGION]))
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("ndctl lists no {REGION}"))
}

/// ndctl's arguments for an fsdax namespace of `size` named `name` in the region (for a
/// caller that runs the tool itself, as a benchmark counting the tools it runs does).
pub fn fsdax_namespace_args(size: &str, name: &str) -> Vec<String> {
    [
        "create-namespace",
        "-r",
        REGION,
        "-m",
        "fsdax",
        "-M",
        "dev",
        "-s",
        size,
        "-n",
        name,
    ]
    .map(str::to_string)
    .to_vec()
}

/// Makes an fsdax namespace of `size` named `name`; returns what ndctl printed of it.
pub fn fsdax_namespace(size: &str, name: &str) -> String {
    let args = fsdax_namespace_args(size, name);
    sh("ndctl", &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The region's namespaces, disabled ones too (`-i`) or only enabled ones.
pub fn namespaces(include_idle: bool) -> Vec<serde_json::Value> {
    let mut args = vec!["list", "-N"];
    if include_idle {
        args.push("-i");
    }
    args.extend(["-r", REGION]);
    json_list(&sh("ndctl", &args))
}

/// A VG on a new fsdax namespace of `size` named `namespace`; returns the namespace's
/// (dev, block device path).
pub fn volume_group_on_pmem(vg: &str, size: &str, namespace: &str) -> (String, String) {
    let made = fsdax_namespace(size, namespace);
    let pv = format!("/dev/{}", json_field(&made, "blockdev"));
    volume_group(vg, &[&pv]);
    (json_field(&made, "dev"), pv)
}

/// Writes `dir/<class>.yaml` for each (class, YAML flow mapping): a config of that class
/// alone.
pub fn single_class_configs(dir: &str, classes: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (class, yaml) in classes {
        std::fs::write(
            Path::new(dir).join(format!("{class}.yaml")),
            format!("device-classes:\n  - {yaml}\n"),
        )
        .unwrap();
    }
}

/// The VGs the VM suite's parts make: tests/vm_backends.rs' on /dev/vda, /dev/vdb and a
/// namespace, and [`sanity`]'s.
const SUITE_VGS: [&str; 4] = ["vmvg", "pmemvg", sanity::VG, sanity::PMEM_VG];

/// Gives back what tests/vm_backends.rs and tests/sanity/vm.sh made, even after a failed
/// test left volumes mounted or encrypted mappings open, so that the next part of the same
/// guest finds empty disks and an empty region: the mounts of the VGs' LVs and of
/// localvol's encrypted mappings (deepest first), the mappings, the VGs, the disks'
/// signatures and the region's namespaces.
pub fn release_suite_storage() -> Result<(), String> {
    let mounts = try_sh("findmnt", &["-rn", "-o", "TARGET,SOURCE"])?;
    let mut ours: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, source)| {
            source.strip_prefix("/dev/mapper/").is_some_and(|dm| {
                dm.starts_with("localvol-crypt-")
                    || SUITE_VGS.iter().any(|vg| dm.starts_with(&format!("{vg}-")))
            })
        })
        .map(|(target, _)| target)
        .collect();
    ours.sort_by(|a, b| b.cmp(a));
    for target in ours {
        try_sh("umount", &["-l", target])?;
    }
    for entry in std::fs::read_dir("/dev/mapper")
        .map_err(|e| format!("/dev/mapper: {e}"))?
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("localvol-crypt-") {
            try_sh("cryptsetup", &["close", &name])?;
        }
    }
    // Whichever of them exist; one that does not makes vgremove fail, and the check below
    // is what counts.
    let mut vgremove = vec!["-q", "-y", "-ff"];
    vgremove.extend(SUITE_VGS);
    let _ = try_sh("vgremove", &vgremove);
    try_sh("wipefs", &["-q", "-a", "/dev/vda", "/dev/vdb", "/dev/vdc"])?;
    // Its status is not the check either: a region nobody labelled refuses it, and holds
    // no namespace of a test.
    let _ = try_sh("ndctl", &["destroy-namespace", "-f", "all", "-r", REGION]);
    if let Some(vg) = SUITE_VGS.iter().find(|vg| try_sh("vgs", &[vg]).is_ok()) {
        return Err(format!("{vg} is still there"));
    }
    match overlay::fsdax_namespaces().first() {
        Some(left) => Err(format!("{left} is still there")),
        None => Ok(()),
    }
}
