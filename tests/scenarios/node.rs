//! The node's side of a volume, per class kind: what backs it (a loop image, an LV, an
//! fsdax namespace), its block device while it has one, and the node's mounts of it.
//! Scenarios run on the node under test (the host's, or inside the guest: its / is the
//! host's), so these read it directly: /proc/self/mountinfo, losetup, lvs, dmsetup and
//! ndctl (through the testkit's `try_sh`), as tests/cluster/lib.sh's per-class
//! functions do for the shell scenarios.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use localvol_testkit::guest::{json_list, overlay, try_sh};

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

    /// The volume's size on the node: the image file's size, the LV's size, the
    /// namespace's size.
    pub fn bytes(&self) -> Result<u64> {
        match self {
            Self::LoopImage(path) => Ok(std::fs::metadata(path)
                .map_err(|e| format!("{}: {e}", path.display()))?
                .len()),
            Self::Lv { vg, lv } => {
                let out = lv_bytes_fields(vg, lv, "lv_size")?;
                lv_size_in(&out).ok_or_else(|| format!("lvs: no size of {vg}/{lv} in {out:?}").into())
            }
            Self::Namespace(name) => {
                let size = namespace_field(name, "size")?
                    .ok_or_else(|| format!("no fsdax namespace {name} holding storage"))?;
                Ok(size.parse()?)
            }
        }
    }
}

/// The size in bytes `lvs --noheadings --units b --nosuffix -o lv_size` prints.
fn lv_size_in(out: &str) -> Option<u64> {
    out.trim().parse().ok()
}

impl Backing {
    /// The first `len` bytes of the volume, read on the node from its storage (the loop
    /// image, or the block device of an LV or a namespace).
    pub fn read_head(&self, len: usize) -> Result<Vec<u8>> {
        let path = match self {
            Self::LoopImage(path) => path.clone(),
            _ => self
                .device()?
                .ok_or_else(|| format!("no block device of {self}"))?,
        };
        let mut head = vec![0; len];
        std::fs::File::open(&path)
            .and_then(|mut f| f.read_exact(&mut head))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(head)
    }

    /// What the volume's data takes on the node, for the kinds that give back what a trim
    /// frees: the image's allocated blocks (loop), the thin LV's mapped share of its size
    /// (lvm-thin: data_percent).
    pub fn used_bytes(&self, run: &Run) -> Result<u64> {
        match (self, run.class_kind.as_str()) {
            (Self::LoopImage(path), _) => Ok(std::fs::metadata(path)?.blocks() * 512),
            (Self::Lv { vg, lv }, "lvm-thin") => {
                let out = lv_bytes_fields(vg, lv, "lv_size,data_percent")?;
                mapped_bytes(&out).ok_or_else(|| format!("lvs of {self}: {out:?}").into())
            }
            _ => Err(format!(
                "{self}: a {} volume has no space a trim gives back",
                run.class_kind
            )
            .into()),
        }
    }
}

/// `lvs` FIELDS of `vg/lv`, sizes in bytes without a unit.
fn lv_bytes_fields(vg: &str, lv: &str, fields: &str) -> Result<String> {
    output(
        "lvs",
        &[
            "--noheadings",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            fields,
            &format!("{vg}/{lv}"),
        ],
    )
}

/// The size in bytes of the run's thin pool.
pub fn pool_bytes(run: &Run) -> Result<u64> {
    let out = lv_bytes_fields(&run.lvm_vg, &run.thin_pool, "lv_size")?;
    lv_size_in(&out).ok_or_else(|| format!("lvs: no size of the pool {} in {out:?}", run.thin_pool).into())
}

/// The data_percent of the run's thin pool.
pub fn pool_data_percent(run: &Run) -> Result<f64> {
    let pool = format!("{}/{}", run.lvm_vg, run.thin_pool);
    let out = output("lvs", &["--noheadings", "-o", "data_percent", &pool])?;
    out.trim()
        .parse()
        .map_err(|e| format!("data_percent of {pool}: {out:?}: {e}").into())
}

/// A thin LV's bytes in use from `lvs -o lv_size,data_percent` in bytes: size times the
/// mapped percentage.
fn mapped_bytes(lvs: &str) -> Option<u64> {
    let mut words = lvs.split_whitespace();
    let size: f64 = words.next()?.parse().ok()?;
    let percent: f64 = words.next()?.parse().ok()?;
    Some((size * percent / 100.0) as u64)
}

