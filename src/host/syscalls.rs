//! The narrow set of system calls localvol makes, behind one trait.
//!
//! Each real call is a short delegation to `nix` run under `spawn_blocking`, so a slow
//! mount or an FITRIM over a large filesystem never stalls the async workers. Tests use
//! [`crate::host::fake::FakeSyscalls`], which keeps an in-memory mount table.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use nix::mount::{MntFlags, MsFlags};

mod loop_ioctl;
mod statmount;

/// A mount(2) call: what, where, which filesystem, flags and fs-specific data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountCall {
    pub source: PathBuf,
    pub target: PathBuf,
    pub fs_type: Option<String>,
    pub flags: MsFlags,
    pub data: Option<String>,
}

/// Usage of a mounted filesystem, from statvfs(2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsUsage {
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub used_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
    pub used_inodes: u64,
}

/// A loop device and the file behind it, as sysfs and LOOP_GET_STATUS64 report them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDevice {
    pub device: PathBuf,
    /// The path as the kernel prints it for the reader: relative to the filesystem
    /// when the mount the file was opened through is gone (a restarted container's
    /// bind mount), with ` (deleted)` after an unlinked file.
    pub backing_file: PathBuf,
}

/// The topmost mount at a path, as statmount(2) reports it: the fields of its
/// mountinfo line that say whose it is (not its source or options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedAt {
    /// The device number of its filesystem (mountinfo's `major:minor`).
    pub major: u32,
    pub minor: u32,
    /// The path inside the filesystem that is mounted.
    pub root: PathBuf,
    pub mount_point: PathBuf,
    pub fs_type: String,
    /// The mount's own read-only flag (`ro` in mountinfo's mount options).
    pub read_only: bool,
    /// The filesystem's: read-only for every mount of it (`ro` in mountinfo's super
    /// options), as the kernel makes an ext4 mounted `errors=remount-ro` after an error.
    pub sb_read_only: bool,
}

/// What a mounted filesystem says of itself beyond its mount flags
/// ([`Syscalls::filesystem_state`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilesystemState {
    /// The errno of a `stat` of the mount point, when it failed: an xfs that shut down
    /// after an I/O error answers EIO for every path in it, statvfs(2) excepted.
    pub root_errno: Option<i32>,
    /// ext4's count of the errors it has met since its last fsck, which it keeps in its
    /// superblock (sysfs `/sys/fs/ext4/<device>/errors_count`); `None` for another
    /// filesystem.
    pub ext4_errors: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
#[error("{call} {path}: {source}", path = path.display())]
pub struct SyscallError {
    pub call: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl SyscallError {
    fn new(call: &'static str, path: &Path, source: impl Into<std::io::Error>) -> Self {
        Self {
            call,
            path: path.to_path_buf(),
            source: source.into(),
        }
    }

    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }

    /// EINVAL from umount2 means "not a mount point": the target is already unmounted.
    pub fn is_not_mounted(&self) -> bool {
        self.call == "umount" && self.errno() == Some(libc::EINVAL)
    }

    pub fn is_not_found(&self) -> bool {
        self.source.kind() == std::io::ErrorKind::NotFound
    }

    /// ENXIO from LOOP_CLR_FD: the loop device has no file attached.
    pub fn is_not_attached(&self) -> bool {
        self.call == "LOOP_CLR_FD" && self.errno() == Some(libc::ENXIO)
    }

    /// Whether the same call again cannot succeed until someone changes something (see
    /// [`crate::model::Terminal`]).
    pub fn is_terminal(&self) -> bool {
        io_is_terminal(&self.source)
    }
}

/// An I/O error that repeats until someone acts: a full or read-only filesystem, a
/// missing permission, a device that is not there or not the kind asked for. Anything
/// else (EBUSY, EINTR, EAGAIN, an unknown errno) may pass.
pub fn io_is_terminal(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ENOSPC
                | libc::EDQUOT
                | libc::EFBIG
                | libc::EROFS
                | libc::EPERM
                | libc::EACCES
                | libc::ENODEV
                | libc::ENXIO
                | libc::ENOTTY
                | libc::EINVAL
        )
    )
}

