//! The node's side of a volume, per class kind: what backs it (a loop image, an LV, an
//! fsdax namespace), its block device while it has one, and the node's mounts of it.
//! Scenarios run on the node under test (the host's, or inside the guest: its / is the
//! host's), so these read it directly: /proc/self/mountinfo, losetup, lvs, dmsetup and
//! ndctl (through the testkit's `try_sh`), as tests/cluster/lib.sh's per-class
//! functions do for the shell scenarios.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use localvol_testkit::guest::{json_list, try_sh};

use crate::run::{Result, Run};

/// What backs a volume on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// The loop class's image file.
    LoopImage(PathBuf),
    /// The LV of an lvm, lvm-thin or pmem-lvm class.
    Lv { vg: String, lv: String },
    /// The pmem class's fsdax namespace, by its name (the volume's token).
    Namespace(String),
}

impl Backing {
    /// The backing of the volume `handle` (`class.token`) on the run's class.
    pub fn of(run: &Run, handle: &str) -> Result<Self> {
        let token = handle
            .split_once('.')
            .ok_or_else(|| format!("volume id {handle} is not class.token"))?
            .1;
        Ok(match run.class_kind.as_str() {
            "loop" => Self::LoopImage(run.loop_dir.join(format!("{token}.img"))),
            "lvm" | "lvm-thin" | "pmem-lvm" => Self::Lv {
                vg: run.lvm_vg.clone(),
                lv: lv_named(&run.lvm_vg, token)?.unwrap_or_else(|| token.to_string()),
            },
            "pmem" => Self::Namespace(token.to_string()),
            other => return Err(format!("class kind {other}: no backing known").into()),
        })
    }

    /// Whether the storage is there.
    pub fn present(&self) -> Result<bool> {
        Ok(match self {
            Self::LoopImage(path) => path.is_file(),
            Self::Lv { vg, lv } => succeeds("lvs", &[&format!("{vg}/{lv}")])?,
            Self::Namespace(name) => namespace_field(name, "dev")?.is_some(),
        })
    }

    /// Whether the storage is gone; for an LV also its device-mapper device and node.
    pub fn gone(&self) -> Result<bool> {
        Ok(match self {
            Self::LoopImage(path) => !path.exists(),
            Self::Lv { vg, lv } => {
                let node = dm_node(vg, lv);
                let name = node.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                !succeeds("lvs", &[&format!("{vg}/{lv}")])?
                    && !succeeds("dmsetup", &["info", name])?
                    && !node.exists()
            }
            Self::Namespace(name) => namespace_field(name, "dev")?.is_none(),
        })
    }

    /// The volume's block device now: the loop device on the image, the LV's
    /// /dev/mapper node, the namespace's /dev/pmem device; `None` when there is none.
    pub fn device(&self) -> Result<Option<PathBuf>> {
        Ok(match self {
            Self::LoopImage(path) => loop_device_of(path)?,
            Self::Lv { vg, lv } => Some(dm_node(vg, lv)).filter(|d| is_block(d)),
            Self::Namespace(name) => namespace_field(name, "blockdev")?
                .map(|b| PathBuf::from(format!("/dev/{b}")))
                .filter(|d| is_block(d)),
        })
    }

    /// Unpublished and unstaged: no mount of the volume `pv` on the node and, for the
    /// loop class, no loop device left on the image (an LV or a namespace stays as it is
    /// until the volume is deleted: only a loop device goes at unstage).
    pub fn released(&self, pv: &str) -> Result<bool> {
        let device = self.device()?;
        let detached = !matches!(self, Self::LoopImage(_)) || device.is_none();
        Ok(detached && mounts_of(pv, device.as_deref())?.is_empty())
    }
}

impl std::fmt::Display for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::LoopImage(path) => write!(f, "backing file {}", path.display()),
            Self::Lv { vg, lv } => write!(f, "LV {vg}/{lv}"),
            Self::Namespace(name) => write!(f, "fsdax namespace {name}"),
        }
    }
}

/// The lines of /proc/self/mountinfo that are the volume's: its PV name in the mount
/// point, or its device as the source (by major:minor) or as the bind root (a raw block
/// volume's bind of its device node from devtmpfs).
pub fn mounts_of(pv: &str, device: Option<&Path>) -> Result<Vec<String>> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let device = match device {
        Some(d) => Some((d.to_path_buf(), d.canonicalize()?, majmin(d)?)),
        None => None,
    };
    Ok(mountinfo
        .lines()
        .filter(|line| mount_is_volume(line, pv, device.as_ref()))
        .map(str::to_string)
        .collect())
}

fn mount_is_volume(line: &str, pv: &str, device: Option<&(PathBuf, PathBuf, String)>) -> bool {
    let fields: Vec<&str> = line.split(' ').collect();
    let (Some(majmin), Some(root), Some(point)) = (fields.get(2), fields.get(3), fields.get(4)) else {
        return false;
    };
    if point.contains(pv) {
        return true;
    }
    let Some((path, real, dev_majmin)) = device else {
        return false;
    };
    let bind_root = |p: &Path| {
        p.strip_prefix("/dev")
            .is_ok_and(|rest| *root == format!("/{}", rest.display()))
    };
    *majmin == dev_majmin || bind_root(path) || bind_root(real)
}

