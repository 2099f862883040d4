//! A mount namespace where a misbehaving driver cannot harm the machine running the test.
//!
//! [`run_sandboxed`] re-executes the test binary for one test under
//! `unshare --mount --propagation private`. Inside, before the test body runs,
//! [`enter`] mounts a private tmpfs on a scratch directory (the only place anything
//! may be written: the daemon's socket, data directory and kubelet root), then remounts
//! every other mount of the namespace read-only, `/`, `/dev`, `/proc` and `/sys`
//! included, and proves `/` refuses a write. Mounts made or removed inside never
//! propagate out, and the namespace dies with the process; loop devices are global, so
//! those left on files in the scratch tmpfs are detached by the parent afterwards.
//!
//! In the tests/vm guest the LVM and PMEM backends need a few places writable that
//! the host's sandbox keeps read-only ([`Sandbox::guest`]): device-mapper makes its
//! nodes in `/dev`, ndctl writes sysfs, LVM takes its locks below `/run`, and LVM's
//! metadata backups get a private tmpfs each. Those are the guest's own (it is thrown
//! away after the run); `/` stays read-only there too.

use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{MsFlags, mount};

const SCRATCH_ENV: &str = "LOCALVOL_HOSTILE_SCRATCH";
const WRITABLE_ENV: &str = "LOCALVOL_HOSTILE_WRITABLE";
const PRIVATE_ENV: &str = "LOCALVOL_HOSTILE_PRIVATE";

/// What the sandbox leaves writable besides its scratch directory.
#[derive(Debug, Default, Clone)]
pub struct Sandbox {
    /// Mount points left as they are (not remounted read-only).
    pub writable: Vec<PathBuf>,
    /// Directories given a private, empty tmpfs before the rest turns read-only.
    pub private: Vec<PathBuf>,
}

impl Sandbox {
    /// For the tests/vm guest: `/dev`, `/sys` and `/run` writable, private LVM backups.
    pub fn guest() -> Self {
        Self {
            writable: ["/dev", "/sys", "/run"].map(PathBuf::from).to_vec(),
            private: ["/etc/lvm/archive", "/etc/lvm/backup"]
                .map(PathBuf::from)
                .to_vec(),
        }
    }
}

fn join(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

fn split(var: &str) -> Vec<PathBuf> {
    std::env::var(var)
        .unwrap_or_default()
        .split(':')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// Runs test `name` of this binary inside a fresh sandbox and fails if it fails. Returns
/// `Some(scratch)` when called inside the sandbox (the test body should run), `None` in
/// the parent (the body already ran in the child).
pub fn run_sandboxed(name: &str) -> Option<PathBuf> {
    run_sandboxed_with(name, &Sandbox::default(), &[])
}

/// [`run_sandboxed`] with `sandbox`'s exceptions and `env` set for the child.
pub fn run_sandboxed_with(name: &str, sandbox: &Sandbox, env: &[(&str, &str)]) -> Option<PathBuf> {
    if let Ok(scratch) = std::env::var(SCRATCH_ENV) {
        let scratch = PathBuf::from(scratch);
        let sandbox = Sandbox {
            writable: split(WRITABLE_ENV),
            private: split(PRIVATE_ENV),
        };
        enter(&scratch, &sandbox);
        return Some(scratch);
    }
    // Short: the daemon's sockets live below it, and socket paths are bounded.
    let scratch = std::env::temp_dir().join(format!("lvh-{}-{}", std::process::id(), name.len()));
    std::fs::create_dir_all(&scratch).unwrap();
    let status = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(SCRATCH_ENV, &scratch)
        .env(WRITABLE_ENV, join(&sandbox.writable))
        .env(PRIVATE_ENV, join(&sandbox.private))
        .env("TMPDIR", &scratch)
        .envs(env.iter().copied())
        .status()
        .expect("unshare (util-linux) runs");
    detach_loops_under(&scratch);
    let _ = std::fs::remove_dir(&scratch);
    assert!(status.success(), "{name} failed inside its sandbox: {status}");
    None
}

fn enter(scratch: &Path, sandbox: &Sandbox) {
    let none: Option<&str> = None;
    for dir in std::iter::once(scratch).chain(sandbox.private.iter().map(PathBuf::as_path)) {
        mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            MsFlags::empty(),
            Some("mode=0700"),
        )
        .unwrap_or_else(|e| panic!("private tmpfs on {}: {e}", dir.display()));
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut points: Vec<(PathBuf, Vec<String>)> = mountinfo
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let point = PathBuf::from(fields.get(4)?.replace("\\040", " "));
            let options = fields.get(5)?.split(',').map(str::to_string).collect();
            Some((point, options))
        })
        .filter(|(p, _)| p != scratch && !sandbox.private.contains(p) && !sandbox.writable.contains(p))
        .collect();
    points.sort();
    points.dedup_by(|a, b| a.0 == b.0);
    for (point, options) in points {
        // Keep each mount's own restrictions; MS_REMOUNT|MS_BIND changes only per-mount flags.
        let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
        for (name, flag) in [
            ("nosuid", MsFlags::MS_NOSUID),
            ("nodev", MsFlags::MS_NODEV),
            ("noexec", MsFlags::MS_NOEXEC),
            ("noatime", MsFlags::MS_NOATIME),
            ("relatime", MsFlags::MS_RELATIME),
        ] {
            if options.iter().any(|o| o == name) {
                flags |= flag;
            }
        }
        // Some pseudo filesystems refuse; `/` must not (checked below).
        let _ = mount(none, &point, none, flags, none);
    }
    let probe = Path::new("/localvol-hostile-probe");
    let err = std::fs::write(probe, b"x").expect_err("/ must be read-only in the sandbox");
    assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{err}");
    assert!(
        std::fs::write(scratch.join("probe"), b"x").is_ok(),
        "scratch is writable"
    );
    std::fs::remove_file(scratch.join("probe")).unwrap();
}

