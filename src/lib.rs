//! localvol: a CSI driver that turns a node's local storage into Kubernetes volumes.
//!
//! The modules form a one-way flow: `csi` (gRPC edge) → `request` (typed requests) →
//! `locks` → `volume` (operations) → `backend` → `fs`/`mount` → `host` (the only code
//! that touches the machine). Lower modules never see gRPC types.

// Errors carry their context (paths, stderr) unboxed: they are built on cold paths, and
// flat enums keep the one exhaustive Status mapping readable.
#![allow(clippy::result_large_err)]

pub mod app;
pub mod backend;
pub mod cli;
pub mod config;
pub mod csi;
pub mod error;
pub mod fs;
pub mod health;
pub mod host;
pub mod k8s;
pub mod locks;
pub mod metrics;
pub mod model;
pub mod mount;
pub mod proto;
pub mod reclaim;
pub mod registration;
pub mod request;
pub mod resize;
pub mod stats;
pub mod status_registry;
pub mod telemetry;
pub mod volume;
