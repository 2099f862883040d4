//! The property `fuzz/fuzz_targets/request_conversion.rs` fuzzes, and
//! `tests/fuzz_replay.rs` replays on every run: arbitrary bytes, decoded as a CSI request
//! the way tonic decodes one off the wire, then converted into localvol's typed request.
//! Nothing may panic, and whatever is accepted must hold the invariants the rest of the
//! daemon relies on.

use std::path::{Component, Path};

use prost::Message;

use super::{
    ControllerExpandRequest, CreateRequest, HostPath, KubeletRoots, NodeExpandRequest, PublishRequest,
    StageRequest, StatsRequest, UnpublishRequest, UnstageRequest,
};
use crate::model::VolumeId;
use crate::proto::csi::v1 as csi;

/// A short root, so the fuzzer reaches paths below it.
const ROOT: &str = "/k";

fn roots() -> KubeletRoots {
    KubeletRoots::new(vec![ROOT.into()])
}

/// An accepted kubelet path names exactly one place, strictly below the root: absolute,
/// no `.`/`..`, no NUL.
fn check_path(path: &HostPath) {
    let p: &Path = path.as_path();
    assert!(p.starts_with(ROOT) && p != Path::new(ROOT), "{p:?}");
    assert!(p.is_absolute(), "{p:?}");
    assert!(
        p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_))),
        "{p:?}"
    );
    assert!(!p.as_os_str().as_encoded_bytes().contains(&0), "{p:?}");
}

/// An accepted volume id prints back to itself and parses again to the same id.
fn check_id(id: &VolumeId) {
    let text = id.to_string();
    assert_eq!(VolumeId::parse(&text).as_ref(), Ok(id));
}

/// The typed request `parse` makes of `bytes` decoded as message `M`, if both accept.
fn accepted<M: Message + Default, R>(bytes: &[u8], parse: impl FnOnce(&M) -> Option<R>) -> Option<R> {
    parse(&M::decode(bytes).ok()?)
}

/// The first byte picks the request (mod 8), the rest is its protobuf encoding.
pub fn request_conversion(data: &[u8]) {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let roots = roots();
    match selector % 8 {
        0 => {
            if let Some(req) = accepted(bytes, |raw: &csi::CreateVolumeRequest| {
                CreateRequest::try_from(raw).ok()
            }) {
                let _ = format!("{req:?}");
            }
        }
        1 => {
            let expand =
                |raw: &csi::ControllerExpandVolumeRequest| ControllerExpandRequest::try_from(raw).ok();
            if let Some(req) = accepted(bytes, expand) {
                check_id(&req.id);
            }
        }
        2 => {
            if let Some(req) = accepted(bytes, |raw| StageRequest::parse(raw, &roots).ok()) {
                check_id(&req.id);
                check_path(&req.staging_path);
            }
        }
        3 => {
            if let Some(req) = accepted(bytes, |raw| UnstageRequest::parse(raw, &roots).ok()) {
                check_id(&req.id);
                check_path(&req.staging_path);
            }
        }
        4 => {
            if let Some(req) = accepted(bytes, |raw| PublishRequest::parse(raw, &roots).ok()) {
                check_id(&req.id);
                check_path(&req.staging_path);
                check_path(&req.target_path);
            }
        }
        5 => {
            if let Some(req) = accepted(bytes, |raw| UnpublishRequest::parse(raw, &roots).ok()) {
                check_id(&req.id);
                check_path(&req.target_path);
            }
        }
        6 => {
            if let Some(req) = accepted(bytes, |raw| StatsRequest::parse(raw, &roots).ok()) {
                check_id(&req.id);
                if let Some(path) = &req.volume_path {
                    check_path(path);
                }
            }
        }
        _ => {
            if let Some(req) = accepted(bytes, |raw| NodeExpandRequest::parse(raw, &roots).ok()) {
                check_id(&req.id);
                if let Some(path) = &req.volume_path {
                    check_path(path);
                }
                if let Some(path) = &req.staging_path {
                    check_path(path);
                }
            }
        }
    }
}