#[async_trait]
pub trait Syscalls: Send + Sync + 'static {
    async fn mount(&self, call: MountCall) -> Result<(), SyscallError>;
    async fn umount(&self, target: &Path) -> Result<(), SyscallError>;
    /// The text of /proc/self/mountinfo.
    async fn mountinfo(&self) -> Result<String, SyscallError>;
    /// The topmost mount whose mount point is exactly `path`, without reading the whole
    /// table; `None` when nothing is mounted at `path` itself. Where the kernel cannot
    /// say (before Linux 6.8), ENOSYS. Callers fall back to the table on any error.
    async fn mount_at(&self, path: &Path) -> Result<Option<MountedAt>, SyscallError>;
    async fn statvfs(&self, path: &Path) -> Result<FsUsage, SyscallError>;
    /// Size in bytes of a block device (BLKGETSIZE64).
    async fn block_device_size(&self, device: &Path) -> Result<u64, SyscallError>;
    /// The first `len` bytes of a device (fewer if it is shorter), read through the page
    /// cache both mkfs programs write through or invalidate.
    async fn device_head(&self, device: &Path, len: usize) -> Result<Vec<u8>, SyscallError>;
    /// The device number of a block or character device node, or of the device a path
    /// is a bind mount of; `None` for anything else.
    async fn device_number(&self, path: &Path) -> Result<Option<u64>, SyscallError>;
    /// The device numbers of the block devices a device-mapper device `dev` is built on
    /// (sysfs `slaves`); empty for a device built on none, or one that is gone.
    async fn device_slaves(&self, dev: u64) -> Result<Vec<u64>, SyscallError>;
    /// The names of the device-mapper devices the kernel holds (sysfs
    /// `/sys/block/dm-*/dm/name`), whatever any tool knows of them.
    async fn device_mapper_names(&self) -> Result<Vec<String>, SyscallError>;
    /// Whether the device-mapper device `dev` is suspended (sysfs `dm/suspended`): its
    /// I/O waits until it is resumed. False for a device that is not device-mapper's or
    /// is gone.
    async fn device_mapper_suspended(&self, dev: u64) -> Result<bool, SyscallError>;
    /// How many sectors of block device `dev` the kernel knows to be bad (sysfs
    /// `badblocks`: media errors of a PMEM namespace, reads of which fail). 0 for a
    /// device that keeps no such list.
    async fn bad_sectors(&self, dev: u64) -> Result<u64, SyscallError>;
    /// Discards unused blocks of the filesystem mounted at `path` (FITRIM); returns the
    /// number of bytes the filesystem reports as trimmed.
    async fn fitrim(&self, path: &Path) -> Result<u64, SyscallError>;
    /// Every attached loop device and its backing file, from sysfs alone (no device is
    /// opened: a node with hundreds of volumes looks devices up on every call).
    async fn loop_devices(&self) -> Result<Vec<LoopDevice>, SyscallError>;
    /// The backing file's identity, `(st_dev, st_ino)`, of the loop device at `device`,
    /// whatever its path: the one name that holds across mount namespaces. `None` when
    /// the device's status cannot be read (not attached, gone).
    async fn loop_backing_inode(&self, device: &Path) -> Result<Option<(u64, u64)>, SyscallError>;
    /// The backing file of one loop device as [`loop_devices`](Self::loop_devices)
    /// shows it; `None` when nothing is attached to it.
    async fn loop_backing_file(&self, device: &Path) -> Result<Option<PathBuf>, SyscallError>;
    /// Attaches `image` (read-write) to a free loop device; returns the device.
    async fn loop_attach(&self, image: &Path) -> Result<PathBuf, SyscallError>;
    /// Detaches the loop device (LOOP_CLR_FD). ENXIO ([`SyscallError::is_not_attached`])
    /// when nothing is attached to it. While another process holds the device open the
    /// kernel only marks it for autoclear, and the detach happens when that one closes.
    async fn loop_detach(&self, device: &Path) -> Result<(), SyscallError>;
    /// Copies `source` into a new file `target` (mode 0600, must not exist) and fsyncs
    /// it: sharing blocks (FICLONE) where the filesystem can, else only the extents
    /// holding data (SEEK_DATA/SEEK_HOLE), so holes stay holes.
    async fn copy_file(&self, source: &Path, target: &Path) -> Result<CopyMethod, SyscallError>;
    /// Freezes the filesystem mounted at `path` (FIFREEZE): writes block until thawed.
    async fn freeze(&self, path: &Path) -> Result<(), SyscallError>;
    /// Thaws it (FITHAW); EINVAL when it was not frozen.
    async fn thaw(&self, path: &Path) -> Result<(), SyscallError>;
    /// What the filesystem of `mount` says of itself: a `stat` of its mount point, and
    /// ext4's error count, found from its device number. Two or three syscalls whatever
    /// the node holds; a counter that cannot be read is `None`, not an error.
    async fn filesystem_state(&self, mount: &MountedAt) -> FilesystemState;
}

