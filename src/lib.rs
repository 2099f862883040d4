//! localvol: a CSI driver that turns a node's local storage into Kubernetes volumes.
//!
//! The modules stand in layers. A module imports only from its own layer and the layers
//! below it, and no two modules import each other; `tests/layers.rs` reads this list and
//! checks both (test code may reach up to drive its module from above). Top first:
//!
//! 1. `cli`: the command line (parser, subcommands, flags into a `Config`)
//! 2. `app`, `telemetry`: wiring the daemon together
//! 3. `csi`, `registration`: the gRPC edges (CSI, csi-addons, kubelet registration)
//! 4. `error`: module errors into gRPC statuses, in one exhaustive match
//! 5. `resize`: node expansion and its reports
//! 6. `reclaim`, `k8s`: beside the request chain (schedules, owners)
//! 7. `gauges`: the periodic refresh of the per-class volume and capacity gauges
//! 8. `metrics`: the registry and its HTTP endpoint
//! 9. `health`: readiness of the device classes
//! 10. `volume`: one function per operation, with idempotency
//! 11. `request`, `proto`, `locks`, `volume_states`: typed requests, per-volume locks,
//!     what the daemon remembers of each volume for `localvol status`
//! 12. `backend`: LVM, PMEM and loop-file volumes
//! 13. `config`, `reclaim_policy`: validated configuration, and which ReclaimSpace
//!     schedule applies to a volume (pure; `config` validates schedules with it)
//! 14. `model`: the shared vocabulary (ids, claims, capacity ranges, driver name)
//! 15. `fs`, `mount`, `crypt`: filesystems, mounts and dm-crypt mappings
//! 16. `host`: the only code that touches the machine (commands, syscalls)
//!
//! gRPC types (tonic's, prost's, the generated messages) stay in layers 1 to 4 and,
//! below them, in `proto`, the generated code, and `request`, which turns its messages
//! into typed requests. Lower modules never see gRPC types.

// Errors carry their context (paths, stderr) unboxed: they are built on cold paths, and
// flat enums keep the one exhaustive Status mapping readable.
#![allow(clippy::result_large_err)]

pub mod app;
pub mod backend;
pub mod cli;
pub mod config;
pub mod crypt;
pub mod csi;
pub mod error;
pub mod fs;
pub mod gauges;
pub mod health;
pub mod host;
pub mod k8s;
pub mod locks;
pub mod metrics;
pub mod model;
pub mod mount;
pub mod proto;
pub mod reclaim;
pub mod reclaim_policy;
pub mod registration;
pub mod request;
pub mod resize;
pub mod telemetry;
pub mod volume;
pub mod volume_states;
