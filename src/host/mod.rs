//! What localvol does to the machine beyond its own files goes through the two seams
//! here: external programs ([`Commands`]: lvm, ndctl, losetup, mkfs, blkid, ...) and the
//! system calls on mounts and devices ([`Syscalls`]: mount, umount, the mount table,
//! statvfs, block device sizes and numbers, loop devices, FITRIM, freeze and thaw,
//! reflink copies). Real implementations run on the host; the fakes in [`fake`] record
//! calls so tests can assert on them.
//!
//! Plain file I/O does not go through a seam: record files and backing images under the
//! data directory (`backend`), the CSI and registration sockets (`csi`, `registration`,
//! `app`), the directories and files a publish creates and removes at its target
//! (`volume`), the configuration file (`config`), and resolving device symlinks. These
//! act on paths localvol owns or was handed, need no privilege beyond the directory's,
//! and their tests run against temporary directories rather than a fake.

pub mod blocking;
pub mod command;
#[cfg(test)]
pub mod fake;
pub mod syscalls;

use std::sync::Arc;

pub use command::{CommandError, CommandOutput, CommandSpec, Commands, SystemCommands};
pub use syscalls::{
    CopyMethod, FilesystemState, FsUsage, LoopDevice, MountCall, MountedAt, SyscallError, Syscalls,
    SystemSyscalls, io_is_terminal,
};

/// The machine, as the rest of localvol sees it.
#[derive(Clone)]
pub struct Host {
    pub commands: Arc<dyn Commands>,
    pub syscalls: Arc<dyn Syscalls>,
}

impl Host {
    /// The real machine.
    pub fn system() -> Self {
        Self {
            commands: Arc::new(SystemCommands),
            syscalls: Arc::new(SystemSyscalls),
        }
    }
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Host")
    }
}
