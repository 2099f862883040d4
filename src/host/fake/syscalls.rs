//! The syscall double: an in-memory machine with a mount table, device numbers and
//! loop devices, recording every call.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::host::{
    CopyMethod, FilesystemState, FsUsage, LoopDevice, MountCall, MountedAt, SyscallError, Syscalls,
};

#[derive(Debug, Clone)]
struct FakeMount {
    call: MountCall,
    dev: (u32, u32),
    /// A bind of a device node: shown as the kernel shows one, a mount of devtmpfs
    /// whose root is the node's name below /dev.
    node: Option<PathBuf>,
}

/// devtmpfs's device number, which every bind of a device node shows.
const DEVTMPFS: (u32, u32) = (0, 6);

impl FakeMount {
    fn fs_type(&self) -> String {
        match (&self.node, &self.call.fs_type) {
            (Some(_), _) => "devtmpfs".to_string(),
            (None, Some(fs)) => fs.clone(),
            (None, None) => "ext4".to_string(),
        }
    }

    fn root(&self) -> PathBuf {
        match &self.node {
            Some(node) => Path::new("/").join(node.strip_prefix("/dev").unwrap_or(node)),
            None => "/".into(),
        }
    }
}

#[derive(Debug, Default)]
struct SyscallState {
    mounts: Vec<FakeMount>,
    devices: HashMap<PathBuf, (u32, u32)>,
    /// Device-mapper devices and the devices they are built on.
    slaves: HashMap<(u32, u32), Vec<(u32, u32)>>,
    sizes: HashMap<PathBuf, u64>,
    /// What a device's first bytes hold (zeros where nothing was planted).
    heads: HashMap<PathBuf, Vec<u8>>,
    loops: Vec<LoopDevice>,
    /// Backing inodes of loop devices attached "by inode" (see attach_loop_by_inode).
    loop_inodes: HashMap<PathBuf, (u64, u64)>,
    /// Loop devices `loop_attach` hands out, first first.
    free_loops: Vec<PathBuf>,
    /// When set, `loop_detach` only marks the device (another opener holds it) and it
    /// goes this long after, as the kernel's autoclear does.
    deferred_detach: Option<std::time::Duration>,
    usage: FsUsage,
    calls: Vec<String>,
    fail_next: HashMap<&'static str, i32>,
    /// Reads of the whole mount table (not in `calls`: most calls make one).
    mountinfo_reads: usize,
    /// A kernel before statmount(2): `mount_at` answers ENOSYS.
    no_statmount: bool,
    /// Filesystems (by device) the kernel made read-only, and what they say of
    /// themselves (`filesystem_state`); healthy when not set.
    sb_read_only: std::collections::HashSet<(u32, u32)>,
    /// What `device_mapper_names` lists.
    dm_names: Vec<String>,
    /// Device-mapper devices suspended (`device_mapper_suspended`), by major:minor.
    dm_suspended: std::collections::HashSet<(u32, u32)>,
    /// Bad sectors per device (`bad_sectors`), by major:minor.
    bad_sectors: HashMap<(u32, u32), u64>,
    filesystem_states: HashMap<(u32, u32), FilesystemState>,
}

/// How the fake FITRIM behaves: how long it takes, what it reports, what it does.
#[derive(Default)]
struct FitrimScript {
    delay: std::time::Duration,
    trimmed: u64,
    effect: Option<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for FitrimScript {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FitrimScript")
            .field("delay", &self.delay)
            .field("trimmed", &self.trimmed)
            .finish_non_exhaustive()
    }
}

/// An in-memory machine: a mount table, device numbers, loop devices.
#[derive(Debug, Default, Clone)]
pub struct FakeSyscalls {
    state: Arc<Mutex<SyscallState>>,
    fitrim: Arc<Mutex<FitrimScript>>,
}

impl FakeSyscalls {
    /// The kernel makes the filesystem on device `dev` read-only for every mount of it
    /// (`false`: writable again), as after an error under `errors=remount-ro`.
    pub fn set_filesystem_read_only(&self, dev: (u32, u32), read_only: bool) {
        let mut s = self.state.lock().unwrap();
        if read_only {
            s.sb_read_only.insert(dev);
        } else {
            s.sb_read_only.remove(&dev);
        }
    }

