//! ReclaimSpace: giving the space of deleted files back to the device class, by FITRIM
//! on each volume's filesystem, on a schedule configured the way csi-addons configures
//! it, and on demand over the csi-addons API.
//!
//! - [`schedule`]: schedules (`@weekly`, cron) and the UID-based stagger; pure.
//! - [`policy`]: which schedule applies to a volume (annotations, ConfigMap, node file); pure.
//! - [`run`]: one run on one volume, under its lock and the node's concurrency limit.
//! - [`scheduler`]: the background task that starts runs when they are due.
//! - [`service`]: the csi-addons Identity and ReclaimSpaceNode gRPC services.
//! - [`k8s`]: watches that reschedule on annotation and ConfigMap changes, and the
//!   `last-run`/`last-result` annotations and failure events written back.

pub mod policy;
pub mod schedule;

/// The schedule annotation csi-addons reads on PVCs, Namespaces and StorageClasses.
pub const SCHEDULE_ANNOTATION: &str = "reclaimspace.csiaddons.openshift.io/schedule";
/// `"false"` turns reclaim off for the object's volumes (csi-addons semantics).
pub const ENABLE_ANNOTATION: &str = "reclaimspace.csiaddons.openshift.io/enable";