/// A claim's volume as the API and the node see it.
#[derive(Clone, Debug)]
pub struct Volume {
    pub pv: String,
    pub handle: String,
    pub backing: Backing,
    /// Its block device when it was looked at.
    pub device: Option<PathBuf>,
}

impl Volume {
    /// The volume bound to claim `claim` ([`Run::volume_of`]); fails unless its storage
    /// is on the node.
    pub async fn of_claim(run: &Run, claim: &str) -> Result<Self> {
        let (pv, handle) = run.volume_of(claim).await?;
        let backing = Backing::of(run, &handle)?;
        if !backing.present()? {
            return Err(format!("{backing} of {handle} missing on the node").into());
        }
        let device = backing.device()?;
        run.note(&format!(
            "PV {pv} handle {handle}: {backing} on {}",
            device
                .as_deref()
                .map_or("no device".into(), |d| d.display().to_string())
        ));
        Ok(Self {
            pv,
            handle,
            backing,
            device,
        })
    }

    /// Its block device; an error when it has none.
    pub fn device(&self) -> Result<&Path> {
        self.device
            .as_deref()
            .ok_or_else(|| format!("no block device of {}", self.backing).into())
    }

    /// The device is the kind the run's class makes: a loop device; a device-mapper LV
    /// (thin for lvm-thin, on a pmem device for pmem-lvm); an fsdax namespace's pmem
    /// device.
    pub fn expect_class_device(&self, run: &Run) -> Result {
        let device = self.device()?;
        let shown = device.display().to_string();
        match (&self.backing, run.class_kind.as_str()) {
            (Backing::LoopImage(_), _) if shown.starts_with("/dev/loop") => {}
            (Backing::Lv { vg, lv }, kind) => {
                let major = majmin(device)?.split(':').next().unwrap_or_default().to_string();
                let dm = device_mapper_major(&std::fs::read_to_string("/proc/devices")?);
                if !shown.starts_with("/dev/mapper/") || dm.as_deref() != Some(major.as_str()) {
                    return Err(format!(
                        "{shown} of {} is not a device-mapper device (major {dm:?})",
                        self.backing
                    )
                    .into());
                }
                let lv = format!("{vg}/{lv}");
                if kind == "lvm-thin" {
                    let segtype = output("lvs", &["--noheadings", "-o", "segtype", &lv])?;
                    if segtype.trim() != "thin" {
                        return Err(format!("{lv} is not a thin LV ({})", segtype.trim()).into());
                    }
                }
                if kind == "pmem-lvm" {
                    let devices = output("lvs", &["--noheadings", "-o", "devices", &lv])?;
                    if !devices.trim().starts_with("/dev/pmem") {
                        return Err(format!("{lv} lies on {}, not on a pmem device", devices.trim()).into());
                    }
                }
            }
            // Backing::present found it fsdax.
            (Backing::Namespace(_), _) if shown.starts_with("/dev/pmem") => {}
            (backing, kind) => {
                return Err(format!("{shown} of {backing} is not the device a {kind} class makes").into());
            }
        }
        run.note(&format!(
            "node: {} is {shown} ({})",
            self.backing,
            majmin(device)?
        ));
        Ok(())
    }

    /// At least `min` mounts of the volume on the node.
    pub fn expect_mounted(&self, run: &Run, min: usize) -> Result {
        let mounts = mounts_of(&self.pv, self.device.as_deref())?;
        if mounts.len() < min {
            return Err(format!(
                "volume {} ({}): {} mounts on the node, expected at least {min}: {mounts:?}",
                self.pv,
                self.backing,
                mounts.len()
            )
            .into());
        }
        run.note(&format!("node: {} mount(s) of {}", mounts.len(), self.pv));
        Ok(())
    }

