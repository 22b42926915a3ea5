//! Human output of times and sizes: `2026-11-25 21:39:00 UTC`,
//! `1.5 GiB (1610612736 bytes)`. JSON output keeps the exact numbers.

use crate::units::human;

/// Seconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC` (the same on
/// every host, whatever its time zone).
pub fn utc(seconds: u64) -> String {
    let days = seconds / 86_400;
    let rest = seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// A byte count as `1.5 GiB (1610612736 bytes)`; below 1 KiB just
/// `512 bytes`, where the exact figure adds nothing.
pub fn size(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    format!("{} ({bytes} bytes)", human(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_calendar_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_642_740), "2026-11-25 21:39:00 UTC");
    }

    #[test]
    fn sizes_show_both_forms() {
        assert_eq!(size(512), "512 bytes");
        assert_eq!(size(3 << 29), "1.5 GiB (1610612736 bytes)");
    }
}
