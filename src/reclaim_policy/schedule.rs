//! Schedules as csi-addons writes them: `@hourly`, `@daily`, `@weekly`, `@monthly` (and
//! `@yearly`/`@annually`/`@midnight`), or a standard five-field cron expression
//! (`minute hour day-of-month month day-of-week`), evaluated in UTC.
//!
//! The accepted grammar is the one csi-addons validates annotations with (robfig/cron's
//! standard parser): `*`, `?`, numbers, `a-b` ranges, `/step`, comma lists, month and
//! weekday names, weekdays 0-6 with 0 = Sunday; when both day fields are restricted a day
//! matching either one fires (Vixie cron). Two forms that parser also takes are refused
//! here, so they fall back to `@weekly` with a warning: `@every <duration>` (a fixed
//! interval from whenever the daemon started is not a schedule a node should keep) and a
//! `TZ=`/`CRON_TZ=` prefix (localvol evaluates every schedule in UTC).
//!
//! Everything here is pure: no clock, no I/O.

use std::fmt;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use k8s_openapi::jiff::civil::{self, DateTime};
use k8s_openapi::jiff::tz::TimeZone;

/// A parsed schedule. The descriptor variants keep their name for display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schedule {
    Hourly,
    Daily,
    Weekly,
    Monthly,
    /// A cron expression (or `@yearly`, `@annually`, `@midnight`), with its text.
    Cron(CronExpr),
}

/// The schedule an invalid one falls back to, as in csi-addons.
pub const FALLBACK: Schedule = Schedule::Weekly;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("schedule {text:?} is invalid: {reason}")]
pub struct ScheduleError {
    pub text: String,
    pub reason: String,
}

