//! The background refresh of the per-device-class gauges: how many volumes each class
//! holds, how much they were promised, and the class's free and total space.
//!
//! Asking the backends on a timer, rather than on every scrape, bounds the work a
//! scraper can cause (on LVM each refresh runs `lvs`/`vgs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tracing::{Instrument, debug, info_span, warn};

use crate::backend::{Backend, BackendError};
use crate::error::full_message;
use crate::metrics::{ClassStats, Metrics};
use crate::volume::Volumes;

async fn class_stats(backend: &Backend) -> Result<ClassStats, BackendError> {
    let volumes = backend.list().await?;
    let capacity = backend.capacity().await?;
    Ok(ClassStats {
        volumes: volumes.len() as u64,
        provisioned_bytes: volumes.iter().map(|v| v.size_bytes).sum(),
        capacity,
    })
}

/// Refreshes every class's gauges once. A class that cannot be read loses its gauges
/// (and the failure is counted) instead of showing stale numbers.
pub async fn refresh(volumes: &Volumes, metrics: &Metrics) {
    for backend in volumes.backends() {
        match class_stats(backend).await {
            Ok(stats) => {
                debug!(device_class = %backend.class(), ?stats, "class stats");
                metrics.set_class_stats(backend.class(), stats);
            }
            Err(e) => {
                warn!(device_class = %backend.class(), error = %full_message(&e), "cannot refresh class stats");
                metrics.class_stats_failed(backend.class());
            }
        }
    }
}

/// Refreshes at once, then every `interval`, until `shutdown` resolves.
pub async fn run(
    volumes: Arc<Volumes>,
    metrics: Metrics,
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
                refresh(&volumes, &metrics).instrument(info_span!("stats_refresh")).await;
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

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[tokio::test]
    async fn gauges_follow_the_backends() {
        let dir = tempfile::tempdir().unwrap();
        let fast = loop_class("fast", dir.path(), 1 << 30);
        fast.prepare().await.unwrap();
        for name in ["pvc-a", "pvc-b"] {
            fast.create(&CreateSpec {
                token: Token::for_name(name),
                name: name.to_string(),
                size_bytes: 16 << 20,
                mode: VolumeMode::Filesystem,
                fs_type: None,
                claim: Default::default(),
            })
            .await
            .unwrap();
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
        refresh(&volumes, &metrics).await;
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
        assert!(available <= total - (32 << 20), "{available} of {total}");
        assert!(
            !text.contains(r#"localvol_volumes{device_class="broken"}"#),
            "{text}"
        );
        assert!(
            text.contains(r#"localvol_stats_refresh_errors_total{device_class="broken"} 1"#),
            "{text}"
        );
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