    /// The device-mapper devices the kernel holds from now on, by name.
    pub fn set_device_mapper_names(&self, names: &[&str]) {
        self.state.lock().unwrap().dm_names = names.iter().map(|n| n.to_string()).collect();
    }

    /// Suspends the device-mapper device `dev` (`false`: resumes it).
    pub fn set_device_mapper_suspended(&self, dev: (u32, u32), suspended: bool) {
        let mut s = self.state.lock().unwrap();
        if suspended {
            s.dm_suspended.insert(dev);
        } else {
            s.dm_suspended.remove(&dev);
        }
    }

    /// The kernel knows `sectors` bad sectors on device `dev` from now on.
    pub fn set_bad_sectors(&self, dev: (u32, u32), sectors: u64) {
        self.state.lock().unwrap().bad_sectors.insert(dev, sectors);
    }

    /// What the filesystem on device `dev` says of itself from now on.
    pub fn set_filesystem_state(&self, dev: (u32, u32), state: FilesystemState) {
        self.state.lock().unwrap().filesystem_states.insert(dev, state);
    }

    /// Declares a block device node and its major:minor.
    pub fn add_device(&self, path: impl Into<PathBuf>, major: u32, minor: u32, size: u64) {
        let mut s = self.state.lock().unwrap();
        let path = path.into();
        s.devices.insert(path.clone(), (major, minor));
        s.sizes.insert(path, size);
    }

    /// Adds a device-mapper device at `path` built on the device at `on` (which must
    /// have been added).
    pub fn add_mapping(&self, path: impl Into<PathBuf>, major: u32, minor: u32, size: u64, on: &Path) {
        let below = self.state.lock().unwrap().devices[on];
        self.add_device(path, major, minor, size);
        self.state
            .lock()
            .unwrap()
            .slaves
            .insert((major, minor), vec![below]);
    }

    /// What the device at `path` holds at its start from now on (a superblock).
    pub fn set_device_head(&self, path: impl Into<PathBuf>, head: Vec<u8>) {
        self.state.lock().unwrap().heads.insert(path.into(), head);
    }

    /// Removes the device node at `path` (and what it was built on, for a mapping).
    pub fn remove_device(&self, path: &Path) {
        let mut s = self.state.lock().unwrap();
        if let Some(dev) = s.devices.remove(path) {
            s.slaves.remove(&dev);
        }
        s.sizes.remove(path);
    }

    pub fn attach_loop(&self, device: impl Into<PathBuf>, backing_file: impl Into<PathBuf>) {
        self.state.lock().unwrap().loops.push(LoopDevice {
            device: device.into(),
            backing_file: backing_file.into(),
        });
    }

    /// A loop device as a restarted container sees one attached by its predecessor:
    /// the path is the kernel's, relative to a mount that is gone; the inode is the file's.
    pub fn attach_loop_by_inode(
        &self,
        device: impl Into<PathBuf>,
        shown_path: impl Into<PathBuf>,
        inode: (u64, u64),
    ) {
        let device = device.into();
        let mut s = self.state.lock().unwrap();
        s.loop_inodes.insert(device.clone(), inode);
        s.loops.push(LoopDevice {
            device,
            backing_file: shown_path.into(),
        });
    }

    /// The image behind loop device `device` is unlinked while attached: sysfs shows
    /// its path with ` (deleted)` from now on.
    pub fn delete_loop_backing(&self, device: &Path) {
        let mut s = self.state.lock().unwrap();
        for l in s.loops.iter_mut().filter(|l| l.device == device) {
            let mut shown = l.backing_file.clone().into_os_string();
            shown.push(" (deleted)");
            l.backing_file = shown.into();
        }
    }

    pub fn detach_loop(&self, device: &Path) {
        self.state.lock().unwrap().loops.retain(|l| l.device != device);
    }

    /// A loop device `loop_attach` may use (each once until detached again).
    pub fn add_free_loop(&self, device: impl Into<PathBuf>) {
        self.state.lock().unwrap().free_loops.push(device.into());
    }

    /// From now on a detached device goes only `delay` after LOOP_CLR_FD returned, as
    /// when another process holds it open.
    pub fn defer_detach(&self, delay: std::time::Duration) {
        self.state.lock().unwrap().deferred_detach = Some(delay);
    }

