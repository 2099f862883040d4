//! Generated gRPC code for the wire definitions under `proto/`. Only the gRPC edge
//! (`csi`, `request`, the csi-addons and registration services) uses these types.
#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub mod csi {
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}

/// csi-addons `identity` package.
pub mod identity {
    tonic::include_proto!("identity");
}

/// csi-addons `reclaimspace` package.
pub mod reclaimspace {
    tonic::include_proto!("reclaimspace");
}

/// kubelet `pluginregistration` package (v1).
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// localvol's own `VolumeStates` service (proto/localvol/status.proto).
pub mod localvol {
    pub mod v1 {
        tonic::include_proto!("localvol.v1");
    }
}