/// How [`Syscalls::copy_file`] copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyMethod {
    /// FICLONE: the copy shares every block with its source until either is written.
    Reflink,
    /// The source's data extents, copied; its holes left as holes.
    Sparse,
}

/// A sysfs `dev` file's `MAJOR:MINOR` as a device number.
fn filesystem_state_blocking(mount: &MountedAt) -> FilesystemState {
    let root_errno = std::fs::metadata(&mount.mount_point)
        .err()
        .and_then(|e| e.raw_os_error());
    let ext4_errors = (mount.fs_type == "ext4")
        .then(|| {
            // /sys/dev/block/M:m links to the device's directory, whose name is the one
            // ext4 files its counters under (loop3, dm-2, pmem0.1).
            let link = std::fs::read_link(format!("/sys/dev/block/{}:{}", mount.major, mount.minor)).ok()?;
            let name = link.file_name()?.to_str()?.to_string();
            let text = std::fs::read_to_string(format!("/sys/fs/ext4/{name}/errors_count")).ok()?;
            text.trim().parse().ok()
        })
        .flatten();
    FilesystemState {
        root_errno,
        ext4_errors,
    }
}

/// The number of bad sectors in a sysfs `badblocks` list: a `<first sector> <count>`
/// line per range. A line that does not parse counts as nothing: the list is the
/// kernel's, and a change in its format should not turn every volume abnormal.
pub fn parse_bad_sectors(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

fn parse_dev(text: &str) -> Option<u64> {
    let (major, minor) = text.trim().split_once(':')?;
    Some(nix::sys::stat::makedev(major.parse().ok()?, minor.parse().ok()?))
}

/// The real system calls.
#[derive(Debug, Default, Clone)]
pub struct SystemSyscalls;

/// Runs a blocking closure where blocking is allowed ([`super::blocking::run`]): the one
/// place syscalls leave the async workers.
async fn blocking<T: Send + 'static>(
    call: &'static str,
    path: &Path,
    f: impl FnOnce(&Path) -> Result<T, SyscallError> + Send + 'static,
) -> Result<T, SyscallError> {
    let owned = path.to_path_buf();
    let started = std::time::Instant::now();
    let result = super::blocking::run(move || f(&owned))
        .await
        .map_err(|join| SyscallError::new(call, path, std::io::Error::other(join)))?;
    // What a slow node call waited on, for `RUST_LOG=localvol::host=debug`; the time
    // includes any hand-off to the blocking pool.
    tracing::debug!(call, path = %path.display(), elapsed_us = started.elapsed().as_micros() as u64,
        ok = result.is_ok(), "syscall");
    result
}

nix::ioctl_read!(blk_get_size64, 0x12, 114, u64);

/// FITRIM's argument (linux/fs.h `struct fstrim_range`).
#[repr(C)]
struct FstrimRange {
    start: u64,
    len: u64,
    minlen: u64,
}
nix::ioctl_readwrite!(fitrim_ioctl, b'X', 121, FstrimRange);
// linux/fs.h: FIFREEZE _IOWR('X', 119, int), FITHAW _IOWR('X', 120, int), FICLONE
// _IOW(0x94, 9, int). The int argument of the first two is unused; FICLONE's is the
// source fd, passed by value.
nix::ioctl_readwrite!(fifreeze_ioctl, b'X', 119, libc::c_int);
nix::ioctl_readwrite!(fithaw_ioctl, b'X', 120, libc::c_int);
nix::ioctl_write_int!(ficlone_ioctl, 0x94, 9);

