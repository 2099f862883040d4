//! The loop driver's ioctls (linux/loop.h): the blocking bodies of the loop calls of
//! [`Syscalls`](super::Syscalls), what `losetup` does, without a process.

use std::path::{Path, PathBuf};

use super::{LoopDevice, SyscallError};

/// `struct loop_info64` of the kernel's loop UAPI (linux/loop.h); only the first two
/// fields are read.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

nix::ioctl_read_bad!(loop_get_status64, 0x4C05, LoopInfo64);

/// `struct loop_config` of linux/loop.h, LOOP_CONFIGURE's argument (Linux 5.8).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

// linux/loop.h: LOOP_SET_FD and LOOP_CLR_FD take an int by value (or nothing),
// LOOP_CONFIGURE a loop_config, LOOP_CTL_GET_FREE (on /dev/loop-control) nothing.
nix::ioctl_write_int_bad!(loop_set_fd, 0x4C00);
nix::ioctl_none_bad!(loop_clr_fd, 0x4C01);
nix::ioctl_write_ptr_bad!(loop_configure, 0x4C0A, LoopConfig);
nix::ioctl_none_bad!(loop_ctl_get_free, 0x4C82);

/// How often attach takes another free device when a concurrent attacher (another
/// daemon's, an administrator's `losetup`) took the one it was given first.
const LOOP_ATTACH_TRIES: usize = 16;

/// The blocking body of [`Syscalls::loop_attach`]: what `losetup --find --show` does,
/// without a process: ask loop-control for a free device, then bind the image to it in
/// one LOOP_CONFIGURE (or LOOP_SET_FD on kernels before 5.8).
pub(super) fn loop_attach_blocking(image: &Path) -> Result<PathBuf, SyscallError> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .map_err(|e| SyscallError::new("open", image, e))?;
    let control_path = Path::new("/dev/loop-control");
    let control =
        std::fs::File::open(control_path).map_err(|e| SyscallError::new("open", control_path, e))?;
    let mut busy = None;
    for _ in 0..LOOP_ATTACH_TRIES {
        // SAFETY: the fd is open for the call; LOOP_CTL_GET_FREE takes no argument.
        let number = unsafe { loop_ctl_get_free(control.as_raw_fd()) }
            .map_err(|e| SyscallError::new("LOOP_CTL_GET_FREE", control_path, e))?;
        let device = PathBuf::from(format!("/dev/loop{number}"));
        let loop_file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&device)
            .map_err(|e| SyscallError::new("open", &device, e))?;
        // SAFETY: all-zero bytes are a valid loop_config: no flags, no offset, no name.
        let mut config: LoopConfig = unsafe { std::mem::zeroed() };
        config.fd = file.as_raw_fd() as u32;
        // SAFETY: both fds are open for the call and `config` is a valid loop_config
        // that the kernel only reads.
        let configured = match unsafe { loop_configure(loop_file.as_raw_fd(), &config) } {
            // Before Linux 5.8: the older call, which sets the same state (no flags).
            // SAFETY: both fds are open for the call; LOOP_SET_FD takes the fd by value.
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOTTY) => unsafe {
                loop_set_fd(loop_file.as_raw_fd(), file.as_raw_fd())
            },
            other => other,
        };
        match configured {
            Ok(_) => return Ok(device),
            // Taken between LOOP_CTL_GET_FREE and now: ask for another.
            Err(nix::errno::Errno::EBUSY) => busy = Some(device),
            Err(e) => return Err(SyscallError::new("LOOP_CONFIGURE", &device, e)),
        }
    }
    let device = busy.unwrap_or_else(|| control_path.to_path_buf());
    Err(SyscallError::new(
        "LOOP_CONFIGURE",
        &device,
        nix::errno::Errno::EBUSY,
    ))
}

