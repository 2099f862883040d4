//! One mount, asked of the kernel by path: statx(2) for the mount's unique id, then
//! statmount(2) (Linux 6.8) for what /proc/self/mountinfo would say of it. The blocking
//! body of [`Syscalls::mount_at`](super::Syscalls::mount_at).
//!
//! Reading mountinfo costs time in proportion to the mounts of the node (1.5 ms at 600
//! mounts here), and a node with hundreds of volumes has two mounts for each; kubelet
//! asks every volume's stats every minute. This costs the same whatever the table holds.

use std::path::{Path, PathBuf};

use super::{MountedAt, SyscallError};

/// `__NR_statmount`: one number on every architecture (the unified table of new calls).
const SYS_STATMOUNT: libc::c_long = 457;
/// `struct mnt_id_req` as first defined (linux/mount.h, `MNT_ID_REQ_SIZE_VER0`).
const MNT_ID_REQ_SIZE_VER0: u32 = 24;
const STATMOUNT_SB_BASIC: u64 = 0x01;
const STATMOUNT_MNT_BASIC: u64 = 0x02;
const STATMOUNT_MNT_ROOT: u64 = 0x08;
const STATMOUNT_MNT_POINT: u64 = 0x10;
const STATMOUNT_FS_TYPE: u64 = 0x20;
const WANTED: u64 =
    STATMOUNT_SB_BASIC | STATMOUNT_MNT_BASIC | STATMOUNT_MNT_ROOT | STATMOUNT_MNT_POINT | STATMOUNT_FS_TYPE;
/// `MOUNT_ATTR_RDONLY` in `statmount.mnt_attr`.
const MOUNT_ATTR_RDONLY: u64 = 0x01;
/// `SB_RDONLY` in `statmount.sb_flags` (linux/fs.h).
const SB_RDONLY: u32 = 0x01;

/// `struct mnt_id_req` (linux/mount.h), version 0.
#[repr(C)]
struct MntIdReq {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
}

/// The fixed part of `struct statmount` (linux/mount.h) that Linux 6.8 defined; later
/// kernels fill fields of the spare space, which stays the same size, so `str`, where
/// the string fields' offsets count from, is always 512 bytes in.
#[repr(C)]
struct StatmountHeader {
    size: u32,
    mnt_opts: u32,
    mask: u64,
    sb_dev_major: u32,
    sb_dev_minor: u32,
    sb_magic: u64,
    sb_flags: u32,
    fs_type: u32,
    mnt_id: u64,
    mnt_parent_id: u64,
    mnt_id_old: u32,
    mnt_parent_id_old: u32,
    mnt_attr: u64,
    mnt_propagation: u64,
    mnt_peer_group: u64,
    mnt_master: u64,
    propagate_from: u64,
    mnt_root: u32,
    mnt_point: u32,
}

const STRINGS_AT: usize = 512;
/// Room for the three strings: paths up to PATH_MAX each, and a type name. The kernel
/// answers EOVERFLOW if they do not fit.
const BUFFER_BYTES: usize = STRINGS_AT + 3 * 4096 + 256;

fn unsupported(path: &Path) -> SyscallError {
    SyscallError::new("statmount", path, std::io::Error::from_raw_os_error(libc::ENOSYS))
}

/// The topmost mount whose mount point is `path` itself (not a mount `path` is inside);
/// `None` when nothing is mounted at `path`. A kernel without unique mount ids or
/// statmount answers ENOSYS.
pub(super) fn mount_at_blocking(path: &Path) -> Result<Option<MountedAt>, SyscallError> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|e| {
        SyscallError::new(
            "statx",
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
        )
    })?;
    // SAFETY: an all-zero statx is a valid value of the plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statx the kernel writes into, both alive for
    // the call.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT,
            libc::STATX_MNT_ID_UNIQUE,
            &mut stx,
        )
    };
    if rc != 0 {
        return Err(SyscallError::new("statx", path, std::io::Error::last_os_error()));
    }
    let mount_root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    if stx.stx_mask & libc::STATX_MNT_ID_UNIQUE == 0 || stx.stx_attributes_mask & mount_root == 0 {
        return Err(unsupported(path));
    }
    if stx.stx_attributes & mount_root == 0 {
        return Ok(None);
    }
    let request = MntIdReq {
        size: MNT_ID_REQ_SIZE_VER0,
        spare: 0,
        mnt_id: stx.stx_mnt_id,
        param: WANTED,
    };
    let mut buffer = vec![0u64; BUFFER_BYTES / 8];
    // SAFETY: the request and the buffer (8-byte aligned, BUFFER_BYTES long) are alive
    // for the call; the kernel writes at most the size it is given.
    let rc = unsafe {
        libc::syscall(
            SYS_STATMOUNT,
            &request as *const MntIdReq,
            buffer.as_mut_ptr(),
            BUFFER_BYTES,
            0u32,
        )
    };
    if rc != 0 {
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::ENOSYS) {
            return Err(unsupported(path));
        }
        return Err(SyscallError::new("statmount", path, error));
    }
    // SAFETY: the buffer is 8-byte aligned and longer than the header.
    let bytes = unsafe { std::slice::from_raw_parts(buffer.as_ptr().cast::<u8>(), BUFFER_BYTES) };
    let mounted = parse(bytes).ok_or_else(|| {
        SyscallError::new(
            "statmount",
            path,
            std::io::Error::other("an answer without the fields asked"),
        )
    })?;
    // The mount a path resolves to has its root there, but a mount propagated or
    // bound elsewhere could still name another place: only an exact match counts.
    Ok((mounted.mount_point == path).then_some(mounted))
}

