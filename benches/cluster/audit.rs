//! API requests made by each driver's pods, from the API server's audit log (run with
//! Metadata level for the drivers' service accounts): the API server's own count, by
//! user and user agent, of requests received in a window.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(rename = "auditID")]
    audit_id: String,
    request_received_timestamp: String,
    user: User,
    #[serde(default)]
    user_agent: String,
    verb: String,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
}

#[derive(Deserialize)]
struct User {
    username: String,
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
}

/// Requests of one service account in a window: in all, and by "agent verb resource".
#[derive(Debug, Default, serde::Serialize)]
pub struct Requests {
    pub total: usize,
    pub by_call: BTreeMap<String, usize>,
}

/// Microseconds since the epoch of an RFC 3339 UTC time as the API server writes it
/// (`2026-11-26T12:00:01.123456Z`).
fn micros_of(stamp: &str) -> Option<i64> {
    let (date, time) = stamp.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>());
    let (h, min, s) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let frac: String = frac.chars().chain(std::iter::repeat('0')).take(6).collect();
    // Days from 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + h) * 60 + min) * 60_000_000 + s * 1_000_000 + frac.parse::<i64>().ok()?)
}

pub fn micros_since_epoch(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The requests `user` made that the API server received in [from, to].
pub fn requests(log: &Path, user: &str, from: SystemTime, to: SystemTime) -> std::io::Result<Requests> {
    let (from, to) = (micros_since_epoch(from), micros_since_epoch(to));
    let text = std::fs::read_to_string(log)?;
    let mut seen = std::collections::HashSet::new();
    let mut out = Requests::default();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<Event>(line) else {
            continue;
        };
        if event.user.username != user {
            continue;
        }
        let Some(at) = micros_of(&event.request_received_timestamp) else {
            continue;
        };
        // A watch has two stages (ResponseStarted, ResponseComplete): one request.
        if at < from || at > to || !seen.insert(event.audit_id) {
            continue;
        }
        let agent = event.user_agent.split('/').next().unwrap_or_default().to_string();
        let resource = event.object_ref.map(|o| o.resource).unwrap_or_default();
        *out.by_call
            .entry(format!("{agent} {} {resource}", event.verb))
            .or_default() += 1;
        out.total += 1;
    }
    Ok(out)
}

/// Checks the timestamp parser on known values (this bench has no test harness; a
/// wrong parse would count nothing and read as "no requests").
pub fn self_check() {
    assert_eq!(micros_of("1970-01-01T00:00:00.000000Z"), Some(0));
    assert_eq!(
        micros_of("2026-11-26T12:00:01.123456Z"),
        Some(1_795_694_401_123_456)
    );
    assert_eq!(micros_of("2000-03-01T00:00:00Z"), Some(951_868_800_000_000));
    assert_eq!(micros_of("garbage"), None);
}