    /// The filesystem pod `pod` sees at `path` is this volume's: `fstype`, on its device
    /// (by major:minor; the source string may be any of its aliases, of the class's
    /// kind), mounted with dax on the pmem classes (their overlays ask for it).
    pub async fn expect_pod_mount(&self, run: &Run, pod: &str, path: &str, fstype: &str) -> Result {
        let mountinfo = run.exec(pod, "cat /proc/self/mountinfo").await?;
        let mount = mount_at(&mountinfo, path).ok_or_else(|| format!("no mount at {path} in pod {pod}"))?;
        let want = majmin(self.device()?)?;
        if mount.fstype != fstype {
            return Err(format!("{path} in pod {pod} is {}, expected {fstype}", mount.fstype).into());
        }
        if mount.majmin != want {
            return Err(format!(
                "{path} in pod {pod} is device {} ({}), not {} ({want})",
                mount.majmin,
                mount.source,
                self.device()?.display()
            )
            .into());
        }
        let kind = run.class_kind.as_str();
        let source_ok = match kind {
            "lvm" | "lvm-thin" | "pmem-lvm" => {
                mount.source.starts_with("/dev/mapper/")
                    || mount.source.starts_with("/dev/dm-")
                    || mount.source.starts_with(&format!("/dev/{}/", run.lvm_vg))
            }
            "pmem" => mount.source.starts_with("/dev/pmem"),
            _ => true,
        };
        if !source_ok {
            return Err(format!(
                "{path} in pod {pod}: mount source {} is not a {kind} volume's device",
                mount.source
            )
            .into());
        }
        if matches!(kind, "pmem" | "pmem-lvm") && !mount.dax {
            return Err(format!("{path} in pod {pod} is not mounted with dax: {}", mount.line).into());
        }
        run.note(&format!(
            "pod {pod}: {path} is {} on {} ({})",
            mount.fstype, mount.source, mount.majmin
        ));
        Ok(())
    }
}

/// Whether the file or device at `path` holds `needle` anywhere, read in chunks that
/// overlap by the needle's length.
pub fn holds_bytes(path: &Path, needle: &[u8]) -> Result<bool> {
    const CHUNK: usize = 1 << 20;
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let keep = needle.len().saturating_sub(1);
    let mut window: Vec<u8> = Vec::with_capacity(CHUNK + keep);
    let mut chunk = vec![0; CHUNK];
    loop {
        let n = file.read(&mut chunk)?;
        if n == 0 {
            return Ok(false);
        }
        window.extend_from_slice(&chunk[..n]);
        if window.windows(needle.len()).any(|w| w == needle) {
            return Ok(true);
        }
        let tail = window.len().saturating_sub(keep);
        window.drain(..tail);
    }
}

/// One line of a mountinfo table, the fields a volume check reads.
#[derive(Debug, PartialEq, Eq)]
pub struct MountLine {
    pub majmin: String,
    pub fstype: String,
    pub source: String,
    /// dax among its mount or superblock options.
    pub dax: bool,
    pub line: String,
}

/// The mount at `point` in a mountinfo table (the last one: it is the one seen).
pub fn mount_at(mountinfo: &str, point: &str) -> Option<MountLine> {
    mountinfo.lines().rev().find_map(|line| {
        let (mine, theirs) = line.split_once(" - ")?;
        let fields: Vec<&str> = mine.split(' ').collect();
        if fields.get(4) != Some(&point) {
            return None;
        }
        let mut rest = theirs.split(' ');
        let (fstype, source, options) = (rest.next()?, rest.next()?, rest.next().unwrap_or_default());
        let has_dax = |opts: &str| opts.split(',').any(|o| o == "dax" || o.starts_with("dax="));
        Some(MountLine {
            majmin: fields.get(2)?.to_string(),
            fstype: fstype.to_string(),
            source: source.to_string(),
            dax: has_dax(fields.get(5).copied().unwrap_or_default()) || has_dax(options),
            line: line.to_string(),
        })
    })
}

/// The device-mapper's block major in /proc/devices.
fn device_mapper_major(devices: &str) -> Option<String> {
    devices.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        let major = words.next()?;
        (words.next()? == "device-mapper").then(|| major.to_string())
    })
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
        .and_then(|n| match &n[field] {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Number(v) => Some(v.to_string()),
            _ => None,
        })
}

fn loop_device_of(image: &Path) -> Result<Option<PathBuf>> {
    let image = image.to_str().ok_or("a loop image path that is not UTF-8")?;
    let out = output("losetup", &["-j", image, "-O", "NAME", "-n"])?;
    Ok(out.lines().next().map(|l| PathBuf::from(l.trim())))
}