/// The fields of a statmount answer (`bytes`, as the kernel wrote them).
fn parse(bytes: &[u8]) -> Option<MountedAt> {
    if bytes.len() < STRINGS_AT {
        return None;
    }
    // SAFETY: `bytes` is longer than the header; read_unaligned copies it out whatever
    // the alignment, and every bit pattern is a valid value of its integer fields.
    let header = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<StatmountHeader>()) };
    let size = (header.size as usize).min(bytes.len());
    if header.mask & WANTED != WANTED || size < STRINGS_AT {
        return None;
    }
    let strings = &bytes[STRINGS_AT..size];
    let string = |offset: u32| -> Option<&[u8]> {
        let rest = strings.get(offset as usize..)?;
        let end = rest.iter().position(|b| *b == 0)?;
        Some(&rest[..end])
    };
    use std::os::unix::ffi::OsStrExt;
    let path = |offset| string(offset).map(|s| PathBuf::from(std::ffi::OsStr::from_bytes(s)));
    Some(MountedAt {
        major: header.sb_dev_major,
        minor: header.sb_dev_minor,
        root: path(header.mnt_root)?,
        mount_point: path(header.mnt_point)?,
        fs_type: String::from_utf8_lossy(string(header.fs_type)?).into_owned(),
        read_only: header.mnt_attr & MOUNT_ATTR_RDONLY != 0,
        sb_read_only: header.sb_flags & SB_RDONLY != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer laid out as the kernel writes it.
    fn answer(mask: u64, strings: &[&str]) -> Vec<u8> {
        let mut bytes = vec![0u8; STRINGS_AT];
        let mut offsets = Vec::new();
        for s in strings {
            offsets.push((bytes.len() - STRINGS_AT) as u32);
            bytes.extend_from_slice(s.as_bytes());
            bytes.push(0);
        }
        let put32 = |b: &mut Vec<u8>, at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        let put64 = |b: &mut Vec<u8>, at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        let size = bytes.len() as u32;
        put32(&mut bytes, 0, size);
        put64(&mut bytes, 8, mask);
        put32(&mut bytes, 16, 7);
        put32(&mut bytes, 20, 3);
        put32(&mut bytes, 36, offsets[0]);
        put32(&mut bytes, 32, SB_RDONLY);
        put64(&mut bytes, 64, MOUNT_ATTR_RDONLY | 0x02);
        put32(&mut bytes, 104, offsets[1]);
        put32(&mut bytes, 108, offsets[2]);
        bytes
    }

    #[test]
    fn the_header_is_laid_out_as_linux_mount_h_defines_it() {
        assert_eq!(std::mem::offset_of!(StatmountHeader, sb_dev_major), 16);
        assert_eq!(std::mem::offset_of!(StatmountHeader, sb_flags), 32);
        assert_eq!(std::mem::offset_of!(StatmountHeader, fs_type), 36);
        assert_eq!(std::mem::offset_of!(StatmountHeader, mnt_attr), 64);
        assert_eq!(std::mem::offset_of!(StatmountHeader, mnt_root), 104);
        assert_eq!(std::mem::offset_of!(StatmountHeader, mnt_point), 108);
        assert_eq!(std::mem::size_of::<MntIdReq>(), MNT_ID_REQ_SIZE_VER0 as usize);
    }

    #[test]
    fn an_answer_is_read_into_the_fields_mountinfo_shows() {
        let bytes = answer(WANTED, &["ext4", "/", "/var/lib/kubelet/pods/a/mount"]);
        assert_eq!(
            parse(&bytes),
            Some(MountedAt {
                major: 7,
                minor: 3,
                root: "/".into(),
                mount_point: "/var/lib/kubelet/pods/a/mount".into(),
                fs_type: "ext4".into(),
                read_only: true,
                sb_read_only: true,
            })
        );
    }

    #[test]
    fn an_answer_without_a_field_asked_or_cut_short_is_refused() {
        let bytes = answer(WANTED & !STATMOUNT_MNT_POINT, &["ext4", "/", "/a"]);
        assert_eq!(parse(&bytes), None);
        let bytes = answer(WANTED, &["ext4", "/", "/a"]);
        assert_eq!(parse(&bytes[..STRINGS_AT + 6]), None);
    }
}
