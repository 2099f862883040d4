use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

fn meta(annotations: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        annotations: super::annotations(annotations),
        ..ObjectMeta::default()
    }
}

fn pvc(annotations: &[(&str, &str)], class: Option<&str>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: meta(annotations),
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: class.map(str::to_string),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ns(annotations: &[(&str, &str)]) -> Namespace {
    Namespace {
        metadata: meta(annotations),
        ..Default::default()
    }
}

fn sc(annotations: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        metadata: meta(annotations),
        provisioner: "localvol.csi.dev".to_string(),
        ..Default::default()
    }
}

fn cm(data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    }
}

const S: &str = SCHEDULE_ANNOTATION;
const E: &str = ENABLE_ANNOTATION;

fn scheduled(r: &Resolution) -> (String, Source) {
    match r {
        Resolution::Scheduled { schedule, source, .. } => (schedule.to_string(), source.clone()),
        other => panic!("not scheduled: {other:?}"),
    }
}

#[test]
fn pvc_then_namespace_then_storage_class() {
    let cluster = ClusterSettings::default();
    let node = NodePolicy::default();
    let (p, n, s) = (
        pvc(&[(S, "@hourly")], Some("fast")),
        ns(&[(S, "@daily")]),
        sc(&[(S, "@monthly")]),
    );
    let all = ClaimObjects {
        pvc: Some(&p),
        namespace: Some(&n),
        storage_class: Some(&s),
    };
    assert_eq!(
        scheduled(&resolve(&all, &cluster, &node)),
        ("@hourly".into(), Source::Pvc)
    );
    let p = pvc(&[], Some("fast"));
    let no_pvc = ClaimObjects {
        pvc: Some(&p),
        ..all.clone()
    };
    assert_eq!(
        scheduled(&resolve(&no_pvc, &cluster, &node)),
        ("@daily".into(), Source::Namespace)
    );
    let n = ns(&[]);
    let only_sc = ClaimObjects {
        namespace: Some(&n),
        ..no_pvc.clone()
    };
    assert_eq!(
        scheduled(&resolve(&only_sc, &cluster, &node)),
        ("@monthly".into(), Source::StorageClass)
    );
    let s = sc(&[]);
    let none = ClaimObjects {
        storage_class: Some(&s),
        ..only_sc
    };
    assert_eq!(resolve(&none, &cluster, &node), Resolution::Unscheduled);
}

#[test]
fn storage_class_precedence_ignores_pvc_and_namespace() {
    let cluster = ClusterSettings::from_config_map(Some(&cm(&[(PRECEDENCE_KEY, "storageclass")])));
    assert_eq!(cluster.precedence, Precedence::StorageClass);
    let node = NodePolicy::default();
    let (p, n, s) = (
        pvc(&[(S, "@hourly"), (E, "false")], Some("fast")),
        ns(&[(S, "@daily"), (E, "false")]),
        sc(&[(S, "@monthly")]),
    );
    let objects = ClaimObjects {
        pvc: Some(&p),
        namespace: Some(&n),
        storage_class: Some(&s),
    };
    assert_eq!(
        scheduled(&resolve(&objects, &cluster, &node)),
        ("@monthly".into(), Source::StorageClass)
    );
    let s = sc(&[]);
    let objects = ClaimObjects {
        storage_class: Some(&s),
        ..objects
    };
    assert_eq!(resolve(&objects, &cluster, &node), Resolution::Unscheduled);
    // The legacy spelling means the same.
    let legacy = ClusterSettings::from_config_map(Some(&cm(&[(PRECEDENCE_KEY, "sc-only")])));
    assert_eq!(legacy.precedence, Precedence::StorageClass);
}

#[test]
fn enable_false_anywhere_read_disables() {
    let cluster = ClusterSettings::default();
    let node = NodePolicy {
        default_schedule: Some(Schedule::Daily),
        ..NodePolicy::default()
    };
    let (p, n, s) = (
        pvc(&[(S, "@hourly"), (E, "true")], None),
        ns(&[(E, "false")]),
        sc(&[]),
    );
    let objects = ClaimObjects {
        pvc: Some(&p),
        namespace: Some(&n),
        storage_class: Some(&s),
    };
    assert_eq!(
        resolve(&objects, &cluster, &node),
        Resolution::Disabled(Source::Namespace)
    );
    // Only the literal "false" disables.
    let n = ns(&[(E, "no")]);
    let objects = ClaimObjects {
        namespace: Some(&n),
        ..objects
    };
    assert_eq!(scheduled(&resolve(&objects, &cluster, &node)).1, Source::Pvc);
}

