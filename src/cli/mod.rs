//! Subcommands other than `serve`: clients of a running daemon.

pub mod status;
