//! Everything localvol does to the machine goes through the two seams here: external
//! programs ([`Commands`]) and system calls ([`Syscalls`]). Real implementations run on
//! the host; the fakes in [`fake`] record calls so tests can assert on them.

pub mod command;
#[cfg(test)]
pub mod fake;
pub mod syscalls;

use std::sync::Arc;

pub use command::{CommandError, CommandOutput, CommandSpec, Commands, SystemCommands};
pub use syscalls::{
    CopyMethod, FsUsage, LoopDevice, MountCall, SyscallError, Syscalls, SystemSyscalls, io_is_terminal,
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
