//! `limit_bytes` is a promise and GetCapacity tells the truth, checked over CSI the same
//! way on every class (the loop class in tests/privileged.rs, LVM and PMEM in
//! tests/vm_backends.rs).

use std::collections::HashMap;
use std::path::Path;

use localvol::proto::csi::v1 as csi;
use tonic::Code;
use tonic::transport::Channel;

use super::{connect, mount_capability};

type Controller = csi::controller_client::ControllerClient<Channel>;

/// One device class as the check sees it.
pub struct Class<'a> {
    /// The StorageClass parameter, or `None` for the daemon's default class.
    pub name: Option<&'a str>,
    /// Two sizes the class holds exactly, `small < large` (whole extents, an fsdax
    /// namespace's usable size, whole MiB for loop).
    pub small: u64,
    pub large: u64,
    /// False for a class whose volumes cannot grow (pmem direct).
    pub grows: bool,
}

fn parameters(class: &Class) -> HashMap<String, String> {
    class
        .name
        .map(|c| ("localvol.csi.dev/device-class".to_string(), c.to_string()))
        .into_iter()
        .collect()
}

fn range(required: u64, limit: u64) -> Option<csi::CapacityRange> {
    Some(csi::CapacityRange {
        required_bytes: required as i64,
        limit_bytes: limit as i64,
    })
}

async fn capacity(c: &mut Controller, class: &Class<'_>) -> (u64, u64) {
    let r = c
        .get_capacity(csi::GetCapacityRequest {
            volume_capabilities: vec![mount_capability()],
            parameters: parameters(class),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (r.available_capacity as u64, r.maximum_volume_size.unwrap() as u64)
}

async fn create(
    c: &mut Controller,
    class: &Class<'_>,
    name: &str,
    required: u64,
    limit: u64,
) -> Result<(String, u64), tonic::Status> {
    let v = c
        .create_volume(csi::CreateVolumeRequest {
            name: name.to_string(),
            capacity_range: range(required, limit),
            volume_capabilities: vec![mount_capability()],
            parameters: parameters(class),
            ..Default::default()
        })
        .await?
        .into_inner()
        .volume
        .unwrap();
    Ok((v.volume_id, v.capacity_bytes as u64))
}

async fn delete(c: &mut Controller, id: &str) {
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: id.to_string(),
        ..Default::default()
    })
    .await
    .unwrap();
}

async fn expand(c: &mut Controller, id: &str, required: u64, limit: u64) -> Result<u64, tonic::Status> {
    let r = c
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: id.to_string(),
            capacity_range: range(required, limit),
            volume_capability: Some(mount_capability()),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(r.capacity_bytes as u64)
}

fn refused(r: Result<impl std::fmt::Debug, tonic::Status>, code: Code, what: &str) {
    match r {
        Ok(v) => panic!("{what}: succeeded with {v:?}, expected {code:?}"),
        Err(s) => assert_eq!(s.code(), code, "{what}: {}", s.message()),
    }
}

/// CreateVolume and ControllerExpandVolume never exceed `limit_bytes` (OUT_OF_RANGE when
/// the class cannot stay within it), and GetCapacity's `maximum_volume_size` is exactly
/// the largest volume CreateVolume makes: that size succeeds, one byte more is
/// RESOURCE_EXHAUSTED; the same for growing by what `available_capacity` says.
pub async fn check(socket: &Path, class: Class<'_>) {
    let label = class.name.unwrap_or("default");
    let mut c = Controller::new(connect(socket).await);
    let (small, large) = (class.small, class.large);

    // A range the class cannot hit exactly: refused, never rounded past the limit.
    refused(
        create(&mut c, &class, "limits-inexact", small + 1, small + 4096).await,
        Code::OutOfRange,
        &format!("{label}: create in [{}, {}]", small + 1, small + 4096),
    );
    // Exact sizes are given exactly.
    let (id, size) = create(&mut c, &class, "limits-small", small, small)
        .await
        .unwrap();
    assert_eq!(size, small, "{label}: create of exactly {small}");
    // Below the current size: volumes never shrink, so no size fits the range.
    refused(
        expand(&mut c, &id, small / 2, small / 2).await,
        Code::OutOfRange,
        &format!("{label}: expand a {small}-byte volume to at most {}", small / 2),
    );
    refused(
        expand(&mut c, &id, large + 1, large + 4096).await,
        Code::OutOfRange,
        &format!("{label}: expand in [{}, {}]", large + 1, large + 4096),
    );
    if class.grows {
        assert_eq!(
            expand(&mut c, &id, large, large).await.unwrap(),
            large,
            "{label}: expand to exactly {large}"
        );
        let (available, _) = capacity(&mut c, &class).await;
        refused(
            expand(&mut c, &id, large + available + 1, 0).await,
            // CSI's "unsupported capacity": external-resizer ends it as infeasible
            // instead of retrying a size the node can never hold.
            Code::OutOfRange,
            &format!("{label}: grow by {available} available + 1 byte"),
        );
        let grown = expand(&mut c, &id, large + available, large + available).await;
        assert_eq!(
            grown.unwrap(),
            large + available,
            "{label}: grow by all {available} available"
        );
    } else {
        refused(
            expand(&mut c, &id, large, large).await,
            Code::OutOfRange,
            &format!("{label}: this class cannot grow"),
        );
    }
    delete(&mut c, &id).await;

    // The largest volume GetCapacity promises is made; one byte more is not.
    let (available, max) = capacity(&mut c, &class).await;
    assert!(
        max > 0 && max <= available,
        "{label}: available {available}, max {max}"
    );
    refused(
        create(&mut c, &class, "limits-max-plus-one", max + 1, 0).await,
        Code::ResourceExhausted,
        &format!("{label}: create of maximum_volume_size {max} + 1"),
    );
    let (id, size) = create(&mut c, &class, "limits-max", max, max).await.unwrap();
    assert_eq!(size, max, "{label}: create of exactly maximum_volume_size");
    delete(&mut c, &id).await;
    eprintln!("limits {label}: sizes {small} and {large} exact, limits kept, largest volume {max} made");
}
