//! Pure functions over ndctl: its JSON output, its error text, and the size rules of
//! fsdax namespaces (see `tests/fixtures/README.md`, "Alignment and usable size").

use serde::Deserialize;

/// A region and, when listed with `-N`, its namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Region {
    pub dev: String,
    pub size: u64,
    /// Namespace sizes must be multiples of this (16 MiB on x86).
    #[serde(default)]
    pub align: u64,
    #[serde(default)]
    pub available_size: u64,
    /// The largest size one new namespace can have.
    #[serde(default)]
    pub max_available_extent: u64,
    #[serde(default)]
    pub namespaces: Vec<Namespace>,
    /// `disabled` while the region's driver is unbound (`ndctl disable-region`, or a
    /// region the kernel could not enable); absent while it is enabled. A disabled
    /// region lists no namespaces: they and their block devices are gone until it is
    /// enabled again.
    #[serde(default)]
    pub state: Option<String>,
    /// The media errors the platform reported in the region (its `badblocks` in sysfs);
    /// absent when there are none.
    #[serde(default)]
    pub badblock_count: u64,
    /// Set when our own create or destroy was applied to a cached report: the
    /// namespaces are exact, the free sizes are not (ndctl picks where a namespace goes).
    #[serde(skip)]
    pub sizes_unknown: bool,
}

impl Region {
    pub fn is_disabled(&self) -> bool {
        self.state.as_deref() == Some("disabled")
    }

    /// The listing after our `create-namespace` made `ns` (as it printed it).
    pub fn created(&mut self, ns: Namespace) {
        self.namespaces.retain(|n| n.dev != ns.dev);
        self.namespaces.push(ns);
        self.sizes_unknown = true;
    }

