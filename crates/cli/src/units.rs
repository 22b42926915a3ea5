//! Sizes as qemu-img writes them: `512`, `64k`, `1G`, `1.5T`.

/// Parses a size with an optional binary suffix (k, M, G, T, P, E; b or
/// B for bytes).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some(c) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_lowercase() {
                'b' => 0,
                'k' => 10,
                'm' => 20,
                'g' => 30,
                't' => 40,
                'p' => 50,
                'e' => 60,
                _ => return Err(format!("invalid size '{s}': unknown suffix '{c}'")),
            };
            (&s[..s.len() - 1], 1u64 << shift)
        }
        _ => (s, 1),
    };
    let value: f64 = num.parse().map_err(|_| {
        format!("invalid size '{s}': expected a number with an optional k/M/G/T suffix")
    })?;
    let bytes = value * mult as f64;
    if !(0.0..1.8e19).contains(&bytes) || bytes.fract() != 0.0 {
        return Err(format!(
            "invalid size '{s}': out of range or not a whole number of bytes"
        ));
    }
    Ok(bytes as u64)
}

/// Parses a duration: a whole number with a unit, `s`, `m`, `h` or `d`
/// (`90s`, `12h`, `7d`); a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (number, unit) = match s.char_indices().last() {
        Some((at, c)) if c.is_ascii_alphabetic() => (&s[..at], c),
        _ => (s, 's'),
    };
    let seconds_per = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => {
            return Err(format!(
                "invalid duration '{s}': the unit is s, m, h or d, not '{unit}'"
            ))
        }
    };
    let count: u64 = number.parse().map_err(|_| {
        format!("invalid duration '{s}': expected a whole number and s, m, h or d (7d)")
    })?;
    count
        .checked_mul(seconds_per)
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("invalid duration '{s}': too long"))
}

/// Renders bytes as qemu-img does: "1 GiB", "64 KiB", "1.5 MiB".
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        return format!("{bytes} B");
    }
    let number = format!("{v:.3}");
    let number = number.trim_end_matches('0').trim_end_matches('.');
    format!("{number} {}", UNITS[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("7d").unwrap().as_secs(), 7 * 86_400);
        assert_eq!(parse_duration("90").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("2s").unwrap().as_secs(), 2);
        assert_eq!(parse_duration("3h").unwrap().as_secs(), 3 * 3600);
        for bad in ["", "d", "1.5h", "7w", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
        assert!(parse_size("12x").is_err());
        assert!(parse_size("-1").is_err());
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(1536), "1.5 KiB");
    }
}
