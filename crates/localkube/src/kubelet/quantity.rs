//! A small parser for Kubernetes resource quantities (`500m`, `1Gi`, `2e3`),
//! enough for `resourceFieldRef` divisors and storage sizes.

use thiserror::Error;

/// A quantity that could not be parsed.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid quantity {0:?}")]
pub struct QuantityError(pub String);

/// Parses a quantity into nano-units (value × 10⁹), exact for every
/// quantity Kubernetes accepts up to exa-scale.
pub fn parse_nanos(q: &str) -> Result<i128, QuantityError> {
    let err = || QuantityError(q.to_string());
    let s = q.trim();
    let (sign, s) = match s.strip_prefix('-') {
        Some(rest) => (-1i128, rest),
        None => (1i128, s.strip_prefix('+').unwrap_or(s)),
    };
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(num_end);
    if number.is_empty() || number == "." {
        return Err(err());
    }
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    // Value = digits × 10^(-frac_len) × multiplier, computed in nano-units.
    let digits: String = format!("{int_part}{frac_part}");
    let mantissa: i128 = digits.parse().map_err(|_| err())?;
    let frac_len = frac_part.len() as i32;
    let (pow10, pow2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        other => {
            let exp = other
                .strip_prefix('e')
                .or_else(|| other.strip_prefix('E'))
                .ok_or_else(err)?;
            (exp.parse::<i32>().map_err(|_| err())?, 0)
        }
    };
    let exp = pow10 - frac_len + 9;
    let mut value = mantissa.checked_mul(1i128 << pow2).ok_or_else(err)?;
    if exp >= 0 {
        value = value
            .checked_mul(10i128.checked_pow(exp as u32).ok_or_else(err)?)
            .ok_or_else(err)?;
    } else {
        let div = 10i128.checked_pow((-exp) as u32).ok_or_else(err)?;
        // Round up like Kubernetes does when a quantity is finer than a nano-unit.
        value = (value + div - 1) / div;
    }
    Ok(sign * value)
}

/// Parses a quantity into whole units, rounding up (e.g. bytes for memory).
pub fn parse_units_ceil(q: &str) -> Result<i128, QuantityError> {
    let n = parse_nanos(q)?;
    Ok(div_ceil(n, 1_000_000_000))
}

/// `ceil(a / b)` for a positive divisor.
pub fn div_ceil(a: i128, b: i128) -> i128 {
    if b <= 0 {
        return a;
    }
    let q = a / b;
    if a % b != 0 && a > 0 { q + 1 } else { q }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        assert_eq!(parse_nanos("1").unwrap(), 1_000_000_000);
        assert_eq!(parse_nanos("500m").unwrap(), 500_000_000);
        assert_eq!(parse_nanos("0.5").unwrap(), 500_000_000);
        assert_eq!(parse_units_ceil("1Gi").unwrap(), 1 << 30);
        assert_eq!(parse_units_ceil("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse_units_ceil("128974848").unwrap(), 128_974_848);
        assert_eq!(parse_units_ceil("129e6").unwrap(), 129_000_000);
        assert_eq!(parse_units_ceil("123Mi").unwrap(), 123 * 1024 * 1024);
        assert_eq!(parse_units_ceil("1k").unwrap(), 1000);
        assert_eq!(parse_units_ceil("1n").unwrap(), 1);
        assert_eq!(parse_nanos("1n").unwrap(), 1);
        assert!(parse_nanos("abc").is_err());
        assert!(parse_nanos("1Xi").is_err());
        assert!(parse_nanos("").is_err());
    }
}