/// The blocking body of [`Syscalls::loop_detach`]: what `losetup --detach` does.
pub(super) fn loop_detach_blocking(device: &Path) -> Result<(), SyscallError> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(device).map_err(|e| SyscallError::new("open", device, e))?;
    // SAFETY: the fd is open for the call; LOOP_CLR_FD takes no argument.
    unsafe { loop_clr_fd(file.as_raw_fd()) }
        .map(drop)
        .map_err(|e| SyscallError::new("LOOP_CLR_FD", device, e))
}

/// The backing file's `(st_dev, st_ino)` of the loop device at `device`.
pub(super) fn loop_backing_inode(device: &Path) -> Option<(u64, u64)> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(device).ok()?;
    let mut info = std::mem::MaybeUninit::<LoopInfo64>::zeroed();
    // SAFETY: the fd is open for the call and `info` is a zeroed loop_info64 that the
    // kernel fills in.
    unsafe { loop_get_status64(file.as_raw_fd(), info.as_mut_ptr()) }.ok()?;
    // SAFETY: all-zero bytes are a valid LoopInfo64, and the kernel wrote the rest.
    let info = unsafe { info.assume_init() };
    Some((info.lo_device, info.lo_inode))
}

/// The backing file sysfs shows for the loop device at `device` (`/dev/loopN`); `None`
/// when nothing is attached (no `backing_file` attribute) or it is no loop device.
pub(super) fn loop_backing_file(device: &Path) -> Option<PathBuf> {
    let name = device.file_name()?.to_str().filter(|n| n.starts_with("loop"))?;
    let shown = std::fs::read_to_string(Path::new("/sys/block").join(name).join("loop/backing_file")).ok()?;
    Some(PathBuf::from(shown.trim_end_matches('\n')))
}

/// The blocking body of [`Syscalls::loop_devices`](super::Syscalls::loop_devices): the
/// attached loop devices and their backing files (under `sys`, /sys/block).
///
/// Which devices are attached comes from one read of `partitions` (/proc/partitions),
/// which lists only block devices with a size: a node keeps every loop device node it
/// ever made (hundreds, after a few hundred volumes), and asking each of them for a
/// backing file took milliseconds per lookup. An attached loop device of zero size is
/// not listed; a volume's image is never smaller than a MiB.
pub(super) fn loop_devices_blocking(sys: &Path, partitions: &Path) -> Result<Vec<LoopDevice>, SyscallError> {
    let listed = std::fs::read_to_string(partitions).map_err(|e| SyscallError::new("read", partitions, e))?;
    let mut found = Vec::new();
    for name in sized_loop_devices(&listed) {
        // Detached since the list was read: gone from sysfs too.
        let Ok(backing) = std::fs::read_to_string(sys.join(name).join("loop/backing_file")) else {
            continue;
        };
        found.push(LoopDevice {
            device: PathBuf::from("/dev").join(name),
            backing_file: PathBuf::from(backing.trim_end_matches('\n')),
        });
    }
    Ok(found)
}

/// The loop devices (`loopN`, not their partitions `loopNpM`) named in /proc/partitions
/// (`major minor #blocks name` after a header line).
pub fn sized_loop_devices(partitions: &str) -> Vec<&str> {
    partitions
        .lines()
        .filter_map(|line| line.split_whitespace().nth(3))
        .filter(|name| {
            name.strip_prefix("loop")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::sized_loop_devices;

    /// /proc/partitions of a node with two attached loop devices (one partitioned), a
    /// disk and its partition, as Linux 6.x prints it.
    const PARTITIONS: &str = "major minor  #blocks  name

 254        0   52428800 vda
 254        1   52427759 vda1
   7        0     327680 loop0
   7        5      32768 loop5
 259        0      16384 loop5p1
  11        0    1048575 sr0
";

    #[test]
    fn only_the_loop_devices_listed_with_a_size_are_read() {
        assert_eq!(sized_loop_devices(PARTITIONS), ["loop0", "loop5"]);
        assert!(sized_loop_devices("major minor  #blocks  name\n\n").is_empty());
        assert!(sized_loop_devices("").is_empty());
    }
}
