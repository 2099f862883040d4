//! Prometheus metrics and the HTTP endpoint that serves them with the health checks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::health::Health;

/// Every metric localvol exports, registered under the `localvol_` prefix.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    rpc_total: IntCounterVec,
    rpc_duration: HistogramVec,
    pub volumes: IntGaugeVec,
    pub capacity_bytes: IntGaugeVec,
    pub reclaim: ReclaimMetrics,
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

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new_custom(Some("localvol".to_string()), None).expect("valid prefix");
        let rpc_total = IntCounterVec::new(
            Opts::new("rpc_requests_total", "CSI gRPC calls by method and status code"),
            &["method", "code"],
        )
        .expect("valid metric");
        let rpc_duration = HistogramVec::new(
            HistogramOpts::new(
                "rpc_duration_seconds",
                "CSI gRPC call latency by method and status code",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
            ]),
            &["method", "code"],
        )
        .expect("valid metric");
        let volumes = IntGaugeVec::new(
            Opts::new("volumes", "Volumes per device class"),
            &["device_class"],
        )
        .expect("valid metric");
        let capacity_bytes = IntGaugeVec::new(
            Opts::new(
                "capacity_bytes",
                "Capacity per device class: kind is available or total",
            ),
            &["device_class", "kind"],
        )
        .expect("valid metric");
        let build_info = IntGaugeVec::new(
            Opts::new("build_info", "Always 1; the version of this daemon"),
            &["version"],
        )
        .expect("valid metric");
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        for collector in [
            Box::new(rpc_total.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(rpc_duration.clone()),
            Box::new(volumes.clone()),
            Box::new(capacity_bytes.clone()),
            Box::new(build_info),
        ] {
            registry.register(collector).expect("unique metric");
        }
        let reclaim = ReclaimMetrics::new();
        for collector in [
            Box::new(reclaim.reclaimed_bytes.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(reclaim.trimmed_bytes.clone()),
            Box::new(reclaim.duration.clone()),
            Box::new(reclaim.runs.clone()),
        ] {
            registry.register(collector).expect("unique metric");
        }
        Self {
            registry,
            rpc_total,
            rpc_duration,
            volumes,
            capacity_bytes,
            reclaim,
        }
    }

    pub fn observe_rpc(&self, method: &str, code: tonic::Code, started: Instant) {
        let code = format!("{code:?}");
        self.rpc_total.with_label_values(&[method, &code]).inc();
        self.rpc_duration
            .with_label_values(&[method, &code])
            .observe(started.elapsed().as_secs_f64());
    }

    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buffer)
            .expect("text encoding cannot fail");
        String::from_utf8(buffer).expect("prometheus text is UTF-8")
    }
}

#[derive(Clone)]
struct HttpState {
    metrics: Metrics,
    health: Arc<Health>,
}

async fn render_metrics(State(state): State<HttpState>) -> String {
    state.metrics.render()
}

async fn healthz(State(state): State<HttpState>) -> (StatusCode, String) {
    match state.health.liveness() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

async fn readyz(State(state): State<HttpState>) -> (StatusCode, String) {
    match state.health.readiness().await {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
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
