use super::*;

fn class(name: &str) -> ClassName {
    ClassName::parse(name).unwrap()
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[test]
fn class_stats_are_set_and_dropped_on_failure() {
    let m = Metrics::new();
    let stats = ClassGauges {
        volumes: 3,
        encrypted_volumes: 1,
        snapshots: 2,
        provisioned_bytes: 3 << 30,
        capacity: ClassCapacity {
            available: 7 << 30,
            total: 10 << 30,
            max_volume: 7 << 30,
        },
        storage: Some(StoreUsage {
            size_bytes: 8 << 30,
            used_bytes: 2 << 30,
            free_bytes: 6 << 30,
            thin_pool: Some(crate::backend::ThinPoolFill {
                data_percent: 25.0,
                metadata_percent: 5.0,
            }),
        }),
    };
    m.set_class_stats(&class("fast"), stats);
    let text = m.render();
    for line in [
        r#"localvol_storage_bytes{device_class="fast",kind="size"} 8589934592"#,
        r#"localvol_storage_bytes{device_class="fast",kind="used"} 2147483648"#,
        r#"localvol_storage_bytes{device_class="fast",kind="free"} 6442450944"#,
        r#"localvol_thin_pool_data_ratio{device_class="fast"} 0.25"#,
        r#"localvol_thin_pool_metadata_ratio{device_class="fast"} 0.05"#,
        r#"localvol_volumes{device_class="fast"} 3"#,
        r#"localvol_encrypted_volumes{device_class="fast"} 1"#,
        r#"localvol_snapshots{device_class="fast"} 2"#,
        r#"localvol_provisioned_bytes{device_class="fast"} 3221225472"#,
        r#"localvol_capacity_bytes{device_class="fast",kind="available"} 7516192768"#,
        r#"localvol_capacity_bytes{device_class="fast",kind="total"} 10737418240"#,
    ] {
        assert!(has_line(&text, line), "{line} missing from\n{text}");
    }
    assert!(!text.contains("stats_refresh_errors_total{"));
    m.class_stats_failed(&class("fast"));
    let text = m.render();
    assert!(!text.contains(r#"device_class="fast",kind"#), "{text}");
    assert!(!text.contains(r#"localvol_volumes{"#), "{text}");
    assert!(!text.contains(r#"localvol_encrypted_volumes{"#), "{text}");
    assert!(!text.contains(r#"thin_pool_data_ratio{"#), "{text}");
    assert!(has_line(
        &text,
        r#"localvol_stats_refresh_errors_total{device_class="fast"} 1"#
    ));
}

#[test]
fn hooks_register_their_metrics_only_when_first_used() {
    let m = Metrics::new();
    let before = m.render();
    for name in ["thin_pool", "resize_operations"] {
        assert!(!before.contains(name), "{name} exported before use");
    }
    assert!(has_line(
        &before,
        &format!(
            r#"localvol_build_info{{version="{}"}} 1"#,
            env!("CARGO_PKG_VERSION")
        )
    ));
    assert!(before.contains("process_resident_memory_bytes "), "{before}");

    let thin = class("thin");
    m.set_thin_pool_usage(&thin, 42.5, 7.0);
    m.set_thin_pool_usage(&thin, 50.0, 8.0);
    m.observe_resize(&thin, "ok");
    m.observe_resize(&thin, "ok");
    let text = m.render();
    for line in [
        r#"localvol_thin_pool_data_ratio{device_class="thin"} 0.5"#,
        r#"localvol_thin_pool_metadata_ratio{device_class="thin"} 0.08"#,
        r#"localvol_resize_operations_total{device_class="thin",result="ok"} 2"#,
    ] {
        assert!(has_line(&text, line), "{line} missing from\n{text}");
    }
    // Clones share the registry and the lazily registered metrics.
    m.clone().observe_resize(&thin, "ok");
    assert!(has_line(
        &m.render(),
        r#"localvol_resize_operations_total{device_class="thin",result="ok"} 3"#
    ));
}

/// deploy/grafana/localvol.json may only query metrics this module exports.
#[test]
fn the_dashboard_uses_only_exported_metrics() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/localvol.json");
    let dashboard = std::fs::read_to_string(path).unwrap();
    let m = Metrics::new();
    let class = class("fast");
    m.set_class_stats(&class, ClassGauges::default());
    m.class_stats_failed(&class);
    m.set_class_stats(
        &class,
        ClassGauges {
            storage: Some(crate::backend::StoreUsage {
                thin_pool: Some(crate::backend::ThinPoolFill {
                    data_percent: 50.0,
                    metadata_percent: 10.0,
                }),
                ..Default::default()
            }),
            ..ClassGauges::default()
        },
    );
    m.observe_rpc("CreateVolume", "Ok", Instant::now());
    let checked = queried_metrics_are_exported(&m, &dashboard, path);
    assert!(checked > 10, "only {checked} metric references found in {path}");
}

/// Every metric name `text` (a dashboard, a rule file) names is one `m` exports, once
/// every hook that registers one has run; returns how many references were checked.
fn queried_metrics_are_exported(m: &Metrics, text: &str, path: &str) -> usize {
    m.set_storage_health(&class("fast"), &crate::backend::StorageHealth::Healthy);
    m.set_class_available(&class("fast"), true);
    m.class_stats_failed(&class("other"));
    let id = crate::model::VolumeId::new(class("fast"), crate::model::Token::for_name("pvc-1"));
    m.set_volume_health(&id, &crate::model::ClaimRef::default(), false);
    let exported = m.render();
    let mut checked = 0;
    for prefix in ["localvol_", "process_"] {
        for (start, _) in text.match_indices(prefix) {
            let name: String = text[start..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            let family = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name);
            assert!(
                exported.contains(&format!("# TYPE {family} ")),
                "{path} queries {name}, which localvol does not export"
            );
            checked += 1;
        }
    }
    checked
}

/// deploy/prometheus/rules.yaml: a PrometheusRule whose every alert has a severity, a
/// summary, a description and a `for`, over metrics this module exports, one alert at
/// least for each storage and volume health status that is not healthy.
#[test]
fn the_alert_rules_cover_each_unhealthy_status_with_exported_metrics() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/rules.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let rule: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(rule["kind"], "PrometheusRule");
    let mut exprs = Vec::new();
    for group in rule["spec"]["groups"].as_sequence().unwrap() {
        for alert in group["rules"].as_sequence().unwrap() {
            let name = alert["alert"].as_str().unwrap();
            for field in [
                &alert["for"],
                &alert["annotations"]["summary"],
                &alert["annotations"]["description"],
            ] {
                assert!(field.as_str().is_some_and(|s| !s.is_empty()), "{name}: {alert:?}");
            }
            let severity = alert["labels"]["severity"].as_str();
            assert!(
                matches!(severity, Some("warning" | "critical")),
                "{name}: {severity:?}"
            );
            exprs.push(alert["expr"].as_str().unwrap().to_string());
        }
    }
    for status in ["critical", "degraded"] {
        let expr = format!(r#"localvol_storage_health{{status="{status}"}} == 1"#);
        assert!(exprs.contains(&expr), "no alert on {expr}: {exprs:?}");
    }
    let expr = r#"localvol_volume_health{status="abnormal"} == 1"#.to_string();
    assert!(exprs.contains(&expr), "no alert on {expr}: {exprs:?}");
    let checked = queried_metrics_are_exported(&Metrics::new(), &exprs.join("\n"), path);
    assert_eq!(checked, exprs.len(), "one metric per expression");
}

/// /readyz's notes: a line for each class whose storage is not healthy, with why, and
/// for each volume last found abnormal, with its claim; gone when healthy again or
/// deleted.
#[test]
fn health_notes_name_unhealthy_storage_and_abnormal_volumes() {
    let m = Metrics::new();
    let (thin, fast) = (class("thin"), class("fast"));
    m.set_storage_health(&fast, &crate::backend::StorageHealth::Healthy);
    let full = "thin pool vg1/pool0 is out of data space";
    m.set_storage_health(&thin, &crate::backend::StorageHealth::Critical(full.into()));
    let id = |name| crate::model::VolumeId::new(class("thin"), crate::model::Token::for_name(name));
    let claim = crate::model::ClaimRef {
        pvc_name: Some("data".into()),
        pvc_namespace: Some("apps".into()),
        pv_name: None,
    };
    m.set_volume_health(&id("pvc-1"), &claim, true);
    m.set_volume_health(&id("pvc-2"), &Default::default(), true);
    m.set_volume_health(&id("pvc-3"), &claim, false);
    let notes = m.health_notes();
    let mut lines: Vec<&str> = notes.lines().collect();
    assert_eq!(
        lines.remove(0),
        format!("device class thin: storage critical: {full}")
    );
    lines.sort();
    let mut want = [
        format!(
            "volume {} (claim apps/data): abnormal (its claim's events and `localvol status` say why)",
            id("pvc-1")
        ),
        format!(
            "volume {}: abnormal (its claim's events and `localvol status` say why)",
            id("pvc-2")
        ),
    ];
    want.sort();
    assert_eq!(lines, want, "{notes}");
    m.set_storage_health(&thin, &crate::backend::StorageHealth::Healthy);
    m.set_volume_health(&id("pvc-1"), &claim, false);
    m.forget_volume(&id("pvc-2"));
    assert_eq!(m.health_notes(), "");
    assert!(!m.render().contains(&format!(r#"volume_id="{}""#, id("pvc-2"))));
}