/// A snapshot's storage on the node: its image and record in the loop class's
/// snapshots directory, or its thin snapshot LV (lvm-thin: `s+TOKEN`, or a hashed `s+`
/// name whose tags carry the token when the token cannot be an LV name;
/// src/backend/lvm/snapshots.rs). The other classes take no snapshots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotStorage {
    LoopFiles { image: PathBuf, record: PathBuf },
    ThinLv { vg: String, token: String },
}

impl SnapshotStorage {
    /// The storage of the snapshot `handle` (`snapshot.CLASS.TOKEN`) on the run's class.
    pub fn of(run: &Run, handle: &str) -> Result<Self> {
        let token = snapshot_token(handle)
            .ok_or_else(|| format!("snapshot id {handle} is not snapshot.class.token"))?;
        Ok(match run.class_kind.as_str() {
            "loop" => {
                let dir = run.loop_dir.join("snapshots");
                Self::LoopFiles {
                    image: dir.join(format!("{token}.img")),
                    record: dir.join(format!("{token}.json")),
                }
            }
            "lvm-thin" => Self::ThinLv {
                vg: run.lvm_vg.clone(),
                token: token.to_string(),
            },
            other => return Err(format!("class kind {other} takes no snapshots").into()),
        })
    }

    /// Whether the snapshot is there: both its files, or its LV.
    pub fn present(&self) -> Result<bool> {
        Ok(match self {
            Self::LoopFiles { image, record } => image.is_file() && record.is_file(),
            Self::ThinLv { .. } => self.lv()?.is_some(),
        })
    }

    /// Whether the snapshot is gone: neither of its files, or no LV of it.
    pub fn gone(&self) -> Result<bool> {
        Ok(match self {
            Self::LoopFiles { image, record } => !image.exists() && !record.exists(),
            Self::ThinLv { .. } => self.lv()?.is_none(),
        })
    }

    /// The name of the thin snapshot LV, when there is one.
    fn lv(&self) -> Result<Option<String>> {
        let Self::ThinLv { vg, token } = self else {
            return Ok(None);
        };
        let named = format!("s+{token}");
        if succeeds("lvs", &[&format!("{vg}/{named}")])? {
            return Ok(Some(named));
        }
        let listing = output("lvs", &["--noheadings", "-o", "lv_name,lv_tags", vg])?;
        Ok(snapshot_lv_in(&listing, token))
    }
}

impl std::fmt::Display for SnapshotStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::LoopFiles { image, record } => {
                write!(
                    f,
                    "snapshot image {} and record {}",
                    image.display(),
                    record.display()
                )
            }
            Self::ThinLv { vg, token } => write!(f, "snapshot LV of {token} in {vg}"),
        }
    }
}

/// The token of a snapshot id `snapshot.CLASS.TOKEN`.
fn snapshot_token(handle: &str) -> Option<&str> {
    let (_class, token) = handle.strip_prefix("snapshot.")?.split_once('.')?;
    (!token.is_empty()).then_some(token)
}

/// The snapshot LV (an `s+` name) whose tags carry `token`, in `lvs -o lv_name,lv_tags`.
fn snapshot_lv_in(listing: &str, token: &str) -> Option<String> {
    listing.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        let (name, tags) = (words.next()?, words.next().unwrap_or_default());
        (name.starts_with("s+") && tags.contains(token)).then(|| name.to_string())
    })
}

/// Every volume and snapshot of the run's class still on the node: the files in the
/// loop class's directory (images, records, freeze records; its empty directories are
/// the daemon's own), the LVs in the class's VG but the thin pool.
pub fn class_storage_left(run: &Run) -> Result<Vec<String>> {
    match run.class_kind.as_str() {
        "loop" => {
            let mut files = Vec::new();
            if run.loop_dir.is_dir() {
                files_under(&run.loop_dir, &mut files)?;
            }
            Ok(files)
        }
        "lvm" | "lvm-thin" | "pmem-lvm" => {
            let listing = output("lvs", &["--noheadings", "-o", "lv_name", &run.lvm_vg])?;
            Ok(overlay::volume_lvs_in(&listing, &run.thin_pool))
        }
        other => Err(format!("class kind {other}: no class storage known").into()),
    }
}

