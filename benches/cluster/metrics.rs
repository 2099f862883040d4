//! Time spent in each CSI call, from two sources read through the API server: kubelet's
//! `csi_operations_seconds` (the same clock for both drivers: what kubelet waited for)
//! and localvol's own `localvol_rpc_duration_seconds`.

use std::collections::BTreeMap;

use kube::Client;

/// Sum (seconds) and count of a histogram, per CSI method.
#[derive(Clone, Debug, Default)]
pub struct Histograms(BTreeMap<String, (f64, f64)>);

impl Histograms {
    /// Mean milliseconds per call of `method` between `before` and `self`.
    pub fn mean_ms_since(&self, before: &Histograms, method: &str) -> Option<f64> {
        let (sum, count) = self.0.get(method).copied().unwrap_or_default();
        let (sum0, count0) = before.0.get(method).copied().unwrap_or_default();
        (count > count0).then(|| (sum - sum0) / (count - count0) * 1000.0)
    }
}

/// `name{labels} value` lines of the Prometheus text format: labels as pairs.
fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (Vec<(&'a str, &'a str)>, f64)> + 'a {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        let pairs = labels
            .split("\",")
            .filter(|p| !p.is_empty())
            .filter_map(|p| {
                let (k, v) = p.split_once("=\"")?;
                Some((k.trim_matches(','), v.trim_end_matches('"')))
            })
            .collect();
        Some((pairs, value.trim().parse().ok()?))
    })
}

/// The histogram `name` summed per value of `key`, over the samples `keep` accepts.
fn histograms(text: &str, name: &str, key: &str, keep: impl Fn(&[(&str, &str)]) -> bool) -> Histograms {
    let mut out = BTreeMap::<String, (f64, f64)>::new();
    for (suffix, slot) in [("_sum", 0), ("_count", 1)] {
        for (labels, value) in samples(text, &format!("{name}{suffix}")) {
            if !keep(&labels) {
                continue;
            }
            let Some((_, method)) = labels.iter().find(|(k, _)| *k == key) else {
                continue;
            };
            let method = method.rsplit('/').next().unwrap_or(method).to_string();
            let entry = out.entry(method).or_default();
            if slot == 0 {
                entry.0 += value
            } else {
                entry.1 += value
            }
        }
    }
    Histograms(out)
}

async fn get(client: &Client, path: &str) -> Result<String, String> {
    let request = http::Request::get(path).body(vec![]).map_err(|e| e.to_string())?;
    client
        .request_text(request)
        .await
        .map_err(|e| format!("GET {path}: {e}"))
}

/// kubelet's view of each driver's node calls.
pub async fn kubelet(client: &Client, node: &str, driver: &str) -> Result<Histograms, String> {
    let text = get(client, &format!("/api/v1/nodes/{node}/proxy/metrics")).await?;
    Ok(histograms(
        &text,
        "csi_operations_seconds",
        "method_name",
        |labels| labels.contains(&("driver_name", driver)),
    ))
}

/// localvol's own view of its calls (the daemon pod's metrics port).
pub async fn localvol(client: &Client, namespace: &str, pod: &str) -> Result<Histograms, String> {
    let text = get(
        client,
        &format!("/api/v1/namespaces/{namespace}/pods/{pod}:9808/proxy/metrics"),
    )
    .await?;
    Ok(histograms(
        &text,
        "localvol_rpc_duration_seconds",
        "method",
        |_| true,
    ))
}

/// Checks the parser on the two formats it reads (no test harness in this bench).
pub fn self_check() {
    let text = "csi_operations_seconds_sum{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\"} 0.5\n\
                csi_operations_seconds_count{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\"} 2\n\
                csi_operations_seconds_count{driver_name=\"e\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\"} 9\n";
    let h = histograms(text, "csi_operations_seconds", "method_name", |l| {
        l.contains(&("driver_name", "d"))
    });
    assert_eq!(
        h.mean_ms_since(&Histograms::default(), "NodeStageVolume"),
        Some(250.0)
    );
    let text = "localvol_rpc_duration_seconds_sum{code=\"Ok\",method=\"CreateVolume\"} 0.03\n\
                localvol_rpc_duration_seconds_count{code=\"Ok\",method=\"CreateVolume\"} 3\n";
    let h = histograms(text, "localvol_rpc_duration_seconds", "method", |_| true);
    let ms = h.mean_ms_since(&Histograms::default(), "CreateVolume").unwrap();
    assert!((ms - 10.0).abs() < 1e-9, "{ms}");
}
