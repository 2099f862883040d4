//! Pure parsers of lvm's JSON reports, as produced by
//! `lvs|vgs --reportformat json --units b --nosuffix -o <FIELDS>`.
//!
//! Every value in these reports is a string, sizes included; a field that does not
//! apply to a row is `""`. Tags are one comma-separated string. See
//! `tests/fixtures/README.md` for the captured outputs these parsers are tested on.

use std::path::PathBuf;

use serde::Deserialize;

/// The options of every report localvol asks lvm for: JSON, sizes in bytes without a unit.
pub const REPORT_FORMAT: [&str; 5] = ["--reportformat", "json", "--units", "b", "--nosuffix"];
/// The LV fields localvol reads (the fixture captures use the same list).
pub const LV_FIELDS: &str = "lv_name,lv_uuid,vg_name,lv_size,lv_attr,lv_tags,pool_lv,data_percent,metadata_percent,lv_path,lv_dm_path";
/// The VG fields localvol reads.
pub const VG_FIELDS: &str = "vg_name,vg_uuid,vg_size,vg_free,vg_extent_size,vg_extent_count,vg_free_count,vg_tags,\
                             vg_attr,vg_missing_pv_count";
/// The fields of the one `lvs` that reports a VG: [`LV_FIELDS`] and, on every row, its
/// VG's [`VG_FIELDS`] (`vg_name` once), so that the report costs one LVM command, not an
/// `lvs` and a `vgs`. A VG without LVs has no row: only then is `vgs` run.
pub const REPORT_FIELDS: &str = "lv_name,lv_uuid,vg_name,lv_size,lv_attr,lv_tags,pool_lv,data_percent,metadata_percent,\
                                 lv_path,lv_dm_path,vg_uuid,vg_size,vg_free,vg_extent_size,vg_extent_count,\
                                 vg_free_count,vg_tags,vg_attr,vg_missing_pv_count";
/// The segment fields read for placing a zeroed extension (`lvs --segments`).
pub const SEG_FIELDS: &str = "lv_name,seg_pe_ranges";

/// One logical volume.
#[derive(Debug, Clone, PartialEq)]
pub struct Lv {
    pub name: String,
    pub vg: String,
    pub size: u64,
    /// The ten `lv_attr` characters (`-wi-a-----`).
    pub attr: String,
    pub tags: Vec<String>,
    /// The thin pool of a thin volume.
    pub pool: Option<String>,
    pub data_percent: Option<f64>,
    /// `/dev/VG/LV`, when lvm reports one (not for pools and hidden LVs).
    pub path: Option<PathBuf>,
}

impl Lv {
    fn attr_at(&self, i: usize) -> char {
        self.attr.chars().nth(i).unwrap_or('-')
    }

    pub fn is_thin_pool(&self) -> bool {
        self.attr_at(0) == 't'
    }

    pub fn is_thin_volume(&self) -> bool {
        self.attr_at(0) == 'V'
    }

    pub fn is_active(&self) -> bool {
        self.attr_at(4) == 'a'
    }

    /// For a thin pool: newly provisioned blocks are zeroed before use.
    pub fn zeroes_new_blocks(&self) -> bool {
        self.attr_at(7) == 'z'
    }

    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| t == tag)
    }
}

/// How full a thin pool is, as lvm reports it (0-100). Kept apart from [`Lv`], whose
/// fields are the record of a volume, because only pools carry these numbers. Both are
/// `None` while the pool is inactive (lvm then prints `""`).
#[derive(Debug, Clone, PartialEq)]
pub struct ThinPool {
    pub name: String,
    pub size: u64,
    pub data_percent: Option<f64>,
    pub metadata_percent: Option<f64>,
}

/// An `lvs` report: every LV, and the thin pools among them with their fill.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LvReport {
    pub lvs: Vec<Lv>,
    pub pools: Vec<ThinPool>,
}

/// One volume group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vg {
    pub name: String,
    pub size: u64,
    pub free: u64,
    pub extent_size: u64,
    pub tags: Vec<String>,
    /// Physical volumes of the VG lvm cannot find (a disk failed or was pulled); the VG
    /// is then partial (`vg_attr`'s fourth character `p`).
    pub missing_pvs: u64,
}

/// One segment of an LV and the physical extents it occupies (`/dev/vda:16-31`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub lv: String,
    pub pe_ranges: Vec<String>,
}