fn detach_loops_under(dir: &Path) {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return;
    };
    for entry in entries.flatten() {
        let backing = std::fs::read_to_string(entry.path().join("loop/backing_file")).unwrap_or_default();
        if Path::new(backing.trim()).starts_with(dir) {
            eprintln!(
                "detaching {} left on {}",
                entry.file_name().to_string_lossy(),
                backing.trim()
            );
            let _ = Command::new("losetup")
                .arg("--detach")
                .arg(Path::new("/dev").join(entry.file_name()))
                .status();
        }
    }
}

/// What a hostile call must not change: the namespace's mount table, the loop devices
/// on the scratch directory, every file below the kubelet root and the data directory
/// (kind, size, mode), read without following symlinks, and with [`Storage::Guest`] the
/// guest's block devices (device-mapper ones by name), NVDIMM namespaces and LVs.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    mounts: Vec<String>,
    loops: Vec<String>,
    files: Vec<String>,
    storage: Vec<String>,
}

/// Which storage besides loop devices a snapshot lists.
#[derive(Debug, Clone)]
pub enum Storage {
    /// None: on a shared host, other tests' devices come and go.
    Loop,
    /// Every block device and namespace, and the LVM metadata of the volume groups on
    /// `physical_volumes`: in the tests/vm guest nothing else makes or removes them.
    Guest { physical_volumes: Vec<PhysicalVolume> },
}

/// A PV whose label and metadata area a snapshot reads.
#[derive(Debug, Clone)]
pub struct PhysicalVolume {
    pub path: PathBuf,
    /// Where its first extent starts (`pvs -o pe_start`): the bytes before it are LVM's.
    pub pe_start: usize,
}

impl Snapshot {
    pub fn take(scratch: &Path, trees: &[&Path], storage: &Storage) -> Self {
        Self {
            mounts: std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect(),
            loops: loops_on(scratch),
            files: files_below(trees),
            storage: match storage {
                Storage::Loop => Vec::new(),
                Storage::Guest { physical_volumes } => guest_storage(physical_volumes),
            },
        }
    }