/// FIFREEZE or FITHAW on the directory `p`.
fn freeze_ioctl(call: &'static str, p: &Path, thaw: bool) -> Result<(), SyscallError> {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(p).map_err(|e| SyscallError::new("open", p, e))?;
    let mut unused: libc::c_int = 0;
    // SAFETY: the fd is open for the call; the kernel ignores the int it is given.
    let result = unsafe {
        if thaw {
            fithaw_ioctl(dir.as_raw_fd(), &mut unused)
        } else {
            fifreeze_ioctl(dir.as_raw_fd(), &mut unused)
        }
    };
    result.map(drop).map_err(|e| SyscallError::new(call, p, e))
}

/// The blocking body of [`Syscalls::copy_file`].
fn copy_file_blocking(source: &Path, target: &Path) -> Result<CopyMethod, SyscallError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let src = std::fs::File::open(source).map_err(|e| SyscallError::new("open", source, e))?;
    let dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(target)
        .map_err(|e| SyscallError::new("create", target, e))?;
    let len = src
        .metadata()
        .map_err(|e| SyscallError::new("stat", source, e))?
        .len();
    // SAFETY: both fds are open for the call; FICLONE takes the source fd by value.
    let method = match unsafe { ficlone_ioctl(dst.as_raw_fd(), src.as_raw_fd() as libc::c_ulong) } {
        Ok(_) => CopyMethod::Reflink,
        // Not a reflink filesystem (ext4, xfs without reflink, tmpfs), or two filesystems.
        Err(nix::errno::Errno::EOPNOTSUPP | nix::errno::Errno::EXDEV | nix::errno::Errno::EINVAL) => {
            copy_extents(&src, &dst, len).map_err(|e| SyscallError::new("copy", target, e))?;
            CopyMethod::Sparse
        }
        Err(e) => return Err(SyscallError::new("FICLONE", target, e)),
    };
    dst.set_len(len)
        .map_err(|e| SyscallError::new("truncate", target, e))?;
    dst.sync_all()
        .map_err(|e| SyscallError::new("fsync", target, e))?;
    Ok(method)
}

/// Copies the data extents of `src` (SEEK_DATA/SEEK_HOLE) to the same offsets of `dst`.
fn copy_extents(src: &std::fs::File, dst: &std::fs::File, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let seek = |offset: u64, whence| -> std::io::Result<Option<u64>> {
        // SAFETY: lseek on an fd we hold open; no memory is passed.
        let at = unsafe { libc::lseek(src.as_raw_fd(), offset as libc::off_t, whence) };
        if at >= 0 {
            return Ok(Some(at as u64));
        }
        let error = std::io::Error::last_os_error();
        // ENXIO: no data at or after `offset`.
        if error.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(error)
        }
    };
    let mut buffer = vec![0u8; 1 << 20];
    let mut offset = 0;
    while offset < len {
        let Some(data) = seek(offset, libc::SEEK_DATA)? else {
            break;
        };
        let hole = seek(data, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        let mut at = data;
        while at < hole {
            let want = ((hole - at) as usize).min(buffer.len());
            let read = src.read_at(&mut buffer[..want], at)?;
            if read == 0 {
                break;
            }
            dst.write_all_at(&buffer[..read], at)?;
            at += read as u64;
        }
        offset = hole;
    }
    Ok(())
}

#[async_trait]
impl Syscalls for SystemSyscalls {
    async fn mount(&self, call: MountCall) -> Result<(), SyscallError> {
        let target = call.target.clone();
        blocking("mount", &target, move |_| {
            nix::mount::mount(
                Some(call.source.as_path()),
                call.target.as_path(),
                call.fs_type.as_deref(),
                call.flags,
                call.data.as_deref(),
            )
            .map_err(|e| SyscallError::new("mount", &call.target, e))
        })
        .await
    }

    async fn umount(&self, target: &Path) -> Result<(), SyscallError> {
        blocking("umount", target, |t| {
            nix::mount::umount2(t, MntFlags::empty()).map_err(|e| SyscallError::new("umount", t, e))
        })
        .await
    }

