//! The calendar arithmetic and the sentinels of the wire contract
//! (docs/design.md, "Wire format") that capture, the sinks and verify
//! share: capture writes dates and timestamps as these numbers, the sinks
//! turn them back into calendar text.

/// Microseconds in a day.
pub const MICROS_PER_DAY: i64 = 86_400_000_000;

/// `timestamp` `infinity` as `io.debezium.time.MicroTimestamp`: PostgreSQL's
/// own sentinel (`DT_NOEND`). No finite `timestamp` is sent as it.
pub const TIMESTAMP_INFINITY: i64 = i64::MAX;
/// `timestamp` `-infinity` (`DT_NOBEGIN`).
pub const TIMESTAMP_NEG_INFINITY: i64 = i64::MIN;
/// `date` `infinity` as `io.debezium.time.Date` (`DATEVAL_NOEND`); finite
/// dates end at 5874897-12-31, day 2,145,042,905.
pub const DATE_INFINITY: i32 = i32::MAX;
/// `date` `-infinity` (`DATEVAL_NOBEGIN`).
pub const DATE_NEG_INFINITY: i32 = i32::MIN;

/// (astronomical year, month, day) of the proleptic Gregorian calendar for
/// days since 1970-01-01 (1 BC is year 0), for any day PostgreSQL holds
/// (H. Hinnant's `civil_from_days`, on `i64`: chrono stops at year 262143).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    // Both are in range by construction.
    (year, month as u32, day as u32)
}

fn is_leap(year: i64) -> bool {
    year.rem_euclid(4) == 0 && (year.rem_euclid(100) != 0 || year.rem_euclid(400) == 0)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (astronomical year);
/// `None` for a month or day that does not exist.
pub fn days_from_civil(year: i64, month: u32, day: u32) -> Option<i64> {
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    // Years counted from March, so the leap day ends the year.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let m = i64::from(month);
    let day_of_year = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    Some(era * 146_097 + day_of_era - 719_468)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_become_calendar_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(-719_528), (0, 1, 1));
        assert_eq!(civil_from_days(2_932_896), (9999, 12, 31));
        assert_eq!(civil_from_days(2_145_042_905), (5_874_897, 12, 31));
    }

    #[test]
    fn calendar_dates_become_days_and_impossible_ones_none() {
        assert_eq!(days_from_civil(1970, 1, 1), Some(0));
        assert_eq!(days_from_civil(0, 1, 1), Some(-719_528));
        assert_eq!(days_from_civil(2000, 2, 29), Some(11_016));
        assert_eq!(days_from_civil(1900, 2, 29), None);
        assert_eq!(days_from_civil(2024, 13, 1), None);
        assert_eq!(days_from_civil(2024, 4, 31), None);
        for days in [-800_000, -1, 0, 19_000, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), Some(days));
        }
    }
}
