//! The background refresh of the per-device-class gauges: how many volumes each class
//! holds, how much they were promised, the class's free and total space, and the size,
//! use and free space of the storage under it (VG, thin pool with its data and metadata
//! fill, PMEM region, loop filesystem).
//!
//! Asking the backends on a timer, rather than on every scrape, bounds the work a
//! scraper can cause (on LVM each refresh runs `lvs`/`vgs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::backend::{Backend, BackendError, StorageHealth};
use crate::metrics::{ClassGauges, Metrics};
use crate::model::{ClassName, full_message};
use crate::volume::Volumes;

async fn class_stats(backend: &Backend) -> Result<(ClassGauges, StorageHealth), BackendError> {
    let volumes = backend.list().await?;
    let (capacity, health) = backend.capacity_and_health().await?;
    let storage = backend.store_usage().await?;
    let gauges = ClassGauges {
        volumes: volumes.len() as u64,
        encrypted_volumes: volumes.iter().filter(|v| v.encryption.is_some()).count() as u64,
        snapshots: backend.list_snapshots().await?.len() as u64,
        provisioned_bytes: volumes.iter().map(|v| v.size_bytes).sum(),
        capacity,
        storage,
    };
    Ok((gauges, health))
}

/// Refreshes every class's gauges once. A class that cannot be read loses its gauges
/// (and the failure is counted) instead of showing stale numbers. Classes whose storage
/// was missing are looked for first, so storage that appeared is served from now on.
pub async fn refresh(volumes: &Volumes, metrics: &Metrics, changes: Option<&dyn HealthChanges>) {
    volumes.open_missing().await;
    for missing in volumes.missing_classes() {
        metrics.set_class_available(&missing.class, false);
    }
    for backend in volumes.backends() {
        metrics.set_class_available(backend.class(), true);
        match class_stats(backend).await {
            Ok((stats, health)) => {
                debug!(device_class = %backend.class(), ?stats, "class stats");
                metrics.set_class_stats(backend.class(), stats);
                report_storage_health(metrics, changes, backend.class(), &health);
            }
            Err(e) => {
                warn!(device_class = %backend.class(), error = %full_message(&e), "cannot refresh class stats");
                metrics.class_stats_failed(backend.class());
            }
        }
    }
}

/// Told of each change of a device class's storage health, after the log line (with
/// the API: an event on the Node, `k8s::StorageHealthEvents`).
pub trait HealthChanges: Send + Sync {
    fn changed(&self, class: &ClassName, health: &StorageHealth);
}

/// Sets the class's storage health gauge, and says a change once: a warning in the log
/// while it is degraded or critical, with what to look at, a line when it is healthy
/// again, and to `changes`.
fn report_storage_health(
    metrics: &Metrics,
    changes: Option<&dyn HealthChanges>,
    class: &ClassName,
    health: &StorageHealth,
) {
    if !metrics.set_storage_health(class, health) {
        return;
    }
    if let Some(changes) = changes {
        changes.changed(class, health);
    }
    match health.reason() {
        Some(reason) => {
            warn!(device_class = %class, status = health.status(), reason, "the class's storage is not healthy")
        }
        None => info!(device_class = %class, "the class's storage is healthy again"),
    }
}

