//! Subcommands other than `serve`: clients of a running daemon, over its sockets.

mod args;
pub mod reclaim;
pub mod status;

pub use args::{Cli, Command, KubeletRegistration, OutputFormat, ReclaimArgs, ServeArgs, StatusArgs};
