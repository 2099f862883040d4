//! What the region's listing says about the health of a PMEM class, at no cost of its
//! own: the class reads `ndctl list -R -N -i` for its namespaces and free space anyway,
//! and the same listing carries the two region-wide signals:
//! - `state: disabled`: the region's driver is unbound, so its namespaces and their
//!   block devices are gone. No volume of the class can be reached, and none can be
//!   made, until it is enabled again;
//! - `badblock_count`: media errors the platform found in the region. Reads of the
//!   bytes they cover fail with EIO in whichever namespace holds them; each volume's
//!   own share shows in its block device's `badblocks` (see `PmemBackend::volume_health`).

use super::ndctl::Region;
use crate::backend::StorageHealth;

/// Why one namespace's volume is out of reach, and the way back.
pub fn namespace_disabled(namespace: &str) -> String {
    format!(
        "its namespace {namespace} is disabled, so its block device is gone: `ndctl enable-namespace \
         {namespace}` brings it back, then unpublish and publish the volume again"
    )
}

/// Why the region is out of reach, and the way back.
pub fn disabled(region: &str) -> String {
    format!(
        "PMEM region {region} is disabled: its namespaces and their block devices are gone, so \
         its volumes cannot be reached and it takes no new volume until it is enabled again \
         (ndctl enable-region {region})"
    )
}

/// The class's storage as the region's listing shows it: critical while the region is
/// disabled, degraded while it holds media errors.
pub fn region_health(region: &Region) -> StorageHealth {
    if region.is_disabled() {
        return StorageHealth::Critical(disabled(&region.dev));
    }
    match region.badblock_count {
        0 => StorageHealth::Healthy,
        n => StorageHealth::Degraded(format!(
            "PMEM region {} has {n} bad block{} (media errors the platform reported): reads of \
             them fail in the namespaces that hold them; `ndctl list -M -N -r {}` names those, \
             whose volumes are reported abnormal",
            region.dev,
            if n == 1 { "" } else { "s" },
            region.dev
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::pmem::ndctl::parse_regions;

    fn region(json: &str) -> Region {
        parse_regions(json.as_bytes()).unwrap().remove(0)
    }

    #[test]
    fn an_enabled_region_without_media_errors_is_healthy() {
        let r = region(r#"{"dev":"region0","size":1073741824,"align":16777216}"#);
        assert_eq!(region_health(&r), StorageHealth::Healthy);
    }

    #[test]
    fn a_disabled_region_is_critical_and_says_how_to_enable_it() {
        let r = region(r#"{"dev":"region0","size":1073741824,"align":16777216,"state":"disabled"}"#);
        assert!(r.is_disabled());
        let StorageHealth::Critical(why) = region_health(&r) else {
            panic!("{:?}", region_health(&r));
        };
        assert!(why.starts_with("PMEM region region0 is disabled"), "{why}");
        assert!(why.ends_with("(ndctl enable-region region0)"), "{why}");
    }

    #[test]
    fn media_errors_in_the_region_degrade_it() {
        let r = region(r#"{"dev":"region1","size":1073741824,"badblock_count":3}"#);
        assert_eq!(
            region_health(&r),
            StorageHealth::Degraded(
                "PMEM region region1 has 3 bad blocks (media errors the platform reported): reads \
                 of them fail in the namespaces that hold them; `ndctl list -M -N -r region1` \
                 names those, whose volumes are reported abnormal"
                    .to_string()
            )
        );
        let one = region(r#"{"dev":"region1","size":1073741824,"badblock_count":1}"#);
        assert!(
            region_health(&one)
                .reason()
                .unwrap()
                .contains("has 1 bad block (")
        );
    }
}
