//! What the cached LVM report says about the health of a thin pool and of a volume's
//! LV, at no cost of its own: no command runs for it. Two signals, both in the report
//! every class reads anyway:
//! - `lv_attr`'s ninth character, lvm's own verdict (lvs(8)): an LV partial (a PV of its
//!   VG is missing), in need of a refresh, with mismatching RAID images; a thin pool
//!   failed, out of data space, or with read-only metadata;
//! - a thin pool's data and metadata fill, against the class's thresholds: past the
//!   critical one a pool takes no new volume (a create would fail in lvcreate, or fill
//!   the pool for the volumes already in it) and its volumes are reported abnormal,
//!   before their writes fail.

use super::report::{Lv, ThinPool, Vg};
use crate::config::PoolThresholds;

/// lvm's verdict on an LV, from `lv_attr`'s ninth character, when it is bad news. `w`
/// (write-mostly) is a setting, not a failure.
pub fn attr_problem(lv: &Lv) -> Option<&'static str> {
    match lv.attr.chars().nth(8)? {
        'p' => Some("partial: a physical volume of its volume group is missing"),
        'r' => Some("needs a refresh (lvchange --refresh): a device below it failed and came back"),
        'm' => Some("its RAID images mismatch"),
        'F' => Some("failed"),
        'D' => Some("out of data space"),
        'M' => Some("its metadata is read-only"),
        'X' => Some("of unknown health: lvm cannot read its state"),
        _ => None,
    }
}

/// A thin pool's state, for new volumes and for the volumes in it.
#[derive(Debug, Clone, PartialEq)]
pub enum PoolHealth {
    Healthy,
    /// Data or metadata at or past the warning threshold: said, nothing refused.
    Warning(String),
    /// Failed, out of data space, metadata read-only, or a fill at or past the critical
    /// threshold: the pool takes no new volume, and its volumes are abnormal.
    Critical(String),
}

impl PoolHealth {
    pub fn critical(&self) -> Option<&str> {
        match self {
            PoolHealth::Critical(why) => Some(why),
            PoolHealth::Healthy | PoolHealth::Warning(_) => None,
        }
    }
}

/// The health of the thin pool `pool_lv` in VG `vg`, with its fill (`None`, or `None`
/// percentages, while the pool is inactive and lvm reports no numbers, or after a
/// removal from it until the next report). An unknown fill refuses nothing: lvcreate's
/// own threshold refusal is the same [`PoolUnusable`](super::LvmError::PoolUnusable).
pub fn pool_health(vg: &str, pool_lv: &Lv, fill: Option<&ThinPool>, limits: PoolThresholds) -> PoolHealth {
    let name = format!("thin pool {vg}/{}", pool_lv.name);
    if let Some(problem) = attr_problem(pool_lv) {
        return PoolHealth::Critical(format!("{name} is {problem}"));
    }
    let fills = fill
        .into_iter()
        .flat_map(|f| [("data", f.data_percent), ("metadata", f.metadata_percent)])
        .filter_map(|(what, percent)| Some((what, percent?)));
    let mut health = PoolHealth::Healthy;
    for (what, percent) in fills {
        if percent >= limits.critical {
            return PoolHealth::Critical(format!(
                "{name}: {what} {percent:.1}% full (critical at {}%)",
                limits.critical
            ));
        }
        if percent >= limits.warning && health == PoolHealth::Healthy {
            health = PoolHealth::Warning(format!(
                "{name}: {what} {percent:.1}% full (warning at {}%)",
                limits.warning
            ));
        }
    }
    health
}

/// The warning on a volume of a VG that lost a PV the volume does not use.
pub fn vg_missing_pvs(vg: &Vg) -> String {
    let n = vg.missing_pvs;
    format!(
        "volume group {} is missing {n} physical volume{} (its extents are on the others; \
         the group takes no new volume until pvs shows it whole)",
        vg.name,
        if n == 1 { "" } else { "s" }
    )
}

