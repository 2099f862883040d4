//! The human output of `localvol status`: a table of the volumes and one of the
//! snapshots, in Kubernetes-like units and ages.

use std::path::PathBuf;

use k8s_openapi::jiff::Timestamp;

use super::{ReclaimStatus, ResizeStatus, SnapshotStatus, StatusReport};

/// Bytes in binary units: `1Gi`, `1.5Gi`, `512Mi`, `100`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["Ki", "Mi", "Gi", "Ti", "Pi"];
    if bytes < 1024 {
        return bytes.to_string();
    }
    let mut value = bytes as f64;
    let mut unit = "";
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    let text = format!("{value:.1}");
    format!("{}{unit}", text.strip_suffix(".0").unwrap_or(&text))
}

fn paths(list: &[PathBuf]) -> String {
    if list.is_empty() {
        "-".to_string()
    } else {
        list.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// How long before `now` an RFC 3339 time was: `40s`, `5m`, `3h`, `2d`.
pub(super) fn age(at: &str, now: Timestamp) -> String {
    let Ok(at) = at.parse::<Timestamp>() else {
        return at.to_string();
    };
    let secs = now.as_second().saturating_sub(at.as_second()).max(0);
    match secs {
        0..120 => format!("{secs}s"),
        120..7200 => format!("{}m", secs / 60),
        7200..172_800 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

pub(super) fn reclaim_cell(r: &ReclaimStatus, now: Timestamp) -> String {
    let ago = age(&r.finished_at, now);
    match r.result {
        "trimmed" => format!("ok {} ({ago} ago)", human_bytes(r.reclaimed_bytes.unwrap_or(0))),
        "not_discarded" => format!("skipped: raw block ({ago} ago)"),
        _ => format!("failed ({ago} ago)"),
    }
}

/// A tool's multi-line message as one table cell: its lines joined by `; `.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

pub(super) fn resize_cell(r: &ResizeStatus, now: Timestamp) -> String {
    let ago = age(&r.updated_at, now);
    let size = human_bytes(r.size_bytes);
    match r.state {
        "in_progress" => format!("expanding to {size} ({}, {ago} ago)", r.step),
        "node_expansion_pending" => format!("{size}, node expansion pending ({ago} ago)"),
        "done" => format!("done {size} ({ago} ago)"),
        _ => format!(
            "failed to {size} ({}, {ago} ago): {}",
            r.step,
            one_line(r.reason.as_deref().unwrap_or("no reason given"))
        ),
    }
}

/// The table `localvol status` prints by default.
pub fn render_table(report: &StatusReport) -> String {
    render_table_at(report, Timestamp::now())
}

/// The tables, with ages counted back from `now`: the volumes (and a line for each
/// abnormal one, saying why), then the snapshots per class when there are any. In the volume table the last two cells may hold spaces,
/// in the snapshot table the last one; every other cell is a single word.
pub fn render_table_at(report: &StatusReport, now: Timestamp) -> String {
    let dash = || "-".to_string();
    let mut rows = vec![
        [
            "ID",
            "CLASS",
            "SIZE",
            "USED",
            "STAGED",
            "PUBLISHED",
            "PVC",
            "POD",
            "LAST-RECLAIM",
            "RESIZE",
            "ENCRYPTION",
            "HEALTH",
        ]
        .map(str::to_string),
    ];
    for v in &report.volumes {
        let pods: Vec<String> = v
            .pods
            .iter()
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        rows.push([
            v.id.clone(),
            v.device_class.clone().unwrap_or_else(dash),
            human_bytes(v.size_bytes),
            v.used_bytes.map(human_bytes).unwrap_or_else(dash),
            paths(&v.staged_paths),
            paths(&v.published_paths),
            v.pvc
                .as_ref()
                .map(|c| format!("{}/{}", c.namespace, c.name))
                .unwrap_or_else(dash),
            if pods.is_empty() { dash() } else { pods.join(",") },
            v.last_reclaim
                .as_ref()
                .map(|r| reclaim_cell(r, now))
                .unwrap_or_else(dash),
            v.resize_state
                .as_ref()
                .map(|r| resize_cell(r, now))
                .unwrap_or_else(dash),
            v.encryption.map(str::to_string).unwrap_or_else(dash),
            match &v.condition {
                Some(c) if c.abnormal => "abnormal".to_string(),
                Some(_) => "healthy".to_string(),
                None => dash(),
            },
        ]);
    }
    let mut out = format!("NODE {}\n", report.node);
    aligned(&rows, &mut out);
    // What is wrong, in the daemon's words: too long for a cell.
    for v in &report.volumes {
        if let Some(c) = v.condition.as_ref().filter(|c| c.abnormal) {
            out.push_str(&format!("ABNORMAL {}: {}\n", v.id, one_line(&c.message)));
        }
    }
    if !report.snapshots.is_empty() {
        out.push('\n');
        let mut rows = vec![["SNAPSHOT", "CLASS", "SOURCE", "SIZE", "CREATED"].map(str::to_string)];
        for s in &report.snapshots {
            rows.push([
                s.id.clone(),
                s.device_class.clone().unwrap_or_else(dash),
                s.source_volume_id.clone(),
                human_bytes(s.size_bytes),
                created_cell(s, now),
            ]);
        }
        aligned(&rows, &mut out);
    }
    out
}

/// When a snapshot was taken, to the second, and how long ago.
fn created_cell(s: &SnapshotStatus, now: Timestamp) -> String {
    let Some(at) = &s.created_at else {
        return "-".to_string();
    };
    let whole = at
        .parse::<Timestamp>()
        .ok()
        .and_then(|t| Timestamp::from_second(t.as_second()).ok())
        .map_or_else(|| at.clone(), |t| t.to_string());
    format!("{whole} ({} ago)", age(at, now))
}

/// Rows as left-aligned columns two spaces apart, without trailing blanks.
fn aligned<const N: usize>(rows: &[[String; N]], out: &mut String) {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
}
