use super::*;

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn next(schedule: &str, after: &str) -> String {
    Schedule::parse(schedule)
        .unwrap()
        .next_after(ts(after))
        .unwrap()
        .to_string()
}

#[test]
fn descriptors_fire_at_their_boundaries() {
    // 2024-05-15 is a Wednesday.
    assert_eq!(next("@hourly", "2024-05-15T10:20:00Z"), "2024-05-15T11:00:00Z");
    assert_eq!(next("@hourly", "2024-05-15T10:00:00Z"), "2024-05-15T11:00:00Z");
    assert_eq!(next("@daily", "2024-05-15T10:20:00Z"), "2024-05-16T00:00:00Z");
    assert_eq!(next("@weekly", "2024-05-15T10:20:00Z"), "2024-05-19T00:00:00Z");
    assert_eq!(next("@monthly", "2024-05-15T10:20:00Z"), "2024-06-01T00:00:00Z");
    assert_eq!(next("@yearly", "2024-05-15T10:20:00Z"), "2025-01-01T00:00:00Z");
    assert_eq!(next("@midnight", "2024-12-31T23:59:59Z"), "2025-01-01T00:00:00Z");
    assert_eq!(Schedule::parse(" @daily ").unwrap(), Schedule::Daily);
}

#[test]
fn cron_expressions() {
    assert_eq!(
        next("*/15 * * * *", "2024-05-15T10:20:00Z"),
        "2024-05-15T10:30:00Z"
    );
    assert_eq!(next("30 2 * * *", "2024-05-15T02:30:00Z"), "2024-05-16T02:30:00Z");
    assert_eq!(
        next("0 3 * * mon-fri", "2024-05-17T04:00:00Z"),
        "2024-05-20T03:00:00Z"
    );
    assert_eq!(next("0 0 29 2 *", "2024-03-01T00:00:00Z"), "2028-02-29T00:00:00Z");
    assert_eq!(next("0 0 31 * *", "2024-04-01T00:00:00Z"), "2024-05-31T00:00:00Z");
    assert_eq!(
        next("5/20 1 * JAN,jul *", "2024-05-15T00:00:00Z"),
        "2024-07-01T01:05:00Z"
    );
    assert_eq!(next("0 12 * * ?", "2024-05-15T12:00:30Z"), "2024-05-16T12:00:00Z");
    // Both day fields restricted: either one fires (the 1st, or a Friday).
    assert_eq!(next("0 0 1 * 5", "2024-05-15T00:00:00Z"), "2024-05-17T00:00:00Z");
    assert_eq!(next("0 0 1 * 5", "2024-05-25T00:00:00Z"), "2024-05-31T00:00:00Z");
    assert_eq!(next("0 0 1 * 5", "2024-05-31T00:00:00Z"), "2024-06-01T00:00:00Z");
    // One day field `*`: both must hold.
    assert_eq!(next("0 0 * 5 1", "2024-05-15T00:00:00Z"), "2024-05-20T00:00:00Z");
    assert_eq!(
        next("59 23 31 12 *", "2024-12-31T23:59:00Z"),
        "2025-12-31T23:59:00Z"
    );
}

#[test]
fn an_impossible_date_never_fires() {
    let s = Schedule::parse("0 0 30 2 *").unwrap();
    assert_eq!(s.next_after(ts("2024-01-01T00:00:00Z")), None);
}

#[test]
fn invalid_schedules_say_why() {
    for (text, why) in [
        ("", "expected 5 fields"),
        ("* * * *", "expected 5 fields"),
        ("0 0 * * * *", "expected 5 fields"),
        ("60 * * * *", "outside 0-59"),
        ("* 24 * * *", "outside 0-23"),
        ("* * 0 * *", "outside 1-31"),
        ("* * * 13 *", "outside 1-12"),
        ("* * * * 7", "outside 0-6"),
        ("5-1 * * * *", "backwards"),
        ("*/0 * * * *", "positive"),
        ("x * * * *", "not a number"),
        ("* * * foo *", "not a number"),
        ("@fortnightly", "unknown descriptor"),
        ("@every 1h", "@every"),
        ("CRON_TZ=Europe/Paris 0 0 * * *", "UTC"),
    ] {
        let err = Schedule::parse(text).unwrap_err();
        assert!(err.to_string().contains(why), "{text:?}: {err}");
    }
}

#[test]
fn display_keeps_the_text() {
    assert_eq!(Schedule::parse("@weekly").unwrap().to_string(), "@weekly");
    assert_eq!(Schedule::parse("0  3 * * *").unwrap().to_string(), "0 3 * * *");
    assert_eq!(Schedule::parse("@annually").unwrap().to_string(), "@annually");
}

#[test]
fn stagger_is_deterministic_and_inside_the_window() {
    let span = 2 * 3600;
    let a = stagger_offset("0b1c6c0e-52a4-4d6e-9f38-8c1c8f1b2a11", span);
    assert_eq!(a, stagger_offset("0b1c6c0e-52a4-4d6e-9f38-8c1c8f1b2a11", span));
    assert!((0..span).contains(&a));
    // FNV-1a 32 of "a" is 0xe40c292c.
    assert_eq!(stagger_offset("a", i64::from(u32::MAX) + 1), 0xe40c_292c);
    assert_eq!(stagger_offset("anything", 0), 0);
    assert_eq!(stagger_offset("anything", -5), 0);
    // Different volumes land at different offsets.
    let offsets: std::collections::BTreeSet<_> = (0..50)
        .map(|i| stagger_offset(&format!("uid-{i}"), span))
        .collect();
    assert!(offsets.len() > 45, "{offsets:?}");
}

#[test]
fn staggered_runs_shift_each_fire_time_and_never_skip_one() {
    let window = Duration::from_secs(2 * 3600);
    let key = "uid-7";
    let offset = stagger_offset(key, 2 * 3600);
    let daily = Schedule::Daily;
    let first = daily
        .next_staggered_after(ts("2024-05-15T00:00:00Z"), key, window)
        .unwrap();
    assert_eq!(first.as_second() - ts("2024-05-15T00:00:00Z").as_second(), offset);
    // Asking again from between the raw and the staggered time still finds it.
    let between = ts("2024-05-15T00:00:01Z");
    if offset > 1 {
        assert_eq!(daily.next_staggered_after(between, key, window), Some(first));
    }
    // From the staggered time itself, the next day's.
    let second = daily.next_staggered_after(first, key, window).unwrap();
    assert_eq!(second.as_second() - first.as_second(), 86_400);
    // An hourly schedule's window is capped at its hour.
    let hourly = Schedule::Hourly
        .next_staggered_after(ts("2024-05-15T10:00:00Z"), key, window)
        .unwrap();
    let into_hour = hourly.as_second() - ts("2024-05-15T10:00:00Z").as_second();
    assert_eq!(into_hour, stagger_offset(key, 3600));
    // No window: the raw time.
    assert_eq!(
        daily.next_staggered_after(ts("2024-05-15T10:00:00Z"), key, Duration::ZERO),
        Some(ts("2024-05-16T00:00:00Z"))
    );
}
