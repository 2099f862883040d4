//! Sizes written as Kubernetes quantities, the one parser for every size localvol reads
//! (flags, claims, PersistentVolumes) and the one format it writes back.
//!
//! The grammar is apimachinery's `resource.Quantity`: an optionally signed number
//! (`5`, `1.5`, `.5`, `5.`) and one suffix: binary `Ki` `Mi` `Gi` `Ti` `Pi` `Ei`,
//! decimal `k` `M` `G` `T` `P` `E` (and `m`, milli), or an exponent `e3` / `E-2`.
//! Nothing else: `K`, `KB`, `gi` and spaces inside are not quantities. A size must
//! also be a byte count: negative and milli quantities are refused, and a fraction of
//! a byte rounds up, as Kubernetes rounds a quantity's value.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "{text:?} is not a size: write a number with an optional Kubernetes suffix, such as \
         10Gi, 1.5G, 500M or 2e9"
    )]
    Malformed { text: String },
    #[error(
        "{text:?}: `K` is not a Kubernetes suffix; write `k` (1000) or `Ki` (1024), as \
         Kubernetes quantities do"
    )]
    UpperK { text: String },
    #[error(
        "{text:?}: unknown suffix {suffix:?}; sizes take Ki, Mi, Gi, Ti, Pi, Ei (powers of \
         1024), k, M, G, T, P, E (powers of 1000) or an exponent such as e9"
    )]
    UnknownSuffix { text: String, suffix: String },
    #[error("{text:?} is not a size: sizes are zero or more bytes, not negative or milli")]
    NotBytes { text: String },
    #[error("{text:?} is more bytes than localvol can count (2^64 - 1)")]
    TooLarge { text: String },
}

/// Bytes in the quantity `text`, rounded up to a whole byte.
pub fn parse_bytes(text: &str) -> Result<u64, QuantityError> {
    let malformed = || QuantityError::Malformed {
        text: text.to_string(),
    };
    let s = text.trim();
    let (negative, unsigned) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(malformed());
    }
    // value = mantissa * multiplier / 10^scale, in u128 to stay exact.
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    let too_large = || QuantityError::TooLarge {
        text: text.to_string(),
    };
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| too_large())?
    };
    let mut scale = u32::try_from(fraction.len()).map_err(|_| too_large())?;
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
        "m" => {
            return Err(QuantityError::NotBytes {
                text: text.to_string(),
            });
        }
        "K" | "KB" | "Kb" => {
            return Err(QuantityError::UpperK {
                text: text.to_string(),
            });
        }
        exponent if exponent.starts_with(['e', 'E']) => {
            let power = &exponent[1..];
            let unsigned_power = power.strip_prefix(['+', '-']).unwrap_or(power);
            if unsigned_power.is_empty() || !unsigned_power.bytes().all(|b| b.is_ascii_digit()) {
                return Err(malformed());
            }
            let power: i32 = power.parse().map_err(|_| too_large())?;
            if power >= 0 {
                10u128.checked_pow(power.unsigned_abs()).ok_or_else(too_large)?
            } else {
                scale = scale.checked_add(power.unsigned_abs()).ok_or_else(too_large)?;
                1
            }
        }
        other if other.starts_with(|c: char| c.is_ascii_alphabetic()) => {
            return Err(QuantityError::UnknownSuffix {
                text: text.to_string(),
                suffix: other.to_string(),
            });
        }
        _ => return Err(malformed()),
    };
    if negative && mantissa != 0 {
        return Err(QuantityError::NotBytes {
            text: text.to_string(),
        });
    }
    let numerator = mantissa.checked_mul(multiplier).ok_or_else(too_large)?;
    // 10^39 overflows u128: any larger scale leaves less than one byte, which rounds up.
    let bytes = match 10u128.checked_pow(scale) {
        Some(divisor) => numerator.div_ceil(divisor),
        None => u128::from(numerator > 0),
    };
    u64::try_from(bytes).map_err(|_| too_large())
}

/// `bytes` as a quantity: `2Gi`, `1536Mi`, or plain bytes when no binary suffix
/// divides it exactly.
pub fn format_bytes(bytes: u64) -> String {
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
                return format!("{}{suffix}", bytes >> shift);
            }
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests;