    /// The listing after our `destroy-namespace` of `dev`.
    pub fn destroyed(&mut self, dev: &str) {
        self.namespaces.retain(|n| n.dev != dev);
        self.sizes_unknown = true;
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Namespace {
    /// `namespace0.1`: what ndctl commands take.
    pub dev: String,
    pub mode: String,
    /// For an enabled fsdax namespace, the usable size (also its block device's size).
    /// Absent, read as 0, for an fsdax namespace left disabled by an interrupted
    /// `ndctl create-namespace`.
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub name: Option<String>,
    /// `pmem0.1`: the block device below /dev, absent while the namespace is disabled.
    #[serde(default)]
    pub blockdev: Option<String>,
    #[serde(default)]
    pub state: Option<String>,
    /// All zeros unless a uuid was written; see [`Namespace::is_setup_interrupted`].
    #[serde(default)]
    pub uuid: Option<String>,
}

impl Namespace {
    /// A region's idle seed: raw, of size 0, holding no storage. The kernel leaves a
    /// destroyed namespace as one that keeps its label's name, so a seed may carry the
    /// name of a volume that is gone.
    pub fn is_idle_seed(&self) -> bool {
        self.mode == "raw" && self.size == 0
    }

    /// An idle namespace whose setup an interrupted `ndctl create-namespace` left
    /// midway: its uuid (and often its name) written, its size not. It holds no
    /// storage, but while the region has no other namespace the kernel refuses to give
    /// it a new uuid (EBUSY), so every create that ndctl sends to it fails, until its
    /// size is written as 0 again (`ndctl destroy-namespace`), which forgets the uuid.
    pub fn is_setup_interrupted(&self) -> bool {
        self.is_idle_seed()
            && self
                .uuid
                .as_deref()
                .is_some_and(|u| u.chars().any(|c| c != '0' && c != '-'))
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Listing {
    Wrapped { regions: Vec<Region> },
    Many(Vec<Region>),
    One(Region),
}

/// Parses `ndctl list -R [-N] [-i] [-r REGION]` in each shape ndctl prints: nothing
/// at all when nothing matched, `{"regions":[...]}` with namespaces, a bare array, or
/// (older ndctl) a bare object for a single match.
pub fn parse_regions(output: &[u8]) -> Result<Vec<Region>, String> {
    if output.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    match serde_json::from_slice::<Listing>(output) {
        Ok(Listing::Wrapped { regions } | Listing::Many(regions)) => Ok(regions),
        Ok(Listing::One(region)) => Ok(vec![region]),
        Err(e) => Err(format!("not an ndctl region listing: {e}")),
    }
}

/// Parses what `ndctl create-namespace` prints: the new namespace.
pub fn parse_namespace(output: &[u8]) -> Result<Namespace, String> {
    serde_json::from_slice(output).map_err(|e| format!("not an ndctl namespace: {e}"))
}

/// Classifiers of ndctl's error text (its exit codes are unreliable).
pub mod stderr {
    pub fn is_no_space(s: &str) -> bool {
        s.contains("No space left on device")
    }

    pub fn is_busy(s: &str) -> bool {
        s.contains("Device or resource busy")
    }

    pub fn is_missing(s: &str) -> bool {
        s.contains("No such device or address")
    }
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Alignment of the data area in an fsdax namespace (ndctl's default on x86).
pub const FSDAX_ALIGN: u64 = 2 * MIB;

/// The usable bytes of an fsdax namespace of `raw` bytes with `--map=dev`: the raw
/// size minus the info block (8 KiB) and the struct-page array (64 bytes per 4 KiB
/// page) placed on the namespace itself, rounded up to the 2 MiB data alignment.
pub fn fsdax_usable(raw: u64) -> u64 {
    if raw <= 8 * KIB {
        return 0;
    }
    let reserve = (8 * KIB + (raw - 8 * KIB) / 64).div_ceil(FSDAX_ALIGN) * FSDAX_ALIGN;
    raw.saturating_sub(reserve)
}

/// The smallest multiple of `align` whose fsdax namespace offers at least `usable`.
pub fn raw_for_usable(usable: u64, align: u64) -> u64 {
    // The reserve exceeds raw / 64, so fsdax_usable(raw) < raw × 63/64: every raw below
    // usable × 64/63 offers less than `usable`. Starting there leaves only the reserve's
    // 2 MiB rounding to step over, instead of one step per `align` of the reserve.
    let lower_bound = usable + usable / 63;
    let mut raw = (lower_bound / align).max(1) * align;
    while fsdax_usable(raw) < usable {
        raw += align;
    }
    raw
}

/// The largest multiple of `align` whose fsdax namespace offers at most `usable`.
pub fn raw_within(usable: u64, align: u64) -> Option<u64> {
    let mut raw = raw_for_usable(usable, align);
    while fsdax_usable(raw) > usable {
        raw = raw.checked_sub(align).filter(|r| *r > 0)?;
    }
    Some(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/ndctl/",
                $name
            ))
        };
    }

    #[test]
    fn usable_sizes_match_the_kernel() {
        // Every `map=dev` line of sizes.txt: requested raw size and the block device size.
        let sizes = std::str::from_utf8(fixture!("sizes.txt")).unwrap();
        let mut checked = 0;
        for line in sizes.lines().filter(|l| !l.starts_with('#')) {
            let f: Vec<_> = line.split_whitespace().collect();
            if f[1] != "dev" {
                continue;
            }
            let raw: u64 = f[2].parse().unwrap();
            let blockdev: u64 = f[4].parse().unwrap();
            assert_eq!(fsdax_usable(raw), blockdev, "{line}");
            checked += 1;
        }
        assert_eq!(checked, 5);
        assert_eq!(fsdax_usable(0), 0);
    }

    #[test]
    fn raw_sizes_are_aligned_and_never_short() {
        let align = 16 * MIB;
        assert_eq!(raw_for_usable(62 * MIB, align), 64 * MIB);
        assert_eq!(raw_for_usable(63 * MIB, align), 80 * MIB);
        assert_eq!(raw_for_usable(1, align), 16 * MIB);
        for usable in [1, 14 * MIB, 100 * MIB, 300_000_000, 1 << 30, 100 << 30] {
            let raw = raw_for_usable(usable, align);
            assert_eq!(raw % align, 0);
            assert!(fsdax_usable(raw) >= usable, "{usable}");
            assert!(fsdax_usable(raw - align) < usable, "{usable}: smallest");
        }
        // A 64 TiB namespace in a few steps, the same answer as stepping from `usable`.
        let usable = 64 << 40;
        let raw = raw_for_usable(usable, 2 * MIB);
        assert!(fsdax_usable(raw) >= usable && fsdax_usable(raw - 2 * MIB) < usable);
        assert_eq!(raw_for_usable(0, align), align);
        assert_eq!(raw_within(100 * MIB, align), Some(96 * MIB));
        assert_eq!(fsdax_usable(96 * MIB), 94 * MIB);
        assert_eq!(raw_within(10 * MIB, align), None);
    }

    #[test]
    fn a_namespace_left_by_a_killed_create_parses_and_is_not_a_seed() {
        let listed: Vec<Namespace> =
            serde_json::from_slice(fixture!("list-Ni-after-killed-create.json")).unwrap();
        let (seed, half_made) = (&listed[0], &listed[1]);
        assert!(seed.is_idle_seed());
        assert_eq!(half_made.name.as_deref(), Some("pvc-crash-pmem-1"));
        assert_eq!((half_made.mode.as_str(), half_made.size), ("fsdax", 0));
        assert_eq!(half_made.state.as_deref(), Some("disabled"));
        assert!(!half_made.is_idle_seed(), "it holds storage: destroy it on retry");
    }

    #[test]
    fn a_namespace_left_mid_setup_is_told_from_a_seed() {
        let r = &parse_regions(fixture!("list-RNi-setup-interrupted.json")).unwrap()[0];
        let (seed, interrupted) = (&r.namespaces[0], &r.namespaces[1]);
        assert!(seed.is_idle_seed() && !seed.is_setup_interrupted());
        assert_eq!(interrupted.name.as_deref(), Some("killed-midway"));
        assert!(interrupted.is_idle_seed() && interrupted.is_setup_interrupted());
        // ndctl's own cleanup after the failed create forgets the uuid: a seed again.
        let after = &parse_regions(fixture!("list-RNi-after-failed-create.json")).unwrap()[0];
        assert!(after.namespaces.iter().all(|n| !n.is_setup_interrupted()));
        let busy = std::str::from_utf8(fixture!("create-namespace-setup-interrupted.txt")).unwrap();
        assert!(stderr::is_busy(busy), "{busy}");
        // Every seed of the other listings is idle and clean.
        for listing in [
            &fixture!("list-RNi-region0-two-namespaces.json")[..],
            fixture!("list-RNi-region0-empty.json"),
        ] {
            let r = &parse_regions(listing).unwrap()[0];
            assert!(r.namespaces.iter().all(|n| !n.is_setup_interrupted()));
        }
    }

    #[test]
    fn region_listings_in_every_shape() {
        let two = parse_regions(fixture!("list-RNi-region0-two-namespaces.json")).unwrap();
        assert_eq!(two.len(), 1);
        let r = &two[0];
        assert_eq!((r.dev.as_str(), r.size, r.align), ("region0", 1 << 30, 16 * MIB));
        assert_eq!(r.available_size, 872415232);
        assert_eq!(r.max_available_extent, 872415232);
        assert_eq!(r.namespaces.len(), 3);
        let seed = &r.namespaces[0];
        assert_eq!(
            (seed.size, seed.name.as_deref(), seed.blockdev.as_deref()),
            (0, None, None)
        );
        assert_eq!(seed.state.as_deref(), Some("disabled"));
        let named = r
            .namespaces
            .iter()
            .find(|n| n.name.as_deref() == Some("myname"))
            .unwrap();
        assert_eq!(named.dev, "namespace0.0");
        assert_eq!(named.blockdev.as_deref(), Some("pmem0"));
        assert_eq!(named.size, 65011712);
        assert_eq!(named.mode, "fsdax");

        let empty = parse_regions(fixture!("list-RNi-region0-empty.json")).unwrap();
        assert_eq!(empty[0].available_size, 1 << 30);
        let fresh = parse_regions(fixture!("list-RNi-uninitialized-labels.json")).unwrap();
        assert_eq!(fresh[0].available_size, 0);
        assert_eq!(fresh[0].namespaces[0].mode, "raw");

        let disabled = parse_regions(fixture!("list-RNi-region0-disabled.json")).unwrap();
        assert!(disabled[0].is_disabled() && !r.is_disabled());
        assert_eq!((disabled[0].namespaces.len(), disabled[0].badblock_count), (0, 0));
        assert!(
            disabled[0].available_size > 0,
            "free sizes are still listed, yet unusable"
        );

        // `ndctl disable-namespace`: listed raw, at its raw size, with its name and no
        // block device.
        let one_off = parse_regions(fixture!("list-RNi-namespace-disabled.json")).unwrap();
        assert!(!one_off[0].is_disabled());
        let off = one_off[0]
            .namespaces
            .iter()
            .find(|n| n.name.as_deref() == Some("myname"))
            .unwrap();
        assert_eq!(
            (
                off.dev.as_str(),
                off.mode.as_str(),
                off.state.as_deref(),
                off.blockdev.as_deref()
            ),
            ("namespace0.0", "raw", Some("disabled"), None)
        );
        assert_eq!(off.size, 64 << 20);

        let bare = parse_regions(fixture!("list-R-two-namespaces.json")).unwrap();
        assert_eq!(bare[0].namespaces, []);
        assert_eq!(
            parse_regions(fixture!("list-RNi-missing-region.json")).unwrap(),
            []
        );
        let one = br#"{"dev":"region1","size":1073741824,"align":16777216}"#;
        assert_eq!(parse_regions(one).unwrap()[0].dev, "region1");
        assert!(parse_regions(b"Error: bogus").is_err());
    }

    #[test]
    fn created_namespaces() {
        let ns = parse_namespace(fixture!("create-namespace-myname.json")).unwrap();
        assert_eq!(ns.name.as_deref(), Some("myname"));
        assert_eq!(ns.blockdev.as_deref(), Some("pmem0"));
        assert_eq!(ns.size, fsdax_usable(64 * MIB));
        let unnamed = parse_namespace(fixture!("create-namespace-unnamed.json")).unwrap();
        assert_eq!(unnamed.name, None);
        assert_eq!(unnamed.blockdev.as_deref(), Some("pmem0.1"));
    }

    #[test]
    fn error_text_is_classified() {
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
        assert!(stderr::is_no_space(&text(fixture!(
            "create-namespace-no-space.txt"
        ))));
        assert!(stderr::is_busy(&text(fixture!("destroy-namespace-busy.txt"))));
        assert!(stderr::is_missing(&text(fixture!(
            "destroy-namespace-missing.txt"
        ))));
        let misaligned = text(fixture!("create-namespace-misaligned.txt"));
        assert!(!stderr::is_no_space(&misaligned) && !stderr::is_busy(&misaligned));
    }
}