    async fn mountinfo(&self) -> Result<String, SyscallError> {
        blocking("read", Path::new("/proc/self/mountinfo"), |p| {
            std::fs::read_to_string(p).map_err(|e| SyscallError::new("read", p, e))
        })
        .await
    }

    async fn mount_at(&self, path: &Path) -> Result<Option<MountedAt>, SyscallError> {
        blocking("statmount", path, statmount::mount_at_blocking).await
    }

    async fn statvfs(&self, path: &Path) -> Result<FsUsage, SyscallError> {
        blocking("statvfs", path, |p| {
            let st = nix::sys::statvfs::statvfs(p).map_err(|e| SyscallError::new("statvfs", p, e))?;
            let frsize = st.fragment_size() as u64;
            let total_bytes = st.blocks() as u64 * frsize;
            let free_bytes = st.blocks_free() as u64 * frsize;
            Ok(FsUsage {
                total_bytes,
                available_bytes: st.blocks_available() as u64 * frsize,
                used_bytes: total_bytes.saturating_sub(free_bytes),
                total_inodes: st.files() as u64,
                free_inodes: st.files_free() as u64,
                used_inodes: (st.files() as u64).saturating_sub(st.files_free() as u64),
            })
        })
        .await
    }

    async fn block_device_size(&self, device: &Path) -> Result<u64, SyscallError> {
        blocking("BLKGETSIZE64", device, |d| {
            use std::os::fd::AsRawFd;
            let file = std::fs::File::open(d).map_err(|e| SyscallError::new("open", d, e))?;
            let mut size = 0u64;
            // SAFETY: the fd is open for the duration of the call and `size` is a valid
            // u64 the kernel writes into, as BLKGETSIZE64 defines.
            unsafe { blk_get_size64(file.as_raw_fd(), &mut size) }
                .map_err(|e| SyscallError::new("BLKGETSIZE64", d, e))?;
            Ok(size)
        })
        .await
    }

    async fn device_head(&self, device: &Path, len: usize) -> Result<Vec<u8>, SyscallError> {
        blocking("read", device, move |d| {
            use std::io::Read;
            let file = std::fs::File::open(d).map_err(|e| SyscallError::new("open", d, e))?;
            let mut head = Vec::with_capacity(len);
            file.take(len as u64)
                .read_to_end(&mut head)
                .map_err(|e| SyscallError::new("read", d, e))?;
            Ok(head)
        })
        .await
    }

    async fn device_number(&self, path: &Path) -> Result<Option<u64>, SyscallError> {
        blocking("stat", path, |p| {
            use std::os::unix::fs::{FileTypeExt, MetadataExt};
            let meta = std::fs::metadata(p).map_err(|e| SyscallError::new("stat", p, e))?;
            let ft = meta.file_type();
            Ok((ft.is_block_device() || ft.is_char_device()).then(|| meta.rdev()))
        })
        .await
    }

