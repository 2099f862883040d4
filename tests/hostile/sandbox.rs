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

use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{MsFlags, mount};

const SCRATCH_ENV: &str = "LOCALVOL_HOSTILE_SCRATCH";

/// Runs test `name` of this binary inside a fresh sandbox and fails if it fails. Returns
/// `Some(scratch)` when called inside the sandbox (the test body should run), `None` in
/// the parent (the body already ran in the child).
pub fn run_sandboxed(name: &str) -> Option<PathBuf> {
    if let Ok(scratch) = std::env::var(SCRATCH_ENV) {
        let scratch = PathBuf::from(scratch);
        enter(&scratch);
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
        .env("TMPDIR", &scratch)
        .status()
        .expect("unshare (util-linux) runs");
    detach_loops_under(&scratch);
    let _ = std::fs::remove_dir(&scratch);
    assert!(status.success(), "{name} failed inside its sandbox: {status}");
    None
}

fn enter(scratch: &Path) {
    let none: Option<&str> = None;
    mount(
        Some("tmpfs"),
        scratch,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("mode=0700"),
    )
    .expect("private tmpfs on the scratch directory");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut points: Vec<(PathBuf, Vec<String>)> = mountinfo
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let point = PathBuf::from(fields.get(4)?.replace("\\040", " "));
            let options = fields.get(5)?.split(',').map(str::to_string).collect();
            Some((point, options))
        })
        .filter(|(p, _)| p != scratch)
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
/// on the scratch directory, and every file below the kubelet root and the data
/// directory (kind, size, mode), read without following symlinks.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    mounts: Vec<String>,
    loops: Vec<String>,
    files: Vec<String>,
}

impl Snapshot {
    pub fn take(scratch: &Path, trees: &[&Path]) -> Self {
        use std::os::unix::fs::MetadataExt;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
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
        Self { mounts, loops, files }
    }
}
