//! Terminal or transient: the one question every module's error answers about itself,
//! next to its variants, so that a new variant is decided where it is written.
//!
//! Terminal means asking again with the same request cannot succeed until someone
//! changes something (the claim's size, the node's storage, an administrator's
//! setting). Transient means the same request may succeed later (a busy volume, a
//! lock, a timeout, an API conflict). An error nobody has recognised is transient:
//! marking a claim as infeasible stops Kubernetes from retrying, which is worse for a
//! failure that would have cleared than a few more retries are for one that will not.
//!
//! The errors of `host`, `fs` and `mount` (below this module) answer with an inherent
//! `is_terminal` of the same meaning.

use super::ValidationError;

pub trait Terminal: std::error::Error {
    fn is_terminal(&self) -> bool;
}

impl Terminal for ValidationError {
    /// The request itself is wrong: the same request fails the same way.
    fn is_terminal(&self) -> bool {
        true
    }
}
