//! Durations and sizes as a spec writes them: `500ms`, `1s`, `2m`, or a
//! number of seconds; `64M`, `1G`, or a number of bytes.

use std::time::Duration;

use serde::de::{Deserialize, Deserializer, Error as _};

/// A number or a string in a spec: YAML gives either for `1` and `1s`.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Scalar {
    Number(f64),
    Text(String),
}

/// A positive duration. Deserialized from seconds (`1.5`) or a number with
/// a unit (`500ms`, `2s`, `1m`, `1h`); zero and negative values are refused
/// with the value's line, since every duration in a spec is an interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval(pub Duration);

impl<'de> Deserialize<'de> for Interval {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (seconds, text) = match Scalar::deserialize(deserializer)? {
            Scalar::Number(n) => (n, format!("{n}")),
            Scalar::Text(text) => (parse_seconds(&text).map_err(D::Error::custom)?, text),
        };
        if !seconds.is_finite() || seconds <= 0.0 {
            return Err(D::Error::custom(format!(
                "{} interval `{text}`: write a positive duration such as 500ms, 1s or 2m",
                if seconds < 0.0 { "negative" } else { "empty" }
            )));
        }
        if seconds > MAX_SECONDS {
            return Err(D::Error::custom(format!(
                "interval `{text}` is longer than a week: write at most 7d's worth, such as 168h"
            )));
        }
        Ok(Interval(Duration::from_secs_f64(seconds)))
    }
}

/// The longest interval a spec may state (a week): longer ones are typos,
/// and bounding them keeps every sleep and deadline finite.
const MAX_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

/// Seconds in `text`: a number with an optional unit ms, s, m or h.
fn parse_seconds(text: &str) -> Result<f64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let scale = match unit {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
            "duration `{text}`: unknown unit `{unit}`; write ms, s, m or h (such as 500ms or 2s)"
        ))
        }
    };
    number
        .trim()
        .parse::<f64>()
        .map(|n| n * scale)
        .map_err(|_| {
            format!("duration `{text}` is not a number with a unit: write such as 500ms or 2s")
        })
}

/// A size in bytes from a number or a number with a binary suffix (K, M,
/// G, T; `64M` is 64 MiB); at least 512 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = match Scalar::deserialize(deserializer)? {
            Scalar::Number(n) => format!("{n}"),
            Scalar::Text(text) => text,
        };
        parse_size(&text).map(Size).map_err(D::Error::custom)
    }
}

/// A new size for `resize`: `+16M` grows by that much, `128M` sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeChange {
    /// Grow by this many bytes.
    Grow(u64),
    /// Grow to this many bytes.
    To(u64),
}

impl<'de> Deserialize<'de> for SizeChange {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = match Scalar::deserialize(deserializer)? {
            Scalar::Number(n) => format!("{n}"),
            Scalar::Text(text) => text,
        };
        match text.trim().strip_prefix('+') {
            Some(rest) => parse_size(rest).map(SizeChange::Grow),
            None => parse_size(&text).map(SizeChange::To),
        }
        .map_err(D::Error::custom)
    }
}

/// Bytes in `text`: digits with an optional K, M, G or T (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let upper = trimmed.to_ascii_uppercase();
    let body = upper
        .strip_suffix("IB")
        .or(upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (digits, shift) = match body.chars().last() {
        Some('K') => (&body[..body.len() - 1], 10),
        Some('M') => (&body[..body.len() - 1], 20),
        Some('G') => (&body[..body.len() - 1], 30),
        Some('T') => (&body[..body.len() - 1], 40),
        _ => (body, 0),
    };
    let bytes = digits
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| {
            format!("size `{text}`: write whole bytes or a whole number with K, M, G or T (such as 64M)")
        })?;
    if bytes < 512 || bytes % 512 != 0 {
        return Err(format!(
            "size `{text}`: volumes take a multiple of 512 bytes, at least 512; write such as 64M"
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12").is_err());
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("lots").is_err());
        assert_eq!(parse_seconds("500ms"), Ok(0.5));
        assert_eq!(parse_seconds("2m"), Ok(120.0));
        assert!(parse_seconds("3 parsecs").is_err());
    }
}