    async fn device_slaves(&self, dev: u64) -> Result<Vec<u64>, SyscallError> {
        let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
        let dir = PathBuf::from(format!("/sys/dev/block/{major}:{minor}/slaves"));
        blocking("read sysfs", &dir, |dir| {
            let entries = match std::fs::read_dir(dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(SyscallError::new("read sysfs", dir, e)),
            };
            let mut slaves = Vec::new();
            for entry in entries {
                let path = entry
                    .map_err(|e| SyscallError::new("read sysfs", dir, e))?
                    .path()
                    .join("dev");
                // A slave removed while it is read: it no longer holds the device.
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
                };
                if let Some(dev) = parse_dev(&text) {
                    slaves.push(dev);
                }
            }
            Ok(slaves)
        })
        .await
    }

    async fn device_mapper_names(&self) -> Result<Vec<String>, SyscallError> {
        blocking("read sysfs", Path::new("/sys/block"), |dir| {
            let entries = std::fs::read_dir(dir).map_err(|e| SyscallError::new("read sysfs", dir, e))?;
            Ok(entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("dm-"))
                .filter_map(|e| std::fs::read_to_string(e.path().join("dm/name")).ok())
                .map(|name| name.trim().to_string())
                .collect())
        })
        .await
    }

    async fn device_mapper_suspended(&self, dev: u64) -> Result<bool, SyscallError> {
        let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
        let path = PathBuf::from(format!("/sys/dev/block/{major}:{minor}/dm/suspended"));
        blocking("read sysfs", &path, |path| match std::fs::read_to_string(path) {
            Ok(text) => Ok(text.trim() == "1"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(SyscallError::new("read sysfs", path, e)),
        })
        .await
    }

    async fn bad_sectors(&self, dev: u64) -> Result<u64, SyscallError> {
        let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
        let path = PathBuf::from(format!("/sys/dev/block/{major}:{minor}/badblocks"));
        blocking("read sysfs", &path, |path| match std::fs::read_to_string(path) {
            Ok(text) => Ok(parse_bad_sectors(&text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(SyscallError::new("read sysfs", path, e)),
        })
        .await
    }

    async fn fitrim(&self, path: &Path) -> Result<u64, SyscallError> {
        blocking("FITRIM", path, |p| {
            use std::os::fd::AsRawFd;
            let dir = std::fs::File::open(p).map_err(|e| SyscallError::new("open", p, e))?;
            let mut range = FstrimRange {
                start: 0,
                len: u64::MAX,
                minlen: 0,
            };
            // SAFETY: the fd is open for the call and `range` is a valid fstrim_range
            // that the kernel reads and updates in place.
            unsafe { fitrim_ioctl(dir.as_raw_fd(), &mut range) }
                .map_err(|e| SyscallError::new("FITRIM", p, e))?;
            Ok(range.len)
        })
        .await
    }

    async fn loop_devices(&self) -> Result<Vec<LoopDevice>, SyscallError> {
        blocking("read", Path::new("/proc/partitions"), |partitions| {
            loop_ioctl::loop_devices_blocking(Path::new("/sys/block"), partitions)
        })
        .await
    }

    async fn loop_backing_inode(&self, device: &Path) -> Result<Option<(u64, u64)>, SyscallError> {
        blocking("LOOP_GET_STATUS64", device, |d| {
            Ok(loop_ioctl::loop_backing_inode(d))
        })
        .await
    }

    async fn loop_backing_file(&self, device: &Path) -> Result<Option<PathBuf>, SyscallError> {
        blocking("read", device, |d| Ok(loop_ioctl::loop_backing_file(d))).await
    }

    async fn loop_attach(&self, image: &Path) -> Result<PathBuf, SyscallError> {
        blocking("LOOP_CONFIGURE", image, loop_ioctl::loop_attach_blocking).await
    }

    async fn loop_detach(&self, device: &Path) -> Result<(), SyscallError> {
        blocking("LOOP_CLR_FD", device, loop_ioctl::loop_detach_blocking).await
    }

    async fn copy_file(&self, source: &Path, target: &Path) -> Result<CopyMethod, SyscallError> {
        let source = source.to_path_buf();
        blocking("copy", target, move |t| copy_file_blocking(&source, t)).await
    }

    async fn freeze(&self, path: &Path) -> Result<(), SyscallError> {
        blocking("FIFREEZE", path, |p| freeze_ioctl("FIFREEZE", p, false)).await
    }

    async fn thaw(&self, path: &Path) -> Result<(), SyscallError> {
        blocking("FITHAW", path, |p| freeze_ioctl("FITHAW", p, true)).await
    }

    async fn filesystem_state(&self, mount: &MountedAt) -> FilesystemState {
        let mount = mount.clone();
        crate::host::blocking::run(move || filesystem_state_blocking(&mount))
            .await
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_bad_sectors;

    /// As a PMEM namespace's `badblocks` reads after the kernel marked 8 sectors at
    /// 128 bad (captured in the VM guest), and with a second range.
    #[test]
    fn bad_sectors_are_the_sum_of_the_ranges() {
        assert_eq!(parse_bad_sectors(""), 0);
        assert_eq!(parse_bad_sectors("128 8\n"), 8);
        assert_eq!(parse_bad_sectors("128 8\n4096 1\n"), 9);
        assert_eq!(parse_bad_sectors("garbage\n"), 0);
    }
}