    pub fn set_usage(&self, usage: FsUsage) {
        self.state.lock().unwrap().usage = usage;
    }

    /// FITRIM takes `delay` (tokio time), then runs `effect` and reports `trimmed` bytes.
    pub fn script_fitrim(
        &self,
        delay: std::time::Duration,
        trimmed: u64,
        effect: impl Fn() + Send + Sync + 'static,
    ) {
        *self.fitrim.lock().unwrap() = FitrimScript {
            delay,
            trimmed,
            effect: Some(Box::new(effect)),
        };
    }

    /// The next call named `call` fails with `errno`.
    pub fn fail_next(&self, call: &'static str, errno: i32) {
        self.state.lock().unwrap().fail_next.insert(call, errno);
    }

    pub fn calls(&self) -> Vec<String> {
        self.state.lock().unwrap().calls.clone()
    }

    /// How many times the whole mount table was read.
    pub fn mountinfo_reads(&self) -> usize {
        self.state.lock().unwrap().mountinfo_reads
    }

    /// Behaves as a kernel without statmount(2) (before Linux 6.8) from now on.
    pub fn without_statmount(&self) {
        self.state.lock().unwrap().no_statmount = true;
    }

    /// The mount(2) calls whose mounts are still in place, oldest first.
    pub fn mounts(&self) -> Vec<MountCall> {
        self.state
            .lock()
            .unwrap()
            .mounts
            .iter()
            .map(|m| m.call.clone())
            .collect()
    }

    pub fn mount_points(&self) -> Vec<PathBuf> {
        self.state
            .lock()
            .unwrap()
            .mounts
            .iter()
            .map(|m| m.call.target.clone())
            .collect()
    }

    fn record(&self, call: &'static str, path: &Path) -> Result<(), SyscallError> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("{call} {}", path.display()));
        match s.fail_next.remove(call) {
            Some(errno) => Err(SyscallError {
                call,
                path: path.to_path_buf(),
                source: std::io::Error::from_raw_os_error(errno),
            }),
            None => Ok(()),
        }
    }
}

#[async_trait]
impl Syscalls for FakeSyscalls {
    async fn mount(&self, call: MountCall) -> Result<(), SyscallError> {
        self.record("mount", &call.target)?;
        let mut s = self.state.lock().unwrap();
        if call.flags.contains(nix::mount::MsFlags::MS_REMOUNT) {
            if let Some(m) = s.mounts.iter_mut().rev().find(|m| m.call.target == call.target) {
                m.call.flags = call.flags;
            }
            return Ok(());
        }
        // A bind mount of a mounted path shows the device of what is mounted there; a
        // bind of a device node, devtmpfs.
        let mounted = s
            .mounts
            .iter()
            .rev()
            .find(|m| m.call.target == call.source)
            .cloned();
        let node = (mounted.is_none() && call.fs_type.is_none() && s.devices.contains_key(&call.source))
            .then(|| call.source.clone());
        let (dev, node) = match (mounted, node) {
            (Some(m), _) => (m.dev, m.node),
            (None, Some(node)) => (DEVTMPFS, Some(node)),
            (None, None) => (s.devices.get(&call.source).copied().unwrap_or((0, 99)), None),
        };
        s.mounts.push(FakeMount { call, dev, node });
        Ok(())
    }

    async fn umount(&self, target: &Path) -> Result<(), SyscallError> {
        self.record("umount", target)?;
        let mut s = self.state.lock().unwrap();
        match s.mounts.iter().rposition(|m| m.call.target == target) {
            Some(i) => {
                s.mounts.remove(i);
                Ok(())
            }
            None => Err(SyscallError {
                call: "umount",
                path: target.to_path_buf(),
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            }),
        }
    }

