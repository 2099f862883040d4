//! `limit_bytes` is a promise and GetCapacity tells the truth, checked over CSI the same
//! way on every class (the loop class in tests/privileged.rs, LVM and PMEM in
//! tests/vm_backends.rs).

use std::path::Path;

use localvol::proto::csi::v1 as csi;
use tonic::Code;

use super::csi_client::{
    CsiClient, NewVolume, capacity_request, controller_expand_request, mount_capability,
};

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

fn range(required: u64, limit: u64) -> Option<csi::CapacityRange> {
    Some(csi::CapacityRange {
        required_bytes: required as i64,
        limit_bytes: limit as i64,
    })
}

async fn capacity(c: &CsiClient, class: &Class<'_>) -> (u64, u64) {
    let r = c
        .controller()
        .get_capacity(csi::GetCapacityRequest {
            volume_capabilities: vec![mount_capability()],
            ..capacity_request(class.name)
        })
        .await
        .unwrap()
        .into_inner();
    (r.available_capacity as u64, r.maximum_volume_size.unwrap() as u64)
}

async fn create(
    c: &CsiClient,
    class: &Class<'_>,
    name: &str,
    required: u64,
    limit: u64,
) -> Result<(String, u64), tonic::Status> {
    let volume = NewVolume {
        class: class.name,
        ..NewVolume::new(name, 0)
    };
    let v = c
        .create(csi::CreateVolumeRequest {
            capacity_range: range(required, limit),
            ..volume.request()
        })
        .await?;
    Ok((v.volume_id, v.capacity_bytes as u64))
}

async fn delete(c: &CsiClient, id: &str) {
    c.delete(id).await.unwrap();
}

async fn expand(c: &CsiClient, id: &str, required: u64, limit: u64) -> Result<u64, tonic::Status> {
    let r = c
        .controller()
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            capacity_range: range(required, limit),
            volume_capability: Some(mount_capability()),
            ..controller_expand_request(id, 0)
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
    let c = CsiClient::connect(socket).await;
    let (small, large) = (class.small, class.large);

    // A range the class cannot hit exactly: refused, never rounded past the limit.
    refused(
        create(&c, &class, "limits-inexact", small + 1, small + 4096).await,
        Code::OutOfRange,
        &format!("{label}: create in [{}, {}]", small + 1, small + 4096),
    );
    // Exact sizes are given exactly.
    let (id, size) = create(&c, &class, "limits-small", small, small).await.unwrap();
    assert_eq!(size, small, "{label}: create of exactly {small}");
    // Below the current size: volumes never shrink, so no size fits the range.
    refused(
        expand(&c, &id, small / 2, small / 2).await,
        Code::OutOfRange,
        &format!("{label}: expand a {small}-byte volume to at most {}", small / 2),
    );
    refused(
        expand(&c, &id, large + 1, large + 4096).await,
        Code::OutOfRange,
        &format!("{label}: expand in [{}, {}]", large + 1, large + 4096),
    );
    if class.grows {
        assert_eq!(
            expand(&c, &id, large, large).await.unwrap(),
            large,
            "{label}: expand to exactly {large}"
        );
        let (available, _) = capacity(&c, &class).await;
        refused(
            expand(&c, &id, large + available + 1, 0).await,
            // CSI's "unsupported capacity": external-resizer ends it as infeasible
            // instead of retrying a size the node can never hold.
            Code::OutOfRange,
            &format!("{label}: grow by {available} available + 1 byte"),
        );
        let grown = expand(&c, &id, large + available, large + available).await;
        assert_eq!(
            grown.unwrap(),
            large + available,
            "{label}: grow by all {available} available"
        );
    } else {
        refused(
            expand(&c, &id, large, large).await,
            Code::OutOfRange,
            &format!("{label}: this class cannot grow"),
        );
    }
    delete(&c, &id).await;

    // The largest volume GetCapacity promises is made; one byte more is not.
    let (available, max) = capacity(&c, &class).await;
    assert!(
        max > 0 && max <= available,
        "{label}: available {available}, max {max}"
    );
    refused(
        create(&c, &class, "limits-max-plus-one", max + 1, 0).await,
        Code::ResourceExhausted,
        &format!("{label}: create of maximum_volume_size {max} + 1"),
    );
    let (id, size) = create(&c, &class, "limits-max", max, max).await.unwrap();
    assert_eq!(size, max, "{label}: create of exactly maximum_volume_size");
    delete(&c, &id).await;
    eprintln!("limits {label}: sizes {small} and {large} exact, limits kept, largest volume {max} made");
}