/// Every file under `dir` that is not a directory (`find DIR -mindepth 1 ! -type d`).
fn files_under(dir: &Path, files: &mut Vec<String>) -> Result {
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            files_under(&entry.path(), files)?;
        } else {
            files.push(entry.path().display().to_string());
        }
    }
    Ok(())
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
        assert_eq!(
            namespace_field_in(one, "tok", "size").as_deref(),
            Some("62914560"),
            "a number field"
        );
    }

    #[test]
    fn an_lvs_size_is_its_bytes() {
        assert_eq!(lv_size_in("  671088640\n"), Some(671088640));
        assert_eq!(lv_size_in(""), None);
        assert_eq!(lv_size_in("  640.00m\n"), None, "not in bytes");
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
    fn the_mount_at_a_point_is_read_with_its_dax_option() {
        let table = "21 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
                     40 21 259:2 / /data rw,relatime - xfs /dev/pmem0.1 rw,dax=always,attr2\n\
                     41 21 0:40 / /data/x rw - tmpfs tmpfs rw\n";
        let data = mount_at(table, "/data").expect("a mount at /data");
        assert_eq!(
            (data.majmin.as_str(), data.fstype.as_str(), data.source.as_str()),
            ("259:2", "xfs", "/dev/pmem0.1")
        );
        assert!(data.dax);
        assert!(!mount_at(table, "/").expect("root").dax);
        assert_eq!(mount_at(table, "/nowhere"), None);
        let ext4 = "50 21 253:3 / /data rw,relatime,dax - ext4 /dev/mapper/vg-lv rw\n";
        assert!(
            mount_at(ext4, "/data").expect("a mount").dax,
            "dax among the mount options"
        );
    }

    #[test]
    fn the_device_mappers_major_is_found_among_the_block_devices() {
        let devices =
            "Character devices:\n  1 mem\n\nBlock devices:\n  7 loop\n252 device-mapper\n259 blkext\n";
        assert_eq!(device_mapper_major(devices).as_deref(), Some("252"));
        assert_eq!(device_mapper_major("Block devices:\n  7 loop\n"), None);
    }

    #[test]
    fn a_thin_lvs_use_is_its_mapped_share() {
        assert_eq!(mapped_bytes("  268435456 25.00\n"), Some(67108864));
        assert_eq!(
            mapped_bytes("  268435456\n"),
            None,
            "no data_percent (a thick LV)"
        );
    }

    #[test]
    fn bytes_are_found_across_chunk_boundaries() {
        let mut file = tempfile::NamedTempFile::new().expect("a temporary file");
        let mut data = vec![0u8; (1 << 20) - 3];
        data.extend_from_slice(b"MARKER");
        data.extend(std::iter::repeat_n(0u8, 100));
        std::io::Write::write_all(&mut file, &data).expect("written");
        assert!(holds_bytes(file.path(), b"MARKER").expect("read"));
        assert!(!holds_bytes(file.path(), b"ABSENT").expect("read"));
    }

    #[test]
    fn dm_nodes_double_the_dashes() {
        assert_eq!(
            dm_node("localvol-pmem", "pvc-a"),
            PathBuf::from("/dev/mapper/localvol--pmem-pvc--a")
        );
    }

    #[test]
    fn a_snapshot_token_follows_its_class() {
        assert_eq!(
            snapshot_token("snapshot.lvm-thin.snapshot-8d42"),
            Some("snapshot-8d42")
        );
        assert_eq!(
            snapshot_token("snapshot.loop.a.b"),
            Some("a.b"),
            "the token may hold dots"
        );
        assert_eq!(snapshot_token("loop.pvc-1"), None, "a volume id");
        assert_eq!(snapshot_token("snapshot.loop"), None);
    }

    #[test]
    fn a_snapshot_lv_is_an_s_plus_lv_tagged_with_the_token() {
        let listing =
            "  pool0\n  pvc-1      localvol.token=tok\n  s+ab12cd   localvol.token=tok\n  s+other\n";
        assert_eq!(snapshot_lv_in(listing, "tok").as_deref(), Some("s+ab12cd"));
        assert_eq!(snapshot_lv_in(listing, "missing"), None);
        assert_eq!(snapshot_lv_in("  pvc-1 tok\n", "tok"), None, "a volume's LV");
    }
}