    async fn mountinfo(&self) -> Result<String, SyscallError> {
        let mut s = self.state.lock().unwrap();
        s.mountinfo_reads += 1;
        let mut text = String::new();
        for (i, m) in s.mounts.iter().enumerate() {
            let bind = m.call.fs_type.is_none();
            let ro = if m.call.flags.contains(nix::mount::MsFlags::MS_RDONLY) {
                "ro"
            } else {
                "rw"
            };
            let fs = m.fs_type();
            let root = m.root();
            let source = if m.node.is_some() {
                "udev".to_string()
            } else if bind {
                "/dev/fake".to_string()
            } else {
                m.call.source.display().to_string()
            };
            let sb = if s.sb_read_only.contains(&m.dev) {
                "ro"
            } else {
                "rw"
            };
            text.push_str(&format!(
                "{} 1 {}:{} {} {} {ro},relatime - {fs} {source} {sb}\n",
                100 + i,
                m.dev.0,
                m.dev.1,
                root.display(),
                m.call.target.display()
            ));
        }
        Ok(text)
    }

    /// What `mountinfo` shows for the topmost mount at `path`.
    async fn mount_at(&self, path: &Path) -> Result<Option<MountedAt>, SyscallError> {
        let s = self.state.lock().unwrap();
        if s.no_statmount {
            return Err(SyscallError {
                call: "statmount",
                path: path.to_path_buf(),
                source: std::io::Error::from_raw_os_error(libc::ENOSYS),
            });
        }
        Ok(s.mounts
            .iter()
            .rev()
            .find(|m| m.call.target == path)
            .map(|m| MountedAt {
                major: m.dev.0,
                minor: m.dev.1,
                root: m.root(),
                mount_point: m.call.target.clone(),
                fs_type: m.fs_type(),
                read_only: m.call.flags.contains(nix::mount::MsFlags::MS_RDONLY),
                sb_read_only: s.sb_read_only.contains(&m.dev),
            }))
    }

    async fn statvfs(&self, path: &Path) -> Result<FsUsage, SyscallError> {
        self.record("statvfs", path)?;
        Ok(self.state.lock().unwrap().usage)
    }

    async fn block_device_size(&self, device: &Path) -> Result<u64, SyscallError> {
        self.record("BLKGETSIZE64", device)?;
        Ok(self.state.lock().unwrap().sizes.get(device).copied().unwrap_or(0))
    }

    async fn device_head(&self, device: &Path, len: usize) -> Result<Vec<u8>, SyscallError> {
        self.record("read", device)?;
        let s = self.state.lock().unwrap();
        let Some(size) = s.sizes.get(device) else {
            return Err(SyscallError {
                call: "open",
                path: device.to_path_buf(),
                source: std::io::Error::from_raw_os_error(libc::ENOENT),
            });
        };
        let mut head = s.heads.get(device).cloned().unwrap_or_default();
        head.resize(len.min(*size as usize), 0);
        Ok(head)
    }

    /// As stat answers: the fake's device nodes, `None` for a path that exists (on the
    /// real filesystem: the tests' directories) and is no device, ENOENT for the rest.
    async fn device_number(&self, path: &Path) -> Result<Option<u64>, SyscallError> {
        let s = self.state.lock().unwrap();
        match s.devices.get(path) {
            Some((major, minor)) => Ok(Some(nix::sys::stat::makedev((*major).into(), (*minor).into()))),
            None if path.exists() => Ok(None),
            None => Err(SyscallError {
                call: "stat",
                path: path.to_path_buf(),
                source: std::io::Error::from_raw_os_error(libc::ENOENT),
            }),
        }
    }

    async fn device_mapper_names(&self) -> Result<Vec<String>, SyscallError> {
        Ok(self.state.lock().unwrap().dm_names.clone())
    }

    async fn device_mapper_suspended(&self, dev: u64) -> Result<bool, SyscallError> {
        let key = (
            nix::sys::stat::major(dev) as u32,
            nix::sys::stat::minor(dev) as u32,
        );
        Ok(self.state.lock().unwrap().dm_suspended.contains(&key))
    }

    async fn bad_sectors(&self, dev: u64) -> Result<u64, SyscallError> {
        let key = (
            nix::sys::stat::major(dev) as u32,
            nix::sys::stat::minor(dev) as u32,
        );
        Ok(self
            .state
            .lock()
            .unwrap()
            .bad_sectors
            .get(&key)
            .copied()
            .unwrap_or(0))
    }