/// What is wrong under a volume whose LV is `lv`: lvm's verdict on the LV, else its thin
/// pool's critical state (`pool`, for a thin volume).
pub fn volume_problem(vg: &str, lv: &Lv, pool: Option<&PoolHealth>) -> Option<String> {
    if let Some(problem) = attr_problem(lv) {
        return Some(format!("logical volume {vg}/{} is {problem}", lv.name));
    }
    pool.and_then(PoolHealth::critical).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::lvm::report::parse_lv_report;

    /// tests/fixtures/lvm/lvs-pool-full.json: a thin pool lvm found out of data space
    /// (captured in the tests/vm guest: a writer filled a 64 MiB pool through a thin LV).
    const FULL: &[u8] = include_bytes!("../../../tests/fixtures/lvm/lvs-pool-full.json");
    const HEALTHY: &[u8] = include_bytes!("../../../tests/fixtures/lvm/lvs.json");

    fn lv(attr: &str) -> Lv {
        Lv {
            name: "lv".into(),
            vg: "vg".into(),
            size: 1 << 30,
            attr: attr.into(),
            tags: vec![],
            pool: None,
            data_percent: None,
            path: None,
        }
    }

    fn fill(data: Option<f64>, metadata: Option<f64>) -> ThinPool {
        ThinPool {
            name: "lv".into(),
            size: 1 << 30,
            data_percent: data,
            metadata_percent: metadata,
        }
    }

    #[test]
    fn lvms_verdict_is_read_from_the_ninth_attribute() {
        let cases = [
            ("-wi-a-----", None),
            ("-wi-a---w-", None),
            (
                "-wi-a---p-",
                Some("partial: a physical volume of its volume group is missing"),
            ),
            (
                "-wi-a---r-",
                Some("needs a refresh (lvchange --refresh): a device below it failed and came back"),
            ),
            ("rwi-a-r-m-", Some("its RAID images mismatch")),
            ("twi-aotzF-", Some("failed")),
            ("twi-aotzD-", Some("out of data space")),
            ("twi-aotzM-", Some("its metadata is read-only")),
            ("-wi-a---X-", Some("of unknown health: lvm cannot read its state")),
            ("-wi", None),
        ];
        for (attr, want) in cases {
            assert_eq!(attr_problem(&lv(attr)), want, "{attr}");
        }
    }

    #[test]
    fn a_pool_is_healthy_warned_or_critical_by_its_fill_and_lvms_verdict() {
        let t = PoolThresholds::default();
        let ok = lv("twi-aotz--");
        let cases = [
            (fill(Some(10.0), Some(10.0)), None, None),
            (fill(None, None), None, None),
            (
                fill(Some(80.0), Some(1.0)),
                Some("data 80.0% full (warning at 80%)"),
                None,
            ),
            (
                fill(Some(1.0), Some(85.5)),
                Some("metadata 85.5% full (warning at 80%)"),
                None,
            ),
            (
                fill(Some(95.0), Some(1.0)),
                None,
                Some("data 95.0% full (critical at 95%)"),
            ),
            (
                fill(Some(81.0), Some(99.0)),
                None,
                Some("metadata 99.0% full (critical at 95%)"),
            ),
        ];
        for (f, warning, critical) in cases {
            let h = pool_health("vg", &ok, Some(&f), t);
            match (&h, warning, critical) {
                (PoolHealth::Healthy, None, None) => {}
                (PoolHealth::Warning(w), Some(want), None) => {
                    assert_eq!(*w, format!("thin pool vg/lv: {want}"))
                }
                (PoolHealth::Critical(c), None, Some(want)) => {
                    assert_eq!(*c, format!("thin pool vg/lv: {want}"))
                }
                _ => panic!("{f:?}: {h:?}"),
            }
        }
        // lvm's verdict wins over any fill, and over no fill at all.
        let full = lv("twi-aotzD-");
        assert_eq!(
            pool_health("vg", &full, Some(&fill(Some(12.0), Some(3.0))), t),
            PoolHealth::Critical("thin pool vg/lv is out of data space".into())
        );
        assert!(pool_health("vg", &lv("twi---tzF-"), None, t).critical().is_some());
        // The class's own thresholds.
        let strict = PoolThresholds {
            warning: 50.0,
            critical: 60.0,
        };
        assert!(
            pool_health("vg", &ok, Some(&fill(Some(61.0), None)), strict)
                .critical()
                .is_some()
        );
    }

    #[test]
    fn a_volume_is_abnormal_for_its_own_lv_or_its_pools_critical_state() {
        let warned = PoolHealth::Warning("thin pool vg/p: data 85.0% full (warning at 80%)".into());
        let critical = PoolHealth::Critical("thin pool vg/p is out of data space".into());
        assert_eq!(
            volume_problem("vg", &lv("Vwi-a-tz--"), Some(&PoolHealth::Healthy)),
            None
        );
        assert_eq!(volume_problem("vg", &lv("Vwi-a-tz--"), Some(&warned)), None);
        assert_eq!(
            volume_problem("vg", &lv("Vwi-a-tz--"), Some(&critical)).as_deref(),
            Some("thin pool vg/p is out of data space")
        );
        assert_eq!(
            volume_problem("vg", &lv("-wi-a---p-"), None).as_deref(),
            Some("logical volume vg/lv is partial: a physical volume of its volume group is missing")
        );
    }

    /// tests/fixtures/lvm/{vgs,lvs}-missing-pv.stdout: vg3 after the second of its two
    /// PVs was switched to the error target (captured in the tests/vm guest).
    #[test]
    fn the_captured_vg_that_lost_a_disk_is_partial_and_so_is_the_lv_on_it() {
        use crate::backend::lvm::report::parse_vgs;
        let whole = parse_vgs(include_bytes!("../../../tests/fixtures/lvm/vgs-whole.json")).unwrap();
        assert_eq!(whole[0].missing_pvs, 0);
        let lost = parse_vgs(include_bytes!(
            "../../../tests/fixtures/lvm/vgs-missing-pv.stdout"
        ))
        .unwrap();
        assert_eq!(lost[0].missing_pvs, 1);
        assert_eq!(
            vg_missing_pvs(&lost[0]),
            "volume group vg3 is missing 1 physical volume (its extents are on the others; \
             the group takes no new volume until pvs shows it whole)"
        );
        let report = parse_lv_report(include_bytes!(
            "../../../tests/fixtures/lvm/lvs-missing-pv.stdout"
        ))
        .unwrap();
        let problems: Vec<_> = report
            .lvs
            .iter()
            .map(|lv| volume_problem("vg3", lv, None))
            .collect();
        assert_eq!(
            problems,
            [
                None,
                Some(
                    "logical volume vg3/onb is partial: a physical volume of its volume group is missing"
                        .into()
                )
            ]
        );
    }

    #[test]
    fn the_captured_full_pool_is_critical_and_the_healthy_one_is_not() {
        let t = PoolThresholds::default();
        for (json, critical) in [(FULL, true), (HEALTHY, false)] {
            let report = parse_lv_report(json).unwrap();
            let pool_lv = report.lvs.iter().find(|l| l.is_thin_pool()).unwrap();
            let fill = report.pools.iter().find(|p| p.name == pool_lv.name);
            let health = pool_health(&pool_lv.vg, pool_lv, fill, t);
            assert_eq!(health.critical().is_some(), critical, "{health:?}");
            for thin in report.lvs.iter().filter(|l| l.is_thin_volume()) {
                assert_eq!(volume_problem(&thin.vg, thin, Some(&health)).is_some(), critical);
            }
        }
    }
}
