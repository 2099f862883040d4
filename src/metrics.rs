//! Prometheus metrics and the HTTP endpoint that serves them with the health checks.
//!
//! Every localvol metric carries the `localvol_` prefix; the standard `process_*`
//! metrics of the daemon (CPU, memory, file descriptors) keep their usual names.
//!
//! Metrics that only some nodes produce (thin pools, resize) are registered on first
//! use: a scrape never shows a series that nothing updates.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::routing::get;
use prometheus::core::Collector;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::backend::{ClassCapacity, StorageHealth, StoreUsage};
use crate::health::Health;
use crate::model::{ClaimRef, ClassName, VolumeId};

mod volume_health;

/// Every metric localvol exports.
#[derive(Clone)]
pub struct Metrics {
    /// `localvol_`-prefixed metrics.
    registry: Registry,
    /// The unprefixed `process_*` metrics.
    process: Registry,
    rpc_total: IntCounterVec,
    rpc_duration: HistogramVec,
    volumes: IntGaugeVec,
    encrypted_volumes: IntGaugeVec,
    snapshots: IntGaugeVec,
    provisioned_bytes: IntGaugeVec,
    capacity_bytes: IntGaugeVec,
    storage_bytes: IntGaugeVec,
    stats_errors: IntCounterVec,
    class_available: IntGaugeVec,
    storage_health: IntGaugeVec,
    volume_health: volume_health::VolumeHealthGauges,
    /// Each device class whose storage is not healthy, with its health, for /readyz.
    unhealthy_storage: Arc<Mutex<BTreeMap<String, StorageHealth>>>,
    thin_pool: Arc<OnceLock<ThinPoolMetrics>>,
    pub reclaim: ReclaimMetrics,
    resize: Arc<OnceLock<IntCounterVec>>,
}

#[derive(Clone)]
struct ThinPoolMetrics {
    data: GaugeVec,
    metadata: GaugeVec,
}

/// ReclaimSpace runs, scheduled and on demand, by device class.
#[derive(Clone)]
pub struct ReclaimMetrics {
    /// Decrease of the backing store's allocation (loop image blocks; thin pool data).
    pub reclaimed_bytes: IntCounterVec,
    /// What the filesystems reported as trimmed (free space discarded, reclaimed or not).
    pub trimmed_bytes: IntCounterVec,
    pub duration: HistogramVec,
    /// By result: trimmed, not_discarded (raw block), busy, or an error label.
    pub runs: IntCounterVec,
}

impl ReclaimMetrics {
    fn new() -> Self {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        Self {
            reclaimed_bytes: counter(
                "reclaimed_bytes_total",
                "Bytes given back to the device class by ReclaimSpace (FITRIM)",
                &["device_class"],
            ),
            trimmed_bytes: counter(
                "reclaim_trimmed_bytes_total",
                "Bytes the filesystems reported as discarded by FITRIM",
                &["device_class"],
            ),
            duration: HistogramVec::new(
                HistogramOpts::new("reclaim_duration_seconds", "Duration of ReclaimSpace runs")
                    .buckets(vec![0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0]),
                &["device_class"],
            )
            .expect("valid metric"),
            runs: counter(
                "reclaim_runs_total",
                "ReclaimSpace runs by device class and result",
                &["device_class", "result"],
            ),
        }
    }
}

/// What the periodic refresh found in one device class.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClassGauges {
    pub volumes: u64,
    /// Of those, the ones with a LUKS2 header (docs/encryption.md).
    pub encrypted_volumes: u64,
    /// Snapshots held by the class (0 where the kind makes none).
    pub snapshots: u64,
    /// The sum of the volumes' sizes.
    pub provisioned_bytes: u64,
    pub capacity: ClassCapacity,
    /// The VG, thin pool, region or filesystem under the class; `None` when unknown.
    pub storage: Option<StoreUsage>,
}

const STORAGE_KINDS: [&str; 3] = ["size", "used", "free"];

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn register<C: Collector + Clone + 'static>(registry: &Registry, collector: C) -> C {
    registry
        .register(Box::new(collector.clone()))
        .expect("metric names are unique");
    collector
}