#[derive(Deserialize)]
struct Report<T> {
    report: Vec<T>,
}

#[derive(Deserialize)]
struct LvSection {
    #[serde(default)]
    lv: Vec<RawLv>,
}

#[derive(Deserialize)]
struct VgSection {
    #[serde(default)]
    vg: Vec<RawVg>,
}

#[derive(Deserialize)]
struct SegSection {
    #[serde(default)]
    seg: Vec<RawSeg>,
}

#[derive(Deserialize)]
struct RawLv {
    lv_name: String,
    #[serde(default)]
    vg_name: String,
    lv_size: String,
    lv_attr: String,
    #[serde(default)]
    lv_tags: String,
    #[serde(default)]
    pool_lv: String,
    #[serde(default)]
    data_percent: String,
    #[serde(default)]
    metadata_percent: String,
    #[serde(default)]
    lv_path: String,
    /// Its VG's fields, in the daemon's report ([`REPORT_FIELDS`]) only.
    vg_size: Option<String>,
    vg_free: Option<String>,
    vg_extent_size: Option<String>,
    #[serde(default)]
    vg_tags: String,
    #[serde(default)]
    vg_attr: String,
    #[serde(default)]
    vg_missing_pv_count: String,
}

#[derive(Deserialize)]
struct RawVg {
    vg_name: String,
    vg_size: String,
    vg_free: String,
    vg_extent_size: String,
    #[serde(default)]
    vg_tags: String,
    #[serde(default)]
    vg_attr: String,
    #[serde(default)]
    vg_missing_pv_count: String,
}

#[derive(Deserialize)]
struct RawSeg {
    lv_name: String,
    #[serde(default)]
    seg_pe_ranges: String,
}

fn number(field: &str, value: &str) -> Result<u64, String> {
    value
        .parse()
        .map_err(|_| format!("{field} {value:?} is not a byte count"))
}

fn non_empty(value: String) -> Option<String> {
    (!value.is_empty()).then_some(value)
}

