//! Commands that talk to a running daemon over its sockets.

pub mod reclaim;