/// A block device's major:minor.
pub fn majmin(device: &Path) -> Result<String> {
    let meta = std::fs::metadata(device).map_err(|e| format!("{}: {e}", device.display()))?;
    if !meta.file_type().is_block_device() {
        return Err(format!("{} is not a block device", device.display()).into());
    }
    let rdev = meta.rdev();
    Ok(format!("{}:{}", libc::major(rdev), libc::minor(rdev)))
}

fn is_block(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// The /dev/mapper node of VG/LV (each '-' in either doubled).
fn dm_node(vg: &str, lv: &str) -> PathBuf {
    PathBuf::from(format!(
        "/dev/mapper/{}-{}",
        vg.replace('-', "--"),
        lv.replace('-', "--")
    ))
}

/// The LV of a volume token: named by it, or (a token that cannot be an LV name) a
/// hashed name whose tags carry it (src/backend/lvm/tags.rs).
fn lv_named(vg: &str, token: &str) -> Result<Option<String>> {
    if succeeds("lvs", &[&format!("{vg}/{token}")])? {
        return Ok(Some(token.to_string()));
    }
    let out = output("lvs", &["--noheadings", "-o", "lv_name,lv_tags", vg])?;
    Ok(out.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        let (name, tags) = (words.next()?, words.next().unwrap_or_default());
        tags.contains(token).then(|| name.to_string())
    }))
}

/// A field of the fsdax namespace `name` that holds storage (the kernel leaves a
/// destroyed namespace as the region's idle seed, raw and of size 0, with its label's
/// name: src/backend/pmem/ndctl.rs, is_idle_seed).
fn namespace_field(name: &str, field: &str) -> Result<Option<String>> {
    let out = output("ndctl", &["list", "-N", "-i"])?;
    Ok(namespace_field_in(&out, name, field))
}

fn namespace_field_in(listing: &str, name: &str, field: &str) -> Option<String> {
    json_list(listing)
        .iter()
        .find(|n| n["name"] == name && n["mode"] == "fsdax" && n["size"].as_u64().unwrap_or(0) > 0)
        .and_then(|n| n[field].as_str().map(str::to_string))
}

fn loop_device_of(image: &Path) -> Result<Option<PathBuf>> {
    let image = image.to_str().ok_or("a loop image path that is not UTF-8")?;
    let out = output("losetup", &["-j", image, "-O", "NAME", "-n"])?;
    Ok(out.lines().next().map(|l| PathBuf::from(l.trim())))
}

/// Whether the command exits 0 (its output discarded).
fn succeeds(program: &str, args: &[&str]) -> Result<bool> {
    Ok(try_sh(program, args).is_ok())
}

/// The command's standard output; an error if it fails.
fn output(program: &str, args: &[&str]) -> Result<String> {
    Ok(try_sh(program, args)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_found_only_while_it_holds_storage() {
        let one =
            r#"{"dev":"namespace0.1","mode":"fsdax","size":62914560,"name":"tok","blockdev":"pmem0.1"}"#;
        assert_eq!(
            namespace_field_in(one, "tok", "blockdev").as_deref(),
            Some("pmem0.1")
        );
        let seed = r#"[{"dev":"namespace0.1","mode":"raw","size":0,"name":"tok"},
                       {"dev":"namespace0.2","mode":"fsdax","size":4096,"name":"other","blockdev":"pmem0.2"}]"#;
        assert_eq!(
            namespace_field_in(seed, "tok", "dev"),
            None,
            "an idle seed with the name"
        );
        assert_eq!(
            namespace_field_in(seed, "other", "dev").as_deref(),
            Some("namespace0.2")
        );
        assert_eq!(namespace_field_in("", "tok", "dev"), None);
    }

    #[test]
    fn a_mount_is_the_volumes_by_its_point_its_device_or_its_bind_root() {
        let pv = "pvc-1234";
        let by_point = "36 25 0:1 / /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pvc-1234/mount rw - ext4 /dev/loop3 rw";
        assert!(mount_is_volume(by_point, pv, None));
        let dev = (
            PathBuf::from("/dev/mapper/vg-lv"),
            PathBuf::from("/dev/dm-3"),
            "253:3".to_string(),
        );
        let by_majmin = "37 25 253:3 / /var/lib/kubelet/plugins/x/globalmount rw - xfs /dev/mapper/vg-lv rw";
        assert!(mount_is_volume(by_majmin, pv, Some(&dev)));
        let by_bind = "38 25 0:5 /dm-3 /var/lib/kubelet/plugins/y/staging rw - devtmpfs udev rw";
        assert!(mount_is_volume(by_bind, pv, Some(&dev)));
        let other = "39 25 253:4 / /data rw - xfs /dev/mapper/vg-other rw";
        assert!(!mount_is_volume(other, pv, Some(&dev)));
    }

    #[test]
    fn dm_nodes_double_the_dashes() {
        assert_eq!(
            dm_node("localvol-pmem", "pvc-a"),
            PathBuf::from("/dev/mapper/localvol--pmem-pvc--a")
        );
    }
}
