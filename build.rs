//! Compiles the wire definitions under `proto/` into Rust with tonic/prost.
//!
//! `protoc` comes from the `protoc-bin-vendored` crate so that a fresh machine needs no
//! system package; `PROTOC` in the environment still wins, for distributions that
//! prefer their own.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "proto/csi.proto",
    "proto/csi-addons/identity.proto",
    "proto/csi-addons/reclaimspace.proto",
    "proto/pluginregistration/api.proto",
    "proto/localvol/status.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc: PathBuf = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing else reads the environment now.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(PROTOS, &["proto"])?;
    Ok(())
}