    async fn device_slaves(&self, dev: u64) -> Result<Vec<u64>, SyscallError> {
        let key = (
            nix::sys::stat::major(dev) as u32,
            nix::sys::stat::minor(dev) as u32,
        );
        let make = |(major, minor): &(u32, u32)| nix::sys::stat::makedev((*major).into(), (*minor).into());
        Ok(self
            .state
            .lock()
            .unwrap()
            .slaves
            .get(&key)
            .map(|s| s.iter().map(make).collect())
            .unwrap_or_default())
    }

    async fn fitrim(&self, path: &Path) -> Result<u64, SyscallError> {
        self.record("FITRIM", path)?;
        let delay = self.fitrim.lock().unwrap().delay;
        tokio::time::sleep(delay).await;
        let script = self.fitrim.lock().unwrap();
        if let Some(effect) = &script.effect {
            effect();
        }
        Ok(script.trimmed)
    }

    async fn loop_devices(&self) -> Result<Vec<LoopDevice>, SyscallError> {
        self.record("list loop devices", Path::new("/sys/block"))?;
        Ok(self.state.lock().unwrap().loops.clone())
    }

    async fn loop_backing_file(&self, device: &Path) -> Result<Option<PathBuf>, SyscallError> {
        self.record("read backing_file", device)?;
        let s = self.state.lock().unwrap();
        Ok(s.loops
            .iter()
            .find(|l| l.device == device)
            .map(|l| l.backing_file.clone()))
    }

    async fn loop_backing_inode(&self, device: &Path) -> Result<Option<(u64, u64)>, SyscallError> {
        self.record("LOOP_GET_STATUS64", device)?;
        let s = self.state.lock().unwrap();
        let attached = s.loops.iter().any(|l| l.device == device);
        Ok(s.loop_inodes.get(device).copied().filter(|_| attached))
    }

    async fn loop_attach(&self, image: &Path) -> Result<PathBuf, SyscallError> {
        self.record("LOOP_CONFIGURE", image)?;
        let mut s = self.state.lock().unwrap();
        if s.free_loops.is_empty() {
            return Err(SyscallError {
                call: "LOOP_CTL_GET_FREE",
                path: PathBuf::from("/dev/loop-control"),
                source: std::io::Error::from_raw_os_error(libc::ENOSPC),
            });
        }
        let device = s.free_loops.remove(0);
        s.loops.push(LoopDevice {
            device: device.clone(),
            backing_file: image.to_path_buf(),
        });
        Ok(device)
    }

    async fn loop_detach(&self, device: &Path) -> Result<(), SyscallError> {
        self.record("LOOP_CLR_FD", device)?;
        let mut s = self.state.lock().unwrap();
        if !s.loops.iter().any(|l| l.device == device) {
            return Err(SyscallError {
                call: "LOOP_CLR_FD",
                path: device.to_path_buf(),
                source: std::io::Error::from_raw_os_error(libc::ENXIO),
            });
        }
        s.free_loops.push(device.to_path_buf());
        match s.deferred_detach {
            None => s.loops.retain(|l| l.device != device),
            Some(delay) => {
                let (fake, device) = (self.clone(), device.to_path_buf());
                std::thread::spawn(move || {
                    std::thread::sleep(delay);
                    fake.detach_loop(&device);
                });
            }
        }
        Ok(())
    }

    /// A plain copy of the real file (the fake's tests run on temporary directories),
    /// reported as sparse.
    async fn copy_file(&self, source: &Path, target: &Path) -> Result<CopyMethod, SyscallError> {
        self.record("copy", target)?;
        std::fs::copy(source, target).map_err(|source| SyscallError {
            call: "copy",
            path: target.to_path_buf(),
            source,
        })?;
        Ok(CopyMethod::Sparse)
    }

    async fn freeze(&self, path: &Path) -> Result<(), SyscallError> {
        self.record("FIFREEZE", path)
    }

    async fn thaw(&self, path: &Path) -> Result<(), SyscallError> {
        self.record("FITHAW", path)
    }

    async fn filesystem_state(&self, mount: &MountedAt) -> FilesystemState {
        let s = self.state.lock().unwrap();
        let state = s.filesystem_states.get(&(mount.major, mount.minor)).copied();
        state.unwrap_or(FilesystemState {
            root_errno: None,
            ext4_errors: (mount.fs_type == "ext4").then_some(0),
        })
    }
}
