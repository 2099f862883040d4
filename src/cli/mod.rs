//! Subcommands other than `serve`: clients of a running daemon, over its sockets.

pub mod reclaim;
pub mod status;