#[test]
fn an_invalid_schedule_falls_back_to_weekly_with_a_warning() {
    let p = pvc(&[(S, "every tuesday")], None);
    let n = ns(&[(S, "@hourly")]);
    let objects = ClaimObjects {
        pvc: Some(&p),
        namespace: Some(&n),
        storage_class: None,
    };
    match resolve(&objects, &ClusterSettings::default(), &NodePolicy::default()) {
        Resolution::Scheduled {
            schedule,
            source,
            warning: Some(warning),
        } => {
            assert_eq!(schedule, Schedule::Weekly);
            // Found on the PVC: the namespace's valid schedule does not take over.
            assert_eq!(source, Source::Pvc);
            assert!(warning.contains("every tuesday"), "{warning}");
            assert!(warning.contains("@weekly"), "{warning}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn node_layers_come_after_the_cluster() {
    let cluster = ClusterSettings::default();
    let node = NodePolicy {
        default_schedule: Some(Schedule::Monthly),
        storage_classes: BTreeMap::from([("fast".to_string(), Schedule::Daily)]),
        ..NodePolicy::default()
    };
    let p = pvc(&[], Some("fast"));
    let objects = ClaimObjects {
        pvc: Some(&p),
        ..Default::default()
    };
    assert_eq!(
        scheduled(&resolve(&objects, &cluster, &node)),
        ("@daily".into(), Source::NodeStorageClass)
    );
    let p = pvc(&[], Some("slow"));
    let objects = ClaimObjects {
        pvc: Some(&p),
        ..Default::default()
    };
    assert_eq!(
        scheduled(&resolve(&objects, &cluster, &node)),
        ("@monthly".into(), Source::NodeDefault)
    );
    // Without Kubernetes at all: the node default.
    assert_eq!(
        scheduled(&resolve(&ClaimObjects::default(), &cluster, &node)).1,
        Source::NodeDefault
    );
    let s = sc(&[(S, "@hourly")]);
    let p = pvc(&[], Some("fast"));
    let objects = ClaimObjects {
        pvc: Some(&p),
        storage_class: Some(&s),
        ..Default::default()
    };
    assert_eq!(
        scheduled(&resolve(&objects, &cluster, &node)).1,
        Source::StorageClass
    );
}

#[test]
fn config_map_values() {
    let d = ClusterSettings::from_config_map(None);
    assert_eq!(d, ClusterSettings::default());
    assert_eq!(d.stagger_window, Duration::from_secs(7200));
    let c = ClusterSettings::from_config_map(Some(&cm(&[
        (STAGGER_WINDOW_KEY, "5"),
        (PRECEDENCE_KEY, ""),
        ("reclaim-space-timeout", "3m"),
    ])));
    assert_eq!(c.stagger_window, Duration::from_secs(5 * 3600));
    assert_eq!(c.precedence, Precedence::Pvc);
    assert!(c.warnings.is_empty());
    let off = ClusterSettings::from_config_map(Some(&cm(&[(STAGGER_WINDOW_KEY, "0")])));
    assert_eq!(off.stagger_window, Duration::ZERO);
    let negative = ClusterSettings::from_config_map(Some(&cm(&[(STAGGER_WINDOW_KEY, "-3")])));
    assert_eq!(negative.stagger_window, Duration::ZERO);
    let bad = ClusterSettings::from_config_map(Some(&cm(&[
        (STAGGER_WINDOW_KEY, "2h"),
        (PRECEDENCE_KEY, "namespace"),
    ])));
    assert_eq!(bad.stagger_window, Duration::from_secs(7200));
    assert_eq!(bad.precedence, Precedence::Pvc);
    assert_eq!(bad.warnings.len(), 2, "{:?}", bad.warnings);
}