/// Refreshes at once, then every `interval`, until `shutdown` resolves.
pub async fn run(
    volumes: Arc<Volumes>,
    metrics: Metrics,
    changes: Option<Arc<dyn HealthChanges>>,
    interval: Duration,
    shutdown: impl Future<Output = ()>,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = ticks.tick() => {
                refresh(&volumes, &metrics, changes.as_deref())
                    .instrument(info_span!("stats_refresh"))
                    .await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::backend::{CreateSpec, LoopBackend};
    use crate::host::Host;
    use crate::model::{ClassName, Token, VolumeMode};

    fn loop_class(name: &str, dir: &std::path::Path, limit: u64) -> LoopBackend {
        LoopBackend::new(
            ClassName::parse(name).unwrap(),
            dir.join(name),
            limit,
            Host::system(),
        )
    }

    /// A 16 MiB filesystem volume named `name`.
    fn volume(name: &str) -> CreateSpec {
        CreateSpec {
            token: Token::for_name(name),
            name: name.to_string(),
            size_bytes: 16 << 20,
            mode: VolumeMode::Filesystem,
            fs_type: None,
            claim: Default::default(),
            encryption: None,
        }
    }

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[tokio::test]
    async fn gauges_follow_the_backends() {
        let dir = tempfile::tempdir().unwrap();
        let fast = loop_class("fast", dir.path(), 1 << 30);
        fast.prepare().await.unwrap();
        for name in ["pvc-a", "pvc-b"] {
            fast.create(&volume(name)).await.unwrap();
        }
        // Never prepared: its directory does not exist, so it cannot be listed.
        let broken = loop_class("broken", dir.path(), 1 << 30);
        let volumes = Volumes::new(
            vec![Backend::Loop(fast), Backend::Loop(broken)],
            ClassName::parse("fast").unwrap(),
            BTreeMap::new(),
            Host::system(),
            "node-1".into(),
        );
        let metrics = Metrics::new();
        refresh(&volumes, &metrics, None).await;
        let text = metrics.render();
        assert_eq!(
            line(&text, r#"localvol_volumes{device_class="fast"}"#),
            Some(r#"localvol_volumes{device_class="fast"} 2"#)
        );
        assert_eq!(
            line(&text, r#"localvol_provisioned_bytes{device_class="fast"}"#),
            Some(r#"localvol_provisioned_bytes{device_class="fast"} 33554432"#)
        );
        // Total is the class limit unless the disk is smaller; available is below it.
        let total: u64 = line(
            &text,
            r#"localvol_capacity_bytes{device_class="fast",kind="total"}"#,
        )
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .expect("total capacity exported");
        let available: u64 = line(
            &text,
            r#"localvol_capacity_bytes{device_class="fast",kind="available"}"#,
        )
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .expect("available capacity exported");
        assert!(total > 0 && total <= 1 << 30, "{total}");
        // The loop class's storage is the filesystem holding its directory.
        let disk = value(
            &text,
            r#"localvol_storage_bytes{device_class="fast",kind="size"}"#,
        )
        .expect("storage size exported");
        let used = value(
            &text,
            r#"localvol_storage_bytes{device_class="fast",kind="used"}"#,
        )
        .expect("storage use exported");
        assert!(disk > 0.0 && used > 0.0 && used <= disk, "{text}");
        assert!(available <= total - (32 << 20), "{available} of {total}");
        assert!(
            !text.contains(r#"localvol_volumes{device_class="broken"}"#),
            "{text}"
        );
        assert!(
            text.contains(r#"localvol_stats_refresh_errors_total{device_class="broken"} 1"#),
            "{text}"
        );
        assert!(!text.contains(r#"storage_bytes{device_class="broken""#), "{text}");
    }

    /// The disk under a loop class's images filled by something else: degraded once it
    /// cannot hold what the volumes may still write, critical once full, healthy again
    /// when space is freed; each change is one `true` of set_storage_health.
    #[tokio::test]
    async fn the_storage_health_gauge_follows_the_disk_under_a_loop_class() {
        use crate::host::FsUsage;
        let dir = tempfile::tempdir().unwrap();
        let (commands, syscalls) = crate::host::fake::loop_machine(std::path::Path::new("/dev/loop7"), 0);
        let host = Host {
            commands,
            syscalls: std::sync::Arc::new(syscalls.clone()),
        };
        let fast = ClassName::parse("fast").unwrap();
        let class = LoopBackend::new(fast.clone(), dir.path().join("fast"), 1 << 30, host.clone());
        class.prepare().await.unwrap();
        class.create(&volume("pvc-a")).await.unwrap();
        let volumes = Volumes::new(
            vec![Backend::Loop(class)],
            fast.clone(),
            BTreeMap::new(),
            host,
            "node-1".into(),
        );
        let metrics = Metrics::new();
        let status = |metrics: &Metrics| {
            let text = metrics.render();
            StorageHealth::STATUSES
                .into_iter()
                .filter(|s| {
                    value(
                        &text,
                        &format!(r#"localvol_storage_health{{device_class="fast",status="{s}"}}"#),
                    ) == Some(1.0)
                })
                .collect::<Vec<_>>()
        };
        let disk = |available_bytes| FsUsage {
            total_bytes: 100 << 30,
            available_bytes,
            ..FsUsage::default()
        };
        /// The changes it is told of, as `class status`.
        #[derive(Default)]
        struct Told(std::sync::Mutex<Vec<String>>);
        impl HealthChanges for Told {
            fn changed(&self, class: &ClassName, health: &StorageHealth) {
                self.0
                    .lock()
                    .unwrap()
                    .push(format!("{class} {}", health.status()));
            }
        }
        let told = Told::default();
        refresh(&volumes, &metrics, Some(&told)).await;
        assert_eq!(status(&metrics), ["healthy"]);
        for (available, want) in [
            (4 << 20, "degraded"),
            (0, "critical"),
            (0, "critical"),
            (50 << 30, "healthy"),
        ] {
            syscalls.set_usage(disk(available));
            refresh(&volumes, &metrics, Some(&told)).await;
            assert_eq!(status(&metrics), [want], "{available} bytes free");
        }
        assert_eq!(
            *told.0.lock().unwrap(),
            ["fast degraded", "fast critical", "fast healthy"],
            "each change once, none for the first healthy refresh"
        );
        // Changes, and only changes, are reported for the log.
        let critical = StorageHealth::Critical("full".into());
        assert!(metrics.set_storage_health(&fast, &critical));
        assert!(!metrics.set_storage_health(&fast, &critical));
        assert!(metrics.set_storage_health(&fast, &StorageHealth::Healthy));
        let other = ClassName::parse("other").unwrap();
        assert!(
            !metrics.set_storage_health(&other, &StorageHealth::Healthy),
            "a first healthy status"
        );
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        line(text, &format!("{series} "))?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()
    }

    /// Two classes on the VG of the captured reports (tests/fixtures/lvm): a thick one,
    /// which reports the VG, and a thin one on pool0, which reports the pool and its fill.
    #[tokio::test]
    async fn lvm_classes_report_their_vg_and_thin_pool() {
        use std::sync::Mutex;

        use crate::backend::LvmBackend;
        use crate::backend::lvm::{Layout, LvmSettings, VolumeGroup};
        use crate::host::CommandOutput;
        use crate::host::fake::{FakeCommands, FakeSyscalls};

        // The daemon's one `lvs` of vg1, its VG's fields on every row.
        const LVS: &str = include_str!("../tests/fixtures/lvm/report.json");
        let lvs = Arc::new(Mutex::new(LVS.to_string()));
        let commands = Arc::new(FakeCommands::default());
        {
            let lvs = Arc::clone(&lvs);
            commands.on("lvs", move |_| {
                Ok(CommandOutput {
                    stdout: lvs.lock().unwrap().clone().into_bytes(),
                    stderr: String::new(),
                })
            });
        }
        let host = Host {
            commands: commands.clone(),
            syscalls: Arc::new(FakeSyscalls::default()),
        };
        let group = VolumeGroup::new("vg1".into(), host.clone());
        let settings = |kind, layout| LvmSettings {
            kind,
            layout,
            lvcreate_options: Vec::new(),
            dax: false,
        };
        let open = |name: &str, settings: LvmSettings| {
            LvmBackend::open(
                ClassName::parse(name).unwrap(),
                settings,
                Arc::clone(&group),
                host.clone(),
            )
        };
        let thick = open(
            "ssd",
            settings(
                "lvm",
                Layout::Thick {
                    spare_bytes: 0,
                    stripes: None,
                    stripe_size: None,
                },
            ),
        )
        .await
        .unwrap();
        let thin = open(
            "thin",
            settings(
                "lvm-thin",
                Layout::Thin {
                    pool: "pool0".into(),
                    overprovision_ratio: 2.0,
                    thresholds: crate::config::PoolThresholds::default(),
                },
            ),
        )
        .await
        .unwrap();
        let volumes = Volumes::new(
            vec![Backend::Lvm(thick), Backend::Lvm(thin)],
            ClassName::parse("ssd").unwrap(),
            BTreeMap::new(),
            host,
            "node-1".into(),
        );
        let metrics = Metrics::new();
        refresh(&volumes, &metrics, None).await;
        let text = metrics.render();
        let storage = |class: &str, kind: &str| {
            value(
                &text,
                &format!(r#"localvol_storage_bytes{{device_class="{class}",kind="{kind}"}}"#),
            )
        };
        // report.json: vg1 is 4290772992 bytes, 2940207104 free.
        assert_eq!(storage("ssd", "size"), Some(4290772992.0), "{text}");
        assert_eq!(storage("ssd", "free"), Some(2940207104.0));
        assert_eq!(storage("ssd", "used"), Some(1350565888.0));
        // report.json: pool0 is 1 GiB, data 6.25 %, metadata 11.62 %.
        assert_eq!(storage("thin", "size"), Some(1073741824.0));
        assert_eq!(storage("thin", "used"), Some(67108864.0));
        assert_eq!(storage("thin", "free"), Some(1006632960.0));
        let ratio = |name: &str, class: &str| {
            value(
                &text,
                &format!(r#"localvol_thin_pool_{name}_ratio{{device_class="{class}"}}"#),
            )
        };
        assert_eq!(ratio("data", "thin"), Some(0.0625), "{text}");
        let metadata = ratio("metadata", "thin").expect("metadata ratio exported");
        assert!((metadata - 0.1162).abs() < 1e-9, "{metadata}");
        assert_eq!(ratio("data", "ssd"), None, "a thick class has no pool: {text}");
        let health = |text: &str, class: &str, status: &str| {
            value(
                text,
                &format!(r#"localvol_storage_health{{device_class="{class}",status="{status}"}}"#),
            )
        };
        assert_eq!(health(&text, "ssd", "healthy"), Some(1.0), "{text}");
        assert_eq!(health(&text, "thin", "healthy"), Some(1.0), "{text}");

        // The pool out of data space, as lvm marks it: the thin class is critical, the
        // thick one on the same VG is not.
        *lvs.lock().unwrap() = LVS
            .replace(r#""data_percent":"6.25""#, r#""data_percent":"100.00""#)
            .replace("twi-aotz--", "twi-aotzD-");
        group.invalidate();
        refresh(&volumes, &metrics, None).await;
        let text = metrics.render();
        assert_eq!(health(&text, "thin", "critical"), Some(1.0), "{text}");
        assert_eq!(health(&text, "thin", "healthy"), Some(0.0), "{text}");
        assert_eq!(health(&text, "ssd", "healthy"), Some(1.0), "{text}");

        // The pool is deactivated: lvm reports no fill, and the gauges go rather than
        // stay at their last values; the thick class is unaffected.
        *lvs.lock().unwrap() = LVS
            .replace(
                r#""data_percent":"6.25", "metadata_percent":"11.62""#,
                r#""data_percent":"", "metadata_percent":"""#,
            )
            .replace("twi-aotz--", "twi---tz--");
        group.invalidate();
        refresh(&volumes, &metrics, None).await;
        let text = metrics.render();
        assert!(
            !text.contains(r#"thin_pool_data_ratio{device_class="thin"}"#),
            "{text}"
        );
        assert!(
            !text.contains(r#"thin_pool_metadata_ratio{device_class="thin"}"#),
            "{text}"
        );
        assert!(!text.contains(r#"storage_bytes{device_class="thin""#), "{text}");
        assert!(
            text.contains(r#"localvol_capacity_bytes{device_class="thin",kind="total"} 2147483648"#),
            "{text}"
        );
        assert!(
            text.contains(r#"localvol_storage_bytes{device_class="ssd",kind="size"} 4290772992"#),
            "{text}"
        );
        assert!(!text.contains("stats_refresh_errors_total{"), "{text}");
    }

    #[tokio::test]
    async fn the_task_refreshes_on_its_interval_and_stops_on_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let class = loop_class("fast", dir.path(), 1 << 30);
        class.prepare().await.unwrap();
        let volumes = Arc::new(Volumes::new(
            vec![Backend::Loop(class)],
            ClassName::parse("fast").unwrap(),
            BTreeMap::new(),
            Host::system(),
            "node-1".into(),
        ));
        let metrics = Metrics::new();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run(
            Arc::clone(&volumes),
            metrics.clone(),
            None,
            Duration::from_millis(50),
            async {
                let _ = stopped.await;
            },
        ));
        let wait_for = |expected: &'static str| {
            let metrics = metrics.clone();
            async move {
                for _ in 0..100 {
                    if metrics.render().lines().any(|l| l == expected) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                panic!("{expected} not seen in 2s:\n{}", metrics.render());
            }
        };
        wait_for(r#"localvol_volumes{device_class="fast"} 0"#).await;
        // A volume made behind the task's back (same class directory) shows up at the
        // next refresh.
        loop_class("fast", dir.path(), 1 << 30)
            .create(&CreateSpec {
                token: Token::for_name("pvc-late"),
                name: "pvc-late".into(),
                size_bytes: 1 << 20,
                mode: VolumeMode::Filesystem,
                fs_type: None,
                claim: Default::default(),
                encryption: None,
            })
            .await
            .unwrap();
        wait_for(r#"localvol_volumes{device_class="fast"} 1"#).await;
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the task stops on shutdown")
            .unwrap();
    }
}
