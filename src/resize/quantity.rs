//! Storage quantities as the API writes them (`10Gi`, `1.5G`, `500M`, `2e9`) and as
//! localvol writes them back (the largest binary suffix that divides the size exactly).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Bytes in `q`, rounded up to a whole byte. `None` for anything that is not a
/// non-negative storage quantity (milli-bytes, negative numbers, text).
pub fn bytes(q: &Quantity) -> Option<u64> {
    parse(&q.0)
}

fn parse(s: &str) -> Option<u64> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(end);
    if number.is_empty() || number.matches('.').count() > 1 || number == "." {
        return None;
    }
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    // value = mantissa / 10^scale * multiplier, all in u128 to stay exact.
    let mantissa: u128 = format!("{whole}{fraction}").parse().ok()?;
    let mut scale = u32::try_from(fraction.len()).ok()?;
    let multiplier: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().ok()?;
            if e >= 0 {
                10u128.checked_pow(u32::try_from(e).ok()?)?
            } else {
                scale = scale.checked_add(e.unsigned_abs())?;
                1
            }
        }
        _ => return None,
    };
    let numerator = mantissa.checked_mul(multiplier)?;
    let divisor = 10u128.checked_pow(scale)?;
    u64::try_from(numerator.div_ceil(divisor)).ok()
}

/// `bytes` as a quantity: `2Gi`, `1536Mi`, or plain bytes when no suffix divides it.
pub fn format(bytes: u64) -> Quantity {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    if bytes > 0 {
        for (suffix, shift) in SUFFIXES {
            if bytes.trailing_zeros() >= shift {
                return Quantity(format!("{}{suffix}", bytes >> shift));
            }
        }
    }
    Quantity(bytes.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_as_the_api_writes_them() {
        let cases = [
            ("10Gi", Some(10 << 30)),
            ("1536Mi", Some(1536 << 20)),
            ("1.5Gi", Some(3 << 29)),
            ("1G", Some(1_000_000_000)),
            ("500M", Some(500_000_000)),
            ("2e9", Some(2_000_000_000)),
            ("2E3", Some(2000)),
            ("1.5", Some(2)),
            ("15e-1", Some(2)),
            ("4096", Some(4096)),
            ("0", Some(0)),
            ("100m", None),
            ("-1Gi", None),
            ("Gi", None),
            ("1.2.3", None),
            ("99999999Ei", None),
        ];
        for (text, expected) in cases {
            assert_eq!(bytes(&Quantity(text.to_string())), expected, "{text}");
        }
    }

    #[test]
    fn sizes_format_with_the_largest_exact_suffix() {
        assert_eq!(format(2 << 30).0, "2Gi");
        assert_eq!(format(1536 << 20).0, "1536Mi");
        assert_eq!(format(1 << 40).0, "1Ti");
        assert_eq!(format(1_000_000_000).0, "1000000000");
        assert_eq!(format(0).0, "0");
        for n in [1u64 << 30, 3 << 29, 12345, 1 << 62] {
            assert_eq!(bytes(&format(n)), Some(n));
        }
    }
}
