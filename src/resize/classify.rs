//! Whether a failed expansion step is terminal (asking again with the same size cannot
//! succeed until someone changes something: the claim's size, the node's storage) or
//! transient (the same request may succeed later: a busy volume, a lock, a timeout, an
//! API conflict).
//!
//! Terminal failures are written to the claim (`NodeResizeInfeasible` and a
//! `NodeResizeError` condition, or their controller counterparts); transient ones never
//! are: they only produce a Warning event and a retry. The decision itself is made by
//! each module's error, next to its variants ([`Terminal`]); this only names its two
//! answers for the reports.

use crate::k8s::api::ApiError;
use crate::model::Terminal;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Terminal,
    Transient,
}

/// What failed: a volume operation (any module's error), or a Kubernetes API call made
/// while resizing (one that did not answer within its deadline included).
#[derive(Debug, Clone, Copy)]
pub enum Cause<'a> {
    Operation(&'a dyn Terminal),
    Api(&'a ApiError),
}

pub fn classify(cause: Cause<'_>) -> Failure {
    let terminal = match cause {
        Cause::Api(e) => e.is_terminal(),
        Cause::Operation(e) => e.is_terminal(),
    };
    if terminal {
        Failure::Terminal
    } else {
        Failure::Transient
    }
}

#[cfg(test)]
mod tests;
