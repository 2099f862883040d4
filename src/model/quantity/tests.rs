use super::*;

#[test]
fn sizes_parse_as_kubernetes_quantities() {
    let cases: &[(&str, u64)] = &[
        // Binary suffixes.
        ("1Ki", 1 << 10),
        ("10Gi", 10 << 30),
        ("1536Mi", 1536 << 20),
        ("2Ti", 2 << 40),
        ("1Pi", 1 << 50),
        ("3Ei", 3 << 60),
        // Decimal suffixes.
        ("1k", 1_000),
        ("500M", 500_000_000),
        ("1G", 1_000_000_000),
        ("2T", 2_000_000_000_000),
        ("1P", 1_000_000_000_000_000),
        ("1E", 1_000_000_000_000_000_000),
        // Plain numbers, decimals and exponents.
        ("4096", 4096),
        ("0", 0),
        ("+1Gi", 1 << 30),
        ("-0", 0),
        ("1.5Gi", 3 << 29),
        (".5Gi", 1 << 29),
        ("2.Gi", 2 << 30),
        ("2e9", 2_000_000_000),
        ("2E3", 2000),
        ("1e+3", 1000),
        ("1.5e3", 1500),
        ("15e-1", 2),
        // A fraction of a byte rounds up, as Kubernetes rounds a quantity's value.
        ("1.5", 2),
        ("1e-50", 1),
        ("0.0001k", 1),
        (" 100Gi ", 100 << 30),
        ("15Ei", 15 << 60),
    ];
    for (text, bytes) in cases {
        assert_eq!(parse_bytes(text), Ok(*bytes), "{text}");
    }
}

#[test]
fn what_kubernetes_refuses_is_refused_with_a_reason() {
    let malformed = |t: &str| QuantityError::Malformed { text: t.to_string() };
    let unknown = |t: &str, s: &str| QuantityError::UnknownSuffix {
        text: t.to_string(),
        suffix: s.to_string(),
    };
    let cases: Vec<(&str, QuantityError)> = vec![
        ("", malformed("")),
        ("Gi", malformed("Gi")),
        (".", malformed(".")),
        ("1.2.3", malformed("1.2.3")),
        ("1 Gi", malformed("1 Gi")),
        ("1e", malformed("1e")),
        ("1e1.5", malformed("1e1.5")),
        ("--1", malformed("--1")),
        ("1Qi", unknown("1Qi", "Qi")),
        ("1gi", unknown("1gi", "gi")),
        ("1GB", unknown("1GB", "GB")),
        ("1Gib", unknown("1Gib", "Gib")),
        // Kubernetes' kilo is `k`; `K` is a common slip, named as such.
        ("100K", QuantityError::UpperK { text: "100K".into() }),
        ("100KB", QuantityError::UpperK { text: "100KB".into() }),
        // Quantities, but not byte counts.
        ("100m", QuantityError::NotBytes { text: "100m".into() }),
        ("-1Gi", QuantityError::NotBytes { text: "-1Gi".into() }),
        ("16Ei", QuantityError::TooLarge { text: "16Ei".into() }),
        (
            "99999999Ei",
            QuantityError::TooLarge {
                text: "99999999Ei".into(),
            },
        ),
        ("1e40", QuantityError::TooLarge { text: "1e40".into() }),
    ];
    for (text, error) in cases {
        assert_eq!(parse_bytes(text), Err(error), "{text}");
    }
}

#[test]
fn the_refusal_says_what_to_write_instead() {
    let message = parse_bytes("512K").unwrap_err().to_string();
    assert!(message.contains("`k` (1000) or `Ki` (1024)"), "{message}");
    let message = parse_bytes("1Qi").unwrap_err().to_string();
    assert!(message.contains("unknown suffix \"Qi\""), "{message}");
}

#[test]
fn sizes_format_with_the_largest_exact_suffix() {
    assert_eq!(format_bytes(2 << 30), "2Gi");
    assert_eq!(format_bytes(1536 << 20), "1536Mi");
    assert_eq!(format_bytes(1 << 40), "1Ti");
    assert_eq!(format_bytes(1_000_000_000), "1000000000");
    assert_eq!(format_bytes(0), "0");
    for n in [1u64 << 30, 3 << 29, 12345, 1 << 62, u64::MAX] {
        assert_eq!(parse_bytes(&format_bytes(n)), Ok(n));
    }
}