/// A five-field cron expression as bit sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronExpr {
    text: String,
    minutes: u64,
    hours: u32,
    /// Bits 1..=31.
    days_of_month: u32,
    /// Bits 1..=12.
    months: u16,
    /// Bits 0..=6, 0 = Sunday.
    days_of_week: u8,
    /// A day field given as `*`/`?` leaves the decision to the other one.
    dom_any: bool,
    dow_any: bool,
}

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
};
const DAY_OF_MONTH: Field = Field {
    name: "day of month",
    min: 1,
    max: 31,
    names: &[],
};
// Index 0 is unused so that a name's index is its number.
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "", "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
const DAY_OF_WEEK: Field = Field {
    name: "day of week",
    min: 0,
    max: 6,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

impl Field {
    fn value(&self, token: &str) -> Result<u32, String> {
        let lower = token.to_ascii_lowercase();
        if let Some(i) = self.names.iter().position(|n| !n.is_empty() && *n == lower) {
            return Ok(i as u32);
        }
        token
            .parse::<u32>()
            .map_err(|_| format!("{}: {token:?} is not a number", self.name))
    }

    /// Parses one comma-separated field into a bit set; the flag says it was `*`/`?`.
    fn parse(&self, text: &str) -> Result<(u64, bool), String> {
        let mut bits = 0u64;
        let mut any = false;
        for item in text.split(',') {
            let (range, step) = match item.split_once('/') {
                Some((range, step)) => {
                    let step: u32 = step
                        .parse()
                        .map_err(|_| format!("{}: step {step:?} is not a number", self.name))?;
                    (range, Some(step))
                }
                None => (item, None),
            };
            let (start, end) = if range == "*" || range == "?" {
                any |= step.unwrap_or(1) == 1 && text.split(',').count() == 1;
                (self.min, self.max)
            } else {
                match range.split_once('-') {
                    Some((a, b)) => (self.value(a)?, self.value(b)?),
                    // `a/step` runs from a to the end of the field.
                    None if step.is_some() => (self.value(range)?, self.max),
                    None => {
                        let v = self.value(range)?;
                        (v, v)
                    }
                }
            };
            if start < self.min || end > self.max {
                return Err(format!(
                    "{}: {item:?} is outside {}-{}",
                    self.name, self.min, self.max
                ));
            }
            if start > end {
                return Err(format!("{}: {item:?} runs backwards", self.name));
            }
            let step = step.unwrap_or(1);
            if step == 0 {
                return Err(format!("{}: a step must be positive", self.name));
            }
            let mut v = start;
            while v <= end {
                bits |= 1 << v;
                v += step;
            }
        }
        Ok((bits, any))
    }
}

impl CronExpr {
    pub fn parse(text: &str) -> Result<Self, String> {
        let fields: Vec<&str> = text.split_whitespace().collect();
        let [minute, hour, dom, month, dow] = fields[..] else {
            return Err(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), found {}",
                fields.len()
            ));
        };
        let (minutes, _) = MINUTE.parse(minute)?;
        let (hours, _) = HOUR.parse(hour)?;
        let (days_of_month, dom_any) = DAY_OF_MONTH.parse(dom)?;
        let (months, _) = MONTH.parse(month)?;
        let (days_of_week, dow_any) = DAY_OF_WEEK.parse(dow)?;
        Ok(Self {
            text: fields.join(" "),
            minutes,
            hours: hours as u32,
            days_of_month: days_of_month as u32,
            months: months as u16,
            days_of_week: days_of_week as u8,
            dom_any,
            dow_any,
        })
    }

    fn day_matches(&self, date: civil::Date) -> bool {
        let dom = self.days_of_month & (1 << date.day()) != 0;
        let dow = self.days_of_week & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        if self.dom_any || self.dow_any {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The first minute strictly after `after` that matches, within five years (an
    /// expression such as `0 0 30 2 *` never matches).
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let start = after.as_second().div_euclid(60) * 60 + 60;
        let dt = Timestamp::from_second(start)
            .ok()?
            .to_zoned(TimeZone::UTC)
            .datetime();
        let (mut year, mut month, mut day) = (dt.year(), dt.month(), dt.day());
        let (mut hour, mut minute) = (dt.hour(), dt.minute());
        let last_year = year + 5;
        while year <= last_year {
            if self.months & (1 << month) == 0 {
                (day, hour, minute) = (1, 0, 0);
                (year, month) = if month == 12 {
                    (year + 1, 1)
                } else {
                    (year, month + 1)
                };
                continue;
            }
            let date = civil::Date::new(year, month, day).ok()?;
            if !self.day_matches(date) {
                (hour, minute) = (0, 0);
                if day == date.days_in_month() {
                    day = 1;
                    (year, month) = if month == 12 {
                        (year + 1, 1)
                    } else {
                        (year, month + 1)
                    };
                } else {
                    day += 1;
                }
                continue;
            }
            if self.hours & (1 << hour) == 0 {
                minute = 0;
                if hour == 23 {
                    hour = 0;
                    advance_day(&mut year, &mut month, &mut day, date);
                } else {
                    hour += 1;
                }
                continue;
            }
            if self.minutes & (1 << minute) == 0 {
                if minute == 59 {
                    minute = 0;
                    if hour == 23 {
                        hour = 0;
                        advance_day(&mut year, &mut month, &mut day, date);
                    } else {
                        hour += 1;
                    }
                } else {
                    minute += 1;
                }
                continue;
            }
            let found = DateTime::new(year, month, day, hour, minute, 0, 0).ok()?;
            return found.to_zoned(TimeZone::UTC).ok().map(|z| z.timestamp());
        }
        None
    }
}

fn advance_day(year: &mut i16, month: &mut i8, day: &mut i8, date: civil::Date) {
    if *day == date.days_in_month() {
        *day = 1;
        if *month == 12 {
            *year += 1;
            *month = 1;
        } else {
            *month += 1;
        }
    } else {
        *day += 1;
    }
}

impl Schedule {
    pub fn parse(text: &str) -> Result<Self, ScheduleError> {
        let trimmed = text.trim();
        let error = |reason: String| ScheduleError {
            text: text.to_string(),
            reason,
        };
        let cron = |expr: &str| {
            CronExpr::parse(expr).map(|mut c| {
                c.text = trimmed.to_string();
                Schedule::Cron(c)
            })
        };
        match trimmed {
            "@hourly" => Ok(Schedule::Hourly),
            "@daily" => Ok(Schedule::Daily),
            "@weekly" => Ok(Schedule::Weekly),
            "@monthly" => Ok(Schedule::Monthly),
            "@yearly" | "@annually" => cron("0 0 1 1 *").map_err(error),
            "@midnight" => cron("0 0 * * *").map_err(error),
            t if t.starts_with("@every") => Err(error(
                "@every intervals are not supported by localvol; use a cron expression".to_string(),
            )),
            t if t.starts_with('@') => Err(error(format!("unknown descriptor {t}"))),
            t if t.starts_with("TZ=") || t.starts_with("CRON_TZ=") => Err(error(
                "time zone prefixes are not supported; localvol evaluates schedules in UTC".to_string(),
            )),
            t => CronExpr::parse(t).map(Schedule::Cron).map_err(error),
        }
    }

    fn expr(&self) -> CronExpr {
        let fixed = |s: &str| CronExpr::parse(s).expect("descriptor expressions parse");
        match self {
            Schedule::Hourly => fixed("0 * * * *"),
            Schedule::Daily => fixed("0 0 * * *"),
            Schedule::Weekly => fixed("0 0 * * 0"),
            Schedule::Monthly => fixed("0 0 1 * *"),
            Schedule::Cron(c) => c.clone(),
        }
    }

    /// The first time strictly after `after` this schedule fires, unstaggered.
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        self.expr().next_after(after)
    }

    /// The first staggered run strictly after `after`: each raw fire time `r` moves to
    /// `r + stagger_offset(key, window capped at the gap to the fire after r)`, as
    /// csi-addons staggers its CronJobs. Deterministic for a key, whatever `after` is, so
    /// recomputing it (after a restart or an annotation change) never skips or repeats a
    /// run.
    pub fn next_staggered_after(&self, after: Timestamp, key: &str, window: Duration) -> Option<Timestamp> {
        let expr = self.expr();
        let window_secs = window.as_secs() as i64;
        // A staggered time after `after` comes from a raw time after `after - window`.
        let mut raw = expr.next_after(after.checked_sub(jiff_secs(window_secs)).ok()?)?;
        loop {
            let following = expr.next_after(raw)?;
            let span = (following.as_second() - raw.as_second()).min(window_secs);
            let staggered = raw.checked_add(jiff_secs(stagger_offset(key, span))).ok()?;
            if staggered > after {
                return Some(staggered);
            }
            raw = following;
        }
    }
}

fn jiff_secs(secs: i64) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_secs(secs)
}

/// Seconds in `[0, span)` chosen by a 32-bit FNV-1a hash of `key` (a PVC's UID), so the
/// runs of one schedule spread across the window yet stay put for each volume. Zero when
/// the span is not positive (staggering disabled).
pub fn stagger_offset(key: &str, span_secs: i64) -> i64 {
    if span_secs <= 0 {
        return 0;
    }
    let mut hash: u32 = 0x811c_9dc5;
    for byte in key.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    i64::from(hash) % span_secs
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Hourly => f.write_str("@hourly"),
            Schedule::Daily => f.write_str("@daily"),
            Schedule::Weekly => f.write_str("@weekly"),
            Schedule::Monthly => f.write_str("@monthly"),
            Schedule::Cron(c) => f.write_str(&c.text),
        }
    }
}

#[cfg(test)]
mod tests;
