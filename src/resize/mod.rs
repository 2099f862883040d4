//! Volume expansion beyond the CSI calls: the claim's resize status
//! (`--report-resize-status`) and, for clusters without a central external-resizer,
//! localvol as the resizer of its own node's claims (`--node-resizer`).
//!
//! The volume work itself is `Volumes::expand` (controller side: grow the backing
//! store) and `Volumes::expand_on_node` (node side: device view and filesystem); this
//! module decides when to call them and tells Kubernetes what happened, with the
//! status values and conditions kubelet and external-resizer use.

pub mod classify;
pub mod quantity;