    /// What differs from `other`, one line per entry only one of them has.
    pub fn diff(&self, other: &Snapshot) -> Vec<String> {
        let mut out = Vec::new();
        for (mine, theirs) in [
            (&self.mounts, &other.mounts),
            (&self.loops, &other.loops),
            (&self.files, &other.files),
            (&self.storage, &other.storage),
        ] {
            out.extend(
                mine.iter()
                    .filter(|l| !theirs.contains(l))
                    .map(|l| format!("- {l}")),
            );
            out.extend(
                theirs
                    .iter()
                    .filter(|l| !mine.contains(l))
                    .map(|l| format!("+ {l}")),
            );
        }
        out
    }
}

fn loops_on(scratch: &Path) -> Vec<String> {
    let mut loops = Vec::new();
    for entry in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let backing = std::fs::read_to_string(entry.path().join("loop/backing_file")).unwrap_or_default();
        if Path::new(backing.trim()).starts_with(scratch) {
            loops.push(format!(
                "{} {}",
                entry.file_name().to_string_lossy(),
                backing.trim()
            ));
        }
    }
    loops.sort();
    loops
}

fn files_below(trees: &[&Path]) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut files = Vec::new();
    let mut todo: Vec<PathBuf> = trees.iter().map(|t| t.to_path_buf()).collect();
    while let Some(path) = todo.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            files.push(format!("{} missing", path.display()));
            continue;
        };
        let kind = if meta.is_dir() {
            "dir"
        } else if meta.file_type().is_symlink() {
            "link"
        } else {
            "file"
        };
        files.push(format!(
            "{} {kind} {} {:o}",
            path.display(),
            meta.len(),
            meta.mode()
        ));
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap().flatten() {
                todo.push(entry.path());
            }
        }
    }
    files.sort();
    files
}

/// sysfs attributes of `dir` named in `attrs`, as `name=value` (missing ones left out).
fn attributes(dir: &Path, attrs: &[&str]) -> String {
    attrs
        .iter()
        .filter_map(|a| {
            let value = std::fs::read_to_string(dir.join(a)).ok()?;
            Some(format!("{a}={}", value.trim()))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Block devices (size; device-mapper name and table owner), NVDIMM namespaces (size,
/// name, mode, holder) and the LVM metadata on `physical_volumes`.
fn guest_storage(physical_volumes: &[PhysicalVolume]) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let attrs = attributes(&entry.path(), &["size", "dm/name", "dm/uuid", "ro"]);
        out.push(format!("block {} {attrs}", entry.file_name().to_string_lossy()));
    }
    for entry in std::fs::read_dir("/sys/bus/nd/devices")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("namespace") {
            let attrs = attributes(&entry.path(), &["size", "alt_name", "mode", "holder", "uuid"]);
            out.push(format!("namespace {name} {attrs}"));
        }
    }
    for pv in physical_volumes {
        out.push(format!(
            "lvm metadata on {} {:016x} (`lvs -o+lv_tags` shows what changed)",
            pv.path.display(),
            metadata_digest(pv)
        ));
    }
    out.sort();
    out
}

/// The bytes before a PV's first extent hold its label and LVM's metadata area: any
/// change to the volume group (an LV made, removed, resized, renamed, tagged) writes a
/// new metadata copy there. They are read in the process, with O_DIRECT as LVM writes
/// them: spawning `lvs` instead costs about a second per call in the TCG guest, and the
/// suite compares storage twice for each of its hundreds of cases.
fn metadata_digest(pv: &PhysicalVolume) -> u64 {
    use std::hash::{Hash, Hasher};
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    const ALIGN: usize = 4096;
    let path = pv.path.display();
    assert!(
        pv.pe_start > 0 && pv.pe_start.is_multiple_of(ALIGN),
        "{path}: pe_start {}",
        pv.pe_start
    );
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&pv.path)
        .unwrap_or_else(|e| panic!("open {path}: {e}"));
    let mut raw = vec![0u8; pv.pe_start + ALIGN];
    let skip = raw.as_ptr().align_offset(ALIGN);
    let buf = &mut raw[skip..skip + pv.pe_start];
    file.read_exact(buf)
        .unwrap_or_else(|e| panic!("read {path}: {e}"));
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    buf.hash(&mut hasher);
    hasher.finish()
}