fn tags(value: &str) -> Vec<String> {
    value
        .split(',')
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

fn sections<T: for<'de> Deserialize<'de>>(json: &[u8]) -> Result<Vec<T>, String> {
    serde_json::from_slice::<Report<T>>(json)
        .map(|r| r.report)
        .map_err(|e| e.to_string())
}

fn percent(field: &str, value: &str) -> Result<Option<f64>, String> {
    match value {
        "" => Ok(None),
        p => p
            .parse()
            .map(Some)
            .map_err(|_| format!("{field} {p:?} is not a number")),
    }
}

pub fn parse_lvs(json: &[u8]) -> Result<Vec<Lv>, String> {
    parse_lv_report(json).map(|r| r.lvs)
}

/// The LVs of an `lvs` report, and the thin pools with their data and metadata fill.
pub fn parse_lv_report(json: &[u8]) -> Result<LvReport, String> {
    parse_rows(json, None).map(|(report, _)| report)
}

/// The daemon's one report of VG `vg` (`lvs -o REPORT_FIELDS vg`): its LVs and the VG,
/// from the fields every row repeats; `None` for the VG when no row is of it (it has
/// no LV). One pass over the rows: a thousand LVs are parsed once, not twice.
pub fn parse_report(json: &[u8], vg: &str) -> Result<(LvReport, Option<Vg>), String> {
    parse_rows(json, Some(vg))
}

fn parse_rows(json: &[u8], vg_of_rows: Option<&str>) -> Result<(LvReport, Option<Vg>), String> {
    let mut report = LvReport::default();
    let mut vg = None;
    for section in sections::<LvSection>(json)? {
        for mut raw in section.lv {
            if vg.is_none() && vg_of_rows == Some(raw.vg_name.as_str()) {
                vg = Some(vg_of_row(&mut raw)?);
            }
            let lv = Lv {
                size: number("lv_size", &raw.lv_size)?,
                data_percent: percent("data_percent", &raw.data_percent)?,
                name: raw.lv_name,
                vg: raw.vg_name,
                attr: raw.lv_attr,
                tags: tags(&raw.lv_tags),
                pool: non_empty(raw.pool_lv),
                path: non_empty(raw.lv_path).map(PathBuf::from),
            };
            if lv.is_thin_pool() {
                report.pools.push(ThinPool {
                    name: lv.name.clone(),
                    size: lv.size,
                    data_percent: lv.data_percent,
                    metadata_percent: percent("metadata_percent", &raw.metadata_percent)?,
                });
            }
            report.lvs.push(lv);
        }
    }
    Ok((report, vg))
}

/// The VG fields of an LV's row, which an `lvs` without them lacks.
fn vg_of_row(raw: &mut RawLv) -> Result<Vg, String> {
    let missing = |field: &str| format!("{field} missing from the row of LV {}", raw.lv_name);
    vg_of(RawVg {
        vg_name: raw.vg_name.clone(),
        vg_size: raw.vg_size.take().ok_or_else(|| missing("vg_size"))?,
        vg_free: raw.vg_free.take().ok_or_else(|| missing("vg_free"))?,
        vg_extent_size: raw
            .vg_extent_size
            .take()
            .ok_or_else(|| missing("vg_extent_size"))?,
        vg_tags: std::mem::take(&mut raw.vg_tags),
        vg_attr: std::mem::take(&mut raw.vg_attr),
        vg_missing_pv_count: std::mem::take(&mut raw.vg_missing_pv_count),
    })
}

pub fn parse_vgs(json: &[u8]) -> Result<Vec<Vg>, String> {
    let mut vgs = Vec::new();
    for section in sections::<VgSection>(json)? {
        for raw in section.vg {
            vgs.push(vg_of(raw)?);
        }
    }
    Ok(vgs)
}

fn vg_of(raw: RawVg) -> Result<Vg, String> {
    let counted = match raw.vg_missing_pv_count.as_str() {
        "" => 0,
        n => number("vg_missing_pv_count", n)?,
    };
    // A partial VG whose count lvm did not give still misses one at least.
    let partial = raw.vg_attr.chars().nth(3) == Some('p');
    Ok(Vg {
        size: number("vg_size", &raw.vg_size)?,
        free: number("vg_free", &raw.vg_free)?,
        extent_size: number("vg_extent_size", &raw.vg_extent_size)?,
        tags: tags(&raw.vg_tags),
        missing_pvs: if partial { counted.max(1) } else { counted },
        name: raw.vg_name,
    })
}

pub fn parse_segments(json: &[u8]) -> Result<Vec<Segment>, String> {
    let mut segments = Vec::new();
    for section in sections::<SegSection>(json)? {
        for raw in section.seg {
            segments.push(Segment {
                pe_ranges: raw.seg_pe_ranges.split_whitespace().map(str::to_string).collect(),
                lv: raw.lv_name,
            });
        }
    }
    Ok(segments)
}

/// The device-mapper name LVM gives `vg/lv`: each name with its `-` doubled, joined by
/// one `-`.
pub fn dm_name(vg: &str, lv: &str) -> String {
    format!("{}-{}", vg.replace('-', "--"), lv.replace('-', "--"))
}

/// How many of the device-mapper devices `names` are LVs of VG `vg`, by
/// [`dm_name`]'s rule: `a--b-x` is LV `x` of VG `a-b`, not of `a` (an LV name never
/// starts with `-`).
pub fn lvs_of_vg_in(vg: &str, names: &[String]) -> usize {
    let prefix = dm_name(vg, "");
    names
        .iter()
        .filter(|n| {
            n.strip_prefix(&prefix)
                .is_some_and(|lv| !lv.is_empty() && !lv.starts_with('-'))
        })
        .count()
}

/// From `dmsetup status` of a thin LV (`<start> <length> thin <mapped sectors>
/// <highest mapped sector>`), the sectors it has mapped in its pool; `None` for any
/// other line, and for a device of more than one segment.
pub fn parse_thin_mapped_sectors(status: &str) -> Option<u64> {
    let mut lines = status.lines().filter(|l| !l.trim().is_empty());
    let line = lines.next()?;
    if lines.next().is_some() {
        return None;
    }
    let fields: Vec<&str> = line.split_ascii_whitespace().collect();
    match fields.as_slice() {
        [_, _, "thin", mapped, ..] => mapped.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/lvm/",
                $name
            ))
        };
    }

    #[test]
    fn lvs_report_of_a_vg_with_thick_thin_and_pool() {
        let lvs = parse_lvs(fixture!("lvs.json")).unwrap();
        let names: Vec<_> = lvs.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["pool0", "thick1", "thin1", "thin2"]);

        let pool = &lvs[0];
        assert!(pool.is_thin_pool() && pool.zeroes_new_blocks() && pool.is_active());
        assert_eq!(pool.size, 1 << 30);
        assert_eq!(pool.path, None, "pools have no /dev/VG/LV");
        assert_eq!(pool.data_percent, Some(6.25));

        let thick = &lvs[1];
        assert_eq!(thick.vg, "vg1");
        assert_eq!(thick.size, 256 << 20);
        assert!(!thick.is_thin_pool() && !thick.is_thin_volume() && thick.is_active());
        assert_eq!(
            thick.tags,
            [
                "localvol.csi.dev/name=pvc-1234",
                "localvol.csi.dev/namespace=default"
            ]
        );
        assert!(thick.has_tag("localvol.csi.dev/name=pvc-1234"));
        assert_eq!(thick.pool, None);
        assert_eq!(thick.data_percent, None, "\"\" for thick LVs");
        assert_eq!(
            thick.path.as_deref(),
            Some(std::path::Path::new("/dev/vg1/thick1"))
        );

        let thin = &lvs[2];
        assert!(thin.is_thin_volume());
        assert_eq!(thin.pool.as_deref(), Some("pool0"));
        assert_eq!(thin.size, 512 << 20);
        assert_eq!(thin.data_percent, Some(12.5));
        assert!(lvs[3].tags.is_empty());
    }

    #[test]
    fn thin_pools_carry_data_and_metadata_fill() {
        for fixture in [&fixture!("lvs.json")[..], &fixture!("lvs-a.json")[..]] {
            let report = parse_lv_report(fixture).unwrap();
            // Only the pool: thin and thick LVs, and the pool's hidden sub-LVs
            // ([pool0_tdata] is `T`, not `t`), have no pool fill.
            assert_eq!(
                report.pools,
                [ThinPool {
                    name: "pool0".into(),
                    size: 1 << 30,
                    data_percent: Some(6.25),
                    metadata_percent: Some(12.01),
                }]
            );
            assert_eq!(report.lvs, parse_lvs(fixture).unwrap());
        }
        let inactive = br#"{"report":[{"lv":[{"lv_name":"p","lv_size":"4194304","lv_attr":"twi---tz--","data_percent":"","metadata_percent":""}]}]}"#;
        let pools = parse_lv_report(inactive).unwrap().pools;
        assert_eq!((pools[0].data_percent, pools[0].metadata_percent), (None, None));
        let bad = br#"{"report":[{"lv":[{"lv_name":"p","lv_size":"4194304","lv_attr":"twi-aotz--","data_percent":"1.00","metadata_percent":"x"}]}]}"#;
        assert!(parse_lv_report(bad).unwrap_err().contains("metadata_percent"));
    }

    #[test]
    fn hidden_lvs_are_reported_with_brackets() {
        let lvs = parse_lvs(fixture!("lvs-a.json")).unwrap();
        assert_eq!(lvs.len(), 7);
        let hidden: Vec<_> = lvs.iter().filter(|l| l.name.starts_with('[')).collect();
        assert_eq!(hidden.len(), 3);
        assert!(hidden.iter().all(|l| l.path.is_none()));
    }

    #[test]
    fn empty_and_missing_vg_reports_have_no_lvs() {
        assert_eq!(parse_lvs(fixture!("lvs-empty.json")).unwrap(), []);
        // lvs still prints an empty report on stdout when the VG does not exist; the
        // exit status (5) is what tells the two apart.
        assert_eq!(parse_lvs(fixture!("lvs-missing-vg.stdout")).unwrap(), []);
    }

    #[test]
    fn vgs_report() {
        let vgs = parse_vgs(fixture!("vgs.json")).unwrap();
        assert_eq!(vgs.len(), 2);
        assert_eq!(
            vgs[0],
            Vg {
                name: "vg1".into(),
                size: 4290772992,
                free: 2940207104,
                extent_size: 4 << 20,
                tags: vec!["localvol.csi.dev/node=node-1".into()],
                missing_pvs: 0,
            }
        );
        assert_eq!(vgs[1].free, vgs[1].size);
        assert!(vgs[1].tags.is_empty());
    }

    #[test]
    fn the_report_fields_are_the_lv_fields_and_the_vg_fields() {
        let vg_fields = VG_FIELDS.split(',').filter(|f| *f != "vg_name");
        let joined: Vec<&str> = LV_FIELDS.split(',').chain(vg_fields).collect();
        assert_eq!(REPORT_FIELDS.split(',').collect::<Vec<_>>(), joined);
    }

    /// The daemon's one `lvs` (tests/fixtures/README.md, `report*`): its LVs are what
    /// the LV fields alone give, and its VG what `vgs` says.
    #[test]
    fn the_report_carries_its_vg_on_every_row() {
        let json = fixture!("report.json");
        let (report, vg) = parse_report(json, "vg1").unwrap();
        let vg = vg.unwrap();
        assert_eq!(vg, parse_vgs(fixture!("report-vgs.json")).unwrap()[0]);
        assert_eq!(vg.tags, ["localvol.csi.dev/node=node-1"]);
        assert_eq!(report, parse_lv_report(json).unwrap());
        let names: Vec<&str> = report.lvs.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["pool0", "thick1", "thin1", "thin2"]);
        assert_eq!(report.pools.len(), 1);
        // Another VG's rows say nothing of this one; a VG without LVs has none.
        assert_eq!(parse_report(json, "vg2").unwrap().1, None);
        let (empty, none) = parse_report(fixture!("report-empty.json"), "vg2").unwrap();
        assert!(empty.lvs.is_empty() && none.is_none());
        // An lvs without the VG fields is an error, not a VG of zero bytes.
        let lv_only = parse_report(fixture!("lvs.json"), "vg1").unwrap_err();
        assert!(lv_only.contains("vg_size missing"), "{lv_only}");
    }

    #[test]
    fn the_report_counts_a_vg_s_missing_pvs() {
        let vg = |json, name| parse_report(json, name).unwrap().1.unwrap();
        let whole = vg(fixture!("report-whole.json"), "vg3");
        assert_eq!(whole.missing_pvs, 0);
        let partial = vg(fixture!("report-missing-pv.stdout"), "vg3");
        assert_eq!(partial.missing_pvs, 1);
        assert_eq!(
            (partial.size, partial.extent_size),
            (whole.size, whole.extent_size)
        );
    }

    #[test]
    fn segments_report() {
        let segs = parse_segments(fixture!("lvs-segments.json")).unwrap();
        assert!(!segs.is_empty());
        for seg in &segs {
            assert!(!seg.pe_ranges.is_empty(), "{seg:?}");
            for range in &seg.pe_ranges {
                let (pv, extents) = range.rsplit_once(':').unwrap();
                assert!(pv.starts_with("/dev/"), "{range}");
                let (start, end) = extents.split_once('-').unwrap();
                assert!(start.parse::<u64>().unwrap() <= end.parse::<u64>().unwrap());
            }
        }
    }

    #[test]
    fn malformed_reports_are_errors_not_empty_lists() {
        assert!(parse_lvs(b"").is_err());
        assert!(parse_lvs(b"{\"report\": [{\"lv\": [{\"lv_name\": \"a\"}]}]}").is_err());
        let bad_size = br#"{"report":[{"lv":[{"lv_name":"a","lv_size":"12.5","lv_attr":"-wi-a-----"}]}]}"#;
        assert!(parse_lvs(bad_size).unwrap_err().contains("lv_size"));
        assert!(parse_vgs(b"[]").is_err());
    }

    #[test]
    fn thin_status_gives_the_mapped_sectors() {
        // Captured in the tests/vm guest: a fresh thin LV, then one after a 4 KiB write.
        assert_eq!(parse_thin_mapped_sectors("0 524288 thin 0 -\n"), Some(0));
        assert_eq!(parse_thin_mapped_sectors("0 524288 thin 128 127\n"), Some(128));
        assert_eq!(parse_thin_mapped_sectors("0 524288 thin Fail\n"), None);
        assert_eq!(parse_thin_mapped_sectors("0 524288 linear\n"), None);
        assert_eq!(parse_thin_mapped_sectors(""), None);
        assert_eq!(
            parse_thin_mapped_sectors("0 8 thin 0 -\n8 8 thin 0 -\n"),
            None,
            "two segments are not one thin LV"
        );
    }

    #[test]
    fn dm_names_double_the_dashes() {
        assert_eq!(dm_name("vg-data", "csi-a_b"), "vg--data-csi--a_b");
        assert_eq!(dm_name("vg", "lv"), "vg-lv");
    }
}