fn int_gauges(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(
        registry,
        IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn int_counters(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        registry,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn i64_of(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new_custom(Some("localvol".to_string()), None).expect("valid prefix");
        let rpc_total = int_counters(
            &registry,
            "rpc_requests_total",
            "CSI gRPC calls by method and status code",
            &["method", "code"],
        );
        let rpc_duration = register(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "rpc_duration_seconds",
                    "CSI gRPC call latency by method and status code",
                )
                .buckets(vec![
                    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
                ]),
                &["method", "code"],
            )
            .expect("valid metric"),
        );
        let volumes = int_gauges(
            &registry,
            "volumes",
            "Volumes per device class",
            &["device_class"],
        );
        let encrypted_volumes = int_gauges(
            &registry,
            "encrypted_volumes",
            "Volumes per device class that are encrypted at rest (LUKS2)",
            &["device_class"],
        );
        let snapshots = int_gauges(
            &registry,
            "snapshots",
            "Volume snapshots per device class",
            &["device_class"],
        );
        let provisioned_bytes = int_gauges(
            &registry,
            "provisioned_bytes",
            "Sum of the sizes of the volumes in a device class",
            &["device_class"],
        );
        let capacity_bytes = int_gauges(
            &registry,
            "capacity_bytes",
            "Space in a device class: kind=available is what a new volume can get now, \
             kind=total the class's whole size",
            &["device_class", "kind"],
        );
        let storage_bytes = int_gauges(
            &registry,
            "storage_bytes",
            "The storage under a device class as its tools count it (the VG; for lvm-thin \
             the thin pool; the PMEM region; the filesystem of the loop files): kind=size, \
             used or free",
            &["device_class", "kind"],
        );
        let stats_errors = int_counters(
            &registry,
            "stats_refresh_errors_total",
            "Failed refreshes of a device class's volume and capacity gauges (the class's \
             gauges are dropped until a refresh succeeds)",
            &["device_class"],
        );
        let class_available = int_gauges(
            &registry,
            "device_class_available",
            "1 when a configured device class's storage is on this node and served, 0 when \
             it is missing (the class then offers no capacity here)",
            &["device_class"],
        );
        let storage_health = int_gauges(
            &registry,
            "storage_health",
            "1 for the status a device class's storage is in (healthy, degraded: a disk of its \
             VG missing or a pool or disk filling up; critical: its volumes' writes fail or are \
             about to), 0 for the others",
            &["device_class", "status"],
        );
        let volume_health = volume_health::VolumeHealthGauges::new(&registry);
        let build_info = int_gauges(
            &registry,
            "build_info",
            "Always 1; the version of this daemon",
            &["version"],
        );
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);

        let reclaim = ReclaimMetrics::new();
        for collector in [
            Box::new(reclaim.reclaimed_bytes.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(reclaim.trimmed_bytes.clone()),
            Box::new(reclaim.duration.clone()),
            Box::new(reclaim.runs.clone()),
        ] {
            registry.register(collector).expect("unique metric");
        }

        let process = Registry::new();
        process
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("process metrics register once");
        Self {
            registry,
            process,
            rpc_total,
            rpc_duration,
            volumes,
            encrypted_volumes,
            snapshots,
            provisioned_bytes,
            capacity_bytes,
            storage_bytes,
            stats_errors,
            class_available,
            storage_health,
            volume_health,
            unhealthy_storage: Arc::default(),
            thin_pool: Arc::default(),
            reclaim,
            resize: Arc::default(),
        }
    }

    /// One finished RPC: `code` is its gRPC status code's name as the edge spells it
    /// (`Ok`, `NotFound`, ...), the label's value.
    pub fn observe_rpc(&self, method: &str, code: &str, started: Instant) {
        self.rpc_total.with_label_values(&[method, code]).inc();
        self.rpc_duration
            .with_label_values(&[method, code])
            .observe(started.elapsed().as_secs_f64());
    }

    /// Records a successful refresh of `class`'s volume and capacity gauges.
    pub fn set_class_stats(&self, class_name: &ClassName, stats: ClassGauges) {
        let class = class_name.as_str();
        self.volumes
            .with_label_values(&[class])
            .set(i64_of(stats.volumes));
        self.encrypted_volumes
            .with_label_values(&[class])
            .set(i64_of(stats.encrypted_volumes));
        self.snapshots
            .with_label_values(&[class])
            .set(i64_of(stats.snapshots));
        self.provisioned_bytes
            .with_label_values(&[class])
            .set(i64_of(stats.provisioned_bytes));
        self.capacity_bytes
            .with_label_values(&[class, "available"])
            .set(i64_of(stats.capacity.available));
        self.capacity_bytes
            .with_label_values(&[class, "total"])
            .set(i64_of(stats.capacity.total));
        match stats.storage {
            Some(storage) => {
                let values = [storage.size_bytes, storage.used_bytes, storage.free_bytes];
                for (kind, bytes) in STORAGE_KINDS.into_iter().zip(values) {
                    self.storage_bytes
                        .with_label_values(&[class, kind])
                        .set(i64_of(bytes));
                }
            }
            None => self.clear_storage(class),
        }
        match stats.storage.and_then(|s| s.thin_pool) {
            Some(fill) => self.set_thin_pool_usage(class_name, fill.data_percent, fill.metadata_percent),
            None => self.clear_thin_pool_usage(class),
        }
    }

    fn clear_storage(&self, class: &str) {
        for kind in STORAGE_KINDS {
            let _ = self.storage_bytes.remove_label_values(&[class, kind]);
        }
    }

    /// A class whose pool fill is unknown (inactive pool, failed refresh) shows none
    /// rather than its last one.
    fn clear_thin_pool_usage(&self, class: &str) {
        if let Some(m) = self.thin_pool.get() {
            let _ = m.data.remove_label_values(&[class]);
            let _ = m.metadata.remove_label_values(&[class]);
        }
    }

    /// Whether `class`'s storage is on this node and served.
    pub fn set_class_available(&self, class: &ClassName, available: bool) {
        self.class_available
            .with_label_values(&[class.as_str()])
            .set(i64::from(available));
    }

    /// The status of `class`'s storage, one-hot over [`StorageHealth::STATUSES`].
    /// Returns whether it changed (a class's first status counts as a change only when
    /// it is not healthy), for the refresh to log it once.
    pub fn set_storage_health(&self, class: &ClassName, health: &StorageHealth) -> bool {
        let class = class.as_str();
        for status in StorageHealth::STATUSES {
            self.storage_health
                .with_label_values(&[class, status])
                .set(i64::from(status == health.status()));
        }
        // The last status is the map's (a class it does not hold was healthy or new).
        let previous = match health {
            StorageHealth::Healthy => self.unhealthy_storage().remove(class),
            _ => self.unhealthy_storage().insert(class.to_string(), health.clone()),
        };
        previous.as_ref().map_or("healthy", StorageHealth::status) != health.status()
    }

    /// The condition NodeGetVolumeStats just found volume `id` (made for `claim`) in
    /// (`localvol_volume_health`).
    pub fn set_volume_health(&self, id: &VolumeId, claim: &ClaimRef, abnormal: bool) {
        self.volume_health.set(id, claim, abnormal);
    }

    fn unhealthy_storage(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, StorageHealth>> {
        // Each update is one insert or remove: a poisoned map is still whole.
        self.unhealthy_storage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// What /readyz adds to its answer, a line each: the device classes whose storage
    /// the last refresh found degraded or critical, with why, and the volumes
    /// NodeGetVolumeStats last found abnormal. None of it makes the daemon unready: it
    /// still serves every class and every volume that works.
    pub fn health_notes(&self) -> String {
        let mut notes = String::new();
        for (class, health) in self.unhealthy_storage().iter() {
            let reason = health.reason().unwrap_or_default();
            notes += &format!("device class {class}: storage {}: {reason}\n", health.status());
        }
        for (id, namespace, claim) in self.volume_health.abnormal() {
            let claim = match (namespace.as_str(), claim.as_str()) {
                ("", _) | (_, "") => String::new(),
                _ => format!(" (claim {namespace}/{claim})"),
            };
            notes +=
                &format!("volume {id}{claim}: abnormal (its claim's events and `localvol status` say why)\n");
        }
        notes
    }

    /// Volume `id` was deleted: its health series go with it.
    pub fn forget_volume(&self, id: &VolumeId) {
        self.volume_health.forget(id);
    }

    /// Records a failed refresh of `class`: its gauges are removed rather than left
    /// showing old numbers, and the failure is counted.
    pub fn class_stats_failed(&self, class: &ClassName) {
        let class = class.as_str();
        let _ = self.volumes.remove_label_values(&[class]);
        let _ = self.encrypted_volumes.remove_label_values(&[class]);
        let _ = self.snapshots.remove_label_values(&[class]);
        let _ = self.provisioned_bytes.remove_label_values(&[class]);
        for kind in ["available", "total"] {
            let _ = self.capacity_bytes.remove_label_values(&[class, kind]);
        }
        self.clear_storage(class);
        self.clear_thin_pool_usage(class);
        for status in StorageHealth::STATUSES {
            let _ = self.storage_health.remove_label_values(&[class, status]);
        }
        self.unhealthy_storage().remove(class);
        self.stats_errors.with_label_values(&[class]).inc();
    }

    /// How full a class's thin pool is, as LVM reports it (`data_percent`,
    /// `metadata_percent`, 0-100), set by each stats refresh. Exported as ratios (0-1):
    /// `localvol_thin_pool_data_ratio` and `localvol_thin_pool_metadata_ratio`.
    pub fn set_thin_pool_usage(&self, class: &ClassName, data_percent: f64, metadata_percent: f64) {
        let m = self.thin_pool.get_or_init(|| ThinPoolMetrics {
            data: register(
                &self.registry,
                GaugeVec::new(
                    Opts::new(
                        "thin_pool_data_ratio",
                        "Fraction of a device class's thin pool data space in use",
                    ),
                    &["device_class"],
                )
                .expect("valid metric"),
            ),
            metadata: register(
                &self.registry,
                GaugeVec::new(
                    Opts::new(
                        "thin_pool_metadata_ratio",
                        "Fraction of a device class's thin pool metadata space in use",
                    ),
                    &["device_class"],
                )
                .expect("valid metric"),
            ),
        });
        m.data
            .with_label_values(&[class.as_str()])
            .set(data_percent / 100.0);
        m.metadata
            .with_label_values(&[class.as_str()])
            .set(metadata_percent / 100.0);
    }

    /// Hook for node-side resize: one expansion of a volume of `class` finished with
    /// `result` (a short fixed label such as `ok` or an error variant). Exports
    /// `localvol_resize_operations_total{device_class,result}`.
    pub fn observe_resize(&self, class: &ClassName, result: &'static str) {
        self.resize
            .get_or_init(|| {
                int_counters(
                    &self.registry,
                    "resize_operations_total",
                    "Volume expansions on this node by device class and result",
                    &["device_class", "result"],
                )
            })
            .with_label_values(&[class.as_str(), result])
            .inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut families = self.registry.gather();
        families.extend(self.process.gather());
        let mut buffer = Vec::new();
        TextEncoder::new()
            .encode(&families, &mut buffer)
            .expect("text encoding cannot fail");
        String::from_utf8(buffer).expect("prometheus text is UTF-8")
    }
}

#[derive(Clone)]
struct HttpState {
    metrics: Metrics,
    health: Arc<Health>,
}

async fn render_metrics(State(state): State<HttpState>) -> ([(header::HeaderName, &'static str); 1], String) {
    (
        [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
        state.metrics.render(),
    )
}

async fn healthz(State(state): State<HttpState>) -> (StatusCode, String) {
    match state.health.liveness() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

async fn readyz(State(state): State<HttpState>) -> (StatusCode, String) {
    let (code, mut body) = match state.health.readiness().await {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    };
    for missing in state.health.missing_classes() {
        body += &format!("device class {} not served: {}\n", missing.class, missing.reason);
    }
    body += &state.metrics.health_notes();
    (code, body)
}

/// Binds the metrics/health listener (so a bad address fails start-up) and returns the
/// future that serves it until `shutdown` resolves.
pub async fn serve_http(
    addr: SocketAddr,
    metrics: Metrics,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<impl std::future::Future<Output = std::io::Result<()>>> {
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(HttpState { metrics, health });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    Ok(async move { axum::serve(listener, app).with_graceful_shutdown(shutdown).await })
}

#[cfg(test)]
mod tests;
