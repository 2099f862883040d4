//! What a mounted filesystem says of its own health: the kernel's verdicts that come
//! before an application's EIO. Pure: the facts are read by
//! [`Syscalls::filesystem_state`](crate::host::Syscalls::filesystem_state) and the mount
//! lookup the volume's stats already make.
//!
//! - **I/O errors at its root:** a `stat` of the mount point fails with EIO once xfs has
//!   shut itself down (after a metadata write failed, or `xfs_io -x -c shutdown`); every
//!   access in it fails the same way until it is unmounted and repaired.
//! - **Read-only by the kernel:** the filesystem is read-only while the mount is not, so
//!   no one asked for it: ext4 mounted `errors=remount-ro` turns so after an error (so
//!   Linux 6.1 does, the VM guest's; 6.18, the host's, keeps a flag of ext4's own
//!   instead, shown as `emergency_ro` in mountinfo, and the error is counted below).
//! - **ext4's error count:** the errors it met since its last fsck, which it keeps in
//!   its superblock whatever its `errors=` behaviour (`continue` goes on writing);
//!   e2fsck clears it.

use crate::host::{FilesystemState, MountedAt};

/// Why the filesystem at `mount` is unhealthy, with what to do; `None` when it is not.
pub fn problem(mount: &MountedAt, state: &FilesystemState) -> Option<String> {
    let fs = &mount.fs_type;
    if let Some(errno) = state.root_errno
        && errno == libc::EIO
    {
        return Some(format!(
            "its {fs} filesystem answers I/O errors (shut down after a failed write, or its device failed): \
             unmount it and repair it (xfs_repair, e2fsck)"
        ));
    }
    if mount.sb_read_only && !mount.read_only {
        return Some(format!(
            "its {fs} filesystem was made read-only by the kernel after an error: writes fail; \
             unmount it and run fsck"
        ));
    }
    match state.ext4_errors {
        Some(n) if n > 0 => Some(format!(
            "its ext4 filesystem recorded {n} error{} since its last fsck (the kernel log names them): \
             unmount it and run e2fsck",
            if n == 1 { "" } else { "s" }
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(fs_type: &str, read_only: bool, sb_read_only: bool) -> MountedAt {
        MountedAt {
            major: 7,
            minor: 3,
            root: "/".into(),
            mount_point: "/k/stage".into(),
            fs_type: fs_type.into(),
            read_only,
            sb_read_only,
        }
    }

    fn state(root_errno: Option<i32>, ext4_errors: Option<u64>) -> FilesystemState {
        FilesystemState {
            root_errno,
            ext4_errors,
        }
    }

    #[test]
    fn a_filesystem_is_healthy_until_the_kernel_says_otherwise() {
        let cases: [(MountedAt, FilesystemState, Option<&str>); 8] = [
            (mount("ext4", false, false), state(None, Some(0)), None),
            (mount("xfs", false, false), state(None, None), None),
            // Read-only because it was staged so: nothing wrong.
            (mount("ext4", true, true), state(None, Some(0)), None),
            // A bind published read-only of a writable filesystem.
            (mount("xfs", true, false), state(None, None), None),
            // A failed stat other than EIO (a racing unmount) judges nothing.
            (mount("xfs", false, false), state(Some(libc::ENOENT), None), None),
            (
                mount("xfs", false, false),
                state(Some(libc::EIO), None),
                Some("its xfs filesystem answers I/O errors"),
            ),
            (
                mount("ext4", false, true),
                state(None, Some(1)),
                Some("its ext4 filesystem was made read-only by the kernel after an error"),
            ),
            (
                mount("ext4", true, true),
                state(None, Some(3)),
                Some("its ext4 filesystem recorded 3 errors since its last fsck"),
            ),
        ];
        for (m, s, want) in cases {
            let got = problem(&m, &s);
            match want {
                None => assert_eq!(got, None, "{m:?} {s:?}"),
                Some(start) => assert!(
                    got.as_deref().is_some_and(|g| g.starts_with(start)),
                    "{m:?} {s:?}: {got:?}"
                ),
            }
        }
        assert!(
            problem(&mount("ext4", false, false), &state(None, Some(1)))
                .is_some_and(|p| p.contains("recorded 1 error since"))
        );
    }
}
